"""Arrow types as PostgreSQL types, values as wire fields, parameters from the wire.

Results go out in text format (binary on request for bool, integers, floats, text and
bytea). ``bytea`` is always ``\\x`` hex; timestamps with a time zone are shown in UTC
(``+00``), as the server advertises ``TimeZone=UTC``; lists, structs and maps are JSON.
"""

from __future__ import annotations

import datetime
import decimal
import json
import math
import struct
from collections.abc import Callable
from typing import Any

import pyarrow as pa

from sql import formatting
from storage.errors import FeatureNotSupportedError, InvalidBinaryDataError

BOOL, BYTEA, INT8, INT2, INT4, TEXT, JSON = 16, 17, 20, 21, 23, 25, 114
FLOAT4, FLOAT8, UNKNOWN, VARCHAR = 700, 701, 705, 1043
DATE, TIME, TIMESTAMP, TIMESTAMPTZ, INTERVAL, NUMERIC = 1082, 1083, 1114, 1184, 1186, 1700
UUID, JSONB = 2950, 3802

_SIZES = {BOOL: 1, INT2: 2, INT4: 4, INT8: 8, FLOAT4: 4, FLOAT8: 8, DATE: 4, TIME: 8,
          TIMESTAMP: 8, TIMESTAMPTZ: 8, INTERVAL: 16, UUID: 16}  # fmt: skip


def type_oid(data_type: pa.DataType) -> int:
    """The PostgreSQL type OID a column of ``data_type`` is described with."""
    t = data_type
    if pa.types.is_dictionary(t):
        return type_oid(t.value_type)
    if isinstance(t, pa.ExtensionType):
        name = getattr(t, "extension_name", "")
        if "json" in name:
            return JSON
        if "uuid" in name:
            return UUID
        return type_oid(t.storage_type)
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
        (lambda x: pa.types.is_binary(x) or pa.types.is_large_binary(x), BYTEA),
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


def type_size(oid: int) -> int:
    return _SIZES.get(oid, -1)


# -- text output ------------------------------------------------------------------------------
def _float_text(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return repr(value)


def _timestamptz_text(value: datetime.datetime) -> str:
    if value.tzinfo is not None:
        value = value.astimezone(datetime.UTC).replace(tzinfo=None)
    return value.isoformat(sep=" ") + "+00"


def _interval_text(value: Any) -> str:
    if isinstance(value, datetime.timedelta):
        sign = "-" if value < datetime.timedelta(0) else ""
        value = abs(value)
        hours, rest = divmod(value.seconds, 3600)
        minutes, seconds = divmod(rest, 60)
        clock = f"{sign}{hours:02d}:{minutes:02d}:{seconds:02d}"
        if value.microseconds:
            clock += f".{value.microseconds:06d}"
        return f"{sign}{value.days} days {clock}" if value.days else clock
    months, days, nanoseconds = value  # pyarrow MonthDayNano
    micros = nanoseconds // 1000
    text = _interval_text(datetime.timedelta(microseconds=micros)) if micros else "00:00:00"
    return f"{months} mons {days} days {text}"


def _json_text(value: Any) -> str:
    return json.dumps(formatting.json_value(value), ensure_ascii=False)


def _text_encoder(oid: int) -> Callable[[Any], str]:
    if oid == BOOL:
        return lambda v: "t" if v else "f"
    if oid in (FLOAT4, FLOAT8):
        return _float_text
    if oid == BYTEA:
        return lambda v: "\\x" + bytes(v).hex()
    if oid == TIMESTAMP:
        return lambda v: v.isoformat(sep=" ") if isinstance(v, datetime.datetime) else str(v)
    if oid == TIMESTAMPTZ:
        return lambda v: _timestamptz_text(v) if isinstance(v, datetime.datetime) else str(v)
    if oid == INTERVAL:
        return _interval_text
    if oid == JSON:
        return lambda v: v if isinstance(v, str) else _json_text(v)
    if oid in (INT2, INT4, INT8, NUMERIC, TEXT):
        return lambda v: v if isinstance(v, str) else (
            format(v, "f") if isinstance(v, decimal.Decimal) else str(v))  # fmt: skip
    return formatting.text_value


def _binary_encoder(oid: int) -> Callable[[Any], bytes] | None:
    shapes = {INT2: "!h", INT4: "!i", INT8: "!q", FLOAT4: "!f", FLOAT8: "!d", BOOL: "!?"}
    if oid in shapes:
        return struct.Struct(shapes[oid]).pack
    if oid == BYTEA:
        return bytes
    if oid in (TEXT, JSON):
        text = _text_encoder(oid)
        return lambda v: text(v).encode("utf-8")
    return None


def column_encoder(oid: int, format_code: int) -> Callable[[Any], bytes]:
    """Turns one non-null value of a column of type ``oid`` into its wire field."""
    if format_code == 1:
        binary = _binary_encoder(oid)
        if binary is None:
            raise FeatureNotSupportedError(f"binary output of type OID {oid} is not supported")
        return binary
    text = _text_encoder(oid)
    return lambda v: text(v).encode("utf-8")


def encode_rows(table: pa.Table, oids: list[int], formats: list[int]) -> list[list[bytes | None]]:
    """The rows of ``table`` as lists of wire fields (None for NULL)."""
    encoders = [column_encoder(o, f) for o, f in zip(oids, formats, strict=True)]
    rows: list[list[bytes | None]] = []
    for batch in table.to_batches():
        columns = []
        for encode, column in zip(encoders, batch.columns, strict=True):
            columns.append([None if v is None else encode(v) for v in column.to_pylist()])
        rows.extend(list(row) for row in zip(*columns, strict=True))
    return rows


# -- parameters ---------------------------------------------------------------------------------
_BINARY_PARAMETERS: dict[int, Callable[[bytes], Any]] = {
    INT2: lambda b: struct.unpack("!h", b)[0],
    INT4: lambda b: struct.unpack("!i", b)[0],
    INT8: lambda b: struct.unpack("!q", b)[0],
    FLOAT4: lambda b: struct.unpack("!f", b)[0],
    FLOAT8: lambda b: struct.unpack("!d", b)[0],
    BOOL: lambda b: struct.unpack("!?", b)[0],
    BYTEA: bytes,
    TEXT: lambda b: b.decode("utf-8"),
    VARCHAR: lambda b: b.decode("utf-8"),
    UNKNOWN: lambda b: b.decode("utf-8"),
    0: lambda b: b.decode("utf-8"),
    JSON: lambda b: b.decode("utf-8"),
    JSONB: lambda b: b[1:].decode("utf-8"),
}


def _text_bytea(text: str) -> bytes:
    if text.startswith("\\x"):
        return bytes.fromhex(text[2:])
    return text.encode("utf-8")


_TEXT_PARAMETERS: dict[int, Callable[[str], Any]] = {
    INT2: int,
    INT4: int,
    INT8: int,
    FLOAT4: float,
    FLOAT8: float,
    NUMERIC: decimal.Decimal,
    BOOL: lambda t: t.strip().lower() in ("t", "true", "1", "on", "yes", "y"),
    BYTEA: _text_bytea,
}


def decode_parameter(value: bytes | None, oid: int, format_code: int) -> Any:
    """A Python value for the engine from one Bind parameter."""
    if value is None:
        return None
    try:
        if format_code == 1:
            decode = _BINARY_PARAMETERS.get(oid)
            if decode is None:
                raise FeatureNotSupportedError(
                    f"binary parameters of type OID {oid} are not supported"
                )
            return decode(value)
        text = value.decode("utf-8")
        convert = _TEXT_PARAMETERS.get(oid)
        return text if convert is None else convert(text)
    except (ValueError, struct.error, UnicodeDecodeError, decimal.InvalidOperation) as error:
        raise InvalidBinaryDataError(
            f"invalid value for parameter of type OID {oid}: {error}"
        ) from None
