"""A logged-in plaintext connection runs on a thread of its own (``connection.own_thread``).

Its message loop and its engine calls share that thread (no hand-off per statement), the
bytes a client sent right behind its startup packet are not lost in the move, a slow
statement holds up only its own connection, and the server's stop closes it.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from sql.pgwire.connection import own_thread
from sql.pgwire.connection.connection import OWN_THREAD_STOP_S, Connection
from sql.pgwire.server import ServerThread
from tests.pgwire.rawclient import RawClient, query, startup_packet


def test_statements_run_on_the_connections_own_loop_thread(server, connect, monkeypatch) -> None:
    seen: list[tuple[threading.Thread, asyncio.AbstractEventLoop | None]] = []
    original = Connection.call

    async def recording(self: Connection, function: Any, *arguments: Any) -> Any:
        def run(*given: Any) -> Any:
            seen.append((threading.current_thread(), asyncio._get_running_loop()))
            return function(*given)

        return await original(self, run, *arguments)

    first, second = connect(autocommit=True), connect(autocommit=True)
    monkeypatch.setattr(Connection, "call", recording)
    for conn in (first, second, first):
        del seen[:]
        assert conn.execute("SELECT 1").fetchone() == (1,)
        conn.seen = list(seen)  # type: ignore[attr-defined]
    assert first.seen and second.seen  # type: ignore[attr-defined]
    assert first.seen[0][0] is not second.seen[0][0]  # type: ignore[attr-defined]
    seen = first.seen + second.seen  # type: ignore[attr-defined]
    for thread, loop in seen:
        assert thread is not server.thread  # not the server's event loop thread
        assert loop is not None and loop is not server.loop  # inline, on its own loop


def test_bytes_sent_behind_the_startup_packet_survive_the_move(server) -> None:
    client = RawClient(server.port)
    try:
        client.send(startup_packet() + query("SELECT 41 + 1"))  # one write, before any answer
        client.until_ready()  # the login's ReadyForQuery
        answer = client.until_ready()
        rows = [body for kind, body in answer if kind == b"D"]
        assert len(rows) == 1 and rows[0].endswith(b"42")
    finally:
        client.close()


def test_a_slow_statement_holds_up_only_its_connection(connect) -> None:
    slow, quick = connect(autocommit=True), connect(autocommit=True)
    finished = threading.Event()

    def run_slow() -> None:
        slow.execute("SELECT sum(a.range * b.range) FROM range(100000) a, range(5000) b")
        finished.set()

    worker = threading.Thread(target=run_slow)
    worker.start()
    try:
        time.sleep(0.2)  # the slow one is running
        assert quick.execute("SELECT 2").fetchone() == (2,)
        assert not finished.is_set(), "the slow statement was too quick to show anything"
    finally:
        worker.join(timeout=60)


def test_stop_closes_connections_on_their_own_threads(tmp_path) -> None:
    running = ServerThread(str(tmp_path / "data"), "127.0.0.1", 0)
    client = RawClient(running.port)
    try:
        client.start()
        (connection,) = running.server.connections.values()
        deadline = time.monotonic() + 10
        while connection.own_thread is None and time.monotonic() < deadline:
            time.sleep(0.01)  # it moves right after the login's ReadyForQuery
        assert connection.own_thread is not None
        started = time.monotonic()
        running.stop()
        assert time.monotonic() - started < OWN_THREAD_STOP_S
        assert client.read_all() == []  # closed, nothing more
        assert connection.own_thread.done.done()
        assert running.server.admission.sessions == 0  # its slot was given back
    finally:
        client.close()


def test_tls_state_keeps_a_connection_on_the_servers_loop() -> None:
    class Writer:
        def __init__(self, extra: dict[str, Any]) -> None:
            self.extra = extra

        def get_extra_info(self, name: str) -> Any:
            return self.extra.get(name)

    assert not own_thread.movable(Writer({"ssl_object": object(), "socket": None}))  # type: ignore[arg-type]


def test_a_socket_with_unsent_output_stays() -> None:
    import socket

    async def main() -> tuple[bool, bool]:
        left, right = socket.socketpair()
        _reader, writer = await own_thread.attach(left, b"")
        empty = own_thread.movable(writer)
        writer.transport.pause_reading()
        writer.write(b"x" * 50_000_000)  # more than the socket takes: the rest is held
        held = own_thread.movable(writer)
        writer.transport.abort()
        right.close()
        return empty, held

    assert asyncio.run(main()) == (True, False)


@pytest.mark.parametrize("pending", [b"", b"Q\0\0\0\x0dSELECT 1\0"])
def test_attach_reads_pending_bytes_first(pending: bytes) -> None:
    import socket

    async def main() -> bytes:
        left, right = socket.socketpair()
        reader, writer = await own_thread.attach(left, pending)
        right.sendall(b"after")
        data = await reader.readexactly(len(pending) + 5)
        writer.close()
        right.close()
        return data

    assert asyncio.run(main()) == pending + b"after"


def _own_connection(server: ServerThread) -> Connection:
    (connection,) = server.server.connections.values()
    deadline = time.monotonic() + 10
    while connection.direct is None and time.monotonic() < deadline:
        time.sleep(0.01)  # it moves right after the login's ReadyForQuery
    assert connection.own_thread is not None and connection.direct is not None
    return connection


def test_statements_are_read_without_turns_of_the_loop(server, connect) -> None:
    conn = connect(autocommit=True)
    connection = _own_connection(server)
    loop = connection.own_thread._loop  # type: ignore[union-attr]
    assert loop is not None
    selector = loop._selector  # type: ignore[attr-defined]
    polls: list[float | None] = []
    original = selector.select

    def counting(timeout: float | None = None) -> Any:
        polls.append(timeout)
        return original(timeout)

    selector.select = counting
    for value in range(50):
        assert conn.execute("SELECT %s::INTEGER", [value]).fetchone() == (value,)
    assert conn.execute("SELECT 1").fetchone() == (1,)
    # Through the loop, every statement polled at least once (waiting for the client).
    assert len(polls) < 5, polls


def test_a_call_for_the_loop_wakes_a_connection_waiting_for_its_client(server, connect) -> None:
    conn = connect(autocommit=True)
    assert conn.execute("SELECT 1").fetchone() == (1,)
    connection = _own_connection(server)
    time.sleep(0.1)  # idle: its thread waits for the client's next bytes
    ran = threading.Event()
    connection.own_thread.call_soon(ran.set)  # type: ignore[union-attr]
    assert ran.wait(5), "the queued call waited for the client"
    assert conn.execute("SELECT 2").fetchone() == (2,)  # and the connection goes on
