"""Sinks of bulk commits belong to a user (``engine.bulk_publish``): another user cannot
record, probe or read the batches of someone else's sink; a commit whose COMMIT fails
after its commit point still answers ``committed``; a write being committed takes no
appends (``engine.bulk_write``)."""

from __future__ import annotations

import threading

import pyarrow as pa
import pytest

from engine import bulk_publish, bulk_write
from engine.identity import LOCAL_SUPERUSER, Identity
from storage import failpoints
from storage.errors import (
    InsufficientPrivilegeError,
    ObjectNotInPrerequisiteStateError,
    SerializationFailure,
)
from tests.engine.bulk_helpers import topic_for_alice_and_bob

ALICE = Identity("alice", superuser=False)
BOB = Identity("bob", superuser=False)
MALLORY = Identity("mallory", superuser=False)


@pytest.fixture
def database(tmp_path):
    with topic_for_alice_and_bob(tmp_path) as db:
        yield db
        failpoints.deactivate()


def _batch(count: int, *, partitions: bool = False) -> pa.RecordBatch:
    columns = {"data": pa.array([b"m-%d" % i for i in range(count)])}
    if partitions:
        columns["partition"] = pa.array([i % 2 for i in range(count)], pa.int32())
    return pa.record_batch(columns)


def _stage(database, identity: Identity, write_id: str, count: int, **options) -> None:
    session = database.connect(identity)
    try:
        bulk = bulk_write.for_database(database)
        bulk.start(session, write_id, "topic", "t")
        batch = _batch(count, **options)
        bulk.append(session, write_id, [batch], batch.schema)
    finally:
        session.close()


def _commit(database, identity: Identity, sink: str, batch_id: int,
            write_ids: list[str]) -> dict:  # fmt: skip
    session = database.connect(identity)
    try:
        return bulk_write.for_database(database).commit(session, sink, batch_id, write_ids)
    finally:
        session.close()


def _last_batch(database, identity: Identity, sink: str) -> int | None:
    session = database.connect(identity)
    try:
        return bulk_write.for_database(database).last_batch(session, sink)
    finally:
        session.close()


def _count(database) -> int:
    session = database.connect()
    try:
        result = session.execute("SELECT count(*) AS n FROM TOPIC t")[-1]
        return int(result.table.column(0)[0].as_py())
    finally:
        session.close()


def test_another_user_cannot_pre_record_a_sinks_batches(database) -> None:
    _stage(database, ALICE, "w-0", 10)
    assert _commit(database, ALICE, "orders", 0, ["w-0"]) == {"status": "committed", "rows": 10}
    for batch_id in range(1, 4):  # the R1 forgery: empty commits of the victim's next batches
        with pytest.raises(InsufficientPrivilegeError):
            _commit(database, MALLORY, "orders", batch_id, [])
    with pytest.raises(InsufficientPrivilegeError):
        _last_batch(database, MALLORY, "orders")  # nor where the sink resumes
    _stage(database, ALICE, "w-1", 100)
    assert _commit(database, ALICE, "orders", 1, ["w-1"]) == {"status": "committed", "rows": 100}
    assert _count(database) == 110
    assert _last_batch(database, ALICE, "orders") == 1
    assert _last_batch(database, Identity("root", superuser=True), "orders") == 1


def test_a_sink_claimed_by_another_user_refuses_loudly_and_keeps_the_writes(database) -> None:
    assert _commit(database, MALLORY, "orders", 5, []) == {"status": "committed", "rows": 0}
    _stage(database, ALICE, "w-1", 100)
    with pytest.raises(InsufficientPrivilegeError):
        _commit(database, ALICE, "orders", 5, ["w-1"])
    session = database.connect(ALICE)
    try:
        staged = [w.write_id for w in bulk_write.for_database(database).list(session)]
    finally:
        session.close()
    assert staged == ["w-1"]  # nothing deleted: the owner of the writes can commit elsewhere
    assert _commit(database, ALICE, "orders-2", 5, ["w-1"]) == {"status": "committed",
                                                                "rows": 100}  # fmt: skip


def test_the_owners_replay_is_a_duplicate(database) -> None:
    assert _commit(database, ALICE, "orders", 0, []) == {"status": "committed", "rows": 0}
    _stage(database, ALICE, "w-1", 10)
    assert _commit(database, ALICE, "orders", 1, ["w-1"]) == {"status": "committed", "rows": 10}
    _stage(database, ALICE, "w-2", 10)
    assert _commit(database, ALICE, "orders", 1, ["w-2"]) == {"status": "duplicate", "rows": 0}
    assert _last_batch(database, ALICE, "orders") == 1
    assert _count(database) == 10


def test_a_superuser_reads_any_sink_and_commits_to_superusers_sinks_only(database) -> None:
    root = Identity("root", superuser=True)
    assert _commit(database, MALLORY, "orders", 3, []) == {"status": "committed", "rows": 0}
    assert _last_batch(database, root, "orders") == 3
    # A sink a non-superuser claimed first (a squatted name) is refused loudly: taking its
    # records for replays would silently drop the superuser's writes (R1's repro).
    _stage(database, root, "w-1", 10)
    with pytest.raises(InsufficientPrivilegeError):
        _commit(database, root, "orders", 3, ["w-1"])
    assert _commit(database, LOCAL_SUPERUSER, "ops", 1, []) == {"status": "committed", "rows": 0}
    assert _commit(database, root, "ops", 1, []) == {"status": "duplicate", "rows": 0}
    assert _commit(database, root, "ops", 2, ["w-1"]) == {"status": "committed", "rows": 10}
    with pytest.raises(InsufficientPrivilegeError):
        _commit(database, MALLORY, "ops", 3, [])


def test_records_made_before_claims_are_claimed_by_the_first_commit(database) -> None:
    bulk_write.for_database(database)  # its tables exist
    cursor = database.root.cursor()
    try:  # a database from before the claims: a record, no claim row
        cursor.execute(f"INSERT INTO {bulk_publish.IDEMPOTENCY_TABLE} VALUES ('old', 3, 0, 0)")
    finally:
        cursor.close()
    assert _last_batch(database, MALLORY, "old") == 3  # unclaimed: anyone may read it
    assert _commit(database, ALICE, "old", 3, []) == {"status": "duplicate", "rows": 0}
    assert _commit(database, ALICE, "old", 4, []) == {"status": "committed", "rows": 0}
    with pytest.raises(InsufficientPrivilegeError):
        _last_batch(database, MALLORY, "old")


def test_two_users_claiming_one_new_sink_at_once_never_both_win(database, monkeypatch) -> None:
    _stage(database, ALICE, "a-1", 20)
    _stage(database, BOB, "b-1", 30)
    both_claimed = threading.Barrier(2)
    claim = bulk_publish.claim

    def claim_then_wait(session, sink_id: str) -> None:
        try:  # both transactions have tried to claim before either commits
            claim(session, sink_id)
        finally:
            both_claimed.wait()

    monkeypatch.setattr(bulk_publish, "claim", claim_then_wait)
    outcomes: dict[str, object] = {}

    def run(identity: Identity, write_id: str, batch_id: int) -> None:
        try:
            outcomes[identity.name] = _commit(database, identity, "new-sink", batch_id,
                                              [write_id])  # fmt: skip
        except Exception as error:  # the outcome under test
            outcomes[identity.name] = error

    threads = [threading.Thread(target=run, args=(ALICE, "a-1", 1)),
               threading.Thread(target=run, args=(BOB, "b-1", 1))]  # fmt: skip
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    won = [name for name, outcome in outcomes.items() if isinstance(outcome, dict)]
    assert len(won) == 1, outcomes
    assert outcomes[won[0]]["status"] == "committed", outcomes
    (lost,) = set(outcomes) - set(won)
    assert isinstance(outcomes[lost], InsufficientPrivilegeError | SerializationFailure), outcomes
    assert _count(database) == outcomes[won[0]]["rows"]
    monkeypatch.undo()
    winner = ALICE if won[0] == "alice" else BOB
    loser = BOB if winner is ALICE else ALICE
    with pytest.raises(InsufficientPrivilegeError):
        _commit(database, loser, "new-sink", 2, [])
    assert _last_batch(database, winner, "new-sink") == 1


def test_one_users_two_commits_claiming_a_new_sink_at_once_both_commit(
    database, monkeypatch
) -> None:
    _stage(database, ALICE, "a-1", 20)
    _stage(database, ALICE, "a-2", 30)
    both_claimed = threading.Barrier(2)
    claim = bulk_publish.claim
    calls: list[str] = []

    def claim_then_wait(session, sink_id: str) -> None:
        calls.append(sink_id)
        try:
            claim(session, sink_id)
        finally:
            if len(calls) <= 2:  # the first two claims meet; the loser's retry goes alone
                both_claimed.wait()

    monkeypatch.setattr(bulk_publish, "claim", claim_then_wait)
    outcomes: dict[int, object] = {}

    def run(write_id: str, batch_id: int) -> None:
        try:
            outcomes[batch_id] = _commit(database, ALICE, "new-sink", batch_id, [write_id])
        except Exception as error:  # the outcome under test
            outcomes[batch_id] = error

    threads = [threading.Thread(target=run, args=("a-1", 1)),
               threading.Thread(target=run, args=("a-2", 2))]  # fmt: skip
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert outcomes == {1: {"status": "committed", "rows": 20},
                        2: {"status": "committed", "rows": 30}}, outcomes  # fmt: skip
    assert len(calls) == 3  # the claims did race: one commit went twice
    assert _count(database) == 50


@pytest.mark.parametrize("by_reference", [False, True])
def test_a_commit_failing_after_its_commit_point_answers_committed(
    database, by_reference: bool
) -> None:
    _stage(database, ALICE, "w-1", 50, partitions=by_reference)
    failpoints.activate("commit.after_commit_point=error")
    assert _commit(database, ALICE, "s", 1, ["w-1"]) == {"status": "committed", "rows": 50}
    failpoints.deactivate()
    _stage(database, ALICE, "w-2", 50, partitions=by_reference)
    assert _commit(database, ALICE, "s", 1, ["w-2"]) == {"status": "duplicate", "rows": 0}
    _stage(database, ALICE, "w-3", 5, partitions=by_reference)  # its publish finishes ours
    assert _commit(database, ALICE, "s", 2, ["w-3"]) == {"status": "committed", "rows": 5}
    assert _count(database) == 55


def test_a_write_being_committed_refuses_appends(database, monkeypatch) -> None:
    _stage(database, ALICE, "w-1", 10)
    bulk = bulk_write.for_database(database)
    refused: list[Exception] = []
    read_write = bulk_write.BulkWrites.read_write

    def read_then_append(self, write_id: str) -> pa.Table:
        table = read_write(self, write_id)
        session = database.connect(ALICE)
        try:  # another stream of the same write arrives while the commit runs
            for attempt in (
                lambda: bulk.append(session, write_id, [_batch(5)], _batch(5).schema),
                lambda: bulk.abort(session, [write_id]),
                lambda: bulk.commit(session, "s", 2, [write_id]),
            ):
                with pytest.raises(ObjectNotInPrerequisiteStateError) as caught:
                    attempt()
                refused.append(caught.value)
        finally:
            session.close()
        return table

    monkeypatch.setattr(bulk_write.BulkWrites, "read_write", read_then_append)
    assert _commit(database, ALICE, "s", 1, ["w-1"]) == {"status": "committed", "rows": 10}
    assert [error.sqlstate for error in refused] == ["55000"] * 3
    assert _count(database) == 10


def test_a_write_with_an_append_in_flight_cannot_start_committing(database) -> None:
    _stage(database, ALICE, "w-1", 10)
    bulk = bulk_write.for_database(database)
    refused: list[Exception] = []

    def batches():
        yield _batch(5)
        try:  # the driver commits while this stream is still being staged
            _commit(database, ALICE, "s", 1, ["w-1"])
        except ObjectNotInPrerequisiteStateError as error:
            refused.append(error)
        yield _batch(5)

    session = database.connect(ALICE)
    try:
        assert bulk.append(session, "w-1", batches(), _batch(5).schema) == 10
    finally:
        session.close()
    assert len(refused) == 1
    assert _commit(database, ALICE, "s", 1, ["w-1"]) == {"status": "committed", "rows": 20}
    assert _count(database) == 20
