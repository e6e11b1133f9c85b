"""A CancelRequest or ``statement_timeout`` ends a stalled staged COPY (``COPY ... FROM
STDIN (FORMAT arrow|frames, WRITE_ID ...)``) as it ends an unstaged one (review R1 round 16,
2.5; ``copy_wait``): 57014 with the COPY's CONTEXT, this COPY's staged file deleted, the
connection in step; on the ``FORMAT frames`` path whose staging thread reads the socket
itself (``copy_staged._SocketCopy``) too, also when it stopped inside a CopyData message.
And an extended-protocol COPY's ErrorResponse goes out when the COPY fails, not at the
client's Sync (review R1 round 16, 2.3; PostgreSQL flushes every error at once)."""

from __future__ import annotations

import glob
import os
import struct
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import errors

from engine.bulk_write import WRITES_DIRECTORY
from sql.pgwire.connection import copy_staged
from sql.pgwire.server import ServerThread
from tests.pgwire.rawclient import RawClient, cancel_request, error_fields, query
from tests.pgwire.test_copy_frames import frame, wire
from tests.pgwire.test_copy_staged import arrow_stream, messages


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    running = ServerThread(str(Path(tmp_path_factory.mktemp("staged_cancel")) / "data"),
                           "127.0.0.1", 0)  # fmt: skip
    with _connect(running) as setup:
        setup.execute("CREATE TOPIC events WITH (min_active_partitions = 2)")
    yield running
    running.stop()


def _connect(server: ServerThread) -> psycopg.Connection:
    return psycopg.connect(host="127.0.0.1", port=server.port, user="tester",
                           dbname="topicbase", connect_timeout=10, autocommit=True)  # fmt: skip


def _staged(server: ServerThread, write_id: str) -> list[str]:
    directory = os.path.join(server.database.path, WRITES_DIRECTORY, write_id)
    return sorted(p for p in glob.glob(os.path.join(directory, "*.*"))
                  if not p.endswith("write.json"))  # fmt: skip


def _wait_until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 20
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert condition()


def _message(kind: bytes, body: bytes = b"") -> bytes:
    return kind + struct.pack("!i", len(body) + 4) + body


def _raw(server: ServerThread) -> tuple[RawClient, int, int]:
    client = RawClient(server.port)
    return client, *client.start_with_keys()


@pytest.fixture
def waiting_inside() -> Iterator[threading.Event]:
    """Set once a ``FORMAT frames`` staging thread waits for the client inside a CopyData
    message (``_SocketCopy._recv_into`` with payload bytes of the message still to come)."""
    inside = threading.Event()
    real = copy_staged._SocketCopy._recv_into

    def spy(self: copy_staged._SocketCopy, target: memoryview) -> int:
        if self._left:
            inside.set()
        return real(self, target)

    copy_staged._SocketCopy._recv_into = spy  # type: ignore[method-assign]
    yield inside
    copy_staged._SocketCopy._recv_into = real  # type: ignore[method-assign]


def test_a_cancel_inside_a_frames_message_fails_the_copy_once_the_message_is_in(
        server: ServerThread, waiting_inside: threading.Event) -> None:  # fmt: skip
    client, process_id, secret_key = _raw(server)
    client.send(query("COPY TOPIC events FROM STDIN (FORMAT frames, WRITE_ID 'c-1')"))
    assert client.read()[0] == b"G"  # type: ignore[index]
    message = _message(b"d", frame(0, wire([b"a" * 100] * 50)))
    client.send(_message(b"d", frame(1, wire([b"whole"]))) + message[: len(message) // 2])
    assert waiting_inside.wait(20)
    cancel_request(server.port, process_id, secret_key)
    _wait_until(lambda: not _staged(server, "c-1"))  # let go while the client sends nothing
    client.send(message[len(message) // 2 :] + _message(b"d", b"ignored") + _message(b"c"))
    got = client.until_ready()
    assert [kind for kind, _ in got] == [b"E", b"Z"], got
    fields = error_fields(got[0][1])
    assert (fields["C"], fields["W"]) == ("57014", "COPY events"), fields
    assert "user request" in fields["M"]
    client.send(query("SELECT 1"))  # in step: the next message is read as one
    assert [kind for kind, _ in client.until_ready()] == [b"T", b"D", b"C", b"Z"]
    client.close()
    assert not _staged(server, "c-1")


def test_statement_timeout_ends_a_frames_copy_stalled_between_messages(
        server: ServerThread) -> None:  # fmt: skip
    client, _, _ = _raw(server)
    client.send(query("SET statement_timeout = '300ms'"))
    client.until_ready()
    started = time.monotonic()
    client.send(query("COPY TOPIC events FROM STDIN (FORMAT frames, WRITE_ID 'c-2')"))
    assert client.read()[0] == b"G"  # type: ignore[index]
    client.send(_message(b"d", frame(0, wire([b"one", b"two"]))))
    got = client.until_ready()  # without anything more from the client
    assert time.monotonic() - started >= 0.3
    assert [kind for kind, _ in got] == [b"E", b"Z"], got
    assert "statement timeout" in error_fields(got[0][1])["M"]
    assert not _staged(server, "c-2")
    client.send(_message(b"c") + query("RESET statement_timeout") + query("SELECT 2"))
    client.until_ready()
    assert [kind for kind, _ in client.until_ready()] == [b"T", b"D", b"C", b"Z"]
    client.close()


def test_a_cancel_ends_a_stalled_arrow_copy_and_deletes_its_staged_file(
        server: ServerThread) -> None:  # fmt: skip
    connection = _connect(server)
    stream = arrow_stream(messages(4000), max_chunksize=500)
    with (pytest.raises(errors.QueryCanceled, match="due to user request"),  # 57014
          connection.cursor().copy(
              "COPY TOPIC events FROM STDIN (FORMAT arrow, WRITE_ID 'c-3')") as copy):  # fmt: skip
        copy.write(stream[: len(stream) // 2])
        copy.connection.pgconn.flush()
        _wait_until(lambda: bool(_staged(server, "c-3")))  # staging began
        threading.Thread(target=connection.cancel_safe).start()
        _wait_until(lambda: not _staged(server, "c-3"))  # let go while the client waits
        copy.write(stream[len(stream) // 2 :])  # ignored: the COPY ended
    assert connection.execute("SELECT 3").fetchone() == (3,)
    assert connection.execute(
        "SELECT count(*) FROM TOPIC events").fetchone() == (0,)  # fmt: skip
    connection.close()


def test_an_extended_protocol_copy_sends_its_error_before_the_sync(
        server: ServerThread) -> None:  # fmt: skip
    client, process_id, secret_key = _raw(server)
    text = b"COPY TOPIC events FROM STDIN (FORMAT frames, WRITE_ID 'c-4')\0"
    client.send(_message(b"P", b"\0" + text + b"\0\0") + _message(b"B", b"\0\0" + b"\0" * 6)
                + _message(b"E", b"\0" + b"\0" * 4) + _message(b"H"))  # fmt: skip
    assert [client.read()[0] for _ in range(3)] == [b"1", b"2", b"G"]  # type: ignore[index]
    client.send(_message(b"d", frame(0, wire([b"x"]))))
    _wait_until(lambda: bool(_staged(server, "c-4")))
    cancel_request(server.port, process_id, secret_key)
    kind, body = client.read()  # type: ignore[misc]
    fields = error_fields(body)  # before any Sync was sent; CONTEXT as in the simple protocol
    assert (kind, fields["C"], fields["W"]) == (b"E", "57014", "COPY events"), fields
    client.send(_message(b"S"))
    assert [kind for kind, _ in client.until_ready()] == [b"Z"]
    assert not _staged(server, "c-4")
    client.close()


def test_a_cancel_while_a_refused_frame_s_message_is_skipped_keeps_the_connection_in_step(
        server: ServerThread, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """A frame refused inside a CopyData message whose rest has not come: the staging
    thread skips to the message's end, and a cancel cuts that skip short. The rest of the
    message must still be skipped before the refusal goes out, never read as messages
    (review R1 round 17, F6: a writer's row bytes holding a Query ran as SQL)."""
    client, process_id, secret_key = _raw(server)
    client.send(query("COPY TOPIC events FROM STDIN (FORMAT frames, WRITE_ID 'c-5')"))
    assert client.read()[0] == b"G"  # type: ignore[index]
    bad = frame(0, wire([b"x" * 100]), crc=123)
    smuggled = query("SELECT 'smuggled'")
    message = _message(b"d", bad + smuggled)
    skipping = threading.Event()
    real_skip = copy_staged._SocketCopy.skip_to_message_end

    def spy(self: copy_staged._SocketCopy) -> None:
        skipping.set()
        real_skip(self)

    monkeypatch.setattr(copy_staged._SocketCopy, "skip_to_message_end", spy)
    client.send(message[: 5 + len(bad)])  # the refused frame in, the rest of its message not
    assert skipping.wait(20)  # refused: the thread skips to the message's end
    cancel_request(server.port, process_id, secret_key)
    time.sleep(0.2)  # the stop reaches the skipping thread
    client.send(message[5 + len(bad) :] + _message(b"c") + query("SELECT 7"))
    got = client.until_ready()
    assert [kind for kind, _ in got] == [b"E", b"Z"], got
    assert error_fields(got[0][1])["C"] == "22P04"  # the first error, as PostgreSQL reports
    got = client.until_ready()  # the next message read is the SELECT 7, nothing smuggled
    assert [body for kind, body in got if kind == b"D"] == [struct.pack("!hi", 1, 1) + b"7"]
    client.close()
