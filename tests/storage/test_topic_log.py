"""Tests of storage/topic_log.py: routing, producer bindings, partitions, long polls."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from storage.clock import ManualClock
from storage.config import FsyncPolicy, TopicConfig
from storage.errors import (
    InvalidParameterValueError,
    LimitExceededError,
    ObjectNotInPrerequisiteStateError,
    PartitionInactiveError,
)
from storage.fs import FileSystem
from storage.partition_log import DUPLICATE, WRITTEN
from storage.record_batch import build_wire_batch
from storage.topic_log import TopicLog

OpenTopic = Callable[..., TopicLog]


@pytest.fixture
def open_topic(tmp_path: Any, fs: FileSystem, clock: ManualClock) -> Iterator[OpenTopic]:
    """Create (first call) or reopen a topic in ``tmp_path``; closed at teardown."""
    opened: list[TopicLog] = []
    directory = os.path.join(str(tmp_path), "t0000000001")

    def open_(partition_count: int | None = None, **settings: Any) -> TopicLog:
        create = partition_count is not None
        topic = TopicLog(fs, directory, "t0000000001", clock, create=create)
        if create:
            settings.setdefault("fsync_policy", FsyncPolicy.NEVER)
            topic.create(TopicConfig(partition_count=partition_count, **settings))
        opened.append(topic)
        return topic

    yield open_
    for topic in opened:
        topic.close()


def _send(
    topic: TopicLog, producers: list[str | None], seq_nos: list[int | None] | None = None
) -> Any:
    data = [f"m{i}".encode() for i in range(len(producers))]
    return topic.append(build_wire_batch(data, seq_no=seq_nos, producer_id=producers))


def test_new_producers_are_bound_round_robin(open_topic: OpenTopic) -> None:
    topic = open_topic(3)
    placed = [int(_send(topic, [name], [1]).partitions[0]) for name in "abcde"]
    assert placed == [0, 1, 2, 0, 1]


def test_new_producers_in_one_batch_are_bound_in_order_of_appearance(
    open_topic: OpenTopic,
) -> None:
    topic = open_topic(3)
    result = _send(topic, ["x", "y", "x", "z", "y"], [1, 1, 2, 1, 2])
    assert result.partitions.tolist() == [0, 1, 0, 2, 1]
    assert result.status.tolist() == [WRITTEN] * 5
    assert result.offsets.tolist() == [0, 0, 1, 0, 1]


def test_a_bound_producer_stays_on_its_partition(open_topic: OpenTopic) -> None:
    topic = open_topic(2)
    first = int(_send(topic, ["p"], [1]).partitions[0])
    _send(topic, ["q"], [1])
    for seq_no in range(2, 6):
        assert int(_send(topic, ["p"], [seq_no]).partitions[0]) == first


def test_binding_survives_reopen(open_topic: OpenTopic) -> None:
    topic = open_topic(3)
    placed = {name: int(_send(topic, [name], [1]).partitions[0]) for name in "abc"}
    topic.close()
    again = open_topic()
    for name in "cba":
        result = _send(again, [name], [1])
        assert int(result.partitions[0]) == placed[name]
        assert result.status.tolist() == [DUPLICATE]


def test_message_group_routes_when_there_is_no_producer(open_topic: OpenTopic) -> None:
    topic = open_topic(3)
    batch = build_wire_batch([b"a", b"b", b"c"], message_group_id=["g", "h", "g"])
    result = topic.append(batch)
    assert result.partitions.tolist() == [0, 1, 0]
    assert result.written_count == 3


def test_keyless_messages_spread_round_robin(open_topic: OpenTopic) -> None:
    topic = open_topic(2)
    placed = [int(_send(topic, [None, None]).partitions[0]) for _ in range(4)]
    assert placed == [0, 1, 0, 1]


def test_resend_through_the_topic_reports_duplicates(open_topic: OpenTopic) -> None:
    topic = open_topic(2)
    _send(topic, ["a"], [1])
    first = _send(topic, ["p", "p", "a"], [1, 2, 2])
    again = _send(topic, ["p", "a", "p"], [2, 2, 3])
    assert again.status.tolist() == [DUPLICATE, DUPLICATE, WRITTEN]
    assert again.offsets.tolist()[:2] == [first.offsets[1], first.offsets[2]]
    assert (again.written_count, again.duplicate_count) == (1, 2)


def test_last_seq_no_lets_a_producer_continue_after_restart(open_topic: OpenTopic) -> None:
    topic = open_topic(2)
    _send(topic, ["other"], [1])
    _send(topic, ["p", "p"], [41, 42])
    topic.close()
    again = open_topic()
    assert again.last_seq_no("p") == 42
    continued = _send(again, ["p"], [again.last_seq_no("p") + 1])  # type: ignore[operator]
    assert continued.status.tolist() == [WRITTEN]


def test_last_seq_no_of_an_unknown_producer_is_none(open_topic: OpenTopic) -> None:
    assert open_topic(2).last_seq_no("nobody") is None


def test_expired_producer_is_written_again(open_topic: OpenTopic, clock: ManualClock) -> None:
    topic = open_topic(2)
    first = _send(topic, ["p"], [1])
    clock.advance(seconds=14 * 24 * 3600)
    again = _send(topic, ["p"], [1])
    assert again.status.tolist() == [WRITTEN]
    assert int(again.partitions[0]) in topic.active_partition_ids()
    assert topic.partition(int(first.partitions[0])).end_offset >= 1


def test_expired_producer_may_move_to_another_partition_after_reopen(
    open_topic: OpenTopic, clock: ManualClock
) -> None:
    topic = open_topic(2)
    assert int(_send(topic, ["p"], [1]).partitions[0]) == 0
    topic.close()
    clock.advance(seconds=15 * 24 * 3600)
    again = open_topic()
    _send(again, [None])  # a keyless message takes partition 0
    result = _send(again, ["p"], [1])
    assert result.status.tolist() == [WRITTEN] and int(result.partitions[0]) == 1


def test_explicit_partition_skips_routing(open_topic: OpenTopic) -> None:
    topic = open_topic(3)
    result = topic.append(build_wire_batch([b"a", b"b"], producer_id="p", seq_no=[1, 2]), 2)
    assert result.partitions.tolist() == [2, 2]
    with pytest.raises(InvalidParameterValueError, match="no partition 7"):
        topic.append(build_wire_batch([b"a"]), 7)


def test_read_goes_to_the_partition(open_topic: OpenTopic) -> None:
    topic = open_topic(2)
    topic.append(build_wire_batch([b"a", b"b"]), 1)
    assert topic.read(1, 1, max_messages=5).batches[0].column("data").to_pylist() == [b"b"]
    assert topic.read(0, 0).batches == []


def test_alter_adds_partitions_and_routes_new_producers_there(open_topic: OpenTopic) -> None:
    topic = open_topic(1)
    _send(topic, ["a"], [1])
    topic.alter(TopicConfig(partition_count=3, fsync_policy=FsyncPolicy.NEVER))
    assert topic.partition_ids() == [0, 1, 2]
    placed = {int(_send(topic, [name], [1]).partitions[0]) for name in "bcd"}
    assert placed == {0, 1, 2}
    topic.close()
    assert open_topic().partition_ids() == [0, 1, 2]


def test_alter_cannot_remove_partitions(open_topic: OpenTopic) -> None:
    topic = open_topic(2)
    with pytest.raises(InvalidParameterValueError, match="not removed"):
        topic.alter(TopicConfig(partition_count=1))


def test_inactive_partition_is_read_only_and_skipped_by_routing(open_topic: OpenTopic) -> None:
    topic = open_topic(2)
    topic.append(build_wire_batch([b"old"]), 0)
    topic.mark_inactive(0, (1,))
    assert topic.active_partition_ids() == [1]
    assert topic.partition_info(0).children == (1,)
    with pytest.raises(PartitionInactiveError):
        topic.append(build_wire_batch([b"a"]), 0)
    assert {int(_send(topic, [name], [1]).partitions[0]) for name in "abc"} == {1}
    assert topic.read(0, 0).message_count == 1
    topic.close()
    again = open_topic()
    assert again.active_partition_ids() == [1] and not again.partition(0).active


def test_split_records_the_parent_on_each_child_across_reopen(open_topic: OpenTopic) -> None:
    topic = open_topic(3)
    assert not topic.has_lineage()
    topic.mark_inactive(0, (1, 2))
    assert [topic.partition_info(i).parent for i in (0, 1, 2)] == [None, 0, 0]
    assert topic.has_lineage()
    topic.close()
    again = open_topic()
    assert [again.partition_info(i).parent for i in (0, 1, 2)] == [None, 0, 0]
    assert again.has_lineage()
    assert again.partition_info(0).children == (1, 2)


def test_split_refuses_a_torn_lineage(open_topic: OpenTopic) -> None:
    topic = open_topic(3)
    topic.mark_inactive(0, (1,))
    with pytest.raises(ObjectNotInPrerequisiteStateError, match="already has parent 0"):
        topic.mark_inactive(2, (1,))
    with pytest.raises(InvalidParameterValueError, match="cannot be a child"):
        topic.mark_inactive(2, (7,))
    with pytest.raises(InvalidParameterValueError, match="cannot be a child"):
        topic.mark_inactive(2, (2,))
    assert topic.partition_info(2).active and topic.partition_info(2).children == ()
    assert topic.partition_info(1).parent == 0


def test_producer_bound_to_an_inactive_partition_moves(open_topic: OpenTopic) -> None:
    topic = open_topic(2)
    assert int(_send(topic, ["p"], [1]).partitions[0]) == 0
    topic.mark_inactive(0, (1,))
    assert int(_send(topic, ["p"], [2]).partitions[0]) == 1


def test_active_partition_cannot_be_removed(open_topic: OpenTopic) -> None:
    topic = open_topic(2)
    with pytest.raises(ObjectNotInPrerequisiteStateError):
        topic.remove_partition(0)
    topic.mark_inactive(0, (1,))
    topic.remove_partition(0)
    assert topic.partition_ids() == [1]
    assert not os.path.exists(os.path.join(topic.directory, "p0"))


def test_wait_for_any_is_woken_by_an_append_to_any_partition(open_topic: OpenTopic) -> None:
    topic = open_topic(3)
    writer = threading.Timer(0.05, lambda: topic.append(build_wire_batch([b"a"]), 2))
    started = time.monotonic()
    writer.start()
    try:
        assert topic.wait_for_any({0: 0, 2: 0}, timeout_s=0.45)
    finally:
        writer.join()
    assert time.monotonic() - started < 0.4


def test_wait_for_any_times_out(open_topic: OpenTopic) -> None:
    topic = open_topic(2)
    topic.append(build_wire_batch([b"a"]), 1)
    started = time.monotonic()
    assert not topic.wait_for_any({0: 0, 1: 1}, timeout_s=0.1)
    assert 0.09 <= time.monotonic() - started < 0.4
    assert topic.wait_for_any({1: 0}, timeout_s=0.1)


def test_wait_for_any_over_the_limit_raises_54000(open_topic: OpenTopic) -> None:
    with pytest.raises(LimitExceededError):
        open_topic(1).wait_for_any({0: 0}, timeout_s=10_000)


def test_config_survives_reopen(open_topic: OpenTopic) -> None:
    open_topic(2, segment_bytes=4096, retention_ms=None, retention_bytes=10_000).close()
    config = open_topic().config
    assert (config.partition_count, config.segment_bytes) == (2, 4096)
    assert (config.retention_ms, config.retention_bytes) == (None, 10_000)
    assert config.fsync_policy is FsyncPolicy.NEVER


def test_mixed_batch_results_come_back_in_input_order(open_topic: OpenTopic) -> None:
    topic = open_topic(2)
    batch = build_wire_batch(
        [b"0", b"1", b"2", b"3"], producer_id=["a", "b", "a", "b"], seq_no=[1, 1, 2, 2]
    )
    result = topic.append(batch)
    for row, (partition, offset) in enumerate(
        zip(result.partitions.tolist(), result.offsets.tolist(), strict=True)
    ):
        read = topic.read(partition, offset, max_messages=1).batches[0]
        assert read.column("data").to_pylist() == [str(row).encode()]
