"""The ledger wired to a topic's partitions (``storage.ledger_route``, the switch on):
appends, reads that settle, writes that meet a ledger tail, dedup, reopen, the copier."""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from storage import cleaner, failpoints, ledger_route, limits, topic_log
from storage.clock import SYSTEM_CLOCK
from storage.codecs import Codec
from storage.config import TopicConfig
from storage.errors import PartitionFencedError, StorageIOError
from storage.fs import FileSystem
from storage.partition_log import DUPLICATE, WRITTEN
from storage.record_batch import build_wire_batch
from storage.topic_log import TopicLog

PARTITIONS = 8


def _open(root: str, *, create: bool = False, ledger: bool = True) -> TopicLog:
    topic = TopicLog(FileSystem(), os.path.join(root, "t"), "t", SYSTEM_CLOCK, create=create,
                     ledger=ledger)  # fmt: skip
    if create:
        topic.create(TopicConfig(partition_count=PARTITIONS,
                                 supported_codecs=frozenset({Codec.RAW})))  # fmt: skip
    return topic


def _statement(k: int, partitions: range = range(PARTITIONS), seq_nos: bool = True
               ) -> list[tuple[int, np.ndarray, pa.RecordBatch]]:  # fmt: skip
    """Two messages a partition, producer ``q<p>``, seq_nos ``2k, 2k + 1`` (or none)."""
    shares = []
    for p in partitions:
        batch = build_wire_batch([f"{k}.{p}.{i}".encode() for i in range(2)],
                                 producer_id=f"q{p}",
                                 seq_no=[2 * k, 2 * k + 1] if seq_nos else None)  # fmt: skip
        shares.append((p, np.arange(2), batch))
    return shares


def _rows(topic: TopicLog, partition: int) -> list[tuple[int, bytes]]:
    result = topic.partition(partition).read(0, max_messages=100_000)
    return [(r["offset"], r["data"]) for b in result.batches for r in b.to_pylist()]


def _expected(statements: range, partition: int) -> list[tuple[int, bytes]]:
    data = [f"{k}.{partition}.{i}".encode() for k in statements for i in range(2)]
    return list(enumerate(data))


def test_statements_are_read_at_their_offsets_before_and_after_the_copy(tmp_path: Any) -> None:
    topic = _open(str(tmp_path), create=True)
    try:
        for k in range(5):
            bases = topic.append_ledger(_statement(k))
            assert bases == [2 * k] * PARTITIONS
        assert topic.ledger is not None
        assert set(topic.ledger.ledger.pending()) == set(range(PARTITIONS))
        # a read settles the partition: every acknowledged row, at its offset
        assert _rows(topic, 3) == _expected(range(5), 3)
        assert topic.partition(5).end_offset == 10  # the end seen settles too
        assert topic.ledger.copy_all() == 10 * PARTITIONS  # synced and released
        assert topic.ledger.ledger.pending() == {}
        for p in range(PARTITIONS):
            assert _rows(topic, p) == _expected(range(5), p)
    finally:
        topic.close()


def test_a_reopen_copies_what_the_ledger_holds_and_keeps_producer_state(tmp_path: Any) -> None:
    topic = _open(str(tmp_path), create=True)
    for k in range(3):
        topic.append_ledger(_statement(k))
    assert topic.ledger is not None
    topic.ledger.close()  # as a crash leaves it: nothing copied (the copier had not run)
    for p in range(PARTITIONS):
        topic.partition(p).ledger_unsettled = False
    topic.ledger = None
    topic.close()
    reopened = _open(str(tmp_path))
    try:
        assert reopened.ledger is not None and reopened.ledger.ledger.pending() == {}
        for p in range(PARTITIONS):
            assert reopened.partition(p).own_end == 6  # in the log itself, copied at the open
            assert _rows(reopened, p) == _expected(range(3), p)
        # a retried statement: the ledger path declines (a duplicate), the usual one says
        # duplicate at the ledger's offsets
        retry = _statement(2)
        assert reopened.append_ledger(retry) is None
        result = reopened.append(retry[4][2], 4)
        assert result.status.tolist() == [DUPLICATE, DUPLICATE]
        assert result.offsets.tolist() == [4, 5]
    finally:
        reopened.close()


def test_dedup_against_ledger_shares_not_yet_copied(tmp_path: Any) -> None:
    topic = _open(str(tmp_path), create=True)
    try:
        topic.append_ledger(_statement(0))
        assert topic.partition(2).ledger_unsettled
        # numbered by the writer: each producer continues after the ledger's seq_nos
        bases = topic.append_ledger(_statement(1, seq_nos=False))
        assert bases == [2] * PARTITIONS
        assert topic.partition(2).last_seq_no("q2") == 3
        assert topic.append_ledger(_statement(1)) is None  # duplicates: the usual way
        result = topic.append(_statement(1)[2][2], 2)  # the seq_nos the writer gave
        assert result.status.tolist() == [DUPLICATE, DUPLICATE]
        assert result.offsets.tolist() == [2, 3]
    finally:
        topic.close()


def test_a_plain_write_copies_the_ledger_tail_first_and_the_ledger_follows_it(
    tmp_path: Any,
) -> None:
    topic = _open(str(tmp_path), create=True)
    try:
        topic.append_ledger(_statement(0))
        plain = build_wire_batch([b"plain"], producer_id="other", seq_no=[0])
        result = topic.append(plain, 1)
        assert result.status.tolist() == [WRITTEN] and result.offsets.tolist() == [2]
        # the next ledger share of partition 1 starts after the plain write
        bases = topic.append_ledger(_statement(1))
        assert bases is not None and bases[1] == 3 and bases[0] == 2
        rows = _rows(topic, 1)
        assert [o for o, _ in rows] == [0, 1, 2, 3, 4]
        assert [d for _, d in rows] == [b"0.1.0", b"0.1.1", b"plain", b"1.1.0", b"1.1.1"]
        assert topic.ledger is not None
        topic.ledger.copy_all()
    finally:
        topic.close()
    reopened = _open(str(tmp_path))
    try:
        assert [d for _, d in _rows(reopened, 1)] == [
            b"0.1.0", b"0.1.1", b"plain", b"1.1.0", b"1.1.1"]  # fmt: skip
    finally:
        reopened.close()


def test_a_waiting_reader_sees_a_ledger_append(tmp_path: Any) -> None:
    topic = _open(str(tmp_path), create=True)
    try:
        seen: list[bool] = []
        reader = threading.Thread(target=lambda: seen.append(
            topic.partition(6).wait_for_data(0, 10.0)))  # fmt: skip
        reader.start()
        time.sleep(0.05)
        topic.append_ledger(_statement(0))
        reader.join(10)
        assert seen == [True]
        assert topic.wait_for_any({7: 0}, 1.0)
    finally:
        topic.close()


def _hold_copier(monkeypatch: pytest.MonkeyPatch) -> None:
    """The background copier never runs on its own: passes only where a test makes them."""
    monkeypatch.setattr(limits, "LEDGER_COPY_WAIT_S", 3600.0)
    monkeypatch.setattr(limits, "LEDGER_COPY_FRAMES_MIN", 10**9)


def _six_statements_copied(topic: TopicLog) -> tuple[ledger_route.TopicLedger, list[int]]:
    """Six statements into the topic's ledger (3 files or more), then a copier's pass;
    the ledger and its files before the pass."""
    ledger = topic.ledger
    assert ledger is not None
    for k in range(6):
        topic.append_ledger(_statement(k))
    files = ledger.ledger.file_numbers
    assert len(files) >= 3
    assert ledger.copy_all() == 6 * 2 * PARTITIONS
    return ledger, files


@pytest.mark.parametrize(("retention_ms", "young_s", "old_s"),
                         [(None, 30.0, limits.LEDGER_KEEP_COPIED_S + 1), (1000, 0.0, 2.0)])
def test_copied_files_are_kept_for_whole_reads_until_they_age_or_retention_passes(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, retention_ms: int | None, young_s: float,
    old_s: float,
) -> None:
    """The copier keeps the files it copied (``LEDGER_KEEP_COPIED_BYTES``); a retention
    pass drops those older than ``LEDGER_KEEP_COPIED_S``, or than the topic's retention
    when that is shorter, and the rows stay in the partitions (round 33)."""
    _hold_copier(monkeypatch)
    monkeypatch.setattr(limits, "LEDGER_FILE_BYTES_MAX", 4096)  # a file a frame or two
    topic = _open(str(tmp_path), create=True)
    try:
        if retention_ms is not None:
            topic.config = dataclasses.replace(topic.config, retention_ms=retention_ms)
        ledger, files = _six_statements_copied(topic)
        assert ledger.ledger.file_numbers == files  # copied, and kept
        now = time.time_ns() // 1000
        young = now + int(young_s * 1_000_000)
        assert cleaner.apply_retention(topic, cleaner.NoGuard(), young).segments_deleted == 0
        assert ledger.ledger.file_numbers == files  # young, within the budget: kept
        cleaner.apply_retention(topic, cleaner.NoGuard(), now + int(old_s * 1_000_000))
        assert ledger.ledger.file_numbers == files[-1:]  # all but the one being written
        for p in range(PARTITIONS):
            assert _rows(topic, p) == _expected(range(6), p)
    finally:
        topic.close()


def test_copied_files_are_kept_within_the_topics_retention_bytes(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A topic whose ``retention_bytes`` times its partitions is less than
    ``LEDGER_KEEP_COPIED_BYTES`` keeps no more copied bytes than that: here less than one
    file, so the copier's own pass drops every copied file (round 34)."""
    _hold_copier(monkeypatch)
    monkeypatch.setattr(limits, "LEDGER_FILE_BYTES_MAX", 4096)
    topic = _open(str(tmp_path), create=True)
    try:
        topic.config = dataclasses.replace(topic.config, retention_bytes=100)
        for p in topic.partition_ids():
            topic.partition(p).config = topic.config
        ledger, files = _six_statements_copied(topic)
        assert ledger.ledger.file_numbers == files[-1:]  # 800 bytes kept at most: none
        for p in range(PARTITIONS):
            assert _rows(topic, p) == _expected(range(6), p)
    finally:
        topic.close()


def test_the_copier_copies_releases_and_drops_files(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(limits, "LEDGER_COPY_FRAMES_MIN", 3)
    monkeypatch.setattr(limits, "LEDGER_FILE_BYTES_MAX", 4096)  # a file a frame or two
    monkeypatch.setattr(limits, "LEDGER_KEEP_COPIED_BYTES", 0)
    topic = _open(str(tmp_path), create=True)
    try:
        ledger = topic.ledger
        assert ledger is not None
        for k in range(12):
            topic.append_ledger(_statement(k))
        deadline = time.monotonic() + 20
        while ledger.ledger.pending() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert ledger.ledger.pending() == {}, ledger.copier_error
        assert ledger.copies >= 1 and ledger.copier_cpu_s > 0
        assert len(ledger.ledger.file_numbers) <= 1  # the one being written, at most
        for p in range(PARTITIONS):
            assert topic.partition(p).durable_end == 24
            assert _rows(topic, p) == _expected(range(12), p)
    finally:
        topic.close()


def test_the_switch_off_copies_a_left_ledger_and_writes_no_more_to_it(tmp_path: Any) -> None:
    topic = _open(str(tmp_path), create=True)
    topic.append_ledger(_statement(0))
    assert topic.ledger is not None
    topic.ledger.close()
    topic.ledger = None
    for p in range(PARTITIONS):
        topic.partition(p).ledger_unsettled = False
    topic.close()
    off = _open(str(tmp_path), ledger=False)
    try:
        assert off.ledger is None
        assert off.append_ledger(_statement(1)) is None
        assert os.listdir(os.path.join(str(tmp_path), "t", ledger_route.DIRECTORY)) == []
        for p in range(PARTITIONS):
            assert _rows(off, p) == _expected(range(1), p)
            assert off.partition(p).ledger_tail is None
    finally:
        off.close()


def test_a_failed_ledger_append_fences_the_statements_partitions(tmp_path: Any) -> None:
    topic = _open(str(tmp_path), create=True)
    try:
        failpoints.activate("ledger.after_write=error")
        with pytest.raises(StorageIOError):
            topic.append_ledger(_statement(0, range(2, 6)))
        failpoints.deactivate()
        with pytest.raises(PartitionFencedError):
            topic.append(_statement(1)[3][2], 3)
        assert topic.append(_statement(1)[0][2], 0).written_count == 2  # not in it
    finally:
        failpoints.deactivate()
        topic.close()
    reopened = _open(str(tmp_path))  # the frame was written, not synced: the open decides
    try:
        for p in range(2, 6):
            rows = _rows(reopened, p)
            assert rows in ([], _expected(range(1), p))
    finally:
        reopened.close()


def test_shares_not_small_or_too_few_go_the_usual_way(tmp_path: Any) -> None:
    topic = _open(str(tmp_path), create=True)
    try:
        big = build_wire_batch([b"x" * (limits.LEDGER_SHARE_BYTES_MAX + 1)], producer_id="b")
        shares = [*_statement(0, range(1, PARTITIONS)), (0, np.arange(1), big)]
        shares.sort(key=lambda share: share[0])
        assert topic.append_ledger(shares) is None
        assert topic.ledger is not None and topic.ledger.ledger.pending() == {}
    finally:
        topic.close()


def test_removing_a_partition_while_the_ledger_holds_uncopied_rows_does_not_hang(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Round 34 (a review): ``remove_partition`` copied the ledger's rows under the topic's
    lock, and the copy's syncs take that lock (``sync_redirected``): a retention pass
    removing an expired split partition while any partition had uncopied rows hung the
    topic, and with it every commit. The copy now runs before the lock is taken."""
    _hold_copier(monkeypatch)
    topic = _open(str(tmp_path), create=True)
    try:
        assert topic.append_ledger(_statement(0)) is not None  # uncopied rows everywhere
        topic.mark_inactive(PARTITIONS - 1, (PARTITIONS - 2,))
        errors: list[BaseException] = []

        def remove() -> None:
            try:
                topic.remove_partition(PARTITIONS - 1)
            except BaseException as error:  # reported below
                errors.append(error)

        remover = threading.Thread(target=remove, daemon=True)
        remover.start()
        remover.join(30)
        assert not remover.is_alive(), "remove_partition hangs (a lock taken twice)"
        assert errors == []
        assert topic.partition_ids() == list(range(PARTITIONS - 1))
        assert _rows(topic, 0) == _expected(range(1), 0)
    finally:
        topic.close()


def test_shares_sliced_from_one_batch_are_written_as_a_list_of_them_is(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``TopicLog.shares`` hands the ledger the batch its shares are slices of
    (``Shares.whole``, round 35): its checks, decision and frame body read that one chunk,
    and no share's batch is made (round 37). The frame, and what every partition reads
    back, are those of the same shares handed as a plain list (one chunk a share, joined
    again)."""
    made = []
    piece = topic_log.Shares.piece

    def counted(self: topic_log.Shares, index: int) -> pa.RecordBatch:
        made.append(index)
        return piece(self, index)

    monkeypatch.setattr(topic_log.Shares, "piece", counted)
    found = []
    for name in ("whole", "list"):
        topic = TopicLog(FileSystem(), os.path.join(str(tmp_path), name), name, SYSTEM_CLOCK,
                         create=True, ledger=True)  # fmt: skip
        topic.create(TopicConfig(partition_count=20, supported_codecs=frozenset({Codec.RAW})))
        try:
            for k in range(3):
                ids = [f"p{(7 * i + k) % 50}" for i in range(300)]
                batch = build_wire_batch([f"{k}.{i}".encode() for i in range(300)],
                                         producer_id=ids)  # fmt: skip
                targets = np.array([(7 * i + k) % 20 if i % 3 else (i + k) % 7
                                    for i in range(300)])  # shares of uneven sizes  # fmt: skip
                shares = topic.shares(batch, targets)
                assert isinstance(shares, topic_log.Shares) and shares.whole is not None
                if name == "whole":
                    assert topic.append_ledger(shares)
                    assert made == [], "the ledger path made a share's batch"
                joined = pa.Table.from_batches([piece for _, _, piece in shares])
                assert made, "the pieces above are made (and counted) when read"
                made.clear()
                assert joined.combine_chunks().to_batches()[0].equals(shares.whole)
                if name == "list":
                    assert topic.append_ledger(list(shares))
            found.append({p: _rows(topic, p) for p in range(20)})
        finally:
            topic.close()
    assert found[0] == found[1]
    assert sum(len(rows) for rows in found[0].values()) == 900
