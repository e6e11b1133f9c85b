"""A fenced partition's acknowledged ledger rows are read where the ledger holds them
(``PartitionLog.reads_across``, ``read_frames``, ``storage.bulk_scan``): a fenced log
takes no copy (it refuses every write until the reopen), yet its rows in the ledger were
synced there, the commit point; its end counts them, its reads return them at their
offsets, a wait sees them, and the reopen copies them in. Writes to it stay refused.
The ledger is switched on explicitly (``TopicLog(..., ledger=True)``), whatever the lane."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from storage import limits
from storage.bulk_scan import scan_many
from storage.errors import PartitionFencedError, StorageIOError
from storage.topic_log import TopicLog

from .test_ledger_route import PARTITIONS, _open, _statement

FENCED = 3
STATEMENTS = 3  # two messages a partition each


@pytest.fixture(autouse=True)
def no_copier(monkeypatch: pytest.MonkeyPatch) -> None:
    """The copier never runs on its own: what is copied, a test copies."""
    monkeypatch.setattr(limits, "LEDGER_COPY_FRAMES_MIN", 10**9)
    monkeypatch.setattr(limits, "LEDGER_COPY_WAIT_S", 3600.0)


def _expected(partition: int, statements: range = range(STATEMENTS)) -> list[tuple[int, bytes]]:
    data = [f"{k}.{partition}.{i}".encode() for k in statements for i in range(2)]
    return list(enumerate(data))


def _read(topic: TopicLog, partition: int, start: int = 0, **limits_: int) -> list[Any]:
    result = topic.partition(partition).read(start, **limits_)
    return [(r["offset"], r["data"]) for b in result.batches for r in b.to_pylist()]


def _fenced_after_a_copy(tmp_path: Any) -> TopicLog:
    """``STATEMENTS`` statements in the ledger; the first copied into every partition
    (settled: not synced, not released); then partition ``FENCED`` fenced, as an I/O
    error of a write to it would."""
    topic = _open(str(tmp_path), create=True)
    assert topic.append_ledger(_statement(0)) is not None
    for p in range(PARTITIONS):
        topic.partition(p).settle()
    for k in range(1, STATEMENTS):
        assert topic.append_ledger(_statement(k)) is not None
    log = topic.partition(FENCED)
    with log.write_lock:
        log.fence_for(StorageIOError("injected: a failed write"))
    assert log.own_end == 2 and log.ledger_unsettled
    return topic


def test_a_fenced_partition_reads_its_ledger_rows_and_refuses_writes(tmp_path: Any) -> None:
    topic = _fenced_after_a_copy(tmp_path)
    try:
        log = topic.partition(FENCED)
        assert log.reads_across
        assert log.reader_end == log.end_offset == 2 * STATEMENTS
        assert topic.reader_ends([FENCED, 0]) == {FENCED: 2 * STATEMENTS, 0: 2 * STATEMENTS}
        assert _read(topic, FENCED) == _expected(FENCED)
        # budgets hold across the log's own rows and the ledger's
        assert _read(topic, FENCED, max_messages=3) == _expected(FENCED)[:3]
        assert log.read(0, max_messages=3).end_offset == 2 * STATEMENTS  # the partition's
        assert _read(topic, FENCED, 3, max_messages=2) == _expected(FENCED)[3:5]
        assert _read(topic, FENCED, 5) == _expected(FENCED)[5:]
        assert _read(topic, FENCED, 2 * STATEMENTS) == []
        assert log.own_end == 2  # read, not copied
        with pytest.raises(PartitionFencedError):
            topic.append(_statement(9)[FENCED][2], FENCED)
        assert topic.append_ledger(_statement(9)) is None  # the usual way decides
    finally:
        topic.close()


def test_a_poll_of_many_partitions_reads_the_fenced_ones_ledger_rows(tmp_path: Any) -> None:
    topic = _fenced_after_a_copy(tmp_path)
    try:
        plan = [(p, topic.partition(p), 1, 2 * STATEMENTS - 1) for p in range(PARTITIONS)]
        scanned = scan_many(plan, 1 << 20)
        assert scanned is not None
        assert scanned.next_offsets == {p: 2 * STATEMENTS for p in range(PARTITIONS)}
        batch = scanned.decode()
        rows = list(zip(batch.column("offset").to_pylist(), batch.column("data").to_pylist(),
                        strict=True))  # fmt: skip
        per_partition = len(rows) // PARTITIONS
        assert per_partition == 2 * STATEMENTS - 1
        for index, p in enumerate(range(PARTITIONS)):  # the plan's order
            got = rows[index * per_partition : (index + 1) * per_partition]
            assert got == _expected(p)[1:], p
    finally:
        topic.close()


def test_a_copier_pass_leaves_the_fenced_rows_readable_and_the_reopen_copies_them(
    tmp_path: Any,
) -> None:
    topic = _fenced_after_a_copy(tmp_path)
    try:
        with pytest.raises(PartitionFencedError):
            topic.ledger.copy_all()  # the others copied, synced, released
        assert all(topic.partition(p).own_end == 2 * STATEMENTS
                   for p in range(PARTITIONS) if p != FENCED)  # fmt: skip
        assert topic.ledger.ledger.pending().keys() == {FENCED}
        assert _read(topic, FENCED) == _expected(FENCED)
    finally:
        topic.close()
    reopened = _open(str(tmp_path))
    try:
        for p in range(PARTITIONS):
            assert _read(reopened, p) == _expected(p)
        assert reopened.partition(FENCED).own_end == 2 * STATEMENTS
    finally:
        reopened.close()


def test_a_wait_on_a_fenced_partition_sees_its_ledger_rows_and_times_out_past_them(
    tmp_path: Any,
) -> None:
    """Before, a fenced log with ledger rows spun in ``wait_for_data`` (no settle, the
    flag still set): the wait never ended. Run in a thread, joined with a bound far
    above the waits' timeouts: a liveness check, not a timing."""
    topic = _fenced_after_a_copy(tmp_path)
    results: list[bool] = []
    log = topic.partition(FENCED)

    def waits() -> None:
        results.append(log.wait_for_data(2 * STATEMENTS - 1, 5.0))  # a ledger row past it
        results.append(log.wait_for_data(2 * STATEMENTS, 0.05))  # nothing past it

    try:
        thread = threading.Thread(target=waits, daemon=True)
        thread.start()
        thread.join(60.0)
        assert not thread.is_alive(), "wait_for_data did not return"
        assert results == [True, False]
        # the topic's wait too: ready with rows past the position, else it waits (before,
        # a fenced partition with ledger rows was ready whatever the position)
        assert topic.wait_for_any({FENCED: 2 * STATEMENTS - 1}, 5.0)
        assert not topic.wait_for_any({FENCED: 2 * STATEMENTS}, 0.05)
    finally:
        topic.close()
