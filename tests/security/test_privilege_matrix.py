"""Each privilege × each statement kind × each front (console, DB-API, wire).

For every cell one privilege is granted to alice, an ordinary user, and one statement is
run as her: it must succeed exactly when the privilege granted is the one the statement
needs (PostgreSQL's rule), and a refusal must be 42501 with nothing changed (rows,
messages, consumers and committed offsets are compared before and after).

Fronts: the console in script mode (``sql.console.main`` with ``-c``, in this process,
``SET ROLE alice`` first: the console is the local superuser), the DB-API
(``sql.dbapi.connect`` then ``SET ROLE alice``) and the wire (psycopg logging in as alice
with SCRAM, an ordinary user of the users file).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import psycopg
import pytest

from sql import console, dbapi
from sql.pgwire import users
from sql.pgwire.server import ServerThread

ALICE_PASSWORD = "alice-secret"


@dataclass(frozen=True)
class Case:
    kind: str  # the object kind GRANT names: "table", "topic", "schema"
    obj: str
    needs: str  # the privilege the statement needs
    sql: str


CASES = (
    Case("table", "t", "SELECT", "SELECT count(*) FROM t"),
    Case("table", "t", "SELECT", "SELECT * FROM (SELECT a FROM t) s JOIN (VALUES (1)) v ON true"),
    Case("table", "t", "INSERT", "INSERT INTO t VALUES (7)"),
    Case("table", "t", "UPDATE", "UPDATE t SET a = 5"),
    Case("table", "t", "DELETE", "DELETE FROM t"),
    Case("topic", "ev", "SELECT", "SELECT count(*) FROM TOPIC ev"),
    Case("topic", "ev", "SELECT", "SELECT count(*) FROM ev"),
    Case("topic", "ev", "SELECT", "SELECT count(*) FROM TOPIC ev WITH (consumer = 'c')"),
    Case("topic", "ev", "INSERT", "INSERT INTO TOPIC ev (data) VALUES ('x')"),
    Case("topic", "ev", "INSERT", "INSERT INTO ev (data) VALUES ('y')"),
    Case("topic", "ev", "ALTER", "ALTER TOPIC ev ADD CONSUMER extra"),
    Case("schema", "main", "CREATE", "CREATE TABLE made (a INT)"),
    Case("schema", "main", "CREATE", "CREATE TOPIC made_topic"),
)
PRIVILEGES = {"table": ("SELECT", "INSERT", "UPDATE", "DELETE"),
              "topic": ("SELECT", "INSERT", "ALTER"), "schema": ("CREATE",)}  # fmt: skip
CELLS = [
    (case, privilege)
    for case in CASES
    for privilege in (*PRIVILEGES[case.kind], None)  # None: nothing granted
]


@dataclass
class World:
    path: str
    server: ServerThread
    admin: dbapi.Connection

    def run(self, sql: str) -> list[tuple[object, ...]]:
        cursor = self.admin.cursor()
        cursor.execute(sql)
        return cursor.fetchall() if cursor.description else []

    def fingerprint(self) -> tuple[object, ...]:
        """Everything a statement of the matrix could change."""
        tables = self.run(
            "SELECT table_name FROM duckdb_tables() WHERE schema_name = 'main' ORDER BY 1"
        )
        return (
            self.run("SELECT count(*), coalesce(sum(a), 0) FROM t"),
            tables,
            self.run("SELECT name, partitions, consumers FROM sys.topics ORDER BY name"),
            self.run("SELECT topic, consumer, committed_offset FROM sys.consumers ORDER BY 1, 2"),
            self.run("SELECT count(*) FROM TOPIC ev"),
        )

    def reset(self) -> None:
        """Back to the starting objects, owned by the superuser, with no grants."""
        for sql in ("DROP TABLE IF EXISTS made", "DROP TOPIC IF EXISTS made_topic",
                    "REVOKE ALL ON t FROM alice", "REVOKE ALL ON TOPIC ev FROM alice",
                    "REVOKE CREATE ON SCHEMA main FROM alice", "DELETE FROM t",
                    "INSERT INTO t VALUES (1), (2)"):  # fmt: skip
            self.run(sql)
        if any(row[0] == "extra" for row in self.run("SELECT consumer FROM sys.consumers")):
            self.run("ALTER TOPIC ev DROP CONSUMER extra")


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    base = tmp_path_factory.mktemp("matrix")
    path = str(base / "data")
    users_file = str(base / "users.json")
    users.add_user(users_file, "alice", ALICE_PASSWORD)
    admin = dbapi.connect(path, autocommit=True)
    setup = ("CREATE TABLE t (a INT)", "INSERT INTO t VALUES (1), (2)",
             "CREATE TOPIC ev (CONSUMER c)", "INSERT INTO TOPIC ev (data) VALUES ('m')")
    for sql in setup:
        admin.cursor().execute(sql)
    server = ServerThread(path, "127.0.0.1", 0, auth="scram", users_file=users_file)
    try:
        yield World(path, server, admin)
    finally:
        server.stop()
        admin.close()


# -- the three fronts: each runs one statement as alice and returns its SQLSTATE or None -----
def run_console(world: World, sql: str, capsys: pytest.CaptureFixture[str]) -> str | None:
    code = console.main(["--data-dir", world.path, "-q", "-c", "SET ROLE alice", "-c", sql])
    err = capsys.readouterr().err
    if code == 0:
        return None
    assert err.startswith("ERROR: "), err
    return err.split(":")[1].strip()


def run_dbapi(world: World, sql: str, capsys: pytest.CaptureFixture[str]) -> str | None:
    connection = dbapi.connect(world.path, autocommit=True)
    try:
        connection.cursor().execute("SET ROLE alice")
        connection.cursor().execute(sql)
    except dbapi.Error as error:
        return error.sqlstate
    finally:
        connection.close()
    return None


def run_wire(world: World, sql: str, capsys: pytest.CaptureFixture[str]) -> str | None:
    with psycopg.connect(host="127.0.0.1", port=world.server.port, user="alice",
                         password=ALICE_PASSWORD, dbname="topicbase", autocommit=True,
                         connect_timeout=10) as connection:  # fmt: skip
        assert connection.info.parameter_status("is_superuser") == "off"
        try:
            connection.execute(sql)
        except psycopg.Error as error:
            return error.sqlstate
    return None


FRONTS: dict[str, Callable[[World, str, pytest.CaptureFixture[str]], str | None]] = {
    "console": run_console, "dbapi": run_dbapi, "wire": run_wire,
}  # fmt: skip


@pytest.mark.parametrize("front", list(FRONTS))
@pytest.mark.parametrize(("case", "granted"), CELLS,
                         ids=[f"{c.sql[:32]}|{g or 'none'}" for c, g in CELLS])  # fmt: skip
def test_cell(world: World, front: str, case: Case, granted: str | None,
              capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    world.reset()
    if granted is not None:
        on = {"table": "TABLE", "topic": "TOPIC", "schema": "SCHEMA"}[case.kind]
        world.run(f"GRANT {granted} ON {on} {case.obj} TO alice")
    before = world.fingerprint()
    sqlstate = FRONTS[front](world, case.sql, capsys)
    if granted == case.needs:
        assert sqlstate is None, f"{case.sql} with {granted} was refused: {sqlstate}"
        assert world.fingerprint() != before or case.sql.startswith("SELECT")
    else:
        assert sqlstate == "42501", f"{case.sql} with {granted}: {sqlstate}"
        assert world.fingerprint() == before
