"""PostgreSQL's binary COPY format, both ways: ``COPY ... FROM STDIN (FORMAT binary)``, which
asyncpg's ``copy_records_to_table`` sends, and ``COPY ... TO STDOUT (FORMAT binary)``, which
psycopg's ``copy.read_row`` after ``copy.set_types`` reads.

Layout (PostgreSQL docs, "Binary Format"): the 11-byte signature ``PGCOPY\\n\\377\\r\\n\\0``,
an int32 of flags (bit 16: OIDs included, refused), an int32 header-extension length and
that many bytes; then one tuple after another: an int16 field count (-1 ends the data),
and per field an int32 length (-1 for NULL) and the value in the type's binary send
format. Values are decoded by the type OID the server describes for the target column
(``sql.pgwire.codec.wire_types``), as the client encodes them by that OID; they are encoded out by
the result column's type OID with ``types``' binary encoders (what binary results use).

Invariants: like the text decoder, the decoder holds at most one unfinished tuple
between ``feed`` calls, counts tuples as "lines" for error context, and turns every
``ARROW_CHUNK_ROWS`` rows into Arrow. The encoder writes no OIDs and no header extension:
``BINARY_HEADER`` with the first tuple, then one tuple per CopyData, then
``BINARY_TRAILER`` alone (PostgreSQL's framing, which psycopg's ``read_row`` relies on).
Pure code; one decoder per COPY, one thread at a time.
"""

from __future__ import annotations

import datetime
import decimal
import struct
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from sql.pgwire.codec import wire_types
from sql.pgwire.codec.copy_format import BadCopyFormatError, RowBuffer
from storage.errors import FeatureNotSupportedError, InvalidBinaryDataError

SIGNATURE = b"PGCOPY\n\xff\r\n\x00"
_EPOCH_2000_DAYS = 10957
_EPOCH_2000_US = 946_684_800_000_000
_INT16 = struct.Struct("!h")
_INT32 = struct.Struct("!i")
BINARY_HEADER = SIGNATURE + _INT32.pack(0) + _INT32.pack(0)  # no flags, no extension
BINARY_TRAILER = _INT16.pack(-1)
_NULL_FIELD = _INT32.pack(-1)



def _fixed(shape: str) -> Callable[[bytes], Any]:
    packer = struct.Struct(shape)

    def decode(raw: bytes) -> Any:
        return packer.unpack(raw)[0]

    return decode


def _numeric(raw: bytes) -> str:
    """PostgreSQL numeric send format: digits in base 10000, as decimal text."""
    count, weight, sign, scale = struct.unpack_from("!hhHh", raw)
    if sign == 0xC000:
        return "NaN"
    digits = struct.unpack_from(f"!{count}h", raw, 8)
    value = decimal.Decimal(0)
    for index, digit in enumerate(digits):
        value += decimal.Decimal(digit).scaleb(4 * (weight - index))
    value = value.quantize(decimal.Decimal(1).scaleb(-scale)) if scale else value
    return format(-value if sign == 0x4000 else value, "f")


def _timestamp_us(raw: bytes) -> int:
    """Microseconds since 1970 from PostgreSQL's microseconds since 2000."""
    return int(struct.unpack("!q", raw)[0]) + _EPOCH_2000_US


def _time(raw: bytes) -> datetime.time:
    (micros,) = struct.unpack("!q", raw)
    return (datetime.datetime.min + datetime.timedelta(microseconds=micros)).time()


def _interval(raw: bytes) -> pa.MonthDayNano:
    micros, days, months = struct.unpack("!qii", raw)
    return pa.MonthDayNano([months, days, micros * 1000])


# type OID -> (decode one value, Arrow type of the column handed to DuckDB)
_DECODERS: dict[int, tuple[Callable[[bytes], Any], pa.DataType]] = {
    wire_types.BOOL: (lambda raw: raw != b"\x00", pa.bool_()),
    wire_types.INT2: (_fixed("!h"), pa.int16()),
    wire_types.INT4: (_fixed("!i"), pa.int32()),
    wire_types.INT8: (_fixed("!q"), pa.int64()),
    wire_types.FLOAT4: (_fixed("!f"), pa.float32()),
    wire_types.FLOAT8: (_fixed("!d"), pa.float64()),
    wire_types.TEXT: (lambda raw: raw.decode("utf-8"), pa.string()),
    wire_types.VARCHAR: (lambda raw: raw.decode("utf-8"), pa.string()),
    wire_types.JSON: (lambda raw: raw.decode("utf-8"), pa.string()),
    wire_types.JSONB: (lambda raw: raw[1:].decode("utf-8"), pa.string()),
    wire_types.BYTEA: (bytes, pa.binary()),
    wire_types.DATE: (lambda raw: _INT32.unpack(raw)[0] + _EPOCH_2000_DAYS, pa.int32()),
    wire_types.TIMESTAMP: (_timestamp_us, pa.timestamp("us")),
    wire_types.TIMESTAMPTZ: (_timestamp_us, pa.timestamp("us", tz="UTC")),
    wire_types.TIME: (_time, pa.time64("us")),
    wire_types.UUID: (lambda raw: str(uuid.UUID(bytes=raw)), pa.string()),
    wire_types.NUMERIC: (_numeric, pa.string()),
    wire_types.INTERVAL: (_interval, pa.month_day_nano_interval()),
}


def check_supported(oids: list[int], column_names: list[str]) -> None:
    for oid, name in zip(oids, column_names, strict=True):
        if oid not in _DECODERS:
            raise FeatureNotSupportedError(
                f'binary COPY into column "{name}" (type OID {oid}) is not supported; '
                "use text or csv")  # fmt: skip


@dataclass
class BinaryCopyDecoder(RowBuffer):
    """Parses binary COPY data into typed columns as it arrives (see the module doc)."""

    oids: list[int]
    column_names: list[str]
    relation: str
    columns: list[list[Any]] = field(default_factory=list)
    lines: list[int] = field(default_factory=list)
    line_number: int = 0
    bytes_seen: int = 0
    ended: bool = False
    _buffer: bytes = b""
    _header_read: bool = False
    _chunks: list[pa.Table] = field(default_factory=list)
    _rows_in_chunks: int = 0

    def __post_init__(self) -> None:
        check_supported(self.oids, self.column_names)
        self.columns = [[] for _ in self.column_names]

    def feed(self, data: bytes) -> None:
        self.bytes_seen += len(data)
        if self.ended:
            if data:
                raise BadCopyFormatError("received copy data after EOF marker", self._where())
            return
        buffer = self._buffer + data
        at = 0 if self._header_read else self._header(buffer)
        if at < 0:
            self._buffer = buffer
            return
        while not self.ended:
            end = self._tuple(buffer, at)
            if end < 0:
                break
            at = end
        self._buffer = buffer[at:]
        self._chunk_when_full()

    def finish(self) -> None:
        if not self._header_read or not self.ended:
            raise BadCopyFormatError("unexpected EOF in COPY data", self._where())
        if self._buffer:
            raise BadCopyFormatError("received copy data after EOF marker", self._where())

    # -- pieces ---------------------------------------------------------------------------------
    def _where(self) -> str:
        return f"COPY {self.relation}, line {max(self.line_number, 1)}"

    def _header(self, buffer: bytes) -> int:
        """Offset after the header, or -1 if it is not complete yet."""
        if len(buffer) < 19:
            return -1
        if buffer[:11] != SIGNATURE:
            raise BadCopyFormatError("COPY file signature not recognized", self._where())
        flags, extension = struct.unpack_from("!ii", buffer, 11)
        if flags & (1 << 16):
            raise FeatureNotSupportedError("binary COPY with OIDs is not supported")
        if extension < 0:
            raise BadCopyFormatError("invalid COPY file header (wrong length)", self._where())
        if len(buffer) < 19 + extension:
            return -1
        self._header_read = True
        return 19 + extension

    def _tuple(self, buffer: bytes, at: int) -> int:
        """Decode one tuple at ``at``; the offset after it, or -1 if it is incomplete."""
        if len(buffer) < at + 2:
            return -1
        (count,) = _INT16.unpack_from(buffer, at)
        if count == -1:
            self.ended = True
            return at + 2
        self.line_number += 1
        if count != len(self.oids):
            raise BadCopyFormatError(f"row field count is {count}, expected {len(self.oids)}",
                                     self._where())  # fmt: skip
        values: list[Any] = []
        position = at + 2
        for index in range(count):
            if len(buffer) < position + 4:
                self.line_number -= 1
                return -1
            (length,) = _INT32.unpack_from(buffer, position)
            position += 4
            if length == -1:
                values.append(None)
                continue
            if length < 0 or len(buffer) < position + length:
                if length < 0:
                    raise BadCopyFormatError("invalid field size", self._where())
                self.line_number -= 1
                return -1
            values.append(self._value(index, buffer[position : position + length]))
            position += length
        for column, value in zip(self.columns, values, strict=True):
            column.append(value)
        self.lines.append(self.line_number)
        return position

    def _value(self, index: int, raw: bytes) -> Any:
        decode, _ = _DECODERS[self.oids[index]]
        try:
            return decode(raw)
        except (struct.error, ValueError, UnicodeDecodeError, decimal.InvalidOperation):
            raise InvalidBinaryDataError(
                "incorrect binary data format",
                where=f"COPY {self.relation}, line {self.line_number}, column "
                f"{self.column_names[index]}") from None  # fmt: skip

    def _column_arrays(self) -> dict[str, pa.Array]:
        """Typed arrays by the columns' type OIDs (dates and timestamps from integers)."""
        arrays: dict[str, pa.Array] = {}
        for name, oid, values in zip(self.column_names, self.oids, self.columns, strict=True):
            _, arrow_type = _DECODERS[oid]
            if oid == wire_types.DATE:
                arrays[name] = pa.array(values, pa.int32()).cast(pa.date32())
            elif oid in (wire_types.TIMESTAMP, wire_types.TIMESTAMPTZ):
                arrays[name] = pa.array(values, pa.int64()).cast(arrow_type)
            else:
                arrays[name] = pa.array(values, arrow_type)
        return arrays

# -- COPY TO ------------------------------------------------------------------------------------
def encode_binary_tuples(table: pa.Table, oids: list[int]) -> list[bytes]:
    """One binary tuple per row of ``table`` (columns of the type OIDs ``oids``)."""
    field_count = _INT16.pack(len(oids))
    tuples: list[bytes] = []
    for row in wire_types.encode_rows(table, oids, [1] * len(oids)):
        parts = [field_count]
        for value in row:
            parts.append(_NULL_FIELD if value is None else _INT32.pack(len(value)) + value)
        tuples.append(b"".join(parts))
    return tuples
