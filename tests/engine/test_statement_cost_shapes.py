"""A text not seen yet takes the rows' way when its shape (the text with its literals taken
out) gave small plain results and never another (``engine.tables._rows_way``): the texts
of a client that binds values on its side (psycopg's ``ClientCursor``, psycopg2) differ
only in their literals, and each would otherwise pay DuckDB's relation on its one run.
The results are DuckDB's own either way (docs/statement_cost.md, round 5)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from engine import tables


def _relation(cursor: tables.Connection, sql: str) -> pa.Table:
    return cursor.sql(sql).to_arrow_table()


def _table(cursor: tables.Connection, sql: str) -> pa.Table:
    table = tables.query_arrow(cursor, sql)
    assert table is not None
    return table


@pytest.fixture
def t(cursor: tables.Connection) -> tables.Connection:
    cursor.execute("CREATE TABLE t AS SELECT i AS id, 'v' || i AS v FROM range(1000) r(i)")
    return cursor


def test_shapes_take_out_literals_only() -> None:
    shape = tables._small_results.shape
    assert shape("SELECT v FROM t WHERE id = 1") == shape("SELECT v FROM t WHERE id = 20")
    assert shape("SELECT v FROM t WHERE k = 'a'") == shape("SELECT v FROM t WHERE k = 'b''c'")
    assert shape("SELECT v FROM t WHERE id = 1") != shape("SELECT v FROM t WHERE di = 1")
    assert shape("SELECT v FROM t WHERE id = 1") != shape("SELECT v FROM t WHERE id > 1")
    assert shape("SELECT v FROM t WHERE id = 1") != shape("SELECT v FROM t WHERE id = -1")
    assert shape("SELECT DATE '2024-01-01'") != shape("SELECT '2024-01-01'")
    assert shape("SELECT 1 -- one") == shape("SELECT 2 -- two")  # comments are no tokens
    assert shape("x" * 100_000) is None  # too long to keep


def test_a_new_text_of_a_small_shape_takes_the_rows_way_at_once(
    t: tables.Connection, rows_way: list[str]
) -> None:
    first = "SELECT v, id FROM t WHERE id = 1"
    assert _table(t, first).to_pylist() == [{"v": "v1", "id": 1}]
    assert rows_way == []  # not seen and no shape known: DuckDB's relation
    for key in (2, 999, 5000):
        sql = f"SELECT v, id FROM t WHERE id = {key}"
        table = _table(t, sql)
        assert table.equals(_relation(t, sql), check_metadata=True), sql
    assert rows_way == [f"SELECT v, id FROM t WHERE id = {key}" for key in (2, 999, 5000)]


def test_a_shape_that_gave_a_big_result_stays_with_the_relation(
    t: tables.Connection, rows_way: list[str]
) -> None:
    _table(t, "SELECT id FROM t WHERE id < 3 ORDER BY id")  # small: the shape is known small
    big = "SELECT id FROM t WHERE id < 500 ORDER BY id"
    table = _table(t, big)  # tried on the rows' way, bigger: the rest from DuckDB
    assert rows_way == [big]
    assert table.equals(_relation(t, big), check_metadata=True)
    for limit in (4, 5, 6):  # small again, but the shape stays with the relation for good
        sql = f"SELECT id FROM t WHERE id < {limit} ORDER BY id"
        assert _table(t, sql).column(0).to_pylist() == list(range(limit))
    assert rows_way == [big]


def test_a_literal_that_changes_the_types_gives_duckdb_s_table(
    cursor: tables.Connection, rows_way: list[str]
) -> None:
    assert _table(cursor, "SELECT 1 AS x").to_pylist() == [{"x": 1}]
    decimal = "SELECT 1.5 AS x"  # the same shape, but DECIMAL: not a type of the rows' way
    table = _table(cursor, decimal)
    assert rows_way == [decimal]
    assert table.equals(_relation(cursor, decimal), check_metadata=True)
    assert pa.types.is_decimal(table.schema.field("x").type)
    _table(cursor, "SELECT 2 AS x")
    assert rows_way == [decimal]  # the shape went back to the relation


def test_a_new_streamed_text_of_a_small_shape_reads_its_rows_whole(
    t: tables.Connection, rows_way: list[str]
) -> None:
    def read(sql: str) -> tuple[Any, pa.Table]:
        reader, _ = tables.batch_reader(t, sql, None, 8)
        try:
            return reader, reader.read_all()
        finally:
            reader.close()

    read("SELECT v FROM t WHERE id = 7")
    reader, table = read("SELECT v FROM t WHERE id = 8")
    assert isinstance(reader, tables.RowsReader)
    assert table.equals(_relation(t, "SELECT v FROM t WHERE id = 8"), check_metadata=True)
    assert rows_way == ["SELECT v FROM t WHERE id = 8"]

