"""Two commits of one new sink id racing so that the second's transaction began before the
first committed but claims the sink after it (``engine.bulk_publish.claim``): the loser
gets 40001 (retryable), as every other conflict, never 23505; one user's two commits then
both commit (the loser's retry)."""

from __future__ import annotations

import threading

import pyarrow as pa
import pytest

from engine import bulk_publish, bulk_write
from engine.identity import LOCAL_SUPERUSER, Identity
from storage import failpoints
from storage.errors import InsufficientPrivilegeError, SerializationFailure
from tests.engine.bulk_helpers import topic_for_alice_and_bob

ALICE = Identity("alice", superuser=False)
BOB = Identity("bob", superuser=False)


@pytest.fixture
def database(tmp_path):
    with topic_for_alice_and_bob(tmp_path) as db:
        yield db
        failpoints.deactivate()


def _stage(database, identity: Identity, write_id: str, count: int) -> None:
    session = database.connect(identity)
    try:
        bulk = bulk_write.for_database(database)
        bulk.start(session, write_id, "topic", "t")
        batch = pa.record_batch({"data": pa.array([b"m-%d" % i for i in range(count)])})
        bulk.append(session, write_id, [batch], batch.schema)
    finally:
        session.close()


def _stage_table_row(database, identity: Identity, write_id: str, table: str) -> None:
    """A write of one row to ``table`` (created, ``identity`` may insert): a commit holding
    it writes to DuckDB before it claims its sink, so its snapshot is older than that."""
    admin = database.connect(LOCAL_SUPERUSER)
    try:
        admin.execute(f"CREATE TABLE {table} (x BIGINT)")
        admin.execute(f"GRANT INSERT ON {table} TO {identity.name}")
    finally:
        admin.close()
    session = database.connect(identity)
    try:
        bulk = bulk_write.for_database(database)
        bulk.start(session, write_id, "table", table)
        batch = pa.record_batch({"x": pa.array([7], pa.int64())})
        bulk.append(session, write_id, [batch], batch.schema)
    finally:
        session.close()


def _commit(database, identity: Identity, sink: str, batch_id: int, write_ids: list[str]):
    session = database.connect(identity)
    try:
        return bulk_write.for_database(database).commit(session, sink, batch_id, write_ids)
    finally:
        session.close()


def _count(database, source: str) -> int:
    session = database.connect()
    try:
        result = session.execute(f"SELECT count(*) AS n FROM {source}")[-1]
        return int(result.table.column(0)[0].as_py())
    finally:
        session.close()


def _race(database, monkeypatch, runs: list[tuple[Identity, list[str], int]]
          ) -> dict[int, object]:  # fmt: skip
    """Run the two commits ``runs`` (identity, write ids, batch id) on the new sink
    ``new-sink``: the second's first claim waits, inside its transaction, until the first
    commit has ended. Returns each batch id's outcome (a dict or the error)."""
    first_done = threading.Event()
    claim = bulk_publish.claim
    second = threading.local()
    calls: list[str] = []

    def claim_late(session, sink_id: str) -> None:
        calls.append(sink_id)
        if getattr(second, "is_second", False) and len(calls) <= 2:
            assert first_done.wait(60), "the first commit did not end"
        claim(session, sink_id)

    monkeypatch.setattr(bulk_publish, "claim", claim_late)
    outcomes: dict[int, object] = {}

    def run(index: int, identity: Identity, write_ids: list[str], batch_id: int) -> None:
        second.is_second = index == 1
        try:
            outcomes[batch_id] = _commit(database, identity, "new-sink", batch_id, write_ids)
        except Exception as error:  # the outcome under test
            outcomes[batch_id] = error
        finally:
            if index == 0:
                first_done.set()

    threads = [threading.Thread(target=run, args=(index, *args)) for index, args in enumerate(runs)]
    threads[1].start()  # the second begins first and waits in its claim
    threads[0].start()
    for thread in threads:
        thread.join(120)
    return outcomes


def test_one_users_two_commits_on_a_new_sink_both_commit(database, monkeypatch) -> None:
    _stage(database, ALICE, "a-1", 20)
    _stage(database, ALICE, "a-2", 30)
    _stage_table_row(database, ALICE, "a-2t", "alices")
    outcomes = _race(database, monkeypatch, [(ALICE, ["a-1"], 1), (ALICE, ["a-2", "a-2t"], 2)])
    assert outcomes == {1: {"status": "committed", "rows": 20},
                        2: {"status": "committed", "rows": 31}}, outcomes  # fmt: skip
    assert _count(database, "TOPIC t") == 50
    assert _count(database, "alices") == 1  # the retry wrote it once


def test_two_users_racing_on_a_new_sink_the_loser_gets_a_retryable_or_owner_error(
    database, monkeypatch
) -> None:
    _stage(database, ALICE, "a-1", 20)
    _stage(database, BOB, "b-1", 30)
    _stage_table_row(database, BOB, "b-1t", "bobs")
    outcomes = _race(database, monkeypatch, [(ALICE, ["a-1"], 1), (BOB, ["b-1", "b-1t"], 2)])
    assert outcomes[1] == {"status": "committed", "rows": 20}, outcomes
    assert isinstance(outcomes[2], SerializationFailure | InsufficientPrivilegeError), outcomes
