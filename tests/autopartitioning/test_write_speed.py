"""The token bucket: writes over a partition's speed are delayed by exactly what the
speed and burst say, never dropped, and refused (53000) past the longest wait."""

from __future__ import annotations

import pytest

from storage.autopartition import WriteSpeed, WriteThrottledError
from storage.record_batch import build_wire_batch
from tests.autopartitioning.conftest import START_US, OpenTopic, SleepRecorder

SECOND_US = 1_000_000


def test_a_full_bucket_lets_the_burst_through_then_charges_the_speed() -> None:
    bucket = WriteSpeed(speed=1000, burst=3000, now_us=START_US)
    assert bucket.reserve(3000, START_US, 10) == 0.0
    assert bucket.reserve(500, START_US, 10) == pytest.approx(0.5)
    assert bucket.reserve(1000, START_US, 10) == pytest.approx(1.5)  # queued behind the first
    assert bucket.throttled_us == 2_000_000


def test_tokens_refill_at_the_speed_up_to_the_burst_only() -> None:
    bucket = WriteSpeed(speed=1000, burst=0, now_us=START_US)  # burst 0: one second's worth
    assert bucket.capacity == 1000
    assert bucket.reserve(1000, START_US, 10) == 0.0
    later = START_US + 10 * SECOND_US  # ten idle seconds refill one second's worth, no more
    assert bucket.reserve(1000, later, 10) == 0.0
    assert bucket.reserve(250, later, 10) == pytest.approx(0.25)


def test_a_wait_past_the_limit_is_refused_and_takes_nothing() -> None:
    bucket = WriteSpeed(speed=1000, burst=1000, now_us=START_US)
    with pytest.raises(WriteThrottledError) as error:
        bucket.reserve(5000, START_US, max_delay_s=2.0)
    assert error.value.sqlstate == "53000"
    assert bucket.reserve(1000, START_US, 10) == 0.0  # the refused write took no tokens


def test_topic_writes_sleep_for_their_partition_and_all_are_written(
    open_topic: OpenTopic, sleeps: SleepRecorder
) -> None:
    topic = open_topic(1, strategy="paused", write_speed=2000, burst=4000)
    for _ in range(4):
        result = topic.append(build_wire_batch([b"x" * 1000, b"y" * 1000]))
        assert result.written_count == 2  # delayed, never dropped
    assert sleeps.delays == pytest.approx([1.0, 1.0])  # 4000 free, then 2000 per second
    assert topic.write_speed(0).throttled_us == 2_000_000
    assert topic.partition(0).end_offset == 8


def test_a_topic_without_autopartitioning_at_the_default_speed_is_not_throttled(
    open_topic: OpenTopic, sleeps: SleepRecorder
) -> None:
    topic = open_topic(1)
    for _ in range(3):
        topic.append(build_wire_batch([b"z" * 3_000_000]))
    assert sleeps.delays == []


def test_a_chosen_speed_throttles_a_topic_without_autopartitioning(
    open_topic: OpenTopic, sleeps: SleepRecorder
) -> None:
    topic = open_topic(1, write_speed=1000)
    topic.append(build_wire_batch([b"a" * 1000]))
    topic.append(build_wire_batch([b"b" * 500]))
    assert sleeps.delays == pytest.approx([0.5])


def test_a_write_over_the_longest_wait_is_53000_and_not_written(open_topic: OpenTopic) -> None:
    topic = open_topic(1, strategy="paused", write_speed=1000)
    with pytest.raises(WriteThrottledError):
        topic.append(build_wire_batch([b"q" * 20_000]), max_delay_s=5)
    assert topic.partition(0).end_offset == 0


def test_measured_speed_is_the_last_whole_second(open_topic: OpenTopic, clock) -> None:
    topic = open_topic(1, strategy="paused", write_speed=10_000)
    topic.append(build_wire_batch([b"m" * 700]))
    topic.append(build_wire_batch([b"m" * 300]))
    assert topic.write_speed(0).speed_now(clock.now_us()) == 0  # this second is not over
    clock.advance(seconds=1)
    assert topic.write_speed(0).speed_now(clock.now_us()) == 1000


def test_a_cancel_ends_the_wait_with_57014_and_nothing_written(
    open_topic: OpenTopic, sleeps: SleepRecorder
) -> None:
    from storage.errors import QueryCanceledError

    topic = open_topic(1, strategy="paused", write_speed=1000)
    topic.append(build_wire_batch([b"a" * 1000]))  # the bucket is empty now
    with pytest.raises(QueryCanceledError) as cancelled:
        topic.append(build_wire_batch([b"b" * 2000]), cancelled=lambda: len(sleeps.delays) >= 3)
    assert cancelled.value.sqlstate == "57014"
    assert sleeps.delays == pytest.approx([0.1, 0.1, 0.1])  # slices of the 2 s wait
    assert topic.partition(0).end_offset == 1
    assert topic.write_speed(0).throttled_us == 300_000  # what was waited, not the 2 s
