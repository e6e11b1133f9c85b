"""Frames whose data column is compressed whole (Arrow IPC body compression, zstd).

A frame's body is an Arrow IPC record-batch message of ``WIRE_SCHEMA``. Arrow's own
format lets a record batch declare *body compression* (``RecordBatch.compression``:
codec ZSTD, method BUFFER): every non-empty buffer then starts with an int64, the
buffer's uncompressed length, followed either by one zstd-compressed payload or, when
that int64 is -1, by the buffer's bytes as they are. Every Arrow IPC reader
(``pa.ipc.read_record_batch``: the SQL reads, the bulk scan, COPY arrow, Flight) decodes
such a body unchanged, so storing one needs no new frame format: this is the storage
level codec of Kafka's compressed record batches, while each message keeps the codec its
producer gave (``raw``: the ``codec`` column, the topic's ``supported_codecs`` and what a
reader gets back are as for any raw frame).

Topicbase accepts one shape only (a client's staged frame, ``COPY ... (FORMAT frames)``):
codec ZSTD, method BUFFER, the ``data`` column's values buffer compressed (or -1) and
every other non-empty buffer -1 (stored as it is). One zstd call a frame instead of one a
message: zstd's fixed per-frame cost (its table building) is paid once for up to 4,096
messages, and its matching sees across messages (docs/spark_throughput.md, round 22).

``compressed_values`` reads a body's metadata (nothing is decompressed) and says whether
it is compressed and, if it is, that it has that shape and how many bytes its values
declare. Invariants of a body it accepts (a caller then decodes it with Arrow, which
decompresses exactly the declared length or fails, and checks the rest):
- no other codec, method, buffer count (``WIRE_BUFFERS``) or node count, no custom metadata
  and no variadic buffers; every buffer within the body;
- only the data values buffer may be compressed, declaring at most ``declared_bound``
  (``limits.COLUMN_DECLARED_BYTES_MAX`` for one message, ``FRAME_TARGET_BYTES`` for
  more; checked before anything is allocated: a zstd bomb is refused from its 8-byte
  prefix); its payload exactly one zstd frame (nothing after it: its blocks' headers
  walked) that declares that same content size;
- every other non-empty buffer is at least 8 bytes and starts with -1.
Otherwise ``BadCompressedFrameError`` (22P04) for a shape, or for more than one message
declaring more than ``FRAME_TARGET_BYTES`` (a plain frame's refusal);
``InvalidBinaryDataError`` (22P03) for a zstd payload that is not what it declares;
``LimitExceededError`` (54000) for a declared size over
``limits.COLUMN_DECLARED_BYTES_MAX``.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import zstandard

from storage import limits
from storage.codecs import Codec
from storage.errors import DataError, InvalidBinaryDataError, LimitExceededError
from storage.record_batch import WIRE_SCHEMA
from storage.wire_columns import (
    IPC_CONTINUATION,
    RECORD_BATCH_TYPE,
    WIRE_BUFFERS,
    WIRE_NODES,
    read_u32,
    table_fields,
)
from storage.zstd_messages import declared_sizes

# The data column's values buffer, in the order Arrow lays WIRE_SCHEMA's buffers out,
# and the codec column's.
DATA_VALUES = 14
CODEC_VALUES = 11
ZSTD_CODEC = 1  # CompressionType.ZSTD in Arrow's Message.fbs (LZ4_FRAME is 0)
BUFFER_METHOD = 0  # BodyCompressionMethod.BUFFER
NOT_COMPRESSED = -1  # a buffer's length prefix: its bytes follow as they are
_INT64 = struct.Struct("<q")


class BadCompressedFrameError(DataError):
    """A compressed body of a shape Topicbase does not accept: malformed COPY data (22P04,
    as any malformed staged frame)."""

    sqlstate = "22P04"


class CompressedValues(NamedTuple):
    """A compressed body's data values: their uncompressed length as declared (0 when
    stored as they are, -1 prefix), whether they are compressed, and where their zstd
    payload lies in the body (after the length prefix)."""

    declared: int
    compressed: bool
    payload_at: int = 0
    payload_size: int = 0


class BatchHeader(NamedTuple):
    """The flatbuffer metadata of a body that starts with an Arrow IPC record-batch
    message: ``raw`` (continuation, length and metadata: ``8 + length`` bytes), and the
    field positions (0 for an absent field; at least five each) of its Message table
    (``fields``: version, header type, header, body length, custom metadata) and of its
    RecordBatch table (``batch``: length, nodes, buffers, compression, variadic counts)."""

    raw: bytes
    length: int
    fields: list[int]
    batch: list[int]


def batch_header(body: pa.Buffer | memoryview) -> BatchHeader | None:
    """``body``'s record-batch header, or None when it is no record-batch message (too
    short, another continuation or message type, no header). Malformed offsets inside the
    metadata raise ``struct.error`` or ``IndexError``: the callers say what that means for
    them (a refused frame, or "not for this path")."""
    view = memoryview(body)
    if len(view) < 8:
        return None
    continuation, length = struct.unpack_from("<Ii", view, 0)
    if continuation != IPC_CONTINUATION or length <= 0 or len(view) < 8 + length:
        return None
    raw = bytes(view[: 8 + length])
    message = 8 + read_u32(raw, 8)
    fields = table_fields(raw, message) + [0] * 5
    if not fields[1] or raw[fields[1]] != RECORD_BATCH_TYPE or not fields[2]:
        return None
    batch = fields[2] + read_u32(raw, fields[2])
    return BatchHeader(raw, length, fields, table_fields(raw, batch) + [0] * 5)


def compressed_values(body: pa.Buffer, record_count: int = 1) -> CompressedValues | None:
    """None when ``body`` (an Arrow IPC record-batch message) declares no body
    compression; else its data values' declared size once the shape is checked (module
    doc). A body that is no record-batch message at all is left to the caller (None).
    ``record_count``: the messages its frame's header counts; a body of more than one
    message (by that count or by its own metadata's) may declare at most
    ``FRAME_TARGET_BYTES`` (``declared_bound``; 22P04, as the decoded batch would be
    refused past that), refused before anything is decompressed."""
    view = memoryview(body)
    try:
        header = batch_header(body)
        if header is None or not header.batch[3]:
            return None  # no record batch, or not compressed: the caller's plain checks
        raw, length, fields, batch_fields = header.raw, header.length, header.fields, header.batch
        compression = batch_fields[3] + read_u32(raw, batch_fields[3])
        codec_at, method_at = [*table_fields(raw, compression), 0, 0][:2]
        codec = raw[codec_at] if codec_at else 0
        method = raw[method_at] if method_at else 0
        if codec != ZSTD_CODEC or method != BUFFER_METHOD:
            raise BadCompressedFrameError(f"a frame's body compression is codec {codec} method "
                                         f"{method}: only zstd buffers are accepted")  # fmt: skip
        if fields[4]:
            raise BadCompressedFrameError("a compressed frame's message has custom metadata")
        if batch_fields[4] and read_u32(raw, batch_fields[4] + read_u32(raw, batch_fields[4])):
            raise BadCompressedFrameError("a compressed frame has variadic buffers")
        if not fields[3] or not batch_fields[1] or not batch_fields[2]:
            raise BadCompressedFrameError("a compressed frame's message lacks its lengths")
        (rows,) = _INT64.unpack_from(raw, batch_fields[0]) if batch_fields[0] else (0,)
        nodes = batch_fields[1] + read_u32(raw, batch_fields[1])
        buffers = batch_fields[2] + read_u32(raw, batch_fields[2])
        if read_u32(raw, nodes) != WIRE_NODES or read_u32(raw, buffers) != WIRE_BUFFERS:
            raise BadCompressedFrameError("a compressed frame is not of the wire schema's "
                                         "layout")  # fmt: skip
        (body_length,) = _INT64.unpack_from(raw, fields[3])
        spans = struct.unpack_from(f"<{2 * WIRE_BUFFERS}q", raw, buffers + 4)
    except (struct.error, IndexError):
        raise BadCompressedFrameError("a compressed frame's metadata is malformed") from None
    start = 8 + length
    if body_length < 0 or start + body_length != body.size:
        raise BadCompressedFrameError("a compressed frame's body length is not its message's")
    found = CompressedValues(0, False)
    for index in range(WIRE_BUFFERS):
        offset, size = spans[2 * index], spans[2 * index + 1]
        if offset < 0 or size < 0 or offset + size > body_length:
            raise BadCompressedFrameError("a compressed frame's buffer lies outside its body")
        if size == 0:
            continue
        if size < 8:
            raise BadCompressedFrameError("a compressed frame's buffer is shorter than its "
                                         "length prefix")  # fmt: skip
        (prefix,) = _INT64.unpack_from(view, start + offset)
        if prefix == NOT_COMPRESSED:
            continue
        if index != DATA_VALUES:
            raise BadCompressedFrameError("a compressed frame compresses a buffer other than "
                                         "its data's values")  # fmt: skip
        if prefix < 0:
            raise BadCompressedFrameError(f"a compressed frame's data declares {prefix} bytes")
        bound = limits.COLUMN_DECLARED_BYTES_MAX
        if prefix > bound:
            raise LimitExceededError(f"a compressed frame's data declares {prefix} bytes: "
                                     f"over the limit of {bound}")  # fmt: skip
        count = max(record_count, rows)
        if prefix > declared_bound(count):
            # as a plain frame of these messages is refused (``staged_frames``: 22P04)
            raise BadCompressedFrameError(f"a compressed frame of {count} messages declares "
                                          f"{prefix} bytes of data: over the frame target "
                                          f"of {declared_bound(count)}")  # fmt: skip
        payload = view[start + offset + 8 : start + offset + size]
        _check_zstd_frame(payload, prefix)
        found = CompressedValues(prefix, True, start + offset + 8, size - 8)
    return found


def declared_bound(count: int) -> int:
    """What the data values of a frame of ``count`` messages may declare: one message
    alone up to ``limits.COLUMN_DECLARED_BYTES_MAX``, more at most ``FRAME_TARGET_BYTES``
    in all (the frame targets ``staged_frames.check_incoming`` holds a decoded batch to)."""
    if count <= 1:
        return limits.COLUMN_DECLARED_BYTES_MAX
    return min(limits.COLUMN_DECLARED_BYTES_MAX, limits.FRAME_TARGET_BYTES)


def check_payload(body: pa.Buffer, values: CompressedValues) -> None:
    """22P03 unless the zstd payload of ``values`` (``compressed_values`` of ``body``)
    decompresses to exactly its declared size (at most that much is ever produced). The
    error path of a body Arrow could not decode: it tells a broken zstd payload (22P03,
    as for a per-message zstd message) from the rest (the caller's 22P04)."""
    payload = memoryview(body)[values.payload_at : values.payload_at + values.payload_size]
    try:
        out = zstandard.ZstdDecompressor().decompress(payload, max_output_size=values.declared)
    except zstandard.ZstdError as error:
        raise InvalidBinaryDataError(f"cannot decode a compressed frame's data: {error}"
                                     ) from None  # fmt: skip
    if len(out) != values.declared:
        raise InvalidBinaryDataError(f"a compressed frame's data declares {values.declared} "
                                     f"bytes and decodes to {len(out)}")  # fmt: skip


def _check_zstd_frame(payload: memoryview, declared: int) -> None:
    """22P03 unless ``payload`` starts with a zstd frame header declaring ``declared``
    bytes of content (what Arrow then decompresses into exactly that many)."""
    try:
        params = zstandard.get_frame_parameters(payload)
    except zstandard.ZstdError as error:
        raise InvalidBinaryDataError(f"a compressed frame's data is not a zstd frame: "
                                     f"{error}") from None  # fmt: skip
    if params.content_size != declared:
        raise InvalidBinaryDataError(f"a compressed frame's data declares {declared} bytes, "
                                     f"its zstd frame {params.content_size}")  # fmt: skip
    if params.dict_id:
        raise InvalidBinaryDataError("a compressed frame's zstd frame names a dictionary")
    length = _zstd_frame_length(payload, params.has_checksum)
    if length != len(payload):
        raise InvalidBinaryDataError(f"a compressed frame's data is not exactly one zstd frame "
                                     f"({len(payload)} bytes, the frame {length})")  # fmt: skip


def _zstd_frame_length(payload: memoryview, checksum: bool) -> int:
    """The bytes of the zstd frame ``payload`` starts with, from its block headers (the
    zstd format, RFC 8878 3.1.1.2: 3 bytes each, last-block bit, type, size; an RLE block
    holds one byte), or -1 for a reserved block type or a payload that ends first. Reads
    no block's content: one step a block (at most 128 KiB each), so a payload followed by
    another frame (skippable or not) or by any other bytes is told from exactly one frame
    without decompressing it."""
    at = zstandard.frame_header_size(payload)
    payload = payload.cast("B")  # an Arrow buffer's view is of signed bytes
    size = len(payload)
    while at + 3 <= size:
        head = payload[at] | payload[at + 1] << 8 | payload[at + 2] << 16
        kind, length = (head >> 1) & 3, head >> 3
        if kind == 3:
            return -1
        at += 3 + (1 if kind == 1 else length)
        if head & 1:
            return at + (4 if checksum else 0)
    return -1  # no last block within the payload: truncated


def compress_body(batch: pa.RecordBatch, level: int = 1) -> pa.Buffer:
    """The body of ``batch`` (a ``WIRE_SCHEMA`` batch) with its data values compressed
    whole at zstd ``level`` and every other buffer stored as it is: the shape
    ``compressed_values`` accepts (what the Spark writer sends; tools and tests)."""
    compressor = zstandard.ZstdCompressor(level=level, write_content_size=True)

    def piece(index: int, values: bytes) -> bytes:
        if index == DATA_VALUES:
            return _INT64.pack(len(values)) + compressor.compress(values)
        return _INT64.pack(NOT_COMPRESSED) + values

    return assemble_body(batch, piece)


def assemble_body(
    batch: pa.RecordBatch, piece: Callable[[int, bytes], bytes], compression: str = "zstd"
) -> pa.Buffer:
    """A body of ``batch`` declaring zstd body compression whose non-empty buffer ``i``
    (``values`` its uncompressed bytes) is ``piece(i, values)``, length prefix included
    (``compress_body``; tests give other pieces). The metadata is Arrow's own for a
    zstd-compressed batch, its buffers' spans and body length set to these pieces, each
    piece padded to 8 bytes as Arrow's writer pads its buffers. ``compression`` names the
    codec the metadata declares (tests: another than zstd is refused)."""
    plain = pa.ipc.read_message(batch.serialize())
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(
        sink, batch.schema, options=pa.ipc.IpcWriteOptions(compression=compression)
    ) as writer:
        writer.write_batch(batch)
    messages = pa.ipc.MessageReader.open_stream(sink.getvalue())
    messages.read_next_message()  # the schema
    raw = bytearray(messages.read_next_message().metadata.to_pybytes())
    spans = _spans(plain.metadata.to_pybytes())
    source = plain.body
    pieces: list[bytes] = []
    layout: list[int] = []
    at = 0
    for index in range(WIRE_BUFFERS):
        offset, size = spans[2 * index], spans[2 * index + 1]
        if size == 0:
            layout += [at, 0]
            continue
        stored = piece(index, source[offset : offset + size].to_pybytes())
        layout += [at, len(stored)]
        stored += bytes(-len(stored) % 8)
        pieces.append(stored)
        at += len(stored)
    _patch(raw, layout, at)
    metadata = bytes(raw) + bytes(-len(raw) % 8)
    head = struct.pack("<Ii", IPC_CONTINUATION, len(metadata)) + metadata
    return pa.py_buffer(head + b"".join(pieces))


def _positions(raw: bytes) -> tuple[int, int]:
    """Where a record-batch message's metadata (no continuation prefix) keeps its body
    length and its buffers' spans."""
    message = read_u32(raw, 0)
    fields = table_fields(raw, message) + [0] * 5
    batch = fields[2] + read_u32(raw, fields[2])
    batch_fields = table_fields(raw, batch) + [0] * 5
    buffers = batch_fields[2] + read_u32(raw, batch_fields[2])
    assert read_u32(raw, buffers) == WIRE_BUFFERS
    return fields[3], buffers + 4


def _spans(raw: bytes) -> tuple[int, ...]:
    _, spans_at = _positions(raw)
    return struct.unpack_from(f"<{2 * WIRE_BUFFERS}q", raw, spans_at)


def _patch(raw: bytearray, spans: list[int], body_length: int) -> None:
    length_at, spans_at = _positions(bytes(raw))
    struct.pack_into("<q", raw, length_at, body_length)
    struct.pack_into(f"<{2 * WIRE_BUFFERS}q", raw, spans_at, *spans)


_FEW_MESSAGES = 64
_LEAD = struct.Struct("<IiI")  # continuation, metadata length, flatbuffer root offset
_MESSAGE_VTABLE = struct.Struct("<5H")  # sizes, then fields version, header_type, header
_BATCH_VTABLE = struct.Struct("<6H")  # sizes, then length, nodes, buffers, compression
_I32 = struct.Struct("<i")
_U32 = struct.Struct("<I")
_SPAN = struct.Struct("<qq")


def unpacked_bytes(body: pa.Buffer | memoryview, messages: bool = False) -> int:
    """The bytes the data values of a stored frame's ``body`` decode to when they are
    compressed (``compressed_values`` accepted the body at ingest: this only reads its
    declared size), else 0; with ``messages``, also the bytes its zstd messages (codec 4,
    compressed by their producer) declare when a reader decompresses them (the SQL reads
    and the bulk read do). What a read's budgets charge for a frame beyond its stored
    bytes (``storage.partition_log``, ``frame_read.FrameSlice.size``): a frame of ~1 KB
    may declare 16 MiB. Reads the few flatbuffer fields on the way to the record batch's
    compression field (six reads for a plain body, ~0.5 us) and, with ``messages``, the
    codec column's bytes; decodes the batch only when one of them is zstd. 0 for a body
    it cannot parse (every stored body was checked whole at ingest)."""
    view = body if isinstance(body, memoryview) else memoryview(body)
    try:
        _, length, root = _LEAD.unpack_from(view, 0)
        message = 8 + root
        vtable = message - _I32.unpack_from(view, message)[0]
        size, _, _, _, header = _MESSAGE_VTABLE.unpack_from(view, vtable)
        if size <= 8 or not header:  # no header field
            return 0
        at = message + header
        batch = at + _U32.unpack_from(view, at)[0]
        vtable = batch - _I32.unpack_from(view, batch)[0]
        size, _, _, _, buffers, compression = _BATCH_VTABLE.unpack_from(view, vtable)
        compressed = size > 10 and compression  # RecordBatch's field 3: absent or trimmed
        if (not compressed and not messages) or size <= 8 or not buffers:
            return 0
        at = batch + buffers
        spans = at + _U32.unpack_from(view, at)[0] + 4
        if compressed:
            offset, size = _SPAN.unpack_from(view, spans + 16 * DATA_VALUES)
            if size < 8:
                return 0
            return max(0, _INT64.unpack_from(view, 8 + length + offset)[0])
        offset, size = _SPAN.unpack_from(view, spans + 16 * CODEC_VALUES)
        start = 8 + length + offset
        if Codec.ZSTD.value not in view[start : start + size].tobytes():
            return 0
    except (struct.error, IndexError, ValueError):
        return 0
    return _zstd_declared(body)


def _zstd_declared(body: pa.Buffer | memoryview) -> int:
    """The bytes the zstd messages of a stored plain ``body`` declare (0 if it cannot be
    read: it was checked at ingest)."""
    try:
        buffer = body if isinstance(body, pa.Buffer) else pa.py_buffer(body)
        batch = pa.ipc.read_record_batch(buffer, WIRE_SCHEMA)
        zstd = batch.column(4).to_numpy(zero_copy_only=False) == Codec.ZSTD.value
        data = batch.column(5)
        if not zstd.all():
            data = data.filter(pa.array(zstd))
        if len(data) > _FEW_MESSAGES:
            return int(declared_sizes(data).sum())
        # a few messages: each one's zstd header read alone (~78 us of numpy saved)
        offsets = np.frombuffer(data.buffers()[1], np.int32, len(data) + 1, data.offset * 4)
        values = memoryview(data.buffers()[2])
        return sum(max(0, zstandard.frame_content_size(values[start : start + 18]))
                   for start in offsets[:-1].tolist())  # fmt: skip
    except (pa.ArrowException, DataError, ValueError, zstandard.ZstdError):
        return 0


def _gathered(buffer: np.ndarray, at: np.ndarray, kind: str) -> np.ndarray:
    """The little-endian integers of numpy type ``kind`` (``u2``, ``u4``, ``i4``) of
    ``buffer`` at each ``at`` (clipped into the buffer), as int64."""
    width = int(kind[1])
    places = np.clip(at, 0, buffer.size - width)[:, None] + np.arange(width)
    return buffer[places].view("<" + kind).ravel().astype(np.int64)


def compressed_bodies(buffer: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """For bodies in ``buffer`` (uint8) starting at ``starts``: whether each may decode to
    more than its stored bytes, its data column compressed whole or a message of it zstd
    (``unpacked_bytes(messages=True)``' tests, vectorised: the bulk scan of many small
    frames charges those it finds, ``bulk_scan``)."""
    message = 8 + starts + _gathered(buffer, starts + 8, "u4")
    vtable = message - _gathered(buffer, message, "i4")
    has_header = _gathered(buffer, vtable, "u2") > 8
    header = np.where(has_header, _gathered(buffer, vtable + 8, "u2"), 0)
    at = message + header
    batch = at + _gathered(buffer, at, "u4")
    vtable = batch - _gathered(buffer, batch, "i4")
    size = _gathered(buffer, vtable, "u2")
    compressed = (size > 10) & (_gathered(buffer, vtable + 10, "u2") != 0)
    at = batch + np.where(size > 8, _gathered(buffer, vtable + 8, "u2"), 0)
    spans = at + _gathered(buffer, at, "u4") + 4 + 16 * CODEC_VALUES
    codec_at = starts + 8 + _gathered(buffer, starts + 4, "i4") + _gathered(buffer, spans, "u4")
    codec_bytes = np.clip(_gathered(buffer, spans + 8, "u4"), 0, 1 << 16)
    # Every codec byte of every body, gathered at once: a body holds a zstd message when
    # one of its codec bytes is 4 (its padding bytes are 0).
    owner = np.repeat(np.arange(starts.size), codec_bytes)
    places = np.arange(owner.size) - np.repeat(np.cumsum(codec_bytes) - codec_bytes, codec_bytes)
    found = buffer[np.clip(codec_at[owner] + places, 0, buffer.size - 1)] == Codec.ZSTD.value
    zstd = np.bincount(owner, weights=found, minlength=starts.size) > 0
    return has_header & (header != 0) & (compressed | zstd)
