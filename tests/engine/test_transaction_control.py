"""``Session.transaction_control``: BEGIN, COMMIT and ROLLBACK without a statement.

A front that holds an autocommit statement's effects until it has delivered its result
(the wire's consumer reads, ``sql.pgwire.connection.copy_commit``) opens and ends that
transaction through it. What must hold: it is the transaction BEGIN / COMMIT / ROLLBACK
statements give (a consumer read's offsets move at the commit and not at a rollback; a
refused commit is 40001; a failed transaction's COMMIT rolls back; BEGIN inside a
transaction and COMMIT outside one are notices), with no planning of its own; a cancel
requested before the commit stays requested; a closed session refuses it.
"""

from __future__ import annotations

import pytest

from engine.session import Session, parse_statements
from engine.transaction import SessionState
from planner import planner
from storage.errors import (
    InFailedTransactionError,
    InvalidParameterValueError,
    SerializationFailure,
)

READ = "SELECT data FROM TOPIC t WITH (consumer = 'c', max_messages = 3)"


def _filled(session: Session, count: int = 10) -> None:
    session.execute("CREATE TOPIC t (CONSUMER c) WITH (min_active_partitions = 1)")
    session.execute("INSERT INTO TOPIC t (data) SELECT CAST(CAST(i AS VARCHAR) AS BLOB) "
                    f"FROM range({count}) r(i)")  # fmt: skip


def _committed(session: Session) -> int | None:
    (result,) = session.execute(
        "SELECT committed_offset FROM sys.consumers WHERE topic = 't' AND consumer = 'c'"
    )
    return result.table.column(0)[0].as_py()


def test_commit_moves_the_reads_offsets_and_rollback_does_not(session: Session) -> None:
    _filled(session)
    assert session.transaction_control("begin").tag == "BEGIN"
    assert session.state is SessionState.IN_TRANSACTION
    (read,) = session.execute(READ)
    assert read.table.num_rows == 3
    assert session.transaction_control("rollback").tag == "ROLLBACK"
    assert session.state is SessionState.IDLE
    assert _committed(session) is None
    session.transaction_control("begin")
    (again,) = session.execute(READ)
    assert again.table.column(0).to_pylist() == read.table.column(0).to_pylist()
    assert session.transaction_control("commit").tag == "COMMIT"
    assert session.state is SessionState.IDLE
    assert _committed(session) == 3


def test_no_planning(session: Session, monkeypatch: pytest.MonkeyPatch) -> None:
    _filled(session)
    planned: list[object] = []
    plan = planner.plan
    monkeypatch.setattr(planner, "plan", lambda *a, **k: planned.append(a[0]) or plan(*a, **k))
    session.transaction_control("begin")
    session.transaction_control("commit")
    session.transaction_control("begin")
    session.transaction_control("rollback")
    assert planned == []


def test_refused_commit_is_40001_and_rolls_back(session: Session, database) -> None:
    _filled(session)
    other = database.connect()
    try:
        session.transaction_control("begin")
        session.execute(READ)
        other.execute(READ)  # moves the offsets first
        with pytest.raises(SerializationFailure):
            session.transaction_control("commit")
        assert session.state is SessionState.IDLE
        assert _committed(session) == 3
    finally:
        other.close()


def test_failed_transaction_commit_rolls_back(session: Session) -> None:
    _filled(session)
    session.transaction_control("begin")
    session.execute(READ)
    with pytest.raises(Exception):  # noqa: B017 - any error fails the transaction
        session.execute("SELECT * FROM no_such_table")
    assert session.state is SessionState.FAILED
    with pytest.raises(InFailedTransactionError):
        session.execute(READ)
    assert session.transaction_control("commit").tag == "ROLLBACK"
    assert session.state is SessionState.IDLE
    assert _committed(session) is None


def test_notices_as_the_statements_give(session: Session) -> None:
    (statement,) = session.execute("COMMIT")
    direct = session.transaction_control("commit")
    assert (direct.tag, direct.notices) == (statement.tag, statement.notices)
    session.transaction_control("begin")
    (statement,) = session.execute("BEGIN")
    direct = session.transaction_control("begin")
    assert (direct.tag, direct.notices) == (statement.tag, statement.notices)
    assert direct.notices == ("there is already a transaction in progress",)
    session.transaction_control("rollback")


def test_cancel_requested_stays_requested(session: Session) -> None:
    _filled(session)
    session.transaction_control("begin")
    session.execute_statement(parse_statements(READ)[0])
    session.cancel()
    session.transaction_control("rollback")
    assert session.cancel_requested


def test_closed_session_refuses(session: Session, database) -> None:
    closed = database.connect()
    closed.close()
    with pytest.raises(InvalidParameterValueError):
        closed.transaction_control("begin")
