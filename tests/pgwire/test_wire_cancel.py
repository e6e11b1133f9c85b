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

import asyncio
import itertools
import struct
import time
from collections.abc import Callable, Iterator

import psycopg
import pytest
from psycopg import errors

from engine import streams
from engine.session import Session
from sql.pgwire.codec import messages as m
from sql.pgwire.connection import commands as wire_commands
from sql.pgwire.connection import connection as wire_connection
from sql.pgwire.connection import extended as wire_extended
from sql.pgwire.connection import insert_flight
from sql.pgwire.server import ServerThread
from tests.pgwire.rawclient import RawClient, bind, cancel_request, parse, query, sync
from tests.pgwire.rawclient import errors as errors_of

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


def _until(client: RawClient, kind: bytes) -> list[tuple[bytes, bytes]]:
    got = []
    while True:
        item = client.read()
        assert item is not None, f"connection closed after {got}"
        got.append(item)
        if item[0] == kind:
            return got


def test_a_cancel_while_a_flight_waits_for_its_client_is_dropped(server: ServerThread) -> None:
    """Parse, Bind, Execute, Flush: the flight is answered and the server waits for the
    client's next message, inside the flight (no Sync yet). A cancel then finds nothing
    running: PostgreSQL ignores it (it reads a command), so the flight's next Execute
    runs. Before, the cancel was kept for the flight and ended that Execute (57014)."""
    client = RawClient(server.port)
    process_id, secret_key = client.start_with_keys()
    client.send(query("CREATE TABLE t (a INTEGER)"))
    assert not errors_of(client.until_ready())
    execute = m.message(b"E", m.cstr("") + struct.pack("!i", 0))
    flush = m.message(b"H", b"")
    client.send(parse("s", "INSERT INTO t VALUES (1)") + bind("s") + execute + flush)
    first = _until(client, b"C")  # answered at the Flush; no ReadyForQuery (no Sync)
    assert [kind for kind, _ in first] == [b"1", b"2", b"C"], first
    session = server.server.connections[process_id].session
    assert session is not None
    deadline = time.monotonic() + 20
    while not session._waiting_on_client:  # the server is back in its read of the client
        assert time.monotonic() < deadline, "the server never waited for the client"
        time.sleep(0.01)
    cancel_request(server.port, process_id, secret_key)
    client.send(bind("s") + execute + sync())
    second = client.until_ready()
    assert not errors_of(second), errors_of(second)
    assert [kind for kind, _ in second] == [b"2", b"C", b"Z"], second
    client.send(query("SELECT count(*) FROM t"))
    rows = [body for kind, body in client.until_ready() if kind == b"D"]
    assert rows and rows[0].endswith(b"2"), rows
    client.close()


@pytest.mark.parametrize("protocol", ["simple", "extended"])
def test_a_streamed_reads_timer_gets_what_is_left(
    connect: Connect, wire_work: WireWork, monkeypatch: pytest.MonkeyPatch, protocol: str
) -> None:
    """A query streams its rows under two timers: the front's (planning and the door) and
    the read's. The read's gets what is left of ``statement_timeout`` after the wire's work
    and the planning, not a whole timeout of its own (before: 0.6 s of wire work and a
    2 s timeout gave the read another 2 s, 2.6 s in all)."""
    given: list[float] = []
    real = streams.Deadline

    def recording(seconds: float, cancel: Callable[[], None]) -> streams.Deadline:
        given.append(seconds)
        return real(seconds, cancel)

    monkeypatch.setattr(streams, "Deadline", recording)
    connection = connect(autocommit=True)
    connection.execute("CREATE TABLE t (a INTEGER, b VARCHAR)")
    connection.execute("INSERT INTO t VALUES (1, 'one')")
    connection.execute("SET statement_timeout = '2s'")
    given.clear()
    mark = wire_work.arm(lambda: time.sleep(0.6))
    rows = _cursor(connection, protocol).execute(f"SELECT a, b FROM t {mark}").fetchall()
    assert rows == [(1, "one")]
    assert wire_work.ran == 1
    assert len(given) == 2, given  # the front's timer, then the read's
    front, read = given
    assert front <= 1.45, given  # the arrival's share of 2 s, as round 28 made it
    assert read <= front, given  # what is left: never more than the front had


RANGE_READ = ('COPY (SELECT data FROM TOPIC events WHERE partition = 0 AND "offset" >= 0 '
              'AND "offset" < 1) TO STDOUT (FORMAT arrow)')


def _armed_copy(monkeypatch: pytest.MonkeyPatch, connection: psycopg.Connection,
                why: str) -> list[bool]:  # fmt: skip
    """The wire's work on a COPY's message stood in for at ``commands._run_copy`` (awaited,
    so the server's loop takes the CancelRequest meanwhile), once: 0.6 s, or a cancel."""
    run_copy = wire_commands._run_copy
    armed = [True]

    async def working(context: object, text: str) -> None:
        if armed[0]:
            armed[0] = False
            if why == "timeout":
                await asyncio.sleep(0.6)
            else:
                await asyncio.get_running_loop().run_in_executor(None, connection.cancel_safe)
        await run_copy(context, text)

    monkeypatch.setattr(wire_commands, "_run_copy", working)
    return armed


@pytest.mark.parametrize("why", ["cancel", "timeout"])
def test_a_copy_range_read_counts_the_wires_work(
    connect: Connect, monkeypatch: pytest.MonkeyPatch, why: str
) -> None:
    """A topic range read by COPY ... (FORMAT arrow) (``copy_arrow``) likewise: the cancel
    of its message ends it (before, ``begin_front_read`` cleared the flag) and its timeout
    counts from the arrival (before, from the read's own start)."""
    connection = connect(autocommit=True)
    connection.execute("CREATE TOPIC events")
    connection.execute("INSERT INTO TOPIC events (data) VALUES ('x')")
    if why == "timeout":
        connection.execute("SET statement_timeout = '300ms'")
    armed = _armed_copy(monkeypatch, connection, why)
    match = "statement timeout" if why == "timeout" else "user request"
    with (pytest.raises(errors.QueryCanceled, match=match),
          connection.cursor().copy(RANGE_READ) as copy):  # fmt: skip
        list(copy)
    assert not armed[0]
    connection.execute("RESET statement_timeout")
    with connection.cursor().copy(RANGE_READ) as copy:
        assert b"".join(bytes(block) for block in copy)  # the next read runs


@pytest.mark.parametrize("why", ["cancel", "timeout"])
def test_a_copy_from_stdin_counts_the_wires_work(
    connect: Connect, monkeypatch: pytest.MonkeyPatch, why: str
) -> None:
    """A COPY FROM STDIN is a statement of its message too: a cancel that comes while the
    wire handles the COPY's message, before the COPY starts, ends it before CopyInResponse
    (before, the COPY's start cleared the flag), and its ``statement_timeout`` counts from
    the arrival (before, from the COPY's own start). Nothing is written; the next COPY
    runs."""
    connection = connect(autocommit=True)
    connection.execute("CREATE TABLE t (a INTEGER, b VARCHAR)")
    if why == "timeout":
        connection.execute("SET statement_timeout = '300ms'")
    armed = _armed_copy(monkeypatch, connection, why)
    match = "statement timeout" if why == "timeout" else "user request"
    cursor = connection.cursor()
    with (pytest.raises(errors.QueryCanceled, match=match),
          cursor.copy("COPY t FROM STDIN") as copy):  # fmt: skip
        copy.write_row((1, "one"))
    assert not armed[0]
    connection.execute("RESET statement_timeout")
    assert _count(connection) == 0
    with cursor.copy("COPY t FROM STDIN") as copy:
        copy.write_row((2, "two"))
    assert _count(connection) == 1


def test_a_cancel_during_a_kept_inserts_flight_ends_it(
    connect: Connect, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A prepared INSERT INTO TOPIC run by the engine's kept way (``Session.append_prepared``,
    round 29) still ends with 57014 when a cancel came during the wire's work on its flight:
    the kept way leaves such a statement to the ordinary path, whose start keeps the cancel.
    The cancel is sent from inside the flight's take (``insert_flight.hold_and_take``)."""
    connection = connect(autocommit=True)
    connection.execute("CREATE TOPIC t")
    cursor = connection.cursor()
    insert = "INSERT INTO TOPIC t (data) VALUES (%s)"
    ran: list[bool] = []
    kept_way = Session.append_prepared

    def recorded(session: Session, statement: object, parameters: object) -> object:
        result = kept_way(session, statement, parameters)
        ran.append(result is not None)
        return result

    monkeypatch.setattr(Session, "append_prepared", recorded)
    for _ in range(3):
        cursor.execute(insert, [b"before"], prepare=True)
    assert ran[-1], ran  # the kept way ran the prepared INSERT
    take = insert_flight.hold_and_take
    armed = [True]

    def cancelled(*args: object) -> bool:
        if armed[0]:
            armed[0] = False
            connection.cancel_safe()
        return take(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(insert_flight, "hold_and_take", cancelled)
    with pytest.raises(errors.QueryCanceled, match="user request"):
        cursor.execute(insert, [b"cancelled"], prepare=True)
    assert not armed[0]
    cursor.execute(insert, [b"after"], prepare=True)
    rows = connection.execute("SELECT data FROM TOPIC t").fetchall()
    assert sorted(bytes(row[0]) for row in rows) == [b"after", b"before", b"before", b"before"]
