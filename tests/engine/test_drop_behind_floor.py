"""The committer gives each partition it publishes to a drop floor (``PartitionLog.drop_floor``)
at its first publish, refreshed by every checkpoint: a topic without consumers may drop
everything written back behind its writes (``storage.page_cache.drop_behind``), a topic
with consumers only below the lowest offset they committed. A bulk move's publishes then
give their pages back as they go, before any checkpoint (round 16, docs/bulk_commit.md).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from engine.commit import EVERY_OFFSET
from engine.database import Database
from storage import limits
from tests.page_cache_spy import record_drops

MESSAGE = b"y" * 1000


def _partition(database: Database, name: str):
    return database.topic_log(database.catalog.entry(name).topic_id).partition(0)


def _insert(session, topic: str, count: int) -> None:
    session.execute("BEGIN")
    session.execute(f"INSERT INTO TOPIC {topic} (data) SELECT unnest(?)", [[MESSAGE] * count])
    session.execute("COMMIT")


def test_floors_at_the_first_publish_and_at_each_checkpoint(tmp_path: Path) -> None:
    database = Database.open(str(tmp_path / "db"), retention_interval_s=None)
    try:
        session = database.connect()
        session.execute("CREATE TOPIC read (CONSUMER c1); CREATE TOPIC unread")
        assert _partition(database, "read").drop_floor is None  # nothing published yet
        _insert(session, "read", 100)
        _insert(session, "unread", 100)
        assert _partition(database, "unread").drop_floor == EVERY_OFFSET
        assert _partition(database, "read").drop_floor == 0  # c1 has read nothing
        session.execute("SELECT data FROM TOPIC read WITH (consumer = 'c1', max_messages = 30)")
        assert _partition(database, "read").drop_floor == 0  # a snapshot till the checkpoint
        database.committer.checkpoint()
        assert _partition(database, "read").drop_floor == 30
        assert _partition(database, "unread").drop_floor == EVERY_OFFSET
        session.close()
    finally:
        database.close()


def test_a_bulk_move_drops_behind_its_publishes_before_any_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    advised = record_drops(monkeypatch, 20_000)
    monkeypatch.setattr(limits, "DROP_BEHIND_KEEP_BYTES", 100_000)
    monkeypatch.setattr(limits, "DROP_BEHIND_STEP_BYTES", 50_000)
    monkeypatch.setattr(limits, "WRITEBACK_INTERVAL_BYTES", 64 * 1024)
    database = Database.open(str(tmp_path / "db"), retention_interval_s=None)
    try:
        session = database.connect()
        session.execute("CREATE TOPIC a (CONSUMER mover); CREATE TOPIC b")
        _insert(session, "a", 3000)
        for _ in range(3):
            session.execute("BEGIN")
            session.execute(
                "INSERT INTO TOPIC b (data) SELECT data FROM TOPIC a "
                "WITH (consumer = 'mover', max_messages = 1000)"
            )
            session.execute("COMMIT")
        assert database.committer.checkpoints == 0
        b_log = os.path.realpath(_partition(database, "b")._segments[-1].log_path)
        a_log = os.path.realpath(_partition(database, "a")._segments[-1].log_path)
        ranges = [(start, end) for path, start, end in advised if path == b_log]
        assert ranges and ranges[0][0] == 0
        segment = _partition(database, "b")._segments[-1]
        assert ranges[-1][1] <= segment.written_back_bytes - 100_000
        assert not [call for call in advised if call[0] == a_log]  # not consumed at first
        rows = session.execute("SELECT count(*) FROM TOPIC b WITH (from_offset = 0)")[-1]
        assert rows.table.column(0).to_pylist() == [3000]
        session.close()
    finally:
        database.close()
