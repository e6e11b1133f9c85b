"""A bulk commit whose rows name their partitions is committed by reference
(``engine.staged_refs``): no spill, nothing in the staging log, the record names the
staged files, which live in ``bulk_commits/`` until the checkpoint that makes the
partitions durable; a commit that fails before its commit point gives the writes back."""

from __future__ import annotations

import json
import os

import pyarrow as pa
import pytest

from engine import bulk_publish, bulk_write
from engine.catalog import SCHEMA
from engine.database import Database
from engine.staged_writes import TransactionStaging
from storage import failpoints
from storage.errors import LimitExceededError, StorageIOError, TopicbaseError
from tests.engine.bulk_helpers import commit_writes


@pytest.fixture
def database(tmp_path):
    db = Database.open(str(tmp_path / "data"), retention_interval_s=None)
    session = db.connect()
    session.execute("CREATE TOPIC t WITH (min_active_partitions = 2)")
    session.close()
    yield db
    db.close()


def _stage(database, write_id: str, count: int, *, partitions: bool = True) -> None:
    """Stage rows as they came (an Arrow stream file): a codec column keeps them out of
    the frames format (``engine.staged_refs.framed_batch``; that one:
    ``test_bulk_commit_framed.py``)."""
    session = database.connect()
    columns = {"data": pa.array([b"%s-%d" % (write_id.encode(), i) for i in range(count)]),
               "codec": pa.array(["raw"] * count)}  # fmt: skip
    if partitions:
        columns["partition"] = pa.array([i % 2 for i in range(count)], pa.int32())
    batch = pa.record_batch(columns)
    bulk = bulk_write.for_database(database)
    bulk.start(session, write_id, "topic", "t")
    bulk.append(session, write_id, [batch], batch.schema)
    session.close()


_commit = commit_writes


def _staging_bytes(database) -> int:
    directory = os.path.join(database.path, "staging")
    return sum(os.path.getsize(os.path.join(directory, n)) for n in os.listdir(directory))


def _records(database) -> list[list]:
    cursor = database.root.cursor()
    try:
        rows = cursor.execute(f"SELECT items FROM {SCHEMA}.transactions").fetchall()
    finally:
        cursor.close()
    return [json.loads(items) for (items,) in rows]


def _messages(database) -> list[bytes]:
    session = database.connect()
    try:
        table = session.execute("SELECT data FROM TOPIC t")[-1].table
        return sorted(table.column("data").to_pylist())
    finally:
        session.close()


def test_a_commit_by_reference_copies_nothing_and_keeps_the_files_to_the_checkpoint(
        database, monkeypatch) -> None:  # fmt: skip
    _stage(database, "a", 300)
    _stage(database, "b", 200)
    database.committer.checkpoint()
    before = _staging_bytes(database)

    def no_spill(self, batch):
        raise AssertionError("a batch committed by reference was spilled")

    monkeypatch.setattr(TransactionStaging, "_spill", no_spill)
    assert _commit(database, 1, ["a", "b"]) == {"status": "committed", "rows": 500}
    assert _staging_bytes(database) == before  # no batch went to the staging log
    bulk = bulk_write.for_database(database)
    assert os.listdir(bulk.root) == []  # the write ids are free again
    (commit_directory,) = os.listdir(bulk.commits_root)
    (items,) = [r for r in _records(database) if r]
    assert sorted(item[1] for item in items) == [0, 1]
    for _, _, by_reference in items:
        (reference,) = by_reference["references"]
        assert [os.path.dirname(os.path.dirname(f[0])) for f in reference["files"]] == [
            os.path.join(bulk_write.COMMITS_DIRECTORY, commit_directory)] * 2
    assert len(_messages(database)) == 500
    database.committer.checkpoint()  # partitions synced: the files may go
    assert os.listdir(bulk.commits_root) == []
    assert _records(database) == []
    assert bulk.staged_bytes == 0


def test_rows_routed_by_the_topic_are_copied_as_before(database) -> None:
    _stage(database, "a", 100, partitions=False)
    before = _staging_bytes(database)
    assert _commit(database, 1, ["a"])["rows"] == 100
    assert _staging_bytes(database) > before
    assert os.listdir(bulk_write.for_database(database).commits_root) == []


def test_a_commit_failing_before_its_commit_point_gives_the_writes_back(
        database, monkeypatch) -> None:  # fmt: skip
    _stage(database, "a", 100)
    bulk = bulk_write.for_database(database)
    staged = bulk.staged_bytes
    real = bulk_publish._record

    def refuse(*args, **kwargs):
        raise LimitExceededError("refused")

    monkeypatch.setattr(bulk_publish, "_record", refuse)
    with pytest.raises(TopicbaseError):
        _commit(database, 1, ["a"])
    assert os.listdir(bulk.root) == ["a"] and os.listdir(bulk.commits_root) == []
    assert bulk.staged_bytes == staged
    assert _messages(database) == []
    monkeypatch.setattr(bulk_publish, "_record", real)
    assert _commit(database, 1, ["a"]) == {"status": "committed", "rows": 100}
    assert len(_messages(database)) == 100


def test_a_commit_over_the_transactions_cap_is_refused_and_gives_the_writes_back(
        database) -> None:  # fmt: skip
    _stage(database, "a", 1000)
    database.staged_writes.total_bytes_max = 1000  # less than the rows
    bulk = bulk_write.for_database(database)
    with pytest.raises(LimitExceededError):
        _commit(database, 1, ["a"])
    assert os.listdir(bulk.root) == ["a"]
    database.staged_writes.total_bytes_max = 1 << 30
    assert _commit(database, 1, ["a"])["rows"] == 1000


@pytest.mark.parametrize(("action", "raised"), [("error", StorageIOError),
                                                ("nomem", MemoryError)])  # fmt: skip
def test_a_release_that_fails_midway_is_finished_at_the_next_start(
        tmp_path, action: str, raised: type[BaseException]) -> None:  # fmt: skip
    """``nomem``: round 24 (H8), an allocation refused there (the process memory cap)."""
    path = str(tmp_path / "data")
    database = Database.open(path, retention_interval_s=None)
    session = database.connect()
    session.execute("CREATE TOPIC t WITH (min_active_partitions = 2)")
    session.close()
    _stage(database, "a", 50)
    assert _commit(database, 1, ["a"])["rows"] == 50
    _stage(database, "b", 50)
    assert _commit(database, 2, ["b"])["rows"] == 50
    commits = os.path.join(path, bulk_write.COMMITS_DIRECTORY)
    assert len(os.listdir(commits)) == 2
    failpoints.activate(f"bulk.mid_release={action}")
    try:
        with pytest.raises(raised):
            database.committer.checkpoint()
    finally:
        failpoints.deactivate()
    assert len(os.listdir(commits)) == 1  # the first deleted, the second left
    _stage(database, "c", 50)  # the process goes on: another commit and checkpoint
    assert _commit(database, 3, ["c"])["rows"] == 50
    database.committer.checkpoint()
    assert len(_messages(database)) == 150
    database.close()
    database = Database.open(path, retention_interval_s=None)
    try:
        bulk_write.for_database(database)  # settles: the batch is recorded, so it goes
        assert os.listdir(commits) == []
        assert len(_messages(database)) == 150 and len(set(_messages(database))) == 150
    finally:
        database.close()


def test_a_staged_file_carries_its_checksum_and_the_commit_records_it(database) -> None:
    import crc32c

    _stage(database, "a", 100)
    bulk = bulk_write.for_database(database)
    (name,) = [n for n in os.listdir(os.path.join(bulk.root, "a")) if n.endswith(".arrows")]
    with open(os.path.join(bulk.root, "a", name), "rb") as handle:
        assert name.split(".")[1] == f"{crc32c.crc32c(handle.read()):08x}"
    assert _commit(database, 1, ["a"])["rows"] == 100
    (items,) = [r for r in _records(database) if r]
    (file_,) = items[0][2]["references"][0]["files"]
    assert file_[0].endswith(name) and f"{file_[2]:08x}" == name.split(".")[1]


def test_rows_by_reference_and_routed_rows_of_one_topic_are_copied_together(database) -> None:
    """One commit with rows naming their partitions and rows the topic routes: both land
    in the same partitions, so the shares are copied (a record naming the files could not
    derive the routed rows) and every row is published once."""
    _stage(database, "a", 100)
    _stage(database, "b", 100, partitions=False)
    assert _commit(database, 1, ["a", "b"])["rows"] == 200
    bulk = bulk_write.for_database(database)
    assert os.listdir(bulk.commits_root) == [] and os.listdir(bulk.root) == []
    assert all(len(item) == 5 for record in _records(database) for item in record)
    expected = sorted([b"a-%d" % i for i in range(100)] + [b"b-%d" % i for i in range(100)])
    assert _messages(database) == expected


def test_commits_by_reference_take_a_turn_that_bounds_their_memory(database) -> None:
    """The batches of a commit by reference are in memory from their derivation to the
    publish: such commits run at most ``SPILLED_COMMITS_MAX`` at once (a turn each)."""
    import threading

    from storage import limits

    bulk = bulk_write.for_database(database)
    turns = []

    class Turns:
        def __init__(self) -> None:
            self._inner = threading.BoundedSemaphore(limits.SPILLED_COMMITS_MAX)

        def __enter__(self):
            turns.append("taken")
            return self._inner.__enter__()

        def __exit__(self, *exc):
            turns.append("given back")
            return self._inner.__exit__(*exc)

    bulk._by_reference_turns = Turns()
    _stage(database, "a", 100)
    assert _commit(database, 1, ["a"])["rows"] == 100
    _stage(database, "b", 100, partitions=False)  # routed: copied, no turn
    assert _commit(database, 2, ["b"])["rows"] == 100
    assert turns == ["taken", "given back"]
