"""``engine.bulk_read.read_range`` reads each stored frame once: a large frame (a Flight or
Spark commit writes one frame per partition, up to BATCH_BYTES_MAX) is read from disk and
decoded once and cut into batches of READ_CHUNK_MESSAGES, not read again for every chunk;
the batches are those a chunk-by-chunk read gives."""

from __future__ import annotations

import pyarrow as pa
import pytest

from engine import bulk_read
from engine.bulk_read import READ_CHUNK_MESSAGES, OffsetRange, read_range
from storage.fs import FileSystem

MESSAGES = 50_000
MESSAGE_BYTES = 1024


@pytest.fixture
def big_frame(database, session) -> tuple:
    """Topic t of one partition holding 50,000 messages of 1 KiB in one frame."""
    session.execute("CREATE TOPIC t")
    session.execute(f"INSERT INTO TOPIC t (data) SELECT repeat('x', {MESSAGE_BYTES - 5}) || "
                    f"lpad(CAST(i AS VARCHAR), 5, '0') FROM range({MESSAGES}) AS r(i)")  # fmt: skip
    topic = database.topic_log(database.catalog.entry("t").topic_id)
    partition = topic.partition(0)
    found = partition.read_frames(0, max_messages=MESSAGES, max_bytes=1 << 28)
    assert [s.rows for s in found.slices] == [MESSAGES], "one frame holds every message"
    return partition, found.slices[0].size


def _counted_preads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    sizes: list[int] = []
    original = FileSystem.pread

    def counting(self: FileSystem, fd: int, size: int, position: int) -> bytes:
        data = original(self, fd, size, position)
        sizes.append(len(data))
        return data

    original_into = FileSystem.pread_into

    def counting_into(self: FileSystem, fd: int, target: memoryview, position: int) -> int:
        got = original_into(self, fd, target, position)  # a large window (buffer_pool)
        sizes.append(got)
        return got

    monkeypatch.setattr(FileSystem, "pread", counting)
    monkeypatch.setattr(FileSystem, "pread_into", counting_into)
    return sizes


def _old_batches(partition, offsets: OffsetRange) -> list[pa.RecordBatch]:
    """What read_range gave before: a storage read of READ_CHUNK_MESSAGES at a time."""
    batches, position = [], offsets.start
    while position < offsets.end:
        result = partition.read(position, max_messages=min(READ_CHUNK_MESSAGES,
                                offsets.end - position), max_bytes=16 << 20)  # fmt: skip
        for batch in result.batches:
            batches.append(bulk_read._project(offsets.partition, batch, bulk_read.BULK_SCHEMA))
            position = batch.column("offset")[-1].as_py() + 1
    return batches


def test_a_range_over_one_large_frame_reads_it_once(big_frame, session, monkeypatch) -> None:
    partition, frame_bytes = big_frame
    assert frame_bytes > MESSAGES * MESSAGE_BYTES
    expected = _old_batches(partition, OffsetRange(0, 0, MESSAGES))
    sizes = _counted_preads(monkeypatch)
    batches = list(read_range(session, "t", OffsetRange(0, 0, MESSAGES)))
    # The frame once, and a peek at its header (a chunk-by-chunk read pread it 7 times).
    assert sum(sizes) < frame_bytes + 4096, (sum(sizes), frame_bytes)
    assert [b.num_rows for b in batches] == [b.num_rows for b in expected]
    assert all(b.num_rows <= READ_CHUNK_MESSAGES for b in batches)
    assert pa.Table.from_batches(batches).equals(pa.Table.from_batches(expected))


@pytest.mark.parametrize("start, end", [(100, 49_900), (8_000, 8_500), (49_999, 50_000)])
def test_a_range_inside_a_frame_gives_exactly_its_messages(big_frame, session, start, end) -> None:
    partition, _ = big_frame
    batches = list(read_range(session, "t", OffsetRange(0, start, end), ["offset", "data"]))
    table = pa.Table.from_batches(batches)
    assert table.column("offset").to_pylist() == list(range(start, end))
    assert table.column("data")[0].as_py().endswith(b"%05d" % start)
    old = _old_batches(partition, OffsetRange(0, start, end))
    assert table.column("data").equals(pa.Table.from_batches(old).column("data"))


def test_many_small_frames_read_as_before(session) -> None:
    session.execute("CREATE TOPIC s")
    for round_ in range(30):
        session.execute(f"INSERT INTO TOPIC s (data) SELECT 'm{round_}-' || CAST(i AS VARCHAR) "
                        f"FROM range({1 + round_ * 7}) AS r(i)")  # fmt: skip
    total = sum(1 + r * 7 for r in range(30))
    batches = list(read_range(session, "s", OffsetRange(0, 3, total - 2)))
    table = pa.Table.from_batches(batches)
    assert table.column("offset").to_pylist() == list(range(3, total - 2))
    assert all(b.num_rows <= READ_CHUNK_MESSAGES for b in batches)


def test_retention_during_a_range_read_fails_rather_than_skipping(session, monkeypatch) -> None:
    """Storage clamps a read to the log start: a range read that retention overtook between
    two reads refuses (22023) instead of skipping the removed messages."""
    from storage.errors import InvalidParameterValueError
    from storage.partition_log import PartitionLog

    session.execute("CREATE TOPIC r")
    for _ in range(3):
        session.execute("INSERT INTO TOPIC r (data) SELECT CAST(repeat('y', 1024) AS BLOB) "
                        "FROM range(5000) AS g(i)")  # fmt: skip
    original = PartitionLog.read_frames
    calls: list[int] = []

    def overtaken(self, start_offset: int, **limits):
        calls.append(start_offset)
        # From the second read on, as if retention had removed the next 10 messages.
        return original(self, start_offset + (10 if len(calls) > 1 else 0), **limits)

    monkeypatch.setattr(PartitionLog, "read_frames", overtaken)
    monkeypatch.setattr(bulk_read, "READ_CHUNK_BYTES", 1)  # one frame per storage read
    batches = read_range(session, "r", OffsetRange(0, 0, 15_000))
    with pytest.raises(InvalidParameterValueError, match="removed by retention"):
        list(batches)
    assert len(calls) == 2
