"""Aborting staged writes (``engine.bulk_write.BulkWrites.abort``): by a prefix (``'job-*'``,
what a Spark driver sends for the tasks whose ids it never learned), and while a COPY is
still adding rows to the write: nothing stays staged and the staged-bytes count stays
that of the writes left."""

from __future__ import annotations

import os
import threading

import pyarrow as pa
import pytest

from engine import bulk_write
from engine.database import Database
from engine.identity import Identity
from storage.errors import (
    InsufficientPrivilegeError,
    InvalidParameterValueError,
    UndefinedObjectError,
)
from tests.engine.bulk_helpers import topic_for_alice_and_bob

ALICE = Identity("alice", superuser=False)
BOB = Identity("bob", superuser=False)
SCHEMA = pa.schema([("data", pa.binary())])


@pytest.fixture
def database(tmp_path):
    with topic_for_alice_and_bob(tmp_path) as db:
        yield db


def _batch(count: int) -> pa.RecordBatch:
    return pa.record_batch([pa.array([b"x" * 100] * count, pa.binary())], schema=SCHEMA)


def _stage(database, identity: Identity, write_id: str, count: int = 10) -> None:
    session = database.connect(identity)
    try:
        writes = bulk_write.for_database(database)
        writes.start(session, write_id, "topic", "t")
        writes.append(session, write_id, [_batch(count)], SCHEMA)
    finally:
        session.close()


def _abort(database, identity: Identity, write_ids: list[str]) -> int:
    session = database.connect(identity)
    try:
        return bulk_write.for_database(database).abort(session, write_ids)
    finally:
        session.close()


def _staged(database) -> list[str]:
    return sorted(os.listdir(os.path.join(database.path, bulk_write.WRITES_DIRECTORY)))


def _bytes_of(database, write_id: str) -> int:
    directory = os.path.join(database.path, bulk_write.WRITES_DIRECTORY, write_id)
    return sum(os.path.getsize(os.path.join(directory, n)) for n in os.listdir(directory)
               if n.endswith(bulk_write.STAGED_SUFFIXES))  # fmt: skip


def test_an_abort_by_prefix_discards_every_write_of_the_job_and_only_the_users(
        database: Database) -> None:  # fmt: skip
    for write_id in ("job1-0-7", "job1-1-8", "job12-0-9", "job2-0-3"):
        _stage(database, ALICE, write_id)
    _stage(database, BOB, "job1-2-10")  # another user's write with the prefix: skipped
    bobs = _bytes_of(database, "job1-2-10")
    kept = _bytes_of(database, "job12-0-9") + _bytes_of(database, "job2-0-3")
    with pytest.raises(InsufficientPrivilegeError):  # named, it is refused
        _abort(database, ALICE, ["job1-2-10"])
    assert _abort(database, ALICE, ["job1-*", "job1-0-7"]) == 2  # named twice: once
    assert _staged(database) == ["job1-2-10", "job12-0-9", "job2-0-3"]
    assert bulk_write.for_database(database).staged_bytes == kept + bobs
    assert _abort(database, BOB, ["job1-*"]) == 1
    assert _staged(database) == ["job12-0-9", "job2-0-3"]
    assert bulk_write.for_database(database).staged_bytes == kept
    assert _abort(database, ALICE, ["job1-*"]) == 0  # a replay aborts nothing
    for bad in ("*", "-*", "job 1*", "job1-**"):
        with pytest.raises(InvalidParameterValueError):
            _abort(database, ALICE, [bad])
    assert _staged(database) == ["job12-0-9", "job2-0-3"]


@pytest.mark.parametrize("frames", [False, True])
def test_an_abort_while_a_copy_adds_rows_leaves_nothing_staged(database: Database,
                                                               frames: bool) -> None:  # fmt: skip
    """The COPY has its file open (a first batch written) when the abort comes: the COPY
    fails with 42704 when it goes on, nothing of the write is left, and the staged-bytes
    count is the other write's (the COPY's unfinished file counted once, not twice)."""
    _stage(database, ALICE, "other")
    kept = _bytes_of(database, "other")
    session = database.connect(ALICE)
    writes = bulk_write.for_database(database)
    writes.start(session, "w-1", "topic", "t")
    opened, resume = threading.Event(), threading.Event()

    def batches():
        yield _batch(2000)
        opened.set()
        assert resume.wait(30)
        yield _batch(2000)

    outcome: list[BaseException | int] = []

    def copy() -> None:
        try:
            if frames:  # rows naming their partition: staged as a frames file
                schema = pa.schema([("data", pa.binary()), ("partition", pa.int32())])
                rows = (pa.record_batch([b.column(0), pa.array([1] * b.num_rows, pa.int32())],
                                        schema=schema) for b in batches())  # fmt: skip
                outcome.append(writes.append(session, "w-1", rows, schema))
            else:
                outcome.append(writes.append(session, "w-1", batches(), SCHEMA))
        except BaseException as error:  # the test looks at it
            outcome.append(error)

    thread = threading.Thread(target=copy)
    thread.start()
    assert opened.wait(30)
    directory = os.path.join(database.path, bulk_write.WRITES_DIRECTORY, "w-1")
    assert any(n.endswith(".part") for n in os.listdir(directory))  # the COPY's file is open
    assert _abort(database, ALICE, ["w-1"]) == 1
    resume.set()
    thread.join(30)
    session.close()
    assert len(outcome) == 1 and isinstance(outcome[0], UndefinedObjectError), outcome
    assert _staged(database) == ["other"]
    assert writes.staged_bytes == kept
    assert os.listdir(writes.commits_root) == []  # the aborted directory is deleted
