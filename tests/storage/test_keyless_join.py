"""Keyless batches join a group-commit round that has company (``TopicLog._keyless_partition``).

Durable produce by many connections (issue 14, ``produce.durable.c16``): a keyless
one-message statement went to the next partition round-robin, so 16 concurrent ones
spread over 4 partitions' group commits and shared ~2 messages per fsync. Now a keyless
batch goes to the partition of the last keyless batch while appends there already wait
for its next round (it shares that sync), up to ``KEYLESS_JOIN_MESSAGES_MAX`` messages,
then on round-robin. Statements one after another never find appends waiting:
round-robin as before (``test_topic_log.test_keyless_messages_spread_round_robin``).
A round that runs with nobody waiting yet is joined as well while at least
``KEYLESS_JOIN_BUSY_APPENDS`` other appends of the topic are in progress.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from typing import Any

import pytest

from storage.clock import ManualClock
from storage.config import FsyncPolicy, TopicConfig
from storage.fs import FileSystem
from storage.group_commit import GroupCommitter, Request
from storage.limits import KEYLESS_JOIN_BUSY_APPENDS, KEYLESS_JOIN_MESSAGES_MAX
from storage.partition_log import PartitionLog
from storage.record_batch import build_wire_batch
from storage.topic_log import TopicLog


def test_a_committer_counts_the_requests_waiting_for_its_next_round() -> None:
    entered, release = threading.Event(), threading.Event()

    def flush(requests: list[Request]) -> None:
        entered.set()
        assert release.wait(10)
        for request in requests:
            request.result = "ok"

    committer = GroupCommitter(flush)
    assert committer.waiting == 0
    leader = threading.Thread(target=committer.submit, args=("a",))
    leader.start()
    assert entered.wait(10)
    assert committer.waiting == 0  # a round runs, nobody waits for the next one
    follower = threading.Thread(target=committer.submit, args=("b",))
    follower.start()
    for _ in range(10_000):  # until it is queued (no timing: a bounded poll)
        if committer.waiting:
            break
        threading.Event().wait(0.001)
    assert committer.waiting == 1
    release.set()
    leader.join(10)
    follower.join(10)
    assert not leader.is_alive() and not follower.is_alive()
    assert committer.waiting == 0


@pytest.fixture
def busy(monkeypatch: pytest.MonkeyPatch) -> set[int]:
    """Partitions made to look as if appends waited for their next group-commit round."""
    waiting: set[int] = set()
    monkeypatch.setattr(
        PartitionLog, "sync_waiters", property(lambda log: int(log.partition_id in waiting))
    )
    return waiting


def _partition(topic: TopicLog, messages: int) -> int:
    targets = topic.route(build_wire_batch([b"m"] * messages))
    assert len(set(targets.tolist())) == 1  # a keyless statement stays together
    return int(targets[0])


def test_keyless_batches_join_a_round_in_progress_up_to_the_cap(
    topic: TopicLog, busy: set[int]
) -> None:
    first = _partition(topic, 2)
    assert _partition(topic, 2) != first  # nobody waits for a sync: round-robin
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


def test_joins_onto_a_partition_busy_with_keyed_writes_keep_the_spread_even(
    tmp_path, monkeypatch
) -> None:
    """Partition 0 always has appends waiting (a hot keyed producer bound there): keyless
    batches join it at most one run of the cap at a time and otherwise fill the others, so
    no partition runs ahead of the average by more than one run of the cap, so each gets
    about a quarter (joining by waiters alone gave partition 0 ~95 %)."""
    log = TopicLog(FileSystem(), os.path.join(str(tmp_path), "t1"), "t1", ManualClock(),
                   create=True)  # fmt: skip
    log.create(TopicConfig(partition_count=4, fsync_policy=FsyncPolicy.GROUP))
    monkeypatch.setattr(PartitionLog, "sync_waiters",
                        property(lambda p: int(p.partition_id == 0)))  # fmt: skip
    counts = [0, 0, 0, 0]
    for _ in range(6400):
        counts[int(log.route(build_wire_batch([b"m"]))[0])] += 1
    log.close()
    assert counts[0] - sum(counts) / 4 <= KEYLESS_JOIN_MESSAGES_MAX, counts
    assert counts[0] / sum(counts) < 0.3, counts


# -- a running round joined while the topic is busy (KEYLESS_JOIN_BUSY_APPENDS) --------
def test_a_committer_says_whether_a_round_runs() -> None:
    entered, release = threading.Event(), threading.Event()

    def flush(requests: list[Request]) -> None:
        entered.set()
        assert release.wait(10)

    committer = GroupCommitter(flush)
    assert not committer.running
    leader = threading.Thread(target=committer.submit, args=("a",))
    leader.start()
    assert entered.wait(10)
    assert committer.running and committer.waiting == 0  # running, nobody queued
    release.set()
    leader.join(10)
    assert not leader.is_alive()
    assert not committer.running


@pytest.fixture
def running(monkeypatch: pytest.MonkeyPatch) -> set[int]:
    """Partitions made to look as if a group-commit round ran there (nobody waiting)."""
    syncing: set[int] = set()
    monkeypatch.setattr(
        PartitionLog, "sync_running", property(lambda log: log.partition_id in syncing)
    )
    return syncing


def test_a_running_round_is_joined_only_while_the_topic_is_busy(
    topic: TopicLog, running: set[int]
) -> None:
    last = _partition(topic, 1)
    running.add(last)
    topic._appending = KEYLESS_JOIN_BUSY_APPENDS - 1  # few appends: a lone round, not joined
    assert _partition(topic, 1) != last
    last = _partition(topic, 1)
    running.add(last)
    topic._appending = KEYLESS_JOIN_BUSY_APPENDS  # busy: the next round will have company
    joined = [_partition(topic, 1) for _ in range(KEYLESS_JOIN_MESSAGES_MAX - 1)]
    assert joined == [last] * len(joined)
    assert _partition(topic, 1) != last  # the cap holds as for waiting rounds
    running.clear()
    last = _partition(topic, 1)
    assert _partition(topic, 1) != last  # busy, but no round runs there: round-robin


def test_appends_in_progress_are_counted_until_they_end(
    topic: TopicLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[int] = []

    def append(log: PartitionLog, batch: Any) -> Any:
        seen.append(topic._appending)
        raise OSError("refused")  # an append that fails still leaves the count

    monkeypatch.setattr(PartitionLog, "append", append)
    assert topic._appending == 0
    with pytest.raises(OSError):
        topic.append(build_wire_batch([b"m"]))
    with pytest.raises(OSError):
        topic.append(build_wire_batch([b"m"]), 2)
    assert seen == [1, 1]
    assert topic._appending == 0
