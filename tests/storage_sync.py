"""The storage sync tests' shared setup (``tests/storage/test_sync_outside_lock.py``,
``tests/storage/test_fence_during_checkpoint_sync.py``): a partition on a test file system
holding two records, and its last segment flushed for a sync outside the lock."""

from __future__ import annotations

from typing import Any

from storage.config import FsyncPolicy
from storage.fs import FileSystem


def two_records(open_partition: Any, batch: Any, fs: FileSystem, policy: FsyncPolicy) -> Any:
    """A partition opened on ``fs`` with ``policy``, holding records 0 and 1."""
    partition = open_partition(file_system=fs, fsync_policy=policy)
    partition.append(batch(2))
    return partition


def flushed(partition: Any, *, locked: bool = True) -> tuple[Any, Any]:
    """The partition's last segment and what ``flush_for_sync`` handed out for a later
    ``sync_published`` (taken under the write lock unless ``locked`` is False)."""
    segment = partition._segments[-1]
    if locked:
        with partition._write_lock:
            held = segment.flush_for_sync()
    else:
        held = segment.flush_for_sync()
    assert held is not None
    return segment, held
