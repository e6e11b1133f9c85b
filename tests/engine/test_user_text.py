"""Text users read carries no Python repr (``None``), in messages and in DESCRIBE TOPIC."""

from __future__ import annotations

import pytest

from engine.database import Database
from storage.errors import SerializationFailure


def test_describe_topic_shows_no_committed_offset_as_none(database: Database) -> None:
    session = database.connect()
    session.execute("CREATE TOPIC t (CONSUMER c)")
    result = session.execute("DESCRIBE TOPIC t")[0]
    assert result.table is not None
    offsets = [r["value"] for r in result.table.to_pylist() if r["section"] == "offset"]
    assert offsets and all(v.startswith("committed=none ") for v in offsets)
    assert not any("None" in str(v) for row in result.table.to_pylist() for v in row.values())
    session.close()


def test_conflict_message_says_nothing_committed_not_none(database: Database) -> None:
    first, second = database.connect(), database.connect()
    first.execute("CREATE TOPIC t (CONSUMER c)")
    first.execute("INSERT INTO TOPIC t (data) VALUES ('a'), ('b')")
    first.execute("BEGIN")
    first.execute("SELECT data FROM TOPIC t WITH (consumer = 'c')")
    second.execute("SELECT data FROM TOPIC t WITH (consumer = 'c', max_messages = 1)")
    with pytest.raises(SerializationFailure) as conflict:
        first.execute("COMMIT")
    assert "moved from nothing committed to 1" in conflict.value.message
    assert "None" not in conflict.value.message
    first.close()
    second.close()
