"""A connection's resources stay bounded whatever its client does (``connection.connection``).

A client that sends and never reads holds the server's memory to a bound (Bind/Execute
flights without Sync wait for it to read), and does not hold up the server's stop; a
connection whose own thread cannot be had (no file descriptor left for its wake-up fd, no
thread) is served on the server's loop or closed, never left holding its session slot; and
an idle timeout is not dodged by a client trickling a message byte by byte.
"""

from __future__ import annotations

import errno
import os
import select
import socket
import struct
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sql.pgwire.codec import messages as m
from sql.pgwire.connection import own_thread
from sql.pgwire.connection.connection import OUTPUT_HELD_MAX, Connection
from sql.pgwire.connection.output import FLUSH_BYTES
from sql.pgwire.limits import ServerLimits
from sql.pgwire.server import ServerThread
from tests.pgwire.rawclient import RawClient, error_fields, errors, query

VALUE_BYTES = 300_000  # one result's one value
SYNC = m.message(b"S")


def parse(name: str, text: str) -> bytes:
    return m.message(b"P", m.cstr(name) + m.cstr(text) + struct.pack("!h", 0))


def bind_execute(statement: str) -> bytes:
    bind = m.message(b"B", m.cstr("") + m.cstr(statement) + struct.pack("!hhh", 0, 0, 0))
    return bind + m.message(b"E", m.cstr("") + struct.pack("!i", 0))


def wait_for(condition: Callable[[], object], what: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"still waiting for {what}"
        time.sleep(0.01)


def own_connection(server: ServerThread) -> Connection:
    """The server's one connection, once its socket moved to its own thread."""
    wait_for(lambda: len(server.server.connections) == 1, "the login")
    (connection,) = server.server.connections.values()
    wait_for(lambda: connection.direct is not None, "the move to its own thread")
    return connection


def output_held(connection: Connection) -> int:
    """Bytes of output the connection's writer holds (its transport's and its own)."""
    writer = connection.writer
    return writer.transport.get_write_buffer_size() + getattr(writer, "_kept_bytes", 0)


def waits_for_the_client(connection: Connection) -> bool:
    """Whether the connection's message loop waits for its client to read (a drain)."""
    return bool(connection.writer.transport.get_protocol()._drain_waiters)


def slow_reader(port: int) -> RawClient:
    client = RawClient(port)
    client.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    client.start()
    return client


@pytest.fixture
def stopping(tmp_path: Path) -> Iterator[Callable[..., ServerThread]]:
    started: list[ServerThread] = []

    def start(**options: object) -> ServerThread:
        running = ServerThread(str(tmp_path / f"data{len(started)}"), "127.0.0.1", 0,
                               **options)  # type: ignore[arg-type]  # fmt: skip
        started.append(running)
        return running

    yield start
    for running in started:
        if running.thread.is_alive():
            running.stop()


# -- a client that does not read -------------------------------------------------------------
def test_executes_without_sync_wait_for_a_client_that_does_not_read(server) -> None:
    client = RawClient(server.port)  # its kernel takes ~128 KiB while it does not read
    client.start()
    connection = own_connection(server)
    client.send(parse("s", f"SELECT repeat('x', {VALUE_BYTES}) AS v") + SYNC)
    client.until_ready()
    count = 64  # ~19 MB of results: held whole before, far over the bound
    client.send(bind_execute("s") * count)  # 24 bytes each, no Sync, nothing read
    bound = OUTPUT_HELD_MAX + FLUSH_BYTES + 2 * VALUE_BYTES
    most = 0

    def bounded_and_waiting() -> bool:
        nonlocal most
        most = max(most, output_held(connection))
        assert most <= bound, f"the server holds {most} bytes for a client that does not read"
        return waits_for_the_client(connection)

    wait_for(bounded_and_waiting, "the server to wait for the client to read")
    client.send(SYNC)
    answer = client.until_ready()  # reading now: every result comes, whole and in order
    rows = [body for kind, body in answer if kind == b"D"]
    assert len(rows) == count
    assert all(body.endswith(b"x" * VALUE_BYTES) for body in rows)
    assert [kind for kind, _ in answer].count(b"C") == count
    client.close()


def test_stop_does_not_wait_for_a_client_that_does_not_read(stopping) -> None:
    running = stopping()
    client = slow_reader(running.port)
    connection = own_connection(running)
    client.send(parse("s", f"SELECT repeat('x', {VALUE_BYTES}) AS v") + SYNC)
    client.until_ready()
    client.send(bind_execute("s") * 20 + SYNC)  # ~6 MB of results it will not read
    wait_for(lambda: waits_for_the_client(connection), "output the client does not read")
    thread = connection.own_thread
    assert thread is not None
    running.stop()
    thread._thread.join(timeout=30)
    assert not thread._thread.is_alive(), "the connection's thread outlived the server's stop"
    assert thread.done.done()
    assert running.server.admission.sessions == 0
    client.close()


# -- no thread of its own to be had ----------------------------------------------------------
def _no_descriptors(*_arguments: object, **_options: object) -> int:
    raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))


def test_a_connection_without_a_wakeup_fd_is_served_on_the_servers_loop(
        stopping, monkeypatch) -> None:  # fmt: skip
    running = stopping(limits=ServerLimits(connections_max=2, superuser_reserved_connections=0))
    monkeypatch.setattr(own_thread.os, "eventfd", _no_descriptors)
    for value in range(4):  # more clients than slots, one after the other
        client = RawClient(running.port)
        client.start()
        client.send(query(f"SELECT {value}"))
        answer = client.until_ready()
        (row,) = [body for kind, body in answer if kind == b"D"]
        assert row.endswith(str(value).encode())
        client.send(m.message(b"X"))
        assert client.read_all() == []
        client.close()
        wait_for(lambda: not running.server.connections, "the connection's end")
        assert running.server.admission.sessions == 0  # its slot was given back
    monkeypatch.undo()
    client = RawClient(running.port)
    client.start()
    assert own_connection(running).own_thread is not None  # descriptors back: it moves
    client.close()


def test_a_connection_whose_thread_does_not_start_gives_its_slot_back(
        stopping, monkeypatch) -> None:  # fmt: skip
    running = stopping(limits=ServerLimits(connections_max=1, superuser_reserved_connections=0))
    wake_fds: list[int] = []
    eventfd = os.eventfd

    def recording(*arguments: object) -> int:
        fd = eventfd(*arguments)  # type: ignore[arg-type]
        wake_fds.append(fd)
        return fd

    def no_thread(self: own_thread.OwnThread) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(own_thread.os, "eventfd", recording)
    monkeypatch.setattr(own_thread.OwnThread, "start", no_thread)
    for _ in range(3):
        client = RawClient(running.port)
        client.start()
        assert client.read_all() == []  # its socket left the loop: the connection ends
        client.close()
        wait_for(lambda: not running.server.connections, "the connection's end")
        assert running.server.admission.sessions == 0
    assert len(wake_fds) == 3
    for fd in wake_fds:  # given back (none of them reused by another file since)
        with pytest.raises(OSError):
            os.fstat(fd)
    monkeypatch.undo()
    client = RawClient(running.port)
    client.start()  # the one slot is free
    client.send(query("SELECT 7"))
    assert next(body for kind, body in client.until_ready() if kind == b"D").endswith(b"7")
    client.close()


# -- idle timeouts -----------------------------------------------------------------------------
@pytest.mark.parametrize("where", ["own thread", "server's loop"])
def test_a_trickled_message_does_not_dodge_the_idle_in_transaction_timeout(
        stopping, monkeypatch, where: str) -> None:  # fmt: skip
    running = stopping()
    if where == "server's loop":  # no wake-up fd: the connection stays on the server's loop
        monkeypatch.setattr(own_thread.os, "eventfd", _no_descriptors)
    client = RawClient(running.port)
    client.start()
    if where == "own thread":
        own_connection(running)
    client.send(query("SET idle_in_transaction_session_timeout = '1s'"))
    client.until_ready()
    client.send(query("BEGIN"))
    client.until_ready()
    message = query("SELECT 1 AS " + "a_rather_long_column_name_to_trickle_" * 2)
    sent = 0
    for byte in message:  # a byte every 0.1 s (~8 s for all): each well within 1 s
        if not client.try_send(bytes([byte])):
            break
        sent += 1
        readable, _, _ = select.select([client.sock], [], [], 0.1)
        if readable:  # the server answered before the message was whole
            break
    got = client.read()
    assert got is not None and got[0] == b"E", (sent, len(message), got)
    fields = error_fields(got[1])
    assert (fields["S"], fields["C"]) == ("FATAL", "25P03")
    assert sent < len(message)
    assert client.read_all() == []  # and the connection is closed
    client.close()


def test_a_message_in_parts_within_the_idle_timeout_is_served(server) -> None:
    client = RawClient(server.port)
    client.start()
    own_connection(server)
    client.send(query("SET idle_in_transaction_session_timeout = '30s'"))
    client.until_ready()
    client.send(query("BEGIN"))
    client.until_ready()
    message = query("SELECT 5")
    for part in (message[:3], message[3:7], message[7:]):
        client.send(part)
        time.sleep(0.05)
    answer = client.until_ready()
    assert not errors(answer)
    assert next(body for kind, body in answer if kind == b"D").endswith(b"5")
    client.close()
