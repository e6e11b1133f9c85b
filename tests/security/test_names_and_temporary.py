"""The door and how names resolve: another search_path or schema, temporary relations.

DuckDB looks a name up in the session's temporary objects first (also inside views the
session reads) and then along its search path; the door (``engine.privileges``) names
relations as ``planner.access`` reads them. These tests pin that what DuckDB reads is what
was checked: an ordinary user cannot create temporary views; a temporary view left in a
session that switched to an ordinary role is checked as that role's; a name that another
search_path or schema resolves elsewhere is checked where it may resolve; DISCARD ALL
ends a switched authorization and drops temporary relations.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from engine.database import Database
from engine.identity import Identity
from engine.session import Session
from storage.errors import InsufficientPrivilegeError

from .conftest import ADMIN, WireServer

ALICE = Identity("alice", superuser=False)


@pytest.fixture
def database(tmp_path: Path) -> Iterator[Database]:
    opened = Database.open(str(tmp_path / "data"))
    admin = opened.connect()
    admin.execute(
        "CREATE TABLE secret (v TEXT); INSERT INTO secret VALUES ('SECRET'); "
        "CREATE TABLE kv (k INT PRIMARY KEY, v TEXT); INSERT INTO kv VALUES (1, 'main'); "
        "CREATE SCHEMA s; CREATE TABLE s.kv (k INT PRIMARY KEY, v TEXT); "
        "INSERT INTO s.kv VALUES (1, 's'); "
        "CREATE VIEW through AS SELECT v FROM kv; "
        "GRANT SELECT ON kv TO alice; GRANT SELECT ON through TO alice; "
        "GRANT CREATE ON SCHEMA main TO alice"
    )
    admin.close()
    yield opened
    opened.close()


@pytest.fixture
def alice(database: Database) -> Iterator[Session]:
    session = database.connect(ALICE)
    yield session
    session.close()


def values(session: Session, sql: str, parameters: Any = None) -> list[Any]:
    result = session.execute(sql, parameters)[-1]
    assert result.table is not None
    return [row["v"] for row in result.table.to_pylist()]


@pytest.mark.parametrize("create", [
    "CREATE TEMP VIEW tv AS SELECT v FROM secret",
    "CREATE TEMPORARY VIEW tv AS SELECT v FROM secret",
    "CREATE OR REPLACE TEMP VIEW tv AS SELECT v FROM secret",
    "CREATE TEMP VIEW kv AS SELECT 1 AS k, v FROM secret",
    "PREPARE p AS CREATE TEMP VIEW tv AS SELECT v FROM secret",
])  # fmt: skip
def test_an_ordinary_user_cannot_create_a_temporary_view(alice: Session, create: str) -> None:
    with pytest.raises(InsufficientPrivilegeError, match="CREATE TEMPORARY VIEW"):
        alice.execute(create)
    assert values(alice, "SELECT v FROM kv") == ["main"]
    assert values(alice, "SELECT v FROM through") == ["main"]


def test_a_temporary_view_left_by_a_superuser_is_checked_as_the_switched_role(
    database: Database,
) -> None:
    session = database.connect()
    try:
        session.execute("CREATE TEMP VIEW tv AS SELECT v FROM secret")
        session.execute("CREATE TEMP VIEW kv AS SELECT 1 AS k, v FROM secret")
        session.execute("SET SESSION AUTHORIZATION alice")
        for sql in ("SELECT v FROM tv", "SELECT v FROM kv", "SELECT v FROM main.kv",
                    "SELECT v FROM through", "SELECT 1 AS v"):  # fmt: skip
            with pytest.raises(InsufficientPrivilegeError, match="secret"):
                values(session, sql)
        session.execute("SET SESSION AUTHORIZATION DEFAULT")
        assert values(session, "SELECT v FROM through") == ["SECRET"]  # DuckDB's temp first
        session.execute("DROP VIEW tv; DROP VIEW kv; SET SESSION AUTHORIZATION alice")
        assert values(session, "SELECT v FROM through") == ["main"]
    finally:
        session.close()


@pytest.mark.parametrize("setting", ["SET search_path = 's'", "SET schema = 's'",
                                     "SET search_path = 'main,s'"])  # fmt: skip
def test_a_name_another_search_path_resolves_elsewhere_is_checked_there(
    database: Database, alice: Session, setting: str
) -> None:
    alice.execute(setting)
    for sql, parameters in (("SELECT v FROM kv", None), ("SELECT v FROM kv WHERE k = $1", [1]),
                            ("SELECT v FROM main.kv", None)):  # fmt: skip
        with pytest.raises(InsufficientPrivilegeError, match=r"table s\.kv"):
            values(alice, sql, parameters)
    admin = database.connect()
    admin.execute("GRANT SELECT ON s.kv TO alice")
    admin.close()
    expected = ["main"] if setting.endswith("'main,s'") else ["s"]
    assert values(alice, "SELECT v FROM kv") == expected
    assert values(alice, "SELECT v FROM kv WHERE k = $1", [1]) == expected
    alice.execute("SET search_path = 'main'; SET schema = 'main'")
    assert values(alice, "SELECT v FROM kv") == ["main"]


def test_a_qualified_name_in_another_schema_needs_only_that_relation(
    database: Database, alice: Session
) -> None:
    admin = database.connect()
    admin.execute("CREATE TABLE s.other (v TEXT); INSERT INTO s.other VALUES ('o'); "
                  "GRANT SELECT ON s.other TO alice")  # fmt: skip
    admin.close()
    alice.execute("SET search_path = 's'")
    assert values(alice, "SELECT v FROM other") == ["o"]
    assert values(alice, "SELECT v FROM s.other") == ["o"]
    with pytest.raises(InsufficientPrivilegeError, match="secret"):
        values(alice, "SELECT v FROM secret")


def test_an_ordinary_users_own_temporary_table_is_hers(alice: Session) -> None:
    alice.execute("CREATE TEMP TABLE mine (v TEXT); INSERT INTO mine VALUES ('x')")
    assert values(alice, "SELECT v FROM mine") == ["x"]
    assert values(alice, "SELECT v FROM temp.main.mine") == ["x"]
    with pytest.raises(InsufficientPrivilegeError, match="secret"):
        alice.execute("CREATE TEMP TABLE copied AS SELECT v FROM secret")
    # a temporary table named like a table she may read shadows it: her own rows
    alice.execute("CREATE TEMP TABLE kv (k INT, v TEXT); INSERT INTO temp.kv VALUES (2, 'hers')")
    assert values(alice, "SELECT v FROM kv") == ["hers"]
    with pytest.raises(InsufficientPrivilegeError, match="secret"):
        values(alice, "SELECT v FROM secret")


def test_discard_all_ends_a_switched_authorization_and_drops_temporary_relations(
    wire_server: WireServer,
) -> None:
    connection: psycopg.Connection = wire_server.login(ADMIN)
    connection.execute("CREATE TEMP TABLE scratch (v TEXT)")
    connection.execute("SET SESSION AUTHORIZATION alice")
    assert connection.execute("SELECT current_user, session_user").fetchone() == ("alice",
                                                                                 "alice")
    connection.execute("DISCARD ALL")
    assert connection.execute("SELECT current_user, session_user").fetchone() == (ADMIN, ADMIN)
    with pytest.raises(psycopg.errors.UndefinedTable):
        connection.execute("SELECT * FROM scratch")
    connection.execute("CREATE TEMP TABLE scratch (v TEXT)")  # the name is free again


def test_a_temporary_table_never_stands_in_for_a_name_inside_a_view(
    database: Database, alice: Session
) -> None:
    """Review R1-10: DuckDB binds a view's names when it is read, the session's temporary
    relations first; an ordinary user's temporary ``acl`` must not replace the ``acl`` of
    another user's row-filtering view, directly or through a view over it."""
    admin = database.connect()
    admin.execute(
        "CREATE TABLE data (k INT, v TEXT, owner TEXT); "
        "INSERT INTO data VALUES (1, 'hers', 'alice'), (2, 'SECRET', 'admin'); "
        "CREATE TABLE acl (usr TEXT, owner TEXT); INSERT INTO acl VALUES ('alice', 'alice'); "
        "CREATE VIEW her_rows AS SELECT d.v FROM data d JOIN main.acl a ON d.owner = a.owner "
        "WHERE a.usr = 'alice'; CREATE VIEW over_hers AS SELECT v FROM her_rows; "
        "GRANT SELECT ON her_rows TO alice; GRANT SELECT ON over_hers TO alice"
    )
    admin.close()
    assert values(alice, "SELECT v FROM her_rows") == ["hers"]
    alice.execute("CREATE TEMP TABLE acl (usr TEXT, owner TEXT); "
                  "INSERT INTO temp.acl VALUES ('alice', 'admin')")  # fmt: skip
    for sql in ("SELECT v FROM her_rows", "SELECT v FROM over_hers"):
        with pytest.raises(InsufficientPrivilegeError, match="temporary relation acl"):
            values(alice, sql)
    alice.execute("DROP TABLE temp.acl")
    assert values(alice, "SELECT v FROM over_hers") == ["hers"]


def test_what_the_door_keeps_of_a_sessions_names_follows_every_change(
    database: Database, alice: Session
) -> None:
    """A session with temporary relations keeps the catalog answers of its names
    (``privileges._names_fact``) between statements; each kind of change is seen by the
    very next statement: a REVOKE by another session, its own SET search_path, its own
    new temporary table under a name a view it reads uses."""
    alice.execute("CREATE TEMP TABLE scratch (a INT)")  # names no longer plain
    for _ in range(3):
        assert values(alice, "SELECT v FROM through") == ["main"]
    alice.execute("CREATE TEMP TABLE kv (k INT, v TEXT)")
    with pytest.raises(InsufficientPrivilegeError, match="temporary relation kv"):
        values(alice, "SELECT v FROM through")
    alice.execute("DROP TABLE temp.kv")
    assert values(alice, "SELECT v FROM through") == ["main"]
    alice.execute("SET search_path = 's'")
    with pytest.raises(InsufficientPrivilegeError, match=r"table s\.kv"):
        values(alice, "SELECT v FROM kv")
    alice.execute("SET search_path = 'main'")
    assert values(alice, "SELECT v FROM kv") == ["main"]
    admin = database.connect()
    admin.execute("REVOKE SELECT ON kv FROM alice")
    admin.close()
    with pytest.raises(InsufficientPrivilegeError, match="table kv"):
        values(alice, "SELECT v FROM kv")
