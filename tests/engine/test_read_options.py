"""Read options that skip old messages (read_from, max_lag) and peeks from an offset."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from engine.clock import ManualClock
from engine.database import Database
from storage.errors import UndefinedObjectError
from tests.engine.conftest import rows

START_US = 1_700_000_000_000_000  # 2023-11-14T22:13:20Z


@pytest.fixture
def clocked(tmp_path):
    clock = ManualClock(START_US)
    db = Database.open(str(tmp_path / "data"), clock=clock)
    session = db.connect()
    session.execute("CREATE TOPIC t (CONSUMER c, CONSUMER late WITH (read_from = 1700003600))")
    session.execute("INSERT INTO TOPIC t (data) VALUES ('old1'), ('old2')")
    clock.advance(seconds=7200)
    session.execute("INSERT INTO TOPIC t (data) VALUES ('new1')")
    yield session, clock
    session.close()
    db.close()


def _data(session, sql):
    return [r["d"] for r in rows(session, sql)]


def test_read_from_timestamp_skips_older_messages(clocked):
    session, _ = clocked
    stamp = datetime.fromtimestamp(START_US / 1e6 + 3600, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    sql = (
        "SELECT CAST(data AS VARCHAR) AS d FROM TOPIC t "
        f"WITH (consumer = 'c', read_from = Timestamp('{stamp}'))"
    )
    assert _data(session, sql) == ["new1"]


def test_max_lag_skips_messages_older_than_the_lag(clocked):
    session, clock = clocked
    clock.advance(seconds=60)
    sql = (
        "SELECT CAST(data AS VARCHAR) AS d FROM TOPIC t "
        "WITH (consumer = 'c', max_lag = Interval('PT10M'))"
    )
    assert _data(session, sql) == ["new1"]


def test_consumer_read_from_setting_applies_to_its_reads(clocked):
    session, _ = clocked
    assert _data(
        session, "SELECT CAST(data AS VARCHAR) AS d FROM TOPIC t WITH (consumer='late')"
    ) == ["new1"]
    assert _data(session, "SELECT CAST(data AS VARCHAR) AS d FROM TOPIC t WITH (consumer='c')") == [
        "old1",
        "old2",
        "new1",
    ]


def test_skipped_messages_count_as_consumed(clocked):
    session, _ = clocked
    session.execute("SELECT * FROM TOPIC t WITH (consumer = 'late')")
    committed = rows(session, "SELECT committed_offset FROM sys.consumers WHERE consumer = 'late'")
    assert committed == [{"committed_offset": 3}]


def test_peek_from_offset_commits_nothing(clocked):
    session, _ = clocked
    sql = "SELECT CAST(data AS VARCHAR) AS d FROM TOPIC t WITH (partition = 0, from_offset = 1)"
    assert _data(session, sql) == ["old2", "new1"]
    assert rows(session, "SELECT * FROM sys.consumers WHERE committed_offset IS NOT NULL") == []


def test_consumer_and_partition_given_as_parameters(tmp_path):
    db = Database.open(str(tmp_path / "params"))
    session = db.connect()
    try:
        session.execute("CREATE TOPIC p (CONSUMER c) WITH (min_active_partitions = 2)")
        session.execute("INSERT INTO TOPIC p (data, partition) VALUES ('a', 0), ('b', 1)")
        read = "SELECT CAST(data AS VARCHAR) AS d FROM TOPIC p WITH (consumer = $1, partition = $2)"
        assert [r["d"] for r in rows(session, read, ["c", 1])] == ["b"]
        assert [r["d"] for r in rows(session, read, ["c", 1])] == []  # committed for c
        assert [r["d"] for r in rows(session, read, ["c", 0])] == ["a"]
        with pytest.raises(UndefinedObjectError, match='consumer "nobody" does not exist'):
            session.execute(read, ["nobody", 0])
        with pytest.raises(UndefinedObjectError, match="has no partition 7"):
            session.execute(read, ["c", 7])
    finally:
        session.close()
        db.close()
