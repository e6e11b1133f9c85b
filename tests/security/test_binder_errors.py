"""DuckDB's binder errors reach a client as class 42 (the statement as written), never as
XX000 (an internal error: a bug). Round 26 found ``SELECT s.a.a FROM (SELECT {'a': 1} AS
s)`` answered XX000: DuckDB refuses a field taken from a value that is no struct (so does
DuckDB embedded), and ``engine.tables.translate`` let every binder message without
"column" or "function" in it fall through to the root error class."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from tests.security.resource_servers import ALICE, ALICE_PASSWORD, login, running_server

CASES = (
    # a field of a value that is no struct: PostgreSQL's "column notation .a applied to
    # type integer, which is not a composite type" is 42809
    ("SELECT s.a.a FROM (SELECT {'a': 1} AS s)", "42809"),
    ("SELECT x.a FROM (SELECT 1 AS x)", "42809"),
    # a struct's missing field: PostgreSQL's "could not identify column" is 42703
    ("SELECT s.b FROM (SELECT {'a': 1} AS s)", "42703"),
    ("SELECT s.a.b FROM (SELECT {'a': {'c': 1}} AS s)", "42703"),
    # PostgreSQL's narrower codes (round 28): grouping, a position out of range
    ("SELECT 1 GROUP BY sum(1)", "42803"),
    ("SELECT 1 ORDER BY 5", "42P10"),
    ("SELECT x, count(*) FROM (SELECT 1 AS x)", "42803"),
    ("SELECT * FROM (SELECT 1 AS a) t1, (SELECT 1 AS a) t2 WHERE a = 1", "42702"),
    # binder refusals no narrower class names
    ("SELECT 1 AS a UNION ALL BY NAME SELECT 1 AS a, 2 AS a", "42000"),
)


def test_binder_refusals_are_class_42_and_the_session_goes_on(tmp_path: Path) -> None:
    with running_server(tmp_path) as server, login(server, ALICE, ALICE_PASSWORD) as connection:
        connection.autocommit = True
        for statement, sqlstate in CASES:
            with pytest.raises(psycopg.Error) as caught:
                connection.execute(statement)
            assert caught.value.sqlstate == sqlstate, statement
            assert "internal error" not in str(caught.value)
            with connection.cursor() as cursor:  # the extended protocol too
                with pytest.raises(psycopg.Error) as again:
                    cursor.execute(statement, prepare=True)
                assert again.value.sqlstate == sqlstate, statement
        assert connection.execute(
            "SELECT s.a.a FROM (SELECT {'a': {'a': 1}} AS s)").fetchone() == (1,)  # fmt: skip
