"""A read's byte budgets charge a column-compressed frame (``storage.column_codec``), or a
frame of zstd messages, what it decodes to, not its stored bytes (review R1 H-1, round
22): a stored frame of ~1 KB may declare megabytes of messages. A poll's ``max_bytes``,
the bulk read's ``READ_CHUNK_BYTES`` (Flight DoGet, Spark's range reads) and the
many-partition scan then return what they return for the same messages stored raw: at
least one frame, and no more once the budget is spent."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import numpy as np
import psycopg
import pytest
import zstandard

from engine.bulk_read import READ_CHUNK_BYTES, OffsetRange
from sql.pgwire.server import ServerThread
from storage.column_codec import compress_body, compressed_bodies, unpacked_bytes
from storage.record_batch import serialize_body_buffer
from tests.pgwire.test_copy_frames import frame, send, wire
from tests.pgwire.test_copy_frames_zstd import zstd_wire

MESSAGE_BYTES = 2 << 20
# raw frames; frames whose data column is compressed whole; frames of zstd messages (a
# topic that accepts them: every reader decompresses them)
KINDS = ("raw", "column", "zstd")
_CONSUMERS = itertools.count()
_ZSTD = zstandard.ZstdCompressor(level=1, write_content_size=True)
FRAMES = 6


def _message(index: int) -> bytes:
    line = b'{"level":"info","msg":"request %d served","path":"/a/b"}\n' % index
    return (line * (MESSAGE_BYTES // len(line) + 1))[:MESSAGE_BYTES]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    """Topics ``raw_t`` and ``column_t`` (two partitions each) holding the same
    ``FRAMES`` one-message frames a partition, raw or with the data column compressed."""
    data = tmp_path_factory.mktemp("budget") / "data"
    server = ServerThread(str(data), "127.0.0.1", 0)
    try:
        with psycopg.connect(host="127.0.0.1", port=server.port, user="tester",
                             dbname="topicbase", autocommit=True) as db:  # fmt: skip
            for kind in KINDS:
                codecs = ", supported_codecs = 'raw,zstd'" if kind == "zstd" else ""
                db.execute(f"CREATE TOPIC {kind}_t WITH (min_active_partitions = 2{codecs})")
                pieces = []
                for partition in (0, 1):
                    for index in range(FRAMES):
                        batch = wire([_message(index)])
                        body = compress_body(batch).to_pybytes() if kind == "column" else None
                        if kind == "zstd":
                            batch = zstd_wire([_ZSTD.compress(_message(index))])
                        pieces.append(frame(partition, batch, body=body))
                stream = b"".join(pieces)
                if kind != "raw":
                    assert len(stream) < 2 * FRAMES * 8192  # stored: a few KB a frame
                send(db, kind, stream, topic=f"{kind}_t", piece=1 << 20)
                db.execute(f"COMMIT WRITES ('{kind}') SINK 's_{kind}' BATCH 0")
        yield server
    finally:
        server.stop()


def _poll(server: ServerThread, topic: str, max_bytes: int, partition: int | None) -> list[int]:
    """The sizes of the messages a new consumer's first poll gets."""
    where = f" WHERE partition = {partition}" if partition is not None else ""
    consumer = f"c{next(_CONSUMERS)}"
    with psycopg.connect(host="127.0.0.1", port=server.port, user="tester",
                         dbname="topicbase", autocommit=True) as db:  # fmt: skip
        db.execute(f"ALTER TOPIC {topic} ADD CONSUMER {consumer}")
        rows = db.execute(f"SELECT octet_length(data) FROM TOPIC {topic} WITH (consumer = "
                          f"'{consumer}', max_bytes = {max_bytes}){where}").fetchall()  # fmt: skip
    return [row[0] for row in rows]


@pytest.mark.parametrize("kind", ["column", "zstd"])
@pytest.mark.parametrize("partition", [0, None])
def test_a_poll_returns_of_compressed_frames_what_it_returns_of_raw_ones(
        server: ServerThread, partition: int | None, kind: str) -> None:  # fmt: skip
    """``max_bytes`` = 1 MiB over 2 MiB messages: one message (the first frame is always
    returned whole), for one partition and for both (the many-partition scan)."""
    raw = _poll(server, "raw_t", 1 << 20, partition)
    compressed = _poll(server, f"{kind}_t", 1 << 20, partition)
    assert raw == [MESSAGE_BYTES]
    assert compressed == raw
    # A budget of three messages' bytes stops that read where it stops a raw one.
    assert _poll(server, f"{kind}_t", 3 * MESSAGE_BYTES, partition) == _poll(
        server, "raw_t", 3 * MESSAGE_BYTES, partition)  # fmt: skip


def test_a_bulk_read_batch_of_column_frames_stays_within_the_chunk(server: ServerThread) -> None:
    """Each batch of a range read holds at most ``READ_CHUNK_BYTES`` plus one frame of
    data, decoded, as for raw frames (before: every frame of the range in one batch)."""
    session = server.database.connect()
    try:
        for topic in [f"{kind}_t" for kind in KINDS]:
            batches = list(session.bulk_read(topic, OffsetRange(0, 0, FRAMES), None))
            assert sum(batch.num_rows for batch in batches) == FRAMES
            largest = max(batch.column("data").nbytes for batch in batches)
            assert largest <= READ_CHUNK_BYTES + MESSAGE_BYTES + 4096, (topic, largest)
            assert len(batches) >= FRAMES * MESSAGE_BYTES // (READ_CHUNK_BYTES + MESSAGE_BYTES)
    finally:
        session.close()


def test_the_vectorised_probe_agrees_with_the_scalar_one() -> None:
    """``compressed_bodies`` (the bulk scan's) finds exactly the bodies for which
    ``unpacked_bytes(messages=True)`` finds declared data: column-compressed ones and
    those holding a zstd message, over bodies of several shapes."""
    rng = np.random.default_rng(22)
    bodies = []
    for count in (1, 5, 300):
        messages = [rng.bytes(int(rng.integers(0, 200))) for _ in range(count)]
        batch = wire(messages)
        zstd = zstd_wire([_ZSTD.compress(message) for message in messages])
        bodies += [serialize_body_buffer(batch), compress_body(batch), serialize_body_buffer(zstd)]
    starts = np.cumsum([0] + [body.size for body in bodies[:-1]])
    joined = np.frombuffer(b"".join(body.to_pybytes() for body in bodies), np.uint8)
    assert compressed_bodies(joined, starts).tolist() == [False, True, True] * 3
    declared = [unpacked_bytes(body, messages=True) for body in bodies]
    assert declared[0::3] == [0, 0, 0]
    assert sum(declared[1::3]) > 0
    assert declared[1::3] == declared[2::3]  # the same messages' bytes, either way
