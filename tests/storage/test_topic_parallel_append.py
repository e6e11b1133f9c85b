"""A statement spreading over many partitions appends to them concurrently (issue 14, Scale).

Each partition's share is that partition's own append (its group commit, its sync
before its publish); the shares' syncs overlap instead of running one after another.
The result is the same as appending share by share: every message's partition and
offset, in the batch's order; a failing share fails the append after the others were
written.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

import pytest

from storage import topic_log
from storage.clock import ManualClock
from storage.config import FsyncPolicy, TopicConfig
from storage.errors import StorageIOError
from storage.fs import FileSystem
from storage.partition_log import PartitionLog
from storage.record_batch import build_wire_batch
from storage.topic_log import PARALLEL_SHARES_MIN, TopicLog


def _topic(tmp_path: Any, fs: FileSystem, clock: ManualClock, policy: FsyncPolicy) -> TopicLog:
    topic = TopicLog(fs, os.path.join(str(tmp_path), "t1"), "t1", clock, create=True)
    topic.create(TopicConfig(partition_count=8, fsync_policy=policy))
    return topic


def _batch(count: int) -> Any:
    producers = [f"p{i % 16}" for i in range(count)]
    seq_nos = [i // 16 + 1 for i in range(count)]
    data = [f"m{i}".encode() for i in range(count)]
    return build_wire_batch(data, seq_no=seq_nos, producer_id=producers)


def _threads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    names: list[str] = []
    original = PartitionLog.append

    def recorded(self: PartitionLog, batch: Any) -> Any:
        names.append(threading.current_thread().name)
        return original(self, batch)

    monkeypatch.setattr(PartitionLog, "append", recorded)
    return names


def test_shares_are_appended_by_the_pool_and_land_as_share_by_share(
    tmp_path: Any, fs: FileSystem, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    topic = _topic(tmp_path, fs, clock, FsyncPolicy.GROUP)
    try:
        names = _threads(monkeypatch)
        result = topic.append(_batch(64))
        assert len(names) == 8 >= PARALLEL_SHARES_MIN
        assert all(name.startswith("topic-append") for name in names)
        assert result.partitions.tolist() == [(i % 16) % 8 for i in range(64)]
        # offsets in each partition follow the batch's order
        for partition_id in range(8):
            mine = result.offsets[result.partitions == partition_id].tolist()
            assert mine == list(range(8))
            read = topic.read(partition_id, 0, max_messages=100)
            data = [m for b in read.batches for m in b.column("data").to_pylist()]
            assert data == [f"m{i}".encode() for i in range(64) if (i % 16) % 8 == partition_id]
    finally:
        topic.close()


def test_without_syncs_the_shares_are_appended_in_the_callers_thread(
    tmp_path: Any, fs: FileSystem, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    topic = _topic(tmp_path, fs, clock, FsyncPolicy.NEVER)
    try:
        names = _threads(monkeypatch)
        topic.append(_batch(64))
        assert names == [threading.current_thread().name] * 8
    finally:
        topic.close()


def test_a_failing_share_fails_the_append_after_the_others_are_written(
    tmp_path: Any, fs: FileSystem, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    topic = _topic(tmp_path, fs, clock, FsyncPolicy.GROUP)
    try:
        original = PartitionLog.append

        def failing(self: PartitionLog, batch: Any) -> Any:
            if self.partition_id == 3:
                raise StorageIOError("disk says no")
            return original(self, batch)

        monkeypatch.setattr(PartitionLog, "append", failing)
        with pytest.raises(StorageIOError, match="disk says no"):
            topic.append(_batch(64))
        ends = [topic.partition(p).end_offset for p in range(8)]
        assert ends == [8, 8, 8, 0, 8, 8, 8, 8]
    finally:
        topic.close()


def test_a_forked_child_appends_in_parallel_with_its_own_pool(
    tmp_path: Any, fs: FileSystem, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A pool of one thread, which the parent's append starts: its pool is full, so one
    # inherited as is would never start a thread in the child.
    monkeypatch.setattr(topic_log, "_append_pool", None)
    monkeypatch.setattr(topic_log, "APPEND_THREADS", 1)
    parent = _topic(tmp_path, fs, clock, FsyncPolicy.GROUP)
    try:
        parent.append(_batch(64))
        pid = os.fork()
        if pid == 0:  # the child: a pool inherited as is would never run the shares
            code = 1
            try:
                child_dir = os.path.join(str(tmp_path), "child")
                os.mkdir(child_dir)
                topic = _topic(child_dir, FileSystem(), clock, FsyncPolicy.GROUP)
                result = topic.append(_batch(64))
                topic.close()
                code = 0 if sorted(set(result.partitions.tolist())) == list(range(8)) else 2
            finally:
                os._exit(code)
        for _ in range(600):  # a guard against a hang, not a speed assertion
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            time.sleep(0.1)
        else:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail("the forked child's parallel append hung")
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        parent.close()
