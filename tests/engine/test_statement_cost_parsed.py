"""Parsed statements kept per cursor (``engine.tables.CursorPlans.statement``): a text the
cursor runs again is executed from the statement DuckDB parsed the first time, and that
gives what the text gives: fresh binding after DDL, ``search_path`` and temp tables,
parameters of each run, the text's errors with their ``LINE n:`` excerpt."""

from __future__ import annotations

import duckdb
import pytest

from engine import tables
from storage import errors, limits


def _statement(cursor: tables.Connection, sql: str) -> duckdb.Statement | str:
    return tables._plans_of(cursor).statement(cursor, sql)


def _parsed(cursor: tables.Connection, sql: str) -> bool:
    """Whether running ``sql`` left its parsed statement with the cursor."""
    return isinstance(tables._plans_of(cursor)._parsed.get(sql), duckdb.Statement)


def test_a_text_is_parsed_once_per_cursor(cursor: tables.Connection) -> None:
    sql = "SELECT v FROM t WHERE k = ?"
    first = _statement(cursor, sql)
    assert isinstance(first, duckdb.Statement)
    assert _statement(cursor, sql) is first
    other = tables._plans_of(cursor.cursor())
    assert other is not tables._plans_of(cursor)  # each cursor keeps its own


def test_texts_that_are_not_one_short_statement_stay_texts(cursor: tables.Connection) -> None:
    assert _statement(cursor, "SELECT 1; SELECT 2") == "SELECT 1; SELECT 2"
    assert _statement(cursor, "SELEKT 1") == "SELEKT 1"
    long_text = "SELECT " + " + ".join(["1"] * limits.PARSED_TEXT_CHARS_MAX)
    assert _statement(cursor, long_text) == long_text
    with pytest.raises(errors.SqlSyntaxError) as raised:  # the text's own error
        tables.run(cursor, "SELEKT 1")
    assert "SELEKT" in raised.value.message


def test_parsed_statements_are_bounded_per_cursor(cursor: tables.Connection) -> None:
    plans = tables._plans_of(cursor)
    for index in range(tables.PARSED_PER_CURSOR + 10):
        tables.run(cursor, f"SELECT {index}")
    assert len(plans._parsed) == tables.PARSED_PER_CURSOR
    assert "SELECT 9" not in plans._parsed and "SELECT 137" in plans._parsed
    long_text = "SELECT 1" + " " * (limits.PARSED_TEXT_CHARS_MAX - 10) + "AS x"
    for index in range(limits.PARSED_CHARS_PER_CURSOR_MAX // len(long_text) + 5):
        tables.run(cursor, f"{long_text}{index}")
    assert plans._parsed_chars == sum(map(len, plans._parsed))
    assert plans._parsed_chars <= limits.PARSED_CHARS_PER_CURSOR_MAX
    assert f"{long_text}0" not in plans._parsed


def test_a_parsed_statement_binds_afresh_on_each_run(cursor: tables.Connection) -> None:
    cursor.execute("CREATE TABLE t (k INTEGER, v VARCHAR)")
    cursor.execute("INSERT INTO t VALUES (1, 'a'), (2, 'b')")
    sql = "SELECT * FROM t WHERE k = ?"

    def rows(key: object) -> list[dict[str, object]]:
        table = tables.query_arrow(cursor, sql, [key])
        assert table is not None
        return table.to_pylist()

    assert rows(1) == [{"k": 1, "v": "a"}]  # the relation's way
    assert rows(2) == [{"k": 2, "v": "b"}]  # the rows' way, parsed statement
    assert _parsed(cursor, sql)
    cursor.execute("ALTER TABLE t ADD COLUMN w INTEGER DEFAULT 7")
    assert rows(1) == [{"k": 1, "v": "a", "w": 7}]
    cursor.execute("CREATE SCHEMA s")
    cursor.execute("CREATE TABLE s.t (k BIGINT, z VARCHAR)")
    cursor.execute("INSERT INTO s.t VALUES (1, 'other')")
    cursor.execute("SET search_path = 's'")
    assert rows(1) == [{"k": 1, "z": "other"}]
    cursor.execute("SET search_path = 'main'")
    cursor.execute("CREATE TEMP TABLE t (k INTEGER)")
    cursor.execute("INSERT INTO temp.t VALUES (1)")
    assert rows(1) == [{"k": 1}]
    assert rows("1") == [{"k": 1}]  # the parameter converts as the text's would


def test_a_parsed_statement_fails_as_its_text(cursor: tables.Connection) -> None:
    cursor.execute("CREATE TABLE t AS SELECT 1 AS k")
    sql = "SELECT k FROM t WHERE k = ?::INTEGER"
    assert tables.query_arrow(cursor, sql, [1]) is not None
    assert tables.query_arrow(cursor, sql, [1]) is not None
    assert _parsed(cursor, sql)
    failures = []
    for parameters in (["x"], [1, 2]):
        with pytest.raises(errors.TopicbaseError) as raised:
            tables.query_arrow(cursor, sql, parameters)
        failures.append((parameters, raised.value))
    cursor.execute("DROP TABLE t")
    with pytest.raises(errors.TopicbaseError) as gone:
        tables.query_arrow(cursor, sql, [1])
    assert gone.value.sqlstate == "42P01"
    assert "LINE 1: SELECT k FROM t WHERE k = ?::INTEGER" in gone.value.message
    failures.append(([1], gone.value))
    assert [error.sqlstate for _, error in failures] == ["22P02", "22P02", "42P01"]
    # The same errors from the text, on a cursor that never parsed it.
    fresh = cursor.cursor()
    for index, (parameters, error) in enumerate(failures):
        if index == 2:
            fresh.execute("DROP TABLE t")
        else:
            fresh.execute("CREATE OR REPLACE TABLE t AS SELECT 1 AS k")
        with pytest.raises(errors.TopicbaseError) as again, tables.translated():
            fresh.execute(sql, parameters)
        assert (again.value.sqlstate, again.value.message) == (error.sqlstate, error.message)


def test_dml_counts_and_internal_statements_run_parsed(cursor: tables.Connection) -> None:
    tables.run(cursor, "CREATE TABLE t (k INTEGER PRIMARY KEY, n BIGINT)")
    insert = "INSERT INTO t VALUES (?, ?)"
    for key in range(3):
        assert tables.execute_count(cursor, insert, [key, 10]) == 1
    assert _parsed(cursor, insert)
    update = "UPDATE t SET n = n + ? WHERE k < ?"
    assert tables.execute_count(cursor, update, [1, 2]) == 2
    assert tables.execute_count(cursor, update, [1, 9]) == 3
    with pytest.raises(errors.TopicbaseError) as duplicate:
        tables.execute_count(cursor, insert, [1, 0])
    assert duplicate.value.sqlstate == "23505"
    tables.run(cursor, "BEGIN")
    tables.run(cursor, "DELETE FROM t WHERE k = ?", [0])
    tables.run(cursor, "ROLLBACK")
    assert tables.fetch_rows(cursor, "SELECT k, n FROM t ORDER BY k") == [
        (0, 12), (1, 12), (2, 11)
    ]  # fmt: skip


def test_relations_and_streams_run_parsed(cursor: tables.Connection) -> None:
    """The relation's way (results over ``SMALL_RESULT_ROWS``, DDL) and streamed reads run
    from the parsed statement too, with the same results and binding."""
    create = "CREATE TABLE t AS SELECT range AS a FROM range(1000)"
    assert tables.query_arrow(cursor, create) is not None
    assert _parsed(cursor, create)
    with pytest.raises(errors.TopicbaseError) as again:  # the text's error, parsed or not
        tables.query_arrow(cursor, create)
    assert again.value.sqlstate == "42P07"
    sql = "SELECT a FROM t WHERE a >= ? ORDER BY a"
    for low in (0, 10, 990):
        table = tables.query_arrow(cursor, sql, [low])
        assert table is not None and table.column("a").to_pylist() == list(range(low, 1000))
    assert _parsed(cursor, sql)
    streamed = "SELECT a * 2 AS b FROM t ORDER BY a"
    for _ in range(2):
        reader, kinds = tables.batch_reader(cursor, streamed, None, 100)
        assert kinds == ["BIGINT"]
        assert reader.read_all().column("b").to_pylist() == [2 * a for a in range(1000)]
        reader.close()
    assert _parsed(cursor, streamed)
    cursor.execute("ALTER TABLE t ADD COLUMN c VARCHAR DEFAULT 'x'")
    table = tables.query_arrow(cursor, "SELECT * FROM t WHERE a >= ? ORDER BY a", [998])
    assert table is not None and table.to_pylist() == [{"a": 998, "c": "x"}, {"a": 999, "c": "x"}]
