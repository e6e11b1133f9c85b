"""A fence in the gap of a checkpoint's unlocked partition sync (review R3, finding 1).

``PartitionLog.sync`` takes the log's descriptor under the write lock
(``flush_for_sync``) and syncs it after releasing the lock (``sync_published``). A
write that fails in that gap fences the partition, and the fence's cut of the log
(``LogSegment.truncate_to``) syncs it: when that ``fdatasync`` is the one the kernel
reports a lost writeback of published pages to (it reports it to one sync only), the
checkpoint's sync after it succeeds although the bytes are not on disk, and the
checkpoint deleted the commit records of those transactions. Now a failed cut's sync is
kept as any failed sync of the log (every later one fails), and a partition fenced in
the gap fails the checkpoint's sync with ``PartitionFencedError`` (the checkpoint sets
its transactions aside until reopen).
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from storage.config import FsyncPolicy
from storage.errors import PartitionFencedError, StorageIOError
from storage.fs import FileSystem
from tests.storage_sync import flushed, two_records

WAIT_S = 10.0  # a bound for a thread that should finish at once (never reached if green)


class _FailingDisk(FileSystem):
    """``writeback_error``: the next ``sync`` (only that one) reports a failed writeback,
    as the kernel does; ``fail_writes``: writes fail. ``synced`` counts the syncs made and
    ``reported_to`` names the thread the writeback error went to."""

    def __init__(self) -> None:
        super().__init__()
        self.writeback_error = False
        self.fail_writes = False
        self.synced = 0
        self.reported_to: str | None = None

    def sync(self, fd: int) -> None:
        if self.writeback_error:
            self.writeback_error = False
            self.reported_to = threading.current_thread().name
            raise StorageIOError("fsync: Input/output error (test writeback)", path="?")
        self.synced += 1
        super().sync(fd)

    def pwritev(self, fd: int, parts: Any, position: int) -> int:
        if self.fail_writes:
            raise StorageIOError("write: Input/output error (test)", path="?")
        return super().pwritev(fd, parts, position)

    def pwrite(self, fd: int, data: Any, position: int) -> int:
        if self.fail_writes:
            raise StorageIOError("write: Input/output error (test)", path="?")
        return super().pwrite(fd, data, position)


class _Checkpoint:
    """``partition.sync()`` on a thread named ``checkpoint``, paused in the gap between
    ``flush_for_sync`` (under the write lock) and ``sync_published`` (outside it) until
    ``resume``."""

    def __init__(self, partition: Any) -> None:
        segment = partition._segments[-1]
        original = segment.sync_published
        self.in_gap = threading.Event()
        self.go = threading.Event()
        self.error: BaseException | None = None

        def paused(held: Any) -> None:
            self.in_gap.set()
            assert self.go.wait(WAIT_S)
            original(held)

        segment.sync_published = paused

        def run() -> None:
            try:
                partition.sync()
            except BaseException as error:  # handed to the test
                self.error = error

        self.thread = threading.Thread(target=run, name="checkpoint", daemon=True)
        self.thread.start()
        assert self.in_gap.wait(WAIT_S)

    def resume(self) -> BaseException | None:
        self.go.set()
        self.thread.join(WAIT_S)
        assert not self.thread.is_alive()
        return self.error


def test_a_fence_whose_cut_saw_the_lost_writeback_fails_the_checkpoint_sync(
    open_partition: Any, batch: Any
) -> None:
    fs = _FailingDisk()
    partition = open_partition(file_system=fs, fsync_policy=FsyncPolicy.NEVER)
    partition.append(batch(2))  # published: durable at the next checkpoint
    fs.writeback_error = True  # its pages' writeback failed in the kernel
    checkpoint = _Checkpoint(partition)
    fs.fail_writes = True
    with pytest.raises(StorageIOError):
        partition.append(batch(1, first=2))  # fails, fences, cuts the log and syncs it
    assert fs.reported_to == threading.current_thread().name, "the cut got the error"
    assert partition._fenced is not None
    error = checkpoint.resume()
    assert isinstance(error, PartitionFencedError), error
    with pytest.raises(PartitionFencedError):
        partition.sync()  # and every checkpoint after it until reopen


def test_a_failed_sync_of_a_cut_fails_every_later_sync_of_the_log(
    open_partition: Any, batch: Any
) -> None:
    fs = _FailingDisk()
    partition = two_records(open_partition, batch, fs, FsyncPolicy.NEVER)
    segment, held = flushed(partition)
    fs.writeback_error = True
    with pytest.raises(StorageIOError, match="test writeback"):
        segment.truncate_to(segment.size_bytes, segment.next_offset)
    with pytest.raises(StorageIOError, match="earlier sync"):
        segment.sync_published(held)  # the kernel would report success now
    with pytest.raises(StorageIOError, match="earlier sync"):
        segment.sync()


def test_a_fence_in_the_gap_fails_the_checkpoint_sync_that_succeeded(
    open_partition: Any, batch: Any
) -> None:
    fs = _FailingDisk()
    partition = two_records(open_partition, batch, fs, FsyncPolicy.NEVER)
    checkpoint = _Checkpoint(partition)
    fs.fail_writes = True
    with pytest.raises(StorageIOError):
        partition.append(batch(1, first=2))
    assert partition._fenced is not None
    synced = fs.synced
    error = checkpoint.resume()
    assert fs.synced == synced + 1, "the checkpoint's fdatasync itself succeeded"
    assert isinstance(error, PartitionFencedError), error


def test_a_cut_after_a_failed_sync_is_still_synced(open_partition: Any, batch: Any) -> None:
    fs = _FailingDisk()
    partition = two_records(open_partition, batch, fs, FsyncPolicy.NEVER)
    segment = partition._segments[-1]
    fs.writeback_error = True
    with pytest.raises(StorageIOError):
        segment.sync()
    synced = fs.synced
    segment.truncate_to(segment.size_bytes, segment.next_offset)
    assert fs.synced == synced + 1, "the cut is made durable although it acknowledges nothing"
    with pytest.raises(StorageIOError, match="earlier sync"):
        segment.sync()
