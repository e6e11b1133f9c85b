"""Tests of storage/cleaner.py: retention by time and size, guards, inactive partitions."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from storage import failpoints
from storage.cleaner import NoGuard, apply_retention, retention_limit
from storage.clock import ManualClock
from storage.config import FsyncPolicy, TopicConfig
from storage.errors import StorageIOError
from storage.fs import FileSystem
from storage.record_batch import build_wire_batch
from storage.topic_log import TopicLog

HOUR_S = 3600


class FixedGuard:
    """Protects everything at or above ``offset`` in every partition."""

    def __init__(self, offset: int | None) -> None:
        self.offset = offset

    def protected_offset(self, topic_id: str, partition_id: int) -> int | None:
        return self.offset


@pytest.fixture
def make_topic(tmp_path: Any, clock: ManualClock) -> Iterator[Any]:
    topics: list[TopicLog] = []

    def make(**settings: Any) -> TopicLog:
        settings.setdefault("fsync_policy", FsyncPolicy.NEVER)
        directory = os.path.join(str(tmp_path), f"t{len(topics)}")
        topic = TopicLog(FileSystem(), directory, "t", clock, create=True)
        topic.create(TopicConfig(**settings))
        topics.append(topic)
        return topic

    yield make
    for topic in topics:
        topic.close()


def _write_segments(
    topic: TopicLog, clock: ManualClock, segments: int, per_segment: int = 5, partition: int = 0
) -> None:
    """Write ``segments`` sealed segments an hour apart, then one message in the active one."""
    log = topic.partition(partition)
    for _ in range(segments):
        log.append(build_wire_batch([b"x" * 100] * per_segment))
        log.roll()
        clock.advance(seconds=HOUR_S)
    log.append(build_wire_batch([b"active"]))


def test_retention_by_time_deletes_only_expired_sealed_segments(
    make_topic: Any, clock: ManualClock
) -> None:
    topic = make_topic(retention_ms=int(2.5 * HOUR_S * 1000))
    _write_segments(topic, clock, segments=4)
    partition = topic.partition(0)
    # Segments were written 4h, 3h, 2h and 1h ago: the first two are past 2.5h.
    report = apply_retention(topic, NoGuard(), clock.now_us())
    assert report.segments_deleted == 2 and report.bytes_deleted > 0
    assert partition.start_offset == 10 and partition.end_offset == 21
    assert partition.read(0).batches[0].column("offset")[0].as_py() == 10
    assert apply_retention(topic, NoGuard(), clock.now_us()).segments_deleted == 0


def test_retention_rolls_and_deletes_an_idle_partitions_expired_active_segment(
    make_topic: Any, clock: ManualClock
) -> None:
    """Kafka's rule: when all of the active segment expired, it is rolled and deleted in
    the same pass; the log start becomes the end offset and new writes go on from it."""
    topic = make_topic(retention_ms=1000)
    _write_segments(topic, clock, segments=2)
    partition = topic.partition(0)
    clock.advance(seconds=100 * HOUR_S)
    report = apply_retention(topic, NoGuard(), clock.now_us())
    assert report.segments_deleted == 3
    assert partition.start_offset == partition.end_offset == 11
    assert len(partition.segments) == 1 and partition.size_bytes == 0
    assert partition.read(0).message_count == 0
    # Idle and empty: later passes neither roll again nor delete anything.
    assert apply_retention(topic, NoGuard(), clock.now_us()).segments_deleted == 0
    assert len(partition.segments) == 1
    result = partition.append(build_wire_batch([b"later"]))
    assert result.offsets.tolist() == [11]
    assert [b.column("offset")[0].as_py() for b in partition.read(0).batches] == [11]


def test_an_active_segment_with_one_unexpired_message_stays(
    make_topic: Any, clock: ManualClock
) -> None:
    topic = make_topic(retention_ms=HOUR_S * 1000)
    partition = topic.partition(0)
    partition.append(build_wire_batch([b"old"]))
    clock.advance(seconds=HOUR_S - 1)
    partition.append(build_wire_batch([b"young"]))
    clock.advance(seconds=2)  # "old" is past retention, "young" is not
    assert apply_retention(topic, NoGuard(), clock.now_us()).segments_deleted == 0
    assert partition.start_offset == 0 and len(partition.segments) == 1
    clock.advance(seconds=HOUR_S)
    assert apply_retention(topic, NoGuard(), clock.now_us()).segments_deleted == 1
    assert partition.start_offset == partition.end_offset == 2


def test_nothing_is_deleted_a_microsecond_before_it_expires(
    make_topic: Any, clock: ManualClock
) -> None:
    topic = make_topic(retention_ms=1000)
    partition = topic.partition(0)
    partition.append(build_wire_batch([b"m"]))
    written = partition.segments[-1].last_written_at_us
    assert written is not None
    # Expired means written before now - retention: at exactly the boundary it stays.
    assert apply_retention(topic, NoGuard(), written + 1_000_000).segments_deleted == 0
    assert partition.start_offset == 0 and partition.read(0).message_count == 1
    assert apply_retention(topic, NoGuard(), written + 1_000_001).segments_deleted == 1
    assert partition.start_offset == 1


def test_a_guard_keeps_an_idle_partitions_active_segment_and_no_empty_rolls_pile_up(
    make_topic: Any, clock: ManualClock
) -> None:
    topic = make_topic(retention_ms=1000)
    partition = topic.partition(0)
    partition.append(build_wire_batch([b"a", b"b", b"c"]))
    clock.advance(seconds=HOUR_S)
    for _ in range(3):
        assert apply_retention(topic, FixedGuard(2), clock.now_us()).segments_deleted == 0
    assert len(partition.segments) == 1, "a roll retention could not use was made"
    assert partition.read(0).message_count == 3
    assert apply_retention(topic, FixedGuard(3), clock.now_us()).segments_deleted == 1
    assert partition.start_offset == 3


@pytest.mark.parametrize("policy", list(FsyncPolicy))
def test_an_emptied_idle_partition_keeps_its_log_start_across_a_reopen(
    make_topic: Any, clock: ManualClock, policy: FsyncPolicy
) -> None:
    topic = make_topic(retention_ms=1000, fsync_policy=policy)
    topic.partition(0).append(build_wire_batch([b"a", b"b"]))
    clock.advance(seconds=2)
    apply_retention(topic, NoGuard(), clock.now_us())
    directory = topic.directory
    topic.close()
    reopened = TopicLog(FileSystem(), directory, "t", clock, create=False)
    try:
        partition = reopened.partition(0)
        assert partition.start_offset == partition.end_offset == 2
        assert partition.append(build_wire_batch([b"c"])).offsets.tolist() == [2]
    finally:
        reopened.close()


@pytest.mark.parametrize(
    "failpoint", ["retention.before_roll", "retention.after_roll", "retention.before_delete"]
)
def test_a_failure_around_the_idle_roll_never_loses_or_resurrects_data(
    make_topic: Any, clock: ManualClock, failpoint: str
) -> None:
    """An error at each step of the idle roll (the process then dies): the reopened
    partition holds all its messages (nothing deleted yet) or none (start = end), never
    a part, and a later pass finishes the job."""
    topic = make_topic(retention_ms=1000)
    topic.partition(0).append(build_wire_batch([b"a", b"b"]))
    clock.advance(seconds=2)
    failpoints.activate(f"{failpoint}=error")
    try:
        with pytest.raises(StorageIOError):
            apply_retention(topic, NoGuard(), clock.now_us())
    finally:
        failpoints.deactivate()
    directory = topic.directory
    reopened = TopicLog(FileSystem(), directory, "t", clock, create=False)
    try:
        partition = reopened.partition(0)
        assert partition.end_offset == 2
        kept = partition.read(0).message_count
        assert (partition.start_offset, kept) in ((0, 2), (2, 0))
        apply_retention(reopened, NoGuard(), clock.now_us())
        assert partition.start_offset == partition.end_offset == 2
    finally:
        reopened.close()


def test_retention_by_size_deletes_oldest_segments_until_under_budget(
    make_topic: Any, clock: ManualClock
) -> None:
    topic = make_topic(retention_ms=None, retention_bytes=1)
    _write_segments(topic, clock, segments=3)
    partition = topic.partition(0)
    segment_bytes = partition.segments[0].size_bytes
    topic.alter(
        TopicConfig(
            retention_ms=None, retention_bytes=2 * segment_bytes, fsync_policy=FsyncPolicy.NEVER
        )
    )
    apply_retention(topic, NoGuard(), clock.now_us())
    # Three sealed segments and a small active one: two must go to get under two segments.
    assert partition.start_offset == 10 and partition.size_bytes <= 2 * segment_bytes
    topic.alter(TopicConfig(retention_ms=None, retention_bytes=1, fsync_policy=FsyncPolicy.NEVER))
    apply_retention(topic, NoGuard(), clock.now_us())
    assert len(partition.segments) == 1 and partition.start_offset == 15


def test_retention_deletes_whole_segments_only(make_topic: Any, clock: ManualClock) -> None:
    topic = make_topic(retention_ms=None)
    _write_segments(topic, clock, segments=3)
    partition = topic.partition(0)
    assert partition.delete_segments_before(7) == 1
    assert partition.start_offset == 5, "offset 7 lies inside the second segment: it stays"
    assert partition.delete_segments_before(5) == 0
    assert partition.delete_segments_before(10**6) == 2
    assert partition.start_offset == 15


def test_retention_stops_at_the_guards_protected_offset(
    make_topic: Any, clock: ManualClock
) -> None:
    topic = make_topic(retention_ms=1000)
    _write_segments(topic, clock, segments=4)
    clock.advance(seconds=10 * HOUR_S)
    apply_retention(topic, FixedGuard(7), clock.now_us())
    partition = topic.partition(0)
    assert partition.start_offset == 5, "the segment holding offset 7 is protected"
    apply_retention(topic, FixedGuard(0), clock.now_us())
    assert partition.start_offset == 5
    apply_retention(topic, FixedGuard(None), clock.now_us())
    # Unguarded, the expired active segment (offset 20) is rolled and goes too.
    assert partition.start_offset == partition.end_offset == 21


def test_retention_limit_with_no_settings_keeps_everything(
    make_topic: Any, clock: ManualClock
) -> None:
    topic = make_topic(retention_ms=None, retention_bytes=None)
    _write_segments(topic, clock, segments=3)
    assert retention_limit(topic.partition(0), clock.now_us() + 10**15) == 0


def test_inactive_partition_whose_data_expired_is_removed(
    make_topic: Any, clock: ManualClock
) -> None:
    topic = make_topic(partition_count=2, retention_ms=HOUR_S * 1000)
    _write_segments(topic, clock, segments=2, partition=0)
    topic.mark_inactive(0, (1,))
    directory = topic.partition(0).directory
    assert apply_retention(topic, NoGuard(), clock.now_us()).partitions_removed == 0
    clock.advance(seconds=2 * HOUR_S)
    report = apply_retention(topic, NoGuard(), clock.now_us())
    assert report.partitions_removed == 1 and topic.partition_ids() == [1]
    assert not os.path.exists(directory)


def test_inactive_partition_with_recent_data_behind_an_empty_segment_stays(
    make_topic: Any, clock: ManualClock
) -> None:
    topic = make_topic(partition_count=2, retention_ms=HOUR_S * 1000)
    topic.partition(0).append(build_wire_batch([b"fresh"]))
    topic.partition(0).roll()  # the active segment is now empty
    topic.mark_inactive(0, (1,))
    report = apply_retention(topic, NoGuard(), clock.now_us())
    assert report.partitions_removed == 0 and topic.partition_ids() == [0, 1]


def test_inactive_partition_a_consumer_still_needs_stays(
    make_topic: Any, clock: ManualClock
) -> None:
    topic = make_topic(partition_count=2, retention_ms=HOUR_S * 1000)
    _write_segments(topic, clock, segments=1, partition=0)
    topic.mark_inactive(0, (1,))
    clock.advance(seconds=5 * HOUR_S)
    assert apply_retention(topic, FixedGuard(3), clock.now_us()).partitions_removed == 0
    assert topic.partition(0).start_offset == 0
    end = topic.partition(0).end_offset
    assert apply_retention(topic, FixedGuard(end), clock.now_us()).partitions_removed == 1


def test_an_inactive_partition_that_never_held_a_message_stays(
    make_topic: Any, clock: ManualClock
) -> None:
    topic = make_topic(partition_count=2, retention_ms=1000)
    topic.mark_inactive(0, (1,))
    clock.advance(seconds=HOUR_S)
    assert apply_retention(topic, NoGuard(), clock.now_us()).partitions_removed == 0
    assert topic.partition_ids() == [0, 1]


def test_an_inactive_partition_emptied_by_earlier_passes_is_removed(
    make_topic: Any, clock: ManualClock
) -> None:
    """Its segments are gone (no write time left), but it did hold messages: removed."""
    topic = make_topic(partition_count=2, retention_ms=1000)
    topic.partition(0).append(build_wire_batch([b"a"]))
    clock.advance(seconds=2)
    apply_retention(topic, NoGuard(), clock.now_us())
    assert topic.partition(0).start_offset == 1
    topic.mark_inactive(0, (1,))
    assert apply_retention(topic, NoGuard(), clock.now_us()).partitions_removed == 1
    assert topic.partition_ids() == [1]


def test_partitions_added_after_a_removal_get_new_ids(make_topic: Any, clock: ManualClock) -> None:
    """A removed partition's id is never handed out again, and the others keep theirs."""
    topic = make_topic(partition_count=3, retention_ms=1000)
    topic.partition(0).append(build_wire_batch([b"a"]))
    topic.mark_inactive(0, (2,))
    clock.advance(seconds=2)
    assert apply_retention(topic, NoGuard(), clock.now_us()).partitions_removed == 1
    kept = topic.partition(2)
    topic.alter(TopicConfig(partition_count=5, retention_ms=1000, fsync_policy=FsyncPolicy.NEVER))
    assert topic.partition_ids() == [1, 2, 3, 4]
    assert topic.partition(2) is kept and topic.partition_info(2).parent == 0


def test_active_partitions_are_never_removed(make_topic: Any, clock: ManualClock) -> None:
    topic = make_topic(partition_count=2, retention_ms=1000)
    clock.advance(seconds=HOUR_S)
    assert apply_retention(topic, NoGuard(), clock.now_us()).partitions_removed == 0
    assert topic.partition_ids() == [0, 1]


@pytest.mark.parametrize("partial", [False, True])
def test_log_start_survives_a_crash_before_the_files_are_removed(
    make_topic: Any, clock: ManualClock, tmp_path: Any, partial: bool
) -> None:
    """A crash at ``retention.before_delete`` (or among the renames) never brings expired
    segments back: the log start after recovery is the one readers were shown, or, when
    the crash came among the renames, one in between — never the old one."""
    topic = make_topic(retention_ms=None, retention_bytes=1)
    _write_segments(topic, clock, segments=3)
    directory = topic.directory
    partition = topic.partition(0)
    if partial:  # as if the process died after renaming the first doomed log file only
        failing = partition.segments[1]
        failing.mark_deleted = _raise_storage_error  # type: ignore[method-assign]
    failpoints.activate("retention.before_delete=error")
    try:
        with pytest.raises(StorageIOError):
            apply_retention(topic, NoGuard(), clock.now_us())
    finally:
        failpoints.deactivate()
    shown = partition.start_offset
    assert shown == 15
    # The process "dies" here: nothing is closed; a new process opens the directory.
    reopened = TopicLog(FileSystem(), directory, "t", clock, create=False)
    try:
        recovered = reopened.partition(0)
        assert recovered.start_offset == (5 if partial else 15)
        assert recovered.read(recovered.start_offset, max_messages=100).message_count == (
            16 - recovered.start_offset
        )
        assert not [n for n in os.listdir(recovered.directory) if n.endswith(".deleted")]
    finally:
        reopened.close()


def _raise_storage_error() -> None:
    raise StorageIOError("simulated crash among the renames")
