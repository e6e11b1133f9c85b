"""``COPY TOPIC t FROM STDIN (FORMAT frames, WRITE_ID 'id')`` against the real server with
psycopg: the client sends its rows already as staged partition frames (the frames file
format of ``storage.staged_frames``), the server checks every frame and writes it as it
came; ``COMMIT WRITES`` publishes them by copy. Every byte is hostile until checked: a
refused frame fails the COPY with its SQLSTATE and nothing of that COPY stays staged.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import os
import struct
from collections.abc import Iterator
from pathlib import Path

import crc32c
import numpy as np
import psycopg
import pyarrow as pa
import pytest

from engine.bulk_write import WRITES_DIRECTORY
from engine.check import check_database
from engine.writes import build_batches
from sql.pgwire.connection import copy_staged
from sql.pgwire.server import ServerThread
from storage import limits
from storage.clock import ManualClock
from storage.record_batch import WIRE_SCHEMA, serialize_body_buffer
from storage.staged_frames import STAGED_HEADER, STAGED_MAGIC
from tests.pgwire.test_copy_staged import Connect, staged_ids, topic_rows
from tests.storage.test_wire_columns import _compressed_body

AT_US = 1_700_000_000_000_000


def wire(payloads: list[bytes], **columns: object) -> pa.RecordBatch:
    """A wire batch of ``payloads`` as a writer builds it (``created_at`` filled)."""
    table = pa.table({"data": pa.array(payloads, pa.binary()), **columns})
    ((_, batch),) = build_batches(table, {}, ManualClock(AT_US))
    return batch


def frame(partition: int, batch: pa.RecordBatch, *, body: bytes | None = None,
          count: int | None = None, crc: int | None = None, magic: bytes = STAGED_MAGIC,
          size: int | None = None) -> bytes:  # fmt: skip
    """A staged frame: header then body; any field may be given wrong on purpose."""
    body = serialize_body_buffer(batch).to_pybytes() if body is None else body
    header = STAGED_HEADER.pack(
        magic, crc32c.crc32c(body) if crc is None else crc, partition,
        batch.num_rows if count is None else count, len(body) if size is None else size)
    return header + body


def send(connection: psycopg.Connection, write_id: str, data: bytes, topic: str = "events",
         piece: int = 7000) -> int:  # fmt: skip
    cursor = connection.cursor()
    with cursor.copy(f"COPY TOPIC {topic} FROM STDIN (FORMAT frames, WRITE_ID '{write_id}')"
                     ) as copy:  # fmt: skip
        for start in range(0, len(data), piece):
            copy.write(data[start:start + piece])
    return cursor.rowcount


def staged_files(server: ServerThread, write_id: str) -> list[str]:
    directory = os.path.join(server.database.path, WRITES_DIRECTORY, write_id)
    return sorted(glob.glob(os.path.join(directory, "*.*")))


@pytest.fixture
def db(connect: Connect) -> psycopg.Connection:
    connection = connect(autocommit=True)
    connection.execute("CREATE TOPIC events WITH (min_active_partitions = 2)")
    return connection


class HostileCases:
    """One server for a module's hostile-frame cases. Each case gets a topic of its own
    (``hostile_<n>``, two partitions) and uses it as its write id and sink too, so no case
    sees another's frames, staged files or rows. ``close`` checks what the cases left:
    only their topics, each holding the one message its case kept, nothing staged, and a
    clean offline check once the server stopped."""

    def __init__(self, path: Path) -> None:
        self.path = str(path / "data")
        self.server = ServerThread(self.path, "127.0.0.1", 0)
        self.topics: list[str] = []

    def connect(self) -> psycopg.Connection:
        return psycopg.connect(host="127.0.0.1", port=self.server.port, user="tester",
                               dbname="topicbase", connect_timeout=10,
                               autocommit=True)  # fmt: skip

    @contextlib.contextmanager
    def case(self) -> Iterator[tuple[psycopg.Connection, str]]:
        """A new connection and a new topic (its name) for one case."""
        topic = f"hostile_{len(self.topics)}"
        with self.connect() as connection:
            connection.execute(f"CREATE TOPIC {topic} WITH (min_active_partitions = 2)")
            self.topics.append(topic)
            yield connection, topic

    def check_refused(self, connection: psycopg.Connection, topic: str) -> None:
        """After a case's refused COPY: only the earlier COPY's frames file is staged
        under the case's write id, no part file, and committing the write publishes that
        one kept message alone."""
        staged = staged_files(self.server, topic)
        assert len([p for p in staged if p.endswith(".frames")]) == 1
        assert not [p for p in staged if p.endswith(".part")]
        done = connection.execute(f"COMMIT WRITES ('{topic}') SINK '{topic}' BATCH 0").fetchone()
        assert done == ("committed", 1)
        assert [bytes(d) for _, _, d in topic_rows(connection, topic)] == [b"kept"]

    def close(self) -> None:
        with self.connect() as connection:
            names = connection.execute("SELECT name FROM sys.topics ORDER BY name").fetchall()
            assert [name for (name,) in names] == sorted(self.topics)
            for topic in self.topics:
                assert [bytes(d) for _, _, d in topic_rows(connection, topic)] == [b"kept"]
        assert staged_ids(self.server) == []
        self.server.stop()
        report = check_database(self.path)
        assert report.ok, report.lines()


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HostileCases]:
    cases = HostileCases(tmp_path_factory.mktemp("hostile_frames"))
    yield cases
    cases.close()


def test_frames_are_staged_as_sent_and_published_once(db: psycopg.Connection,
                                                      server: ServerThread) -> None:  # fmt: skip
    frames = [frame(0, wire([b"a0", b"a1"])), frame(1, wire([b"b0"])),
              frame(0, wire([b"a2"], seq_no=pa.array([7]))), frame(1, wire([b"b1", b"b2"]))]
    stream = b"".join(frames)
    assert send(db, "f-1", stream) == 6
    assert topic_rows(db, "events") == []
    (path,) = [p for p in staged_files(server, "f-1") if p.endswith(".frames")]
    with open(path, "rb") as handle:
        assert handle.read() == stream  # as received: no re-encoding
    assert db.execute("COMMIT WRITES ('f-1') SINK 's' BATCH 0").fetchone() == ("committed", 6)
    assert [(p, o, bytes(d)) for p, o, d in topic_rows(db, "events")] == [
        (0, 0, b"a0"), (0, 1, b"a1"), (0, 2, b"a2"), (1, 0, b"b0"), (1, 1, b"b1"),
        (1, 2, b"b2")]  # fmt: skip
    assert db.execute("SELECT seq_no, created_at FROM TOPIC events WHERE data = 'a2'::BLOB"
                      ).fetchone()[0] == 7  # fmt: skip
    # A replay publishes nothing more.
    assert db.execute("COMMIT WRITES ('f-1') SINK 's' BATCH 0").fetchone()[0] == "duplicate"
    assert len(topic_rows(db, "events")) == 6


def _padded(body: bytes) -> bytes:
    return body + b"\0" * (-len(body) % 8)


GOOD = wire([b"x", b"y"])
OTHER_SCHEMA = pa.record_batch({"data": pa.array([b"x", b"y"]), "n": pa.array([1, 2])})
WITH_PRODUCER = wire([b"x", b"y"], producer_id=pa.array(["p", "p"]), seq_no=pa.array([1, 2]))
NEGATIVE_SEQ = GOOD.set_column(0, "seq_no", pa.array([-1, 2], pa.int64()))
NULL_CREATED = GOOD.set_column(3, "created_at", pa.array([None, AT_US], WIRE_SCHEMA.field(
    "created_at").type))  # fmt: skip
FAR_CREATED = GOOD.set_column(3, "created_at", pa.array([AT_US, 2**62], WIRE_SCHEMA.field(
    "created_at").type))  # fmt: skip
COMPRESSED = GOOD.set_column(4, "codec", pa.array([1, 4], pa.uint8()))
TOO_MANY = wire([b"m"] * (limits.FRAME_TARGET_MESSAGES + 1))


def _bad_offsets() -> bytes:
    """GOOD's body whose data offsets point past its data buffer (a CRC that matches)."""
    body = bytearray(serialize_body_buffer(GOOD).to_pybytes())
    offsets = np.frombuffer(bytes(struct.pack("<3i", 0, 1, 2)), dtype=np.uint8).tobytes()
    at = bytes(body).rfind(offsets)
    assert at > 0
    body[at:at + 12] = struct.pack("<3i", 0, 1, 1 << 20)
    return bytes(body)


@pytest.mark.parametrize(("stream", "sqlstate"), [
    (frame(0, GOOD, crc=123), "22P04"),  # a body that is not what its CRC says
    (frame(0, GOOD, magic=b"TBs2"), "22P04"),
    (frame(0, GOOD, count=3), "22P04"),  # a header that lies about its rows
    (frame(0, GOOD, count=0), "22P04"),
    (frame(0, GOOD, size=1 << 30), "22P04"),  # larger than a frame may be: never read
    (frame(0, GOOD)[:30], "22P04"),  # the stream ends inside a body
    (frame(0, GOOD)[:10], "22P04"),  # inside a header
    (frame(-1, GOOD), "22003"),
    (frame(2, GOOD), "22023"),  # the topic has partitions 0 and 1
    (frame(0, GOOD, body=_padded(OTHER_SCHEMA.serialize().to_pybytes())), "22P04"),
    (frame(0, GOOD, body=b"\xff" * 64), "22P04"),
    (frame(0, GOOD, body=_compressed_body(GOOD).to_pybytes()), "22P04"),
    (frame(0, GOOD, body=serialize_body_buffer(GOOD).to_pybytes() + b"\0" * 8), "22P04"),
    (frame(0, GOOD, body=_bad_offsets()), "22P04"),
    (frame(0, WITH_PRODUCER), "22P04"),  # producer state: not a frame published by copy
    (frame(0, COMPRESSED), "22P04"),
    (frame(0, NEGATIVE_SEQ), "22003"),
    (frame(0, NULL_CREATED), "22P04"),
    (frame(0, FAR_CREATED), "22008"),
    (frame(0, TOO_MANY), "22P04"),
], ids=["crc", "magic", "count", "zero-count", "oversized", "truncated-body",
        "truncated-header", "negative-partition", "unknown-partition", "other-schema",
        "not-arrow", "ipc-compressed", "trailing-bytes", "bad-offsets", "producer-id",
        "codec", "negative-seq-no", "null-created-at", "created-at-range",
        "over-frame-target"])  # fmt: skip
def test_a_hostile_frame_fails_the_copy_and_stages_nothing(
        hostile: HostileCases, stream: bytes, sqlstate: str) -> None:  # fmt: skip
    with hostile.case() as (db, topic):
        good = frame(0, wire([b"kept"]))
        assert send(db, topic, good, topic) == 1  # an earlier COPY of the write stays staged
        with pytest.raises(psycopg.Error) as raised:
            send(db, topic, frame(1, wire([b"before"])) + stream, topic)
        assert raised.value.sqlstate == sqlstate, raised.value
        hostile.check_refused(db, topic)


def test_a_message_over_the_limit_is_refused(db: psycopg.Connection,
                                             monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.setattr(limits, "MESSAGE_BYTES_MAX", 1000)
    with pytest.raises(psycopg.errors.ProgramLimitExceeded):
        send(db, "l-1", frame(0, wire([b"z" * 2000])))


@pytest.mark.parametrize("statement", [
    "COPY TOPIC events (data) FROM STDIN (FORMAT frames, WRITE_ID 'x')",
    "COPY TOPIC events FROM STDIN (FORMAT frames)",
    "COPY t FROM STDIN (FORMAT frames, WRITE_ID 'x')",
])  # fmt: skip
def test_frames_are_only_a_topic_s_staged_copy(db: psycopg.Connection, statement: str) -> None:
    db.execute("CREATE TABLE t (data BLOB)")
    with pytest.raises(psycopg.errors.InvalidParameterValue), db.cursor().copy(statement):
        pass


def test_the_pipe_hands_a_whole_copy_data_over_without_a_copy() -> None:
    """A frame sent as one CopyData message reaches the check as a view of that message
    (``_Pipe.read_view``); a frame cut across messages is joined (a copy)."""
    loop = asyncio.new_event_loop()
    try:
        pipe = copy_staged._Pipe(loop)
        whole, cut = frame(0, wire([b"w"])), frame(1, wire([b"c"]))
        pipe.feed(whole)
        pipe.feed(cut[:40])
        pipe.feed(cut[40:])
        pipe.close()
        header = pipe.read_view(24)
        body = pipe.read_view(len(whole) - 24)
        assert isinstance(body, memoryview) and body.obj is whole
        assert bytes(header) + bytes(body) == whole
        assert bytes(pipe.read_view(24)) == cut[:24]
        joined = pipe.read_view(len(cut) - 24)
        assert not isinstance(joined, memoryview) and bytes(joined) == cut[24:]
        assert pipe.read_view(24) == b""
    finally:
        loop.close()
