"""Alias chains refused before DuckDB binds them (review R2 F8, round 24 H6)."""

from __future__ import annotations

import time

import pytest

from engine.database import Database
from engine.identity import Identity
from storage.errors import LimitExceededError


@pytest.fixture
def alice(tmp_path):
    database = Database.open(str(tmp_path / "data"), retention_interval_s=None)
    session = database.connect(Identity("alice", superuser=False))
    session.database = database
    yield session
    database.close()


def _chain(levels: int) -> str:
    items = ["'x' AS a0"] + [f"a{j} || a{j} AS a{j + 1}" for j in range(levels)]
    return "SELECT " + ", ".join(items) + f", length(a{levels}) AS n"


@pytest.mark.parametrize("levels", [20, 40])
def test_a_long_alias_chain_is_refused_quickly(alice, levels):
    started = time.process_time()
    with pytest.raises(LimitExceededError, match="expanded"):
        alice.execute(_chain(levels))
    assert time.process_time() - started < 0.5


@pytest.mark.parametrize("sql", [
    "SELECT ['x'] a0, " + ", ".join(f"a{j} || a{j} a{j + 1}" for j in range(24)),  # implicit
    "SELECT {'k': 1} a0, " + ", ".join(f"[a{j}, a{j}] a{j + 1}" for j in range(24)),
    "SELECT a0: 'x', " + ", ".join(f"a{j + 1}: a{j} || a{j}" for j in range(24)),  # prefix
    "SELECT NULL a0, " + ", ".join(f"coalesce(a{j}, a{j}) AS a{j + 1}" for j in range(24)),
])
def test_aliases_written_without_as_are_counted(alice, sql):
    with pytest.raises(LimitExceededError, match="expanded"):
        alice.execute(sql)


def test_ordinary_alias_reuse_still_runs(alice):
    assert alice.execute(_chain(4))[-1].table.column("n").to_pylist() == [16]
    rows = alice.execute("SELECT 2 AS a, a + 1 AS b, b * b AS c")[-1].table.to_pylist()
    assert rows == [{"a": 2, "b": 3, "c": 9}]
    admin = alice.database.connect(Identity("admin", superuser=True))
    admin.execute("CREATE TABLE t (a INT, g INT)")
    admin.execute("INSERT INTO t VALUES (1, 1), (2, 1), (5, 2)")
    grouped = admin.execute("SELECT g % 2 AS k, sum(a) AS s FROM t GROUP BY k ORDER BY s")[
        -1
    ].table.to_pylist()
    assert [(row["k"], int(row["s"])) for row in grouped] == [(1, 3), (0, 5)]
    same_name = admin.execute("SELECT a AS a, a + 1 AS b FROM t ORDER BY a")[-1].table
    assert same_name.column("b").to_pylist() == [2, 3, 6]


# -- macros (round 25): a parameter used twice in the body copies the argument twice -----
def _nest(function: str, levels: int, seed: str, extra: str = "") -> str:
    expression = seed
    for _ in range(levels):
        expression = f"{function}({expression}{extra})"
    return expression


@pytest.mark.parametrize("sql", [
    "SELECT " + _nest("nullif", 20, "1", ", 2"),  # 228 characters; 18 levels took 11 s
    "SELECT " + _nest("nullif", 40, "1", ", 2"),
    "SELECT " + _nest("array_pop_back", 16, "[1]"),  # 4 s at 16 levels on main
    "SELECT " + _nest("map_to_pg_oid", 5, "'int'"),  # its parameter 19 times in the body
    "SELECT " + _nest("NULLIF", 20, "1", ", 2").replace("NULLIF(", '"nullif"(', 3),
    "SELECT 1 AS a0, " + ", ".join(f"nullif(a{j}, 2) AS a{j + 1}" for j in range(30)),
])
def test_nested_built_in_macros_are_refused_quickly(alice, sql):
    started = time.process_time()
    with pytest.raises(LimitExceededError, match="aliases and macros are expanded") as caught:
        alice.execute(sql)
    assert caught.value.sqlstate == "54000"
    assert time.process_time() - started < 0.5


def test_a_superusers_macro_nested_by_anyone_is_refused(alice):
    admin = alice.database.connect(Identity("admin", superuser=True))
    admin.execute("CREATE MACRO sq(x) AS x * x")
    admin.execute("CREATE MACRO wrap(x) AS nullif(x, 2)")  # x once, but nullif copies it
    for sql in ("SELECT " + _nest("sq", 24, "1"), "SELECT " + _nest("wrap", 24, "1")):
        started = time.process_time()
        with pytest.raises(LimitExceededError, match="macros are expanded"):
            alice.execute(sql)
        assert time.process_time() - started < 0.5
    assert alice.execute("SELECT sq(sq(3)) AS v, wrap(wrap(5)) AS w")[-1].table.to_pylist() == [
        {"v": 81, "w": 5}]


def test_ordinary_macro_calls_still_run(alice):
    rows = alice.execute("SELECT nullif(nullif(1, 2), 3) AS n, split_part('a,b', ',', 2) AS p, "
                         "array_pop_back([1, 2, 3]) AS l")[-1].table.to_pylist()  # fmt: skip
    assert rows == [{"n": 1, "p": "b", "l": [1, 2]}]


def test_a_text_sqlglot_cannot_read_with_a_reused_name_is_refused_to_ordinary_users(
    alice, monkeypatch
):
    """Its aliases cannot be counted: refused (fail closed) for an ordinary user, as the
    privileges refuse a statement whose relations cannot be read; a superuser's runs."""
    from engine import sandbox

    monkeypatch.setattr(sandbox, "_tree", lambda sql: None)
    with pytest.raises(LimitExceededError, match="cannot be checked"):
        sandbox.refuse_expansion("SELECT 2 AS a, a + 1 AS b", _tokens("SELECT 2 AS a, a + 1 AS b"),
                                 {}, superuser=False)  # fmt: skip
    sandbox.refuse_expansion("SELECT 2 AS a, a + 1 AS b", _tokens("SELECT 2 AS a, a + 1 AS b"),
                             {}, superuser=True)  # fmt: skip
    sandbox.refuse_expansion("SELECT 2 AS a, 3 AS b", _tokens("SELECT 2 AS a, 3 AS b"), {},
                             superuser=False)  # no name again: nothing to count  # fmt: skip


def _tokens(sql):
    from engine import tables

    return tables.sql_tokens(sql)


def test_over_the_wire_the_chains_are_54000_and_the_connection_goes_on(tmp_path):
    import psycopg

    from tests.security.conftest import WireServer

    server = WireServer(tmp_path)
    try:
        alice = server.login()
        for sql in (_chain(20), _chain(40), "SELECT " + _nest("nullif", 30, "1", ", 2")):
            started = time.monotonic()
            with pytest.raises(psycopg.errors.ProgramLimitExceeded):
                alice.execute(sql)
            assert time.monotonic() - started < 5  # wall: the machine is shared
        cursor = alice.cursor()
        with pytest.raises(psycopg.errors.ProgramLimitExceeded):  # extended protocol
            cursor.execute(_chain(24), prepare=True)
        assert alice.execute("SELECT 2 AS a, a + 1 AS b").fetchall() == [(2, 3)]
    finally:
        server.stop()


def test_from_and_with_are_not_scopes_of_the_select_lists_aliases() -> None:
    # DuckDB binds FROM and WITH before the SELECT list: a name there is never the alias.
    # (sqlglot 30 calls them ``from_`` and ``with_``: they were walked as scopes, round 26.)
    from planner.alias_expansion import alias_copies
    from planner.duckdb_sql import parse_duckdb

    for sql in ("SELECT repeat('x', 100) AS a FROM unnest([a, a, a]) AS z",
                "WITH c AS (SELECT [a, a, a] AS l FROM t) SELECT repeat('x', 9) AS a FROM c"):
        tree = parse_duckdb(sql)
        assert tree is not None
        assert alias_copies(tree, {}) == 0
