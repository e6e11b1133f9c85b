"""A CancelRequest or ``statement_timeout`` that comes while the wire still works on a
statement's message, before the engine starts the statement (round 28, H5): the wire reads,
decodes and splits a multi-MiB Query or Parse first (0.2-2 s here), and the session cleared
its cancel flag at the statement's start, so such a cancel was lost and the timeout's clock
started late. Now the wire tells the session when a message arrived
(``Session.message_arrived``): a cancel since then ends the message's statement (57014,
nothing written) and no later one; ``statement_timeout`` counts from the arrival.

The wire's own work is caught at its text-splitting step (``parse_text`` for a Query,
``_prepare_text`` for a Parse): there the test sends its CancelRequest (psycopg's
``cancel_safe``, which returns once the server took it) or spends the time a long text
would, so nothing depends on the machine's speed."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator

import psycopg
import pytest
from psycopg import errors

from sql.pgwire.connection import connection as wire_connection
from sql.pgwire.connection import extended as wire_extended

Connect = Callable[..., psycopg.Connection]

ROWS = 160_000  # ~3 MiB of INSERT text, as tests/pgwire/test_front_cancel.py
_marks = itertools.count()


class WireWork:
    """Runs ``action`` inside the wire's work on a text holding ``mark`` (once per text)."""

    def __init__(self) -> None:
        self.mark = ""
        self.action: Callable[[], None] = lambda: None
        self.ran = 0

    def arm(self, action: Callable[[], None]) -> str:
        """A fresh mark (a text the wire's parse caches have not seen) for ``action``."""
        self.mark = f"/* wire work {next(_marks)} {time.time_ns()} */"
        self.action = action
        return self.mark

    def __call__(self, text: str) -> None:
        if self.mark and self.mark in text:
            self.mark = ""
            self.ran += 1
            self.action()


@pytest.fixture
def wire_work(monkeypatch: pytest.MonkeyPatch) -> Iterator[WireWork]:
    work = WireWork()
    parse_text = wire_connection.parse_text
    prepare_text = wire_extended._prepare_text

    def parsing(text: str) -> object:
        work(text)
        return parse_text(text)

    def preparing(text: str) -> object:
        work(text)
        return prepare_text(text)

    monkeypatch.setattr(wire_connection, "parse_text", parsing)
    monkeypatch.setattr(wire_extended, "_prepare_text", preparing)
    yield work


def _cursor(connection: psycopg.Connection, protocol: str) -> psycopg.Cursor:
    if protocol == "simple":
        return psycopg.ClientCursor(connection)  # a Query message
    return connection.cursor()  # Parse, Bind, Describe, Execute, Sync


def _insert(rows: int, mark: str) -> str:
    return f"INSERT INTO t VALUES {mark} " + ", ".join(f"({i}, 'v{i}')" for i in range(rows))


def _count(connection: psycopg.Connection) -> int:
    row = connection.execute("SELECT count(*) FROM t").fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.parametrize("protocol", ["simple", "extended"])
@pytest.mark.parametrize("rows", [1, ROWS], ids=["small", "3MiB"])
def test_a_cancel_during_the_wires_work_ends_that_statement(
    connect: Connect, wire_work: WireWork, protocol: str, rows: int
) -> None:
    connection = connect(autocommit=True)
    connection.execute("CREATE TABLE t (a INTEGER, b VARCHAR)")
    sql = _insert(rows, wire_work.arm(connection.cancel_safe))
    started = time.monotonic()
    with pytest.raises(errors.QueryCanceled, match="user request"):
        _cursor(connection, protocol).execute(sql)
    assert wire_work.ran == 1
    assert time.monotonic() - started < 10.0  # on main the 3 MiB INSERT ran whole (>15 s)
    assert _count(connection) == 0
    # The cancel was that statement's: the next one (and its Parse) runs.
    _cursor(connection, protocol).execute("INSERT INTO t VALUES (1, 'one')")
    assert _count(connection) == 1


@pytest.mark.parametrize("protocol", ["simple", "extended"])
def test_a_cancel_while_idle_ends_no_later_statement(connect: Connect, protocol: str) -> None:
    connection = connect(autocommit=True)
    connection.execute("CREATE TABLE t (a INTEGER, b VARCHAR)")
    connection.cancel_safe()  # nothing runs: PostgreSQL drops it, so does the server
    _cursor(connection, protocol).execute("INSERT INTO t VALUES (1, 'one')")
    assert _count(connection) == 1


def test_a_rollback_is_not_cancelled(connect: Connect, wire_work: WireWork) -> None:
    """A cancel during the wire's work on a ROLLBACK leaves the ROLLBACK to undo."""
    connection = connect(autocommit=True)
    connection.execute("CREATE TABLE t (a INTEGER, b VARCHAR)")
    cursor = psycopg.ClientCursor(connection)
    cursor.execute("BEGIN")
    cursor.execute("INSERT INTO t VALUES (1, 'one')")
    cursor.execute(f"ROLLBACK {wire_work.arm(connection.cancel_safe)}")
    assert wire_work.ran == 1
    assert _count(connection) == 0


@pytest.mark.parametrize("protocol", ["simple", "extended"])
@pytest.mark.parametrize("statement", ["insert", "query"])
def test_statement_timeout_counts_the_wires_work(
    connect: Connect, wire_work: WireWork, protocol: str, statement: str
) -> None:
    """The wire spends 0.6 s on the text (as on megabytes); the engine's own work is short:
    with a 300 ms timeout the statement ends with 57014, having written nothing."""
    connection = connect(autocommit=True)
    connection.execute("CREATE TABLE t (a INTEGER, b VARCHAR)")
    connection.execute("SET statement_timeout = '300ms'")
    mark = wire_work.arm(lambda: time.sleep(0.6))
    sql = (_insert(1, mark) if statement == "insert"
           else f"SELECT count(*) FROM t WHERE a IN (1, 2) {mark}")  # fmt: skip
    with pytest.raises(errors.QueryCanceled, match="statement timeout"):
        _cursor(connection, protocol).execute(sql)
    assert wire_work.ran == 1
    # The next statement's clock starts at its own arrival: it runs.
    _cursor(connection, protocol).execute("INSERT INTO t VALUES (1, 'one')")
    connection.execute("RESET statement_timeout")
    assert _count(connection) == 1


def test_statement_timeout_in_a_transaction_fails_it(connect: Connect, wire_work: WireWork) -> None:
    """Timed out before it started, the statement fails its transaction, as any error."""
    connection = connect(autocommit=True)
    connection.execute("CREATE TABLE t (a INTEGER, b VARCHAR)")
    cursor = psycopg.ClientCursor(connection)
    cursor.execute("SET statement_timeout = '200ms'")
    cursor.execute("BEGIN")
    cursor.execute("INSERT INTO t VALUES (1, 'one')")
    with pytest.raises(errors.QueryCanceled, match="statement timeout"):
        cursor.execute(_insert(1, wire_work.arm(lambda: time.sleep(0.5))))
    with pytest.raises(errors.InFailedSqlTransaction):
        cursor.execute("INSERT INTO t VALUES (2, 'two')")
    cursor.execute("ROLLBACK")
    cursor.execute("RESET statement_timeout")
    assert _count(connection) == 0
