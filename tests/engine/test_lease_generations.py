"""Lease generations: a transaction commits only under the lease (member *and* generation)
it read under, whatever the consumer offsets say.

The offset check at COMMIT gives 40001 when another reader moved the consumer's offset;
these tests keep every offset where it was, so only the lease check can refuse the
COMMIT: a member that rejoins under the same name in another session starts a new
generation and takes the partitions over, and a second member's join takes some of them.
"""

from __future__ import annotations

import pytest

from engine.database import Database
from storage import errors
from tests.engine.conftest import rows


@pytest.fixture
def database(tmp_path):
    """Long leases: nothing here may depend on a lease expiring."""
    db = Database.open(str(tmp_path / "data"), lease_timeout_s=600.0)
    yield db
    db.close()


def _setup(session, partitions: int) -> None:
    session.execute(
        f"CREATE TOPIC t (CONSUMER c) WITH (min_active_partitions = {partitions}); CREATE TOPIC out"
    )
    for partition in range(partitions):
        session.execute(
            f"INSERT INTO TOPIC t (data) VALUES ('m{partition}') WITH (partition = {partition})"
        )


def _move(member: str) -> str:
    return (
        "INSERT INTO TOPIC out (data) SELECT data FROM TOPIC t "
        f"WITH (consumer = 'c', member = '{member}')"
    )


def _committed(session) -> dict[int, int | None]:
    found = rows(
        session,
        "SELECT partition, committed_offset FROM sys.consumers "
        "WHERE topic = 't' AND consumer = 'c'",
    )
    return {r["partition"]: r["committed_offset"] for r in found}


def test_commit_raises_40001_when_lease_was_taken_by_same_member_name_newer_generation(
    database,
):
    first, second = database.connect(), database.connect()
    _setup(first, partitions=1)
    first.execute("BEGIN")
    assert first.execute(_move("m1"))[-1].tag == "INSERT 0 1"
    # Another session joins under the same member name: a new generation, and the
    # partition's owner is still called "m1", but it is not first's lease any more.
    second.execute("BEGIN")
    assert second.execute(_move("m1"))[-1].tag == "INSERT 0 1"
    assert _committed(first) == {0: None}  # nobody moved the offset: no offset conflict
    with pytest.raises(errors.SerializationFailure) as caught:
        first.execute("COMMIT")
    assert caught.value.sqlstate == "40001"
    assert 'member "m1"' in caught.value.message and "lost its lease" in caught.value.message
    assert _committed(second) == {0: None}
    assert rows(second, "SELECT data FROM TOPIC out") == []  # first's move left nothing
    second.execute("COMMIT")  # the current holder commits
    assert _committed(second) == {0: 1}
    assert [r["data"] for r in rows(second, "SELECT data FROM TOPIC out")] == [b"m0"]


def test_commit_raises_40001_when_a_new_member_took_a_partition_although_no_offset_moved(
    database,
):
    first, second = database.connect(), database.connect()
    _setup(first, partitions=2)
    first.execute("BEGIN")
    assert first.execute(_move("m1"))[-1].tag == "INSERT 0 2"  # alone: both partitions
    # m2 joins inside a transaction it never commits: a partition is handed to it, and
    # every offset stays where it was.
    second.execute("BEGIN")
    read = rows(second, "SELECT partition FROM TOPIC t WITH (consumer = 'c', member = 'm2')")
    assert len(read) == 1
    assert _committed(first) == {0: None, 1: None}
    with pytest.raises(errors.SerializationFailure) as caught:
        first.execute("COMMIT")
    assert caught.value.sqlstate == "40001"
    assert "lost its lease" in caught.value.message
    assert _committed(first) == {0: None, 1: None}
    assert rows(first, "SELECT data FROM TOPIC out") == []
    second.execute("ROLLBACK")


def test_a_member_that_rejoins_in_its_own_session_keeps_its_lease(database):
    """The same session reading again under its own name is a heartbeat, not a new
    generation: its transaction still commits."""
    session = database.connect()
    _setup(session, partitions=2)
    session.execute("BEGIN")
    session.execute(_move("m1"))
    session.execute(_move("m1"))
    session.execute("COMMIT")
    assert _committed(session) == {0: 1, 1: 1}
