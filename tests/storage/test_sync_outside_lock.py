"""A checkpoint's partition sync runs outside the partition's write lock (issue 14).

A checkpoint syncs every partition its transactions wrote, one after another; while
``PartitionLog.sync`` held the write lock through its ``fdatasync``, a spread publish
(which takes every partition's lock in turn) waited behind each sync, and a
1000-partition statement stalled ~0.8 s behind every checkpoint. Now the sync runs
outside the lock (``LogSegment.flush_for_sync`` / ``sync_published``): appends go on
while it syncs; a failed sync still fences the partition, and every later sync of that
log fails too (the kernel reports a failed writeback to one ``fdatasync`` only, so a
writer's sync after the checkpoint's could otherwise succeed over lost bytes).
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


class _BlockingSync(FileSystem):
    """``sync`` waits for ``release`` once ``block`` is set (``entered`` tells it has),
    and fails while ``fail`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.block = False
        self.fail = False
        self.entered = threading.Event()
        self.release = threading.Event()

    def sync(self, fd: int) -> None:
        if self.block:
            self.entered.set()
            assert self.release.wait(WAIT_S)
        if self.fail:
            raise StorageIOError("could not fsync (test)", path="?")
        super().sync(fd)


def _in_thread(target: Any) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            target()
        except BaseException as error:  # handed to the test
            errors.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, errors


def test_appends_go_on_while_a_checkpoint_syncs(
    open_partition: Any, batch: Any, read_all: Any
) -> None:
    fs = _BlockingSync()
    partition = two_records(open_partition, batch, fs, FsyncPolicy.NEVER)
    fs.block = True
    syncing, sync_errors = _in_thread(partition.sync)
    assert fs.entered.wait(WAIT_S)
    appending, append_errors = _in_thread(lambda: partition.append(batch(3, first=2)))
    appending.join(WAIT_S)
    assert not appending.is_alive(), "the append waited for the sync"
    assert syncing.is_alive(), "the sync is still blocked"
    # A roll now seals (syncs, then closes) the segment the checkpoint is syncing: its
    # sync waits for the checkpoint's, and its close leaves the descriptor to it.
    rolling, roll_errors = _in_thread(partition.roll)
    fs.release.set()
    syncing.join(WAIT_S)
    rolling.join(WAIT_S)
    assert not syncing.is_alive() and not rolling.is_alive()
    assert not sync_errors and not append_errors and not roll_errors
    fs.block = False
    partition.append(batch(1, first=5))
    partition.sync()
    assert [row["offset"] for row in read_all(partition)] == [0, 1, 2, 3, 4, 5]


def test_after_a_failed_sync_every_later_sync_of_the_log_fails(
    open_partition: Any, batch: Any
) -> None:
    fs = _BlockingSync()
    partition = two_records(open_partition, batch, fs, FsyncPolicy.NEVER)
    segment, held = flushed(partition, locked=False)
    fs.fail = True
    with pytest.raises(StorageIOError):
        segment.sync_published(held)  # a checkpoint's sync, before it fences
    fs.fail = False  # the kernel would now report success: the error went to that sync
    with pytest.raises(StorageIOError, match="earlier sync"):
        segment.sync()  # a writer's group commit syncing before the fence
    with pytest.raises(StorageIOError, match="earlier sync"):
        segment.seal(durable=True)


def test_a_failed_checkpoint_sync_fences_the_partition_and_no_sync_after_it_passes(
    open_partition: Any, batch: Any
) -> None:
    fs = _BlockingSync()
    partition = two_records(open_partition, batch, fs, FsyncPolicy.NEVER)
    segment = partition._segments[-1]
    fs.fail = True
    with pytest.raises(StorageIOError):
        partition.sync()
    fs.fail = False
    with pytest.raises(PartitionFencedError):
        partition.append(batch(1, first=2))
    with pytest.raises(PartitionFencedError):
        partition.sync()
    with pytest.raises(StorageIOError, match="earlier sync"):
        segment.sync()
    assert partition.end_offset == 2


def test_a_group_commit_after_a_failed_checkpoint_sync_is_not_acknowledged(
    open_partition: Any, batch: Any
) -> None:
    fs = _BlockingSync()
    partition = two_records(open_partition, batch, fs, FsyncPolicy.ALWAYS)
    segment, held = flushed(partition)
    fs.fail = True
    with pytest.raises(StorageIOError):
        segment.sync_published(held)
    fs.fail = False
    with pytest.raises(StorageIOError):
        partition.append(batch(1, first=2))  # its own sync fails: fenced, not acked
    assert partition.end_offset == 2
    with pytest.raises(PartitionFencedError):
        partition.append(batch(1, first=2))
