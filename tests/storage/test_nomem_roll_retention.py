"""Round 24 (H8): a ``MemoryError`` at a segment roll or a retention step, the process going on.

``nomem`` (an allocation refused under the process memory cap; not an I/O error, so no
handler for ``StorageIOError`` sees it) at ``segment.roll_after_seal`` /
``segment.roll_before_snapshot`` (a roll inside an append: nothing of the append is
written yet) and at ``retention.before_roll`` / ``retention.after_roll`` /
``retention.before_delete`` (the idle roll and the deletion of expired segments). The
failed call raises ``MemoryError``; later appends go on (or are refused: a fence), every
acknowledged message is there once and in order in the same process, after a close and
reopen, and the failed append's messages are absent; a later retention pass finishes.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from storage import failpoints, limits
from storage.cleaner import NoGuard, apply_retention
from storage.clock import ManualClock
from storage.config import FsyncPolicy, TopicConfig
from storage.fs import FileSystem
from storage.record_batch import build_wire_batch
from storage.topic_log import TopicLog

PAYLOAD = 1000  # bytes a message: a segment holds a few
MESSAGES = 60


def _topic(path: str, clock: ManualClock, create: bool, **settings: Any) -> TopicLog:
    topic = TopicLog(FileSystem(), path, "t", clock, create=create)
    if create:
        topic.create(TopicConfig(segment_bytes=limits.SEGMENT_BYTES_MIN, **settings))
    return topic


def _data(topic: TopicLog) -> list[bytes]:
    log = topic.partition(0)
    found: list[bytes] = []
    offset = log.start_offset
    while offset < log.end_offset:
        result = log.read(offset, max_messages=10_000)
        for batch in result.batches:
            found.extend(batch.column("data").to_pylist())
        offset = result.next_offset
    return found


def _message(k: int) -> bytes:
    return b"%06d" % k + b"x" * (PAYLOAD - 6)


@pytest.mark.parametrize("policy", [FsyncPolicy.ALWAYS, FsyncPolicy.NEVER])
@pytest.mark.parametrize("point", ["segment.roll_after_seal", "segment.roll_before_snapshot"])
def test_a_memory_error_in_a_roll_fails_that_append_alone(
        tmp_path: Any, clock: ManualClock, point: str, policy: FsyncPolicy) -> None:  # fmt: skip
    path = os.path.join(str(tmp_path), "t")
    topic = _topic(path, clock, True, fsync_policy=policy)
    acked: list[bytes] = []
    failed = 0
    try:
        failpoints.activate(f"{point}=nomem@2")
        for k in range(MESSAGES):
            try:
                topic.partition(0).append(build_wire_batch([_message(k)]))
            except MemoryError:
                failed += 1
                continue
            acked.append(_message(k))
        failpoints.deactivate()
        assert failed == 1  # the point was passed, at the second roll
        assert len(topic.partition(0).segments) > 3  # rolls went on after it
        assert _data(topic) == acked
    finally:
        failpoints.deactivate()
        topic.close()
    reopened = _topic(path, clock, False)
    try:
        assert _data(reopened) == acked  # once each, in order; the failed one absent
        reopened.partition(0).append(build_wire_batch([b"after"]))
        assert _data(reopened) == [*acked, b"after"]
    finally:
        reopened.close()


@pytest.mark.parametrize(
    "point", ["retention.before_roll", "retention.after_roll", "retention.before_delete"]
)
def test_a_memory_error_in_retention_never_loses_or_resurrects_data(
        tmp_path: Any, clock: ManualClock, point: str) -> None:  # fmt: skip
    path = os.path.join(str(tmp_path), "t")
    topic = _topic(path, clock, True, retention_ms=1000, fsync_policy=FsyncPolicy.ALWAYS)
    try:
        old = [_message(k) for k in range(10)]
        for message in old:
            topic.partition(0).append(build_wire_batch([message]))
        clock.advance(seconds=2)
        failpoints.activate(f"{point}=nomem")
        with pytest.raises(MemoryError):
            apply_retention(topic, NoGuard(), clock.now_us())
        failpoints.deactivate()
        kept = _data(topic)
        assert kept in (old, []) or kept == old[len(old) - len(kept) :]  # a suffix, whole
        topic.partition(0).append(build_wire_batch([b"new"]))  # the partition goes on
        assert _data(topic) == [*kept, b"new"]
        apply_retention(topic, NoGuard(), clock.now_us())  # a later pass finishes
        assert _data(topic) == [b"new"]
    finally:
        failpoints.deactivate()
        topic.close()
    reopened = _topic(path, clock, False)
    try:
        assert _data(reopened) == [b"new"]
        assert reopened.partition(0).end_offset == len(old) + 1
    finally:
        reopened.close()
