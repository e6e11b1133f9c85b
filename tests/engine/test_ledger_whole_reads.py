"""A consumer poll standing at the edges of the ledger's oldest unread frames takes them
whole (``Ledger.whole_frames``, ``engine.reads._read_all``): every message once, each
partition's offsets dense and ascending from poll to poll, the same rows per partition as
the ledger off, in whole frames within the budget; a consumer inside a frame reads
partition by partition until it stands at the edges again; offsets commit (and roll back)
as with any poll; copied and released rows are read from the partitions."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from engine import reads
from engine.database import Database
from storage import limits
from storage.ledger import Ledger
from storage.partition_log import PartitionLog
from tests.engine.test_ledger_read_across import (
    INSERT,
    POLL,
    POLL_STORED,
    _check_dense,
    _open,
    _polls,
    _rows,
    _written,
)

STATEMENT = 400  # ``_written``'s statements: one ledger frame each


@pytest.fixture
def no_copier(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The copier never runs on its own; the messages of every whole-frame read."""
    monkeypatch.setattr(limits, "LEDGER_COPY_FRAMES_MIN", 10**9)
    monkeypatch.setattr(limits, "LEDGER_COPY_WAIT_S", 3600.0)
    taken: list[int] = []
    real = Ledger.whole_frames

    def counted(self: Ledger, *args: Any) -> Any:
        found = real(self, *args)
        if found is not None:
            taken.append(found.message_count)
        return found

    monkeypatch.setattr(Ledger, "whole_frames", counted)
    return taken


def _by_partition(polls: list[list[tuple[Any, ...]]]) -> dict[int, list[tuple[Any, ...]]]:
    """Each partition's (offset, data) in the order the polls returned them."""
    found: dict[int, list[tuple[Any, ...]]] = {}
    for poll in polls:
        for partition, offset, data in poll:
            found.setdefault(partition, []).append((offset, data))
    return found


def test_a_consumer_keeping_up_takes_whole_frames_and_reads_as_the_ledger_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_copier: list[int]
) -> None:
    found = {}
    for ledger in (True, False):
        database = _open(tmp_path, monkeypatch, ledger)
        try:
            session, topic = _written(database, 2400)
            found[ledger] = _polls(database, 1000)
            session.execute(INSERT, _rows(2400, 400))
            found[ledger, "stored"] = _polls(database, 1000, POLL_STORED)
            if ledger:  # nothing was copied into the partitions by the polls
                assert all(topic.partition(p).own_end == 0 for p in topic.partition_ids())
        finally:
            database.close()
    # whole frames of 400 within 1000 messages: two a poll (the ledger off: 1000 a poll)
    assert [len(poll) for poll in found[True]] == [800, 800, 800]
    assert [len(poll) for poll in found[False]] == [1000, 1000, 400]
    assert no_copier == [800, 800, 800, 400]
    _check_dense(found[True], 2400)
    assert _by_partition(found[True]) == _by_partition(found[False])
    # frame after frame: the first poll's first 400 rows are the first statement's
    assert sorted(row[2] for row in found[True][0][:STATEMENT]) == sorted(_rows(0, 400)[0])
    assert [len(poll) for poll in found[True, "stored"]] == [400]
    assert sorted(found[True, "stored"][0]) == sorted(found[False, "stored"][0])


def test_a_consumer_inside_a_frame_reads_by_partition_until_it_is_at_the_edges(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_copier: list[int]
) -> None:
    database = _open(tmp_path, monkeypatch, True)
    try:
        session, _ = _written(database, 1200)
        polls = [  # a frame over the budget: partition by partition
            [tuple(row.values()) for row in session.execute(POLL.format(100))[0].table.to_pylist()]
            for _ in range(3)
        ]
        assert [len(poll) for poll in polls] == [100, 100, 100] and not no_copier
        polls += _polls(database, 1000)  # inside frames: the usual reads to the end
        assert not no_copier
        session.execute(INSERT, _rows(1200, 400))
        session.execute(INSERT, _rows(1600, 400))
        polls += _polls(database, 1000)  # at the edges again: the new frames whole
        assert no_copier == [800]
        _check_dense(polls, 2000)
    finally:
        database.close()


def test_whole_frame_reads_commit_their_offsets_and_roll_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_copier: list[int]
) -> None:
    database = _open(tmp_path, monkeypatch, True)
    try:
        _written(database, 1600)
        session = database.connect()
        session.execute("BEGIN")
        first = session.execute(POLL.format(800))[0].table.to_pylist()
        second = session.execute(POLL.format(800))[0].table.to_pylist()  # from the first's end
        session.execute("ROLLBACK")
        assert len(first) == len(second) == 800
        assert {r["data"] for r in first}.isdisjoint({r["data"] for r in second})
        again = session.execute(POLL.format(800))[0].table.to_pylist()  # autocommit
        assert again == first
        assert no_copier == [800, 800, 800]
    finally:
        database.close()
    database = Database.open(str(tmp_path / "on"))  # the offsets committed are durable
    try:
        rest = _polls(database, 10_000)
        assert [len(poll) for poll in rest] == [800]
        assert {row[2] for row in rest[0]} == set(_rows(800, 800)[0])
    finally:
        database.close()


@pytest.mark.parametrize(
    ("file_bytes", "keep_bytes"),
    [(limits.LEDGER_FILE_BYTES_MAX, 0), (4096, 0), (4096, limits.LEDGER_KEEP_COPIED_BYTES)],
)
def test_rows_copied_and_released_are_read_whole_until_their_files_go(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    no_copier: list[int],
    file_bytes: int,
    keep_bytes: int,
) -> None:
    """Released rows are the partitions' rows too: read whole while a ledger file holds
    them (one file, the one written: never dropped; or files the copier keeps, round 33);
    once their files are dropped (a file a frame: all but the last), from the partitions,
    up to the edges of the frame still held (round 34), which is then taken whole."""
    monkeypatch.setattr(limits, "LEDGER_FILE_BYTES_MAX", file_bytes)
    monkeypatch.setattr(limits, "LEDGER_KEEP_COPIED_BYTES", keep_bytes)
    monkeypatch.setattr(limits, "LEDGER_KEEP_UNREAD_BYTES", keep_bytes)  # (no more if unread)
    database = _open(tmp_path, monkeypatch, True)
    try:
        _, topic = _written(database, 800)
        assert topic.ledger.copy_all() == 800  # copied, synced and released
        assert not topic.ledger.ledger.pending()
        kept = file_bytes > 4096 or keep_bytes > 0
        # one file written (never dropped), or a file a frame, both kept
        assert len(topic.ledger.ledger.file_numbers) == (2 if keep_bytes else 1)
        polls = _polls(database, 1000)
        assert [len(poll) for poll in polls] == ([800] if kept else [400, 400])
        assert no_copier == ([800] if kept else [400])
        _check_dense(polls, 800)
    finally:
        database.close()


def test_a_consumer_resumes_after_the_frames_it_took_past_more_than_the_walk_allows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_copier: list[int]
) -> None:
    """A poll at the offsets an earlier one left starts after the frames that one took
    (its resume point): with the walk limited to 1 read frame, a consumer that took
    frames 1-3 takes frames 4-6 whole, where a walk from the oldest frame (past 3 read
    ones) gives up and reads partition by partition (checked last, the resume point
    forgotten)."""
    monkeypatch.setattr(limits, "LEDGER_WHOLE_WALK_MAX", 1)
    database = _open(tmp_path, monkeypatch, True)
    try:
        session, topic = _written(database, 3 * STATEMENT)
        first = _polls(database, 3 * STATEMENT)
        assert no_copier == [3 * STATEMENT]
        session.execute(INSERT, _rows(3 * STATEMENT, 3 * STATEMENT))  # one frame
        for first_row in range(6 * STATEMENT, 8 * STATEMENT, STATEMENT):
            session.execute(INSERT, _rows(first_row, STATEMENT))
        second = _polls(database, 5 * STATEMENT)
        assert no_copier == [3 * STATEMENT, 5 * STATEMENT]
        _check_dense(first + second, 8 * STATEMENT)
        topic.ledger.ledger._whole_resume.clear()  # without its resume point: the walk
        session.execute(INSERT, _rows(8 * STATEMENT, STATEMENT))
        third = _polls(database, 10_000)
        assert no_copier == [3 * STATEMENT, 5 * STATEMENT]  # partition by partition
        _check_dense(first + second + third, 9 * STATEMENT)
    finally:
        database.close()


def test_full_relation_of_whole_frames(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_copier: list[int]
) -> None:
    """Every column (not only the stored ones): offsets, partitions and write times built."""
    database = _open(tmp_path, monkeypatch, True)
    try:
        _written(database, 800)
        session = database.connect()
        rows = session.execute(
            "SELECT partition, offset, data, producer_id, codec, written_at FROM TOPIC t "
            "WITH (consumer = 'c', max_messages = 1000)"
        )[0].table.to_pylist()
        assert no_copier == [800] and len(rows) == 800
        _check_dense([[(r["partition"], r["offset"], r["data"]) for r in rows]], 800)
        assert {r["codec"] for r in rows} == {"raw"}
        assert all(r["written_at"] is not None for r in rows)
        peek = session.execute("SELECT partition, offset, data, producer_id FROM TOPIC t")
        key = ("partition", "offset", "data", "producer_id")
        expected = {tuple(r[k] for k in key) for r in peek[0].table.to_pylist()}
        assert {tuple(r[k] for k in key) for r in rows} == expected
    finally:
        database.close()


def test_a_resume_point_does_not_apply_once_the_offsets_moved_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_copier: list[int]
) -> None:
    """After a reset to EARLIEST the consumer stands below the frames its resume point
    skips: the point does not apply, and it reads them whole again from the first."""
    database = _open(tmp_path, monkeypatch, True)
    try:
        session, _ = _written(database, 3 * STATEMENT)
        first = _polls(database, STATEMENT)
        assert no_copier == [STATEMENT] * 3
        session.execute("ALTER TOPIC t ALTER CONSUMER c SET OFFSETS TO EARLIEST")
        again = _polls(database, STATEMENT)
        assert no_copier == [STATEMENT] * 6  # whole again, from the first frame
        assert again == first
    finally:
        database.close()


def _six_files(database: Database) -> tuple[Any, Any, list[int], list[int]]:
    """Six statements, a ledger file each (the caller opened the database with
    ``LEDGER_FILE_BYTES_MAX`` at 4096), not copied: a session, the topic, its ledger's
    file numbers and their sizes."""
    session, topic = _written(database, 6 * STATEMENT)
    ledger = topic.ledger.ledger
    files = ledger.file_numbers
    assert len(files) == 6
    return session, topic, files, [ledger._files[n].size for n in files]


def test_a_consumer_behind_the_kept_files_reads_to_their_edges_then_takes_them_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_copier: list[int]
) -> None:
    """Round 34: a consumer further behind than the copied files the copier keeps (their
    oldest dropped) reads the dropped rows from the partitions, every partition up to its
    first share the ledger still holds and no further, and then stands at the kept
    frames' edges and takes them whole. Before, its poll read the copies past those edges
    (a budget of 1000 ends inside a frame), and every later poll read partition by
    partition: a backlog a little over the kept budget read at the copies' speed whole."""
    monkeypatch.setattr(limits, "LEDGER_FILE_BYTES_MAX", 4096)  # a file a frame
    database = _open(tmp_path, monkeypatch, True)
    try:
        _, topic, files, sizes = _six_files(database)
        ledger = topic.ledger.ledger
        monkeypatch.setattr(limits, "LEDGER_KEEP_COPIED_BYTES", sizes[-2] + sizes[-3])
        # behind the larger budget for unread files too (round 35)
        monkeypatch.setattr(limits, "LEDGER_KEEP_UNREAD_BYTES", sizes[-2] + sizes[-3])
        assert topic.ledger.copy_all() == 6 * STATEMENT
        assert ledger.file_numbers == files[-3:]  # two kept, and the one being written
        polls = _polls(database, 1000)
        # the dropped 3 frames from the partitions (1000, then 200 to the edges), then
        # the 3 kept frames whole (two fit in 1000, then one)
        assert [len(poll) for poll in polls] == [1000, 200, 800, 400]
        assert no_copier == [800, 400]
        _check_dense(polls, 6 * STATEMENT)
    finally:
        database.close()


@pytest.mark.parametrize("one_buffer", [True, False])
def test_a_consumer_catching_up_leaves_the_uncopied_rows_to_the_copier(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_copier: list[int], one_buffer: bool
) -> None:
    """Round 38: a consumer behind the kept files reads the dropped rows from the
    partitions' segments without settling them, though a later statement's rows wait in
    the ledger uncopied: a settle copies those rows in the poll's thread, partition by
    partition (0.6-0.8 s in one poll of 1000 partitions, where the copier does it in
    ~0.1 s a pass). The polls are as before: the copies to the kept frames' edges, then
    the kept frames and the new one whole, every message once. ``one_buffer`` off: the
    partition reads (``_read_in_turn``) instead of ``scan_many``."""
    monkeypatch.setattr(limits, "LEDGER_FILE_BYTES_MAX", 4096)  # a file a frame
    if not one_buffer:
        monkeypatch.setattr(reads, "SCAN_PARTITIONS_MIN", 10**9)
    database = _open(tmp_path, monkeypatch, True)
    try:
        session, topic, _, sizes = _six_files(database)
        monkeypatch.setattr(limits, "LEDGER_KEEP_COPIED_BYTES", sizes[-2] + sizes[-3])
        monkeypatch.setattr(limits, "LEDGER_KEEP_UNREAD_BYTES", sizes[-2] + sizes[-3])
        assert topic.ledger.copy_all() == 6 * STATEMENT
        session.execute(INSERT, _rows(6 * STATEMENT, STATEMENT))  # left in the ledger
        partitions = topic.partition_ids()
        own_ends = {p: topic.partition(p).own_end for p in partitions}
        assert all(topic.partition(p).ledger_unsettled for p in partitions)
        settled: list[int] = []
        real = PartitionLog.settle

        def counted(self: PartitionLog) -> Any:
            settled.append(self.partition_id)
            return real(self)

        monkeypatch.setattr(PartitionLog, "settle", counted)
        polls = _polls(database, 1000)
        assert settled == []
        assert {p: topic.partition(p).own_end for p in partitions} == own_ends
        # the dropped 3 frames from the partitions, then 4 whole: the 3 kept, the new one
        assert [len(poll) for poll in polls] == [1000, 200, 800, 800]
        assert no_copier == [800, 800]
        _check_dense(polls, 7 * STATEMENT)
    finally:
        database.close()


def test_files_a_consumer_has_not_read_are_kept_past_the_budget_until_it_reads_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_copier: list[int]
) -> None:
    """Round 35: the copier keeps copied files past ``LEDGER_KEEP_COPIED_BYTES`` while a
    consumer of the topic has not read them (within ``LEDGER_KEEP_UNREAD_BYTES``), so a
    consumer behind by more than the budget takes them whole instead of reading the
    dropped ones from the partitions; once it has committed past them, the next pass
    keeps the budget only."""
    monkeypatch.setattr(limits, "LEDGER_FILE_BYTES_MAX", 4096)  # a file a frame
    database = _open(tmp_path, monkeypatch, True)
    try:
        session, topic, files, sizes = _six_files(database)
        ledger = topic.ledger.ledger
        monkeypatch.setattr(limits, "LEDGER_KEEP_COPIED_BYTES", sizes[-2] + sizes[-3])
        assert topic.ledger.copy_all() == 6 * STATEMENT
        assert ledger.file_numbers == files  # all unread by consumer c: all kept
        polls = _polls(database, 1000)
        assert [len(poll) for poll in polls] == [800, 800, 800]  # every frame whole
        assert no_copier == [800, 800, 800]
        _check_dense(polls, 6 * STATEMENT)
        session.execute(INSERT, _rows(6 * STATEMENT, STATEMENT))
        assert topic.ledger.copy_all() == STATEMENT
        # c read them all: the budget's two kept, the file being written
        assert ledger.file_numbers == [*files[-2:], files[-1] + 1]
        # a second consumer that has read nothing keeps the unread ones again, from the
        # oldest still held (the dropped ones are its to read from the partitions)
        session.execute("ALTER TOPIC t ADD CONSUMER late")
        session.execute(INSERT, _rows(7 * STATEMENT, STATEMENT))
        assert topic.ledger.copy_all() == STATEMENT
        assert ledger.file_numbers == [*files[-2:], files[-1] + 1, files[-1] + 2]
    finally:
        database.close()
