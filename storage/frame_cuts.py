"""Bounded frames for transactional publishes: a large share cut into frames of a target size.

A committed transaction's share of a partition used to be one frame whatever its size (a
Spark write: 50,000 x 1 KiB, a 53 MB frame), and a reader pays for a whole frame
(docs/bounded_frames.md: a poll of 100 messages preads and checks 53 MB). ``frame_slices``
cuts a share into consecutive zero-copy slices of at most ``FRAME_TARGET_MESSAGES``
messages and about ``FRAME_TARGET_BYTES`` of message data (a single larger message stays
one frame), which ``PartitionLog.publish_transactional`` writes in row order and makes
visible together.

Why recovery stays exact without a new header field: the frames of a share are written
in row order at the log end, and a crash keeps a prefix of the log (a torn frame and
everything after it are cut off at load), so the partition holds a *prefix* of the share;
``PartitionLog.published_prefix`` counts its rows (the frames tagged with the transaction
id) and only the rest is published again. That count equals the share's rows only if no
row was dropped as a duplicate, so only shares without producer ids are cut
(``cuttable``: messages without a producer id are never duplicates); a share with
producer ids stays one frame, present or absent as before. Shares with metadata are not
cut either: an IPC slice of a map column is written with its whole child arrays.
"""

from __future__ import annotations

import struct

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from storage import limits

_INT32 = struct.Struct("<i")
PRODUCER_COLUMN = 1  # of ``record_batch.WIRE_SCHEMA``
DATA_COLUMN = 5
METADATA_COLUMN = 6


def cuttable(batch: pa.RecordBatch) -> bool:
    """Whether ``batch`` may be published as several frames (see the module doc)."""
    count = batch.num_rows
    return (
        batch.column(PRODUCER_COLUMN).null_count == count
        and batch.column(METADATA_COLUMN).null_count == count
    )


def frame_slices(batch: pa.RecordBatch) -> list[pa.RecordBatch]:
    """``batch`` as consecutive slices, each at most ``FRAME_TARGET_MESSAGES`` messages and
    ``FRAME_TARGET_BYTES`` of data (or one message); ``[batch]`` if it is within them or
    not ``cuttable``."""
    count = batch.num_rows
    messages, target = limits.FRAME_TARGET_MESSAGES, limits.FRAME_TARGET_BYTES
    data = batch.column(DATA_COLUMN)
    if count <= 1 or (count <= messages and _data_bytes(data) <= target):
        return [batch]
    if not cuttable(batch):
        return [batch]
    ends = np.cumsum(pc.binary_length(data).to_numpy(zero_copy_only=False), dtype=np.int64)
    slices = []
    start = 0
    while start < count:
        before = int(ends[start - 1]) if start else 0
        fits = int(np.searchsorted(ends, before + target, side="right"))
        stop = min(count, start + messages, max(fits, start + 1))
        slices.append(batch.slice(start, stop - start))
        start = stop
    return slices


def _data_bytes(data: pa.Array) -> int:
    """Message bytes of a binary column (its value range, slices counted by range):
    two offsets read, not an ndarray made (~0.5 against ~2 us, every publish's share)."""
    count = len(data)
    if count == 0:
        return 0
    offsets = data.buffers()[1]  # int32 value offsets of a binary array
    first = data.offset
    (start,) = _INT32.unpack_from(offsets, 4 * first)
    (end,) = _INT32.unpack_from(offsets, 4 * (first + count))
    return end - start
