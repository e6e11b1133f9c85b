"""An autocommit write spread over many partitions commits by one record in the staging log.

What must hold (``engine.spread_append``): a write that reaches ``SPREAD_SHARES_MIN``
or more partitions of a synced topic costs one staging sync and no partition sync on
its way to the acknowledgement; RETURNING reports each message's partition, offset and
status in the statement's order, duplicates included; a partition that cannot be
written refuses the whole statement before anything is committed; concurrent spread
writes keep every message once and each producer's order; writes with an explicit
partition, to an unsynced topic or to fewer partitions take the plain path. Crashes:
``test_spread_append_crash.py``.

With the store's ledger on (``pytest --ledger``: statements over 4 partitions or more go
to the topic's ledger, ``storage.ledger_route``) the same statements commit by one ledger
frame instead of a staging record: the counts below are of both (``_spread_commits``), the
sync's is the ledger's, and the tests of the staging log's own work (its recovery, its
checkpoint) keep the ledger off (``ledger_off``).
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from engine import commit, spread_append
from engine.database import Database
from storage import errors, limits
from storage.config import FsyncPolicy
from storage.partition_log import PartitionLog

INSERT = (
    "INSERT INTO TOPIC t (data, producer_id, seq_no) SELECT unnest(?), unnest(?), unnest(?)"
)
PRODUCERS = 32
WAIT_S = 120  # a bound on waiting for threads, never a timing assertion


def _rows(first: int, count: int, producers: int = PRODUCERS, prefix: str = "p"):
    data = [f"m{first + i}".encode() for i in range(count)]
    ids = [f"{prefix}{i % producers}" for i in range(count)]
    seq_nos = [first + i for i in range(count)]
    return [data, ids, seq_nos]


def _all_messages(database: Database) -> dict[bytes, tuple[int, int, str, int]]:
    """data -> (partition, offset, producer id, seq_no) of every message of topic t."""
    entry = database.catalog.entry("t")
    assert entry is not None
    topic = database.topic_log(entry.topic_id)
    found = {}
    for partition_id in topic.partition_ids():
        log = topic.partition(partition_id)
        offset = log.start_offset
        while offset < log.end_offset:
            result = log.read(offset, max_messages=10_000)
            for batch in result.batches:
                rows = batch.to_pydict()
                for data, at, producer, seq_no in zip(
                    rows["data"], rows["offset"], rows["producer_id"], rows["seq_no"],
                    strict=True,
                ):  # fmt: skip
                    assert data not in found, f"{data} twice"
                    found[data] = (partition_id, at, producer, seq_no)
            offset = result.next_offset
    return found


def _ledger_frames(database: Database) -> int:
    """Frames topic t's ledger holds or held (0: no ledger)."""
    entry = database.catalog.entry("t")
    assert entry is not None
    ledger = database.topic_log(entry.topic_id).ledger
    return 0 if ledger is None else ledger.ledger.next_sequence


def _spread_commits(database: Database) -> int:
    """Spread statements committed: by a staging record (``log_commits``) or, with the
    ledger on, by a ledger frame of topic t (one a statement; a statement with a
    duplicate in it goes the staging way)."""
    return database.commit_counters()["log_commits"] + _ledger_frames(database)


@pytest.fixture
def database(tmp_path: Path):
    database = Database.open(str(tmp_path / "data"))
    session = database.connect()
    session.execute("CREATE TOPIC t WITH (min_active_partitions = 8)")
    session.close()
    yield database
    database.close()


def test_a_spread_write_costs_one_staging_sync_and_no_partition_sync(database, monkeypatch) -> None:
    monkeypatch.setattr(limits, "LEDGER_COPY_WAIT_S", 3600.0)  # (the ledger's copier held off)
    session = database.connect()
    before, frames = database.commit_counters(), _ledger_frames(database)
    session.execute(INSERT, _rows(0, 96))
    after = database.commit_counters()
    ledger = _ledger_frames(database) - frames  # the ledger on: its frame is the commit
    assert after["log_commits"] + ledger == before["log_commits"] + 1
    assert after["staging_syncs"] + ledger == before["staging_syncs"] + 1
    # every fsync of the statement is the staging log's (or the ledger's): none of the 8
    # partitions synced
    assert after["fs_fsyncs"] - before["fs_fsyncs"] == 1
    found = _all_messages(database)
    assert len(found) == 96 and len({p for p, *_ in found.values()}) == 8
    session.close()


def test_returning_reports_each_message_in_order_and_a_resend_is_wholly_duplicate(
    database,
) -> None:
    session = database.connect()
    returning = INSERT + " RETURNING partition, offset, status, producer_id, seq_no"
    first = session.execute(returning, _rows(0, 96))[0].table.to_pylist()
    found = _all_messages(database)
    assert [row["seq_no"] for row in first] == list(range(96))
    for index, row in enumerate(first):
        assert row["status"] == "written"
        assert row["producer_id"] == f"p{index % PRODUCERS}"
        assert found[f"m{index}".encode()][:2] == (row["partition"], row["offset"])
    again = session.execute(returning, _rows(0, 96))[0]
    assert again.table.to_pylist() == [{**row, "status": "duplicate"} for row in first]
    assert session.execute(INSERT, _rows(0, 96))[0].tag == "INSERT 0 0"
    assert len(_all_messages(database)) == 96
    assert _spread_commits(database) == 3  # each through the staging log (or the ledger)
    session.close()


def test_a_fenced_partition_refuses_the_whole_statement(database, monkeypatch) -> None:
    session = database.connect()
    session.execute(INSERT, _rows(0, 96))
    entry = database.catalog.entry("t")
    assert entry is not None
    log = database.topic_log(entry.topic_id).partition(3)
    # as ``_fence`` leaves it (undone before the database closes: its checkpoint syncs)
    monkeypatch.setattr(log, "_fenced", errors.StorageIOError("injected write failure"))
    commits = database.commit_counters()["log_commits"]
    with pytest.raises(errors.PartitionFencedError):
        session.execute(INSERT, _rows(96, 96))
    assert database.commit_counters()["log_commits"] == commits  # nothing committed
    assert len(_all_messages(database)) == 96  # no partition got its share
    session.close()


def test_concurrent_spread_writes_keep_every_message_once_and_each_producers_order(
    database,
) -> None:
    errors_seen: list[BaseException] = []

    def write(worker: int) -> None:
        session = database.connect()
        try:
            for n in range(6):
                session.execute(INSERT, _rows(1000 * worker + 48 * n, 48, 16, f"w{worker}-"))
        except BaseException as error:
            errors_seen.append(error)
        finally:
            session.close()

    threads = [threading.Thread(target=write, args=(w,)) for w in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT_S)
    assert not errors_seen
    assert _spread_commits(database) == 4 * 6
    found = _all_messages(database)
    assert len(found) == 4 * 6 * 48
    by_producer: dict[str, list[tuple[int, int, int]]] = {}
    for partition, offset, producer, seq_no in found.values():
        by_producer.setdefault(producer, []).append((partition, offset, seq_no))
    for producer, messages in by_producer.items():
        assert len({p for p, _, _ in messages}) == 1, producer  # one partition per producer
        seq_nos = [s for _, _, s in sorted(messages)]
        assert seq_nos == sorted(seq_nos), producer  # in seq_no order by offset


def test_metadata_survives_the_spread_write(database) -> None:
    session = database.connect()
    session.execute(
        "INSERT INTO TOPIC t (data, producer_id, metadata) "
        "SELECT 'm' || i, 'p' || (i % 32), '{\"k\": \"v' || i || '\"}' FROM range(96) r(i)"
    )
    assert _spread_commits(database) == 1
    entry = database.catalog.entry("t")
    assert entry is not None
    topic = database.topic_log(entry.topic_id)
    seen = {}
    for partition_id in topic.partition_ids():
        for batch in topic.read(partition_id, 0, max_messages=1000).batches:
            for row in batch.to_pylist():
                seen[row["data"]] = row["metadata"]
    assert len(seen) == 96
    assert all(seen[f"m{i}".encode()] == [("k", f"v{i}".encode())] for i in range(96))
    session.close()


@pytest.mark.parametrize(
    "case", ["explicit partition", "few partitions", "fsync never", "big shares"]
)
def test_other_writes_take_the_plain_path(tmp_path: Path, case: str) -> None:
    policy = FsyncPolicy.NEVER if case == "fsync never" else FsyncPolicy.GROUP
    database = Database.open(str(tmp_path / "data"), fsync_policy=policy)
    try:
        session = database.connect()
        session.execute("CREATE TOPIC t WITH (min_active_partitions = 8)")
        if case == "explicit partition":
            session.execute(
                "INSERT INTO TOPIC t (data, partition) SELECT 'm' || i, 2 FROM range(50) r(i)"
            )
        elif case == "big shares":  # 8 shares of 768 KiB: the log would write them twice
            rows = _rows(0, 96)
            rows[0] = [bytes(64 * 1024)] * 96
            session.execute(INSERT, rows)
        else:
            producers = spread_append.SPREAD_SHARES_MIN - 1 if case == "few partitions" else 32
            session.execute(INSERT, _rows(0, 96, producers))
        assert database.commit_counters()["log_commits"] == 0
        session.close()
    finally:
        database.close()


def test_recovery_scans_each_partition_once_whatever_the_number_of_records(
    tmp_path: Path, monkeypatch, ledger_off: None
) -> None:
    """Commit records of spread writes not checkpointed (a crash): recovery learns which
    transactions each partition holds from one scan of its frame headers, not one per
    record (``transaction_rows_since``), and republishes nothing that is there. (The
    staging log's recovery: the ledger off.)"""
    monkeypatch.setattr(commit, "CHECKPOINT_TRANSACTIONS", 10**9)
    database = Database.open(str(tmp_path / "data"))
    session = database.connect()
    session.execute("CREATE TOPIC t WITH (min_active_partitions = 8)")
    for n in range(5):
        session.execute(INSERT, _rows(96 * n, 96))
    session.close()
    monkeypatch.setattr(database.committer, "checkpoint", lambda: None)  # as a crash
    database.close()
    monkeypatch.undo()
    scans = []
    original = PartitionLog.transaction_rows_since
    monkeypatch.setattr(
        PartitionLog,
        "transaction_rows_since",
        lambda self, since: (scans.append(self.partition_id), original(self, since))[1],
    )

    def refused(*_: object) -> bool:
        raise AssertionError("a scan per record")

    monkeypatch.setattr(PartitionLog, "contains_transaction", refused)
    database = Database.open(str(tmp_path / "data"))
    try:
        assert sorted(scans) == list(range(8))  # 5 records x 8 partitions: 8 scans
        assert len(_all_messages(database)) == 5 * 96  # nothing republished twice
    finally:
        database.close()


def test_staged_bytes_make_a_checkpoint_due_before_the_transaction_count(
    ledger_off: None, database, monkeypatch
) -> None:
    """Spread writes stage their data: the checkpoint that releases it is due after
    ``CHECKPOINT_STAGED_BYTES`` too, not only after ``CHECKPOINT_TRANSACTIONS`` commits.
    (The staging log's checkpoint: the ledger off.)"""
    monkeypatch.setattr(commit, "CHECKPOINT_TRANSACTIONS", 10**9)
    monkeypatch.setattr(commit, "CHECKPOINT_STAGED_BYTES", 4096)
    session = database.connect()
    for n in range(3):
        session.execute(INSERT, _rows(96 * n, 96))  # ~7 KB staged each
    session.close()
    committer = database.committer
    for _ in range(WAIT_S * 10):  # a bound on waiting for the background thread
        if committer.checkpoints and not committer.backlog:
            break
        threading.Event().wait(0.1)
    assert committer.checkpoints >= 1 and committer.backlog == 0
    assert len(committer.staging.file_numbers()) <= 2  # released: the current and a spare
