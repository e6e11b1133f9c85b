"""A consumer poll over many partitions reads the rows the topic's ledger holds where it
holds them (``storage.bulk_scan.scan_many`` with ``Ledger.spans_many``), instead of
copying them into every partition first (``PartitionLog.settle``): the same rows, at the
same offsets, in the same order as the same polls with the ledger off; nothing copied
by the poll; a partition partly copied is read from its segments then from the ledger;
a range released under the read falls back to the partition reads, which settle; a
fenced partition's ledger rows are read there too (it takes no copy until the reopen)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from engine.database import Database
from storage import limits
from storage.errors import PartitionFencedError, StorageIOError
from storage.ledger_route import TopicLedger
from storage.record_batch import build_wire_batch

PARTITIONS = limits.LEDGER_SHARES_MIN * 2
INSERT = "INSERT INTO TOPIC t (data, producer_id) SELECT unnest(?), unnest(?)"
POLL = ("SELECT partition, offset, data FROM TOPIC t "
        "WITH (consumer = 'c', max_messages = {})")  # fmt: skip
# the stored columns only: gathered from the buffer without building the others
POLL_STORED = ("SELECT data, producer_id, seq_no FROM TOPIC t "
               "WITH (consumer = 'c', max_messages = {})")  # fmt: skip


def _rows(first: int, count: int) -> list[list[Any]]:
    return [[f"m{first + i}".encode() for i in range(count)],
            [f"p{(first + i) % (PARTITIONS * 3)}" for i in range(count)]]  # fmt: skip


@pytest.fixture
def no_copier(monkeypatch: pytest.MonkeyPatch) -> None:
    """The copier never runs on its own: what is copied, a test copies. And every poll
    plans partition by partition, reading across (no poll takes whole ledger frames,
    ``tests/engine/test_ledger_whole_reads.py``)."""
    monkeypatch.setattr(limits, "LEDGER_COPY_FRAMES_MIN", 10**9)
    monkeypatch.setattr(limits, "LEDGER_COPY_WAIT_S", 3600.0)
    monkeypatch.setattr(limits, "LEDGER_WHOLE_FRAMES_READ", False)


def _open(path: Path, monkeypatch: pytest.MonkeyPatch, ledger: bool) -> Database:
    monkeypatch.setenv("TOPICBASE_LEDGER", "1" if ledger else "0")
    database = Database.open(str(path / ("on" if ledger else "off")))
    session = database.connect()
    session.execute(f"CREATE TOPIC t (CONSUMER c) WITH (min_active_partitions = {PARTITIONS})")
    return database


def _topic(database: Database) -> Any:
    entry = database.catalog.entry("t")
    assert entry is not None
    return database.topic_log(entry.topic_id)


def _written(database: Database, messages: int) -> tuple[Any, Any]:
    """``messages`` written by statements of 400; a session and the topic."""
    session = database.connect()
    for first in range(0, messages, 400):
        session.execute(INSERT, _rows(first, 400))
    return session, _topic(database)


def _polls(database: Database, size: int, poll: str = POLL) -> list[list[tuple[Any, ...]]]:
    """Poll with consumer ``c`` until a poll comes back empty; each poll's rows."""
    session = database.connect()
    polls = []
    while True:
        rows = session.execute(poll.format(size))[0].table.to_pylist()
        if not rows:
            return polls
        polls.append([tuple(row.values()) for row in rows])


def _check_dense(polls: list[list[tuple[Any, ...]]], count: int) -> None:
    """Every message once, each partition's offsets dense from 0 in poll order."""
    seen: dict[int, int] = {}
    messages = set()
    for poll in polls:
        for partition, offset, data in poll:
            assert offset == seen.get(partition, 0), (partition, offset)
            seen[partition] = offset + 1
            messages.add(data)
    assert len(messages) == count == sum(seen.values())


@pytest.mark.parametrize("file_bytes", [limits.LEDGER_FILE_BYTES_MAX, 4096])
def test_a_poll_reads_the_ledger_where_it_is_and_matches_the_ledger_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_copier: None, file_bytes: int
) -> None:
    """One ledger file (the rows taken from its map) or several (its bodies copied)."""
    monkeypatch.setattr(limits, "LEDGER_FILE_BYTES_MAX", file_bytes)
    found = {}
    for ledger in (True, False):
        database = _open(tmp_path, monkeypatch, ledger)
        try:
            session, topic = _written(database, 1200)
            if ledger:
                assert all(topic.partition(p).own_end == 0 for p in topic.partition_ids())
            found[ledger] = _polls(database, 500)
            session.execute(INSERT, _rows(1200, 300))
            found[ledger, "stored"] = _polls(database, 100, POLL_STORED)
            if ledger:  # the polls copied nothing into the partitions
                assert all(topic.partition(p).own_end == 0 for p in topic.partition_ids())
                assert len(topic.ledger.ledger.pending()) == PARTITIONS
                files = len(topic.ledger.ledger.file_numbers)
                assert files == 1 if file_bytes > 4096 else files > 1
        finally:
            database.close()
    assert found[True] == found[False]
    assert [len(poll) for poll in found[True]] == [500, 500, 200]
    _check_dense(found[True], 1200)
    assert found[True, "stored"] == found[False, "stored"]
    assert [len(poll) for poll in found[True, "stored"]] == [100, 100, 100]
    assert {row[0] for poll in found[True, "stored"] for row in poll} == set(_rows(1200, 300)[0])


def test_a_partition_partly_copied_is_read_from_its_segments_then_the_ledger(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_copier: None
) -> None:
    database = _open(tmp_path, monkeypatch, True)
    try:
        session = database.connect()
        session.execute(INSERT, _rows(0, 400))
        topic = _topic(database)
        settled = topic.partition_ids()[::2]
        for partition in settled:  # half the partitions: the first statement copied in
            topic.partition(partition).settle()
        session.execute(INSERT, _rows(400, 400))
        ends = {p: topic.partition(p).own_end for p in topic.partition_ids()}
        assert all(ends[p] > 0 for p in settled)
        assert all(ends[p] == 0 for p in topic.partition_ids() if p not in settled)
        polls = _polls(database, 10_000)
        assert len(polls) == 1 and len(polls[0]) == 800
        _check_dense(polls, 800)
        # the second statement's rows stayed in the ledger: nothing more was copied
        assert {p: topic.partition(p).own_end for p in topic.partition_ids()} == ends
        assert sorted({data for _, _, data in polls[0]}) == sorted(_rows(0, 800)[0])
    finally:
        database.close()


def test_a_range_released_under_the_poll_is_read_from_the_partitions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_copier: None
) -> None:
    database = _open(tmp_path, monkeypatch, True)
    try:
        _, topic = _written(database, 800)
        real = TopicLedger.spans_many
        raced = []

        def copier_first(self: TopicLedger, wanted: Any) -> Any:
            # the copier's whole pass (copy, sync, release) lands between the poll's look
            # at each log's end and its look in the ledger
            if not raced:
                raced.append(self.copy_all())
            return real(self, wanted)

        monkeypatch.setattr(TopicLedger, "spans_many", copier_first)
        polls = _polls(database, 10_000)
        assert raced == [800]
        assert not topic.ledger.ledger.pending()  # all released: read from the partitions
        assert len(polls) == 1
        _check_dense(polls, 800)
    finally:
        database.close()


@pytest.mark.parametrize("poll_size", [10_000, 37])
def test_a_fenced_partitions_ledger_rows_are_polled_and_peeked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_copier: None, poll_size: int
) -> None:
    """A partition fenced (an I/O error of a write to it) after its rows went to the
    ledger: it takes no copy until the reopen, yet its rows were acknowledged; polls (one
    buffer of many partitions, and small ones, which read partition by partition) and a
    peek of the partition read them, every row once; writes to it stay refused; the
    consumer's committed offsets hold across the reopen, which copies the rows in."""
    path = tmp_path
    database = _open(path, monkeypatch, True)
    try:
        _, topic = _written(database, 800)
        fenced = topic.partition_ids()[3]
        log = topic.partition(fenced)
        with log.write_lock:
            log.fence_for(StorageIOError("injected: a failed write"))
        held = log.reader_end
        assert log.own_end == 0 and held > 0 and log.end_offset == held
        polls = _polls(database, poll_size)
        _check_dense(polls, 800)
        assert sum(1 for poll in polls for row in poll if row[0] == fenced) == held
        session = database.connect()
        peek = session.execute(f"SELECT offset, data FROM TOPIC t WITH (partition = {fenced})")
        assert [row["offset"] for row in peek[0].table.to_pylist()] == list(range(held))
        with pytest.raises(PartitionFencedError):
            topic.append(build_wire_batch([b"x"]), fenced)
    finally:
        database.close()
    monkeypatch.setenv("TOPICBASE_LEDGER", "1")
    reopened = Database.open(str(path / "on"))
    try:
        assert _topic(reopened).partition(fenced).own_end == held  # copied at the open
        assert _polls(reopened, poll_size) == []  # every row was consumed before
    finally:
        reopened.close()
