"""Keyless batches join the group-commit round in progress (``TopicLog._keyless_partition``).

Durable produce by many connections (issue 14, ``produce.durable.c16``): a keyless
one-message statement went to the next partition round-robin, so 16 concurrent ones
spread over 4 partitions' group commits and shared ~2 messages per fsync. Now a keyless
batch goes to the partition of the last keyless batch while a round is in progress there
(it would wait for a sync anyway), up to ``KEYLESS_JOIN_MESSAGES_MAX`` messages, then on
round-robin. Statements one after another never see a round in progress: round-robin as
before (``test_topic_log.test_keyless_messages_spread_round_robin``).
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from storage.clock import ManualClock
from storage.config import FsyncPolicy, TopicConfig
from storage.fs import FileSystem
from storage.group_commit import GroupCommitter, Request
from storage.partition_log import PartitionLog
from storage.record_batch import build_wire_batch
from storage.topic_log import KEYLESS_JOIN_MESSAGES_MAX, TopicLog


def test_a_committer_is_busy_exactly_while_a_round_runs() -> None:
    entered, release = threading.Event(), threading.Event()

    def flush(requests: list[Request]) -> None:
        entered.set()
        assert release.wait(10)
        for request in requests:
            request.result = "ok"

    committer = GroupCommitter(flush)
    assert not committer.busy
    worker = threading.Thread(target=committer.submit, args=("a",))
    worker.start()
    assert entered.wait(10)
    assert committer.busy
    release.set()
    worker.join(10)
    assert not worker.is_alive()
    assert not committer.busy


@pytest.fixture
def topic(tmp_path: Any, fs: FileSystem, clock: ManualClock) -> Iterator[TopicLog]:
    log = TopicLog(fs, os.path.join(str(tmp_path), "t1"), "t1", clock, create=True)
    log.create(TopicConfig(partition_count=4, fsync_policy=FsyncPolicy.GROUP))
    yield log
    log.close()


@pytest.fixture
def busy(monkeypatch: pytest.MonkeyPatch) -> set[int]:
    """Partitions whose group commit is made to look in progress."""
    committing: set[int] = set()
    monkeypatch.setattr(
        PartitionLog, "committing", property(lambda log: log.partition_id in committing)
    )
    return committing


def _partition(topic: TopicLog, messages: int) -> int:
    targets = topic.route(build_wire_batch([b"m"] * messages))
    assert len(set(targets.tolist())) == 1  # a keyless statement stays together
    return int(targets[0])


def test_keyless_batches_join_a_round_in_progress_up_to_the_cap(
    topic: TopicLog, busy: set[int]
) -> None:
    first = _partition(topic, 2)
    assert _partition(topic, 2) != first  # no round in progress: round-robin
    last = _partition(topic, 2)
    busy.add(last)
    joined = [_partition(topic, 2) for _ in range(KEYLESS_JOIN_MESSAGES_MAX // 2 - 1)]
    assert joined == [last] * len(joined)
    moved = _partition(topic, 2)  # the cap reached: on to the next partition
    assert moved != last
    busy.add(moved)
    assert _partition(topic, 2) == moved
    busy.clear()
    assert _partition(topic, 2) != moved


def test_a_busy_partition_that_keyless_batches_did_not_pick_last_is_not_joined(
    topic: TopicLog, busy: set[int]
) -> None:
    busy.update(range(4))
    picked = _partition(topic, 1)  # no keyless batch before: round-robin
    busy.discard(picked)
    assert _partition(topic, 1) != picked


def test_an_inactive_partition_is_never_joined(
    topic: TopicLog, busy: set[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    last = _partition(topic, 1)
    busy.add(last)
    monkeypatch.setitem(topic._info, last, dataclasses.replace(topic._info[last], active=False))
    assert _partition(topic, 1) != last


def test_keyed_batches_are_not_affected(topic: TopicLog, busy: set[int]) -> None:
    last = _partition(topic, 1)
    busy.update(range(4))
    producers = [f"p{i}" for i in range(8)]
    bound = topic.route(build_wire_batch([b"m"] * 8, producer_id=producers)).tolist()
    assert len(set(bound)) == 4  # new producers are bound round-robin, not joined
    assert _partition(topic, 1) == last
