"""Consumer members: partitions shared out by lease; a member that lost its lease cannot commit."""

from __future__ import annotations

import time

import pytest

from engine.database import Database
from storage import errors
from tests.engine.conftest import rows

LEASE_S = 1.0


@pytest.fixture
def database(request, tmp_path):
    """Leases last ``LEASE_S`` for tests marked to need expiry, else long (no timing flakes)."""
    short = request.node.get_closest_marker("short_leases") is not None
    db = Database.open(str(tmp_path / "data"), lease_timeout_s=LEASE_S if short else 60.0)
    yield db
    db.close()


def _setup(session, partitions: int = 1) -> None:
    session.execute(
        f"CREATE TOPIC t (CONSUMER c) WITH (min_active_partitions = {partitions}); "
        "CREATE TOPIC out"
    )
    for partition in range(partitions):
        session.execute(
            f"INSERT INTO TOPIC t (data) VALUES ('m{partition}a'), ('m{partition}b') "
            f"WITH (partition = {partition})"
        )


def _move(member: str) -> str:
    return (
        "INSERT INTO TOPIC out (data) SELECT data FROM TOPIC t "
        f"WITH (consumer = 'c', member = '{member}')"
    )


@pytest.mark.short_leases
def test_stalled_member_whose_lease_was_taken_over_gets_40001(database):
    first, second = database.connect(), database.connect()
    _setup(first)
    first.execute("BEGIN")
    first.execute(_move("m1"))
    time.sleep(LEASE_S * 1.5)  # first stalls past its lease
    second.execute("BEGIN")
    second.execute(_move("m2"))
    second.execute("COMMIT")
    with pytest.raises(errors.SerializationFailure) as caught:
        first.execute("COMMIT")
    assert caught.value.sqlstate == "40001"
    assert "lost its lease" in caught.value.message
    data = sorted(r["data"] for r in rows(second, "SELECT data FROM TOPIC out"))
    assert data == [b"m0a", b"m0b"]


def test_members_share_partitions_and_each_reads_only_its_own(database):
    first, second = database.connect(), database.connect()
    _setup(first, partitions=2)
    sql = "SELECT partition FROM TOPIC t WITH (consumer = 'c', member = '{}')"
    first.execute(sql.format("m1"))  # alone: owns both partitions, reads everything
    first.execute("INSERT INTO TOPIC t (data) VALUES ('x'), ('y') WITH (partition = 0)")
    first.execute("INSERT INTO TOPIC t (data) VALUES ('z') WITH (partition = 1)")
    # m2 joins: the partitions are shared out, each member reads only its own.
    seen_second = {r["partition"] for r in rows(second, sql.format("m2"))}
    seen_first = {r["partition"] for r in rows(first, sql.format("m1"))}
    assert seen_first.isdisjoint(seen_second)
    assert seen_first | seen_second == {0, 1}


def test_closing_a_session_releases_its_partitions(database):
    first, second = database.connect(), database.connect()
    _setup(first, partitions=2)
    sql = "SELECT partition FROM TOPIC t WITH (consumer = 'c', member = '{}')"
    first.execute(sql.format("m1"))
    second.execute(sql.format("m2"))
    second.close()
    first.execute("INSERT INTO TOPIC t (data) VALUES ('p0') WITH (partition = 0)")
    first.execute("INSERT INTO TOPIC t (data) VALUES ('p1') WITH (partition = 1)")
    seen = {r["partition"] for r in rows(first, sql.format("m1"))}
    assert seen == {0, 1}


@pytest.mark.short_leases
def test_a_member_that_keeps_reading_keeps_its_lease(database):
    session = database.connect()
    _setup(session)
    session.execute("BEGIN")
    for _ in range(3):
        session.execute(_move("m1"))
        time.sleep(LEASE_S / 4)
    session.execute("COMMIT")
    assert len(rows(session, "SELECT * FROM TOPIC out")) == 2


def test_plain_readers_ignore_members_and_conflict_optimistically(database):
    member, plain = database.connect(), database.connect()
    _setup(member)
    member.execute("BEGIN")
    member.execute(_move("m1"))
    plain.execute("BEGIN")
    plain.execute("INSERT INTO TOPIC out (data) SELECT data FROM TOPIC t WITH (consumer = 'c')")
    plain.execute("COMMIT")
    with pytest.raises(errors.SerializationFailure):
        member.execute("COMMIT")
