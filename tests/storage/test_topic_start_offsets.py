"""``TopicLog.start_offsets`` reads the table the partitions keep at each publish
(``PartitionLog.start_table``, round 38): it equals every partition's own ``start_offset``
after appends through the staging path and the ledger, rolls, retention's deletions from
the front, splits (new partitions), a copy of the ledger, and a reopen."""

from __future__ import annotations

import os
import random
from typing import Any

import pyarrow as pa
import pytest

from storage import limits
from storage.autopartition import AutoPartitioning
from storage.clock import SYSTEM_CLOCK
from storage.config import Codec, TopicConfig
from storage.fs import FileSystem
from storage.record_batch import build_wire_batch
from storage.topic_log import TopicLog
from tests.storage.test_ledger_route import _statement


def _open(root: str, create: bool) -> TopicLog:
    topic = TopicLog(FileSystem(), os.path.join(root, "t"), "t", SYSTEM_CLOCK, create=create,
                     ledger=True)  # fmt: skip
    if create:  # ranged partitions (autopartitioning on), so that they can split
        topic.create(TopicConfig(partition_count=8, segment_bytes=limits.SEGMENT_BYTES_MIN,
                                 supported_codecs=frozenset({Codec.RAW})),
                     AutoPartitioning(strategy="scale_up"))  # fmt: skip
    return topic


def _check(topic: TopicLog) -> None:
    ids = topic.partition_ids()
    assert topic.start_offsets(ids) == {p: topic.partition(p).start_offset for p in ids}


def _batch(rng: random.Random) -> pa.RecordBatch:
    return build_wire_batch([b"x" * rng.randrange(50, 400) for _ in range(rng.randrange(1, 6))])


@pytest.mark.parametrize("seed", range(4))
def test_the_table_is_every_partitions_start(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    monkeypatch.setattr(limits, "LEDGER_COPY_FRAMES_MIN", 10**9)
    monkeypatch.setattr(limits, "LEDGER_COPY_WAIT_S", 3600.0)
    rng = random.Random(seed)
    topic = _open(str(tmp_path), create=True)
    moved = splits = 0
    try:
        for step in range(120):
            action = rng.random()
            ids = topic.partition_ids()
            active = [p for p in ids if topic.partition(p).active]
            if action < 0.45:
                topic.partition(rng.choice(active)).append(_batch(rng))
            elif action < 0.6:
                topic.append_ledger(_statement(step, range(8), seq_nos=False))
            elif action < 0.7:
                assert topic.ledger is not None
                topic.ledger.copy_all()
            elif action < 0.95:
                log = topic.partition(rng.choice(ids))
                moved += bool(log.delete_segments_before(rng.randrange(log.own_end + 1)))
            elif len(ids) < 14:
                splits += topic.split(rng.choice(active), force=True) is not None
            _check(topic)
        assert moved and any(topic.partition(p).start_offset for p in topic.partition_ids())
        assert splits and len(topic.partition_ids()) > 8
    finally:
        topic.close()
    reopened = _open(str(tmp_path), create=False)
    try:
        _check(reopened)
    finally:
        reopened.close()


def test_an_unknown_partition_is_refused_as_before(tmp_path: Any) -> None:
    topic = _open(str(tmp_path), create=True)
    try:
        with pytest.raises(Exception, match="99"):
            topic.start_offsets([0, 99])
    finally:
        topic.close()


def test_a_partition_is_in_the_table_before_a_poll_can_list_it(tmp_path: Any) -> None:
    """A poll planned from ``partition_ids`` while a split adds the children finds their
    starts (a review of round 38: the table's entry was written after the partition was
    listed, and a poll in between was refused with a ``KeyError``); a removed partition
    leaves the table."""
    topic = _open(str(tmp_path), create=True)
    polled: list[dict[int, int]] = []

    class Listed(dict):
        def __setitem__(self, key: int, value: Any) -> None:
            super().__setitem__(key, value)
            polled.append(topic.start_offsets(topic.partition_ids()))  # a poll right then

    try:
        topic._partitions = Listed(topic._partitions)
        assert topic.split(0, force=True) is not None
        assert [len(poll) for poll in polled] == [9, 10]  # each child as it is listed
        topic._partitions = dict(topic._partitions)
        topic.remove_partition(0)
        assert 0 not in topic._log_starts
        with pytest.raises(Exception, match="0"):
            topic.start_offsets([0])
    finally:
        topic.close()
