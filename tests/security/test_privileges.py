"""Owners, GRANT/REVOKE and the privilege checks, behaviour by behaviour.

Engine-level cases run on sessions of one ``Database`` (a superuser session and one
acting as alice, an ordinary user); wire cases (cursors, COPY, \\dp-style catalogs) log
in as alice with SCRAM against a real server.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from engine import privileges, tables
from engine.check import check_database
from engine.database import Database
from engine.identity import Identity
from engine.session import Session
from sql.pgwire import users
from sql.pgwire.server import ServerThread
from storage.errors import InsufficientPrivilegeError, TopicbaseError

ALICE = Identity("alice", superuser=False)
BOB = Identity("bob", superuser=False)


@pytest.fixture
def database(tmp_path: Path) -> Iterator[Database]:
    opened = Database.open(str(tmp_path / "data"))
    yield opened
    opened.close()


@pytest.fixture
def admin(database: Database) -> Iterator[Session]:
    session = database.connect()
    session.execute("CREATE TABLE t (a INT); INSERT INTO t VALUES (1), (2); "
                    "CREATE TABLE u (a INT); CREATE TOPIC ev (CONSUMER c)")  # fmt: skip
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


def refused(session: Session, sql: str, match: str = "") -> str:
    with pytest.raises(
        InsufficientPrivilegeError, match=re.escape(match) if match else None
    ) as caught:
        session.execute(sql)
    assert caught.value.sqlstate == "42501"
    return caught.value.message


# -- grants are catalog state ----------------------------------------------------------------
def test_grant_inside_a_rolled_back_transaction_never_existed(
    admin: Session, alice: Session
) -> None:
    admin.execute("BEGIN; GRANT SELECT ON t TO alice")
    refused(alice, "SELECT * FROM t", "permission denied for table t")  # not committed yet
    admin.execute("ROLLBACK")
    refused(alice, "SELECT * FROM t")
    admin.execute("BEGIN; GRANT SELECT ON t TO alice; COMMIT")
    assert rows(alice, "SELECT count(*) FROM t") == [(2,)]
    admin.execute("BEGIN; REVOKE SELECT ON t FROM alice; ROLLBACK")
    assert rows(alice, "SELECT count(*) FROM t") == [(2,)]


def test_grants_and_owners_survive_a_restart(tmp_path: Path) -> None:
    path = str(tmp_path / "data")
    database = Database.open(path)
    admin = database.connect()
    admin.execute("CREATE TABLE t (a INT); CREATE TOPIC ev; GRANT SELECT ON t TO alice; "
                  "GRANT INSERT ON TOPIC ev TO PUBLIC; "
                  "GRANT CREATE ON SCHEMA main TO alice")  # fmt: skip
    alice = database.connect(ALICE)
    alice.execute("CREATE TABLE mine (a INT)")
    for session in (admin, alice):
        session.close()
    database.close()
    database = Database.open(path)
    try:
        alice, bob = database.connect(ALICE), database.connect(BOB)
        assert rows(alice, "SELECT count(*) FROM t") == [(0,)]
        bob.execute("INSERT INTO TOPIC ev (data) VALUES ('via public')")
        refused(bob, "SELECT * FROM t")
        refused(bob, "DROP TABLE mine", "must be owner of table mine")
        alice.execute("DROP TABLE mine")  # still hers
    finally:
        database.close()


def test_drop_takes_owner_and_grants_with_it(admin: Session, alice: Session) -> None:
    admin.execute("GRANT SELECT ON u TO alice; DROP TABLE u; CREATE TABLE u (b INT)")
    refused(alice, "SELECT * FROM u")  # a new u: the old grant went with the old one
    admin.execute("CREATE TOPIC gone; GRANT SELECT ON TOPIC gone TO alice; DROP TOPIC gone; "
                  "CREATE TOPIC gone")  # fmt: skip
    refused(alice, "SELECT * FROM TOPIC gone", "permission denied for topic gone")


def test_rename_keeps_owner_and_grants(admin: Session, alice: Session) -> None:
    admin.execute("GRANT SELECT ON u TO alice; ALTER TABLE u RENAME TO v")
    assert rows(alice, "SELECT count(*) FROM v") == [(0,)]


# -- every relation a statement touches ---------------------------------------------------------
def test_joins_subqueries_and_set_operations_check_every_table(
    admin: Session, alice: Session
) -> None:
    admin.execute("GRANT SELECT ON t TO alice")
    for sql in ("SELECT * FROM t JOIN u ON t.a = u.a",
                "SELECT * FROM t WHERE a IN (SELECT a FROM u)",
                "SELECT (SELECT max(a) FROM main.u) FROM t",
                "SELECT a FROM t UNION SELECT a FROM u",
                "SELECT * FROM t WHERE EXISTS (SELECT 1 FROM tables.main.u)",
                'SELECT * FROM "U"'):  # fmt: skip
        refused(alice, sql, "permission denied for table u")
    assert rows(alice, "SELECT count(*) FROM t, (SELECT 1) AS x") == [(2,)]


def test_a_cte_name_is_not_a_table_but_its_body_is_checked(admin: Session, alice: Session) -> None:
    assert rows(alice, "WITH t AS (SELECT 42 AS a) SELECT a FROM t") == [(42,)]
    refused(alice, "WITH x AS (SELECT * FROM t) SELECT * FROM x", "table t")
    refused(alice, "WITH t AS (SELECT * FROM t) SELECT * FROM t", "table t")  # inner t: the table
    assert rows(alice, "WITH RECURSIVE t(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM t "
                       "WHERE n < 3) SELECT count(*) FROM t") == [(3,)]  # fmt: skip


def test_writes_need_their_privilege_and_select_on_what_they_read(
    admin: Session, alice: Session
) -> None:
    admin.execute("GRANT INSERT ON u TO alice")
    refused(alice, "INSERT INTO u SELECT a FROM t", "permission denied for table t")
    admin.execute("GRANT SELECT ON t TO alice")
    alice.execute("INSERT INTO u SELECT a FROM t")
    refused(alice, "UPDATE u SET a = 0", "(UPDATE privilege needed)")
    admin.execute("GRANT UPDATE ON u TO alice")
    alice.execute("UPDATE u SET a = 0")
    refused(alice, "UPDATE u SET a = t.a FROM t WHERE u.a = t.a", "(SELECT privilege needed)")
    refused(alice, "DELETE FROM u USING t WHERE u.a = t.a", "(DELETE privilege needed)")
    admin.execute("GRANT DELETE ON u TO alice")
    refused(alice, "DELETE FROM u USING t WHERE u.a = t.a", "table u (SELECT")  # reads u's rows
    refused(alice, "MERGE INTO u USING t ON u.a = t.a WHEN NOT MATCHED THEN INSERT VALUES (t.a)",
            "table u (SELECT")  # fmt: skip
    assert rows(admin, "SELECT count(*), sum(a) FROM u") == [(2, 0)]


def test_topics_by_plain_name_and_with_topic(admin: Session, alice: Session) -> None:
    admin.execute("GRANT INSERT ON TOPIC ev TO alice")
    alice.execute("INSERT INTO ev (data) VALUES ('a')")
    refused(alice, "SELECT count(*) FROM ev", "permission denied for topic ev (SELECT")
    refused(alice, "SELECT count(*) FROM main.ev", "topic ev")
    refused(alice, "SELECT * FROM TOPIC ev WITH (consumer = 'c')", "topic ev")
    refused(alice, "COMMIT OFFSETS ON TOPIC ev FOR CONSUMER c (PARTITION 0 UPTO 1)", "topic ev")
    refused(alice, "ALTER TOPIC ev ADD CONSUMER d", "topic ev (ALTER")
    refused(alice, "DROP TOPIC ev", "must be owner of topic ev")
    refused(alice, "INSERT INTO TOPIC ev (data) SELECT CAST(a AS VARCHAR) FROM t", "table t")
    admin.execute("GRANT SELECT ON TOPIC ev TO alice")
    assert rows(alice, "SELECT count(*) FROM ev") == [(1,)]
    assert rows(alice, "SELECT count(*) FROM TOPIC ev WITH (consumer = 'c')") == [(1,)]


def test_views_are_read_with_their_owners_privileges(
    database: Database, admin: Session, alice: Session
) -> None:
    admin.execute("CREATE VIEW tv AS SELECT a FROM t WHERE a > 1; GRANT SELECT ON tv TO alice")
    assert rows(alice, "SELECT * FROM tv") == [(2,)]  # no privilege on t needed
    refused(alice, "SELECT * FROM t")
    admin.execute("GRANT CREATE ON SCHEMA main TO alice")
    alice.execute("CREATE VIEW mine AS SELECT * FROM t")  # allowed; checked when read
    message = refused(alice, "SELECT * FROM mine", "permission denied for table t")
    assert "for view mine owned by alice" in message
    bob = database.connect(BOB)
    try:
        admin.execute("GRANT SELECT ON mine TO bob; GRANT SELECT ON t TO alice")
        assert rows(bob, "SELECT count(*) FROM mine") == [(2,)]  # alice's privilege on t
        refused(bob, "SELECT * FROM t")
    finally:
        bob.close()


def test_creating_needs_create_on_schema_and_ownership_follows(
    admin: Session, alice: Session
) -> None:
    refused(alice, "CREATE TABLE x (a INT)", "permission denied for schema main")
    refused(alice, "CREATE TOPIC x", "permission denied for schema main")
    refused(alice, "CREATE TABLE x AS SELECT * FROM t", "schema main")
    alice.execute("CREATE TEMP TABLE scratch AS SELECT 1 AS a")  # TEMP: PUBLIC may
    refused(alice, "CREATE TEMP TABLE leak AS SELECT * FROM t", "table t")
    admin.execute("GRANT CREATE ON SCHEMA main TO alice")
    alice.execute("CREATE TABLE x (a INT); INSERT INTO x VALUES (1); CREATE TOPIC xt")
    alice.execute("INSERT INTO TOPIC xt (data) VALUES ('mine'); ALTER TOPIC xt ADD CONSUMER r")
    refused(alice, "DROP TABLE t", "must be owner of table t")
    refused(alice, "ALTER TABLE t ADD COLUMN b INT", "must be owner of table t")
    refused(alice, "CREATE OR REPLACE TABLE t AS SELECT 1", "must be owner of table t")
    alice.execute("DROP TABLE x; DROP TOPIC xt")


def test_statements_whose_relations_cannot_be_known_are_for_superusers(alice: Session) -> None:
    for sql in ("SELECT * FROM query_table('t')", "SELECT * FROM query('SELECT * FROM t')",
                "CREATE SCHEMA s", "CREATE MACRO m() AS 1", "CREATE SEQUENCE q"):  # fmt: skip
        # (the sandbox may refuse some first, for its own reason: 42501 either way)
        refused(alice, sql, "permission denied")


# -- GRANT and REVOKE: who may ------------------------------------------------------------------
def test_only_owners_superusers_and_grant_option_holders_grant(
    database: Database, admin: Session, alice: Session
) -> None:
    refused(alice, "GRANT SELECT ON t TO alice", "permission denied for table t")
    refused(alice, "GRANT CREATE ON SCHEMA main TO alice", "schema main")
    admin.execute("GRANT SELECT ON t TO alice WITH GRANT OPTION")
    alice.execute("GRANT SELECT ON t TO bob")
    refused(alice, "GRANT INSERT ON t TO bob", "INSERT WITH GRANT OPTION")
    bob = database.connect(BOB)
    try:
        assert rows(bob, "SELECT count(*) FROM t") == [(2,)]
        admin.execute("REVOKE SELECT ON t FROM alice")  # cascades to what alice granted
        refused(bob, "SELECT * FROM t")
        refused(alice, "SELECT * FROM t")
    finally:
        bob.close()
    with pytest.raises(TopicbaseError) as caught:
        admin.execute("GRANT SELECT ON t TO PUBLIC WITH GRANT OPTION")
    assert caught.value.sqlstate == "0LP01"
    with pytest.raises(TopicbaseError) as caught:
        admin.execute("GRANT SELECT ON nothing TO alice")
    assert caught.value.sqlstate == "42P01"


def test_revoke_grant_option_keeps_the_privilege(admin: Session, alice: Session) -> None:
    admin.execute("GRANT ALL ON TABLE t TO alice WITH GRANT OPTION")
    admin.execute("REVOKE GRANT OPTION FOR SELECT ON t FROM alice")
    assert rows(alice, "SELECT count(*) FROM t") == [(2,)]
    refused(alice, "GRANT SELECT ON t TO bob")
    alice.execute("GRANT INSERT ON t TO bob")  # still holds INSERT WITH GRANT OPTION


# -- roles ----------------------------------------------------------------------------------
def test_set_role_and_session_authorization(
    database: Database, admin: Session, alice: Session
) -> None:
    admin.execute("SET ROLE alice")
    assert rows(admin, "SELECT current_user, session_user") == [("alice", "topicbase")]
    refused(admin, "SELECT * FROM t")  # a superuser that SET ROLE has only the role's rights
    admin.execute("RESET ROLE")
    assert rows(admin, "SELECT count(*) FROM t") == [(2,)]
    admin.execute("SET SESSION AUTHORIZATION bob")
    assert rows(admin, "SELECT current_user, session_user") == [("bob", "bob")]
    refused(admin, "SET ROLE alice", 'permission denied to set role "alice"')
    admin.execute("RESET SESSION AUTHORIZATION")
    assert rows(admin, "SELECT current_user") == [("topicbase",)]
    refused(alice, "SET ROLE topicbase", "permission denied to set role")
    refused(alice, "SET SESSION AUTHORIZATION topicbase", "session authorization")
    alice.execute("SET ROLE alice; RESET ROLE")  # to oneself is always allowed


def test_require_for_plan_less_doors(database: Database, admin: Session, alice: Session) -> None:
    with pytest.raises(InsufficientPrivilegeError, match="topic ev"):
        privileges.require(alice, "topic", "ev", "select")
    admin.execute("GRANT SELECT ON TOPIC ev TO alice; GRANT INSERT ON t TO alice")
    privileges.require(alice, "topic", "ev", "SELECT")
    privileges.require(alice, "table", "t", "INSERT")
    privileges.require(alice, "table", "tables.main.T", "insert")
    with pytest.raises(InsufficientPrivilegeError, match="table t"):
        privileges.require(alice, "table", "t", "SELECT")
    privileges.require(admin, "table", "t", "DELETE")  # a superuser


# -- over the wire: cursors and COPY run through the session's checks ------------------------
@pytest.fixture
def wire(tmp_path: Path) -> Iterator[tuple[ServerThread, Session]]:
    users_file = str(tmp_path / "users.json")
    users.add_user(users_file, "alice", "pw-alice")
    users.add_user(users_file, "root", "pw-root", superuser=True)
    path = str(tmp_path / "data")
    server = ServerThread(path, "127.0.0.1", 0, auth="scram", users_file=users_file)
    database = Database.open(path)
    admin = database.connect()
    admin.execute("CREATE TABLE t (a INT); INSERT INTO t VALUES (1), (2); CREATE TABLE u (a INT)")
    try:
        yield server, admin
    finally:
        admin.close()
        database.close()
        server.stop()


def wire_connect(server: ServerThread, user: str, password: str) -> psycopg.Connection:
    return psycopg.connect(host="127.0.0.1", port=server.port, user=user, password=password,
                           dbname="topicbase", connect_timeout=10)  # fmt: skip


def test_wire_identity_cursors_and_copy(wire: tuple[ServerThread, Session]) -> None:
    server, admin = wire
    with wire_connect(server, "root", "pw-root") as root:
        assert root.info.parameter_status("is_superuser") == "on"
        assert root.execute("SELECT count(*) FROM t").fetchone() == (2,)
    with wire_connect(server, "alice", "pw-alice") as conn:
        assert conn.info.parameter_status("is_superuser") == "off"
        assert conn.info.parameter_status("session_authorization") == "alice"
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="table t"):
            conn.execute("DECLARE c CURSOR FOR SELECT * FROM t")
        conn.rollback()
        with (pytest.raises(psycopg.errors.InsufficientPrivilege, match="table t"),
              conn.cursor().copy("COPY t TO STDOUT") as copy):  # fmt: skip
            list(copy)
        conn.rollback()
        with (pytest.raises(psycopg.errors.InsufficientPrivilege, match="table u"),
              conn.cursor().copy("COPY u FROM STDIN") as copy):  # fmt: skip
            copy.write_row((5,))
        conn.rollback()
        admin.execute("GRANT SELECT ON t TO alice; GRANT INSERT ON u TO alice")
        conn.execute("DECLARE c CURSOR FOR SELECT a FROM t ORDER BY a")
        assert conn.execute("FETCH ALL FROM c").fetchall() == [(1,), (2,)]
        with conn.cursor().copy("COPY u FROM STDIN") as copy:
            copy.write_row((5,))
        conn.commit()
    assert rows(admin, "SELECT a FROM u") == [(5,)]


def test_grants_shown_to_postgresql_clients(wire: tuple[ServerThread, Session]) -> None:
    server, admin = wire
    admin.execute("CREATE TOPIC ev; GRANT SELECT, INSERT ON t TO alice WITH GRANT OPTION; "
                  "GRANT DELETE ON t TO PUBLIC; GRANT SELECT ON TOPIC ev TO alice")  # fmt: skip
    with wire_connect(server, "alice", "pw-alice") as conn:
        acl = dict(conn.execute("SELECT relname, relacl FROM pg_catalog.pg_class "
                                "WHERE relname IN ('t', 'u', 'ev')").fetchall())  # fmt: skip
        assert acl["t"] == ["topicbase=arwd/topicbase", "=d/topicbase", "alice=a*r*/topicbase"]
        assert acl["ev"] == ["topicbase=arA/topicbase", "alice=r/topicbase"]
        assert acl["u"] is None  # never granted: PostgreSQL's default ACL
        roles = conn.execute("SELECT rolname, rolsuper FROM pg_roles ORDER BY 1").fetchall()
        assert roles == [("alice", False), ("root", True), ("topicbase", True)]
        privileges_of_alice = conn.execute(
            "SELECT privilege_type, is_grantable FROM information_schema.table_privileges "
            "WHERE table_name = 't' AND grantee = 'alice' ORDER BY 1").fetchall()  # fmt: skip
        assert privileges_of_alice == [("INSERT", "YES"), ("SELECT", "YES")]
        checks = conn.execute(
            "SELECT has_table_privilege('t', 'SELECT'), has_table_privilege('u', 'SELECT'), "
            "has_table_privilege('alice', 'main.t', 'DELETE'), "
            "has_table_privilege('alice', 't', 'UPDATE'), "
            "has_table_privilege('root', 'u', 'UPDATE')").fetchone()  # fmt: skip
        assert checks == (True, False, True, False, True)
    listing = subprocess.run(
        [shutil.which("psql") or "/usr/bin/psql", "-h", "127.0.0.1", "-p", str(server.port),
         "-U", "alice", "-d", "topicbase", "-X", "-c", r"\dp", "-c", r"\du"],
        env={**os.environ, "PGPASSWORD": "pw-alice"}, capture_output=True, text=True,
        timeout=60, check=True,
    ).stdout  # fmt: skip
    assert "alice=a*r*/topicbase" in listing and "=d/topicbase" in listing
    assert re.search(r"root\s*\|\s*Superuser", listing)


def test_check_reports_grants_of_objects_that_do_not_exist(tmp_path: Path) -> None:
    path = str(tmp_path / "data")
    database = Database.open(path)
    admin = database.connect()
    admin.execute("CREATE TABLE t (a INT); CREATE VIEW v AS SELECT * FROM t; CREATE TOPIC ev; "
                  "GRANT SELECT ON t TO alice; GRANT SELECT ON v TO PUBLIC; "
                  "GRANT INSERT ON TOPIC ev TO alice; GRANT CREATE ON SCHEMA main TO alice; "
                  "DROP TABLE IF EXISTS gone")  # fmt: skip
    admin.close()
    database.close()
    assert check_database(path).problems == []
    connection = tables.connect(os.path.join(path, tables.TABLES_FILE))
    tables.run(connection, "INSERT INTO __topicbase.grants VALUES "
                           "('relation', 'gone', 'bob', 'SELECT', 'topicbase', false), "
                           "('topic', 'nope', '', 'INSERT', 'topicbase', false); "
                           "INSERT INTO __topicbase.owners VALUES "
                           "('relation', 't', 'table', 'x')")  # fmt: skip
    connection.close()
    texts = [problem.message for problem in check_database(path).problems]
    assert any('relation "gone" (grantee "bob")' in text for text in texts), texts
    assert any('topic "nope" (grantee "PUBLIC")' in text for text in texts), texts
    assert any('relation "t" has more than one owner row' in text for text in texts), texts
    assert len(texts) == 3


def test_wire_set_role_and_unknown_grantees(wire: tuple[ServerThread, Session]) -> None:
    server, _ = wire
    with wire_connect(server, "root", "pw-root") as root:
        root.autocommit = True
        with pytest.raises(psycopg.errors.UndefinedObject, match='role "nobody" does not exist'):
            root.execute("GRANT SELECT ON t TO nobody")
        assert root.execute("SELECT current_user, session_user").fetchone() == ("root", "root")
        root.execute("SET ROLE alice")  # a superuser may become anyone, and loses its rights
        assert root.execute("SELECT current_user, session_user").fetchone() == ("alice", "root")
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="table t"):
            root.execute("SELECT * FROM t")
        root.execute("RESET ROLE")
        assert root.execute("SELECT count(*) FROM t").fetchone() == (2,)
    with (wire_connect(server, "alice", "pw-alice") as conn,
          pytest.raises(psycopg.errors.InsufficientPrivilege, match="set role")):  # fmt: skip
        conn.execute("SET ROLE root")


def test_cached_privileges_follow_every_committed_change(admin: Session, alice: Session) -> None:
    """engine.privilege_cache: a check never answers from a state that is no longer true."""
    admin.execute("GRANT SELECT ON t TO alice")
    for _ in range(3):  # cached now
        assert rows(alice, "SELECT count(*) FROM t") == [(2,)]
    admin.execute("BEGIN; REVOKE SELECT ON t FROM alice")
    assert rows(alice, "SELECT count(*) FROM t") == [(2,)]  # not committed: still granted
    admin.execute("COMMIT")
    refused(alice, "SELECT * FROM t")
    admin.execute("GRANT SELECT ON t TO alice")
    assert rows(alice, "SELECT count(*) FROM t") == [(2,)]
    admin.execute("DROP TABLE t; CREATE TABLE t (a INT)")  # a new t: no grant
    refused(alice, "SELECT * FROM t")
    admin.execute("CREATE TOPIC fresh; GRANT SELECT ON TOPIC fresh TO alice")
    assert rows(alice, "SELECT count(*) FROM fresh") == [(0,)]
    admin.execute("DROP TOPIC fresh; CREATE TOPIC fresh")
    refused(alice, "SELECT * FROM fresh", "topic fresh")


def test_set_role_in_a_transaction_is_undone_by_rollback(admin: Session) -> None:
    admin.execute("BEGIN; SET ROLE alice")
    refused(admin, "SELECT * FROM t")  # the transaction fails here; only ROLLBACK remains
    admin.execute("ROLLBACK")
    assert rows(admin, "SELECT count(*) FROM t") == [(2,)]  # the superuser again
    assert admin.identity.superuser
    admin.execute("BEGIN; SET ROLE alice; COMMIT")
    refused(admin, "SELECT * FROM t")  # committed: alice stays
    assert rows(admin, "SELECT current_user") == [("alice",)]
    admin.execute("RESET ROLE")
    assert rows(admin, "SELECT current_user") == [("topicbase",)]


# -- EXECUTE is judged when it runs -----------------------------------------------------------
def test_execute_after_a_revoke_is_refused_as_the_statement_would_be(
    admin: Session, alice: Session
) -> None:
    """PostgreSQL checks a prepared statement's privileges at EXECUTE: a REVOKE between
    PREPARE and EXECUTE counts (before, EXECUTE ran what PREPARE had been allowed)."""
    admin.execute("GRANT SELECT ON t TO alice")
    alice.execute("PREPARE p AS SELECT a FROM t ORDER BY a")
    assert rows(alice, "EXECUTE p") == [(1,), (2,)]
    admin.execute("REVOKE SELECT ON t FROM alice")
    refused(alice, "EXECUTE p", "permission denied for table t")
    admin.execute("GRANT SELECT ON t TO alice")
    assert rows(alice, "EXECUTE p") == [(1,), (2,)]


def test_a_superusers_prepared_statement_does_not_run_after_set_role(admin: Session) -> None:
    admin.execute('PREPARE "Secret" AS SELECT a FROM t')
    admin.execute("SET ROLE alice")
    refused(admin, 'EXECUTE "Secret"', "permission denied for table t")
    admin.execute("RESET ROLE")
    assert len(rows(admin, 'EXECUTE "Secret"')) == 2


def test_execute_is_judged_by_what_it_runs_whatever_the_prepare_text_said(
    admin: Session,
) -> None:
    """The statement an EXECUTE runs is read from the kept PREPARE with DuckDB's lexer
    (``engine.prepared_room``, as the sandbox read it): a comment that looks like
    ``AS <harmless>`` or a name in other case or quotes changes nothing."""
    admin.execute("PREPARE Hidden /* AS SELECT 1 */ AS SELECT a FROM t")
    admin.execute("SET ROLE alice")
    for spelling in ("EXECUTE hidden", 'EXECUTE "Hidden"', "/* x */ EXECUTE HIDDEN",
                     "EXECUTE/**/hidden"):  # fmt: skip
        refused(admin, spelling, "permission denied for table t")
    admin.execute("RESET ROLE")
    assert len(rows(admin, "EXECUTE hidden")) == 2
