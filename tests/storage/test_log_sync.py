"""Many logs made durable by one sync of their file system (``storage.log_sync``).

The ledger copier syncs every partition it copied rows into; ``FileSystemSync.sync_logs``
does it with one ``syncfs`` where the file system offers it, and otherwise (a test file
system that models its syncs, a ``syncfs`` that reports a failure) with each log's own
sync, so that a failure still reaches the log it concerns and fences it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import storage.fs as fs_module
from storage import failpoints
from storage.config import FsyncPolicy
from storage.errors import PartitionFencedError, StorageIOError
from storage.fs import FileSystem
from storage.log_sync import FileSystemSync
from storage.partition_log import PartitionLog

# The kernel's: ``syncfs`` reports write-back failures from Linux 5.8 on (elsewhere the
# handle is never offered and every log syncs on its own, as the modelling test shows).
needs_syncfs = pytest.mark.skipif(fs_module._syncfs is None, reason="needs Linux >= 5.8 syncfs")


class _CountingSync(FileSystem):
    """Counts the syncs of single files; ``fail`` makes them fail."""

    def __init__(self) -> None:
        super().__init__()
        self.file_syncs = 0
        self.fail = False

    def sync(self, fd: int) -> None:
        self.file_syncs += 1
        if self.fail:
            raise StorageIOError("could not fsync (test)", path="?")
        super().sync(fd)


def _count_file_syncs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every ``FileSystem.sync`` from now on recorded (its descriptor) in the list returned
    (the handle was opened already: it still offers ``syncfs``)."""
    synced_files: list[int] = []
    real_sync = FileSystem.sync

    def counted(self: FileSystem, fd: int) -> None:
        synced_files.append(fd)
        real_sync(self, fd)

    monkeypatch.setattr(FileSystem, "sync", counted)
    return synced_files


@pytest.fixture
def logs(tmp_path: Any, open_partition: Any, batch: Any
         ) -> Callable[[FileSystem, int], list[PartitionLog]]:  # fmt: skip
    def make(fs: FileSystem, count: int) -> list[PartitionLog]:
        opened = []
        for number in range(count):
            log = open_partition(directory=os.path.join(str(tmp_path), f"p{number}"),
                                 file_system=fs, fsync_policy=FsyncPolicy.NEVER)  # fmt: skip
            log.append(batch(3))
            assert log.durable_end == 0  # NEVER: nothing synced yet
            opened.append(log)
        return opened

    return make


@pytest.fixture
def syncs(tmp_path: Any) -> Iterator[Callable[[FileSystem], FileSystemSync]]:
    made: list[FileSystemSync] = []

    def make(fs: FileSystem) -> FileSystemSync:
        made.append(FileSystemSync(fs, str(tmp_path)))
        return made[-1]

    yield make
    for handle in made:
        handle.close()


@needs_syncfs
def test_one_sync_of_the_file_system_makes_every_log_durable(logs: Any, syncs: Any) -> None:
    fs = FileSystem()
    together = syncs(fs)
    opened = logs(fs, 5)
    before = fs.fsync_count
    assert together.sync_logs(opened) == {}
    assert fs.fsync_count - before == 1, "one syncfs, no fdatasync a log"
    assert together.together == 1 and together.fell_back == 0
    assert [log.durable_end for log in opened] == [3] * 5


def test_a_file_system_that_models_its_syncs_syncs_each_log(logs: Any, syncs: Any) -> None:
    fs = _CountingSync()
    together = syncs(fs)
    opened = logs(fs, 3)
    assert together.sync_logs(opened) == {}
    assert fs.file_syncs == 3 and together.together == 0
    assert [log.durable_end for log in opened] == [3] * 3


@needs_syncfs
def test_a_failed_syncfs_falls_back_to_each_logs_own_sync(
    logs: Any, syncs: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    fs = FileSystem()
    together = syncs(fs)
    opened = logs(fs, 3)
    synced_files = _count_file_syncs(monkeypatch)
    monkeypatch.setattr(fs_module, "_syncfs", lambda fd: -1)  # it reports a failure
    assert together.sync_logs(opened) == {}
    assert together.fell_back == 1 and together.together == 0
    assert len(synced_files) == 3, "each log synced on its own after the failure"
    assert [log.durable_end for log in opened] == [3] * 3


@needs_syncfs
def test_a_failure_reaches_the_log_it_concerns_and_fences_it(
    logs: Any, syncs: Any, batch: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    fs = FileSystem()
    together = syncs(fs)
    opened = logs(fs, 3)
    bad_fd = opened[1]._segments[-1]._shared.fd
    real_sync = FileSystem.sync

    def failing_one(self: FileSystem, fd: int) -> None:
        if fd == bad_fd:
            raise StorageIOError("could not fsync (test: lost write-back)", path="?")
        real_sync(self, fd)

    monkeypatch.setattr(fs_module, "_syncfs", lambda fd: -1)
    monkeypatch.setattr(FileSystem, "sync", failing_one)
    failed = together.sync_logs(opened)
    assert list(failed) == [opened[1].partition_id]
    assert isinstance(failed[opened[1].partition_id], StorageIOError)
    assert [log.durable_end for log in opened] == [3, 0, 3]
    with pytest.raises(PartitionFencedError):
        opened[1].append(batch(1))
    opened[0].append(batch(1))  # the others write on


@needs_syncfs
def test_a_log_whose_earlier_sync_failed_is_never_reported_synced(logs: Any, syncs: Any) -> None:
    fs = FileSystem()
    together = syncs(fs)
    opened = logs(fs, 2)
    segment = opened[0]._segments[-1]
    segment._sync_failed = StorageIOError("an earlier fdatasync failed (test)", path="?")
    failed = together.sync_logs(opened)
    assert list(failed) == [opened[0].partition_id]
    assert opened[0].durable_end == 0 and opened[1].durable_end == 3
    assert together.together == 1


@needs_syncfs
def test_a_fenced_log_is_reported_and_the_others_synced(logs: Any, syncs: Any) -> None:
    fs = FileSystem()
    together = syncs(fs)
    opened = logs(fs, 3)
    with opened[2].write_lock:
        opened[2].fence_for(StorageIOError("fenced (test)", path="?"))
    failed = together.sync_logs(opened)
    assert list(failed) == [opened[2].partition_id]
    assert isinstance(failed[opened[2].partition_id], PartitionFencedError)
    assert [log.durable_end for log in opened[:2]] == [3, 3]


@needs_syncfs
def test_a_log_on_another_file_system_is_synced_on_its_own(
    logs: Any, syncs: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    fs = FileSystem()
    together = syncs(fs)
    opened = logs(fs, 2)
    together._on_device[opened[1].directory] = False  # as if mounted elsewhere
    synced_files = _count_file_syncs(monkeypatch)
    assert together.sync_logs(opened) == {}
    assert len(synced_files) == 1 and together.together == 1
    assert [log.durable_end for log in opened] == [3, 3]


@needs_syncfs
def test_an_error_in_the_file_system_sync_ends_every_sync_begun(logs: Any, syncs: Any) -> None:
    """A failure raised by the ``syncfs`` step itself (a failpoint's error here) counts as
    one it reported: each log syncs on its own, none keeps its descriptor held."""
    fs = FileSystem()
    together = syncs(fs)
    opened = logs(fs, 3)
    failpoints.activate("fs.before_sync=error@1")  # the syncfs: the first sync of the call
    try:
        assert together.sync_logs(opened) == {}
    finally:
        failpoints.deactivate()
    assert together.fell_back == 1
    assert [log.durable_end for log in opened] == [3] * 3
    for log in opened:
        assert log._segments[-1]._shared.readers == 0, "the held descriptor was let go"
