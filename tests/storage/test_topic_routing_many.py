"""Routing a batch of many producer ids over many partitions (issue 14, Scale).

A batch's keys are looked up in one pass over the partitions (each partition
intersects the batch's keys with its producer table), not once per key and
partition; the binding rule is unchanged: the active partition with the key's
newest live entry, else a round-robin binding in order of appearance.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from storage.clock import ManualClock
from storage.config import FsyncPolicy, TopicConfig
from storage.fs import FileSystem
from storage.producer_state import ProducerStateManager
from storage.record_batch import build_wire_batch
from storage.topic_log import TopicLog


def _topic(tmp_path: Any, fs: FileSystem, clock: ManualClock, partitions: int) -> TopicLog:
    topic = TopicLog(fs, os.path.join(str(tmp_path), "t1"), "t1", clock, create=True)
    topic.create(TopicConfig(partition_count=partitions, fsync_policy=FsyncPolicy.NEVER))
    return topic


def _batch(producers: list[str], seq_no: int) -> Any:
    data = [f"m{i}".encode() for i in range(len(producers))]
    return build_wire_batch(data, seq_no=[seq_no] * len(producers), producer_id=producers)


def test_a_batch_of_many_keys_costs_one_lookup_per_partition(
    tmp_path: Any, fs: FileSystem, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    topic = _topic(tmp_path, fs, clock, 20)
    try:
        producers = [f"p{i}" for i in range(100)]
        first = topic.append(_batch(producers, 1))
        lookups = []
        original = ProducerStateManager.live_entries

        def counted(self: ProducerStateManager, keys: set[str]) -> Any:
            lookups.append(len(keys))
            return original(self, keys)

        monkeypatch.setattr(ProducerStateManager, "live_entries", counted)
        again = topic.append(_batch(producers, 2))
        assert lookups == [100] * 20  # one per partition, with every key at once
        assert again.partitions.tolist() == first.partitions.tolist()
        assert first.partitions.tolist() == [i % 20 for i in range(100)]
    finally:
        topic.close()


def test_the_newest_entry_wins_when_a_key_is_in_two_partitions(
    tmp_path: Any, fs: FileSystem, clock: ManualClock
) -> None:
    topic = _topic(tmp_path, fs, clock, 4)
    try:
        topic.append(_batch(["p"], 1), 3)
        clock.advance(seconds=1)
        topic.append(_batch(["p"], 1), 1)  # newer: p is bound to partition 1 now
        result = topic.append(_batch(["q", "p", "r"], 2))
        assert result.partitions.tolist()[1] == 1
        clock.advance(seconds=1)
        topic.append(_batch(["p"], 5), 2)
        assert topic.partition_for_key("p") == 2
    finally:
        topic.close()


def test_expired_entries_do_not_bind(tmp_path: Any, fs: FileSystem, clock: ManualClock) -> None:
    topic = _topic(tmp_path, fs, clock, 3)
    try:
        topic.append(_batch(["p"], 1), 2)
        assert topic.partition(2).producers.live_entries({"p", "x"}).keys() == {"p"}
        clock.advance(seconds=15 * 24 * 3600)
        assert topic.partition(2).producers.live_entries({"p"}) == {}
        assert topic.partition_for_key("p") == 0  # round-robin again
    finally:
        topic.close()
