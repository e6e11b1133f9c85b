"""Round 24 (H2): sequences have owners and grants, and their functions need PostgreSQL's
privileges.

On main ``SELECT nextval('ids')`` of a superuser's sequence answered any user: sequences
had no owners or grants. Now a sequence is its creator's (CREATE SEQUENCE stays a
superuser's), ``GRANT USAGE | SELECT | UPDATE ON SEQUENCE`` gives it out, and nextval needs
USAGE or UPDATE, currval SELECT or USAGE, setval UPDATE (42501 otherwise), wherever the
call is: the statement, a view read, a table's DEFAULT run by INSERT, a macro's body.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from engine.database import Database
from engine.identity import Identity
from engine.session import Session
from storage.errors import InsufficientPrivilegeError, UndefinedTopicError
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
    session.execute("CREATE SEQUENCE ids")
    yield session
    session.close()


@pytest.fixture
def alice(database: Database, admin: Session) -> Iterator[Session]:
    session = database.connect(Identity("alice", superuser=False))
    yield session
    session.close()


def value(session: Session, sql: str) -> Any:
    table = session.execute(sql)[-1].table
    assert table is not None
    return table.column(0)[0].as_py()


def refused(session: Session, sql: str, match: str = "permission denied") -> None:
    with pytest.raises(InsufficientPrivilegeError, match=match) as caught:
        session.execute(sql)
    assert caught.value.sqlstate == "42501"


def test_nextval_and_currval_need_a_privilege(alice: Session) -> None:
    for spelling in ("SELECT nextval('ids')", "SELECT nextval('main.ids')",
                     "SELECT nextval('tables.main.ids')", "SELECT \"NEXTVAL\"('ids')",
                     "SELECT main.nextval('IDS')", "SELECT currval('ids')"):  # fmt: skip
        refused(alice, spelling, "sequence ids")


def test_a_sequence_named_by_an_expression_is_refused(alice: Session) -> None:
    refused(alice, "SELECT nextval(s) FROM (SELECT 'ids' AS s)", "not named by a string")
    refused(alice, "SELECT nextval('id' || 's')", "not named by a string")


def test_usage_select_update_as_postgresql(admin: Session, alice: Session) -> None:
    admin.execute("GRANT USAGE ON SEQUENCE ids TO alice")
    assert value(alice, "SELECT nextval('ids') AS n") == 1
    assert value(alice, "SELECT currval('ids') AS n") == 1
    admin.execute("REVOKE USAGE ON SEQUENCE ids FROM alice")
    refused(alice, "SELECT nextval('ids')")
    admin.execute("GRANT SELECT ON SEQUENCE ids TO alice")
    assert value(alice, "SELECT currval('ids') AS n") == 1  # SELECT: currval only
    refused(alice, "SELECT nextval('ids')")
    admin.execute("GRANT UPDATE ON SEQUENCE ids TO alice")
    assert value(alice, "SELECT nextval('ids') AS n") == 2  # UPDATE: nextval
    admin.execute("REVOKE ALL ON SEQUENCE ids FROM alice")
    refused(alice, "SELECT currval('ids')")


def test_grant_to_public_and_superusers_pass(admin: Session, alice: Session) -> None:
    assert value(admin, "SELECT nextval('ids') AS n") == 1
    admin.execute("GRANT USAGE ON SEQUENCE ids TO PUBLIC")
    assert value(alice, "SELECT nextval('ids') AS n") == 2


def test_through_views_defaults_macros_and_prepare(admin: Session, alice: Session) -> None:
    admin.execute("CREATE TABLE auto (id BIGINT DEFAULT nextval('ids'), v INTEGER)")
    admin.execute("GRANT INSERT, SELECT ON auto TO alice")
    admin.execute("CREATE VIEW next_id AS SELECT nextval('ids') AS n")
    admin.execute("GRANT SELECT ON next_id TO alice")
    admin.execute("CREATE MACRO bump() AS nextval('ids')")
    for sql in ("INSERT INTO auto (v) VALUES (1)", "SELECT * FROM next_id", "SELECT bump()",
                "PREPARE p AS SELECT nextval('ids')"):  # fmt: skip
        refused(alice, sql, "sequence ids")
    assert value(alice, "SELECT count(*) AS n FROM auto") == 0  # reading runs no default
    admin.execute("GRANT USAGE ON SEQUENCE ids TO alice")
    alice.execute("INSERT INTO auto (v) VALUES (1)")
    assert value(alice, "SELECT n FROM next_id") == 2
    assert value(alice, "SELECT bump() AS n") == 3
    alice.execute("PREPARE p AS SELECT nextval('ids') AS n")
    assert value(alice, "EXECUTE p") == 4
    admin.execute("REVOKE USAGE ON SEQUENCE ids FROM alice")
    refused(alice, "EXECUTE p", "sequence ids")  # judged at EXECUTE


def test_owner_rows_follow_create_and_drop(admin: Session, alice: Session) -> None:
    admin.execute("GRANT USAGE ON SEQUENCE ids TO alice")
    admin.execute("DROP SEQUENCE ids")
    admin.execute("CREATE SEQUENCE ids")  # a new sequence of the name: no old grants
    refused(alice, "SELECT nextval('ids')")
    owners = admin.cursor.execute(
        "SELECT owner FROM __topicbase.owners WHERE namespace = 'sequence' AND name = 'ids'"
    ).fetchall()
    assert owners == [("topicbase",)]


def test_grant_on_a_missing_sequence_or_by_a_user(admin: Session, alice: Session) -> None:
    with pytest.raises(UndefinedTopicError):
        admin.execute("GRANT USAGE ON SEQUENCE nothing_here TO alice")
    refused(alice, "GRANT USAGE ON SEQUENCE ids TO alice", "sequence ids")


def test_over_the_wire(tmp_path: Path) -> None:
    server = WireServer(tmp_path)
    try:
        admin = server.login(ADMIN)
        admin.execute("CREATE SEQUENCE ids")
        alice = server.login()
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="sequence ids"):
            alice.execute("SELECT nextval('ids')")
        admin.execute("GRANT USAGE ON SEQUENCE ids TO alice")
        assert alice.execute("SELECT nextval('ids')").fetchone() == (1,)
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="string literal"):
            alice.execute("SELECT nextval(%s)", ["ids"])  # a bound name: not known at the check
    finally:
        server.stop()


def test_the_search_paths_sequence_is_the_one_checked(admin: Session, alice: Session) -> None:
    """Review R2 F3: with ``SET search_path = 's2'`` an unqualified ``nextval('ids')``
    advanced ``s2.ids`` while ``main.ids`` (granted) was the one checked."""
    admin.execute("CREATE SCHEMA s2")
    admin.execute("CREATE SEQUENCE s2.ids START 1000")
    admin.execute("GRANT USAGE ON SEQUENCE ids TO alice")
    assert value(alice, "SELECT nextval('ids') AS n") == 1
    alice.execute("SET search_path = 's2'")
    refused(alice, "SELECT nextval('ids')", "sequence s2.ids")
    refused(alice, "SELECT nextval('s2.ids')", "sequence s2.ids")
    admin.execute("GRANT USAGE ON SEQUENCE s2.ids TO alice")
    assert value(alice, "SELECT nextval('ids') AS n") == 1000
