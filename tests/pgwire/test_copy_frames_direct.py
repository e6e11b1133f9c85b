"""``COPY ... (FORMAT frames, WRITE_ID ...)`` read from the socket by the staging thread
(``copy_staged._SocketCopy``), with a raw client that sends what a library would not: frames
cut at any byte across CopyData messages, Flush and Sync between them, a query pipelined
right after CopyDone (the bytes read past the COPY go back to the connection), a frame
refused in the middle of a CopyData message (the rest of the COPY is ignored, the
connection reads on from a message boundary), CopyFail inside a frame, a client gone
mid-frame. TLS connections keep the transport's path.
"""

from __future__ import annotations

import errno
import glob
import itertools
import os
import struct
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from engine.bulk_write import WRITES_DIRECTORY
from sql.pgwire.connection import copy_staged
from sql.pgwire.server import ServerThread
from tests.pgwire.rawclient import RawClient, errors, query
from tests.pgwire.test_copy_frames import GOOD, frame, send, wire
from tests.pgwire.test_copy_staged import Connect, topic_rows
from tests.tls_certificates import self_signed


def _message(kind: bytes, body: bytes = b"") -> bytes:
    return kind + struct.pack("!i", len(body) + 4) + body


def _copy_data(stream: bytes, cuts: list[int]) -> list[bytes]:
    """``stream`` as CopyData messages cut at ``cuts`` (positions in the stream)."""
    bounds = [0, *cuts, len(stream)]
    return [_message(b"d", stream[a:b]) for a, b in itertools.pairwise(bounds) if b > a]


@pytest.fixture
def client(server: ServerThread, connect: Connect) -> Iterator[RawClient]:
    connect(autocommit=True).execute("CREATE TOPIC events WITH (min_active_partitions = 2)")
    raw = RawClient(server.port)
    raw.start()
    yield raw
    raw.close()


@pytest.fixture
def direct_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The sizes ``_SocketCopy.read`` was asked for (the direct path was taken)."""
    sizes: list[int] = []
    real = copy_staged._SocketCopy.read

    def spy(self: copy_staged._SocketCopy, size: int) -> memoryview:
        sizes.append(size)
        return real(self, size)

    monkeypatch.setattr(copy_staged._SocketCopy, "read", spy)
    return sizes


def _staged(server: ServerThread, write_id: str) -> list[str]:
    directory = os.path.join(server.database.path, WRITES_DIRECTORY, write_id)
    return sorted(p for p in glob.glob(os.path.join(directory, "*.*"))
                  if not p.endswith("write.json"))  # fmt: skip


def _copy(write_id: str) -> bytes:
    return query(f"COPY TOPIC events FROM STDIN (FORMAT frames, WRITE_ID '{write_id}')")


def test_frames_cut_anywhere_with_flush_and_sync_between_and_a_pipelined_query(
        client: RawClient, server: ServerThread, connect: Connect,
        direct_reads: list[int]) -> None:  # fmt: skip
    frames = [frame(0, wire([b"a0", b"a1"])), frame(1, wire([b"b0"] * 3)),
              frame(0, wire([b"a2" * 5000]))]  # fmt: skip
    stream = b"".join(frames)
    client.send(_copy("d-1"))
    assert client.read()[0] == b"G"
    cuts = [1, 5, 24, 25, len(frames[0]) - 1, len(frames[0]) + 30, len(stream) - 8]
    pieces = _copy_data(stream, cuts)
    middle = len(pieces) // 2
    client.send(b"".join([*pieces[:middle], _message(b"H"), *pieces[middle:], _message(b"S"),
                          _message(b"c"), query("SELECT 41 + 1")]))  # fmt: skip
    got = client.until_ready()
    assert (b"C", b"COPY 6\0") in got and not errors(got)
    got = client.until_ready()  # the query sent right after CopyDone
    assert [body for kind, body in got if kind == b"D"] == [struct.pack("!hi", 1, 2) + b"42"]
    assert direct_reads, "read from the socket by the staging thread"
    (path,) = _staged(server, "d-1")
    with open(path, "rb") as handle:
        assert handle.read() == stream
    db = connect(autocommit=True)
    assert db.execute("COMMIT WRITES ('d-1') SINK 'd' BATCH 0").fetchone() == ("committed", 6)
    assert [bytes(d) for _, _, d in topic_rows(db, "events")] == [
        b"a0", b"a1", b"a2" * 5000, b"b0", b"b0", b"b0"]  # fmt: skip


def test_a_frame_refused_mid_message_ignores_the_rest_of_the_copy(
        client: RawClient, server: ServerThread, direct_reads: list[int]) -> None:  # fmt: skip
    bad = frame(1, GOOD, crc=123)
    stream = frame(0, wire([b"x"])) + bad + frame(0, wire([b"after"]))
    client.send(_copy("d-2"))
    assert client.read()[0] == b"G"
    # One CopyData holds the bad frame and the next: refused in the middle of it.
    client.send(b"".join(_copy_data(stream, [len(stream) - len(bad) - 100])))
    client.send(_message(b"d", b"more bytes that are ignored") + _message(b"c"))
    got = client.until_ready()
    assert [e["C"] for e in errors(got)] == ["22P04"]
    assert direct_reads
    assert not _staged(server, "d-2")
    client.send(query("SELECT 1"))  # the connection reads on from a message boundary
    assert not errors(client.until_ready())


def test_copy_fail_inside_a_frame_is_57014(client: RawClient, server: ServerThread,
                                           direct_reads: list[int]) -> None:  # fmt: skip
    stream = frame(0, wire([b"x" * 100]))
    client.send(_copy("d-3"))
    assert client.read()[0] == b"G"
    client.send(_message(b"d", stream[:60]) + _message(b"f", b"stopped\0"))
    got = client.until_ready()
    assert [e["C"] for e in errors(got)] == ["57014"] and "stopped" in errors(got)[0]["M"]
    assert direct_reads and not _staged(server, "d-3")
    client.send(query("SELECT 1"))
    assert not errors(client.until_ready())


def test_another_message_during_the_copy_is_08p01(client: RawClient,
                                                  direct_reads: list[int]) -> None:  # fmt: skip
    client.send(_copy("d-4"))
    assert client.read()[0] == b"G"
    client.send(_message(b"d", frame(0, GOOD)[:10]) + query("SELECT 1"))
    got = client.until_ready()
    assert [e["C"] for e in errors(got)] == ["08P01"] and direct_reads


def test_a_client_gone_mid_frame_stages_nothing_and_the_server_carries_on(
        client: RawClient, server: ServerThread, connect: Connect,
        direct_reads: list[int]) -> None:  # fmt: skip
    client.send(_copy("d-5"))
    assert client.read()[0] == b"G"
    client.send(_message(b"d", frame(0, GOOD)[:50]))
    client.close()
    db = connect(autocommit=True)
    assert send(db, "d-6", frame(1, GOOD)) == 2
    assert direct_reads and not _staged(server, "d-5")
    assert db.execute("COMMIT WRITES ('d-6') SINK 'd' BATCH 0").fetchone() == ("committed", 2)


def test_over_tls_the_transport_reads_the_frames(tmp_path: Path,
                                                 direct_reads: list[int]) -> None:  # fmt: skip
    (tmp_path / "tls").mkdir()
    cert, key = self_signed(tmp_path / "tls", alt_names=None)
    running = ServerThread(str(tmp_path / "data"), "127.0.0.1", 0, auth="trust",
                           tls_cert=cert, tls_key=key)  # fmt: skip
    try:
        with psycopg.connect(host="127.0.0.1", port=running.port, user="tester",
                             dbname="topicbase", sslmode="require",
                             autocommit=True) as db:  # fmt: skip
            db.execute("CREATE TOPIC events WITH (min_active_partitions = 2)")
            assert send(db, "t-1", frame(0, wire([b"a", b"b"])) + frame(1, GOOD)) == 4
            assert db.execute("COMMIT WRITES ('t-1') SINK 't' BATCH 0").fetchone() == (
                "committed", 4)  # fmt: skip
            assert len(topic_rows(db, "events")) == 4
        assert not direct_reads, "TLS state lives in the transport"
    finally:
        running.stop()


def test_without_a_descriptor_to_spare_the_transport_reads_the_frames(
        server: ServerThread, connect: Connect, direct_reads: list[int],
        monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    def no_descriptor(*args: object) -> int:
        raise OSError(errno.EMFILE, "Too many open files")

    db = connect(autocommit=True)
    db.execute("CREATE TOPIC events WITH (min_active_partitions = 2)")
    monkeypatch.setattr(copy_staged.os, "eventfd", no_descriptor)
    assert send(db, "e-1", frame(0, wire([b"a", b"b"])) + frame(1, GOOD)) == 4
    assert not direct_reads
    assert db.execute("COMMIT WRITES ('e-1') SINK 'e' BATCH 0").fetchone() == ("committed", 4)
    assert len(topic_rows(db, "events")) == 4
