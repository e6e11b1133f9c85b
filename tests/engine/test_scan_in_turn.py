"""A consumer poll over many partitions of small frames reads them into one buffer
(``engine.reads._scan_in_turn`` over ``storage.bulk_scan``; issue 14, consume at 1000
partitions).

Properties: the polls return the same rows in the same order, move the same offsets
and stop at the same partitions as the partition-by-partition reads they replace,
whatever the bounds; partitions with nothing new are not read; a poll over many
partitions commits every partition's offset; a stale reader's commit is still refused
(40001) and leaves the winner's offsets.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from engine import reads
from storage import bulk_scan, errors, wire_columns
from storage.partition_log import PartitionLog
from tests.engine.conftest import rows

PARTITIONS = 40
BOUNDS = (
    "max_messages = 1",
    "max_messages = 13",
    "max_messages = 100",
    "max_messages = 5000",
    "max_bytes = 3000",
    "max_bytes = 200000",
)


@pytest.fixture
def scans(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Each ``scan_many`` call: whether it read (True) or left the poll to read_frames."""
    calls: list[bool] = []
    original = bulk_scan.scan_many

    def counted(*args: Any) -> Any:
        found = original(*args)
        calls.append(found is not None)
        return found

    monkeypatch.setattr(reads, "scan_many", counted)
    return calls


def _write(session: Any, rng: random.Random, statements: int, partitions: int) -> None:
    for _ in range(statements):
        partition = rng.randrange(partitions)
        count = rng.choice((1, 2, 5, 9, 30))
        tag = rng.randrange(1 << 30)
        values = ", ".join(f"('{tag}-{i}', {partition})" for i in range(count))
        session.execute(f"INSERT INTO TOPIC t (data, partition) VALUES {values}")


def _poll(session: Any, consumer: str, bound: str) -> list[tuple[int, int, bytes]]:
    read = f"SELECT partition, offset, data FROM TOPIC t WITH (consumer = '{consumer}', {bound})"
    return [(r["partition"], r["offset"], bytes(r["data"])) for r in rows(session, read)]


def _offsets(session: Any, consumer: str) -> dict[int, int]:
    found = rows(
        session,
        "SELECT partition, committed_offset FROM sys.consumers "
        f"WHERE topic = 't' AND consumer = '{consumer}'",
    )
    return {r["partition"]: r["committed_offset"] for r in found}


@pytest.mark.parametrize("seed", range(5))
def test_polls_equal_the_partition_reads(
    session: Any, monkeypatch: pytest.MonkeyPatch, scans: list[bool], seed: int
) -> None:
    """Consumer ``fast`` polls with the scan, ``slow`` without it, the same bounds in
    the same order: every poll returns the same rows and leaves the same offsets."""
    rng = random.Random(seed)
    session.execute(
        f"CREATE TOPIC t (CONSUMER fast, CONSUMER slow) WITH (min_active_partitions = {PARTITIONS})"
    )
    for _ in range(5):
        _write(session, rng, rng.randint(0, 60), PARTITIONS)
        for _ in range(rng.randint(1, 5)):
            bound = rng.choice(BOUNDS)
            fast = _poll(session, "fast", bound)
            monkeypatch.setattr(reads, "SCAN_PARTITIONS_MIN", 10**9)
            slow = _poll(session, "slow", bound)
            monkeypatch.setattr(reads, "SCAN_PARTITIONS_MIN", 2)
            assert fast == slow, bound
            assert _offsets(session, "fast") == _offsets(session, "slow")
    assert any(scans), "no poll took the scan"


def test_partitions_with_nothing_new_are_not_read(
    session: Any, monkeypatch: pytest.MonkeyPatch, scans: list[bool]
) -> None:
    session.execute(f"CREATE TOPIC t (CONSUMER c) WITH (min_active_partitions = {PARTITIONS})")
    for partition in range(PARTITIONS):
        session.execute(f"INSERT INTO TOPIC t (data, partition) VALUES ('a', {partition})")
    assert len(_poll(session, "c", "max_messages = 1000")) == PARTITIONS
    for partition in (3, 17, 31):
        for index in range(3):
            session.execute(
                f"INSERT INTO TOPIC t (data, partition) VALUES ('b{index}', {partition})"
            )
    read: list[int] = []
    original = PartitionLog.frame_window

    def counted(self: PartitionLog, *args: Any, **kwargs: Any) -> Any:
        read.append(self.partition_id)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(PartitionLog, "frame_window", counted)
    got = _poll(session, "c", "max_messages = 1000")
    assert scans[-1] is True
    assert sorted(read) == [3, 17, 31]
    assert [(p, o) for p, o, _ in got] == [(p, o) for p in (3, 17, 31) for o in (1, 2, 3)]
    assert _poll(session, "c", "max_messages = 1000") == []


def test_one_poll_over_many_partitions_commits_each_offset(session: Any, scans: list[bool]) -> None:
    partitions = 200
    session.execute(f"CREATE TOPIC t (CONSUMER c) WITH (min_active_partitions = {partitions})")
    rng = random.Random(7)
    counts = {p: rng.randrange(1, 6) for p in range(partitions)}
    for partition, count in counts.items():
        values = ", ".join(f"('m{partition}-{i}', {partition})" for i in range(count))
        session.execute(f"INSERT INTO TOPIC t (data, partition) VALUES {values}")
    got = _poll(session, "c", "max_messages = 100000")
    assert scans == [True]
    assert got == [
        (p, o, f"m{p}-{o}".encode()) for p in range(partitions) for o in range(counts[p])
    ]
    assert _offsets(session, "c") == counts


def test_a_stale_readers_commit_is_refused(database: Any, scans: list[bool]) -> None:
    setup = database.connect()
    setup.execute(f"CREATE TOPIC t (CONSUMER c) WITH (min_active_partitions = {PARTITIONS})")
    _write(setup, random.Random(3), 80, PARTITIONS)
    winner, loser = database.connect(), database.connect()
    polled = []
    for session in (winner, loser):
        session.execute("BEGIN")  # both read from the same committed offsets
        polled.append(_poll(session, "c", "max_messages = 100000"))  # all of it
    assert polled[0] == polled[1] and polled[0]
    assert scans == [True, True]
    winner.execute("COMMIT")
    with pytest.raises(errors.SerializationFailure):
        loser.execute("COMMIT")
    offsets = _offsets(setup, "c")
    expected: dict[int, int] = {}
    for partition, offset, _ in polled[0]:
        expected[partition] = max(expected.get(partition, 0), offset + 1)
    assert {p: o for p, o in offsets.items() if o} == expected
    for session in (setup, winner, loser):
        session.close()


def test_a_poll_of_stored_columns_builds_only_those(
    session: Any, monkeypatch: pytest.MonkeyPatch, scans: list[bool]
) -> None:
    """``SELECT data`` (a consumer's usual projection) through the scan gets the ``data``
    column alone, gathered from the buffer: no other column is built (the metadata map,
    the producer ids, the offsets), and its values and the offsets moved are those of
    the whole relation's poll; a projection with a column not stored builds it all."""
    session.execute(
        f"CREATE TOPIC t (CONSUMER narrow, CONSUMER whole) "
        f"WITH (min_active_partitions = {PARTITIONS})"
    )
    _write(session, random.Random(3), 80, PARTITIONS)
    built: list[str] = []
    for name in ("map", "fixed", "variable"):
        original = getattr(wire_columns._Columns, name)

        def spying(
            self: Any, *args: Any, _name: str = name, _original: Any = original, **kwargs: Any
        ) -> Any:
            built.append(_name if _name != "variable" else f"variable {args[0]}")
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(wire_columns._Columns, name, spying)
    read = "FROM TOPIC t WITH (consumer = '{}', max_messages = 100000)"
    result = session.execute(f"SELECT data {read.format('narrow')}")[-1]
    assert scans == [True]
    assert result.table is not None and result.table.column_names == ["data"]
    assert sorted(built) == ["fixed", f"variable {wire_columns.DATA}"]  # codec, data
    built.clear()
    whole = rows(session, f'SELECT partition, "offset", data {read.format("whole")}')
    assert scans == [True, True] and "map" in built
    assert [bytes(d) for d in result.table.column("data").to_pylist()] == [
        bytes(r["data"]) for r in whole
    ]
    assert _offsets(session, "narrow") == _offsets(session, "whole")
