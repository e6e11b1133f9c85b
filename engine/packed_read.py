"""A range read's batches left compressed: a column-compressed frame sent as it is stored.

A frame whose data column is compressed whole (``storage.column_codec``: the Spark
writer's default on compressible rows) decodes to ~30-100x its stored bytes. A reader
that takes Arrow IPC body compression (ZSTD) itself (``COPY ... TO STDOUT (FORMAT arrow,
COMPRESSION zstd)``, which the Spark JVM's reader asks for) is sent such a frame's
columns as a ``PackedBatch``: the relation's columns as IPC nodes and buffers in
compressed form, the stored ones as views of the frame's body (the data values still
zstd), the server's own (``partition``, ``offset``, ``written_at``, ``codec``) built
here, each stored as it is (-1 length prefix). The server so neither decompresses the
data nor copies or sends the decoded bytes; the reader decodes it.

Invariants: a ``PackedBatch`` holds exactly the rows of one whole frame (never part of
one: a slice cut by the range is decoded as before), at most ``READ_CHUNK_MESSAGES`` of
them, of raw messages only (``storage.packed_body``), and its columns are ``schema``'s,
in its order, with the values ``bulk_read.read_range`` gives for the same rows (the
tests compare the two through pyarrow's own decompression).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from storage.codecs import Codec
from storage.frame_read import FrameSlice
from storage.packed_body import packed_body
from storage.wire_columns import (
    CREATED_AT,
    DATA,
    ENTRIES,
    GROUP_ID,
    KEY,
    METADATA,
    PRODUCER_ID,
    SEQ_NO,
    VALUE,
    node_buffers,
)

_NOT_COMPRESSED = struct.pack("<q", -1)
# The relation's columns taken from the stored body: their nodes, depth first.
_STORED = {
    "seq_no": (SEQ_NO,),
    "producer_id": (PRODUCER_ID,),
    "message_group_id": (GROUP_ID,),
    "created_at": (CREATED_AT,),
    "data": (DATA,),
    "metadata": (METADATA, ENTRIES, KEY, VALUE),
}
_RAW_LABEL = Codec.RAW.label.encode()


@dataclass(frozen=True, slots=True)
class PackedBatch:
    """One record batch of ``schema`` as Arrow IPC pieces whose buffers are in the form
    body compression gives them (empty, or an int64 length prefix then the bytes:
    -1 for bytes as they are, else the uncompressed length and a zstd frame)."""

    schema: pa.Schema
    num_rows: int
    nodes: tuple[tuple[int, int], ...]
    buffers: tuple[memoryview | bytes, ...]


def packed_slice(partition: int, piece: FrameSlice, schema: pa.Schema,
                 max_rows: int) -> PackedBatch | None:  # fmt: skip
    """``piece`` as a ``PackedBatch`` of ``schema``'s columns, or None when it is not a
    whole column-compressed frame of raw messages of at most ``max_rows`` (then the
    caller decodes it)."""
    header = piece.header
    if not piece.unpacked or piece.skip or piece.rows != header.record_count:
        return None
    if header.record_count > max_rows:
        return None
    body = packed_body(piece.body)
    if body is None or body.rows != header.record_count:
        return None
    rows = body.rows
    nodes: list[tuple[int, int]] = []
    buffers: list[memoryview | bytes] = []
    for name in schema.names:
        if name in _STORED:
            for node in _STORED[name]:
                nodes.append(body.nodes[node])
                buffers += [body.buffers[index] for index in node_buffers(node)]
            continue
        nodes.append((rows, 0))
        if name == "partition":
            values = np.full(rows, partition, dtype=np.int32)
        elif name == "offset":
            values = np.arange(header.base_offset, header.base_offset + rows, dtype=np.int64)
        elif name == "written_at":
            values = np.full(rows, header.written_at_us, dtype=np.int64)
        else:
            assert name == "codec", name  # every message is raw (packed_body)
            offsets = np.arange(0, len(_RAW_LABEL) * (rows + 1), len(_RAW_LABEL), dtype=np.int32)
            buffers += [b"", _NOT_COMPRESSED + offsets.tobytes(),
                        _NOT_COMPRESSED + _RAW_LABEL * rows]  # fmt: skip
            continue
        buffers += [b"", _NOT_COMPRESSED + values.tobytes()]
    return PackedBatch(schema, rows, tuple(nodes), tuple(buffers))
