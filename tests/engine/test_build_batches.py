"""``engine.writes.build_batches``: the codec column and the data of every combination of
a codec column, a statement's default codec and message counts.

Raw messages (no codec column, default unset or ``raw``) take a shortcut: no compression
pass and a cached codec column. These tests pin what the shortcut must give: each
message's codec id is ``Codec.RAW`` (1, not 0), the cached column is shared but never
wrong for another length, and a compressed or mixed statement still compresses.
"""

from __future__ import annotations

import pyarrow as pa
import pytest

from engine.writes import build_batches, table_from_rows
from storage.clock import ManualClock
from storage.codecs import Codec, decode, parse_codec
from storage.errors import InvalidParameterValueError
from storage.record_batch import WIRE_SCHEMA

CLOCK = ManualClock()


def _batch(columns: tuple[str, ...], rows: list[tuple], **options: object) -> pa.RecordBatch:
    [(partition, batch)] = build_batches(table_from_rows(columns, rows), dict(options), CLOCK)
    assert partition is None
    assert batch.schema.equals(WIRE_SCHEMA)
    return batch


@pytest.mark.parametrize("count", [1, 2, 7, 1, 7])
@pytest.mark.parametrize("default", [None, "raw", "RAW"])
def test_raw_messages_are_marked_raw_and_kept_as_they_are(count: int, default: str | None) -> None:
    rows = [(f"m{i}",) for i in range(count)]
    options = {} if default is None else {"codec": default}
    batch = _batch(("data",), rows, **options)
    assert batch.column("codec").to_pylist() == [Codec.RAW.value] * count
    assert batch.column("data").to_pylist() == [f"m{i}".encode() for i in range(count)]


@pytest.mark.parametrize("default", ["gzip", "zstd"])
def test_a_default_codec_compresses_every_message(default: str) -> None:
    codec = parse_codec(default)
    batch = _batch(("data",), [(b"x" * 300,), (b"y" * 5,)], codec=default)
    assert batch.column("codec").to_pylist() == [codec.value] * 2
    stored = batch.column("data").to_pylist()
    assert stored[0] != b"x" * 300
    assert [decode(codec, v) for v in stored] == [b"x" * 300, b"y" * 5]


def test_a_codec_column_chooses_per_message_and_falls_back_to_the_default() -> None:
    rows = [(b"a" * 100, "raw"), (b"b" * 100, None), (b"c" * 100, "gzip")]
    batch = _batch(("data", "codec"), rows, codec="zstd")
    ids = batch.column("codec").to_pylist()
    assert ids == [Codec.RAW.value, parse_codec("zstd").value, parse_codec("gzip").value]
    stored = batch.column("data").to_pylist()
    assert [decode(Codec(i), v) for i, v in zip(ids, stored, strict=True)] == [
        b"a" * 100, b"b" * 100, b"c" * 100,
    ]  # fmt: skip


def test_a_bad_default_codec_is_refused_even_for_raw_data() -> None:
    with pytest.raises(InvalidParameterValueError):
        _batch(("data",), [(b"x",)], codec="snappyish")


def test_null_data_is_refused_before_anything_is_compressed() -> None:
    with pytest.raises(InvalidParameterValueError, match="must not be NULL"):
        _batch(("data",), [(None,)])
    with pytest.raises(InvalidParameterValueError, match="must not be NULL"):
        _batch(("data",), [(None,)], codec="gzip")
