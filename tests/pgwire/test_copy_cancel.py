"""A CancelRequest or ``statement_timeout`` ends a stalled ``COPY ... FROM STDIN`` (review
R1-9, ``sql.pgwire.connection.copy_wait``): 57014, nothing of the COPY written, the
transaction as PostgreSQL leaves it (failed in a block, nothing begun in autocommit), the
connection usable, and the COPY's bytes given back to the server's memory budget at once,
while the client still sends nothing.

PostgreSQL 15, checked with the same psycopg steps: the same 57014 and the same states
once the client goes on; its backend meanwhile waits in ``ClientRead`` (it fails the COPY
when data comes), where this server ends the COPY at once."""

from __future__ import annotations

import asyncio
import struct
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pyarrow as pa
import pytest
from psycopg import errors

from sql.pgwire.codec import messages as m
from sql.pgwire.connection import copy_exchange
from sql.pgwire.limits import ServerLimits
from sql.pgwire.server import ServerThread
from tests.pgwire.rawclient import RawClient, cancel_request, error_fields, query

FLOOR_BYTES = 64 * 1024
SENT_BYTES = 256 * 1024  # past the floor: the COPY holds bytes in the server's budget


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    """One server for the module: each test has a table of its own, and the budget is
    back to 0 after each (what every test checks)."""
    limits = ServerLimits(held_bytes_max=16 * 1024 * 1024, held_bytes_floor=FLOOR_BYTES)
    running = ServerThread(str(Path(tmp_path_factory.mktemp("copy_cancel")) / "data"),
                           "127.0.0.1", 0, limits)  # fmt: skip
    yield running
    running.stop()


def _connect(server: ServerThread, autocommit: bool) -> psycopg.Connection:
    return psycopg.connect(host="127.0.0.1", port=server.port, user="tester",
                           dbname="topicbase", connect_timeout=10,
                           autocommit=autocommit)  # fmt: skip


def _held(server: ServerThread) -> int:
    return server.server.memory_budget.held_bytes


def _wait_until(condition: Callable[[], bool]) -> None:
    """``condition()`` once the server got there (it runs on its own threads)."""
    deadline = time.monotonic() + 20
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert condition()


def _lines(count_bytes: int) -> bytes:
    line = b"7\t" + b"x" * 1021 + b"\n"
    return line * (count_bytes // len(line))


def _stall_in_copy(server: ServerThread, copy: psycopg.Copy) -> None:
    """Send part of the COPY's data, then nothing: the server holds it (in its budget)."""
    copy.write(_lines(SENT_BYTES))
    copy.connection.pgconn.flush()
    _wait_until(lambda: _held(server) > 0)


def _count(server: ServerThread, table: str) -> int:
    with _connect(server, autocommit=True) as other:
        row = other.execute(f"SELECT count(*) FROM {table}").fetchone()
    assert row is not None
    return int(row[0])


def test_a_cancel_request_ends_a_stalled_copy_and_fails_its_transaction(
    server: ServerThread,
) -> None:
    with _connect(server, autocommit=True) as setup:
        setup.execute("CREATE TABLE in_block (n INTEGER, s VARCHAR)")
    connection = _connect(server, autocommit=False)
    cursor = connection.cursor()
    cursor.execute("INSERT INTO in_block VALUES (0, 'before the COPY')")
    with (pytest.raises(errors.QueryCanceled, match="due to user request"),  # 57014
          cursor.copy("COPY in_block FROM STDIN") as copy):  # fmt: skip
        _stall_in_copy(server, copy)
        # cancel_safe: the blocking cancel() holds the GIL, and this server runs here.
        threading.Thread(target=connection.cancel_safe).start()
        _wait_until(lambda: _held(server) == 0)  # ended while the client sent nothing
        copy.write(_lines(4096))  # ignored: the COPY ended
    assert connection.info.transaction_status is psycopg.pq.TransactionStatus.INERROR
    with pytest.raises(errors.InFailedSqlTransaction):
        connection.execute("SELECT 1")
    connection.rollback()
    assert connection.execute("SELECT 2").fetchone() == (2,)
    assert _count(server, "in_block") == 0  # neither the COPY nor the INSERT before it
    connection.close()


def test_statement_timeout_ends_a_stalled_copy_in_autocommit(server: ServerThread) -> None:
    connection = _connect(server, autocommit=True)
    connection.execute("CREATE TABLE autocommitted (n INTEGER, s VARCHAR)")
    connection.execute("SET statement_timeout = '300ms'")
    started = time.monotonic()
    with (pytest.raises(errors.QueryCanceled, match="due to statement timeout"),  # 57014
          connection.cursor().copy("COPY autocommitted FROM STDIN") as copy):  # fmt: skip
        _stall_in_copy(server, copy)
        _wait_until(lambda: _held(server) == 0)
    assert time.monotonic() - started >= 0.3
    assert connection.info.transaction_status is psycopg.pq.TransactionStatus.IDLE
    connection.execute("RESET statement_timeout")
    assert connection.execute("SELECT 3").fetchone() == (3,)
    assert _count(server, "autocommitted") == 0
    with connection.cursor().copy("COPY autocommitted FROM STDIN") as copy:  # usable
        copy.write(_lines(4096))
    assert _count(server, "autocommitted") == 4
    connection.close()


def test_a_cancel_inside_a_message_fails_the_copy_once_the_message_is_in(
    server: ServerThread,
) -> None:
    """A COPY cancelled while a CopyData message is only partly in: the COPY's data and the
    bytes held while it arrived go back at once, the rest is read and dropped when it comes,
    then 57014, and the connection goes on in step (PostgreSQL reads a message whole
    before it checks for the cancel; review R1 round 16, 2.1)."""
    with _connect(server, autocommit=True) as setup:
        setup.execute("CREATE TABLE torn (n INTEGER, s VARCHAR)")
    client = RawClient(server.port)
    keys = [body for kind, body in client.start() if kind == b"K"]
    process_id, secret_key = struct.unpack("!ii", keys[0])
    client.send(query("COPY torn FROM STDIN"))
    assert client.read()[0] == b"G"  # type: ignore[index]
    client.send(m.copy_data(_lines(SENT_BYTES)))  # a whole message: the COPY's data
    _wait_until(lambda: _held(server) == SENT_BYTES - FLOOR_BYTES)
    message = m.copy_data(_lines(SENT_BYTES))
    client.send(message[: len(message) // 2])
    _wait_until(lambda: _held(server) > SENT_BYTES - FLOOR_BYTES)  # held while it arrives
    cancel_request(server.port, process_id, secret_key)
    # the COPY's data and the arriving message's hold given back before the rest comes
    _wait_until(lambda: _held(server) == 0)
    client.send(message[len(message) // 2 :] + m.copy_done())
    got = client.until_ready()
    assert [kind for kind, _ in got] == [b"E", b"Z"], got
    fields = error_fields(got[0][1])
    assert (fields["S"], fields["C"]) == ("ERROR", "57014"), fields
    # the line it was reading when cancelled (256 whole lines came before), as PostgreSQL
    assert fields["W"] == f"COPY torn, line {SENT_BYTES // 1024 + 1}", fields
    client.send(query("SELECT count(*) FROM torn"))  # in step: the next message is read
    assert [kind for kind, _ in client.until_ready()] == [b"T", b"D", b"C", b"Z"]
    client.close()
    assert _count(server, "torn") == 0


def test_a_cancel_while_the_copy_is_set_up_fails_it_before_copy_in(
    server: ServerThread, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cancel that comes after the COPY's Query but before its CopyInResponse (its
    DESCRIBE clears the session's cancel flag) is not lost: 57014 instead of CopyInResponse,
    the connection goes on (review R1 round 16, 2.2)."""
    with _connect(server, autocommit=True) as setup:
        setup.execute("CREATE TABLE early (n INTEGER, s VARCHAR)")
    real = copy_exchange._target
    setting_up = threading.Event()

    async def slow_target(context: object, statement: object) -> object:
        setting_up.set()
        await asyncio.sleep(0.3)  # the cancel lands here
        return await real(context, statement)  # type: ignore[arg-type]

    monkeypatch.setattr(copy_exchange, "_target", slow_target)
    client = RawClient(server.port)
    keys = [body for kind, body in client.start() if kind == b"K"]
    process_id, secret_key = struct.unpack("!ii", keys[0])
    client.send(query("COPY early FROM STDIN"))
    assert setting_up.wait(10)
    cancel_request(server.port, process_id, secret_key)
    got = client.until_ready()
    assert [kind for kind, _ in got] == [b"E", b"Z"], got
    assert error_fields(got[0][1])["C"] == "57014"
    monkeypatch.setattr(copy_exchange, "_target", real)
    client.send(query("SELECT 1"))
    assert [kind for kind, _ in client.until_ready()] == [b"T", b"D", b"C", b"Z"]
    client.close()
    assert _count(server, "early") == 0


def _slow_in_duckdb(session: object) -> None:
    copy_exchange.run_over_relation(  # ~minutes of DuckDB work unless interrupted
        session, pa.table({"x": [1]}),  # type: ignore[arg-type]
        ["SELECT count(*) FROM range(100000000000) AS r(i), {relation}"])  # fmt: skip


def _slow_in_python(session: object) -> None:
    time.sleep(0.8)  # as building a large COPY's Arrow table, before any statement


@pytest.mark.parametrize("slow", [_slow_in_duckdb, _slow_in_python])
def test_statement_timeout_covers_the_insert_after_copy_done(
    server: ServerThread, monkeypatch: pytest.MonkeyPatch, slow: Callable[[object], None]
) -> None:
    """The COPY's time runs to the end of its insert: an insert still running at the
    deadline fails with 57014 and writes nothing, as PostgreSQL's timeout covers the whole
    COPY statement: interrupted in DuckDB, or refused before its next statement when the
    deadline passed in Python (every statement clears the session's cancel flag: review R1
    round 17, F1). The data itself arrives at once; ``slow`` stands for a slow insert."""
    real_write = copy_exchange._write

    def slow_write(session: object, *rest: object) -> None:
        slow(session)
        real_write(session, *rest)  # type: ignore[arg-type]

    monkeypatch.setattr(copy_exchange, "_write", slow_write)
    connection = _connect(server, autocommit=True)
    table = f"slow_insert_{slow.__name__.strip('_')}"
    connection.execute(f"CREATE TABLE {table} (n INTEGER, s VARCHAR)")
    connection.execute("SET statement_timeout = '400ms'")
    started = time.monotonic()
    with (pytest.raises(errors.QueryCanceled, match="due to statement timeout"),  # 57014
          connection.cursor().copy(f"COPY {table} FROM STDIN") as copy):  # fmt: skip
        copy.write(_lines(4096))
    assert 0.4 <= time.monotonic() - started < 20
    monkeypatch.setattr(copy_exchange, "_write", real_write)
    connection.execute("RESET statement_timeout")
    assert _count(server, table) == 0
    connection.close()


def test_a_cancel_request_between_the_insert_s_statements_is_not_lost(
    server: ServerThread, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A CancelRequest that comes after CopyDone while the insert is in Python (between
    DuckDB statements, where interrupting the idle cursor does nothing and the next
    statement clears the session's flag) still fails the COPY: 57014, nothing written
    (review R1 round 17, F9)."""
    real_write = copy_exchange._write
    in_python = threading.Event()

    def slow_write(session: object, *rest: object) -> None:
        in_python.set()
        time.sleep(0.8)  # the cancel lands here
        real_write(session, *rest)  # type: ignore[arg-type]

    monkeypatch.setattr(copy_exchange, "_write", slow_write)
    connection = _connect(server, autocommit=True)
    connection.execute("CREATE TABLE cancelled_insert (n INTEGER, s VARCHAR)")

    def cancel_when_inserting() -> None:
        assert in_python.wait(20)
        connection.cancel_safe()

    canceller = threading.Thread(target=cancel_when_inserting)
    canceller.start()
    with (pytest.raises(errors.QueryCanceled, match="due to user request"),  # 57014
          connection.cursor().copy("COPY cancelled_insert FROM STDIN") as copy):  # fmt: skip
        copy.write(_lines(4096))
    canceller.join(20)
    monkeypatch.setattr(copy_exchange, "_write", real_write)
    assert _count(server, "cancelled_insert") == 0
    connection.close()
