"""The commit pipeline under concurrency: claims, publish turns, background checkpoints.

``engine.commit`` validates and claims under the commit lock, COMMITs in DuckDB
outside it, and publishes in the order transactions were validated; records are
checkpointed by a background thread. What must hold:

- concurrent transactions that write one partition publish whole and in a
  consistent order (each session's transactions in its own order), none lost;
- of sessions racing to commit the same consumer range, exactly one wins each
  round and the others get 40001 (a claimed range is never validated twice);
- the background checkpoint deletes records without anyone calling
  ``checkpoint``, and a session catches up when it falls far behind;
- DDL waits for commits in flight: offsets moved by them are never lost.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from pathlib import Path

import pytest

from engine import commit
from engine.catalog import SCHEMA
from engine.database import Database
from storage import errors

WAIT_S = 30  # a bound on waiting for another thread, never a timing assertion


@pytest.fixture
def database(tmp_path: Path):
    database = Database.open(str(tmp_path / "data"))
    session = database.connect()
    session.execute(
        "CREATE TOPIC a (CONSUMER c) WITH (min_active_partitions = 2); "
        "CREATE TOPIC b WITH (min_active_partitions = 2)"
    )
    session.close()
    yield database
    database.close()


def _payloads(session, topic: str, partition: int) -> list[str]:
    result = session.execute(
        f"SELECT CAST(data AS VARCHAR) AS d FROM TOPIC {topic} "
        f"WITH (partition = {partition}, max_messages = 100000) ORDER BY \"offset\""
    )[-1]
    assert result.table is not None
    return result.table.column("d").to_pylist()


def _records(database: Database) -> int:
    cursor = database.root.cursor()
    try:
        row = cursor.execute(f"SELECT count(*) FROM {SCHEMA}.transactions").fetchone()
    finally:
        cursor.close()
    assert row is not None
    return int(row[0])


def _run_threads(count: int, body) -> None:
    errors_seen: list[BaseException] = []

    def guarded(index: int) -> None:
        try:
            body(index)
        except BaseException as error:  # reported below
            errors_seen.append(error)

    threads = [threading.Thread(target=guarded, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT_S * 4)
    assert not any(t.is_alive() for t in threads), "a committing thread hangs"
    if errors_seen:
        raise errors_seen[0]


def test_concurrent_transactions_on_one_partition_publish_whole_and_in_order(database):
    sessions_count, transactions, per_transaction = 4, 25, 3
    sessions = [database.connect() for _ in range(sessions_count)]

    def body(index: int) -> None:
        session = sessions[index]
        for number in range(transactions):
            session.execute("BEGIN")
            values = ", ".join(
                f"('s{index}:{number}:{k}', 0)" for k in range(per_transaction)
            )
            session.execute(f"INSERT INTO TOPIC b (data, partition) VALUES {values}")
            session.execute("COMMIT")

    _run_threads(sessions_count, body)
    found = _payloads(sessions[0], "b", 0)
    assert len(found) == sessions_count * transactions * per_transaction
    by_session: dict[str, list[int]] = defaultdict(list)
    for start in range(0, len(found), per_transaction):
        chunk = [item.split(":") for item in found[start : start + per_transaction]]
        owner, number = chunk[0][0], int(chunk[0][1])
        assert chunk == [[owner, str(number), str(k)] for k in range(per_transaction)], chunk
        by_session[owner].append(number)
    assert by_session == {f"s{i}": list(range(transactions)) for i in range(sessions_count)}
    for session in sessions:
        session.close()


def test_sessions_racing_for_one_consumer_range_commit_it_exactly_once(database):
    """Each round, three sessions read the same new messages with consumer ``c``, write
    them to ``b`` and COMMIT at once: one wins, the others get 40001."""
    racers, rounds = 3, 8
    sessions = [database.connect() for _ in range(racers)]
    feeder = database.connect()
    barrier = threading.Barrier(racers)
    outcomes: list[list[str]] = [[] for _ in range(rounds)]

    def body(index: int) -> None:
        session = sessions[index]
        for number in range(rounds):
            session.execute("BEGIN")
            session.execute(
                "INSERT INTO TOPIC b (data) SELECT data FROM TOPIC a "
                "WITH (consumer = 'c', max_messages = 1000)"
            )
            barrier.wait(WAIT_S)
            try:
                session.execute("COMMIT")
                outcomes[number].append("committed")
            except errors.SerializationFailure:
                outcomes[number].append("40001")
            barrier.wait(WAIT_S)
            if index == 0:
                feed(number + 1)
            barrier.wait(WAIT_S)

    def feed(number: int) -> None:
        if number < rounds:
            feeder.execute(
                "INSERT INTO TOPIC a (data, partition) "
                f"VALUES ('r{number}.0', 0), ('r{number}.1', 1)"
            )

    feed(0)
    _run_threads(racers, body)
    for number, seen in enumerate(outcomes):
        assert sorted(seen) == ["40001"] * (racers - 1) + ["committed"], (number, seen)
    moved = sorted(_payloads(feeder, "b", 0) + _payloads(feeder, "b", 1))
    assert moved == sorted(f"r{n}.{p}" for n in range(rounds) for p in (0, 1))
    for session in [*sessions, feeder]:
        session.close()


def test_the_background_checkpoint_deletes_records_nobody_asked_for(database, monkeypatch):
    monkeypatch.setattr(commit, "CHECKPOINT_TRANSACTIONS", 3)
    session = database.connect()
    session.execute("INSERT INTO TOPIC a (data, partition) VALUES ('x', 0), ('y', 0), ('z', 0)")
    for _ in range(3):
        session.execute("BEGIN")
        session.execute(
            "INSERT INTO TOPIC b (data) SELECT data FROM TOPIC a "
            "WITH (consumer = 'c', max_messages = 1)"
        )
        session.execute("COMMIT")
    committer = database.committer
    deadline = time.monotonic() + WAIT_S
    while committer.checkpoints == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert committer.checkpoints >= 1, "the background checkpoint never ran"
    assert _records(database) == 0
    cursor = database.root.cursor()
    offsets = cursor.execute(
        f"SELECT partition, committed FROM {SCHEMA}.offsets WHERE consumer = 'c'"
    ).fetchall()
    cursor.close()
    assert offsets == [(0, 3)]
    session.close()


@pytest.mark.parametrize("kind", ["topic-only", "table"])
def test_a_session_checkpoints_itself_when_the_background_falls_behind(
    database, monkeypatch, kind
):
    """With the background checkpointer unable to run, committed transactions not yet
    checkpointed (DuckDB record rows, or commit records in the log) pile up to the
    backlog bound; the committing session then checkpoints after its commit."""
    monkeypatch.setattr(commit, "CHECKPOINT_TRANSACTIONS", 2)
    monkeypatch.setattr(commit.Committer, "_checkpoint_loop", lambda self: None)
    session = database.connect()
    session.execute("CREATE TABLE t (x INTEGER)")
    table = "INSERT INTO t VALUES (1); " if kind == "table" else ""
    backlog_max = commit.CHECKPOINT_BACKLOG_FACTOR * 2
    for number in range(backlog_max - 1):
        session.execute(f"BEGIN; {table}INSERT INTO TOPIC b (data) VALUES ('{number}'); COMMIT")
    assert database.committer.backlog == backlog_max - 1
    assert _records(database) == (backlog_max - 1 if kind == "table" else 0)
    session.execute(f"BEGIN; {table}INSERT INTO TOPIC b (data) VALUES ('last'); COMMIT")
    assert database.committer.backlog == 0
    assert _records(database) == 0
    session.close()


def test_ddl_beside_committing_sessions_loses_no_offset_move(database):
    """Two sessions move messages of ``a`` with consumer ``c`` (one partition each)
    while a third adds and drops consumers (DDL checkpoints, then changes the
    catalog): every message is moved once and ``c``'s offsets count all of them."""
    feeder = database.connect()
    values = ", ".join(f"('m{i}', {i % 2})" for i in range(200))
    feeder.execute(f"INSERT INTO TOPIC a (data, partition) VALUES {values}")
    movers = [database.connect() for _ in range(2)]
    stop = threading.Event()

    def body(index: int) -> None:
        if index == 2:
            number = 0
            while not stop.is_set():
                feeder.execute(f"ALTER TOPIC a ADD CONSUMER extra{number}")
                feeder.execute(f"ALTER TOPIC a DROP CONSUMER extra{number}")
                number += 1
            return
        session = movers[index]
        try:
            while True:
                session.execute("BEGIN")
                tag = session.execute(
                    "INSERT INTO TOPIC b (data, partition) SELECT data, partition FROM TOPIC a "
                    f"WITH (consumer = 'c', partition = {index}, max_messages = 7)"
                )[-1].tag
                session.execute("COMMIT")
                if tag == "INSERT 0 0":
                    return
        finally:
            if index == 0:
                stop.set()

    _run_threads(3, body)
    stop.set()
    moved = _payloads(feeder, "b", 0) + _payloads(feeder, "b", 1)
    assert sorted(moved) == sorted(f"m{i}" for i in range(200))
    result = feeder.execute(
        "SELECT partition, committed_offset FROM sys.consumers WHERE topic = 'a' "
        "AND consumer = 'c' ORDER BY partition"
    )[-1]
    assert result.table is not None
    assert result.table.to_pylist() == [
        {"partition": 0, "committed_offset": 100},
        {"partition": 1, "committed_offset": 100},
    ]
    for session in [feeder, *movers]:
        session.close()
