"""A stored column-compressed frame's body taken apart into its Arrow IPC pieces, undecoded.

A frame whose data column is compressed whole (``storage.column_codec``) is an Arrow IPC
record-batch message declaring body compression (ZSTD, BUFFER): every non-empty buffer
is an int64 length prefix, then the zstd payload (the data values) or, after -1, the
bytes as they are. A reader that decodes such bodies itself (the Spark JVM's COPY
reader, ``COPY ... (FORMAT arrow, COMPRESSION zstd)``) can be sent these buffers as they
are stored, so the server neither decompresses the data nor sends the decoded bytes.

``packed_body`` gives each node (length, null count) and each buffer of the body, the
buffers as views of the body in their stored (compressed-form) bytes. Invariants of what
it returns: exactly ``WIRE_NODES`` nodes and ``WIRE_BUFFERS`` buffers, each buffer inside
the body, empty or at least 8 bytes, and every message of the frame has the codec
``raw`` (so the relation's ``data`` is the stored data column as it is: no message needs
the per-message decoding ``storage.codecs.decode_column`` does). Anything else, a plain
body included, gives None: the caller decodes the frame as before. It never
decompresses anything; the body was checked whole at ingest (``compressed_values``) and
its frame's CRC-32C by the read.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

import numpy as np
import pyarrow as pa

from storage.codecs import Codec
from storage.column_codec import CODEC_VALUES, NOT_COMPRESSED, ZSTD_CODEC, batch_header
from storage.wire_columns import (
    WIRE_BUFFERS,
    WIRE_NODES,
    read_u32,
    table_fields,
)

_INT64 = struct.Struct("<q")


class PackedBody(NamedTuple):
    """A compressed body's pieces: its row count, its nodes (length, null count) and its
    buffers in stored form (views of the body: prefix included, or empty)."""

    rows: int
    nodes: tuple[tuple[int, int], ...]
    buffers: tuple[memoryview, ...]


def packed_body(body: pa.Buffer) -> PackedBody | None:
    """``body``'s pieces when it is a column-compressed frame of raw messages, else None
    (module doc)."""
    view = memoryview(body)
    try:
        header = batch_header(body)
        if header is None:
            return None
        raw, length, batch_fields = header.raw, header.length, header.batch
        if not batch_fields[3] or not batch_fields[1] or not batch_fields[2]:
            return None  # not compressed, or no nodes or buffers
        compression = batch_fields[3] + read_u32(raw, batch_fields[3])
        codec_at, method_at = [*table_fields(raw, compression), 0, 0][:2]
        if (raw[codec_at] if codec_at else 0) != ZSTD_CODEC or (raw[method_at] if method_at else 0):
            return None
        (rows,) = _INT64.unpack_from(raw, batch_fields[0]) if batch_fields[0] else (0,)
        nodes = batch_fields[1] + read_u32(raw, batch_fields[1])
        buffers = batch_fields[2] + read_u32(raw, batch_fields[2])
        if read_u32(raw, nodes) != WIRE_NODES or read_u32(raw, buffers) != WIRE_BUFFERS:
            return None
        node_values = struct.unpack_from(f"<{2 * WIRE_NODES}q", raw, nodes + 4)
        spans = struct.unpack_from(f"<{2 * WIRE_BUFFERS}q", raw, buffers + 4)
    except (struct.error, IndexError):
        return None
    start = 8 + length
    pieces: list[memoryview] = []
    for index in range(WIRE_BUFFERS):
        offset, size = spans[2 * index], spans[2 * index + 1]
        if offset < 0 or size < 0 or start + offset + size > body.size or 0 < size < 8:
            return None
        pieces.append(view[start + offset : start + offset + size])
    if rows <= 0 or not _all_raw(pieces[CODEC_VALUES], rows):
        return None
    pairs = tuple((node_values[2 * i], node_values[2 * i + 1]) for i in range(WIRE_NODES))
    return PackedBody(rows, pairs, tuple(pieces))


def _all_raw(codecs: memoryview, rows: int) -> bool:
    """Whether the codec column's stored values (-1, then one byte a message) are all
    ``raw``; False for any other form (a compressed codec column is not what ingest
    accepts)."""
    if len(codecs) < 8 + rows or _INT64.unpack_from(codecs, 0)[0] != NOT_COMPRESSED:
        return False
    values = np.frombuffer(codecs, dtype=np.uint8, count=rows, offset=8)
    return bool((values == Codec.RAW).all())
