"""Staged frames whose data column is compressed whole (Arrow IPC body compression, zstd:
``storage.column_codec``; the Spark writer's default, round 22): staged and published as
sent, each message raw, and every reader of the partition gets the messages back: SQL
reads, a consumer's poll over many partitions (the bulk scan), ``COPY ... TO STDOUT
(FORMAT arrow)``, the Flight door's range read, a move into another topic, the offline
check. Every byte is hostile until checked: a refused frame fails the COPY and nothing of
it stays staged; a server killed mid-COPY keeps only the whole COPYs.
"""

from __future__ import annotations

import glob
import json
import os
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pytest
import zstandard

from engine import reads
from engine.bulk_read import OffsetRange
from engine.bulk_write import WRITES_DIRECTORY
from engine.check import check_database
from sql.pgwire.server import ServerThread
from storage import limits
from storage.column_codec import DATA_VALUES, NOT_COMPRESSED, assemble_body, compress_body
from tests.pgwire.test_copy import copy_out
from tests.pgwire.test_copy_frames import HostileCases, frame, send, staged_files, wire
from tests.pgwire.test_copy_frames_zstd import zstd_wire
from tests.pgwire.test_copy_staged import Connect, topic_rows

_INT64 = struct.Struct("<q")


def json_lines(count: int, seed: int) -> list[bytes]:
    """Log-line-like messages (compressible, not runs of one byte), one empty."""
    lines = [json.dumps({"ts": 1_700_000_000 + i * 7, "user": f"u{(i * seed) % 97}",
                         "path": f"/api/v1/items/{(i * 31 + seed) % 1000}", "status": 200,
                         "note": "ok" if i % 3 else "retry after timeout"}).encode()
             for i in range(count)]  # fmt: skip
    lines[count // 2] = b""
    return lines


def column_frame(partition: int, messages: list[bytes]) -> bytes:
    batch = wire(messages)
    return frame(partition, batch, body=compress_body(batch).to_pybytes())


@pytest.fixture
def db(connect: Connect) -> psycopg.Connection:
    connection = connect(autocommit=True)
    connection.execute("CREATE TOPIC events WITH (min_active_partitions = 2)")
    return connection


def test_column_compressed_frames_are_stored_as_sent_and_every_reader_gets_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """Then the server stops and the offline check of its data directory is clean."""
    server = ServerThread(str(tmp_path / "data"), "127.0.0.1", 0)
    try:
        with psycopg.connect(host="127.0.0.1", port=server.port, user="tester",
                             dbname="topicbase", autocommit=True) as db:  # fmt: skip
            db.execute("CREATE TOPIC events (CONSUMER c) WITH (min_active_partitions = 4)")
            db.execute("CREATE TOPIC moved")
            _every_reader(db, server, monkeypatch)
    finally:
        server.stop()
    report = check_database(str(tmp_path / "data"))
    assert report.ok, report.lines()


def _every_reader(db: psycopg.Connection, server: ServerThread,
                  monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    expected: dict[int, list[bytes]] = {}
    pieces = []
    for partition in range(4):
        first, raw, last = (json_lines(6, partition), [b"plain %d" % partition],
                            json_lines(5, 10 + partition))  # fmt: skip
        pieces += [column_frame(partition, first), frame(partition, wire(raw)),
                   column_frame(partition, last)]  # fmt: skip
        expected[partition] = first + raw + last
    stream = b"".join(pieces)
    assert send(db, "c-1", stream) == 48
    (path,) = [p for p in staged_files(server, "c-1") if p.endswith(".frames")]
    with open(path, "rb") as handle:
        assert handle.read() == stream  # as received: compressed, not re-encoded
    assert db.execute("COMMIT WRITES ('c-1') SINK 's' BATCH 0").fetchone() == ("committed", 48)
    rows = [(p, o, d) for p in range(4) for o, d in enumerate(expected[p])]
    assert [(p, o, bytes(d)) for p, o, d in topic_rows(db, "events")] == rows
    codecs = db.execute("SELECT DISTINCT codec FROM TOPIC events").fetchall()
    assert codecs == [("raw",)]  # the messages keep their codec: the frame is compressed
    # the partition holds the compressed bodies as sent, not re-encoded
    first_body = pieces[0][24:]
    logs = glob.glob(os.path.join(server.database.path, "store", "topics", "*", "p0", "*.log"))
    assert any(first_body in Path(log).read_bytes() for log in logs)
    assert len(first_body) < sum(len(d) for d in json_lines(6, 0)) // 2 + 1024

    for partition in range(4):  # COPY ... (FORMAT arrow): a range read of stored frames
        out = copy_out(
            db,
            f"COPY (SELECT data FROM TOPIC events WHERE partition = {partition} "
            f'AND "offset" >= 0 AND "offset" < 12) TO STDOUT (FORMAT arrow)',
        )
        table = pa.ipc.open_stream(out).read_all()
        assert [bytes(d) for d in table.column("data").to_pylist()] == expected[partition]
    session = server.database.connect()  # the Flight door's DoGet reads so
    try:
        for partition in range(4):
            batches = list(session.bulk_read("events", OffsetRange(partition, 0, 12), None))
            got = pa.Table.from_batches(batches).column("data").to_pylist()
            assert [bytes(d) for d in got] == expected[partition]
    finally:
        session.close()

    scans: list[bool] = []
    original = reads.scan_many

    def counted(*args: Any) -> Any:
        found = original(*args)
        scans.append(found is not None)
        return found

    monkeypatch.setattr(reads, "scan_many", counted)
    polled = db.execute('SELECT partition, "offset", data FROM TOPIC events WITH (consumer = '
                        "'c', max_messages = 1000)").fetchall()  # fmt: skip
    assert sorted((p, o, bytes(d)) for p, o, d in polled) == rows
    assert True in scans  # the bulk scan read them (its Arrow path for compressed bodies)

    db.execute("BEGIN")
    db.execute("INSERT INTO TOPIC moved SELECT data FROM TOPIC events WHERE partition = 1")
    db.execute("COMMIT")
    moved = db.execute('SELECT data FROM TOPIC moved ORDER BY "offset"').fetchall()
    assert [bytes(d) for (d,) in moved] == expected[1]


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HostileCases]:
    """One server for the hostile compressed frames (``test_copy_frames.HostileCases``)."""
    cases = HostileCases(tmp_path_factory.mktemp("hostile_column_frames"))
    yield cases
    cases.close()


BIG = bytes(range(256)) * 300  # 76,800 bytes: zstd declares it in a 4-byte field
_ZSTD = zstandard.ZstdCompressor(level=1, write_content_size=True)


def _data(payload: bytes) -> Any:
    """A piece maker: ``payload(values)`` as the data values buffer, the rest stored."""

    def piece(index: int, values: bytes) -> bytes:
        if index == DATA_VALUES:
            return payload(values)
        return _INT64.pack(NOT_COMPRESSED) + values

    return piece


def _lying(values: bytes, declared: int) -> bytes:
    """``values`` compressed, the frame header's 4-byte content size and the prefix both
    set to ``declared``."""
    packed = _ZSTD.compress(values)
    assert packed[4] >> 6 == 2 and packed[4] & 0x20
    return _INT64.pack(declared) + packed[:5] + struct.pack("<I", declared) + packed[9:]


def _corrupt(values: bytes) -> bytes:
    """The first block of the zstd frame of the reserved type (3): undecodable."""
    packed = _ZSTD.compress(values)
    assert packed[4] >> 6 == 2 and packed[4] & 0x20
    return _INT64.pack(len(values)) + packed[:9] + bytes([packed[9] | 0b110]) + packed[10:]


def _body(messages: list[bytes], piece: Any, compression: str = "zstd") -> bytes:
    return assemble_body(wire(messages), piece, compression).to_pybytes()


HOSTILE = {
    "not-zstd": ([b"a" * 100], _data(lambda v: _INT64.pack(len(v)) + b"\xff" * 64), "22P03"),
    "no-content-size": (
        [b"a" * 100],
        _data(
            lambda v: (
                _INT64.pack(len(v)) + zstandard.ZstdCompressor(write_content_size=False).compress(v)
            )
        ),
        "22P03",
    ),
    "prefix-not-frame-size": (
        [b"a" * 100],
        _data(lambda v: _INT64.pack(len(v) - 1) + _ZSTD.compress(v)),
        "22P03",
    ),
    "size-lie": ([BIG], _data(lambda v: _lying(v, len(v) + 8)), "22P03"),
    "corrupt": ([BIG], _data(_corrupt), "22P03"),
    "truncated": ([BIG], _data(lambda v: _INT64.pack(len(v)) + _ZSTD.compress(v)[:-7]), "22P03"),
    "negative": ([b"a" * 100], _data(lambda v: _INT64.pack(-5) + v), "22P04"),
    "declared-too-large": ([BIG], _data(lambda v: _lying(v, 1 << 30)), "54000"),
    "bomb": (
        [b"a"],
        _data(lambda v: _INT64.pack(32 << 20) + _ZSTD.compress(bytes(32 << 20))),
        "54000",
    ),
    "extra-values": (
        [b"a" * 100],
        _data(lambda v: _INT64.pack(len(v) + 3) + _ZSTD.compress(v + b"abc")),
        "22P04",
    ),
    "other-buffer": (
        [b"a" * 100, b"b"],
        lambda i, v: (
            _INT64.pack(len(v)) + _ZSTD.compress(v)
            if i == DATA_VALUES - 1
            else _INT64.pack(NOT_COMPRESSED) + v
        ),
        "22P04",
    ),
    "short-buffer": (
        [b"a" * 100],
        lambda i, v: v[:4] if i == DATA_VALUES - 1 else _INT64.pack(NOT_COMPRESSED) + v,
        "22P04",
    ),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_compressed_frame_fails_the_copy_and_stages_nothing(
        hostile: HostileCases, case: str) -> None:  # fmt: skip
    messages, piece, sqlstate = HOSTILE[case]
    batch = wire(messages)
    with hostile.case() as (db, topic):
        assert send(db, topic, frame(0, wire([b"kept"])), topic) == 1
        bad = frame(0, batch, body=_body(messages, piece))
        with pytest.raises(psycopg.Error) as raised:
            send(db, topic, frame(1, wire([b"before"])) + bad, topic)
        assert raised.value.sqlstate == sqlstate, raised.value
        hostile.check_refused(db, topic)


def test_another_codec_or_compressed_messages_in_a_compressed_frame_are_refused(
        hostile: HostileCases) -> None:  # fmt: skip
    lz4 = wire([b"a" * 100])
    lz4_body = _body([b"a" * 100], lambda i, v: _INT64.pack(NOT_COMPRESSED) + v, "lz4")
    inner = zstd_wire([_ZSTD.compress(b"p" * 50)])  # zstd messages in a zstd frame
    cases = [
        (frame(0, lz4, body=lz4_body), "22P04"),
        (frame(0, inner, body=compress_body(inner).to_pybytes()), "22P04"),
    ]
    for bad, sqlstate in cases:
        with hostile.case() as (db, topic):
            assert send(db, topic, frame(0, wire([b"kept"])), topic) == 1
            with pytest.raises(psycopg.Error) as raised:
                send(db, topic, bad, topic)
            assert raised.value.sqlstate == sqlstate, raised.value
            hostile.check_refused(db, topic)


def test_a_compressed_frame_needs_a_topic_that_accepts_raw(connect: Connect) -> None:
    """Its messages are raw: a topic of zstd messages only refuses it (22023), as any
    raw frame."""
    db = connect(autocommit=True)
    db.execute("CREATE TOPIC zonly WITH (supported_codecs = 'zstd')")
    with pytest.raises(psycopg.errors.InvalidParameterValue):
        send(db, "z-1", column_frame(0, [b"x" * 100]), topic="zonly")


def test_the_declared_size_is_checked_before_anything_is_decompressed(
        db: psycopg.Connection, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """A frame declaring more than the bound is refused from its prefix: Arrow is never
    asked to allocate it (the bound lowered below a real frame's size)."""
    monkeypatch.setattr(limits, "COLUMN_DECLARED_BYTES_MAX", 1000)
    asked: list[int] = []
    original = pa.ipc.read_record_batch
    monkeypatch.setattr(pa.ipc, "read_record_batch",
                        lambda *a, **k: asked.append(1) or original(*a, **k))  # fmt: skip
    with pytest.raises(psycopg.errors.ProgramLimitExceeded):
        send(db, "d-1", column_frame(0, [b"y" * 1001]))
    assert not asked
    assert send(db, "d-2", column_frame(0, [b"y" * 1000])) == 1


def test_crash_mid_compressed_copy_keeps_only_the_whole_copies(tmp_path: Path) -> None:
    """A server killed (SIGKILL) while a COPY of compressed frames is half sent: after the
    restart the write holds its first COPY only, committed once, its rows read back."""
    from tests.pgwire.test_copy_staged_crash import _connect, _kill_mid_copy, _restarted, _serve

    data_dir = tmp_path / "data"
    process, port = _serve(data_dir)
    first = {p: json_lines(50, p) for p in (0, 1)}
    try:
        with _connect(port) as db:
            db.execute("CREATE TOPIC events WITH (min_active_partitions = 2)")
            cursor = db.cursor()
            sql = "COPY TOPIC events FROM STDIN (FORMAT frames, WRITE_ID 'w')"
            with cursor.copy(sql) as copy:
                copy.write(b"".join(column_frame(p, first[p]) for p in (0, 1)))
            assert cursor.rowcount == 100
            write_dir = data_dir / WRITES_DIRECTORY / "w"
            lines = [os.urandom(200) + b"x" * 824 for _ in range(1000)]
            stream = b"".join(column_frame(i % 2, lines) for i in range(40))
            _kill_mid_copy(process, db, sql, stream, write_dir)
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()
    with _restarted(data_dir) as db:
        got = db.execute('SELECT partition, data FROM TOPIC events ORDER BY partition, "offset"'
                         ).fetchall()  # fmt: skip
        assert [(p, bytes(d)) for p, d in got] == [(p, d) for p in (0, 1) for d in first[p]]
    report = check_database(str(data_dir))
    assert report.ok, report.lines()
