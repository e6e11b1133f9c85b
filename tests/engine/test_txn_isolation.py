"""What other sessions see of a transaction, and which transactions conflict.

- A transaction's topic writes are staged invisibly: nobody sees them before
  COMMIT, and nobody ever sees them after ROLLBACK or a 40001 abort (also not
  after a reopen, whose recovery deletes staging no commit record needs).
- Publishing appends one frame per partition, each visible whole, so a reader
  of one partition never sees part of a transaction's batch for that
  partition. Across partitions, docs/DESIGN.md §5 ("Visibility": all at once,
  or not at all) asks that one read see a transaction in all its
  partitions or in none, also while the commit is between two partitions'
  publishes (``commit.mid_publish``). Separate statements read at separate
  moments: reading partition 0, then partition 1 later, may of course see a
  transaction committed in between in partition 1 only.
- Optimistic concurrency: overlapping reads of one consumer's range conflict
  (the later COMMIT gets 40001, a "zombie" without membership cannot commit
  twice); reads of different partitions of one consumer, or of different
  consumers, never conflict.
"""

from __future__ import annotations

import os
import threading
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from engine.database import Database
from storage import errors, failpoints

SETUP = (
    "CREATE TOPIC a (CONSUMER c, CONSUMER d, CONSUMER e) WITH (min_active_partitions = 2); "
    "CREATE TOPIC b WITH (min_active_partitions = 2)"
)
MOVE = (
    "INSERT INTO TOPIC b (data, message_group_id) SELECT {expression}, message_group_id "
    "FROM TOPIC a WITH ({options})"
)


def _fill_a(session, count: int) -> None:
    """``count`` messages ``m<i>`` (groups ``g0``..``g5``, spread over both partitions)."""
    session.execute(
        "INSERT INTO TOPIC a (data, message_group_id) "
        f"SELECT 'm' || i, 'g' || (i % 6) FROM range({count}) t(i)"
    )


def _data(session, topic: str, *, in_transaction: bool = False, **options) -> list[str]:
    """The payloads of ``topic`` (peek), by partition and offset.

    ``in_transaction`` peeks inside BEGIN ... ROLLBACK: an autocommit statement
    ends by taking the database's commit lock, which a committing transaction
    holds while it publishes, so an autocommit peek would wait for the publish.
    """
    settings = ", ".join(f"{k} = {v}" for k, v in {"max_messages": 100_000, **options}.items())
    query = (
        f"SELECT CAST(data AS VARCHAR) AS d FROM TOPIC {topic} WITH ({settings}) "
        'ORDER BY partition, "offset"'
    )
    if in_transaction:
        session.execute("BEGIN")
        try:
            result = session.execute(query)[-1]
        finally:
            session.execute("ROLLBACK")
    else:
        result = session.execute(query)[-1]
    assert result.table is not None
    return result.table.column("d").to_pylist()


def _committed(session, consumer: str) -> dict[int, int | None]:
    result = session.execute(
        "SELECT partition, committed_offset FROM sys.consumers "
        f"WHERE topic = 'a' AND consumer = '{consumer}'"
    )[-1]
    assert result.table is not None
    return {r["partition"]: r["committed_offset"] for r in result.table.to_pylist()}


@pytest.fixture
def database(tmp_path: Path):
    database = Database.open(str(tmp_path / "data"))
    session = database.connect()
    session.execute(SETUP)
    session.close()
    yield database
    database.close()


def test_staged_writes_are_invisible_to_other_sessions_until_commit(database):
    writer, reader = database.connect(), database.connect()
    writer.execute("BEGIN")
    writer.execute("INSERT INTO TOPIC b (data, partition) VALUES ('x0', 0), ('y0', 0)")
    writer.execute("INSERT INTO TOPIC b (data, partition) VALUES ('x1', 1)")
    assert _data(reader, "b") == []
    assert _data(writer, "b") == []  # not even to the transaction itself
    ends = reader.execute("SELECT sum(end_offset) AS n FROM sys.partitions WHERE topic = 'b'")
    assert ends[-1].table.to_pylist() == [{"n": 0}]
    writer.execute("COMMIT")
    assert _data(reader, "b") == ["x0", "y0", "x1"]


def test_rolled_back_writes_are_never_visible_not_even_after_reopen(tmp_path: Path):
    path = str(tmp_path / "data")
    database = Database.open(path)
    session = database.connect()
    session.execute(SETUP)
    _fill_a(session, 10)
    session.execute("BEGIN")
    session.execute(MOVE.format(expression="data", options="consumer = 'c'"))
    session.execute("ROLLBACK")
    assert _data(session, "b") == []
    assert _committed(session, "c") == {0: None, 1: None}
    session.close()
    database.close()
    database = Database.open(path)
    try:
        session = database.connect()
        assert _data(session, "b") == []
        session.close()
    finally:
        database.close()


def test_writes_of_a_transaction_aborted_with_40001_are_never_visible(tmp_path: Path):
    """The loser's writes were staged (staging happens before validation) and then
    abandoned: not visible, not published by the recovery of a reopen, and its
    staging is gone once no transaction needs the file."""
    path = str(tmp_path / "data")
    database = Database.open(path)
    winner, loser = database.connect(), database.connect()
    winner.execute(SETUP)
    _fill_a(winner, 20)
    for session, tag in ((winner, "win"), (loser, "lose")):
        session.execute("BEGIN")
        session.execute(MOVE.format(expression=f"'{tag}:' || data", options="consumer = 'c'"))
    winner.execute("COMMIT")
    with pytest.raises(errors.SerializationFailure) as caught:
        loser.execute("COMMIT")
    assert caught.value.sqlstate == "40001"
    assert not [d for d in _data(winner, "b") if d.startswith("lose:")]
    assert len(_data(winner, "b")) == 20
    for session in (winner, loser):
        session.close()
    database.close()
    database = Database.open(path)
    try:
        session = database.connect()
        moved = _data(session, "b")
        assert len(moved) == 20 and all(d.startswith("win:") for d in moved), moved
        session.close()
        staged = os.listdir(os.path.join(path, "staging"))
        assert len(staged) <= 1, staged  # at most the file being written
    finally:
        database.close()


def test_a_zombie_without_membership_cannot_commit_the_same_range_twice(database):
    """Two sessions read the same range with consumer ``c`` and both write it to ``b``:
    the first COMMIT wins, the second gets 40001, ``b`` holds each message once."""
    first, second = database.connect(), database.connect()
    _fill_a(first, 30)
    for session in (first, second):
        session.execute("BEGIN")
        result = session.execute(MOVE.format(expression="data", options="consumer = 'c'"))
        assert result[-1].tag == "INSERT 0 30"
    second.execute("COMMIT")  # the one that read last commits first
    with pytest.raises(errors.SerializationFailure) as caught:
        first.execute("COMMIT")
    assert caught.value.sqlstate == "40001"
    moved = _data(first, "b")
    assert sorted(moved) == sorted(f"m{i}" for i in range(30))
    assert _committed(first, "c") == {0: 15, 1: 15}
    # Retrying the zombie's transaction finds nothing left to move.
    first.execute("BEGIN")
    assert first.execute(MOVE.format(expression="data", options="consumer = 'c'"))[-1].tag == (
        "INSERT 0 0"
    )
    first.execute("COMMIT")
    assert len(_data(first, "b")) == 30


def test_a_reader_never_sees_part_of_a_transactions_batch_in_a_partition(database):
    """A writer commits transactions that each write ``PER_PARTITION`` messages to each
    of partitions 0 and 1 of ``b`` (in six INSERTs, interleaved); a reader thread peeks
    each partition over and over. Within a partition, every transaction it sees is
    complete. (One read across partitions: see the next test.)"""
    transactions, per_partition = 40, 6
    writer, reader = database.connect(), database.connect()
    done = threading.Event()
    partial: list[str] = []
    snapshots = [0]

    def read_loop() -> None:
        while not done.is_set():
            for partition in (0, 1):
                rows = _data(reader, "b", partition=partition, in_transaction=True)
                seen = Counter(d.split(":")[0] for d in rows)
                partial.extend(
                    f"p{partition} {t}: {n}" for t, n in seen.items() if n != per_partition
                )
                snapshots[0] += 1

    thread = threading.Thread(target=read_loop)
    thread.start()
    try:
        for t in range(transactions):
            writer.execute("BEGIN")
            for part in range(3):
                for partition in (0, 1):
                    values = ", ".join(f"('t{t}:{part}.{i}', {partition})" for i in range(2))
                    writer.execute(f"INSERT INTO TOPIC b (data, partition) VALUES {values}")
            writer.execute("COMMIT")
    finally:
        done.set()
        thread.join()
    assert not partial, partial[:10]
    assert snapshots[0] > 2
    for partition in (0, 1):
        seen = Counter(d.split(":")[0] for d in _data(reader, "b", partition=partition))
        assert seen == {f"t{t}": per_partition for t in range(transactions)}


def test_one_read_sees_a_transaction_in_all_its_partitions_or_in_none(database, monkeypatch):
    """docs/DESIGN.md §5, "Visibility": a transaction appears all at once. The commit is paused
    between the publish of partition 0's frame and partition 1's (at
    ``commit.mid_publish``) while another session reads all of ``b`` in one statement
    (in a transaction, so that it does not wait for the commit lock at its end): it
    sees the transaction in both partitions or in neither, never partition 0's share
    alone; and after COMMIT returned, everything."""
    reached, release = threading.Event(), threading.Event()
    original = failpoints.hit

    def hit(name: str) -> None:
        if name == "commit.mid_publish":
            reached.set()
            assert release.wait(30)
        original(name)

    monkeypatch.setattr(failpoints, "hit", hit)
    writer, reader = database.connect(), database.connect()
    writer.execute("BEGIN")
    writer.execute(
        "INSERT INTO TOPIC b (data, partition) "
        "VALUES ('a0', 0), ('a1', 1), ('b0', 0), ('b1', 1), ('c0', 0)"
    )
    committing = threading.Thread(target=writer.execute, args=("COMMIT",))
    seen: list[list[str]] = []
    reading = threading.Thread(target=lambda: seen.append(_data(reader, "b", in_transaction=True)))
    committing.start()
    try:
        assert reached.wait(30), "the commit did not reach commit.mid_publish"
        reading.start()
        reading.join(0.5)  # a reader may wait for the publish to end, or read at once
    finally:
        release.set()
        committing.join()
        reading.join()
    assert len(seen) == 1
    assert seen[0] in ([], ["a0", "b0", "c0", "a1", "b1"]), seen[0]
    assert _data(reader, "b", partition=0) == ["a0", "b0", "c0"]
    assert _data(reader, "b", partition=1) == ["a1", "b1"]


def test_transactions_on_different_partitions_or_consumers_never_conflict(database):
    """Four threads move messages concurrently, each in its own lane: consumer ``c`` on
    partition 0, ``c`` on partition 1, ``d`` on both, ``e`` on partition 0. Every round,
    all four read, wait for each other, then COMMIT together: no 40001, and every lane's
    offsets advance by what it read."""
    rounds, per_read = 12, 3
    setup = database.connect()
    _fill_a(setup, 200)
    lanes = {
        "c/p0": "consumer = 'c', partition = 0",
        "c/p1": "consumer = 'c', partition = 1",
        "d": "consumer = 'd'",
        "e/p0": "consumer = 'e', partition = 0",
    }
    barrier = threading.Barrier(len(lanes))
    failures: list[str] = []
    moved: dict[str, int] = defaultdict(int)

    def lane(name: str, options: str) -> None:
        session = database.connect()
        statement = MOVE.format(
            expression=f"'{name}:' || CAST(data AS VARCHAR)",
            options=f"{options}, max_messages = {per_read}",
        )
        try:
            for _ in range(rounds):
                session.execute("BEGIN")
                tag = session.execute(statement)[-1].tag
                moved[name] += int(tag.rsplit(" ", 1)[-1])
                barrier.wait(30)
                session.execute("COMMIT")
        except Exception as error:  # reported below
            failures.append(f"{name}: {type(error).__name__}: {error}")
            barrier.abort()
        finally:
            session.close()

    threads = [threading.Thread(target=lane, args=item) for item in lanes.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures, failures
    assert dict(moved) == dict.fromkeys(lanes, rounds * per_read)
    assert _committed(setup, "c") == {0: rounds * per_read, 1: rounds * per_read}
    assert _committed(setup, "e") == {0: rounds * per_read, 1: None}
    assert sum(v or 0 for v in _committed(setup, "d").values()) == rounds * per_read
    assert len(_data(setup, "b")) == len(lanes) * rounds * per_read


def test_commit_moves_the_offsets_of_a_read_whose_insert_select_wrote_nothing(database):
    """A transaction that read messages but wrote none of them (a filter dropped all)
    still commits: the offsets move past what it read and nothing is published."""
    session = database.connect()
    _fill_a(session, 8)
    session.execute("BEGIN")
    statement = MOVE.format(expression="data", options="consumer = 'c'") + " WHERE false"
    assert session.execute(statement)[-1].tag == "INSERT 0 0"
    session.execute("COMMIT")
    assert _committed(session, "c") == {0: 4, 1: 4}
    assert _data(session, "b") == []
