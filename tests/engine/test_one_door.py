"""Every front's every way of running a statement passes the session's door.

(SQL-level PREPARE/EXECUTE by an ordinary user, against the real checks, is in
``tests/security/test_door_prepare.py``.)

The door is ``Session._guard``: the sandbox and the privilege checks, run on the plan
before anything of it runs. Here the privilege check is replaced by one that refuses any
plan reading the table ``secret``; each front path must then get 42501 and no rows, which
fails the moment some path plans or runs SQL past the session (as the wire's streamed
COPY TO and DECLARE once did on the DuckDB cursor).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from engine import privileges
from engine.database import Database
from engine.identity import Identity
from grammar.parse import parse_one
from planner.operations import Plan, RunQuery
from sql import dbapi
from sql.pgwire.server import ServerThread
from storage.errors import InsufficientPrivilegeError, ObjectInUseError

SECRET_ROWS = 3


def _refuse_secret(plan: Plan, identity: Identity, session: Any, memo: Any = None) -> None:
    for operation in plan.operations:
        if isinstance(operation, RunQuery) and any(
            name.split(".")[-1] == "secret" for name in operation.tables_read
        ):
            raise InsufficientPrivilegeError("permission denied for table secret")


@pytest.fixture
def guarded(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[str]:
    data = str(tmp_path / "data")
    database = Database.open(data)
    session = database.connect()
    session.execute(
        "CREATE TABLE secret (v INTEGER); INSERT INTO secret SELECT * FROM range(3);"
        "CREATE TABLE open_t (v INTEGER); INSERT INTO open_t VALUES (1)"
    )
    session.close()
    database.close()
    monkeypatch.setattr(privileges, "check_plan", _refuse_secret)
    yield data


def test_engine_execute_describe_and_stream_are_refused(guarded: str) -> None:
    database = Database.open(guarded)
    session = database.connect()
    try:
        statement = parse_one("SELECT * FROM secret")
        for attempt in (
            lambda: session.execute("SELECT count(*) FROM secret"),
            lambda: session.describe(statement),
            lambda: session.open_stream(statement, no_rows=AssertionError("rows")),
        ):
            with pytest.raises(InsufficientPrivilegeError):
                attempt()
        allowed = session.open_stream(
            parse_one("SELECT v FROM open_t"), no_rows=AssertionError("rows")
        )
        assert allowed is not None
        with pytest.raises(ObjectInUseError):  # one open result per session
            session.execute("SELECT 1")
        batch = allowed.next_batch()
        assert batch is not None and batch.to_pylist() == [{"v": 1}]
        allowed.close()
        assert session.execute("SELECT 1 AS one")[0].table.to_pylist() == [{"one": 1}]
    finally:
        session.close()
        database.close()


def test_dbapi_is_refused(guarded: str) -> None:
    connection = dbapi.connect(guarded)
    try:
        with pytest.raises(dbapi.Error) as refused:
            connection.cursor().execute("SELECT * FROM secret")
        assert refused.value.sqlstate == "42501"
    finally:
        connection.close()


def test_every_wire_path_is_refused(guarded: str) -> None:
    server = ServerThread(guarded, "127.0.0.1", 0)
    try:
        with psycopg.connect(host="127.0.0.1", port=server.port, user="tester",
                             autocommit=True, connect_timeout=10) as client:  # fmt: skip
            attempts = [
                lambda c: c.execute("SELECT * FROM secret"),  # simple protocol
                lambda c: c.execute("SELECT * FROM secret WHERE v > %s", (0,)),  # extended
                lambda c: c.execute("DECLARE c CURSOR WITH HOLD FOR SELECT * FROM secret"),
            ]
            for attempt in attempts:
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    attempt(client.cursor())
            for copy in ("COPY (SELECT * FROM secret) TO STDOUT", "COPY secret TO STDOUT"):
                cursor = client.cursor()
                with pytest.raises(psycopg.errors.InsufficientPrivilege), cursor.copy(copy) as out:
                    list(out)
            # The connection still serves what is allowed.
            assert client.execute("SELECT v FROM open_t").fetchall() == [(1,)]
    finally:
        server.stop()
