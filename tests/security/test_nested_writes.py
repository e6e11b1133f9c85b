"""Data-modifying statements nested in another (``WITH u AS (UPDATE ...) SELECT ...``).

They would run as their root's kind: a SELECT needing only SELECT privilege, tagged
SELECT, read-only as far as the transaction knows. The planner refuses them (0A000),
the sandbox refuses them again from DuckDB's tokens whatever sqlglot reads, and the
privilege analysis demands the nested writes' privileges (the third line). Each form
is tried by a superuser and by an ordinary user with SELECT, through the engine and
through the wire's simple and extended protocols; the tables are looked at afterwards.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from engine.database import Database
from engine.identity import LOCAL_SUPERUSER, Identity
from engine.sandbox import check_sql
from engine.session import Session
from planner.access import relation_access
from planner.planner import analyse_sql
from storage.errors import FeatureNotSupportedError, TopicbaseError
from tests.security.conftest import ADMIN, ALICE, WireServer

NESTED_WRITES = [
    "WITH u AS (UPDATE kv SET v = 'x' WHERE k = 1 RETURNING *) SELECT * FROM u",
    "WITH u AS (UPDATE kv SET v = 'x' RETURNING *) SELECT 1",
    "WITH d AS (DELETE FROM kv WHERE k = 2 RETURNING *) SELECT count(*) FROM d",
    "WITH i AS (INSERT INTO kv VALUES (3, 'ins') RETURNING *) SELECT * FROM i",
    "with I as materialized ( insert into KV values (4, 'ins') returning * ) select 1",
    "WITH d AS (DELETE FROM kv RETURNING *) INSERT INTO log SELECT v FROM d",
    "WITH d AS (DELETE FROM kv RETURNING *) UPDATE log SET v = 'y'",
    "CREATE TABLE copied AS WITH d AS (DELETE FROM kv RETURNING *) SELECT * FROM d",
    "WITH a AS (WITH b AS (SELECT 1) DELETE FROM kv RETURNING *) SELECT 1",
    "SELECT * FROM (WITH d AS (DELETE FROM kv RETURNING *) SELECT * FROM d) AS s",
    "WITH d AS (/* c */ DELETE FROM kv RETURNING *) SELECT 1",
]
# Refused by the sandbox whatever the planner made of them (sqlglot reads PREPARE as a
# command, and DuckDB's own binder refuses the last two too).
SANDBOX_ALSO = [
    f"PREPARE p AS {NESTED_WRITES[0]}",
    "CREATE VIEW w AS WITH d AS (DELETE FROM kv RETURNING *) SELECT * FROM d",
    "CREATE MACRO m() AS TABLE WITH d AS (DELETE FROM kv RETURNING *) SELECT * FROM d",
]
STILL_ALLOWED = [
    "WITH x AS (SELECT 5 AS k, 'five' AS v) INSERT INTO kv SELECT * FROM x",
    "INSERT INTO kv VALUES (1, 'z') ON CONFLICT (k) DO UPDATE SET v = excluded.v",
    "MERGE INTO kv USING (SELECT 1 AS k) AS s ON kv.k = s.k "
    "WHEN MATCHED THEN UPDATE SET v = 'm' WHEN NOT MATCHED THEN INSERT VALUES (s.k, 'n')",
    "UPDATE kv SET v = (SELECT 'q') WHERE k IN (SELECT 1)",
    "DELETE FROM kv WHERE k IN (SELECT 99)",
    "PREPARE p AS WITH x AS (SELECT 6 AS k, 'six' AS v) INSERT INTO kv SELECT * FROM x",
    "CREATE TABLE child (k BIGINT REFERENCES kv (k) ON DELETE RESTRICT ON UPDATE RESTRICT)",
]
SETUP = (
    "CREATE TABLE kv (k BIGINT PRIMARY KEY, v VARCHAR); INSERT INTO kv VALUES (1, 'a'), (2, 'b'); "
    "CREATE TABLE log (v VARCHAR); GRANT SELECT ON TABLE kv TO alice; "
    "GRANT SELECT ON TABLE log TO alice"
)
ROWS = [(1, "a"), (2, "b")]


@pytest.fixture
def database(tmp_path: Path) -> Iterator[Database]:
    opened = Database.open(str(tmp_path / "data"), retention_interval_s=None)
    admin = opened.connect()
    admin.execute(SETUP)
    admin.close()
    yield opened
    opened.close()


@pytest.fixture(params=["superuser", "alice"])
def session(request: pytest.FixtureRequest, database: Database) -> Iterator[Session]:
    alice = Identity("alice", superuser=False)
    identity = LOCAL_SUPERUSER if request.param == "superuser" else alice
    opened = database.connect(identity)
    yield opened
    opened.close()


def rows(session: Session, sql: str) -> list[tuple[Any, ...]]:
    result = session.execute(sql)[-1]
    assert result.table is not None
    return [tuple(row.values()) for row in result.table.to_pylist()]


@pytest.mark.parametrize("sql", NESTED_WRITES)
def test_the_planner_refuses_nested_writes(sql: str) -> None:
    with pytest.raises(FeatureNotSupportedError, match="data-modifying statements in WITH"):
        analyse_sql(sql)


@pytest.mark.parametrize("sql", NESTED_WRITES + SANDBOX_ALSO)
def test_the_sandbox_refuses_nested_writes_by_itself(sql: str) -> None:
    for superuser in (True, False):
        with pytest.raises(FeatureNotSupportedError, match="data-modifying"):
            check_sql(sql, superuser=superuser)


@pytest.mark.parametrize("sql", STILL_ALLOWED)
def test_writes_of_the_root_itself_pass_both(sql: str) -> None:
    check_sql(sql, superuser=False)
    analyse_sql(sql)


def test_nested_writes_demand_their_privileges() -> None:
    needs = set(relation_access(NESTED_WRITES[0]).needs)
    assert {("kv", "UPDATE"), ("kv", "SELECT")} <= needs
    needs = set(relation_access(NESTED_WRITES[5]).needs)
    assert {("kv", "DELETE"), ("log", "INSERT")} <= needs
    needs = set(relation_access(NESTED_WRITES[7]).needs)
    assert {("kv", "DELETE"), ("copied", "CREATE")} <= needs
    assert ("kv", "INSERT") in relation_access(NESTED_WRITES[3]).needs


def test_every_form_is_refused_and_changes_nothing(session: Session) -> None:
    for sql in NESTED_WRITES + SANDBOX_ALSO:
        with pytest.raises(TopicbaseError) as caught:
            session.execute(sql)
        assert caught.value.sqlstate == "0A000", sql
    assert rows(session, "SELECT * FROM kv ORDER BY k") == ROWS
    assert rows(session, "SELECT count(*) FROM log") == [(0,)]
    with pytest.raises(TopicbaseError):
        session.execute("SELECT * FROM copied")
    assert rows(session, "SELECT 1") == [(1,)]


def test_refused_inside_a_transaction_too(session: Session) -> None:
    session.execute("BEGIN")
    with pytest.raises(TopicbaseError) as caught:
        session.execute(NESTED_WRITES[0])
    assert caught.value.sqlstate == "0A000"
    session.execute("ROLLBACK")
    assert rows(session, "SELECT * FROM kv ORDER BY k") == ROWS


def test_over_the_wire_simple_and_extended(wire_server: WireServer) -> None:
    admin = wire_server.login(ADMIN)
    admin.execute(SETUP)
    attacker = wire_server.login(ALICE)
    for connection in (attacker, admin):
        for sql in NESTED_WRITES:
            with pytest.raises(psycopg.Error) as caught:  # simple protocol
                connection.execute(sql, prepare=False)
            assert caught.value.sqlstate == "0A000", sql
        with pytest.raises(psycopg.Error) as caught:  # extended: Parse/Bind with a parameter
            connection.execute(
                "WITH u AS (UPDATE kv SET v = %s WHERE k = 1 RETURNING *) SELECT * FROM u",
                ("x",),
            )
        assert caught.value.sqlstate == "0A000"
        with pytest.raises(psycopg.Error) as caught:  # extended, prepared and reused
            connection.execute(NESTED_WRITES[2], prepare=True)
        assert caught.value.sqlstate == "0A000"
        assert connection.execute("SELECT * FROM kv ORDER BY k").fetchall() == ROWS
    assert admin.execute("SELECT count(*) FROM log").fetchone() == (0,)
