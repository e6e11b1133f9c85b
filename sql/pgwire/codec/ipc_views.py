"""An Arrow IPC record batch message as buffers, without copying the batch's data.

``pa.RecordBatch.serialize`` copies every body buffer into one new buffer: for a topic
range read (``COPY ... (FORMAT arrow)``, 1 KiB messages) that is a copy of every message's
bytes, ~20 % of the server's CPU per byte sent. ``batch_views`` gives the same message as
a list of buffers instead: the encapsulated metadata (continuation marker, length, the
``Message``/``RecordBatch`` flatbuffer written here), then each body buffer as a view of
the batch's own memory followed by its padding to 8 bytes. Sent with a vectored write,
the bytes are copied once, by the kernel.

Layouts handled (else None, and the caller serialises with pyarrow): fixed-width columns
(integers, timestamps) and variable-width ones (``binary``, ``string``), sliced or not (a
slice's offsets not starting at 0 are rebased in a small copy of the offsets only: the
data stays a view). A column without nulls sends an empty validity buffer, as Arrow's own
writer does; one with nulls sends its bitmap, if the slice starts at a whole byte of it.

The flatbuffer (Arrow's ``Message.fbs``, metadata version V5) is laid out front to back:
the root offset, the ``Message`` vtable and table (version, header type RecordBatch, the
header, bodyLength), the ``RecordBatch`` vtable and table (length, nodes, buffers), then
the two vectors of 16-byte structs; every 8-byte scalar is 8-aligned from the metadata's
start (which the stream keeps 8-aligned). ``packed_views`` writes the same message for
buffers already in body-compression form (``engine.packed_read``: a stored
column-compressed frame sent as it is stored), its RecordBatch table then also naming a
``BodyCompression`` (codec ZSTD, method BUFFER), written after the buffers vector. Pure
code, no I/O.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import numpy as np
import pyarrow as pa

CONTINUATION = b"\xff\xff\xff\xff"
_VERSION_V5 = 4
_HEADER_RECORD_BATCH = 3
# Message: vtable at 4 (4 fields), table at 16; RecordBatch: vtable at 40 (3 fields),
# table at 56; the nodes vector's count at 84, its structs from 88 (8-aligned), the
# buffers vector's count 4 bytes after them, its structs 8-aligned too.
_MESSAGE_VTABLE = struct.pack("<HHHHHH", 12, 24, 4, 6, 8, 16)
_RECORD_BATCH_VTABLE = struct.pack("<HHHHH", 10, 24, 8, 4, 16)
_NODES_AT = 84
# With body compression the RecordBatch vtable has a 4th field (compression, at 20 of its
# table: the table's 4 bytes of padding); BodyCompression: vtable (codec at 4, method at
# 5), then its table (soffset 8 back to it, codec ZSTD, method BUFFER, padding).
_RECORD_BATCH_VTABLE_COMPRESSED = struct.pack("<HHHHHH", 12, 24, 8, 4, 16, 20)
_ZSTD = 1  # CompressionType.ZSTD
_BUFFER = 0  # BodyCompressionMethod.BUFFER
_BODY_COMPRESSION = struct.pack("<HHHHiBBxx", 8, 8, 4, 5, 8, _ZSTD, _BUFFER)


def _fixed_width(kind: pa.DataType) -> int | None:
    """Bytes per value of a fixed-width integer or timestamp column, else None."""
    if pa.types.is_integer(kind) or pa.types.is_timestamp(kind):
        return kind.bit_width // 8
    return None


def _column_buffers(column: pa.Array) -> list[memoryview | bytes] | None:
    """The IPC body buffers of ``column`` (validity first), or None for other layouts."""
    start, rows = column.offset, len(column)
    buffers = column.buffers()
    validity: memoryview | bytes = b""
    if column.null_count:
        if buffers[0] is None or start % 8:
            return None  # a bitmap not starting at a byte: Arrow's writer shifts it
        validity = memoryview(buffers[0])[start // 8:(start + rows + 7) // 8]
    width = _fixed_width(column.type)
    if width is not None:
        return [validity, memoryview(buffers[1])[start * width:(start + rows) * width]]
    if column.type in (pa.binary(), pa.string()):
        offsets = np.frombuffer(buffers[1], dtype=np.int32, count=start + rows + 1)[start:]
        first, last = int(offsets[0]), int(offsets[rows])
        sent: memoryview | bytes = memoryview(buffers[1])[start * 4:(start + rows + 1) * 4]
        if first:
            sent = (offsets - np.int32(first)).tobytes()  # rebased: 4 bytes a row
        data = memoryview(buffers[2])[first:last] if buffers[2] is not None else b""
        return [validity, sent, data]
    return None


def _metadata(rows: int, nodes: list[tuple[int, int]], layout: list[tuple[int, int]],
              body_length: int, compressed: bool = False) -> bytes:  # fmt: skip
    """The Message flatbuffer of a RecordBatch, padded so that 8 + its length is a
    multiple of 8 (the body then starts 8-aligned); with ``compressed``, the batch
    declares body compression ZSTD, BUFFER."""
    buffers_at = _NODES_AT + 4 + 16 * len(nodes) + 4  # its count too at 8-aligned + 4
    out = bytearray()
    out += struct.pack("<I", 16)  # root: the Message table
    out += _MESSAGE_VTABLE  # 4..16
    # Message table at 16: soffset to its vtable, version, header type, pad, header, pad,
    # bodyLength (at 32)
    out += struct.pack("<ihBxIxxxxq", 16 - 4, _VERSION_V5, _HEADER_RECORD_BATCH, 56 - 24,
                       body_length)  # fmt: skip
    if compressed:
        out += _RECORD_BATCH_VTABLE_COMPRESSED + b"\x00" * 4  # 40..56
    else:
        out += _RECORD_BATCH_VTABLE + b"\x00" * 6  # 40..56
    # RecordBatch table at 56: soffset, nodes (at 60), length (at 64), buffers (at 72),
    # compression (at 76, patched below) or padding
    out += struct.pack("<iIqII", 56 - 40, _NODES_AT - 60, rows, buffers_at - 72, 0)
    out += b"\x00" * 4  # 80..84
    out += struct.pack("<I", len(nodes))
    for length, nulls in nodes:
        out += struct.pack("<qq", length, nulls)
    out += b"\x00" * 4
    assert len(out) == buffers_at
    out += struct.pack("<I", len(layout))
    for offset, length in layout:
        out += struct.pack("<qq", offset, length)
    if compressed:
        out += b"\x00" * (-len(out) % 4)
        vtable = len(out)
        out += _BODY_COMPRESSION
        struct.pack_into("<I", out, 76, vtable + 8 - 76)  # its table follows its vtable
    out += b"\x00" * (-len(out) % 8)
    return bytes(out)


def batch_views(batch: pa.RecordBatch) -> list[memoryview | bytes] | None:
    """The IPC message of ``batch`` (what ``batch.serialize()`` reads back as) as buffers
    to send in order, the body's buffers as views of the batch; None when a column has
    a layout this does not handle."""
    assert batch.num_rows > 0, "an empty batch has no message (copy_arrow sends none)"
    nodes: list[tuple[int, int]] = []
    pieces: list[memoryview | bytes] = []
    layout: list[tuple[int, int]] = []
    at = 0
    for column in batch.columns:
        buffers = _column_buffers(column)
        if buffers is None:
            return None
        nodes.append((len(column), column.null_count))
        at = _lay(buffers, pieces, layout, at)
    metadata = _metadata(batch.num_rows, nodes, layout, at)
    return [CONTINUATION + struct.pack("<i", len(metadata)) + metadata, *pieces]


def _lay(buffers: Sequence[memoryview | bytes], pieces: list[memoryview | bytes],
         layout: list[tuple[int, int]], at: int) -> int:  # fmt: skip
    """Append ``buffers`` to ``pieces`` (each followed by zeros to 8 bytes) and their
    (offset, size) in the body to ``layout``, from body offset ``at``; the offset after."""
    for buffer in buffers:
        size = len(buffer)
        layout.append((at, size))
        pad = -size % 8
        if size:
            pieces.append(buffer)
        if pad:
            pieces.append(b"\x00" * pad)
        at += size + pad
    return at


def packed_views(rows: int, nodes: list[tuple[int, int]] | tuple[tuple[int, int], ...],
                 buffers: list[memoryview | bytes] | tuple[memoryview | bytes, ...]
                 ) -> list[memoryview | bytes]:  # fmt: skip
    """The IPC message of a batch of ``rows`` declaring body compression ZSTD (BUFFER)
    whose nodes are ``nodes`` and whose body buffers are ``buffers``, each already in that
    form (empty, or an int64 length prefix, -1 or the uncompressed length, then the bytes
    or one zstd frame): as buffers to send in order, the body's as they are given (no
    copy), each padded to 8 bytes."""
    assert rows > 0, "an empty batch has no message (copy_arrow sends none)"
    assert all(len(b) == 0 or len(b) >= 8 for b in buffers), [len(b) for b in buffers]
    pieces: list[memoryview | bytes] = []
    layout: list[tuple[int, int]] = []
    at = _lay(buffers, pieces, layout, 0)
    metadata = _metadata(rows, list(nodes), layout, at, compressed=True)
    return [CONTINUATION + struct.pack("<i", len(metadata)) + metadata, *pieces]
