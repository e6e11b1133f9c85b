"""The one batch format: an Arrow IPC record batch behind a checksummed frame.

A producer builds a *wire batch* (``WIRE_SCHEMA``); the log stores it as it
came, behind a fixed 48-byte frame header; a reader gets it back whole as a
*read batch* (``READ_SCHEMA``), which adds the two columns the server owns:
``offset`` (``base_offset + row``) and ``written_at`` (one value per batch).
Adding them is vectorised; no message is decoded one by one in Python.

Frame layout (little-endian), every frame starts at a multiple of 8 bytes;
``transaction_id`` lets recovery tell whether a committed transaction's
batches already reached a partition (publishing is idempotent)::

    0  magic         4s   b"TBb1"
    4  crc32c        u32  CRC-32C of bytes [8, 40) of the header and of the body
    8  base_offset   i64  offset of the first message
    16 written_at_us i64  server time of the append, microseconds since the epoch
    24 record_count  u32  messages in the body (>= 1)
    28 body_bytes    u32  length of the body, a multiple of 8
    32 attributes    u32  bit 0: published by a transaction (``transaction_id`` is set)
    36 reserved      u32  zero
    40 transaction_id u64 the publishing transaction, 0 for plain appends
    48 body               Arrow IPC encapsulated record batch message (no schema)

Invariants: ``body_bytes % 8 == 0`` so every frame and every Arrow buffer in a
segment stays 8-byte aligned; the checksum is verified on every read.

Two encoders give the same bytes: ``serialize_body`` + ``encode_frame`` (one
joined copy: tests, tools) and ``FrameEncoder`` (the append path: the batch's
own buffers, written without a copy). ``offset`` and ``written_at`` live only in
the header, so an append never rewrites the batch.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import NamedTuple

import crc32c
import numpy as np
import pyarrow as pa

from storage import limits
from storage.codecs import Codec
from storage.errors import InvalidParameterValueError, LimitExceededError

MAGIC = b"TBb1"
HEADER = struct.Struct("<4sIqqIIIIQ")
HEADER_BYTES = HEADER.size
assert HEADER_BYTES == 48
_HEADER_LEAD = struct.Struct("<4sI")  # magic, crc32c: bytes [0, 8)
_HEADER_COVERED = struct.Struct("<qqIIIIQ")  # bytes [8, 48), covered by the checksum
assert _HEADER_LEAD.size + _HEADER_COVERED.size == HEADER_BYTES
_INT32 = struct.Struct("<i")
TRANSACTIONAL = 1
_ENCODED_PARTS_MAX = 128  # buffers of one encoded body (WIRE_SCHEMA gives about 30)
# FrameEncoder copies batches this small (see _encode_joined): one C copy beats the ~28
# Python-level sink writes of the zero-copy path up to ~600 KiB (100 x 1 KiB: 12 against
# 28 us; 500 x 1 KiB: 39 against 47 us; 1000 x 1 KiB: 80 against 65 us; thread CPU).
_JOINED_BELOW_BYTES = 512 * 1024
# and slices of at most this many rows with this little data: a move's 100-message slice
# of a 1000-message frame (12 against 29 us; 400 of them: 32 against 39 us)
_JOINED_ROWS_MAX = 4096
_ROW_BYTES_ESTIMATE = 128  # a row's bytes besides its data (ids, seq_no, times, codec)

TIMESTAMP = pa.timestamp("us", tz="UTC")
METADATA_TYPE = pa.map_(pa.string(), pa.binary())

WIRE_SCHEMA = pa.schema(
    [
        pa.field("seq_no", pa.int64()),
        pa.field("producer_id", pa.string()),
        pa.field("message_group_id", pa.string()),
        pa.field("created_at", TIMESTAMP),
        pa.field("codec", pa.uint8(), nullable=False),
        pa.field("data", pa.binary(), nullable=False),
        pa.field("metadata", METADATA_TYPE),
    ]
)

READ_SCHEMA = pa.schema(
    [
        pa.field("offset", pa.int64(), nullable=False),
        *list(WIRE_SCHEMA)[:4],
        pa.field("written_at", TIMESTAMP, nullable=False),
        *list(WIRE_SCHEMA)[4:],
    ]
)
# The server's columns as ``decode_body`` inserts them into a wire batch.
_OFFSET_FIELD = READ_SCHEMA.field(0)
_WRITTEN_FIELD = READ_SCHEMA.field(5)
assert (_OFFSET_FIELD.name, _WRITTEN_FIELD.name) == ("offset", "written_at")


class FrameHeader(NamedTuple):
    """A frame's decoded header. A named tuple, not a frozen dataclass: a read makes one
    per frame (4,000 for a poll over 1000 partitions), and a frozen dataclass costs
    ~2 us to build against ~0.3 us (issue 14)."""

    crc: int
    base_offset: int
    written_at_us: int
    record_count: int
    body_bytes: int
    attributes: int
    transaction_id: int = 0

    @property
    def frame_bytes(self) -> int:
        return HEADER_BYTES + self.body_bytes

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.record_count


def serialize_body(batch: pa.RecordBatch) -> bytes:
    """Encode a wire batch as an IPC message padded to a multiple of 8 bytes."""
    body = batch.serialize().to_pybytes()
    padding = -len(body) % 8
    return body + b"\0" * padding if padding else body


def encode_frame(
    body: bytes,
    *,
    base_offset: int,
    written_at_us: int,
    record_count: int,
    transaction_id: int = 0,
) -> bytes:
    """Prefix ``body`` with its header and checksum."""
    header = encode_frame_header(
        body,
        base_offset=base_offset,
        written_at_us=written_at_us,
        record_count=record_count,
        transaction_id=transaction_id,
    )
    return header + body


def serialize_body_buffer(batch: pa.RecordBatch) -> pa.Buffer:
    """``serialize_body`` without copying the IPC message into ``bytes`` (1 MB: ~0.1 ms)."""
    body = batch.serialize()
    if body.size % 8:
        return pa.py_buffer(body.to_pybytes() + b"\0" * (-body.size % 8))
    return body


class FrameEncoder:
    """Frames wire batches as a list of buffers to write, without copying the batch.

    ``batch.serialize()`` copies every column buffer into one new IPC message
    (~150-250 us per MB); this encoder yields the very same message bytes as a
    list of *parts* instead: the message's small metadata and padding as
    ``bytes`` and the batch's own Arrow buffers, zero-copy (an IPC stream writer
    over a sink that only keeps what it is handed). The frame is then
    ``[header, *parts]``, written with one ``pwritev``.

    Invariants:
    - ``b"".join(parts) == serialize_body(batch)``: the one batch format, byte
      for byte (tests compare the two);
    - the header's CRC-32C covers header bytes [8, 48) and then the parts in
      order, exactly as ``encode_frame_header`` covers a joined body;
    - the parts keep the batch's buffers alive and must not outlive the write;
    - their number is bounded by ``WIRE_SCHEMA`` (about 30: two per Arrow buffer
      at most, plus the metadata), far below the ``pwritev`` limit (IOV_MAX 1024);
    - a batch of at most ``_JOINED_BELOW_BYTES`` is copied once instead
      (``_encode_joined``, two parts): same bytes, a fraction of the CPU.

    Not thread-safe: each writer owns one (the partition's, under its lock).
    """

    def __init__(self) -> None:
        self._parts: list[bytes | pa.Buffer] = []
        self._writer = self._open_writer()

    def encode(
        self,
        batch: pa.RecordBatch,
        *,
        base_offset: int,
        written_at_us: int,
        transaction_id: int = 0,
        body: pa.Buffer | None = None,
    ) -> tuple[list[bytes | pa.Buffer], FrameHeader]:
        """The frame of ``batch`` as buffers (header first) and its decoded header.

        ``body``, if given, is ``serialize_body_buffer(batch)`` made earlier (a
        transaction's staging frame holds the same bytes): the frame reuses it."""
        if body is not None:
            return framed_body(body, batch.num_rows, base_offset, written_at_us, transaction_id)
        small = batch.get_total_buffer_size() <= _JOINED_BELOW_BYTES or _few_small_rows(batch)
        if small and batch.schema.equals(WIRE_SCHEMA):  # another schema: the writer refuses it
            return _encode_joined(batch, base_offset, written_at_us, transaction_id)
        parts = self._parts
        parts.clear()
        try:
            self._writer.write_batch(batch)
        except BaseException:
            parts.clear()
            self._writer = self._open_writer()  # the stream may be half-written
            raise
        body_parts = list(parts)
        parts.clear()
        assert 0 < len(body_parts) < _ENCODED_PARTS_MAX, len(body_parts)
        size = 0
        for part in body_parts:
            size += _part_size(part)
        if size % 8:
            body_parts.append(bytes(-size % 8))
            size += -size % 8
        count = batch.num_rows
        assert count >= 1 and transaction_id >= 0
        attributes = TRANSACTIONAL if transaction_id else 0
        covered = _HEADER_COVERED.pack(
            base_offset, written_at_us, count, size, attributes, 0, transaction_id
        )
        crc = crc32c.crc32c(covered)
        for part in body_parts:
            crc = crc32c.crc32c(part, crc)
        header = FrameHeader(
            crc, base_offset, written_at_us, count, size, attributes, transaction_id
        )
        return [_HEADER_LEAD.pack(MAGIC, crc) + covered, *body_parts], header

    def _open_writer(self) -> pa.ipc.RecordBatchStreamWriter:
        """A stream writer whose schema message is already out (and dropped)."""
        writer = pa.ipc.new_stream(pa.PythonFile(_PartSink(self._parts), mode="w"), WIRE_SCHEMA)
        writer.write_batch(pa.RecordBatch.from_pylist([], schema=WIRE_SCHEMA))
        self._parts.clear()
        return writer


def _few_small_rows(batch: pa.RecordBatch) -> bool:
    """A slice of a few rows whose data is small: worth copying (``_encode_joined``)
    although ``get_total_buffer_size`` counts its parent's whole buffers (a statement's
    share of one partition, ``TopicLog.shares``)."""
    count = batch.num_rows
    if count > _JOINED_ROWS_MAX or batch.num_columns != len(WIRE_SCHEMA):
        return False
    data = batch.column(5)
    if not pa.types.is_binary(data.type):
        return False
    offsets = data.buffers()[1]
    first = data.offset
    if first == 0 and offsets.size <= 4 * (count + 1):
        return False  # not a slice: ``get_total_buffer_size`` was exact
    (start,) = _INT32.unpack_from(offsets, 4 * first)
    (end,) = _INT32.unpack_from(offsets, 4 * (first + count))
    return end - start + count * _ROW_BYTES_ESTIMATE <= _JOINED_BELOW_BYTES


def _encode_joined(
    batch: pa.RecordBatch, base_offset: int, written_at_us: int, transaction_id: int
) -> tuple[list[bytes | pa.Buffer], FrameHeader]:
    """``FrameEncoder.encode`` for a small batch: one ``serialize()``, the same bytes.

    Copying a few KiB in C costs less than the ~25 Python-level sink writes of
    the zero-copy path (a 1-message batch: ~9 us against ~80 us); group commit
    and single-message appends take this path.
    """
    return framed_body(
        serialize_body_buffer(batch), batch.num_rows, base_offset, written_at_us, transaction_id
    )


def framed_body(
    body: pa.Buffer, count: int, base_offset: int, written_at_us: int, transaction_id: int
) -> tuple[list[bytes | pa.Buffer], FrameHeader]:
    """The frame of an encoded ``body`` of ``count`` messages: its header and the body
    (``encode_frame_header``'s bytes, packed here once: a spread publish frames 1000
    shares a statement)."""
    size = body.size
    assert size % 8 == 0 and count >= 1 and transaction_id >= 0
    attributes = TRANSACTIONAL if transaction_id else 0
    covered = _HEADER_COVERED.pack(
        base_offset, written_at_us, count, size, attributes, 0, transaction_id
    )
    crc = crc32c.crc32c(body, crc32c.crc32c(covered))
    header = FrameHeader(crc, base_offset, written_at_us, count, size, attributes, transaction_id)
    return [_HEADER_LEAD.pack(MAGIC, crc) + covered, body], header


def body_header_bytes(
    body: pa.Buffer, count: int, base_offset: int, written_at_us: int, transaction_id: int
) -> bytes:
    """The header bytes ``framed_body`` gives the frame of ``body``, alone: no
    ``FrameHeader`` and no list of parts (a spread publish writes 1000 frames a statement
    through ``LogSegment.append_body``, ~1 us a frame less)."""
    assert body.size % 8 == 0 and count >= 1 and transaction_id >= 0
    covered = _HEADER_COVERED.pack(
        base_offset, written_at_us, count, body.size, TRANSACTIONAL if transaction_id else 0, 0,
        transaction_id,
    )  # fmt: skip
    return _HEADER_LEAD.pack(MAGIC, crc32c.crc32c(body, crc32c.crc32c(covered))) + covered


class _PartSink:
    """A write-only file object that keeps every buffer it is handed, uncopied."""

    def __init__(self, parts: list[bytes | pa.Buffer]) -> None:
        self._parts = parts
        self.closed = False

    def write(self, data: bytes | pa.Buffer) -> int:
        self._parts.append(data)
        return _part_size(data)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


def _part_size(part: bytes | pa.Buffer) -> int:
    if isinstance(part, bytes):
        return len(part)
    if isinstance(part, pa.Buffer):
        return part.size
    return memoryview(part).nbytes


def encode_frame_header(
    body: bytes | pa.Buffer,
    *,
    base_offset: int,
    written_at_us: int,
    record_count: int,
    transaction_id: int = 0,
) -> bytes:
    """The 48-byte header, checksum included, of a frame holding ``body``."""
    size = len(body)
    assert size % 8 == 0 and record_count >= 1 and transaction_id >= 0
    attributes = TRANSACTIONAL if transaction_id else 0
    # The checksummed part of the header (bytes [8, 48)) is packed once and reused.
    covered = _HEADER_COVERED.pack(
        base_offset, written_at_us, record_count, size, attributes, 0, transaction_id
    )
    crc = crc32c.crc32c(body, crc32c.crc32c(covered))
    return _HEADER_LEAD.pack(MAGIC, crc) + covered


def decode_header(raw: bytes | memoryview) -> FrameHeader | None:
    """Parse a header; None if the magic is wrong (not a frame start)."""
    magic, crc, base, written, count, body_bytes, attributes, _, transaction = HEADER.unpack_from(
        raw
    )
    if magic != MAGIC:
        return None
    return FrameHeader(crc, base, written, count, body_bytes, attributes, transaction)


def frame_checksum_ok(header: FrameHeader, header_raw: memoryview, body: memoryview) -> bool:
    return crc32c.crc32c(body, crc32c.crc32c(header_raw[8:HEADER_BYTES])) == header.crc


def decode_body(header: FrameHeader, body: pa.Buffer) -> pa.RecordBatch:
    """Turn a frame body into a read batch, zero-copy over ``body``.

    The two server columns are inserted into the wire batch (``add_column``) rather than
    the batch rebuilt from its columns: wrapping the seven wire columns as Python
    objects and checking them against ``READ_SCHEMA`` was half of the decode (20 us of
    a 1000-message frame's, 11 us this way)."""
    wire = pa.ipc.read_record_batch(body, WIRE_SCHEMA)
    count = header.record_count
    assert wire.num_rows == count, (wire.num_rows, count)
    base = header.base_offset
    offsets = pa.Array.from_buffers(
        pa.int64(), count, [None, pa.py_buffer(np.arange(base, base + count, dtype=np.int64))]
    )
    written_at = np.full(count, header.written_at_us, dtype=np.int64)
    written = pa.Array.from_buffers(TIMESTAMP, count, [None, pa.py_buffer(written_at)])
    return wire.add_column(0, _OFFSET_FIELD, offsets).add_column(5, _WRITTEN_FIELD, written)


def decode_bodies(frames: Sequence[tuple[FrameHeader, pa.Buffer]]) -> pa.RecordBatch:
    """Turn a run of consecutive frames (each one's offsets follow the previous one's)
    into one read batch, as ``decode_body`` of each concatenated, in fewer steps.

    For small frames: the per-frame cost of ``decode_body`` is mostly building the
    ``offset`` and ``written_at`` columns and the batch (about 30 us against 3 us for
    the Arrow IPC read); here those are built once for the run. The messages' bytes
    are copied once (the concatenation), so large frames are better decoded alone.
    """
    assert frames
    if len(frames) == 1:
        return decode_body(*frames[0])
    wires = []
    counts = np.empty(len(frames), dtype=np.int64)
    written_ats = np.empty(len(frames), dtype=np.int64)
    base = frames[0][0].base_offset
    expected = base
    for index, (header, body) in enumerate(frames):
        assert header.base_offset == expected, (header.base_offset, expected)
        wire = pa.ipc.read_record_batch(body, WIRE_SCHEMA)
        assert wire.num_rows == header.record_count, (wire.num_rows, header.record_count)
        wires.append(wire)
        counts[index] = header.record_count
        written_ats[index] = header.written_at_us
        expected += header.record_count
    count = expected - base
    wire = pa.concat_batches(wires)
    offsets = pa.Array.from_buffers(
        pa.int64(), count, [None, pa.py_buffer(np.arange(base, expected, dtype=np.int64))]
    )
    written = pa.Array.from_buffers(
        TIMESTAMP, count, [None, pa.py_buffer(np.repeat(written_ats, counts))]
    )
    columns = wire.columns
    return pa.RecordBatch.from_arrays(
        [offsets, *columns[:4], written, *columns[4:]], schema=READ_SCHEMA
    )


def data_bytes(batch: pa.RecordBatch) -> int:
    """The bytes of a wire batch's ``data`` column, as its ``nbytes`` counts them: its
    messages and their offsets, read from two of its offsets, plus the bytes of its
    validity bitmap that the column's rows cover when it has one (a column made by a
    take or a filter has one, even with no null). ``nbytes`` walks the column's buffers
    and costs ~14-24 us on a share just read (2.5 us warm); this ~1 us."""
    data = batch.column(5)
    count = len(data)
    if not count:
        return 0
    validity, offsets = data.buffers()[:2]  # a binary array: bitmap, int32 offsets
    first = data.offset
    (start,) = _INT32.unpack_from(offsets, 4 * first)
    (end,) = _INT32.unpack_from(offsets, 4 * (first + count))
    bitmap = 0 if validity is None else (first + count + 7) // 8 - first // 8
    return 4 * count + end - start + bitmap


def check_wire_batch(batch: pa.RecordBatch) -> None:
    """Refuse batches of another schema or over the size limits (54000).

    Costs a few microseconds whatever the batch size: the largest message is
    only looked for when the data column as a whole is over the message limit.
    """
    if not batch.schema.equals(WIRE_SCHEMA):
        raise InvalidParameterValueError(
            f"batch schema does not match the topic wire schema: {batch.schema}"
        )
    count = batch.num_rows
    if count == 0:
        raise InvalidParameterValueError("a batch must hold at least one message")
    if count > limits.BATCH_MESSAGES_MAX:
        raise LimitExceededError(
            f"batch of {count} messages exceeds the limit of {limits.BATCH_MESSAGES_MAX}"
        )
    data = batch.column(5)
    value_offsets = data.buffers()[1]  # int32 offsets of a binary array
    first = data.offset
    (start,) = _INT32.unpack_from(value_offsets, 4 * first)
    (end,) = _INT32.unpack_from(value_offsets, 4 * (first + count))
    if end - start > limits.MESSAGE_BYTES_MAX:
        # No message can be over the limit unless all of them together are.
        window = np.frombuffer(value_offsets, dtype=np.int32)[first : first + count + 1]
        largest = int(np.max(np.diff(window)))
        if largest > limits.MESSAGE_BYTES_MAX:
            raise LimitExceededError(
                f"message of {largest} bytes exceeds the limit of {limits.MESSAGE_BYTES_MAX} bytes"
            )
    size = batch.get_total_buffer_size()  # ~3 us; ``nbytes`` costs 50-70 us per batch
    if size > limits.BATCH_BYTES_MAX:
        raise LimitExceededError(
            f"batch of {size} bytes exceeds the limit of {limits.BATCH_BYTES_MAX} bytes"
        )


def build_wire_batch(
    data: Sequence[bytes],
    *,
    seq_no: Sequence[int | None] | None = None,
    producer_id: Sequence[str | None] | str | None = None,
    message_group_id: Sequence[str | None] | str | None = None,
    created_at_us: Sequence[int] | int | None = None,
    codec: Sequence[int] | int = Codec.RAW,
    metadata: Sequence[dict[str, bytes] | None] | None = None,
) -> pa.RecordBatch:
    """Build a wire batch from Python values with columnar construction.

    ``data`` is joined into one buffer plus an offsets array (no per-message
    Arrow objects). Scalar arguments apply to every message.
    """
    count = len(data)
    lengths = np.fromiter((len(item) for item in data), dtype=np.int64, count=count)
    value_offsets = np.zeros(count + 1, dtype=np.int64)
    np.cumsum(lengths, out=value_offsets[1:])
    if count and value_offsets[-1] >= 2**31:
        raise LimitExceededError("batch data exceeds 2 GiB")
    data_array = pa.Array.from_buffers(
        pa.binary(),
        count,
        [None, pa.py_buffer(value_offsets.astype(np.int32)), pa.py_buffer(b"".join(data))],
    )
    return pa.RecordBatch.from_arrays(
        [
            _int64_column(seq_no, count),
            _string_column(producer_id, count),
            _string_column(message_group_id, count),
            _timestamp_column(created_at_us, count),
            _codec_column(codec, count),
            data_array,
            _metadata_column(metadata, count),
        ],
        schema=WIRE_SCHEMA,
    )


def _int64_column(values: Sequence[int | None] | None, count: int) -> pa.Array:
    if values is None:
        return pa.nulls(count, pa.int64())
    assert len(values) == count
    return pa.array(values, type=pa.int64())


def _string_column(values: Sequence[str | None] | str | None, count: int) -> pa.Array:
    if values is None:
        return pa.nulls(count, pa.string())
    if isinstance(values, str):
        return pa.array([values], pa.string()).take(np.zeros(count, dtype=np.int64))
    assert len(values) == count
    return pa.array(values, type=pa.string())


def _timestamp_column(values: Sequence[int] | int | None, count: int) -> pa.Array:
    if values is None:
        return pa.nulls(count, TIMESTAMP)
    if isinstance(values, int):
        return pa.array(np.full(count, values, dtype=np.int64)).cast(TIMESTAMP)
    return pa.array(np.asarray(values, dtype=np.int64)).cast(TIMESTAMP)


def _codec_column(values: Sequence[int] | int, count: int) -> pa.Array:
    if isinstance(values, int):
        return pa.array(np.full(count, int(values), dtype=np.uint8))
    return pa.array(np.asarray([int(v) for v in values], dtype=np.uint8))


def _metadata_column(values: Sequence[dict[str, bytes] | None] | None, count: int) -> pa.Array:
    if values is None:
        return pa.nulls(count, METADATA_TYPE)
    rows = [None if item is None else list(item.items()) for item in values]
    return pa.array(rows, type=METADATA_TYPE)
