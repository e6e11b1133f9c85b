"""Topic-only transactions commit in the staging log; table transactions through DuckDB.

What must hold (``engine.commit``):

- a transaction that touches no table runs no DuckDB statement at all on its way
  to the commit point, leaves no DuckDB record row, and costs one staging fsync
  (or less: group commit) per commit;
- one that touches a table keeps the DuckDB protocol (a record row);
- both kinds interleave on one consumer: stale readers get 40001 whichever kind
  committed first, and every message read is moved exactly once;
- after a crash (simulated: closed without the checkpoint), recovery replays the
  log's commit records with DuckDB's record rows by transaction id; a torn record
  at the tail is not committed; a checkpointed record is never replayed again;
- a commit record whose sync failed leaves the outcome in doubt: later commits are
  refused until the database is reopened.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from engine import commit, tables
from engine.catalog import SCHEMA
from engine.database import Database
from storage import errors, failpoints

WAIT_S = 60  # a bound on waiting for threads, never a timing assertion
MOVE = (
    "INSERT INTO TOPIC b (data) SELECT data FROM TOPIC a "
    "WITH (consumer = 'c', max_messages = {k})"
)
MOVE_TO_TABLE = (
    "INSERT INTO moved SELECT data FROM TOPIC a WITH (consumer = 'c', max_messages = {k})"
)


def _setup(path: Path) -> Database:
    database = Database.open(str(path))
    session = database.connect()
    session.execute(
        "CREATE TOPIC a (CONSUMER c) WITH (min_active_partitions = 2); "
        "CREATE TOPIC b WITH (min_active_partitions = 2); CREATE TABLE moved (data BLOB)"
    )
    values = ", ".join(f"('m{i}', {i % 2})" for i in range(200))
    session.execute(f"INSERT INTO TOPIC a (data, partition) VALUES {values}")
    session.close()
    return database


@pytest.fixture
def database(tmp_path: Path):
    database = _setup(tmp_path / "data")
    yield database
    database.close()


@pytest.fixture(autouse=True)
def _no_failpoints():
    yield
    failpoints.deactivate()


def _records(database: Database) -> int:
    cursor = database.root.cursor()
    try:
        row = cursor.execute(f"SELECT count(*) FROM {SCHEMA}.transactions").fetchone()
    finally:
        cursor.close()
    assert row is not None
    return int(row[0])


def _payloads(session, topic: str) -> list[str]:
    result = session.execute(
        f"SELECT CAST(data AS VARCHAR) AS d FROM TOPIC {topic} WITH (max_messages = 100000)"
    )[-1]
    assert result.table is not None
    return result.table.column("d").to_pylist()


def _table_rows(session) -> list[str]:
    result = session.execute("SELECT CAST(data AS VARCHAR) AS d FROM moved")[-1]
    assert result.table is not None
    return result.table.column("d").to_pylist()


def _offsets(session) -> dict[int, int]:
    result = session.execute(
        "SELECT partition, committed_offset FROM sys.consumers WHERE topic = 'a' "
        "AND consumer = 'c'"
    )[-1]
    assert result.table is not None
    return {r["partition"]: r["committed_offset"] or 0 for r in result.table.to_pylist()}


def _move(session, statement: str, k: int) -> None:
    """``statement`` in an explicit transaction (an autocommit ``INSERT INTO TOPIC``
    appends at once and commits only its offset moves)."""
    session.execute("BEGIN")
    try:
        session.execute(statement.format(k=k))
        session.execute("COMMIT")
    except BaseException:
        session.execute("ROLLBACK")
        raise


def _crash_close(database: Database, monkeypatch) -> None:
    """Close without the committer's last checkpoint: what a crash after the publish
    leaves (commit records and record rows not checkpointed)."""
    committer = database.committer
    monkeypatch.setattr(committer, "checkpoint", lambda: None)
    database.close()


def _no_background_checkpoints(monkeypatch) -> None:
    monkeypatch.setattr(commit, "CHECKPOINT_TRANSACTIONS", 10**9)


def test_a_topic_only_transaction_runs_no_duckdb_statement_and_leaves_no_record_row(
    database, monkeypatch
):
    _no_background_checkpoints(monkeypatch)
    session = database.connect()
    statements: list[str] = []
    for name in ("run", "query_arrow", "execute_count"):
        original = getattr(tables, name)

        def spy(cursor, sql, *args, _original=original, **kwargs):
            statements.append(sql)
            return _original(cursor, sql, *args, **kwargs)

        monkeypatch.setattr(tables, name, spy)
    before = database.commit_counters()
    tag = session.execute(MOVE.format(k=10))[-1].tag  # autocommit: the whole statement
    assert tag == "INSERT 0 10"
    assert statements == []
    after = database.commit_counters()
    assert after["log_commits"] == before["log_commits"] + 1
    assert after["table_commits"] == before["table_commits"]
    assert after["staging_syncs"] - before["staging_syncs"] == 1
    session.execute("BEGIN")  # opens no DuckDB transaction: no statement needs one
    session.execute(MOVE.format(k=5))
    session.execute("COMMIT")
    assert statements == []
    assert _records(database) == 0
    assert len(_payloads(session, "b")) == 15
    assert sum(_offsets(session).values()) == 15
    session.close()


def test_a_transaction_that_writes_a_table_commits_through_duckdb(database, monkeypatch):
    _no_background_checkpoints(monkeypatch)
    session = database.connect()
    before = database.commit_counters()
    session.execute("BEGIN")
    session.execute(MOVE_TO_TABLE.format(k=4))
    session.execute("COMMIT")
    session.execute(MOVE_TO_TABLE.format(k=3))  # autocommit
    after = database.commit_counters()
    assert after["table_commits"] - before["table_commits"] == 2
    assert after["log_commits"] == before["log_commits"]
    assert _records(database) == 2
    assert len(_table_rows(session)) == 7
    session.close()


@pytest.mark.parametrize("first", ["topic-only", "table"])
def test_a_stale_reader_is_refused_whichever_kind_committed_first(database, first):
    """Two sessions read the same range with consumer ``c``; one commits (in the log, or
    through DuckDB); the other, of the other kind, gets 40001 and nothing of it stays."""
    winner, loser = database.connect(), database.connect()
    statements = [MOVE, MOVE_TO_TABLE] if first == "topic-only" else [MOVE_TO_TABLE, MOVE]
    for session, statement in zip((winner, loser), statements, strict=True):
        session.execute("BEGIN")  # both read partition 0 from the same committed offset
        session.execute(statement.replace("consumer = 'c'", "consumer = 'c', partition = 0")
                        .format(k=6))  # fmt: skip
    winner.execute("COMMIT")
    with pytest.raises(errors.SerializationFailure):
        loser.execute("COMMIT")
    assert len(_payloads(winner, "b")) + len(_table_rows(winner)) == 6
    assert sum(_offsets(winner).values()) == 6
    for session in (winner, loser):
        session.close()


def test_both_kinds_interleaved_on_one_consumer_move_every_message_once(
    tmp_path: Path, monkeypatch
):
    """Four sessions drain ``a`` with consumer ``c``, each transaction topic-only or
    table-writing in turn; with checkpoints every 5 commits; then the database is
    'crashed' (no last checkpoint) and reopened: every message is in ``b`` or in
    ``moved`` exactly once and the offsets are at ``a``'s end."""
    monkeypatch.setattr(commit, "CHECKPOINT_TRANSACTIONS", 5)
    database = _setup(tmp_path / "data")
    sessions = [database.connect() for _ in range(4)]
    failures: list[BaseException] = []

    def body(index: int) -> None:
        session = sessions[index]
        number = 0
        try:
            while True:
                statement = (MOVE, MOVE_TO_TABLE)[(index + number) % 2]
                number += 1
                try:
                    session.execute("BEGIN")
                    tag = session.execute(statement.format(k=7))[-1].tag
                    if tag == "INSERT 0 0":
                        session.execute("ROLLBACK")
                        return
                    session.execute("COMMIT")
                except errors.SerializationFailure:
                    session.execute("ROLLBACK")
        except BaseException as error:  # reported below
            failures.append(error)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT_S * 4)
    assert not any(t.is_alive() for t in threads), "a session hangs"
    assert not failures, failures
    counters = database.commit_counters()
    assert counters["log_commits"] > 0 and counters["table_commits"] > 0, counters
    for session in sessions:
        session.close()
    _crash_close(database, monkeypatch)
    monkeypatch.undo()
    database = Database.open(str(tmp_path / "data"))
    session = database.connect()
    moved = _payloads(session, "b") + _table_rows(session)
    assert sorted(moved) == sorted(f"m{i}" for i in range(200))
    assert _offsets(session) == {0: 100, 1: 100}
    session.close()
    database.close()


def test_recovery_replays_commit_records_and_ignores_a_torn_one(tmp_path: Path, monkeypatch):
    """Topic-only commits not checkpointed: their offsets live only in the log's commit
    records; after a crash they are replayed. A last append torn inside its record
    (``staging.torn_record``) was never committed: its offsets do not move and its
    messages are not published."""
    _no_background_checkpoints(monkeypatch)
    database = _setup(tmp_path / "data")
    session = database.connect()
    for _ in range(3):
        _move(session, MOVE, 10)
    failpoints.activate("staging.torn_record=error")
    with pytest.raises(errors.StorageIOError):
        _move(session, MOVE, 10)
    failpoints.deactivate()
    assert _records(database) == 0
    session.close()
    _crash_close(database, monkeypatch)
    monkeypatch.undo()
    database = Database.open(str(tmp_path / "data"))
    session = database.connect()
    assert sum(_offsets(session).values()) == 30
    assert len(_payloads(session, "b")) == 30
    # The recovered records were checkpointed at open: a later crash does not replay
    # them again over newer offsets (the watermark), even with their file still there.
    _move(session, MOVE_TO_TABLE, 5)
    assert sum(_offsets(session).values()) == 35
    session.close()
    _crash_close(database, monkeypatch)
    monkeypatch.undo()
    database = Database.open(str(tmp_path / "data"))
    session = database.connect()
    assert sum(_offsets(session).values()) == 35
    assert len(_payloads(session, "b")) == 30 and len(_table_rows(session)) == 5
    session.close()
    database.close()


def test_a_commit_record_whose_sync_fails_is_in_doubt_and_stops_commits(
    tmp_path: Path, monkeypatch
):
    """The sync of a commit record fails: the record may be on disk or not, so the
    commit is reported in doubt and every later commit is refused; reads still work.
    Reopening decides: here the record was written, so recovery commits it."""
    _no_background_checkpoints(monkeypatch)
    database = _setup(tmp_path / "data")
    session = database.connect()
    _move(session, MOVE, 4)
    failpoints.activate("commit.after_log_append=error")
    with pytest.raises(errors.StorageIOError, match="in doubt"):
        _move(session, MOVE, 4)
    failpoints.deactivate()
    with pytest.raises(errors.StorageIOError, match="reopened"):
        _move(session, MOVE, 4)
    with pytest.raises(errors.StorageIOError, match="reopened"):
        _move(session, MOVE_TO_TABLE, 4)
    assert len(_payloads(session, "b")) == 4
    session.close()
    database.close()
    database = Database.open(str(tmp_path / "data"))
    session = database.connect()
    assert sum(_offsets(session).values()) == 8
    assert len(_payloads(session, "b")) == 8
    _move(session, MOVE, 4)
    assert sum(_offsets(session).values()) == 12
    session.close()
    database.close()


def test_concurrent_topic_only_commits_share_fsyncs(database, monkeypatch):
    """Eight sessions commit topic-only transactions at once: at most one staging fsync
    per commit (group commit makes it fewer when commits overlap), and no DuckDB
    record row or COMMIT at all."""
    _no_background_checkpoints(monkeypatch)
    sessions = [database.connect() for _ in range(8)]
    fs = database.store.fs
    before, fsyncs_before = database.commit_counters(), fs.fsync_count

    def body(index: int) -> None:
        for number in range(10):
            sessions[index].execute("BEGIN")
            sessions[index].execute(f"INSERT INTO TOPIC b (data) VALUES ('{index}:{number}')")
            sessions[index].execute("COMMIT")

    threads = [threading.Thread(target=body, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT_S * 4)
    assert not any(t.is_alive() for t in threads)
    after = database.commit_counters()
    commits = after["log_commits"] - before["log_commits"]
    assert commits == 80
    assert after["table_commits"] == before["table_commits"]
    assert after["staging_syncs"] - before["staging_syncs"] <= commits
    assert fs.fsync_count - fsyncs_before <= commits  # storage.fs sees the same
    assert _records(database) == 0
    for session in sessions:
        session.close()


def test_topicbase_check_finds_commit_records_valid_and_repair_keeps_them(
    tmp_path: Path, monkeypatch
):
    """``topicbase check`` walks staging files: commit records not yet checkpointed are
    valid content, not a torn tail that ``--repair`` would cut (which would undo commits
    at the next recovery)."""
    from engine.check import check_database

    _no_background_checkpoints(monkeypatch)
    database = _setup(tmp_path / "data")
    session = database.connect()
    for _ in range(3):
        _move(session, MOVE, 10)
    session.close()
    _crash_close(database, monkeypatch)
    monkeypatch.undo()
    report = check_database(str(tmp_path / "data"), repair=True)
    assert report.problems == [], report.lines()
    database = Database.open(str(tmp_path / "data"))
    session = database.connect()
    assert sum(_offsets(session).values()) == 30
    session.close()
    database.close()
