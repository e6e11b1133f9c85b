"""Retention run by the engine: time-based deletion guarded by important consumers."""

from __future__ import annotations

import time

import pytest

from engine.clock import ManualClock
from engine.database import Database
from engine.ddl import SEGMENT_MS_MIN, segment_ms_for
from engine.retention import RETENTION_INTERVAL_MIN_S, pass_interval_s
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


# -- idle topics, the log start, availability_period, inactive partitions ----------------------
def _consumers(session, consumer: str) -> list[dict]:
    return rows(
        session,
        "SELECT partition, committed_offset, end_offset, lag_messages FROM sys.consumers "
        f"WHERE topic = 't' AND consumer = '{consumer}' ORDER BY partition",
    )


def _peek(session) -> list[str]:
    sql = "SELECT CAST(data AS VARCHAR) AS d FROM TOPIC t WITH (partition = 0, from_offset = 0)"
    return [r["d"] for r in rows(session, sql)]


def _consume(session, consumer: str, limit: int = 100) -> list[str]:
    sql = (
        "SELECT CAST(data AS VARCHAR) AS d FROM TOPIC t "
        f"WITH (consumer = '{consumer}', max_messages = {limit})"
    )
    return [r["d"] for r in rows(session, sql)]


def test_an_idle_topic_empties_once_its_last_message_expires(clocked):
    db, session, clock = clocked
    session.execute("CREATE TOPIC t (CONSUMER c) WITH (retention_period = Interval('PT1H'))")
    session.execute("INSERT INTO TOPIC t (data) VALUES ('a'), ('b')")
    clock.advance(seconds=HOUR_S)  # exactly one period old: not yet expired
    assert db.run_retention().segments_deleted == 0
    assert _peek(session) == ["a", "b"]
    clock.advance(microseconds=1)
    assert db.run_retention().segments_deleted == 1
    assert _partition(session) == {"start_offset": 2, "end_offset": 2}
    assert _peek(session) == []
    # The consumer (committed nothing) lags by nothing: the lag counts from the log start.
    assert _consumers(session, "c") == [
        {"partition": 0, "committed_offset": None, "end_offset": 2, "lag_messages": 0}
    ]
    assert _consume(session, "c") == []
    assert _consumers(session, "c")[0]["committed_offset"] == 2  # skipped to the log start
    session.execute("INSERT INTO TOPIC t (data) VALUES ('c')")
    assert _consume(session, "c") == ["c"]


def test_an_idle_topic_empties_after_a_restart_too(tmp_path):
    clock = ManualClock(START_US)
    path = str(tmp_path / "data")
    db = Database.open(path, clock=clock, retention_interval_s=None)
    session = db.connect()
    session.execute("CREATE TOPIC t WITH (retention_period = Interval('PT1H'))")
    session.execute("INSERT INTO TOPIC t (data) VALUES ('a')")
    session.close()
    db.close()
    clock.advance(seconds=2 * HOUR_S)
    db = Database.open(path, clock=clock, retention_interval_s=None)
    session = db.connect()
    try:
        db.run_retention()
        assert _partition(session) == {"start_offset": 1, "end_offset": 1}
    finally:
        session.close()
        db.close()


def test_an_important_consumer_holds_an_idle_topic_until_it_commits(clocked):
    db, session, clock = clocked
    session.execute(
        "CREATE TOPIC t (CONSUMER keeper WITH (important = true)) "
        "WITH (retention_period = Interval('PT1H'))"
    )
    session.execute("INSERT INTO TOPIC t (data) VALUES ('a'), ('b'), ('c')")
    clock.advance(seconds=5 * HOUR_S)
    assert db.run_retention().segments_deleted == 0
    assert _consume(session, "keeper", limit=2) == ["a", "b"]
    # 'c' is not committed: the segment holding it stays whole.
    assert db.run_retention().segments_deleted == 0
    assert _peek(session) == ["a", "b", "c"]
    assert _consume(session, "keeper") == ["c"]
    assert db.run_retention().segments_deleted == 1
    assert _partition(session) == {"start_offset": 3, "end_offset": 3}


def test_a_consumer_below_the_log_start_continues_from_it(clocked):
    db, session, clock = clocked
    session.execute("CREATE TOPIC t (CONSUMER c) WITH (retention_period = Interval('PT1H'))")
    _write_hourly(session, clock, 2)  # m0, m1 an hour apart: two segments
    assert _consume(session, "c", limit=1) == ["m0"]
    session.execute("INSERT INTO TOPIC t (data) VALUES ('m2'), ('m3')")
    clock.advance(seconds=HOUR_S / 2)
    db.run_retention()  # m0 and m1 expired; m2, m3 are half an hour old
    assert _partition(session) == {"start_offset": 2, "end_offset": 4}
    # committed 1 < log start 2: the lag counts from the log start, reads go on from it.
    assert _consumers(session, "c") == [
        {"partition": 0, "committed_offset": 1, "end_offset": 4, "lag_messages": 2}
    ]
    assert _consume(session, "c", limit=1) == ["m2"]
    assert _consumers(session, "c")[0]["committed_offset"] == 3
    assert _consume(session, "c") == ["m3"]


def test_availability_period_holds_back_what_the_consumer_has_not_committed(clocked):
    """YDB: availability_period extends retention, for the messages the consumer has not
    committed, up to that period; a bounded form of important."""
    db, session, clock = clocked
    session.execute(
        "CREATE TOPIC t (CONSUMER slow WITH (availability_period = Interval('PT3H')), "
        "CONSUMER other) WITH (retention_period = Interval('PT1H'))"
    )
    _write_hourly(session, clock, 6)  # m0..m5, one segment each; now m5 is 1 h old
    db.run_retention()
    # Without slow the log would start at 5; slow keeps what is younger than 3 h.
    assert _partition(session)["start_offset"] == 3
    assert _consume(session, "slow", limit=1) == ["m3"]
    db.run_retention()
    assert _partition(session)["start_offset"] == 4  # committed messages are not held
    clock.advance(seconds=3 * HOUR_S)  # the period is over for every message
    db.run_retention()
    assert _partition(session) == {"start_offset": 6, "end_offset": 6}


def test_availability_period_keeps_an_idle_topic_until_it_commits_or_the_period_ends(clocked):
    db, session, clock = clocked
    session.execute(
        "CREATE TOPIC t (CONSUMER slow WITH (availability_period = Interval('PT5H'))) "
        "WITH (retention_period = Interval('PT1H'))"
    )
    session.execute("INSERT INTO TOPIC t (data) VALUES ('a'), ('b')")
    clock.advance(seconds=2 * HOUR_S)
    assert db.run_retention().segments_deleted == 0
    assert _peek(session) == ["a", "b"]
    assert _consume(session, "slow") == ["a", "b"]
    assert db.run_retention().segments_deleted == 1  # committed: retention applies again
    session.execute("INSERT INTO TOPIC t (data) VALUES ('c')")
    clock.advance(seconds=5 * HOUR_S)
    assert db.run_retention().segments_deleted == 0, "exactly 5 h old: still available"
    clock.advance(seconds=1)
    assert db.run_retention().segments_deleted == 1
    assert _partition(session) == {"start_offset": 3, "end_offset": 3}


def _split(db, partition: int, child: int) -> None:
    """Make ``partition`` inactive with ``child`` as its child (as a split does)."""
    db.topic_log(db.catalog.entry("t").topic_id).mark_inactive(partition, (child,))


def test_an_inactive_partition_whose_data_expired_is_removed_and_leaves_the_views(clocked):
    db, session, clock = clocked
    session.execute(
        "CREATE TOPIC t (CONSUMER c) "
        "WITH (retention_period = Interval('PT1H'), min_active_partitions = 2)"
    )
    session.execute("INSERT INTO TOPIC t (data) VALUES ('a'), ('b')")
    _split(db, 0, 1)
    listed = "SELECT partition, active, parent FROM sys.partitions WHERE topic = 't'"
    assert rows(session, listed + " ORDER BY partition") == [
        {"partition": 0, "active": False, "parent": None},
        {"partition": 1, "active": True, "parent": 0},
    ]
    assert db.run_retention().partitions_removed == 0  # its data has not expired
    clock.advance(seconds=2 * HOUR_S)
    assert db.run_retention().partitions_removed == 1
    assert [r["partition"] for r in rows(session, listed)] == [1]
    assert [r["partition"] for r in _consumers(session, "c")] == [1]
    (topic,) = rows(session, "SELECT partitions, active_partitions FROM sys.topics")
    assert topic == {"partitions": 1, "active_partitions": 1}
    session.execute("INSERT INTO TOPIC t (data) VALUES ('later')")
    assert _consume(session, "c") == ["later"]


def test_an_inactive_partition_an_important_consumer_needs_stays_until_it_commits(clocked):
    db, session, clock = clocked
    session.execute(
        "CREATE TOPIC t (CONSUMER keeper WITH (important = true)) "
        "WITH (retention_period = Interval('PT1H'), min_active_partitions = 2)"
    )
    session.execute("INSERT INTO TOPIC t (data) VALUES ('a'), ('b')")
    _split(db, 0, 1)
    clock.advance(seconds=2 * HOUR_S)
    assert db.run_retention().partitions_removed == 0
    assert sorted(_consume(session, "keeper")) == ["a", "b"]
    assert db.run_retention().partitions_removed == 1
    assert [r["partition"] for r in _consumers(session, "keeper")] == [1]


def test_the_pass_interval_follows_the_shortest_retention_period(clocked):
    db, session, _ = clocked
    assert pass_interval_s(db, 60.0) == 60.0  # no topic
    session.execute("CREATE TOPIC slow WITH (retention_period = Interval('P1D'))")
    assert pass_interval_s(db, 60.0) == 60.0
    session.execute("CREATE TOPIC mid WITH (retention_period = Interval('PT20S'))")
    assert pass_interval_s(db, 60.0) == 5.0
    session.execute("CREATE TOPIC fast WITH (retention_period = Interval('PT1S'))")
    assert pass_interval_s(db, 60.0) == RETENTION_INTERVAL_MIN_S == 1.0
    assert pass_interval_s(db, 0.02) == 0.02  # a shorter ceiling wins (tests)
    session.execute("DROP TOPIC fast")
    assert pass_interval_s(db, 60.0) == 5.0


def test_a_one_second_retention_empties_an_idle_topic_within_seconds(tmp_path):
    """Real time, the default service (a minute between passes for long retention)."""
    db = Database.open(str(tmp_path / "data"))
    session = db.connect()
    try:
        session.execute("CREATE TOPIC t WITH (retention_period = Interval('PT1S'))")
        written = time.monotonic()  # before the write: written_at is no earlier
        session.execute("INSERT INTO TOPIC t (data) VALUES ('a'), ('b')")
        deadline = written + 20
        while _partition(session)["start_offset"] != 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        emptied = time.monotonic() - written
        assert _partition(session) == {"start_offset": 2, "end_offset": 2}
        assert 1.0 <= emptied < 5.0, emptied  # never early; within a pass or two
    finally:
        session.close()
        db.close()
