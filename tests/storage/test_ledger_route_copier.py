"""The ledger copier's pass (``TopicLedger.copy_all``, round 30): one ``Ledger.read_many``
for every pending partition, read with no partition lock held, then under each lock only
what is still past the log's end; settles racing it; release at share edges only; a
fenced partition passed over."""

from __future__ import annotations

import random
import threading
from typing import Any

import pytest

import storage.fs as fs_module
from storage import failpoints, limits
from storage.errors import PartitionFencedError, StorageIOError
from storage.topic_log import TopicLog

from .test_ledger_route import PARTITIONS, _expected, _open, _rows, _statement


@pytest.fixture(autouse=True)
def _no_background_copier(monkeypatch: pytest.MonkeyPatch) -> None:
    """The copier thread never comes due: each test runs ``copy_all`` itself."""
    monkeypatch.setattr(limits, "LEDGER_COPY_FRAMES_MIN", 10**9)
    monkeypatch.setattr(limits, "LEDGER_COPY_WAIT_S", 3600.0)


def _check_all(topic: TopicLog, statements: range) -> None:
    for p in range(PARTITIONS):
        assert _rows(topic, p) == _expected(statements, p), p


def test_a_pass_reads_the_ledger_once_for_every_partition(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    topic = _open(str(tmp_path), create=True)
    try:
        assert topic.ledger is not None
        ledger = topic.ledger.ledger
        calls = {"read": 0, "read_many": 0}
        for name in calls:
            real = getattr(ledger, name)

            def counted(*args: Any, _real: Any = real, _name: str = name, **kw: Any) -> Any:
                calls[_name] += 1
                return _real(*args, **kw)

            monkeypatch.setattr(ledger, name, counted)
        for k in range(4):
            topic.append_ledger(_statement(k))
        assert topic.ledger.copy_all() == 8 * PARTITIONS
        assert calls == {"read": 0, "read_many": 1}
        assert ledger.pending() == {}
        _check_all(topic, range(4))
    finally:
        topic.close()


def test_partitions_settled_between_the_read_and_the_lock_are_not_written_twice(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Partition 3 is settled and then appended to before the pass's read (its own end
    seen by the pass is stale: the write slices the rows read); partition 6 is settled
    after the read (its rows read are all in the log already: nothing written)."""
    topic = _open(str(tmp_path), create=True)
    try:
        assert topic.ledger is not None
        ledger = topic.ledger.ledger
        real = ledger.read_many
        seen: list[dict[int, int]] = []

        def racing(starts: Any, *args: Any, **kw: Any) -> Any:
            seen.append(dict(starts))
            if len(seen) == 1:
                assert topic.partition(3).end_offset == 6  # a reader settles 3
                topic.append_ledger(_statement(3))
            result = real(starts, *args, **kw)
            if len(seen) == 1:
                assert topic.partition(6).end_offset == 8  # and 6, after the read
            return result

        monkeypatch.setattr(ledger, "read_many", racing)
        for k in range(3):
            topic.append_ledger(_statement(k))
        topic.ledger.copy_all()
        assert seen and seen[0][3] == 0  # the pass read partition 3 from before its settle
        assert ledger.pending() == {}
        _check_all(topic, range(4))
        for p in range(PARTITIONS):
            assert topic.partition(p).durable_end == 8
            assert not topic.partition(p).ledger_unsettled
    finally:
        topic.close()


def test_settles_and_appends_racing_the_copier_keep_every_row_once(tmp_path: Any) -> None:
    topic = _open(str(tmp_path), create=True)
    statements = 60
    try:
        assert topic.ledger is not None
        done = threading.Event()
        errors: list[BaseException] = []

        def produce() -> None:
            rng = random.Random(30)
            try:
                for k in range(statements):
                    assert topic.append_ledger(_statement(k)) is not None
                    for p in rng.sample(range(PARTITIONS), 3):
                        topic.partition(p).end_offset  # noqa: B018 (a reader's settle)
            except BaseException as error:  # checked below
                errors.append(error)
            finally:
                done.set()

        thread = threading.Thread(target=produce)
        thread.start()
        passes = 0
        while not done.is_set():
            topic.ledger.copy_all()
            passes += 1
        thread.join()
        assert not errors, errors
        topic.ledger.copy_all()
        assert passes > 1
        assert topic.ledger.ledger.pending() == {}
        _check_all(topic, range(statements))
    finally:
        topic.close()


def test_reads_in_parts_copy_and_release_at_share_edges_only(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read of at most 5 messages (whole frames: one statement, 16) and pieces of about
    one share: the log's frames begin at share edges, everything is released."""
    monkeypatch.setattr(limits, "LEDGER_COPY_MESSAGES_MAX", 5)
    monkeypatch.setattr(limits, "LEDGER_COPY_PIECE_BYTES", 64)
    topic = _open(str(tmp_path), create=True)
    try:
        assert topic.ledger is not None
        for k in range(6):
            topic.append_ledger(_statement(k))
        assert topic.partition(2).end_offset == 12  # settled by a reader: one frame
        assert topic.ledger.copy_all() == 12 * PARTITIONS
        assert topic.ledger.ledger.pending() == {}
        _check_all(topic, range(6))
        for p in range(PARTITIONS):
            firsts = [frame.header.base_offset for segment in topic.partition(p).segments
                      for frame in segment.scan(0, segment.size_bytes, 1 << 20)]  # fmt: skip
            assert all(first % 2 == 0 for first in firsts), (p, firsts)  # shares of 2
            if p != 2:
                assert len(firsts) > 1, (p, firsts)  # the pass wrote it in parts
    finally:
        topic.close()


def test_a_fenced_partition_does_not_hold_back_the_others(tmp_path: Any) -> None:
    topic = _open(str(tmp_path), create=True)
    try:
        assert topic.ledger is not None
        for k in range(2):
            topic.append_ledger(_statement(k))
        failpoints.activate("partition.after_write=error@3")  # the third partition written
        with pytest.raises(StorageIOError):
            topic.ledger.copy_all()
        failpoints.deactivate()
        with pytest.raises(PartitionFencedError):
            topic.ledger.copy_all()
        assert set(topic.ledger.ledger.pending()) == {2}  # its rows wait for the reopen
        for p in set(range(PARTITIONS)) - {2}:
            assert _rows(topic, p) == _expected(range(2), p)
            assert topic.partition(p).durable_end == 4
    finally:
        failpoints.deactivate()
        topic.close()
    reopened = _open(str(tmp_path))
    try:
        _check_all(reopened, range(2))
    finally:
        reopened.close()


def test_settle_all_writes_every_row_into_the_logs_and_syncs_and_releases_nothing(
    tmp_path: Any,
) -> None:
    topic = _open(str(tmp_path), create=True)
    try:
        assert topic.ledger is not None
        ledger = topic.ledger.ledger
        for k in range(3):
            topic.append_ledger(_statement(k))
        pending = ledger.pending()
        durable = {p: topic.partition(p).durable_end for p in range(PARTITIONS)}
        topic.ledger.settle_all()
        for p in range(PARTITIONS):
            log = topic.partition(p)
            assert log.own_end == ledger.end_offset(p) and not log.ledger_unsettled
            assert log.durable_end == durable[p]  # not synced
        assert ledger.pending() == pending  # nothing released: the ledger keeps them durable
        _check_all(topic, range(3))
        assert topic.ledger.copy_all() == 6 * PARTITIONS  # a pass then syncs and releases
        assert ledger.pending() == {}
    finally:
        topic.close()


def test_a_pass_syncs_its_logs_with_one_sync_of_the_file_system(tmp_path: Any) -> None:
    topic = _open(str(tmp_path), create=True)
    try:
        assert topic.ledger is not None
        for k in range(3):
            topic.append_ledger(_statement(k))
        fs = topic.ledger.ledger._fs
        before = fs.fsync_count
        assert topic.ledger.copy_all() == 6 * PARTITIONS
        syncs = topic.ledger._syncs
        if fs_module._syncfs is not None:
            assert (syncs.together, syncs.fell_back) == (1, 0)
            assert fs.fsync_count - before == 1, "one syncfs, not one fdatasync a partition"
        else:  # no syncfs here: each log synced on its own
            assert fs.fsync_count - before == PARTITIONS
        assert topic.ledger.ledger.pending() == {}
        for p in range(PARTITIONS):
            assert topic.partition(p).durable_end == 6
    finally:
        topic.close()
    reopened = _open(str(tmp_path))
    try:
        _check_all(reopened, range(3))
    finally:
        reopened.close()


def test_a_pass_whose_file_system_sync_fails_syncs_each_log_and_releases(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    topic = _open(str(tmp_path), create=True)
    try:
        assert topic.ledger is not None
        for k in range(2):
            topic.append_ledger(_statement(k))
        monkeypatch.setattr(fs_module, "_syncfs", lambda fd: -1)  # reports a failure
        fs = topic.ledger.ledger._fs
        before = fs.fsync_count
        assert topic.ledger.copy_all() == 4 * PARTITIONS
        if topic.ledger._syncs._handle is not None:
            assert topic.ledger._syncs.fell_back == 1
            assert fs.fsync_count - before == 1 + PARTITIONS
        assert topic.ledger.ledger.pending() == {}
        _check_all(topic, range(2))
    finally:
        topic.close()


def test_a_read_below_the_logs_own_end_does_not_settle_and_one_past_it_does(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``read_frames(settle=False)`` (a consumer's partition reads, round 38): rows wholly
    below the log's own end are read from its segments and the ledger's rows past it stay
    there; a read that may reach past the own end (``start + max_messages`` over it, by
    one or more) settles first, and reads them. ``settle=True`` (the default) always
    settles."""
    topic = _open(str(tmp_path), create=True)
    try:
        for k in range(2):
            topic.append_ledger(_statement(k))
        assert topic.ledger is not None
        topic.ledger.copy_all()
        topic.append_ledger(_statement(2))  # two rows a partition past each own end
        settled: list[int] = []
        real = type(topic.partition(0)).settle

        def counted(self: Any) -> Any:
            settled.append(self.partition_id)
            return real(self)

        monkeypatch.setattr(type(topic.partition(0)), "settle", counted)
        log = topic.partition(0)
        assert log.own_end == 4 and log.ledger_unsettled
        found = log.read_frames(1, max_messages=3, settle=False)  # offsets 1-3: to the end
        assert settled == [] and log.own_end == 4 and log.ledger_unsettled
        assert found.message_count == 3 and found.next_offset == 4
        found = log.read_frames(1, max_messages=4, settle=False)  # offset 4 is the ledger's
        assert settled == [0] and log.own_end == 6 and not log.ledger_unsettled
        assert found.message_count == 4 and found.next_offset == 5
        other = topic.partition(1)
        other.read_frames(0, max_messages=1)  # the default: settles, though below its end
        assert settled == [0, 1] and other.own_end == 6
        _check_all(topic, range(3))
    finally:
        topic.close()
