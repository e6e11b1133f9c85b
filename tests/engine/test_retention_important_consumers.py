"""Retention with several important consumers: the slowest one decides.

A partition's old segments may go only below the *smallest* committed offset of the
topic's important consumers (a consumer that never committed protects everything);
a fast important consumer must not let retention take what a slow one has not read.
Each test here has two or three important consumers per topic, at different offsets,
and per partition a different one is the slowest.
"""

from __future__ import annotations

import pytest

from engine.clock import ManualClock
from engine.database import Database
from tests.engine.conftest import rows

START_US = 1_700_000_000_000_000
HOUR_S = 3600


@pytest.fixture
def clocked(tmp_path):
    clock = ManualClock(START_US)
    db = Database.open(str(tmp_path / "data"), clock=clock, retention_interval_s=None)
    session = db.connect()
    yield db, session, clock
    session.close()
    db.close()


def _write_hourly(session, clock: ManualClock, hours: int, partitions: int) -> None:
    """One message per partition per hour: segments roll by age (15 min at PT1H)."""
    for hour in range(hours):
        for partition in range(partitions):
            session.execute(
                f"INSERT INTO TOPIC t (data) VALUES ('p{partition}m{hour}') "
                f"WITH (partition = {partition})"
            )
        clock.advance(seconds=HOUR_S)


def _consume(session, consumer: str, partition: int, count: int) -> list[str]:
    """Read ``count`` messages of one partition as ``consumer`` and commit them."""
    got = rows(
        session,
        f"SELECT CAST(data AS VARCHAR) AS d FROM TOPIC t WITH (consumer = '{consumer}', "
        f"partition = {partition}, max_messages = {count})",
    )
    return [r["d"] for r in got]


def _starts(session) -> dict[int, int]:
    found = rows(session, "SELECT partition, start_offset FROM sys.partitions WHERE topic = 't'")
    return {r["partition"]: r["start_offset"] for r in found}


def _remaining(session, consumer: str, partition: int) -> list[str]:
    got = rows(
        session,
        f"SELECT CAST(data AS VARCHAR) AS d FROM TOPIC t WITH (consumer = '{consumer}', "
        f"partition = {partition})",
    )
    return [r["d"] for r in got]


def test_retention_keeps_what_the_slowest_of_two_important_consumers_has_not_committed(clocked):
    db, session, clock = clocked
    session.execute(
        "CREATE TOPIC t (CONSUMER fast WITH (important = true), "
        "CONSUMER slow WITH (important = true)) WITH (retention_period = Interval('PT1H'))"
    )
    _write_hourly(session, clock, 8, partitions=1)
    assert _consume(session, "fast", 0, 6) == [f"p0m{i}" for i in range(6)]
    assert _consume(session, "slow", 0, 2) == ["p0m0", "p0m1"]
    db.run_retention()
    assert _starts(session) == {0: 2}  # slow's committed offset, not fast's
    assert _remaining(session, "slow", 0) == [f"p0m{i}" for i in range(2, 8)]


def test_an_important_consumer_that_never_committed_keeps_everything(clocked):
    db, session, clock = clocked
    session.execute(
        "CREATE TOPIC t (CONSUMER reader WITH (important = true), "
        "CONSUMER late WITH (important = true)) WITH (retention_period = Interval('PT1H'))"
    )
    _write_hourly(session, clock, 6, partitions=1)
    _consume(session, "reader", 0, 6)
    assert db.run_retention().segments_deleted == 0
    assert _starts(session) == {0: 0}
    assert _remaining(session, "late", 0) == [f"p0m{i}" for i in range(6)]


def test_the_slowest_important_consumer_is_found_per_partition(clocked):
    """Three important consumers; on each partition another one is the slowest."""
    db, session, clock = clocked
    session.execute(
        "CREATE TOPIC t (CONSUMER a WITH (important = true), CONSUMER b WITH (important = "
        "true), CONSUMER c WITH (important = true), CONSUMER casual) "
        "WITH (retention_period = Interval('PT1H'), min_active_partitions = 3)"
    )
    _write_hourly(session, clock, 8, partitions=3)
    committed = {"a": (1, 5, 6), "b": (6, 2, 5), "c": (5, 6, 3)}  # per partition
    for consumer, offsets in committed.items():
        for partition, count in enumerate(offsets):
            _consume(session, consumer, partition, count)
    _consume(session, "casual", 0, 8)  # not important: protects nothing
    db.run_retention()
    assert _starts(session) == {0: 1, 1: 2, 2: 3}
    assert _remaining(session, "a", 0) == [f"p0m{i}" for i in range(1, 8)]
    assert _remaining(session, "b", 1) == [f"p1m{i}" for i in range(2, 8)]
    assert _remaining(session, "c", 2) == [f"p2m{i}" for i in range(3, 8)]
