"""Fixtures for the autopartitioning tests: a manual clock whose sleeps advance it."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from storage.autopartition import AutoPartitioning
from storage.clock import ManualClock
from storage.config import FsyncPolicy, TopicConfig
from storage.fs import FileSystem
from storage.topic_log import TopicLog

SECOND_US = 1_000_000
START_US = 1_700_000_000 * SECOND_US  # a whole second: the meter's seconds line up


class SleepRecorder:
    """A sleep that advances the manual clock instead of waiting, and remembers."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.delays: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)
        self.clock.advance(microseconds=round(seconds * SECOND_US))


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(START_US)


@pytest.fixture
def sleeps(clock: ManualClock) -> SleepRecorder:
    return SleepRecorder(clock)


OpenTopic = Callable[..., TopicLog]


@pytest.fixture
def open_topic(tmp_path: Any, clock: ManualClock, sleeps: SleepRecorder) -> Iterator[OpenTopic]:
    """Create (with settings) or reopen (without) a topic; closed at teardown."""
    opened: list[TopicLog] = []
    directory = os.path.join(str(tmp_path), "t1")

    def open_(partitions: int | None = None, **auto: Any) -> TopicLog:
        topic = TopicLog(FileSystem(), directory, "t1", clock, create=partitions is not None)
        if partitions is not None:
            config = TopicConfig(partition_count=partitions, fsync_policy=FsyncPolicy.NEVER)
            topic.create(config, AutoPartitioning(**auto))
        topic.sleep = sleeps
        opened.append(topic)
        return topic

    yield open_
    for topic in opened:
        topic.close()
