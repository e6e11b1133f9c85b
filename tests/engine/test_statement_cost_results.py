"""Small results without DuckDB's relation (``engine.tables.query_arrow``): a text whose
last result was small and of plain types runs through ``execute`` + ``fetchmany``, and the
Arrow table built from its rows is the one DuckDB's relation gives, type for type."""

from __future__ import annotations

import math
from typing import Any

import pyarrow as pa
import pytest

from engine import tables


@pytest.fixture
def small_path(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The texts that went through the rows' way."""
    taken: list[str] = []
    original = tables._query_small

    def spying(cursor: Any, sql: str, parameters: Any) -> pa.Table | None:
        taken.append(sql)
        return original(cursor, sql, parameters)

    monkeypatch.setattr(tables, "_query_small", spying)
    return taken


def _twice(cursor: tables.Connection, sql: str, parameters: Any = None) -> tuple[Any, Any]:
    """The relation's table (first run) and the rows' table (second run) of one text."""
    first = tables.query_arrow(cursor, sql, parameters)
    second = tables.query_arrow(cursor, sql, parameters)
    return first, second


VALUES = {
    "BOOLEAN": "[true, false, NULL]",
    "TINYINT": "[-128, 127, NULL]",
    "SMALLINT": "[-32768, 32767, NULL]",
    "INTEGER": "[-2147483648, 2147483647, NULL]",
    "BIGINT": "[-9223372036854775808, 9223372036854775807, NULL]",
    "UTINYINT": "[0, 255, NULL]",
    "USMALLINT": "[0, 65535, NULL]",
    "UINTEGER": "[0, 4294967295, NULL]",
    "UBIGINT": "[0, 18446744073709551615, NULL]",
    "FLOAT": "[-1.5, 3.4e38, 'nan', 'inf', '-inf', NULL]",
    "DOUBLE": "[-0.0, 1.7e308, 'nan', '-inf', 5e-324, NULL]",
    "VARCHAR": "['', 'ü€𝄞', 'a''b', NULL]",
    "BLOB": "['\\x00\\xFF'::BLOB, ''::BLOB, NULL]",
}


def test_every_plain_type_has_a_value_list() -> None:
    assert set(VALUES) == set(tables._ROW_ARROW_TYPES)


@pytest.mark.parametrize("kind", list(VALUES))
def test_rows_give_duckdb_s_own_arrow_table(
    cursor: tables.Connection, small_path: list[str], kind: str
) -> None:
    sql = f"SELECT x, x AS x FROM unnest({VALUES[kind]}::{kind}[]) AS t(x)"
    relation, rows = _twice(cursor, sql)
    assert small_path == [sql]
    assert rows.schema.equals(relation.schema, check_metadata=True), (rows.schema, relation.schema)
    for mine, theirs in zip(rows.columns, relation.columns, strict=True):
        assert _same_values(mine.to_pylist(), theirs.to_pylist())


def _same_values(mine: list[Any], theirs: list[Any]) -> bool:
    def key(value: Any) -> Any:
        if isinstance(value, float) and math.isnan(value):
            return "nan"
        if isinstance(value, float):
            return (value, math.copysign(1.0, value))
        return value

    return [key(v) for v in mine] == [key(v) for v in theirs]


def test_a_result_that_grows_past_the_bound_is_whole(
    cursor: tables.Connection, small_path: list[str]
) -> None:
    cursor.execute("CREATE TABLE t AS SELECT i AS id, 'v' || i AS v FROM range(1000) r(i)")
    sql = "SELECT id, v FROM t WHERE id < ? ORDER BY id"
    few = tables.query_arrow(cursor, sql, [3])
    assert few is not None and few.num_rows == 3
    many = tables.query_arrow(cursor, sql, [500])
    assert small_path == [sql]
    expected = cursor.sql("SELECT id, v FROM t WHERE id < 500 ORDER BY id").to_arrow_table()
    assert many is not None and many.equals(expected, check_metadata=True)
    tables.query_arrow(cursor, sql, [3])
    assert small_path == [sql]  # a big result sends the text back to the relation


def test_a_text_whose_types_changed_gives_duckdb_s_arrow(
    cursor: tables.Connection, small_path: list[str]
) -> None:
    cursor.execute("CREATE TABLE t (x INTEGER)")
    cursor.execute("INSERT INTO t VALUES (1)")
    sql = "SELECT x FROM t"
    tables.query_arrow(cursor, sql)
    cursor.execute("ALTER TABLE t ALTER x TYPE TIMESTAMP USING TIMESTAMP 'infinity'")
    table = tables.query_arrow(cursor, sql)
    assert small_path == [sql]
    expected = cursor.sql(sql).to_arrow_table()
    assert table is not None and table.equals(expected, check_metadata=True)
    assert tables._small_results[sql] is False


def test_statements_without_rows_and_dml_counts_match(
    cursor: tables.Connection, small_path: list[str]
) -> None:
    cursor.execute("CREATE TABLE t (x INTEGER)")
    for sql in ("INSERT INTO t VALUES (1)", "UPDATE t SET x = x + 1", "SET search_path = 'main'"):
        relation, rows = _twice(cursor, sql)
        assert rows.equals(relation, check_metadata=True), sql
    assert len(small_path) == 3


def test_the_cursor_runs_the_next_statement_after_a_small_result(
    cursor: tables.Connection,
) -> None:
    for _ in range(3):
        table = tables.query_arrow(cursor, "SELECT 1 AS one")
        assert table is not None and table.to_pylist() == [{"one": 1}]
        assert cursor.execute("SELECT 2").fetchall() == [(2,)]


def test_errors_are_translated_on_the_rows_way(
    cursor: tables.Connection, small_path: list[str]
) -> None:
    sql = "SELECT 10 // ?"
    tables.query_arrow(cursor, sql, [2])
    with pytest.raises(tables.DivisionByZeroError):
        tables.query_arrow(cursor, sql, [0])
    assert small_path == [sql]
    assert cursor.execute("SELECT 3").fetchall() == [(3,)]


# -- streams (the wire's queries): ``tables.batch_reader`` ----------------------------------
def _read_all(cursor: tables.Connection, sql: str, parameters: Any = None) -> tuple[Any, Any]:
    reader, duckdb_types = tables.batch_reader(cursor, sql, parameters, 8)
    try:
        return reader.read_all(), duckdb_types
    finally:
        reader.close()


def test_a_small_plain_stream_takes_the_rows_way_the_second_time(
    cursor: tables.Connection, small_path: list[str]
) -> None:
    sql = "SELECT i AS n, 'v' || i AS v, NULL::BLOB AS b FROM range(20) r(i) WHERE i < ?"
    first, first_types = _read_all(cursor, sql, [20])
    assert tables._small_results[sql] is True
    second, second_types = _read_all(cursor, sql, [20])
    assert second.equals(first, check_metadata=True)
    assert first_types == second_types == ["BIGINT", "VARCHAR", "BLOB"]
    assert cursor.execute("SELECT 7").fetchall() == [(7,)]


def test_a_stream_that_grew_reads_whole_or_closes_early(cursor: tables.Connection) -> None:
    sql = "SELECT i FROM range(?) r(i)"
    tables.query_arrow(cursor, sql, [3])
    assert tables._small_results[sql] is True
    whole, _ = _read_all(cursor, sql, [1000])
    assert whole.column(0).to_pylist() == list(range(1000))
    assert tables._small_results[sql] is False
    tables._small_results.texts.put(sql, True, len(sql))
    reader, _ = tables.batch_reader(cursor, sql, [1000], 8)
    assert reader.read_next_batch().num_rows > 0
    reader.close()  # early: the cursor is free again
    assert cursor.execute("SELECT 8").fetchall() == [(8,)]
