"""Round 23 (H3): what an ordinary user reached through others' objects.

- A macro (only superusers create them) is expanded by DuckDB into the statement that
  calls it; PostgreSQL runs a function with its caller's privileges, so the caller needs
  SELECT on what the macro reads, whether it is called directly, by another macro, from
  a view the caller owns, from a column's definition, or under a built-in's name.
- ``INSERT OR REPLACE`` overwrites existing rows: DuckDB's ON CONFLICT DO UPDATE, so it
  needs UPDATE (and SELECT) as that does, not INSERT alone.
- ``COMMENT ON`` a table, a view or a column is for the owner (PostgreSQL's rule); it
  asked for nothing (a column) or for SELECT (a table) before.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engine.database import Database
from engine.identity import Identity
from engine.session import Session
from storage.errors import InsufficientPrivilegeError

ALICE = Identity("alice", superuser=False)


@pytest.fixture
def database(tmp_path: Path) -> Iterator[Database]:
    opened = Database.open(str(tmp_path / "data"), retention_interval_s=None)
    yield opened
    opened.close()


@pytest.fixture
def admin(database: Database) -> Iterator[Session]:
    session = database.connect()
    session.execute(
        "CREATE TABLE secret (id INT PRIMARY KEY, v TEXT); "
        "INSERT INTO secret VALUES (1, 's1'), (2, 's2'); "
        "CREATE TABLE open_t (a INT); INSERT INTO open_t VALUES (7); "
        "GRANT SELECT ON open_t TO alice; GRANT CREATE ON SCHEMA main TO alice; "
        "CREATE MACRO peek() AS TABLE SELECT * FROM secret; "
        "CREATE MACRO peek_max() AS (SELECT max(v) FROM secret); "
        "CREATE MACRO peek_again() AS TABLE SELECT * FROM peek(); "
        "CREATE MACRO twice(x) AS x * 2; "
        "CREATE MACRO from_open() AS TABLE SELECT * FROM open_t"
    )
    yield session
    session.close()


@pytest.fixture
def alice(database: Database, admin: Session) -> Iterator[Session]:
    session = database.connect(ALICE)
    yield session
    session.close()


def rows(session: Session, sql: str) -> list[tuple[Any, ...]]:
    result = session.execute(sql)[-1]
    assert result.table is not None
    return [tuple(row.values()) for row in result.table.to_pylist()]


def refused(session: Session, sql: str, match: str) -> None:
    with pytest.raises(InsufficientPrivilegeError, match=re.escape(match)) as caught:
        session.execute(sql)
    assert caught.value.sqlstate == "42501"


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM peek()",
        "SELECT peek_max()",
        "SELECT * FROM peek_again()",
        "SELECT * FROM main.peek()",
        'SELECT * FROM "PEEK"()',
        "SELECT 1 WHERE EXISTS (SELECT * FROM peek())",
        "WITH c AS (SELECT peek_max() AS m) SELECT * FROM c",
        "CREATE TABLE copied AS SELECT * FROM peek()",
        "CREATE TABLE computed (a INT, b TEXT GENERATED ALWAYS AS (peek_max()))",
    ],
)
def test_a_macro_reads_with_its_callers_privileges(alice: Session, sql: str) -> None:
    refused(alice, sql, "permission denied for table secret (SELECT privilege needed)")


def test_macros_over_what_the_caller_may_read_still_work(admin: Session, alice: Session) -> None:
    assert rows(alice, "SELECT twice(21)") == [(42,)]
    assert rows(alice, "SELECT * FROM from_open()") == [(7,)]
    admin.execute("GRANT SELECT ON secret TO alice")
    assert rows(alice, "SELECT peek_max()") == [("s2",)]
    assert rows(alice, "SELECT count(*) FROM peek_again()") == [(2,)]


def test_a_view_of_the_callers_own_does_not_lend_a_macro_privileges(
    admin: Session, alice: Session
) -> None:
    refused(alice, "CREATE VIEW mine AS SELECT * FROM peek()", "read by macro peek")
    admin.execute("CREATE MACRO later() AS TABLE SELECT 1 AS one")
    alice.execute("CREATE VIEW mine AS SELECT * FROM later()")
    assert rows(alice, "SELECT * FROM mine") == [(1,)]
    admin.execute("CREATE OR REPLACE MACRO later() AS TABLE SELECT id AS one FROM secret")
    refused(alice, "SELECT * FROM mine", "read by macro later")


def test_a_superusers_view_calling_a_macro_runs_it_as_the_reader(
    admin: Session, alice: Session
) -> None:
    """PostgreSQL: a view's relations are read as its owner, the functions it calls run
    with the reader's privileges."""
    admin.execute("CREATE VIEW through AS SELECT * FROM peek(); "
                  "CREATE VIEW direct AS SELECT * FROM secret; "
                  "GRANT SELECT ON through TO alice; GRANT SELECT ON direct TO alice")  # fmt: skip
    assert rows(alice, "SELECT count(*) FROM direct") == [(2,)]
    refused(alice, "SELECT * FROM through", "permission denied for table secret")


def test_views_of_superusers_nested_still_run_the_macro_as_the_reader(
    admin: Session, alice: Session
) -> None:
    """Review R2 F3: the check went one view deep under a superuser's view."""
    admin.execute("CREATE VIEW inner_v AS SELECT * FROM peek(); "
                  "CREATE VIEW middle_v AS SELECT * FROM inner_v; "
                  "CREATE VIEW outer_v AS SELECT * FROM middle_v; "
                  "GRANT SELECT ON outer_v TO alice")  # fmt: skip
    refused(alice, "SELECT * FROM outer_v", "read by macro peek")
    admin.execute("GRANT SELECT ON secret TO alice")
    assert rows(alice, "SELECT count(*) FROM outer_v") == [(2,)]


def test_a_column_named_like_a_macro_is_no_call(admin: Session, alice: Session) -> None:
    """Review R2 F4: only a name before ``(`` (or a keyword, an operator) calls a macro."""
    admin.execute("CREATE MACRO a() AS (SELECT count(*) FROM secret)")
    assert rows(alice, "SELECT a FROM open_t") == [(7,)]
    refused(alice, "SELECT a() FROM open_t", "read by macro a")


def test_a_macro_gives_no_more_than_its_caller_may_call(admin: Session, alice: Session) -> None:
    """The sandbox's rules for the caller hold inside a superuser's macro (review R2 F3's
    companion: DuckDB's settings name the server's files)."""
    admin.execute("CREATE MACRO cfg(n) AS current_setting(n)")
    refused(alice, "SELECT cfg('temp_directory')", "for superusers")
    assert rows(admin, "SELECT cfg('temp_directory') IS NOT NULL") == [(True,)]


def test_a_macro_shadowing_a_builtin_is_checked(admin: Session, alice: Session) -> None:
    assert rows(alice, "SELECT upper('a')") == [("A",)]
    admin.execute("CREATE MACRO upper(x) AS (SELECT max(v) FROM secret)")
    refused(alice, "SELECT upper('a')", "read by macro upper")


def test_a_macro_replaced_after_a_check_is_checked_again(admin: Session, alice: Session) -> None:
    """The macros' bodies are cached with owners and grants: CREATE OR REPLACE MACRO
    moves the cache on (else alice's next call would be judged by the old body)."""
    admin.execute("CREATE MACRO harmless() AS 1")
    assert rows(alice, "SELECT harmless()") == [(1,)]
    admin.execute("CREATE OR REPLACE MACRO harmless() AS (SELECT count(*) FROM secret)")
    refused(alice, "SELECT harmless()", "read by macro harmless")
    admin.execute("DROP MACRO harmless; CREATE MACRO harmless() AS 2")
    assert rows(alice, "SELECT harmless()") == [(2,)]


def test_insert_or_replace_needs_update(admin: Session, alice: Session) -> None:
    admin.execute("GRANT INSERT ON secret TO alice")
    refused(alice, "INSERT OR REPLACE INTO secret VALUES (1, 'overwritten')",
            "permission denied for table secret (UPDATE privilege needed)")  # fmt: skip
    alice.execute("INSERT OR IGNORE INTO secret VALUES (1, 'ignored'), (3, 's3')")
    assert rows(admin, "SELECT v FROM secret ORDER BY id") == [("s1",), ("s2",), ("s3",)]
    admin.execute("GRANT UPDATE, SELECT ON secret TO alice")
    alice.execute("INSERT OR REPLACE INTO secret VALUES (1, 'replaced')")
    assert rows(admin, "SELECT v FROM secret WHERE id = 1") == [("replaced",)]


@pytest.mark.parametrize(
    "sql",
    [
        "COMMENT ON TABLE secret IS 'mine'",
        "COMMENT ON TABLE main.secret IS 'mine'",
        "COMMENT ON COLUMN secret.v IS 'mine'",
        "COMMENT ON COLUMN main.secret.v IS 'mine'",
    ],
)
def test_comment_on_is_for_the_owner(admin: Session, alice: Session, sql: str) -> None:
    admin.execute("GRANT SELECT, INSERT, UPDATE, DELETE ON secret TO alice")
    refused(alice, sql, "must be owner of table secret")
    comments = rows(
        admin,
        "SELECT comment FROM duckdb_columns() WHERE table_name = 'secret' "
        "UNION ALL SELECT comment FROM duckdb_tables() WHERE table_name = 'secret'",
    )
    assert comments == [(None,), (None,), (None,)]


def test_comment_on_what_one_owns_works(alice: Session) -> None:
    alice.execute("CREATE TABLE own (a INT); CREATE VIEW own_v AS SELECT 1 AS b; "
                  "COMMENT ON TABLE own IS 't'; COMMENT ON COLUMN own.a IS 'c'; "
                  "COMMENT ON VIEW own_v IS 'v'")  # fmt: skip
    assert rows(alice, "SELECT comment FROM duckdb_tables() WHERE table_name = 'own'") == [("t",)]
    refused(alice, "COMMENT ON MACRO peek IS 'x'", "COMMENT ON MACRO is for superusers")


def test_over_the_wire_simple_and_extended(tmp_path: Path) -> None:
    """The wire's doors (simple query, extended protocol with a parameter, a cursor) are
    the engine's: the macro's body is checked for each."""
    import psycopg

    from tests.security.conftest import ADMIN, WireServer

    server = WireServer(tmp_path)
    try:
        admin = server.login(ADMIN)
        admin.execute("CREATE TABLE secret (v TEXT); INSERT INTO secret VALUES ('s'); "
                      "CREATE MACRO peek(x) AS TABLE SELECT v || x AS v FROM secret")  # fmt: skip
        alice = server.login()
        for sql, parameters in (("SELECT * FROM peek('!')", None),
                                ("SELECT * FROM peek(%s)", ("!",))):  # fmt: skip
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="macro peek"):
                alice.execute(sql, parameters)
        with (
            alice.transaction(),
            alice.cursor(name="c") as cursor,
            pytest.raises(psycopg.errors.InsufficientPrivilege, match="macro peek"),
        ):
            cursor.execute("SELECT * FROM peek('!')")
            cursor.fetchall()
        admin.execute("GRANT SELECT ON secret TO alice")
        assert alice.execute("SELECT * FROM peek(%s)", ("!",)).fetchall() == [("s!",)]
    finally:
        server.stop()
