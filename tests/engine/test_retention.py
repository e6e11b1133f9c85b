"""Retention run by the engine: time-based deletion guarded by important consumers."""

from __future__ import annotations

import time

import pytest

from engine.clock import ManualClock
from engine.database import Database
from engine.ddl import SEGMENT_MS_MIN, segment_ms_for
from storage import limits
from tests.engine.conftest import rows

START_US = 1_700_000_000_000_000
HOUR_S = 3600


def _partition(session) -> dict:
    (row,) = rows(session, "SELECT start_offset, end_offset FROM sys.partitions WHERE topic = 't'")
    return row


def _write_hourly(session, clock: ManualClock, hours: int) -> None:
    """One message per hour for ``hours`` hours: segments roll by age (15 min at PT1H)."""
    for hour in range(hours):
        session.execute(f"INSERT INTO TOPIC t (data) VALUES ('m{hour}')")
        clock.advance(seconds=HOUR_S)


@pytest.fixture
def clocked(tmp_path):
    clock = ManualClock(START_US)
    db = Database.open(str(tmp_path / "data"), clock=clock, retention_interval_s=None)
    session = db.connect()
    yield db, session, clock
    session.close()
    db.close()


def test_segment_age_follows_retention():
    assert segment_ms_for(None) == limits.SEGMENT_MS_DEFAULT
    assert segment_ms_for(4 * HOUR_S * 1000) == HOUR_S * 1000
    assert segment_ms_for(1000) == SEGMENT_MS_MIN
    assert segment_ms_for(10**12) == limits.SEGMENT_MS_DEFAULT


def test_expired_segments_go_and_reads_start_at_the_new_log_start(clocked):
    db, session, clock = clocked
    session.execute("CREATE TOPIC t (CONSUMER c) WITH (retention_period = Interval('PT1H'))")
    _write_hourly(session, clock, 6)
    assert _partition(session) == {"start_offset": 0, "end_offset": 6}
    report = db.run_retention()
    assert report.segments_deleted == 5 and report.bytes_deleted > 0
    # The active segment (the last message's) stays; everything older expired.
    assert _partition(session) == {"start_offset": 5, "end_offset": 6}
    peek = "SELECT CAST(data AS VARCHAR) AS d FROM TOPIC t WITH (partition = 0, from_offset = 0)"
    assert [r["d"] for r in rows(session, peek)] == ["m5"]
    # A consumer whose committed offset (0) fell below the log start reads from there.
    consume = "SELECT CAST(data AS VARCHAR) AS d FROM TOPIC t WITH (consumer = 'c')"
    assert [r["d"] for r in rows(session, consume)] == ["m5"]
    assert db.run_retention().segments_deleted == 0  # nothing more is due


def test_an_important_consumer_keeps_what_it_has_not_committed(clocked):
    db, session, clock = clocked
    session.execute(
        "CREATE TOPIC t (CONSUMER keeper WITH (important = true), CONSUMER casual) "
        "WITH (retention_period = Interval('PT1H'))"
    )
    _write_hourly(session, clock, 6)
    assert db.run_retention().segments_deleted == 0  # keeper has committed nothing
    got = rows(
        session,
        "SELECT CAST(data AS VARCHAR) AS d FROM TOPIC t WITH (consumer = 'keeper', "
        "max_messages = 3)",
    )
    assert [r["d"] for r in got] == ["m0", "m1", "m2"]
    db.run_retention()
    assert _partition(session)["start_offset"] == 3  # up to keeper's committed offset
    # keeper goes on from where it stopped: nothing it had not read was lost.
    got = rows(session, "SELECT CAST(data AS VARCHAR) AS d FROM TOPIC t WITH (consumer = 'keeper')")
    assert [r["d"] for r in got] == ["m3", "m4", "m5"]
    db.run_retention()
    assert _partition(session)["start_offset"] == 5


def test_a_consumer_made_important_later_still_protects_from_then_on(clocked):
    db, session, clock = clocked
    session.execute("CREATE TOPIC t (CONSUMER c) WITH (retention_period = Interval('PT1H'))")
    _write_hourly(session, clock, 3)
    session.execute("ALTER TOPIC t ALTER CONSUMER c SET (important = true)")
    _write_hourly(session, clock, 3)
    assert db.run_retention().segments_deleted == 0
    session.execute("ALTER TOPIC t ALTER CONSUMER c SET (important = false)")
    assert db.run_retention().segments_deleted == 5


def test_the_background_service_runs_passes_and_stops_with_the_database(tmp_path):
    clock = ManualClock(START_US)
    db = Database.open(str(tmp_path / "data"), clock=clock, retention_interval_s=0.02)
    session = db.connect()
    session.execute("CREATE TOPIC t WITH (retention_period = Interval('PT1H'))")
    _write_hourly(session, clock, 4)
    deadline = time.monotonic() + 30
    while _partition(session)["start_offset"] != 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _partition(session) == {"start_offset": 3, "end_offset": 4}
    service = db._retention
    assert service is not None and service.passes >= 1
    session.close()
    db.close()
    assert not service._thread.is_alive()
