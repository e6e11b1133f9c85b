"""``TopicLog.publish_transactional_many``: a transaction's shares of many partitions
published together (``storage.spread_publish``) give what publishing them one by one
gives: the same results, frames (one per share, tagged with the transaction), messages,
seq_nos and producer state; resends and other unusual cases go share by share; an I/O
error part-way leaves the partitions before it written, as share by share.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from storage import failpoints, limits, spread_publish, topic_log
from storage.clock import ManualClock
from storage.codecs import Codec
from storage.config import FsyncPolicy, TopicConfig
from storage.errors import StorageIOError, UnsupportedCodecError
from storage.fs import FileSystem
from storage.partition_log import DUPLICATE, PartitionLog
from storage.record_batch import build_wire_batch
from storage.spread_publish import checked_data_bytes
from storage.topic_log import TopicLog

PARTITIONS = 6


def _topic(tmp_path: Any, clock: ManualClock, name: str) -> TopicLog:
    topic = TopicLog(FileSystem(), os.path.join(str(tmp_path), name), name, clock, create=True)
    config = TopicConfig(partition_count=PARTITIONS, fsync_policy=FsyncPolicy.GROUP,
                         supported_codecs=frozenset({Codec.RAW}))  # fmt: skip
    topic.create(config)
    return topic


def _shares(statement: int, seq_nos: bool) -> list[tuple[int, pa.RecordBatch, None]]:
    shares = []
    for partition in range(PARTITIONS):
        producers = [f"p{partition}-{k % 3}" for k in range(partition + 2)]
        batch = build_wire_batch(
            [f"{statement}:{partition}:{k}".encode() for k in range(len(producers))],
            producer_id=producers,
            seq_no=[10 * statement + k for k in range(len(producers))] if seq_nos else None,
        )
        shares.append((partition, batch, None))
    return shares


def _rows(topic: TopicLog) -> list[list[tuple[Any, ...]]]:
    rows = []
    for partition in range(PARTITIONS):
        result = topic.partition(partition).read(0, max_messages=10_000)
        rows.append(
            [
                (r["offset"], r["seq_no"], r["producer_id"], r["data"])
                for batch in result.batches
                for r in batch.to_pylist()
            ]
        )
    return rows


def _same(a: list[Any], b: list[Any]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert x.partitions.tolist() == y.partitions.tolist()
        assert x.status.tolist() == y.status.tolist()
        assert x.offsets.tolist() == y.offsets.tolist()


@pytest.mark.parametrize("seq_nos", [False, True])
def test_together_is_the_same_as_one_by_one(
    tmp_path: Any, clock: ManualClock, seq_nos: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    together, alone = _topic(tmp_path, clock, "a"), _topic(tmp_path, clock, "b")
    for statement in range(3):
        shares = _shares(statement, seq_nos)
        expected = [alone.publish_transactional(b, p, 100 + statement) for p, b, _ in shares]
        with monkeypatch.context() as patched:  # the usual case never goes share by share
            patched.setattr(PartitionLog, "publish_transactional", _refused)
            got = together.publish_transactional_many(shares, 100 + statement)
        _same(got, expected)
        clock.advance(microseconds=1)
    assert _rows(together) == _rows(alone)
    for partition in range(PARTITIONS):
        log = together.partition(partition)
        assert all(log.contains_transaction(100 + s, 0) for s in range(3))
        for key in {f"p{partition}-{k % 3}" for k in range(partition + 2)}:
            assert log.last_seq_no(key) == alone.partition(partition).last_seq_no(key)
        # each share metered as one by one (the partition's write speed counts its bytes)
        metered = together.write_speed(partition)
        assert metered.written_bytes == alone.write_speed(partition).written_bytes > 0
    # a resend of the last statement is wholly duplicate, as one by one
    shares = _shares(2, seq_nos=True) if seq_nos else None
    if shares is not None:
        resent = together.publish_transactional_many(shares, 200)
        assert all((r.status == DUPLICATE).all() for r in resent)
        _same(resent, [alone.publish_transactional(b, p, 200) for p, b, _ in shares])
    together.close()
    alone.close()


def _refused(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("published share by share")


def test_state_survives_a_reopen(tmp_path: Any, clock: ManualClock) -> None:
    topic = _topic(tmp_path, clock, "a")
    topic.publish_transactional_many(_shares(0, seq_nos=False), 7)
    for partition in range(PARTITIONS):
        topic.partition(partition).sync()
    topic.close()
    reopened = TopicLog(FileSystem(), os.path.join(str(tmp_path), "a"), "a", clock, create=False)
    # server-numbered: each producer's messages got 0, 1, ... in its partition
    for partition in range(PARTITIONS):
        counts = np.bincount([k % 3 for k in range(partition + 2)])
        for k, count in enumerate(counts.tolist()):
            assert reopened.partition(partition).last_seq_no(f"p{partition}-{k}") == count - 1
    reopened.close()


def test_an_io_error_part_way_keeps_the_shares_before_it(tmp_path: Any, clock: ManualClock) -> None:
    topic = _topic(tmp_path, clock, "a")
    shares = _shares(0, seq_nos=True)
    failpoints.activate("publish.mid_spread=error@2")  # before the third share
    try:
        with pytest.raises(StorageIOError):
            topic.publish_transactional_many(shares, 7)
    finally:
        failpoints.deactivate()
    written = [len(rows) for rows in _rows(topic)]
    assert written[:2] == [2, 3] and written[2:] == [0] * (PARTITIONS - 2)
    # what a retry of the unfinished publish does: the rest, and the first two as duplicates
    again = topic.publish_transactional_many(shares, 7)
    assert [int((r.status == DUPLICATE).sum()) for r in again] == [2, 3, 0, 0, 0, 0]
    assert [len(rows) for rows in _rows(topic)] == [p + 2 for p in range(PARTITIONS)]
    topic.close()


def test_checked_data_bytes_gives_each_shares_bytes_or_refuses(tmp_path: Any) -> None:
    config = TopicConfig(partition_count=2, supported_codecs=frozenset({Codec.RAW}))
    shares = [build_wire_batch([b"ab", b"c"]), build_wire_batch([b"x" * 100])]
    assert checked_data_bytes(shares, config) == [3, 100]
    zstd = build_wire_batch([b"a"], codec=Codec.ZSTD)
    assert checked_data_bytes([shares[0], zstd], config) is None  # a codec the topic refuses
    assert checked_data_bytes([shares[0], zstd], replace(config, supported_codecs=frozenset(
        {Codec.RAW, Codec.ZSTD}))) == [3, 1]  # fmt: skip
    other = pa.RecordBatch.from_arrays([pa.array([1])], names=["x"])
    assert checked_data_bytes([shares[0], other], config) is None
    big = build_wire_batch([b"x" * (limits.MESSAGE_BYTES_MAX + 1)])
    assert checked_data_bytes([shares[0], big], config) is None


def test_a_share_that_fails_its_checks_is_refused_as_one_by_one(
    tmp_path: Any, clock: ManualClock
) -> None:
    topic = _topic(tmp_path, clock, "a")
    shares = _shares(0, seq_nos=True)
    bad = build_wire_batch([b"z"], producer_id="q", seq_no=[1], codec=Codec.ZSTD)
    shares[3] = (3, bad, None)
    with pytest.raises(UnsupportedCodecError):
        topic.publish_transactional_many(shares, 7)
    # one by one: the shares before it were written, none after
    assert [len(rows) for rows in _rows(topic)] == [2, 3, 4, 0, 0, 0]
    topic.close()


def test_waiting_readers_are_woken_once(tmp_path: Any, clock: ManualClock) -> None:
    topic = _topic(tmp_path, clock, "a")
    woken = []
    condition = topic.partition(0).data_ready
    assert all(topic.partition(p).data_ready is condition for p in range(PARTITIONS))
    original = condition.notify_all
    condition.notify_all = lambda: (woken.append(1), original())  # type: ignore[method-assign]
    topic.publish_transactional_many(_shares(0, seq_nos=False), 7)
    assert woken == [1]
    topic.close()



def test_the_shares_are_read_through_one_table(
    tmp_path: Any, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The checks and the producer-state decision read the shares through one table of
    them all, made once per publish (a table of 1000 shares costs ~2 ms)."""
    topic = _topic(tmp_path, clock, "a")
    tables: list[Any] = []
    checked, decide = spread_publish.checked_shares, spread_publish.decide_shares

    def checking(*args: Any) -> Any:
        result = checked(*args)
        tables.append(result[1])
        return result

    def deciding(managers: Any, batches: Any, table: Any = None) -> Any:
        assert table is not None and table is tables[-1], "a second table of the shares"
        return decide(managers, batches, table)

    with monkeypatch.context() as patched:
        patched.setattr(topic_log, "checked_shares", checking)
        patched.setattr(spread_publish, "decide_shares", deciding)
        patched.setattr(PartitionLog, "publish_transactional", _refused)
        for statement, seq_nos in enumerate((False, True)):
            topic.publish_transactional_many(_shares(5 + statement, seq_nos), 7 + statement)
    assert len(tables) == 2
    topic.close()


def test_checked_shares_from_counts_match_the_batches_and_refuse_empty_shares() -> None:
    """Given the shares' row counts and the batch they are slices of (the ledger path:
    no share's batch is read), the checks give what they give from the batches; no
    share, or a share of no rows, is refused (None: the caller goes share by share)."""
    config = TopicConfig(supported_codecs=frozenset({Codec.RAW}))
    whole = build_wire_batch([bytes([65 + i % 26]) * (1 + i) for i in range(12)])
    counts = np.array([5, 1, 6])
    starts = np.cumsum(counts) - counts
    batches = [whole.slice(int(s), int(c)) for s, c in zip(starts, counts, strict=True)]
    from_batches = spread_publish.checked_shares(batches, config)
    from_counts = spread_publish.checked_shares(batches, config, whole, counts)
    assert from_batches is not None and from_counts is not None
    assert from_counts[0] == from_batches[0] == [15, 6, 57]
    assert from_counts[1].equals(from_batches[1])
    assert spread_publish.checked_shares([], config) is None
    empty = [batches[0], whole.slice(0, 0)]
    assert spread_publish.checked_shares(empty, config) is None
    assert spread_publish.checked_shares(empty, config, batches[0], np.array([5, 0])) is None
