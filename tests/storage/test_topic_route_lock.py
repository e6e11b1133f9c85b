"""Routing holds the topic's lock only for its bookkeeping (issue 14, durable produce).

Arrow compute calls release the GIL. Made under ``TopicLog._lock``, every
concurrent statement queued on the lock behind one thread waiting to get the
GIL back: 16 wire producers spent most of their time on that line (measured:
923-1136 msgs/s before, 1041-1539 after, H10's report). Keyless batches (no
producer id, no message group) need no Arrow call at all: the next partition
round-robin. These tests fail if the lock is held across an Arrow call again.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

import storage.topic_log as topic_log_module
from storage.clock import ManualClock
from storage.config import FsyncPolicy, TopicConfig
from storage.fs import FileSystem
from storage.record_batch import build_wire_batch
from storage.topic_log import TopicLog


def _topic(tmp_path: Any, fs: FileSystem, clock: ManualClock) -> TopicLog:
    topic = TopicLog(fs, os.path.join(str(tmp_path), "t1"), "t1", clock, create=True)
    topic.create(TopicConfig(partition_count=4, fsync_policy=FsyncPolicy.NEVER))
    return topic


class _Watched:
    """``pyarrow.compute`` as topic_log sees it, noting whether the topic's lock was
    held during each call."""

    def __init__(self, real: Any, topic: TopicLog) -> None:
        self._real, self._topic = real, topic
        self.calls: list[tuple[str, bool]] = []

    def __getattr__(self, name: str) -> Any:
        function = getattr(self._real, name)

        def watched(*args: Any, **kwargs: Any) -> Any:
            self.calls.append((name, self._topic._lock.locked()))
            return function(*args, **kwargs)

        return watched


def test_keyed_routing_makes_no_arrow_call_under_the_lock(
    tmp_path: Any, fs: FileSystem, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    topic = _topic(tmp_path, fs, clock)
    try:
        watched = _Watched(topic_log_module.pc, topic)
        monkeypatch.setattr(topic_log_module, "pc", watched)
        batch = build_wire_batch([b"a", b"b", b"c"], seq_no=[1, 1, None],
                                 producer_id=["p1", "p2", None])  # fmt: skip
        targets = topic.route(batch)
        assert {name for name, _ in watched.calls} >= {"coalesce", "unique"}
        assert not [name for name, locked in watched.calls if locked]
        assert targets[0] != targets[1]  # two new keys bound round-robin
        assert topic.route(batch)[:2].tolist() == targets[:2].tolist()  # bindings kept
    finally:
        topic.close()


def test_keyless_routing_is_round_robin_without_arrow_calls(
    tmp_path: Any, fs: FileSystem, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    topic = _topic(tmp_path, fs, clock)
    try:
        watched = _Watched(topic_log_module.pc, topic)
        monkeypatch.setattr(topic_log_module, "pc", watched)
        batch = build_wire_batch([b"a", b"b"])
        firsts = []
        for _ in range(4):
            targets = topic.route(batch)
            assert len(set(targets.tolist())) == 1  # a keyless statement stays together
            firsts.append(int(targets[0]))
        assert sorted(firsts) == [0, 1, 2, 3]
        assert watched.calls == []
    finally:
        topic.close()
