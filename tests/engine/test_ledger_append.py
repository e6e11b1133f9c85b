"""An autocommit write spread over many partitions goes to the topic's ledger when the
store's switch is on (``TOPICBASE_LEDGER=1``; ``engine.spread_append``,
``storage.ledger_route``): one ledger frame and one sync, no staging record; RETURNING
reports each message's partition and offset; a resend is wholly duplicate; the rows are
read back at their offsets before and after a reopen. Off (the default), nothing changes."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from engine.database import Database
from storage import errors, limits
from storage.ledger import Ledger
from storage.ledger_route import TopicLedger

INSERT = (
    "INSERT INTO TOPIC t (data, producer_id, seq_no) SELECT unnest(?), unnest(?), unnest(?)"
)
RETURNING = INSERT + " RETURNING partition, offset, status"
PARTITIONS = limits.LEDGER_SHARES_MIN * 2


def _rows(first: int, count: int) -> list[list]:
    return [[f"m{first + i}".encode() for i in range(count)],
            [f"p{i % (PARTITIONS * 4)}" for i in range(count)],
            [first + i for i in range(count)]]  # fmt: skip


def _read_all(database: Database) -> dict[bytes, tuple[int, int]]:
    entry = database.catalog.entry("t")
    assert entry is not None
    topic = database.topic_log(entry.topic_id)
    found: dict[bytes, tuple[int, int]] = {}
    for partition_id in topic.partition_ids():
        result = topic.partition(partition_id).read(0, max_messages=100_000)
        for batch in result.batches:
            for data, offset in zip(batch.column("data").to_pylist(),
                                    batch.column("offset").to_pylist(), strict=True):  # fmt: skip
                assert data not in found
                found[data] = (partition_id, offset)
    return found


def _open(path: Path) -> Database:
    return Database.open(str(path / "data"))


def _spread_topic(database: Database) -> tuple[Any, Any]:
    """A session and topic ``t``'s ledger (``PARTITIONS`` partitions, the switch on)."""
    session = database.connect()
    session.execute(f"CREATE TOPIC t WITH (min_active_partitions = {PARTITIONS})")
    entry = database.catalog.entry("t")
    assert entry is not None
    ledger = database.topic_log(entry.topic_id).ledger
    assert ledger is not None
    return session, ledger


@pytest.mark.parametrize("switch", ["1", "0"])
def test_a_spread_write_goes_to_the_ledger_only_with_the_switch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, switch: str
) -> None:
    monkeypatch.setenv("TOPICBASE_LEDGER", switch)
    database = _open(tmp_path)
    try:
        session = database.connect()
        session.execute(f"CREATE TOPIC t WITH (min_active_partitions = {PARTITIONS})")
        before = database.commit_counters()
        first = session.execute(RETURNING, _rows(0, 400))[0].table.to_pylist()
        after = database.commit_counters()
        entry = database.catalog.entry("t")
        assert entry is not None
        ledger = database.topic_log(entry.topic_id).ledger
        if switch == "1":
            assert ledger is not None
            assert after["log_commits"] == before["log_commits"]  # no staging record
            assert len(ledger.ledger.pending()) == PARTITIONS
        else:
            assert ledger is None
            assert after["log_commits"] == before["log_commits"] + 1
        found = _read_all(database)
        assert len(found) == 400
        for index, row in enumerate(first):
            assert row["status"] == "written"
            assert found[f"m{index}".encode()] == (row["partition"], row["offset"])
        again = session.execute(RETURNING, _rows(0, 400))[0].table.to_pylist()
        assert again == [{**row, "status": "duplicate"} for row in first]
        session.execute(INSERT, _rows(400, 400))
        # read through SQL before any copy finished (the reads settle what they need)
        count = session.execute("SELECT count(*) AS n FROM TOPIC t")[0].table.to_pylist()
        assert count == [{"n": 800}]
        session.close()
    finally:
        database.close()
    reopened = _open(tmp_path)
    try:
        found = _read_all(reopened)
        assert len(found) == 800
        for index, row in enumerate(first):
            assert found[f"m{index}".encode()] == (row["partition"], row["offset"])
        session = reopened.connect()
        count = session.execute("SELECT count(*) AS n FROM TOPIC t")[0].table.to_pylist()
        assert count == [{"n": 800}]
        session.close()
    finally:
        reopened.close()


def test_a_drop_that_closes_the_ledger_under_a_statement_refuses_it_with_42p01(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DROP TOPIC closes the topic's ledger between a spread statement's checks and its
    frame's round (the statement holds its partitions' locks, so the DROP then waits for
    them): the round refuses, nothing is written, and the statement gets what the staging
    path gives a statement whose topic was dropped under it, 42P01."""
    monkeypatch.setenv("TOPICBASE_LEDGER", "1")
    database = _open(tmp_path)
    try:
        session, _ = _spread_topic(database)
        real = Ledger.append_whole
        dropper: list[threading.Thread] = []

        def dropped_first(self: Ledger, *args: Any, **kwargs: Any) -> Any:
            thread = threading.Thread(target=lambda: database.connect().execute("DROP TOPIC t"))
            dropper.append(thread)
            thread.start()
            deadline = time.monotonic() + 10
            while not self._closed and time.monotonic() < deadline:  # the DROP got this far
                time.sleep(0.005)
            assert self._closed
            return real(self, *args, **kwargs)

        monkeypatch.setattr(Ledger, "append_whole", dropped_first)
        with pytest.raises(errors.UndefinedTopicError, match="dropped") as raised:
            session.execute(INSERT, _rows(0, 400))
        assert raised.value.sqlstate == "42P01"
        dropper[0].join(10)
        assert not dropper[0].is_alive()
        assert database.catalog.entry("t") is None
        session.execute(f"CREATE TOPIC t WITH (min_active_partitions = {PARTITIONS})")
        monkeypatch.setattr(Ledger, "append_whole", real)
        session.execute(INSERT, _rows(0, 400))  # the new topic takes the statement
        assert session.execute("SELECT count(*) AS n FROM TOPIC t")[0].table.to_pylist() == [
            {"n": 400}
        ]
        session.close()
    finally:
        database.close()


def test_a_cancel_while_the_statement_waits_for_its_partitions_refuses_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cancel (statement_timeout's timer, a client's cancel request) that comes while a
    spread statement waits for its partitions' locks, after its first look, refuses it
    before its frame's round, as the staging path refuses one before its commit point
    (57014): nothing written, no producer state moved, and the next statement commits."""
    monkeypatch.setenv("TOPICBASE_LEDGER", "1")
    monkeypatch.setattr(limits, "LEDGER_COPY_WAIT_S", 3600.0)  # the copier held off
    database = _open(tmp_path)
    try:
        session, ledger = _spread_topic(database)
        real = TopicLedger._follow_locked

        def cancelled_under_the_locks(self: TopicLedger, log: Any) -> bool:
            session.cancel()  # every lock of the statement is held by now
            return real(self, log)

        monkeypatch.setattr(TopicLedger, "_follow_locked", cancelled_under_the_locks)
        with pytest.raises(errors.QueryCanceledError) as raised:
            session.execute(INSERT, _rows(0, 400))
        assert raised.value.sqlstate == "57014"
        assert ledger.ledger.next_sequence == 0 and ledger.ledger.pending() == {}
        assert _read_all(database) == {}
        monkeypatch.setattr(TopicLedger, "_follow_locked", real)
        returned = session.execute(RETURNING, _rows(0, 400))[0].table.to_pylist()
        assert {row["status"] for row in returned} == {"written"}  # not seen as duplicates
        assert ledger.ledger.next_sequence == 1
        assert len(_read_all(database)) == 400
    finally:
        database.close()
