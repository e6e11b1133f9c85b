"""``COPY ... (FORMAT arrow)``: one Arrow IPC stream in CopyData messages, both ways.

The data of the COPY, all CopyData payloads put end to end, is exactly one Arrow IPC
*stream* (the streaming format, not the file format): the schema message, one record batch
message per batch, then the end-of-stream marker (continuation 0xFFFFFFFF and a zero
length). Any reader of the format reads it (``pyarrow.ipc.open_stream``, Java's
``ArrowStreamReader``); message boundaries and CopyData boundaries are unrelated.

Invariants: dictionary-encoded columns are sent decoded (no dictionary batches: the stream
is schema, batches, end), so a reader needs no dictionary support; every CopyData payload
is at most ``CHUNK_BYTES``; batches are serialised one at a time, so what is held is one
batch and its message, never the whole result. The CopyData messages are given as buffers
(headers and slices of the message, ``copy_data``) for a vectored send: a batch of simple
columns is not serialised into a copy at all (``ipc_views``: its metadata, then views of
its own buffers), and no message is copied again to frame it. COPY FROM reads the same format
(``ArrowCopyDecoder``). Pure code, no I/O.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING

import pyarrow as pa

from sql.pgwire.codec import ipc_bounds, ipc_views
from sql.pgwire.codec.copy_format import BadCopyFormatError
from storage.limits import COPY_IN_BYTES_MAX

if TYPE_CHECKING:
    from engine.api import PackedBatch

# The largest CopyData payload sent. Below glibc malloc's default mmap threshold (128 KiB):
# libpq holds each CopyData whole and copies it into a buffer of its own, and psycopg into
# a bytes object; at 1 MiB both were mapped afresh for every message (~256 page faults
# each), which cost a psycopg client ~1 ms of CPU per 1 MB consumer read (measured: 1.8
# -> 0.8 ms per COPY of 1000 x 1 KiB messages), more than decoding the stream.
CHUNK_BYTES = 64 * 1024
END_OF_STREAM = b"\xff\xff\xff\xff\x00\x00\x00\x00"
_COPY_DATA = struct.Struct("!cI")


def plain_type(kind: pa.DataType) -> pa.DataType:
    """``kind`` with dictionaries replaced by their value type (nested ones too)."""
    if pa.types.is_dictionary(kind):
        return plain_type(kind.value_type)
    if pa.types.is_list(kind):
        return pa.list_(_plain_field(kind.value_field))
    if pa.types.is_large_list(kind):
        return pa.large_list(_plain_field(kind.value_field))
    if pa.types.is_fixed_size_list(kind):
        return pa.list_(_plain_field(kind.value_field), kind.list_size)
    if pa.types.is_map(kind):
        return pa.map_(_plain_field(kind.key_field), _plain_field(kind.item_field),
                       kind.keys_sorted)  # fmt: skip
    if pa.types.is_struct(kind):
        return pa.struct([_plain_field(kind.field(i)) for i in range(kind.num_fields)])
    return kind


def _plain_field(value: pa.Field) -> pa.Field:
    return value.with_type(plain_type(value.type))


def plain_schema(schema: pa.Schema) -> pa.Schema:
    """The schema sent for ``schema``: the same columns, no dictionary encoding."""
    return pa.schema([f.with_type(plain_type(f.type)) for f in schema], metadata=schema.metadata)


def plain_batch(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """``batch`` as a batch of ``schema`` (``plain_schema`` of its own): dictionaries cast."""
    if batch.schema.equals(schema):
        return batch
    columns = [column if column.type == field.type else column.cast(field.type)
               for column, field in zip(batch.columns, schema, strict=True)]  # fmt: skip
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def copy_data(message: pa.Buffer | bytes | list[bytes | memoryview],
              chunk_bytes: int = CHUNK_BYTES) -> list[bytes | memoryview]:  # fmt: skip
    """``message`` (bytes of the IPC stream, or buffers to put end to end) as CopyData
    messages of at most ``chunk_bytes``, as buffers to send in order: each message's
    5-byte header, then its payload as slices of ``message`` (no copy; the slices keep
    the buffers alive). Only the last message may be shorter than ``chunk_bytes``."""
    assert chunk_bytes > 0
    parts = [memoryview(part) for part in (message if isinstance(message, list) else [message])]
    total = sum(len(part) for part in parts)
    pieces: list[bytes | memoryview] = []
    index, at = 0, 0  # the next unsent byte: parts[index][at]
    for start in range(0, total, chunk_bytes):
        size = min(chunk_bytes, total - start)
        pieces.append(_COPY_DATA.pack(b"d", size + 4))
        while size:
            part = parts[index]
            take = min(size, len(part) - at)
            if take:
                pieces.append(part[at:at + take])
            size -= take
            at += take
            if at == len(part):
                index, at = index + 1, 0
    return pieces


def schema_messages(schema: pa.Schema) -> list[bytes | memoryview]:
    """CopyData of the stream's first message, the schema."""
    return copy_data(schema.serialize())


def batch_messages(batch: pa.RecordBatch, schema: pa.Schema) -> list[bytes | memoryview]:
    """CopyData of one record batch message (an empty batch gives none)."""
    if batch.num_rows == 0:
        return []
    plain = plain_batch(batch, schema)
    views = ipc_views.batch_views(plain)  # the message without copying the batch's data
    return copy_data(plain.serialize() if views is None else views)


def packed_messages(packed: PackedBatch) -> list[bytes | memoryview]:
    """CopyData of one record batch message declaring body compression ZSTD, its buffers
    as ``packed`` holds them (a stored column-compressed frame: ``engine.packed_read``).
    Only for a COPY whose client asked for it (``COMPRESSION zstd``)."""
    return copy_data(ipc_views.packed_views(packed.num_rows, packed.nodes, packed.buffers))


def end_messages() -> list[bytes | memoryview]:
    """CopyData of the end-of-stream marker."""
    return copy_data(END_OF_STREAM)


# -- COPY FROM STDIN (FORMAT arrow) -------------------------------------------------------------
class ArrowCopyDecoder:
    """COPY FROM data that is one Arrow IPC stream, as the rows of the COPY's columns.

    The CopyData payloads are held as they come (the caller bounds their total, as for every
    COPY FROM format) and read as one stream at ``finish``. The stream's columns are the
    COPY's columns by position (names are not looked at); a stream that is not Arrow, is
    cut short, or has another number of columns is 22P04 and nothing is written. ``to_arrow``
    gives the columns (renamed by the caller) plus ``line_column``, the 1-based row number,
    so ``copy_exchange`` inserts them as it inserts any COPY FROM rows. Compressed bodies
    and dictionary casts are bounded before they are decoded (``ipc_bounds``, 54000)."""

    def __init__(self, column_names: list[str], relation: str, line_column: str) -> None:
        self.column_names = column_names
        self.relation = relation
        self.line_column = line_column
        self.bytes_seen = 0
        self._chunks: list[bytes] = []
        self._table: pa.Table | None = None

    def feed(self, data: bytes) -> None:
        self.bytes_seen += len(data)
        self._chunks.append(bytes(data))

    def finish(self) -> None:
        data, self._chunks = b"".join(self._chunks), []
        # Compressed bodies decode to at most what an uncompressed COPY may send.
        ipc_bounds.check_stream(data, ipc_bounds.Bounds(total_bytes_max=COPY_IN_BYTES_MAX,
                                                        where=f"COPY {self.relation}"))  # fmt: skip
        try:
            table = pa.ipc.open_stream(data).read_all()
        except (pa.ArrowInvalid, OSError) as error:
            raise BadCopyFormatError(f"COPY data is not one Arrow IPC stream: {error}",
                                     where=f"COPY {self.relation}") from None  # fmt: skip
        if table.num_columns != len(self.column_names):
            raise BadCopyFormatError(
                f"the Arrow stream has {table.num_columns} columns, the COPY "
                f"{len(self.column_names)} ({', '.join(self.column_names)})",
                where=f"COPY {self.relation}")  # fmt: skip
        plain = plain_schema(table.schema)
        if not plain.equals(table.schema):
            ipc_bounds.check_plain(table.columns, COPY_IN_BYTES_MAX, f"COPY {self.relation}")
            table = table.cast(plain)
        self._table = table

    @property
    def row_count(self) -> int:
        return 0 if self._table is None else self._table.num_rows

    def to_arrow(self) -> pa.Table:
        assert self._table is not None, "finish first"
        lines = pa.array(range(1, self._table.num_rows + 1), pa.int64())
        return self._table.append_column(self.line_column, lines)
