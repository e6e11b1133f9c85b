"""Round 24 (H2): SQL-level PREPAREs and the engine's kept plans hold no folded constants.

DuckDB folds constant expressions when it prepares, and keeps the values with the plan:
on main ``PREPARE big AS SELECT repeat('x', 40000000) AS v`` kept ~40 MB until DEALLOCATE
(16 of them: +650 MiB), and 20 repeated ``SELECT repeat('x', 1e7) AS vN`` kept +235 MiB
of the engine's own plans (``tables.CursorPlans``). Now a session keeps its PREPAREs as
text (``engine.prepared_room``: DuckDB holds one only while its EXECUTE runs) and a plan
is kept only for a text whose calls cannot fold a value larger than the text
(``tables.bounded_constants``). PostgreSQL's semantics stay: PREPARE is checked when it
runs, EXECUTE with wrong arguments or over a dropped table errors, privileges are the
caller's at EXECUTE.
"""

from __future__ import annotations

import gc
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from engine import tables
from engine.database import Database
from engine.identity import Identity
from engine.session import Session
from storage.errors import (
    InsufficientPrivilegeError,
    SqlSyntaxError,
    TopicbaseError,
    UndefinedPreparedStatementError,
)
from tests.security.conftest import ADMIN, WireServer

logging.getLogger("sqlglot").setLevel(logging.CRITICAL)


@pytest.fixture
def database(tmp_path: Path) -> Iterator[Database]:
    database = Database.open(str(tmp_path / "data"), retention_interval_s=None)
    yield database
    database.close()


@pytest.fixture
def admin(database: Database) -> Iterator[Session]:
    session = database.connect()
    session.execute("CREATE TABLE t (a INTEGER)")
    session.execute("INSERT INTO t VALUES (1), (2)")
    yield session
    session.close()


@pytest.fixture
def alice(database: Database, admin: Session) -> Iterator[Session]:
    admin.execute("GRANT SELECT ON t TO alice")
    session = database.connect(Identity("alice", superuser=False))
    yield session
    session.close()


def rows(session: Session, sql: str) -> list[tuple[Any, ...]]:
    table = session.execute(sql)[-1].table
    assert table is not None
    return [tuple(row.values()) for row in table.to_pylist()]


def duckdb_holds(session: Session) -> int:
    """The user statements DuckDB holds on the session's connection (not kept plans),
    asked of the connection itself: through the session a statement listing them has the
    session's kept statements held for its run (``SqlStatements.listed``)."""
    held = session.cursor.execute("SELECT count(*) FROM duckdb_prepared_statements() "
                                  "WHERE NOT starts_with(name, '__topicbase')").fetchone()
    assert held is not None
    return int(held[0])


def rss_mib() -> int:
    with open(f"/proc/{os.getpid()}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) // 1024
    raise AssertionError("no VmRSS")


# -- SQL-level PREPARE ------------------------------------------------------------------------
def test_duckdb_holds_no_prepared_statement_between_statements(alice: Session) -> None:
    alice.execute("PREPARE p AS SELECT a + $1 AS b FROM t ORDER BY a")
    assert duckdb_holds(alice) == 0
    assert rows(alice, "EXECUTE p(10)") == [(11,), (12,)]
    assert duckdb_holds(alice) == 0
    alice.execute("BEGIN")
    with pytest.raises(TopicbaseError):
        alice.execute("EXECUTE p('not a number')")  # fails inside the transaction
    alice.execute("ROLLBACK")
    assert duckdb_holds(alice) == 0
    assert rows(alice, "EXECUTE p(1)") == [(2,), (3,)]  # still kept, as text
    assert alice.sql_statements.names() == ["p"]


def test_sixteen_big_prepares_keep_no_values(alice: Session) -> None:
    """On main: +650 MiB (16 x 40 MB); now one value at a time, freed after the PREPARE."""
    alice.execute("PREPARE warm AS SELECT repeat('x', 20000000) AS v")
    alice.execute("DEALLOCATE warm")
    gc.collect()
    before = rss_mib()
    for index in range(16):
        alice.execute(f"PREPARE big{index} AS SELECT repeat('x', 20000000) AS v")
    gc.collect()
    grown = rss_mib() - before
    assert grown < 120, f"16 PREPAREs of a 20 MB value grew the process by {grown} MiB"
    assert len(rows(alice, "EXECUTE big3")[0][0]) == 20_000_000


def test_prepare_is_checked_when_it_runs(admin: Session, alice: Session) -> None:
    with pytest.raises(TopicbaseError) as missing:
        alice.execute("PREPARE p AS SELECT * FROM no_such_table")
    assert missing.value.sqlstate == "42P01"
    assert alice.sql_statements.names() == []
    with pytest.raises(SqlSyntaxError) as syntax:
        admin.execute("PREPARE q AS SELECT a FROM t WHERE")
    assert syntax.value.sqlstate == "42601"
    assert admin.sql_statements.names() == []


def test_execute_with_wrong_arguments_errors_and_the_statement_stays(alice: Session) -> None:
    alice.execute("PREPARE p AS SELECT $1::INTEGER + 1 AS b")
    for wrong in ("EXECUTE p", "EXECUTE p(1, 2)", "EXECUTE p('x')"):
        with pytest.raises(TopicbaseError):
            alice.execute(wrong)
    assert rows(alice, "EXECUTE p(41)") == [(42,)]


def test_execute_over_a_dropped_table_errors(admin: Session) -> None:
    admin.execute("CREATE TABLE gone (a INTEGER)")
    admin.execute("PREPARE p AS SELECT * FROM gone")
    admin.execute("DROP TABLE gone")
    with pytest.raises(TopicbaseError) as caught:
        admin.execute("EXECUTE p")
    assert caught.value.sqlstate == "42P01"
    admin.execute("CREATE TABLE gone (a INTEGER)")
    admin.execute("INSERT INTO gone VALUES (7)")
    assert rows(admin, "EXECUTE p") == [(7,)]  # bound anew, as PostgreSQL replans


def test_execute_is_judged_for_the_caller_at_execute(admin: Session, alice: Session) -> None:
    alice.execute("PREPARE p AS SELECT a FROM t ORDER BY a")
    admin.execute("REVOKE SELECT ON t FROM alice")
    with pytest.raises(InsufficientPrivilegeError):
        alice.execute("EXECUTE p")
    admin.execute("GRANT SELECT ON t TO alice")
    assert rows(alice, "EXECUTE p") == [(1,), (2,)]


def test_execute_of_an_unknown_name_is_26000(alice: Session) -> None:
    alice.execute("SELECT count(*) FROM t")  # the engine's kept plans are not names to run
    with pytest.raises(UndefinedPreparedStatementError) as caught:
        alice.execute("EXECUTE nothing_here")
    assert caught.value.sqlstate == "26000"
    with pytest.raises(TopicbaseError):
        alice.execute("EXECUTE __topicbase_plan_1")


def test_names_without_case_and_deallocate(alice: Session) -> None:
    alice.execute("PREPARE Mixed AS SELECT 1 AS one")
    assert rows(alice, 'EXECUTE "MIXED"') == [(1,)]
    alice.execute("PREPARE other AS SELECT 2 AS two")
    alice.execute("DEALLOCATE mixed")
    assert alice.sql_statements.names() == ["other"]
    alice.execute("DEALLOCATE ALL")
    assert alice.sql_statements.names() == []
    with pytest.raises(UndefinedPreparedStatementError):
        alice.execute("EXECUTE other")


def test_a_prepare_outlives_a_rolled_back_transaction(alice: Session) -> None:
    """PostgreSQL's PREPARE is not transactional: ROLLBACK keeps it."""
    alice.execute("BEGIN")
    alice.execute("PREPARE p AS SELECT count(*) AS n FROM t")
    alice.execute("ROLLBACK")
    assert rows(alice, "EXECUTE p") == [(2,)]


# -- the engine's kept plans -----------------------------------------------------------------
def test_kept_plans_skip_texts_that_fold_big_values(admin: Session) -> None:
    for _ in range(4):  # relation, rows' way (noted), rows' way (PREPAREd), the plan
        admin.execute("SELECT count(*) FROM t")
    assert len(tables._plans_of(admin.cursor)) == 1
    for _ in range(4):
        admin.execute("SELECT repeat('x', 1000) AS v")
        admin.execute("SELECT \"REPEAT\"('x', 1000) AS v, a FROM t")
        admin.execute("SELECT main.lpad('x', 1000, ' ') AS v")
        admin.execute("SELECT max(a) AS m FROM range(5) r(a)")  # range: a keyword to DuckDB
    assert len(tables._plans_of(admin.cursor)) == 1


def test_kept_plans_hold_no_big_values(admin: Session) -> None:
    """On main: 20 texts of a 10 MB value kept +235 MiB in plans."""
    admin.execute("SELECT repeat('x', 10000000) AS warm")
    gc.collect()
    before = rss_mib()
    for index in range(20):
        for _ in range(4):
            admin.execute(f"SELECT repeat('x', 10000000) AS v{index}")
    gc.collect()
    grown = rss_mib() - before
    assert grown < 120, f"20 repeated texts of a 10 MB value grew the process by {grown} MiB"


@pytest.mark.parametrize(
    ("sql", "bounded"),
    [
        ("SELECT a FROM t WHERE a IN (1, 2)", True),
        ("SELECT count(*), lower(coalesce(a, 'b')) FROM t", True),
        ("SELECT max(v) OVER (PARTITION BY a, b) FROM t WHERE a IN (1, 2)", True),
        ("SELECT concat(s, s) FROM (SELECT 'x' AS s)", False),
        ("SELECT s || s FROM t", False),
        ("SELECT [s, s] FROM t", False),
        ("SELECT {'a': s, 'b': s} FROM t", False),
        ("SELECT (s, s) FROM t", False),
        ("SELECT row(s, s) FROM t", False),
        ("SELECT '" + "x" * 200 + "' AS long_literal", False),
        ("SELECT a FROM t WHERE " + " OR ".join(["a = 1"] * 500), False),  # too long
        ("SELECT a AS x0, x0 + x0 AS x1, x1 + x1 AS x2 FROM t", False),  # an alias reused
        ("SELECT a x0, greatest(x0, x0) x1 FROM t", False),  # an alias without AS
        ("SELECT v AS w FROM kv WHERE k = 5", True),
        ("SELECT CAST(a AS DECIMAL(10, 2)) FROM t", True),
        ("SELECT repeat('x', 5)", False),
        ("SELECT \"repeat\"('x', 5)", False),
        ("SELECT * FROM range(5)", False),
        ("SELECT replace('aaaa', 'a', 'bbbb')", False),
        ("SELECT list_resize([1], 9)", False),
        ("SELECT printf('%9d', 1)", False),
    ],
)
def test_bounded_constants(sql: str, bounded: bool) -> None:
    assert tables.bounded_constants(sql) is bounded


# -- over the wire ---------------------------------------------------------------------------
def test_over_the_wire_prepare_execute_deallocate(tmp_path: Path) -> None:
    server = WireServer(tmp_path)
    try:
        admin = server.login(ADMIN)
        admin.execute("CREATE TABLE t (a INTEGER)")
        admin.execute("INSERT INTO t VALUES (1), (2)")
        admin.execute("GRANT SELECT ON t TO alice")
        alice = server.login()
        alice.execute("PREPARE p AS SELECT a + $1 AS b FROM t ORDER BY a")
        assert alice.execute("EXECUTE p(10)").fetchall() == [(11,), (12,)]
        cursor = alice.cursor()
        for _ in range(3):  # Parse, Describe, Bind, Execute: described against the kept text
            assert cursor.execute("EXECUTE p(20)", prepare=True).fetchall() == [(21,), (22,)]
        assert cursor.description[0].name == "b"
        listed = alice.execute("SELECT name, statement FROM pg_prepared_statements").fetchall()
        assert listed == [("p", "SELECT (a + $1) AS b FROM t ORDER BY a")]  # as DuckDB writes it
        with pytest.raises(psycopg.errors.UndefinedTable):
            alice.execute("PREPARE q AS SELECT * FROM no_such_table")
        admin.execute("REVOKE SELECT ON t FROM alice")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            alice.execute("EXECUTE p(1)")
        alice.execute("DEALLOCATE p")
        with pytest.raises(psycopg.errors.InvalidSqlStatementName):
            alice.execute("EXECUTE p(1)")
        admin.execute("CREATE SEQUENCE ids")
        alice.execute("PREPARE v AS SELECT $1 AS v")
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="constants"):
            alice.execute("EXECUTE v(nextval('ids'))")  # R2 F1: invalidated the database
        assert admin.execute("SELECT count(*) FROM t").fetchone() == (2,)
    finally:
        server.stop()


def test_a_superusers_prepare_meets_the_sandbox_for_the_role_at_execute(admin: Session) -> None:
    admin.execute("PREPARE setting AS SELECT current_setting('temp_directory') AS d")
    assert rows(admin, "EXECUTE setting")  # a superuser may read it
    admin.execute("SET ROLE alice")
    with pytest.raises(InsufficientPrivilegeError, match="settings"):
        admin.execute("EXECUTE setting")
    admin.execute("RESET ROLE")
    assert rows(admin, "EXECUTE setting")


@pytest.mark.parametrize("name", ['"ÄBC"', '"äbc"', '"Σ"', '"İx"', "Äx", '"MiXeD"', "plain"])
def test_duckdb_holds_nothing_whatever_the_name(alice: Session, name: str) -> None:
    """DuckDB matches statement names without case in ASCII letters only: each name is
    DEALLOCATEd from DuckDB as the PREPARE spelled it (review R2 F5: non-ASCII names stayed
    there, folded values and all)."""
    alice.execute(f"PREPARE {name} AS SELECT repeat('x', 1000) AS v")
    assert duckdb_holds(alice) == 0
    assert len(rows(alice, f"EXECUTE {name}")[0][0]) == 1000
    assert duckdb_holds(alice) == 0
    alice.execute(f"DEALLOCATE {name}")
    assert alice.sql_statements.names() == []
    assert duckdb_holds(alice) == 0


def test_execute_arguments_are_constants_for_ordinary_users(admin: Session, alice: Session) -> None:
    """DuckDB evaluates EXECUTE's arguments outside the statement's checks, and a sequence
    function there invalidated the whole database (review R2 F1, DuckDB 2.0.1)."""
    admin.execute("CREATE SEQUENCE ids")
    admin.execute("CREATE TABLE secret (v INTEGER)")
    alice.execute("PREPARE p AS SELECT $1 AS v")
    for argument in ("nextval('ids')", "setval('ids', 5)", "currval('ids')",
                     "lower('A')"):  # fmt: skip
        with pytest.raises(InsufficientPrivilegeError, match="constants"):
            alice.execute(f"EXECUTE p({argument})")
    for refused_by_duckdb in ("(SELECT max(v) FROM secret)", "current_user"):
        with pytest.raises(TopicbaseError):  # DuckDB's parser refuses these there
            alice.execute(f"EXECUTE p({refused_by_duckdb})")
    assert rows(alice, "SELECT 1 AS ok") == [(1,)]  # the database lives on
    assert rows(admin, "SELECT count(*) AS n FROM secret") == [(0,)]
    for argument, expected in (("'x'::VARCHAR", "x"), ("CAST('2' AS INTEGER)", 2), ("-5", -5),
                               ("NULL", None),
                               ("DATE '2020-01-02'", "2020-01-02")):  # fmt: skip
        got = rows(alice, f"EXECUTE p({argument})")[0][0]
        assert (str(got) if expected == "2020-01-02" else got) == expected


def test_kept_plans_skip_views(admin: Session) -> None:
    """A view's body is folded into a plan (review R2 F2: 10 texts over a view of a 40 MB
    value kept +419 MiB): a text naming a view is not kept, and a kept plan whose table
    was replaced by a view of its name runs as text again."""
    admin.execute("CREATE VIEW big AS SELECT repeat('x', 10000000) AS s")
    admin.execute("SELECT length(s) AS warm FROM big")
    gc.collect()
    before = rss_mib()
    for index in range(10):
        for _ in range(4):
            assert rows(admin, f"SELECT length(s) AS n{index} FROM big") == [(10_000_000,)]
    gc.collect()
    assert len(tables._plans_of(admin.cursor)) == 0
    grown = rss_mib() - before
    assert grown < 60, f"10 repeated texts over a view of a 10 MB value grew {grown} MiB"
    admin.execute("CREATE TABLE swap (s VARCHAR)")
    admin.execute("INSERT INTO swap VALUES ('a')")
    for _ in range(4):
        assert rows(admin, "SELECT length(s) AS n FROM swap") == [(1,)]
    assert len(tables._plans_of(admin.cursor)) == 1
    admin.execute("DROP TABLE swap")
    admin.execute("CREATE VIEW swap AS SELECT repeat('y', 1000) AS s")
    for _ in range(2):
        assert rows(admin, "SELECT length(s) AS n FROM swap") == [(1000,)]
    assert len(tables._plans_of(admin.cursor)) == 0


def test_kept_plans_hold_no_values_pulled_up_from_a_subquery(admin: Session) -> None:
    """Review R2 F6: DuckDB pulls a subquery's constant up into every expression naming
    it: ``length(concat(s, s, ...))`` over ``(SELECT '<10,000 x>' AS s)``, 3,000 times,
    kept +202 MiB in 4 plans. (Each run's own 30 MB evaluation makes RSS too noisy to
    tell here: the plans are counted.)"""
    literal = "x" * 10_000
    for index in range(2):
        sql = (f"SELECT length(concat({', '.join(['s'] * 3000)})) AS n{index} "
               f"FROM (SELECT '{literal}' AS s)")  # fmt: skip
        for _ in range(4):
            assert rows(admin, sql) == [(30_000_000,)]
    short = "SELECT greatest(a, 1) AS g FROM t ORDER BY a"
    for _ in range(4):
        assert rows(admin, short) == [(1,), (2,)]
    assert len(tables._plans_of(admin.cursor)) == 1  # the short one only


def test_kept_plans_skip_reused_aliases(admin: Session) -> None:
    """Review R2 F9: DuckDB puts an alias's expression in place of each use, so
    ``x1 = x0 + x0, x2 = x1 + x1, ...`` is a tree of 2^n nodes held by the plan (16 levels:
    118 MiB in one plan, no literal at all)."""
    chain = ", ".join(f"x{i} + x{i} AS x{i + 1}" for i in range(8))
    for _ in range(4):
        assert rows(admin, f"SELECT a AS x0, {chain} FROM t ORDER BY a")[0][-1] == 256
    assert len(tables._plans_of(admin.cursor)) == 0
