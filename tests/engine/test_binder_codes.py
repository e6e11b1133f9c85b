"""DuckDB's binder refusals carry PostgreSQL's narrower SQLSTATE, not the 42703 that any
message mentioning "column" fell into before round 28 (PostgreSQL answers ``SELECT a,
count(*) FROM t`` with 42803, ``ORDER BY 3`` of a one-column list with 42P10, an ambiguous
column with 42702), nor the 42P01 of a missing table for a missing type (42704)."""

from __future__ import annotations

import duckdb
import pytest

from engine.tables import translate

CASES = (
    ("SELECT a, count(*) FROM t", "42803"),
    ("SELECT b FROM t GROUP BY a HAVING b > 1", "42803"),
    ("SELECT a FROM t WHERE sum(a) > 1", "42803"),
    ("SELECT sum(sum(a)) FROM t", "42803"),
    ("SELECT 1 GROUP BY sum(1)", "42803"),
    ("SELECT count(*) FILTER (WHERE sum(a) > 1) FROM t", "42803"),
    ("SELECT grouping(a) FROM t", "42803"),
    ("SELECT row_number() OVER () FROM t WHERE row_number() OVER () > 1", "42P20"),
    ("SELECT lag(a) FROM t", "42P20"),
    ("SELECT 1 FROM t QUALIFY 1", "42P20"),
    ("SELECT a FROM t ORDER BY 3", "42P10"),
    ("SELECT a FROM t GROUP BY 5", "42P10"),
    ("SELECT * FROM t t1, t t2 WHERE a = 1", "42702"),
    ("SELECT t.a FROM t, t", "42712"),
    ("SELECT 'x' + 1", "42725"),
    ("SELECT a FROM t UNION SELECT a, b FROM t", "42601"),
    ("SELECT (SELECT a, b FROM t)", "42601"),
    ("INSERT INTO t VALUES (1, 2, 3)", "42601"),
    ("SELECT count(DISTINCT *) FROM t", "42601"),
    ("SELECT * FROM t ORDER BY a COLLATE nocase_x", "42804"),
    ("SELECT 1 OFFSET -1", "2201W"),
    ("SELECT COLUMNS(*) + COLUMNS('a') FROM t", "0A000"),
    ("SELECT a::no_such_type FROM t", "42704"),
    # unchanged: what the narrower table does not name
    ("SELECT zz FROM t", "42703"),
    ("SELECT * FROM t JOIN t u USING (zz)", "42703"),
    ("SELECT abs(1, 2)", "42883"),
    ("SELECT * FROM no_such_table", "42P01"),
    ("SELECT 1 AS a UNION ALL BY NAME SELECT 1 AS a, 2 AS a", "42000"),
)


@pytest.fixture(scope="module")
def connection() -> duckdb.DuckDBPyConnection:
    connection = duckdb.connect()
    connection.execute("CREATE TABLE t (a INTEGER, b INTEGER)")
    return connection


@pytest.mark.parametrize(("statement", "sqlstate"), CASES)
def test_binder_refusal_has_postgres_code(
    connection: duckdb.DuckDBPyConnection, statement: str, sqlstate: str
) -> None:
    with pytest.raises(duckdb.Error) as caught:
        connection.execute(statement)
    translated = translate(caught.value)
    assert translated.sqlstate == sqlstate, (statement, str(caught.value))
    assert str(translated), statement  # DuckDB's words kept as the message
