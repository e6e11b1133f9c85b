"""One read of many partitions' small frames into one buffer (issue 14: a consumer poll
over 1000 partitions that hold a few messages each).

``PartitionLog.read_frames`` reads one partition: a ``pread``, then per frame a header
object, a checksum, a body buffer and a ``FrameSlice``; the poll then decodes the
slices of all partitions together. At 1000 partitions of 4 frames of 5 messages, the
objects and calls per frame and per partition were most of the poll's CPU.
``scan_many`` reads the same frames with one ``pread`` per partition straight into one
array (``LogSegment.read_into``), walks the headers there, checks each frame's
checksum, and keeps what it found as numbers in arrays (``ScannedFrames``); the
decode gathers the columns from that array (``wire_columns.decode_wire_spans``).

It is a fast path, all or nothing: it handles only the plain case, and returns None for
anything else, before or after reading (the caller then reads as before, which also
raises the errors that belong to the case): a range over two segments or below the
log start, a read window over ``SCAN_WINDOW_BYTES``, a frame over ``SMALL_SLICE_ROWS``
messages (read alone and zero-copy as before, and kept in the frame cache), a bad header
or checksum, a short read, a segment deleted under it, a byte budget the frames would
reach (a poll stopped by bytes is read as before).

Invariant: for a plan ``[(partition, log, start, count)]`` it accepts, the slices are
exactly those ``log.read_frames(start, max_messages=count, max_bytes=B)`` would return
for each partition in turn with ``B`` whatever of ``max_bytes`` earlier partitions
left (the budget never binds), and each partition's next offset is ``start + count``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import crc32c
import numpy as np
import pyarrow as pa

from storage import limits
from storage.frame_read import SMALL_SLICE_ROWS, read_batch
from storage.partition_log import PartitionLog
from storage.record_batch import HEADER, HEADER_BYTES, MAGIC, WIRE_SCHEMA
from storage.wire_columns import decode_wire_spans

# A partition whose wanted frames lie in a read window larger than this is left to
# ``read_frames`` (a poll that stops inside a big segment would read the rest of it).
SCAN_WINDOW_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class ScannedFrames:
    """The frame slices of one ``scan_many``, as arrays (one entry per slice, grouped by
    partition in the plan's order): slice ``k`` is ``rows[k]`` messages from message
    ``skips[k]`` of a frame of ``counts[k]`` messages whose body is
    ``buffer[body_starts[k] : body_starts[k] + body_sizes[k]]``."""

    buffer: np.ndarray  # uint8, every partition's read window
    partitions: np.ndarray  # int32
    body_starts: np.ndarray  # int64, 8-aligned
    body_sizes: np.ndarray  # int64
    counts: np.ndarray  # int64: messages in the frame
    skips: np.ndarray  # int64
    rows: np.ndarray  # int64
    firsts: np.ndarray  # int64: offset of the slice's first message
    written_ats: np.ndarray  # int64: the frame's written_at (us)
    next_offsets: dict[int, int]  # partition -> where its next read starts
    message_count: int
    size: int  # the slices' share of their frames' bytes, as ``FrameSlice.size`` counts

    def __len__(self) -> int:
        return len(self.rows)

    def in_order(self, partitions: Sequence[int]) -> ScannedFrames:
        """The same slices, partitions in the order of ``partitions`` (each partition's
        slices keep their order)."""
        rank = {p: index for index, p in enumerate(partitions)}
        keys = np.fromiter((rank[p] for p in self.partitions.tolist()), np.int64, len(self))
        order = np.argsort(keys, kind="stable")
        if np.array_equal(order, np.arange(len(order))):
            return self
        return ScannedFrames(
            self.buffer, self.partitions[order], self.body_starts[order],
            self.body_sizes[order], self.counts[order], self.skips[order], self.rows[order],
            self.firsts[order], self.written_ats[order], self.next_offsets,
            self.message_count, self.size,
        )  # fmt: skip

    def decode(self) -> pa.RecordBatch:
        """One read batch (``READ_SCHEMA``) of all the slices, in order."""
        assert len(self) > 0
        wire = decode_wire_spans(
            self.buffer, self.body_starts, self.body_sizes, self.counts, self.skips, self.rows
        )
        if wire is None:  # a body of another layout: an Arrow IPC read per frame
            wire = self._read_each()
        return read_batch(wire, self.rows, self.firsts, self.written_ats)

    def _read_each(self) -> pa.RecordBatch:
        buffer = pa.py_buffer(self.buffer)
        wires = []
        for start, size, count, skip, rows in zip(
            self.body_starts.tolist(), self.body_sizes.tolist(), self.counts.tolist(),
            self.skips.tolist(), self.rows.tolist(), strict=True,
        ):  # fmt: skip
            wire = pa.ipc.read_record_batch(buffer.slice(start, size), WIRE_SCHEMA)
            assert wire.num_rows == count, (wire.num_rows, count)
            wires.append(wire.slice(skip, rows) if skip or rows < count else wire)
        return wires[0] if len(wires) == 1 else pa.concat_batches(wires)


def scan_many(
    plan: Sequence[tuple[int, PartitionLog, int, int]], max_bytes: int
) -> ScannedFrames | None:
    """Read ``count`` messages from ``start`` of each ``(partition id, log, start, count)``
    of ``plan``, in order, within ``max_bytes`` of frames in all; None when this path
    does not apply (see the module: the caller reads as before)."""
    if not plan or not 0 < max_bytes <= limits.READ_BYTES_MAX:
        return None
    windows = []
    total = 0
    for _, log, start, count in plan:
        if not 0 < count <= limits.READ_MESSAGES_MAX:
            return None
        window = log.frame_window(start, count, SCAN_WINDOW_BYTES)
        if window is None:
            return None
        windows.append(window)
        total += window[2] - window[1]
    if total == 0:
        return None
    buffer = np.empty(-(-total // 8) * 8, dtype=np.uint8)
    view = memoryview(buffer)
    partitions: list[int] = []
    body_starts: list[int] = []
    body_sizes: list[int] = []
    counts: list[int] = []
    skips: list[int] = []
    rows_taken: list[int] = []
    firsts: list[int] = []
    written_ats: list[int] = []
    next_offsets: dict[int, int] = {}
    unpack = HEADER.unpack_from
    crc = crc32c.crc32c
    at = 0
    frame_bytes = 0  # every frame taken, whole, as the read's byte budget counts them
    size = 0
    for (partition_id, _, start, count), (segment, position, limit) in zip(
        plan, windows, strict=True
    ):
        end = at + limit - position
        assert at % 8 == 0 and end % 8 == 0, (at, end)  # frames are 8-byte multiples
        try:
            got = segment.read_into(view[at:end], position)
        except FileNotFoundError:
            return None  # retention deleted the segment: read_frames retries
        if got != end - at:
            return None
        offset, remaining = start, count
        while remaining > 0:
            if at + HEADER_BYTES > end:
                return None
            magic, checksum, base, written, frame_rows, body_bytes, _, _, _ = unpack(view, at)
            frame_end = at + HEADER_BYTES + body_bytes
            if magic != MAGIC or body_bytes % 8 or frame_rows == 0 or frame_end > end:
                return None
            if base + frame_rows <= offset:
                at = frame_end  # before the start (the index is sparse): not checked
                continue
            skip = offset - base
            if (
                skip < 0
                or frame_rows > SMALL_SLICE_ROWS
                or crc(view[at + 8 : frame_end]) != checksum
            ):
                return None
            rows = min(frame_rows - skip, remaining)
            whole = HEADER_BYTES + body_bytes
            partitions.append(partition_id)
            body_starts.append(at + HEADER_BYTES)
            body_sizes.append(body_bytes)
            counts.append(frame_rows)
            skips.append(skip)
            rows_taken.append(rows)
            firsts.append(offset)
            written_ats.append(written)
            frame_bytes += whole
            size += whole if rows == frame_rows else max(1, whole * rows // frame_rows)
            offset += rows
            remaining -= rows
            at = frame_end
        next_offsets[partition_id] = offset
        at = end
    if frame_bytes >= max_bytes:
        return None  # the budget would have stopped the read somewhere: read as before
    return ScannedFrames(
        buffer,
        np.array(partitions, dtype=np.int32),
        np.array(body_starts, dtype=np.int64),
        np.array(body_sizes, dtype=np.int64),
        np.array(counts, dtype=np.int64),
        np.array(skips, dtype=np.int64),
        np.array(rows_taken, dtype=np.int64),
        np.array(firsts, dtype=np.int64),
        np.array(written_ats, dtype=np.int64),
        next_offsets,
        sum(rows_taken),
        size,
    )
