"""A streamed query (``engine.tables.batch_reader``: the wire server's simple query, COPY
... TO STDOUT, DECLARE) that the rows' way runs because its text or its shape was learnt
small streams its result however big it came out: the rows past the head come from
DuckDB's streaming ``fetchmany`` (``tables.FetchReader``), one batch at a time, never from
DuckDB's Arrow over the executed result, which takes the whole rest out first (any size,
outside DuckDB's memory limit). A result of other types reads nothing on the rows' way
and streams from the relation.

The tests see streaming by its effect: a row past the first batches that fails
(``error()``) fails when the stream reaches it, not before the first batch; a result
taken out whole fails in ``batch_reader`` itself."""

from __future__ import annotations

from typing import Any

import duckdb
import pyarrow as pa
import pytest

from engine import tables

# Rows below ``good`` are returned; the first row at or past it fails. Far more rows than
# DuckDB computes ahead of a streaming reader (its buffer holds a few MiB at most).
_FAILS_LATE = (
    "SELECT CASE WHEN i < {good} THEN i ELSE error('late row')::BIGINT END AS i{extra} "
    "FROM range({n}) r(i)"
)
_BATCH_ROWS = 1000


def _read_all(cursor: tables.Connection, sql: str) -> tuple[Any, pa.Table]:
    reader, _ = tables.batch_reader(cursor, sql, None, _BATCH_ROWS)
    try:
        return reader, reader.read_all()
    finally:
        reader.close()


def _first_batches_then_the_error(cursor: tables.Connection, sql: str, good: int) -> Any:
    """Stream ``sql``: its first batches come (rows 0, 1, ...) before the failing row is
    computed; reading on reaches it. The reader, for the caller to inspect."""
    reader, _ = tables.batch_reader(cursor, sql, None, _BATCH_ROWS)
    try:
        seen = 0
        for _ in range(3):
            batch = reader.read_next_batch()
            assert batch.column(0).to_pylist() == list(range(seen, seen + batch.num_rows))
            seen += batch.num_rows
        assert 0 < seen < good
        with pytest.raises((duckdb.Error, OSError), match="late row"):
            while True:
                reader.read_next_batch()
    finally:
        reader.close()
    return reader


@pytest.fixture
def one_thread() -> Any:
    """A cursor whose DuckDB runs the query only on the thread that fetches, as far as
    its streaming buffer (a few MiB), so the failing row is computed after the first
    rows. With more threads DuckDB's worker threads run it too, ahead of the reader:
    on a loaded machine they may compute the failing row before the first batch is
    fetched (seen with 2 threads: "late row" from the first ``fetchmany``, 2 runs in 15)."""
    connection = tables.connect(":memory:", threads=1)
    tables._small_results.clear()
    yield connection.cursor()
    connection.close()


def test_a_big_text_of_a_shape_learnt_small_streams(
    one_thread: tables.Connection, rows_way: list[str]
) -> None:
    cursor = one_thread
    small = _FAILS_LATE.format(good=5, extra="", n=3)
    for _ in range(2):
        assert _read_all(cursor, small)[1].column("i").to_pylist() == [0, 1, 2]
    big = _FAILS_LATE.format(good=500_000, extra="", n=10_000_000)
    reader = _first_batches_then_the_error(cursor, big, 500_000)
    assert rows_way == [small, big]  # the shape chose the rows' way, which streamed
    assert isinstance(reader, tables.ChainedReader)
    assert not tables._rows_way(big)  # and both text and shape went back to the relation
    assert not tables._rows_way(_FAILS_LATE.format(good=7, extra="", n=2))


def test_a_text_learnt_small_whose_data_grew_streams(
    one_thread: tables.Connection, rows_way: list[str]
) -> None:
    cursor = one_thread
    cursor.execute("CREATE TABLE t AS SELECT i AS id FROM range(3) r(i)")
    sql = "SELECT CASE WHEN id < 500000 THEN id ELSE error('late row')::BIGINT END FROM t"
    for _ in range(4):  # relation, rows' way (noted), rows' way (PREPAREd), the plan
        assert _read_all(cursor, sql)[1].column(0).to_pylist() == [0, 1, 2]
    assert len(tables._plans_of(cursor)) == 1
    cursor.execute("INSERT INTO t SELECT i FROM range(3, 10000000) r(i)")
    _first_batches_then_the_error(cursor, sql, 500_000)  # the plan, then the text, streamed
    assert rows_way == [sql] * 4
    assert len(tables._plans_of(cursor)) == 0  # the plan is dropped
    assert not tables._rows_way(sql)


def test_a_literal_of_other_types_in_a_shape_learnt_small_streams(
    one_thread: tables.Connection, rows_way: list[str]
) -> None:
    cursor = one_thread
    small = _FAILS_LATE.format(good=5, extra=", 1 AS x", n=3)
    _read_all(cursor, small)  # the relation's way: the shape is learnt small
    big = _FAILS_LATE.format(good=500_000, extra=", 1.5 AS x", n=10_000_000)  # DECIMAL
    reader = _first_batches_then_the_error(cursor, big, 500_000)
    assert rows_way == [big]
    assert isinstance(reader, pa.RecordBatchReader)  # run again on the relation's way


def test_a_big_result_on_the_rows_way_is_duckdb_s_table(
    cursor: tables.Connection, rows_way: list[str]
) -> None:
    """Read out whole, the batches built from ``fetchmany`` are the relation's table
    (values, NULLs, types), whatever ``batch_rows`` cuts them into."""
    shape = (
        "SELECT i, 'v' || i AS v, CASE WHEN i % 7 = 0 THEN NULL ELSE i / 2 END AS d, "
        "i % 2 = 0 AS b, encode('b' || i) AS bl FROM range({n}) r(i)"
    )
    _read_all(cursor, shape.format(n=3))
    for n in (65, 1000, 2500, 3001):
        sql = shape.format(n=n)
        tables._small_results.shapes.put(tables._small_results.shape(sql), True, 0)  # learnt small
        reader, table = _read_all(cursor, sql)
        assert isinstance(reader, tables.ChainedReader), n
        assert table.equals(cursor.sql(sql).to_arrow_table(), check_metadata=True), n
        assert sql in rows_way


def test_fetch_reader_reads_in_batches_and_stops() -> None:
    connection = duckdb.connect()
    cursor = connection.cursor()
    cursor.execute("SELECT i FROM range(2500) r(i)")
    schema = pa.schema([pa.field("i", pa.int64())])
    reader = tables.FetchReader(cursor, schema, 1000)
    sizes = []
    with pytest.raises(StopIteration):
        while True:
            sizes.append(reader.read_next_batch().num_rows)
    assert sizes == [1000, 1000, 500]
    with pytest.raises(StopIteration):
        reader.read_next_batch()
    cursor.execute("SELECT i FROM range(2000) r(i)")  # a multiple of the batch size
    reader = tables.FetchReader(cursor, schema, 1000)
    assert reader.read_all().column("i").to_pylist() == list(range(2000))
    connection.close()
