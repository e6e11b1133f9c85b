"""PostgreSQL types on the wire: OIDs for result columns and parameters, values in and out.

Results: a column's OID comes from its Arrow type (``type_oid``), or, when DuckDB's own
type name is known (a described statement), from that name (``column_oid``), which keeps
UUID and JSON apart from text. Every type below has a text and a binary form, both ways:

========================  ======  ============================================================
type                      OID     binary form (PostgreSQL's ``*send``/``*recv``)
========================  ======  ============================================================
bool                      16      1 byte
bytea                     17      the bytes (text form: ``\\x`` hex; escape form accepted in)
int8 / int2 / int4        20/21/23  big-endian two's complement
text / varchar            25/1043 UTF-8
json / jsonb              114/3802  UTF-8 text; jsonb prefixed by version byte 1
float4 / float8           700/701 IEEE 754 big-endian
date                      1082    int32 days since 2000-01-01
time                      1083    int64 microseconds since midnight
timestamp / timestamptz   1114/1184 int64 microseconds since 2000-01-01 00:00 (UTC for tz)
interval                  1186    int64 microseconds, int32 days, int32 months
numeric                   1700    int16 ndigits, weight, sign, dscale; ndigits base-10000 int16
uuid                      2950    16 bytes
========================  ======  ============================================================

The server advertises ``TimeZone=UTC``: timestamptz goes out in UTC (``+00``), and a text
timestamptz parameter without an offset is read as UTC. Intervals go out in the
``postgres`` IntervalStyle. Lists, structs and maps go out as JSON text.

Parameters come in as the Python values DuckDB binds: int, float, Decimal, str, bytes,
bool, date, time, datetime (aware for timestamptz), timedelta, UUID. An interval with
months is passed as text DuckDB casts (``'14 months 3 days 5000000 microseconds'``), as a
timedelta has no months. A value that does not read as its type is refused with the
SQLSTATE PostgreSQL uses (22P02 text representation, 22P03 binary representation, 22003
out of range, 22007 datetime format, 22008 datetime out of range).
"""

from __future__ import annotations

import binascii
import datetime
import decimal
import json
import math
import re
import struct
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from sql import formatting
from sql.pgwire.codec import arrays
from storage.errors import (
    DataError,
    DatetimeFieldOverflowError,
    FeatureNotSupportedError,
    InvalidBinaryDataError,
    InvalidTextRepresentationError,
    NumericValueOutOfRangeError,
)
from storage.limits import NUMERIC_DIGITS_MAX

BOOL, BYTEA, INT8, INT2, INT4, TEXT, JSON = 16, 17, 20, 21, 23, 25, 114
FLOAT4, FLOAT8, UNKNOWN, BPCHAR, VARCHAR = 700, 701, 705, 1042, 1043
DATE, TIME, TIMESTAMP, TIMESTAMPTZ, INTERVAL, NUMERIC = 1082, 1083, 1114, 1184, 1186, 1700
UUID, JSONB = 2950, 3802
INTEGER_OIDS = frozenset((INT2, INT4, INT8))

_SIZES = {BOOL: 1, INT2: 2, INT4: 4, INT8: 8, FLOAT4: 4, FLOAT8: 8, DATE: 4, TIME: 8,
          TIMESTAMP: 8, TIMESTAMPTZ: 8, INTERVAL: 16, UUID: 16}  # fmt: skip
_POSTGRES_EPOCH_DATE = datetime.date(2000, 1, 1)
_POSTGRES_EPOCH = datetime.datetime(2000, 1, 1)
_POSTGRES_EPOCH_UTC = datetime.datetime(2000, 1, 1, tzinfo=datetime.UTC)
_MICROSECOND = datetime.timedelta(microseconds=1)


class InvalidDatetimeFormatError(DataError):
    sqlstate = "22007"


# -- OIDs ---------------------------------------------------------------------------------------
def type_oid(data_type: pa.DataType) -> int:
    """The PostgreSQL type OID a column of ``data_type`` is described with (kept per type:
    every result asks it for each of its columns)."""
    oid = _TYPE_OIDS.get(data_type)
    if oid is None:
        oid = _type_oid(data_type)
        if len(_TYPE_OIDS) < TYPE_OIDS_KEPT:  # results bring few distinct types
            _TYPE_OIDS[data_type] = oid
    return oid


TYPE_OIDS_KEPT = 1024
_TYPE_OIDS: dict[pa.DataType, int] = {}


def _type_oid(data_type: pa.DataType) -> int:
    t = data_type
    if pa.types.is_dictionary(t):
        return _type_oid(t.value_type)
    if isinstance(t, pa.ExtensionType):
        name = getattr(t, "extension_name", "")
        if "json" in name:
            return JSON
        if "uuid" in name:
            return UUID
        return _type_oid(t.storage_type)
    checks: list[tuple[Callable[[pa.DataType], bool], int]] = [
        (pa.types.is_boolean, BOOL),
        (lambda x: x in (pa.int8(), pa.int16(), pa.uint8()), INT2),
        (lambda x: x in (pa.int32(), pa.uint16()), INT4),
        (lambda x: x in (pa.int64(), pa.uint32()), INT8),
        (pa.types.is_integer, NUMERIC),  # uint64
        (lambda x: x in (pa.float16(), pa.float32()), FLOAT4),
        (pa.types.is_floating, FLOAT8),
        (pa.types.is_decimal, NUMERIC),
        (lambda x: pa.types.is_string(x) or pa.types.is_large_string(x), TEXT),
        (pa.types.is_string_view, TEXT),
        (lambda x: pa.types.is_binary(x) or pa.types.is_large_binary(x), BYTEA),
        (pa.types.is_binary_view, BYTEA),
        (pa.types.is_fixed_size_binary, BYTEA),
        (pa.types.is_date, DATE),
        (pa.types.is_time, TIME),
        (lambda x: pa.types.is_timestamp(x) and x.tz is None, TIMESTAMP),
        (pa.types.is_timestamp, TIMESTAMPTZ),
        (pa.types.is_duration, INTERVAL),
        (pa.types.is_interval, INTERVAL),
        (pa.types.is_nested, JSON),
    ]
    for check, oid in checks:
        if check(t):
            return oid
    return TEXT


_SQL_TYPE_OIDS = {
    "BOOLEAN": BOOL, "BOOL": BOOL, "TINYINT": INT2, "SMALLINT": INT2, "UTINYINT": INT2,
    "INTEGER": INT4, "INT": INT4, "USMALLINT": INT4, "BIGINT": INT8, "UINTEGER": INT8,
    "UBIGINT": NUMERIC, "HUGEINT": NUMERIC, "UHUGEINT": NUMERIC, "FLOAT": FLOAT4,
    "REAL": FLOAT4, "DOUBLE": FLOAT8, "DECIMAL": NUMERIC, "NUMERIC": NUMERIC,
    "VARCHAR": TEXT, "TEXT": TEXT, "STRING": TEXT, "BLOB": BYTEA, "BYTEA": BYTEA,
    "DATE": DATE, "TIME": TIME, "TIMESTAMP": TIMESTAMP, "TIMESTAMP_S": TIMESTAMP,
    "TIMESTAMP_MS": TIMESTAMP, "TIMESTAMP_NS": TIMESTAMP, "DATETIME": TIMESTAMP,
    "TIMESTAMP WITH TIME ZONE": TIMESTAMPTZ, "TIMESTAMPTZ": TIMESTAMPTZ,
    "INTERVAL": INTERVAL, "UUID": UUID, "JSON": JSON,
}  # fmt: skip


def sql_type_oid(sql_type: str | None) -> int:
    """The OID of a DuckDB type name (``DECIMAL(10,2)`` → numeric); text when unknown.

    Used for parameters, whose type PostgreSQL resolves to text when nothing tells it.
    """
    if sql_type is None:
        return TEXT
    if sql_type.endswith("[]"):  # a LIST parameter: the array of its element type
        return arrays.ARRAY_OIDS.get(sql_type_oid(sql_type[:-2]), arrays.ARRAY_OIDS[TEXT])
    base = sql_type.upper().split("(", 1)[0].strip()
    return _SQL_TYPE_OIDS.get(base, TEXT)


def column_oid(arrow_type: pa.DataType, sql_type: str | None) -> int:
    """The OID of a described result column: DuckDB's UUID and JSON are Arrow strings."""
    if sql_type is not None and sql_type.upper() in ("UUID", "JSON"):
        return UUID if sql_type.upper() == "UUID" else JSON
    return type_oid(arrow_type)


def type_size(oid: int) -> int:
    return _SIZES.get(oid, -1)


# -- text output ------------------------------------------------------------------------------
def _float_text(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return repr(float(value))


def _float4_text(value: float) -> str:
    if math.isnan(value) or math.isinf(value):
        return _float_text(value)
    return str(np.float32(value))  # the shortest text that reads back as the same float4


def _numeric_text(value: Any) -> str:
    if isinstance(value, decimal.Decimal):
        if value.is_nan():
            return "NaN"
        if value.is_infinite():
            return "Infinity" if value > 0 else "-Infinity"
        return format(value, "f")
    if isinstance(value, float):
        return _float_text(value)
    return str(value)


def _timestamp_text(value: Any) -> str:
    if not isinstance(value, datetime.datetime):
        return str(value)
    return value.replace(tzinfo=None).isoformat(sep=" ")


def _timestamptz_text(value: Any) -> str:
    if not isinstance(value, datetime.datetime):
        return str(value)
    if value.tzinfo is not None:
        value = value.astimezone(datetime.UTC).replace(tzinfo=None)
    return value.isoformat(sep=" ") + "+00"


def interval_parts(value: Any) -> tuple[int, int, int]:
    """(months, days, microseconds) of an Arrow interval or duration value."""
    if isinstance(value, datetime.timedelta):
        return 0, value.days, value.seconds * 1_000_000 + value.microseconds
    if isinstance(value, (int, np.integer)):  # a duration Arrow could not make a timedelta
        return 0, 0, int(value)
    months, days, nanoseconds = value  # pyarrow MonthDayNano
    return int(months), int(days), int(nanoseconds) // 1000


def _interval_text(value: Any) -> str:
    """The ``postgres`` IntervalStyle: ``1 year 2 mons -3 days +04:05:06.5``."""
    months, days, micros = interval_parts(value)
    years, months = int(months / 12), months - int(months / 12) * 12
    parts: list[str] = []
    negative_before = False
    for amount, unit in ((years, "year"), (months, "mon"), (days, "day")):
        if amount:
            sign = "+" if negative_before and amount > 0 else ""
            parts.append(f"{sign}{amount} {unit}{'' if amount == 1 else 's'}")
            negative_before = amount < 0
    if micros or not parts:
        sign = "-" if micros < 0 else ("+" if negative_before else "")
        seconds, fraction = divmod(abs(micros), 1_000_000)
        minutes, seconds = divmod(seconds, 60)
        hours, minutes = divmod(minutes, 60)
        clock = f"{sign}{hours:02d}:{minutes:02d}:{seconds:02d}"
        if fraction:
            clock += f".{fraction:06d}".rstrip("0")
        parts.append(clock)
    return " ".join(parts)


def _json_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(formatting.json_value(value), ensure_ascii=False)


def _plain_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, decimal.Decimal):
        return _numeric_text(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return formatting.text_value(bytes(value))
    if isinstance(value, dict | list | tuple):
        return _json_text(value)
    return formatting.text_value(value)


_TEXT_ENCODERS: dict[int, Callable[[Any], str]] = {
    BOOL: lambda v: "t" if v else "f",
    INT2: str, INT4: str, INT8: str,
    FLOAT4: _float4_text, FLOAT8: _float_text,
    NUMERIC: _numeric_text,
    BYTEA: lambda v: "\\x" + bytes(v).hex(),
    DATE: lambda v: v.isoformat() if isinstance(v, datetime.date) else str(v),
    TIME: lambda v: v.isoformat() if isinstance(v, datetime.time) else str(v),
    TIMESTAMP: _timestamp_text,
    TIMESTAMPTZ: _timestamptz_text,
    INTERVAL: _interval_text,
    UUID: str,
    JSON: _json_text, JSONB: _json_text,
}  # fmt: skip


def _text_encoder(oid: int) -> Callable[[Any], str]:
    return _TEXT_ENCODERS.get(oid, _plain_text)


# -- binary output -----------------------------------------------------------------------------
def _packer(shape: str) -> Callable[[Any], bytes]:
    packer = struct.Struct(shape).pack

    def pack(value: Any) -> bytes:
        try:
            return packer(value)
        except struct.error:
            raise NumericValueOutOfRangeError(
                f"value {value} is out of range for its type"
            ) from None

    return pack


def numeric_binary(value: Any) -> bytes:
    """PostgreSQL's binary numeric: base-10000 digits after an 8-byte header."""
    number = value if isinstance(value, decimal.Decimal) else decimal.Decimal(str(value))
    if number.is_nan():
        return struct.pack("!hhHh", 0, 0, 0xC000, 0)
    if number.is_infinite():
        return struct.pack("!hhHh", 0, 0, 0xD000 if number > 0 else 0xF000, 0)
    sign, digits, exponent = number.as_tuple()
    assert isinstance(exponent, int)
    text = "".join(map(str, digits))
    dscale = max(-exponent, 0)
    if exponent > 0:
        text, exponent = text + "0" * exponent, 0
    point = len(text) + exponent  # digits before the decimal point
    whole = text[: max(point, 0)].lstrip("0")
    fraction = ("0" * max(-point, 0)) + text[max(point, 0) :]
    whole = whole.zfill(-(-len(whole) // 4) * 4)
    fraction = fraction.ljust(-(-len(fraction) // 4) * 4, "0")
    groups = [int(whole[i : i + 4]) for i in range(0, len(whole), 4)]
    weight = len(groups) - 1
    groups += [int(fraction[i : i + 4]) for i in range(0, len(fraction), 4)]
    while groups and groups[0] == 0:
        groups.pop(0)
        weight -= 1
    while groups and groups[-1] == 0:
        groups.pop()
    if not groups:
        weight = 0
    header = struct.pack("!hhHh", len(groups), weight, 0x4000 if sign else 0, dscale)
    return header + struct.pack(f"!{len(groups)}h", *groups)


def _date_binary(value: datetime.date) -> bytes:
    return struct.pack("!i", (value - _POSTGRES_EPOCH_DATE).days)


def _time_binary(value: datetime.time) -> bytes:
    micros = ((value.hour * 60 + value.minute) * 60 + value.second) * 1_000_000
    return struct.pack("!q", micros + value.microsecond)


def _micros_since(value: datetime.datetime, epoch: datetime.datetime) -> int:
    delta = value - epoch
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _timestamp_binary(value: datetime.datetime) -> bytes:
    return struct.pack("!q", _micros_since(value.replace(tzinfo=None), _POSTGRES_EPOCH))


def _timestamptz_binary(value: datetime.datetime) -> bytes:
    if value.tzinfo is None:
        value = value.replace(tzinfo=datetime.UTC)
    return struct.pack("!q", _micros_since(value, _POSTGRES_EPOCH_UTC))


def _interval_binary(value: Any) -> bytes:
    months, days, micros = interval_parts(value)
    return struct.pack("!qii", micros, days, months)


def _uuid_binary(value: Any) -> bytes:
    if isinstance(value, uuid.UUID):
        return value.bytes
    if isinstance(value, bytes) and len(value) == 16:
        return value
    return uuid.UUID(str(value)).bytes


def _utf8(encode: Callable[[Any], str]) -> Callable[[Any], bytes]:
    return lambda v: encode(v).encode("utf-8")


_BINARY_ENCODERS: dict[int, Callable[[Any], bytes]] = {
    BOOL: _packer("!?"), INT2: _packer("!h"), INT4: _packer("!i"), INT8: _packer("!q"),
    FLOAT4: _packer("!f"), FLOAT8: _packer("!d"),
    NUMERIC: numeric_binary,
    BYTEA: bytes,
    TEXT: _utf8(_plain_text), VARCHAR: _utf8(_plain_text), BPCHAR: _utf8(_plain_text),
    JSON: _utf8(_json_text), JSONB: lambda v: b"\x01" + _json_text(v).encode("utf-8"),
    DATE: _date_binary, TIME: _time_binary,
    TIMESTAMP: _timestamp_binary, TIMESTAMPTZ: _timestamptz_binary,
    INTERVAL: _interval_binary, UUID: _uuid_binary,
}  # fmt: skip


def column_encoder(oid: int, format_code: int) -> Callable[[Any], bytes]:
    """Turns one non-null value of a column of type ``oid`` into its wire field."""
    if format_code == 1:
        binary = _BINARY_ENCODERS.get(oid)
        if binary is None:
            raise FeatureNotSupportedError(f"binary output of type OID {oid} is not supported")
        return binary
    if format_code != 0:
        raise InvalidBinaryDataError(f"unsupported format code: {format_code}")
    encode = _TEXT_COLUMN_ENCODERS.get(oid)
    if encode is None:
        text = _text_encoder(oid)

        def encode(v: Any) -> bytes:
            return text(v).encode("utf-8")

        _TEXT_COLUMN_ENCODERS[oid] = encode
    return encode


# Text-format encoders by OID, made once (every result asks for one per column).
_TEXT_COLUMN_ENCODERS: dict[int, Callable[[Any], bytes]] = {}


def encode_rows(table: pa.Table, oids: list[int], formats: list[int]) -> list[list[bytes | None]]:
    """The rows of ``table`` as lists of wire fields (None for NULL). Column by column:
    ``to_pylist`` of a chunked column reads every chunk (no batch objects are made)."""
    encoders = [column_encoder(o, f) for o, f in zip(oids, formats, strict=True)]
    columns = [
        [None if v is None else encode(v) for v in column.to_pylist()]
        for encode, column in zip(encoders, table.columns, strict=True)
    ]
    return [list(row) for row in zip(*columns, strict=True)]


def encode_value_rows(rows: list[tuple[Any, ...]], oids: list[int], formats: list[int]
                      ) -> list[list[bytes | None]]:  # fmt: skip
    """``encode_rows`` of a small result held as Python values (``engine.api.Rows``: the
    values ``to_pylist`` would give of its Arrow table), row by row."""
    encoders = [column_encoder(o, f) for o, f in zip(oids, formats, strict=True)]
    return [
        [None if v is None else encode(v) for encode, v in zip(encoders, row, strict=True)]
        for row in rows
    ]


# -- parameters: text in ---------------------------------------------------------------------
_INT_RANGES = {INT2: (-(2**15), 2**15 - 1), INT4: (-(2**31), 2**31 - 1),
               INT8: (-(2**63), 2**63 - 1)}  # fmt: skip
_TYPE_NAMES = {BOOL: "boolean", INT2: "smallint", INT4: "integer", INT8: "bigint",
               FLOAT4: "real", FLOAT8: "double precision", NUMERIC: "numeric", BYTEA: "bytea",
               DATE: "date", TIME: "time", TIMESTAMP: "timestamp", INTERVAL: "interval",
               TIMESTAMPTZ: "timestamp with time zone", UUID: "uuid", JSON: "json",
               JSONB: "json"}  # fmt: skip
_TRUE = ("t", "true", "y", "yes", "on", "1")
_FALSE = ("f", "false", "n", "no", "off", "0")


def _checked_int(value: int, oid: int) -> int:
    low, high = _INT_RANGES[oid]
    if not low <= value <= high:
        raise NumericValueOutOfRangeError(
            f'value "{value}" is out of range for type {_TYPE_NAMES[oid]}'
        )
    return value


# PostgreSQL 15's integer input: blanks, a sign, ASCII digits, blanks (no ``1_000``, no
# ``0x10``, no ``1.5``; Python's ``int`` and DuckDB's cast read some of those)
_INTEGER_TEXT = re.compile(r"\s*([+-]?[0-9]+)\s*", re.ASCII)
_INTEGER_BYTES = re.compile(rb"\s*[+-]?[0-9]+\s*")
# what DuckDB's cast of a text to an integer may read besides: decimals, exponents, ``_``,
# hexadecimal, binary and octal forms
_LOOSE_NUMBER_BYTES = re.compile(
    rb"\s*[+-]?(?:0[xXbBoO][0-9a-fA-F_]*|[0-9_]*\.?[0-9_]*(?:[eE][+-]?[0-9_]*)?)\s*"
)


def _text_int(text: str, oid: int) -> int:
    """A text parameter of type int2/int4/int8 as PostgreSQL reads it: ValueError (22P02)
    for anything but an integer, 22003 (with the text as sent) outside the type's range."""
    match = _INTEGER_TEXT.fullmatch(text)
    if match is None:
        raise ValueError(text)
    low, high = _INT_RANGES[oid]
    value = int(match.group(1))
    if not low <= value <= high:
        raise NumericValueOutOfRangeError(
            f'value "{text}" is out of range for type {_TYPE_NAMES[oid]}'
        )
    return value


def integer_cast_differs(value: bytes) -> bool:
    """Whether an untyped text parameter is one an integer cast in DuckDB would read
    (rounding ``1.5``, reading ``1e2``, ``0x10``, ``1_000``) but PostgreSQL refuses as
    integer input: such a value must be checked against the parameter's type."""
    return (
        _LOOSE_NUMBER_BYTES.fullmatch(value) is not None
        and _INTEGER_BYTES.fullmatch(value) is None
        and any(48 <= byte <= 57 for byte in value)
    )


def _text_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ValueError(text)


def _text_float(text: str) -> float:
    lowered = text.strip().lower()
    special = {"nan": math.nan, "infinity": math.inf, "+infinity": math.inf, "inf": math.inf,
               "-infinity": -math.inf, "-inf": -math.inf}  # fmt: skip
    return special[lowered] if lowered in special else float(text)


def _text_numeric(text: str) -> decimal.Decimal:
    number = decimal.Decimal(text.strip())
    if number.is_snan() or (number.is_nan() and text.strip().lower() != "nan"):
        raise ValueError(text)
    return number


def _text_bytea(text: str) -> bytes:
    if text.startswith("\\x"):
        return bytes.fromhex(text[2:])
    out = bytearray()  # the escape format: \\ and \ooo
    position = 0
    while position < len(text):
        char = text[position]
        if char != "\\":
            out += char.encode("utf-8")
            position += 1
        elif text[position + 1 : position + 2] == "\\":
            out.append(0x5C)
            position += 2
        elif re.fullmatch(r"[0-3][0-7]{2}", text[position + 1 : position + 4]):
            out.append(int(text[position + 1 : position + 4], 8))
            position += 4
        else:
            raise ValueError("invalid input syntax for type bytea")
    return bytes(out)


_OFFSET = re.compile(r"([+-])(\d{2})(?::?(\d{2}))?(?::?(\d{2}))?$")


def _text_timestamp(text: str, with_zone: bool) -> datetime.datetime:
    stripped = text.strip()
    if stripped.endswith(("Z", "z")):
        stripped = stripped[:-1] + "+00"
    if stripped.upper().endswith(" UTC"):
        stripped = stripped[:-4] + "+00"
    zone = None
    match = _OFFSET.search(stripped)
    if match and len(stripped) > 10 and ("T" in stripped or " " in stripped.strip()):
        sign = 1 if match.group(1) == "+" else -1
        hours, minutes, seconds = (int(g) if g else 0 for g in match.group(2, 3, 4))
        zone = datetime.timezone(sign * datetime.timedelta(hours=hours, minutes=minutes,
                                                           seconds=seconds))  # fmt: skip
        stripped = stripped[: match.start()].rstrip()
    value = datetime.datetime.fromisoformat(stripped)
    if with_zone:
        return value.replace(tzinfo=zone or datetime.UTC).astimezone(datetime.UTC)
    return value  # PostgreSQL ignores a zone given for a timestamp without time zone


_INTERVAL_UNITS = {
    "year": (12, 0, 0), "mon": (1, 0, 0), "month": (1, 0, 0), "week": (0, 7, 0),
    "day": (0, 1, 0), "hour": (0, 0, 3_600_000_000), "minute": (0, 0, 60_000_000),
    "min": (0, 0, 60_000_000), "second": (0, 0, 1_000_000), "sec": (0, 0, 1_000_000),
    "millisecond": (0, 0, 1000), "microsecond": (0, 0, 1),
}  # fmt: skip
_INTERVAL_ITEM = re.compile(
    r"([+-]?\d+(?:\.\d+)?)\s*([a-z]+)|([+-])?(\d+):(\d{2})(?::(\d{2}(?:\.\d+)?))?"
)
_ISO_INTERVAL = re.compile(
    r"P(?:(-?\d+)Y)?(?:(-?\d+)M)?(?:(-?\d+)W)?(?:(-?\d+)D)?"
    r"(?:T(?:(-?\d+)H)?(?:(-?\d+)M)?(?:(-?\d+(?:\.\d+)?)S)?)?"
)


def _text_interval(text: str) -> tuple[int, int, int]:
    """(months, days, microseconds) of a ``postgres``-style or ISO 8601 interval."""
    stripped = text.strip().lower()
    ago = stripped.endswith(" ago")
    stripped = stripped.removesuffix(" ago").strip().lstrip("@").strip()
    months = days = micros = 0
    if stripped.upper().startswith("P"):
        match = _ISO_INTERVAL.fullmatch(stripped.upper())
        if not match or stripped.upper() in ("P", "PT"):
            raise ValueError(text)
        years, mons, weeks, ds, hours, minutes, seconds = match.groups()
        months = int(years or 0) * 12 + int(mons or 0)
        days = int(weeks or 0) * 7 + int(ds or 0)
        micros = (int(hours or 0) * 3600 + int(minutes or 0) * 60) * 1_000_000
        micros += round(decimal.Decimal(seconds or 0) * 1_000_000)
    else:
        position = 0
        for match in _INTERVAL_ITEM.finditer(stripped):
            if stripped[position : match.start()].strip():
                raise ValueError(text)
            position = match.end()
            if match.group(2):
                unit = match.group(2).rstrip("s") if match.group(2) != "s" else "second"
                if unit not in _INTERVAL_UNITS:
                    raise ValueError(text)
                amount = decimal.Decimal(match.group(1))
                scale = _INTERVAL_UNITS[unit]
                months += int(amount * scale[0])
                days += int(amount * scale[1])
                micros += round(amount * scale[2])
            else:
                sign = -1 if match.group(3) == "-" else 1
                seconds = decimal.Decimal(match.group(6) or 0)
                clock = (int(match.group(4)) * 3600 + int(match.group(5)) * 60) * 1_000_000
                micros += sign * (clock + round(seconds * 1_000_000))
        if position == 0 or stripped[position:].strip():
            raise ValueError(text)
    if ago:
        months, days, micros = -months, -days, -micros
    return months, days, micros


def interval_value(months: int, days: int, micros: int) -> Any:
    """An interval as DuckDB binds it: a timedelta, or text where there are months."""
    if months == 0:
        return datetime.timedelta(days=days, microseconds=micros)
    return f"{months} months {days} days {micros} microseconds"


_TEXT_PARAMETERS: dict[int, Callable[[str], Any]] = {
    INT2: lambda t: _text_int(t, INT2),
    INT4: lambda t: _text_int(t, INT4),
    INT8: lambda t: _text_int(t, INT8),
    FLOAT4: _text_float,
    FLOAT8: _text_float,
    NUMERIC: _text_numeric,
    BOOL: _text_bool,
    BYTEA: _text_bytea,
    DATE: lambda t: datetime.date.fromisoformat(t.strip()),
    TIME: lambda t: datetime.time.fromisoformat(t.strip()),
    TIMESTAMP: lambda t: _text_timestamp(t, with_zone=False),
    TIMESTAMPTZ: lambda t: _text_timestamp(t, with_zone=True),
    INTERVAL: lambda t: interval_value(*_text_interval(t)),
    UUID: lambda t: uuid.UUID(t.strip()),
    JSON: lambda t: _checked_json(t),
    JSONB: lambda t: _checked_json(t),
}


def _checked_json(text: str) -> str:
    json.loads(text)
    return text


# -- parameters: binary in --------------------------------------------------------------------
def _unpacker(shape: str) -> Callable[[bytes], Any]:
    unpacker = struct.Struct(shape)

    def unpack(data: bytes) -> Any:
        if len(data) != unpacker.size:
            raise InvalidBinaryDataError(
                f"incorrect binary data format: {len(data)} bytes where {unpacker.size} belong"
            )
        return unpacker.unpack(data)[0]

    return unpack


def numeric_from_binary(data: bytes) -> decimal.Decimal:
    """The inverse of ``numeric_binary``."""
    if len(data) < 8:
        raise InvalidBinaryDataError("insufficient data left in message for numeric")
    count, weight, sign, dscale = struct.unpack("!hhHh", data[:8])
    if count < 0 or count > NUMERIC_DIGITS_MAX or len(data) != 8 + 2 * count or dscale < 0:
        raise InvalidBinaryDataError("invalid length in external numeric value")
    if sign == 0xC000:
        return decimal.Decimal("NaN")
    if sign in (0xD000, 0xF000):
        return decimal.Decimal("Infinity" if sign == 0xD000 else "-Infinity")
    if sign not in (0, 0x4000):
        raise InvalidBinaryDataError("invalid sign in external numeric value")
    groups = struct.unpack(f"!{count}h", data[8:])
    if any(not 0 <= g < 10000 for g in groups):
        raise InvalidBinaryDataError("invalid digit in external numeric value")
    digits = "".join(f"{g:04d}" for g in groups) or "0"
    exponent = 4 * (weight - count + 1)
    number = decimal.Decimal(f"{'-' if sign else ''}{digits}E{exponent}")
    context = decimal.Context(prec=NUMERIC_DIGITS_MAX * 4 + 8)
    return number.quantize(decimal.Decimal(1).scaleb(-dscale), context=context)


def _date_from_binary(data: bytes) -> datetime.date:
    days = _unpacker("!i")(data)
    return _POSTGRES_EPOCH_DATE + datetime.timedelta(days=days)


def _time_from_binary(data: bytes) -> datetime.time:
    micros = _unpacker("!q")(data)
    if not 0 <= micros <= 86_400_000_000:
        raise DatetimeFieldOverflowError("time out of range")
    seconds, micro = divmod(micros, 1_000_000)
    minutes, second = divmod(seconds, 60)
    hour, minute = divmod(minutes, 60)
    return datetime.time(hour % 24, minute, second, micro)


def _timestamp_from_binary(data: bytes, with_zone: bool) -> datetime.datetime:
    micros = _unpacker("!q")(data)
    epoch = _POSTGRES_EPOCH_UTC if with_zone else _POSTGRES_EPOCH
    return epoch + micros * _MICROSECOND


def _interval_from_binary(data: bytes) -> Any:
    if len(data) != 16:
        raise InvalidBinaryDataError("incorrect binary data format for interval")
    micros, days, months = struct.unpack("!qii", data)
    return interval_value(months, days, micros)


def _jsonb_from_binary(data: bytes) -> str:
    if data[:1] != b"\x01":
        raise InvalidBinaryDataError("unsupported jsonb version number")
    return _checked_json(data[1:].decode("utf-8"))


def _uuid_from_binary(data: bytes) -> uuid.UUID:
    if len(data) != 16:
        raise InvalidBinaryDataError("incorrect binary data format for uuid")
    return uuid.UUID(bytes=data)


def _utf8_text(data: bytes) -> str:
    return data.decode("utf-8")


_BINARY_PARAMETERS: dict[int, Callable[[bytes], Any]] = {
    INT2: _unpacker("!h"), INT4: _unpacker("!i"), INT8: _unpacker("!q"),
    FLOAT4: _unpacker("!f"), FLOAT8: _unpacker("!d"), BOOL: _unpacker("!?"),
    NUMERIC: numeric_from_binary,
    BYTEA: bytes,
    TEXT: _utf8_text, VARCHAR: _utf8_text, BPCHAR: _utf8_text, UNKNOWN: _utf8_text,
    0: _utf8_text,
    JSON: lambda b: _checked_json(b.decode("utf-8")), JSONB: _jsonb_from_binary,
    DATE: _date_from_binary, TIME: _time_from_binary,
    TIMESTAMP: lambda b: _timestamp_from_binary(b, with_zone=False),
    TIMESTAMPTZ: lambda b: _timestamp_from_binary(b, with_zone=True),
    INTERVAL: _interval_from_binary, UUID: _uuid_from_binary,
}  # fmt: skip


def decode_parameter(value: bytes | None, oid: int, format_code: int) -> Any:
    """A Python value for the engine from one Bind parameter of type ``oid``.

    Text of an unknown or unlisted type stays text: DuckDB casts it where it is used.
    """
    if value is None:
        return None
    element_oid = arrays.ELEMENT_OIDS.get(oid)
    if element_oid is not None:
        return _decode_array(value, element_oid, format_code)
    name = _TYPE_NAMES.get(oid, f"OID {oid}")
    if format_code == 1:
        decode = _BINARY_PARAMETERS.get(oid)
        if decode is None:
            raise FeatureNotSupportedError(f"binary parameters of type OID {oid} are not supported")
        try:
            return decode(value)
        except (ValueError, struct.error, UnicodeDecodeError, OverflowError) as error:
            raise InvalidBinaryDataError(
                f"incorrect binary data format in a parameter of type {name}: {error}"
            ) from None
    text = _parameter_text(value, format_code)
    convert = _TEXT_PARAMETERS.get(oid)
    if convert is None:
        return text
    try:
        return convert(text)
    except (ValueError, decimal.InvalidOperation, OverflowError):
        if oid in (DATE, TIME, TIMESTAMP, TIMESTAMPTZ):
            raise InvalidDatetimeFormatError(
                f'invalid input syntax for type {name}: "{text}"'
            ) from None
        raise InvalidTextRepresentationError(
            f'invalid input syntax for type {name}: "{text}"'
        ) from None


def _decode_array(value: bytes, element_oid: int, format_code: int) -> list[Any]:
    """An array parameter as nested lists, its elements decoded as parameters of their
    type (``sql.pgwire.codec.arrays``)."""
    if format_code == 1:
        return arrays.decode_binary(
            value, element_oid, lambda data: decode_parameter(data, element_oid, 1)
        )
    return arrays.decode_text(
        _parameter_text(value, format_code),
        lambda item: decode_parameter(item.encode("utf-8"), element_oid, 0),
    )


def _parameter_text(value: bytes, format_code: int) -> str:
    """A text-format parameter as a string (22P02 for bad UTF-8); any other non-binary
    format code is refused."""
    if format_code != 0:
        raise InvalidBinaryDataError(f"unsupported format code: {format_code}")
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidTextRepresentationError(
            'invalid byte sequence for encoding "UTF8" in a parameter'
        ) from None


def decode_parameters(
    values: Sequence[bytes | None], oids: Sequence[int], formats: Sequence[int]
) -> list[Any]:
    """Bind's parameter values, each as ``decode_parameter`` gives it (same values, same
    errors), with the hot cases of a many-row INSERT short-cut: binary ``bytea`` is the
    bytes as sent, text ``bytea`` in hex (``\\x...``) goes through ``binascii`` (anything it
    refuses, such as whitespace between digits, takes the general path). The three
    sequences have one entry per parameter; values are ``bytes`` (as ``parse_bind`` gives
    them) or None."""
    count = len(values)
    if count == len(oids) == len(formats) and oids.count(BYTEA) == formats.count(1) == count:
        return list(values)  # all binary bytea (psycopg's bytes): nothing to decode
    decoded: list[Any] = []
    append = decoded.append
    for value, oid, fmt in zip(values, oids, formats, strict=True):
        if value is None:
            append(None)
        elif oid == BYTEA and fmt == 1:
            append(bytes(value))
        elif oid == BYTEA and fmt == 0 and value[:2] == b"\\x":
            try:
                append(binascii.a2b_hex(value[2:]))
            except binascii.Error:
                append(decode_parameter(value, oid, fmt))
        else:
            append(decode_parameter(value, oid, fmt))
    return decoded
