"""Running ``AppendRecords``: rows (literal or from a query) into wire batches.

Column mapping: ``data`` (required; text is stored as its UTF-8 bytes),
``producer_id``, ``seq_no``, ``message_group_id``, ``partition``,
``created_at`` (default: now), ``metadata`` (a MAP or a JSON object of
strings), ``codec``. Statement options (``WITH``) give defaults for every row.
A ``codec`` other than raw compresses each message here, on the producer's
side, as YDB's SDKs do.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engine.clock import Clock
from storage import limits
from storage.codecs import Codec, encode, parse_codec
from storage.errors import InvalidParameterValueError, LimitExceededError
from storage.record_batch import METADATA_TYPE, TIMESTAMP, WIRE_SCHEMA

INSERT_COLUMNS = (
    "data",
    "producer_id",
    "seq_no",
    "message_group_id",
    "partition",
    "created_at",
    "metadata",
    "codec",
)
RETURNING_COLUMNS = ("partition", "offset", "status", "seq_no", "producer_id")


def table_from_rows(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> pa.Table:
    """Literal VALUES rows as an Arrow table (types inferred per column)."""
    data = {}
    for index, name in enumerate(columns):
        values = [row[index] for row in rows]
        if name == "data":
            values = [v.encode() if isinstance(v, str) else v for v in values]
            data[name] = pa.array(values, pa.binary())
        elif name == "metadata":
            data[name] = pa.array(values)
        else:
            data[name] = pa.array(values)
    return pa.table(data)


def build_batches(
    table: pa.Table, options: dict[str, Any], clock: Clock
) -> list[tuple[int | None, pa.RecordBatch]]:
    """Wire batches to append, each with its explicit partition (or None to route)."""
    if "data" not in table.column_names:
        raise InvalidParameterValueError('INSERT INTO TOPIC needs a "data" column')
    count = table.num_rows
    if count > limits.BATCH_MESSAGES_MAX:
        raise LimitExceededError(
            f"{count} messages in one statement exceed the limit of {limits.BATCH_MESSAGES_MAX}"
        )
    codec_default = options.get("codec")
    codecs = _codec_column(table, codec_default, count)
    data = _data_column(table)
    if data.null_count:
        raise InvalidParameterValueError("message data must not be NULL")
    data = _compress(data, codecs)
    columns = [
        _column(table, "seq_no", options, pa.int64(), count),
        _column(table, "producer_id", options, pa.string(), count),
        _column(table, "message_group_id", options, pa.string(), count),
        _created_at(table, count, clock),
        pa.array(codecs, pa.uint8()),
        data,
        _metadata(table, count),
    ]
    batch = pa.RecordBatch.from_arrays(columns, schema=WIRE_SCHEMA)
    partitions = _column(table, "partition", options, pa.int64(), count)
    if partitions.null_count == count:
        return [(None, batch)]
    if partitions.null_count:
        raise InvalidParameterValueError("partition must be given for every row or for none")
    values = partitions.to_numpy()
    return [(int(p), batch.filter(pa.array(values == p))) for p in np.unique(values)]


def _data_column(table: pa.Table) -> pa.Array:
    """The data column as binary: bytes as they are, text as UTF-8, others as text."""
    column = _single_chunk(table.column("data"))
    if pa.types.is_binary(column.type):
        return column
    if pa.types.is_large_binary(column.type) or pa.types.is_binary_view(column.type):
        return pc.cast(column, pa.binary())
    return pc.cast(pc.cast(column, pa.string()), pa.binary())


def _codec_column(table: pa.Table, default: Any, count: int) -> np.ndarray:
    if "codec" in table.column_names:
        names = table.column("codec").to_pylist()
        return np.array([parse_codec(n or default or "raw").value for n in names], dtype=np.uint8)
    codec = parse_codec(default or "raw")
    return np.full(count, codec.value, dtype=np.uint8)


def _compress(data: pa.Array, codecs: np.ndarray) -> pa.Array:
    if not codecs.size or (codecs.min() == Codec.RAW.value and codecs.max() == Codec.RAW.value):
        return data
    values = data.to_pylist()
    compressed = [encode(Codec(int(c)), v) for c, v in zip(codecs, values, strict=True)]
    return pa.array(compressed, pa.binary())


def _column(
    table: pa.Table, name: str, options: dict[str, Any], kind: pa.DataType, count: int
) -> pa.Array:
    if name in table.column_names:
        column = _single_chunk(table.column(name))
        if pa.types.is_null(column.type) and options.get(name) is not None:
            return pa.array([options[name]] * count, kind)
        if column.type == kind:
            return column
        try:
            return pc.cast(column, kind)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as error:
            raise InvalidParameterValueError(f'column "{name}": {error}') from None
    default = options.get(name)
    if default is None:
        return _nulls(count, kind)
    return pa.array([default] * count, kind)


def _single_chunk(column: pa.ChunkedArray) -> pa.Array:
    """The column as one array (no copy when it already is one chunk)."""
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()


_NULLS: dict[tuple[pa.DataType, int], pa.Array] = {}
NULLS_CACHED_MAX = 64


def _nulls(count: int, kind: pa.DataType) -> pa.Array:
    """An all-null column; cached by type and length (arrays are immutable), because
    building one costs tens of microseconds and most statements repeat their shape."""
    key = (kind, count)
    cached = _NULLS.get(key)
    if cached is None:
        if len(_NULLS) >= NULLS_CACHED_MAX:
            _NULLS.clear()
        cached = _NULLS[key] = pa.nulls(count, kind)
    return cached


def _created_at(table: pa.Table, count: int, clock: Clock) -> pa.Array:
    if "created_at" in table.column_names:
        column = _single_chunk(table.column("created_at"))
        if pa.types.is_timestamp(column.type):
            return pc.cast(column, TIMESTAMP)
        values = [
            datetime.fromisoformat(v) if isinstance(v, str) else v for v in column.to_pylist()
        ]
        return pa.array(values, TIMESTAMP)
    now = np.full(count, clock.now_us(), dtype=np.int64)
    return pa.Array.from_buffers(TIMESTAMP, count, [None, pa.py_buffer(now)])


def _metadata(table: pa.Table, count: int) -> pa.Array:
    if "metadata" not in table.column_names:
        return _nulls(count, METADATA_TYPE)
    values = table.column("metadata").to_pylist()
    rows = []
    for value in values:
        if value is None:
            rows.append(None)
            continue
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError:
                raise InvalidParameterValueError("metadata must be a JSON object") from None
        items = value.items() if isinstance(value, dict) else value
        rows.append([(str(k), v.encode() if isinstance(v, str) else bytes(v)) for k, v in items])
    if any(r is not None and len(r) > limits.METADATA_ITEMS_MAX for r in rows):
        raise LimitExceededError(f"metadata holds at most {limits.METADATA_ITEMS_MAX} items")
    return pa.array(rows, METADATA_TYPE)
