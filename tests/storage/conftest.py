"""Shared fixtures for the storage tests: a manual clock, a private file system, partitions.

Every test gets its own ``FileSystem`` so that fsync counters start at zero
and no test sees another's counts. Helpers that tests call are handed out as
fixtures (``open_partition``, ``read_all``...) so no test imports this module.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
import pytest

from storage.clock import ManualClock
from storage.config import FsyncPolicy, TopicConfig
from storage.errors import StorageIOError
from storage.fs import FileSystem
from storage.partition_log import PartitionLog
from storage.record_batch import build_wire_batch
from storage.topic_log import TopicLog


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def fs() -> FileSystem:
    return FileSystem()


@pytest.fixture
def partition_dir(tmp_path: Any) -> str:
    return os.path.join(str(tmp_path), "p0")


class _FailingSync(FileSystem):
    """A file system whose ``sync`` fails (``StorageIOError``) while ``fail`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.fail = False

    def sync(self, fd: int) -> None:
        if self.fail:
            raise StorageIOError("could not fsync (test)", path="?")
        super().sync(fd)


@pytest.fixture
def failing_sync() -> FileSystem:
    """A fresh file system whose fsyncs fail once the test sets its ``fail`` to True."""
    return _FailingSync()


@pytest.fixture
def open_partition(
    fs: FileSystem, clock: ManualClock, partition_dir: str
) -> Iterator[Callable[..., PartitionLog]]:
    """Open a ``PartitionLog`` (default: ``partition_dir``, NEVER fsync); closed at teardown."""
    opened: list[PartitionLog] = []

    def open_(
        config: TopicConfig | None = None,
        *,
        directory: str | None = None,
        file_system: FileSystem | None = None,
        **settings: Any,
    ) -> PartitionLog:
        if config is None:
            settings.setdefault("fsync_policy", FsyncPolicy.NEVER)
            config = TopicConfig(**settings).validate()
        partition = PartitionLog(file_system or fs, directory or partition_dir, 0, config, clock)
        opened.append(partition)
        return partition

    yield open_
    for partition in opened:
        partition.close()


@pytest.fixture
def topic(tmp_path: Any, fs: FileSystem, clock: ManualClock) -> Iterator[TopicLog]:
    """Topic ``t1`` of 4 partitions with GROUP fsync (the keyless append tests); closed
    at teardown."""
    log = TopicLog(fs, os.path.join(str(tmp_path), "t1"), "t1", clock, create=True)
    log.create(TopicConfig(partition_count=4, fsync_policy=FsyncPolicy.GROUP))
    yield log
    log.close()


def make_batch(
    count: int = 1,
    *,
    first: int = 0,
    size_bytes: int = 16,
    producer: str | None = None,
    seq_nos: list[int | None] | None = None,
    **columns: Any,
) -> pa.RecordBatch:
    """A wire batch of ``count`` messages ``b"m<first+i>"`` padded to ``size_bytes``."""
    data = [f"m{first + i}".encode().ljust(size_bytes, b".") for i in range(count)]
    return build_wire_batch(data, seq_no=seq_nos, producer_id=producer, **columns)


@pytest.fixture
def batch() -> Callable[..., pa.RecordBatch]:
    return make_batch


def read_all_rows(partition: PartitionLog, start_offset: int = 0) -> list[dict[str, Any]]:
    """Every message from ``start_offset`` to the visible end, as Python dicts."""
    rows: list[dict[str, Any]] = []
    offset = start_offset
    for _ in range(100_000):  # bounded: each round reads at least one message
        result = partition.read(offset, max_messages=10_000)
        for read_batch in result.batches:
            rows.extend(read_batch.to_pylist())
        if result.next_offset >= result.end_offset or not result.batches:
            return rows
        offset = result.next_offset
    raise AssertionError("read_all did not reach the end")


@pytest.fixture
def read_all() -> Callable[..., list[dict[str, Any]]]:
    return read_all_rows
