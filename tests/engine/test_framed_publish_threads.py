"""A bulk commit's shares staged as frames are published at once, a thread per partition
(``engine.commit.Committer._publish_framed``): each partition's frames in order, every
message once; a share whose copy fails while the others' succeed is published by the
next commit's ``_finish_unfinished`` (and, had the process died, by recovery: the crash
points of ``test_bulk_commit_crash.py``), never twice."""

from __future__ import annotations

import itertools
import threading

import pyarrow as pa

from engine.database import Database
from storage.errors import StorageIOError
from storage.partition_log import PartitionLog
from tests.engine.bulk_helpers import commit_writes, messages_by_partition, stage_batch

PARTITIONS = 4


def _open(tmp_path) -> Database:
    database = Database.open(str(tmp_path / "data"), retention_interval_s=None)
    session = database.connect()
    session.execute(f"CREATE TOPIC t WITH (min_active_partitions = {PARTITIONS})")
    session.close()
    return database


def _stage(database: Database, write_id: str, start: int, count: int) -> None:
    batch = pa.record_batch({
        "data": pa.array([b"m%05d" % i for i in range(start, start + count)]),
        "partition": pa.array([i % PARTITIONS for i in range(start, start + count)], pa.int32()),
    })  # fmt: skip
    stage_batch(database, write_id, batch, 100)


def _partitions(database: Database) -> dict[int, list[bytes]]:
    return messages_by_partition(database, PARTITIONS)


def _expected(*ranges: tuple[int, int]) -> dict[int, list[bytes]]:
    found: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
    for start, count in ranges:
        for i in range(start, start + count):
            found[i % PARTITIONS].append(b"m%05d" % i)
    return found


def test_framed_shares_are_copied_on_threads_of_their_own(tmp_path, monkeypatch) -> None:
    """The first two copies on the publish threads are in progress at once: each waits
    at a barrier for the other before copying. Merely counting the
    threads that copied is not enough: the pool hands the next share to a worker that
    went idle, so on a loaded machine one worker may have copied all three. Copied one
    after another, the first copy would wait alone; the barrier's timeout only keeps
    that failure from hanging."""
    threads: dict[int, set[str]] = {}
    real = PartitionLog.publish_staged
    both_copying = threading.Barrier(2, timeout=60)
    calls = itertools.count()
    alone: list[int] = []

    def spy(self: PartitionLog, frames: list, transaction_id: int) -> int:
        name = threading.current_thread().name
        threads.setdefault(self.partition_id, set()).add(name)
        if name.startswith("topicbase-publish") and next(calls) < 2:
            try:
                both_copying.wait()
            except threading.BrokenBarrierError:
                alone.append(self.partition_id)
        return real(self, frames, transaction_id)

    monkeypatch.setattr(PartitionLog, "publish_staged", spy)
    database = _open(tmp_path)
    try:
        _stage(database, "a", 0, 2000)
        _stage(database, "b", 2000, 1000)
        assert commit_writes(database, 1, ["a", "b"]) == {"status": "committed", "rows": 3000}
        assert _partitions(database) == _expected((0, 2000), (2000, 1000))
        names = set().union(*threads.values())
        assert sorted(threads) == list(range(PARTITIONS))
        assert len([n for n in names if n.startswith("topicbase-publish")]) >= 2
        assert not alone, "two shares were not copied at the same time"
    finally:
        database.close()


def test_the_first_partitions_share_is_published_beside_the_others(
        tmp_path, monkeypatch) -> None:  # fmt: skip
    """Round 16: the transaction's first share (partition 0) no longer goes alone before
    the others: its publish waits until another partition's has begun, and the commit
    ends (before, partition 0 was published on the committing thread before any other
    began, so it waited the event's whole timeout). ``commit.mid_publish`` is still hit
    once, after a share is published."""
    real = PartitionLog.publish_staged
    started = threading.Event()
    waited: list[bool] = []
    points: list[str] = []

    def spy(self: PartitionLog, frames: list, transaction_id: int) -> int:
        if self.partition_id == 0:
            waited.append(started.wait(20))
        else:
            started.set()
        return real(self, frames, transaction_id)

    monkeypatch.setattr(PartitionLog, "publish_staged", spy)
    monkeypatch.setattr("engine.commit.failpoints.hit", lambda name: points.append(name)
                        if name == "commit.mid_publish" else None)  # fmt: skip
    database = _open(tmp_path)
    try:
        _stage(database, "a", 0, 2000)
        assert commit_writes(database, 1, ["a"]) == {"status": "committed", "rows": 2000}
        assert waited == [True], waited
        assert points == ["commit.mid_publish"]
        assert _partitions(database) == _expected((0, 2000))
    finally:
        database.close()


def test_a_share_that_failed_beside_published_ones_is_published_once_later(
        tmp_path, monkeypatch) -> None:  # fmt: skip
    real = PartitionLog.publish_staged
    failed: list[int] = []

    def failing(self: PartitionLog, frames: list, transaction_id: int) -> int:
        if self.partition_id == 2 and not failed:
            failed.append(transaction_id)
            raise StorageIOError("a disk error while copying (injected)")
        return real(self, frames, transaction_id)

    monkeypatch.setattr(PartitionLog, "publish_staged", failing)
    database = _open(tmp_path)
    try:
        _stage(database, "a", 0, 2000)
        assert commit_writes(database, 1, ["a"]) == {"status": "committed", "rows": 2000}
        assert failed
        published = _partitions(database)
        assert published[2] == [] and published[3] == _expected((0, 2000))[3]
        _stage(database, "b", 2000, 400)  # the next commit publishes what was left first
        assert commit_writes(database, 2, ["b"]) == {"status": "committed", "rows": 400}
        assert _partitions(database) == _expected((0, 2000), (2000, 400))
    finally:
        database.close()
    database = Database.open(str(tmp_path / "data"), retention_interval_s=None)
    try:
        assert _partitions(database) == _expected((0, 2000), (2000, 400))
    finally:
        database.close()
