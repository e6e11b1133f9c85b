"""Frames a client sends (``COPY TOPIC t FROM STDIN (FORMAT frames)``, the JVM writer's
path) staged in files of their own per partition and adopted as segments by the commit
(``storage.staged_frames`` own files, ``PartitionLog._adopt_locked``): every reader sees
the write whole, in order, at offsets 0.. (SQL over the wire, ``COPY ... (FORMAT
arrow)``, Flight DoGet), before and after an autopartitioning split of a partition
holding adopted segments, and retention deletes them whole."""

from __future__ import annotations

import os

import pytest

from spark_sql_ext.client import TopicbaseClient
from sql.flight.server import start_flight
from sql.pgwire.server import ServerThread
from storage import limits
from storage.staged_frames import OWN_FILE
from tests.pgwire.test_copy_arrow import read_arrow
from tests.pgwire.test_copy_frames import frame, send, staged_files, wire
from tests.pgwire.test_copy_staged import Connect, topic_rows

FRAMES = 6  # per partition, of 16 messages of 1 KiB: own files of ~100 KiB each


def _message(partition: int, index: int) -> bytes:
    return b"p%d-%05d-" % (partition, index) + b"x" * 1000


@pytest.fixture
def adopting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "ADOPT_BYTES_MIN", 4096)
    monkeypatch.setattr(limits, "ADOPT_SWITCH_BYTES", 0)


def _stream(start: int) -> bytes:
    """FRAMES frames per partition (0 and 1, interleaved), messages ``start``.. ."""
    frames = []
    for number in range(FRAMES):
        for partition in (0, 1):
            first = start + number * 16
            frames.append(frame(partition, wire([_message(partition, i)
                                                 for i in range(first, first + 16)])))
    return b"".join(frames)


def _expected(copies: int) -> list[tuple[int, int, bytes]]:
    count = copies * FRAMES * 16
    return [(p, i, _message(p, i)) for p in (0, 1) for i in range(count)]


def test_adopted_frames_are_read_whole_and_in_order_by_every_reader(
        adopting: None, connect: Connect, server: ServerThread) -> None:  # fmt: skip
    db = connect(autocommit=True)
    db.execute("CREATE TOPIC events WITH (min_active_partitions = 2, "
               "auto_partitioning_strategy = 'paused')")  # fmt: skip
    for copy in range(2):  # two COPYs: two own files per partition
        assert send(db, "f-1", _stream(copy * FRAMES * 16)) == FRAMES * 16 * 2
    own = [p for p in staged_files(server, "f-1") if OWN_FILE.match(os.path.basename(p))]
    assert len(own) == 4, staged_files(server, "f-1")
    assert db.execute("COMMIT WRITES ('f-1') SINK 's' BATCH 0").fetchone() == (
        "committed", 2 * FRAMES * 16 * 2)
    database = server.database
    topic = database.topic_log(database.catalog.entry("events").topic_id)
    for partition in (0, 1):
        segments = [s for s in topic.partition(partition).segments if s.size_bytes]
        assert [s.base_offset for s in segments] == [0, FRAMES * 16]  # the two files, adopted
    expected = _expected(2)

    def rows_everywhere() -> None:
        assert [(p, o, bytes(d)) for p, o, d in topic_rows(db, "events")] == expected
        table = read_arrow(db, 'SELECT partition, "offset", data FROM TOPIC events '
                               'ORDER BY partition, "offset"')  # fmt: skip
        assert list(zip(*(table.column(c).to_pylist() for c in ("partition", "offset", "data")),
                        strict=True)) == expected  # fmt: skip
        for partition in (0, 1):
            end = 2 * FRAMES * 16
            ranged = read_arrow(db, f'SELECT "offset", data FROM TOPIC events WHERE partition = '
                                    f'{partition} AND "offset" >= 0 AND "offset" < {end}')
            assert ranged.to_pylist() == [{"offset": o, "data": d}
                                          for p, o, d in expected if p == partition]
        door = start_flight(database, "127.0.0.1", 0, "trust")
        try:
            with TopicbaseClient(f"topicbase://127.0.0.1:{door.port}", "tester") as client:
                got = client.read_all({"topic": "events",
                                       "columns": ["partition", "offset", "data"]})
        finally:
            door.stop()
        assert sorted(zip(*(got.column(c).to_pylist() for c in ("partition", "offset", "data")),
                          strict=True)) == expected  # fmt: skip

    rows_everywhere()
    # a split of partition 0: its readers read the parent's adopted segments, then children
    assert topic.split(0, force=True) is not None
    rows_everywhere()
    # retention deletes whole segments: the first adopted file of partition 1 goes whole
    log = topic.partition(1)
    log.roll()
    assert log.delete_segments_before(FRAMES * 16) == 1
    assert log.start_offset == FRAMES * 16
    kept = [r for r in expected if r[0] == 0 or r[1] >= FRAMES * 16]
    assert [(p, o, bytes(d)) for p, o, d in topic_rows(db, "events")] == kept
