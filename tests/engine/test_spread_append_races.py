"""An autocommit spread write (``engine.spread_append``) racing DROP TOPIC, a cancel, and a
partition fenced after it was published.

What must hold: a commit whose topic was dropped after its writes were routed is refused
(42P01) under the commit lock, nothing committed, and never leaves a publish that fails
for ever (which made every later COMMIT, checkpoint, topic DDL and close fail); a
table-touching commit that a DROP overtook commits and publishes nothing to the dropped
topic; a cancel before the commit point refuses the statement (57014); a partition fenced
after a spread write published to it sets its transactions aside at the checkpoint
(recovery at the next open republishes them) instead of failing every checkpoint.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from engine import commit
from engine.database import Database
from storage import errors

INSERT = "INSERT INTO TOPIC t (data, producer_id, seq_no) SELECT unnest(?), unnest(?), unnest(?)"


def _rows(first: int, count: int) -> list[list]:
    return [
        [f"m{first + i}".encode() for i in range(count)],
        [f"p{i % 32}" for i in range(count)],
        list(range(first, first + count)),
    ]


def _in_thread(database: Database, sql: str) -> None:
    """Run ``sql`` in another session on another thread, as a concurrent client would."""
    other = database.connect()
    worker = threading.Thread(target=other.execute, args=(sql,))
    worker.start()
    worker.join()
    other.close()


def _data(session, topic: str) -> list[bytes]:
    return sorted(session.execute(f"SELECT data FROM TOPIC {topic}")[-1].table["data"].to_pylist())


def _everything_still_works(database: Database, session) -> None:
    assert not database.committer._unfinished
    session.execute("CREATE TOPIC u")
    session.execute("INSERT INTO TOPIC v (data) VALUES ('y')")
    session.execute("BEGIN")
    session.execute("INSERT INTO TOPIC v (data) VALUES ('z')")
    session.execute("COMMIT")
    assert _data(session, "v") == [b"y", b"z"]
    database.committer.checkpoint()


def test_a_drop_between_routing_and_commit_refuses_the_spread_write(
    tmp_path: Path, ledger_off: None
) -> None:
    """The staging path (its commit hook): the ledger off whatever the lane. The ledger's
    counterpart: test_ledger_append.py's DROP between the checks and the ledger round."""
    database = Database.open(str(tmp_path / "data"))
    session = database.connect()
    session.execute("CREATE TOPIC t WITH (min_active_partitions = 8)")
    session.execute("CREATE TOPIC v")
    committer = database.committer
    original = committer.commit_in_log

    def dropped_first(*args, **kwargs):
        committer.commit_in_log = original
        _in_thread(database, "DROP TOPIC t")  # takes the commit lock: no slot is held yet
        return original(*args, **kwargs)

    committer.commit_in_log = dropped_first
    commits = database.commit_counters()["log_commits"]
    with pytest.raises(errors.UndefinedTopicError) as raised:
        session.execute(INSERT, _rows(0, 64))
    assert raised.value.sqlstate == "42P01"
    assert database.commit_counters()["log_commits"] == commits  # nothing committed
    _everything_still_works(database, session)
    session.close()
    database.close()
    database = Database.open(str(tmp_path / "data"))
    session = database.connect()
    assert _data(session, "v") == [b"y", b"z"]
    assert database.catalog.entry("t") is None
    session.close()
    database.close()


def test_spread_writes_racing_drop_and_create_never_wedge_the_committer(tmp_path: Path) -> None:
    database = Database.open(str(tmp_path / "data"))
    session = database.connect()
    session.execute("CREATE TOPIC t WITH (min_active_partitions = 16)")
    session.execute("CREATE TOPIC v")
    stop = threading.Event()
    unexpected: list[BaseException] = []

    def write() -> None:
        writer = database.connect()
        while not stop.is_set():
            try:
                writer.execute(INSERT, _rows(0, 256))
            except (errors.UndefinedTopicError, errors.TopicbaseError):
                pass  # the topic is gone (42P01), or was re-created meanwhile (a plan of the old)
            except BaseException as error:  # pragma: no cover - reported below
                unexpected.append(error)
                return
        writer.close()

    thread = threading.Thread(target=write)
    thread.start()
    try:
        for _ in range(15):  # R2 saw the committer wedged within 4 rounds without the fix
            session.execute("DROP TOPIC t")
            session.execute("CREATE TOPIC t WITH (min_active_partitions = 16)")
            assert not database.committer._unfinished
    finally:
        stop.set()
        thread.join(120)
    assert not unexpected, unexpected
    _everything_still_works(database, session)
    session.close()
    database.close()


def test_a_table_commit_overtaken_by_a_drop_commits_and_publishes_nothing_there(
    tmp_path: Path,
) -> None:
    database = Database.open(str(tmp_path / "data"))
    session = database.connect()
    session.execute("CREATE TOPIC t WITH (min_active_partitions = 2)")
    session.execute("CREATE TOPIC v")
    session.execute("CREATE TABLE x (a INTEGER)")
    committer = database.committer
    original = committer.enter

    def dropped_first(*args, **kwargs):
        committer.enter = original
        _in_thread(database, "DROP TOPIC t")  # after routing and staging, before the lock
        return original(*args, **kwargs)

    session.execute("BEGIN")
    session.execute("INSERT INTO x VALUES (1)")
    session.execute("INSERT INTO TOPIC t (data) VALUES ('x')")
    committer.enter = dropped_first
    session.execute("COMMIT")  # the table row commits; the topic's share goes nowhere
    assert session.execute("SELECT a FROM x")[-1].table["a"].to_pylist() == [1]
    _everything_still_works(database, session)
    session.close()
    database.close()
    database = Database.open(str(tmp_path / "data"))  # recovery skips the dropped topic
    session = database.connect()
    assert session.execute("SELECT a FROM x")[-1].table["a"].to_pylist() == [1]
    assert _data(session, "v") == [b"y", b"z"]
    session.close()
    database.close()


def test_a_cancel_before_the_commit_point_refuses_the_spread_write(
    tmp_path: Path, ledger_off: None
) -> None:
    """The staging path (its commit hook): the ledger off whatever the lane. (The ledger
    path checks the cancel once, before its round: docs/scale.md round 31.)"""
    database = Database.open(str(tmp_path / "data"))
    session = database.connect()
    session.execute("CREATE TOPIC t WITH (min_active_partitions = 8)")
    committer = database.committer
    original = committer.commit_in_log

    def cancelled_first(*args, **kwargs):
        committer.commit_in_log = original
        session.cancel()  # as statement_timeout's timer or a client's cancel request does
        return original(*args, **kwargs)

    committer.commit_in_log = cancelled_first
    commits = database.commit_counters()["log_commits"]
    with pytest.raises(errors.QueryCanceledError) as raised:
        session.execute(INSERT, _rows(0, 64))
    assert raised.value.sqlstate == "57014"
    assert database.commit_counters()["log_commits"] == commits
    assert _data(session, "t") == []
    session.execute(INSERT, _rows(0, 64))  # the next statement is not cancelled
    assert len(_data(session, "t")) == 64
    session.close()
    database.close()


def test_a_partition_fenced_after_a_spread_write_is_set_aside_by_the_checkpoint(
    tmp_path: Path, ledger_off: None
) -> None:
    """The staging path's checkpoint: the ledger off whatever the lane. With the ledger a
    fenced partition's rows stay in the ledger until the reopen, read from there
    (tests/storage/test_ledger_fenced_reads.py)."""
    database = Database.open(str(tmp_path / "data"))
    session = database.connect()
    session.execute("CREATE TOPIC t (CONSUMER c) WITH (min_active_partitions = 8)")
    session.execute("CREATE TOPIC other WITH (min_active_partitions = 8)")
    into_other = INSERT.replace("TOPIC t", "TOPIC other")
    session.execute(into_other, _rows(0, 64))  # before: checkpointed as usual
    session.execute(INSERT, _rows(0, 64))  # published to all 8 partitions, none synced
    entry = database.catalog.entry("t")
    assert entry is not None
    database.topic_log(entry.topic_id).partition(3)._fence(
        errors.StorageIOError("EIO on a later write (simulated)")
    )
    session.execute(into_other, _rows(64, 64))  # after: kept with it (a suffix is kept)
    assert database.committer.backlog == 3
    # The checkpoint syncs what it can, releases the first write and keeps the spread
    # write to t and the one after it with their records and staging; topic DDL, which
    # checkpoints first, works.
    assert database.committer.checkpoint() == 2
    assert database.committer.backlog == 2
    with pytest.raises(commit.CheckpointSetAside):  # nor a retention pass
        database.committer.checkpoint_whole()
    session.execute("CREATE TOPIC u")
    session.execute("DROP TOPIC u")
    session.execute("ALTER TOPIC t SET (retention_period = Interval('PT1H'))")
    # ... but not DDL that drops a consumer (one re-created under its name would inherit
    # the kept records' moves); a retention pass, which needs a whole checkpoint, is
    # skipped (``checkpoint_whole`` raises, as above)
    with pytest.raises(commit.CheckpointSetAside):
        session.execute("ALTER TOPIC t DROP CONSUMER c")
    assert database.committer.backlog == 2
    session.close()
    database.close()  # its checkpoint sets them aside too: no error
    database = Database.open(str(tmp_path / "data"))  # recovery republishes what is missing
    session = database.connect()
    assert _data(session, "t") == sorted(_rows(0, 64)[0])
    assert _data(session, "other") == sorted(_rows(0, 128)[0])
    assert database.committer.backlog == 0  # the recovery's checkpoint released them
    session.close()
    database.close()
