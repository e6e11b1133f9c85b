"""The checkpoint drops published, synced bytes from the page cache below its consumers'
floor (``Committer._consumed_floor``, ``storage.page_cache``, issue 14).

A topic no consumer reads is dropped but its kept tail (its appends then reuse those
pages: the bulk move's publish into fresh pages cost ~7x more CPU, docs/bulk_commit.md);
a topic with consumers keeps every byte at or above the lowest offset they committed,
which is what they read next. A move's source, made durable by a commit, is not dropped.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from engine.database import Database
from tests.page_cache_spy import record_drops

KEEP = 20_000
MESSAGE = b"x" * 1000


@pytest.fixture
def advised(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int, int]]:
    """Every DONTNEED as (file, start, end), with the drop on and a small kept tail."""
    return record_drops(monkeypatch, KEEP)


def _dropped_end(calls: list[tuple[str, int, int]], log_path: str) -> int:
    """End of the dropped prefix of one log file (0: nothing dropped)."""
    path = os.path.realpath(log_path)
    return max((end for p, _, end in calls if p == path), default=0)


def _insert(session, topic: str, count: int, rounds: int) -> None:
    for _ in range(rounds):  # explicit: published after a log commit, synced by a checkpoint
        session.execute("BEGIN")
        session.execute(f"INSERT INTO TOPIC {topic} (data) SELECT unnest(?)", [[MESSAGE] * count])
        session.execute("COMMIT")


def test_checkpoint_drops_below_the_consumers_floor(tmp_path: Path, advised) -> None:
    database = Database.open(str(tmp_path / "db"), retention_interval_s=None)
    try:
        session = database.connect()
        session.execute("CREATE TOPIC read (CONSUMER c1, CONSUMER c2); CREATE TOPIC unread")
        _insert(session, "read", 50, 8)
        _insert(session, "unread", 50, 8)
        # c1 committed 300 of 400 messages, c2 only 120: the floor is c2's 120.
        session.execute("SELECT data FROM TOPIC read WITH (consumer = 'c1', max_messages = 300)")
        session.execute("SELECT data FROM TOPIC read WITH (consumer = 'c2', max_messages = 120)")
        assert advised == []  # the commits' syncs and the reads drop nothing
        database.committer.checkpoint()
        read = database.topic_log(database.catalog.entry("read").topic_id).partition(0)
        unread = database.topic_log(database.catalog.entry("unread").topic_id).partition(0)
        (read_segment,) = read._segments
        (unread_segment,) = unread._segments
        floor_position = read_segment.offset_index.lookup(120)
        dropped = _dropped_end(advised, read_segment.log_path)
        assert 0 < dropped <= floor_position  # below c2's offset only
        # no consumer: everything synced but the kept tail
        assert _dropped_end(advised, unread_segment.log_path) == unread_segment.size_bytes - KEEP
        # c2 catches up: the next checkpoint drops on, still below the new floor
        session.execute("SELECT data FROM TOPIC read WITH (consumer = 'c2', max_messages = 200)")
        _insert(session, "read", 50, 1)
        database.committer.checkpoint()
        later = _dropped_end(advised, read_segment.log_path)
        assert floor_position <= later <= read_segment.offset_index.lookup(300)
        assert later > dropped
        # the data reads back whole after the drops
        rows = session.execute("SELECT count(*) FROM TOPIC read WITH (from_offset = 0)")[-1]
        assert rows.table.column(0).to_pylist() == [450]
        session.close()
    finally:
        database.close()


def test_a_moved_source_made_durable_is_not_dropped(tmp_path: Path, advised) -> None:
    """A move makes its source durable before the commit (``moved_refs.make_durable``):
    that sync drops nothing of the source, which the consumer reads on."""
    database = Database.open(str(tmp_path / "db"), retention_interval_s=None)
    try:
        session = database.connect()
        session.execute("CREATE TOPIC a (CONSUMER mover); CREATE TOPIC b")
        _insert(session, "a", 100, 4)  # published by log commits: not synced yet
        source = database.topic_log(database.catalog.entry("a").topic_id).partition(0)
        assert source.durable_end < source.end_offset == 400
        session.execute("BEGIN")
        session.execute("INSERT INTO TOPIC b (data) SELECT data FROM TOPIC a "
                        "WITH (consumer = 'mover', max_messages = 100)")  # fmt: skip
        session.execute("COMMIT")
        assert database.committer.moved_shares == 1
        assert source.durable_end == 400  # the move synced its source
        (segment,) = source._segments
        assert _dropped_end(advised, segment.log_path) == 0
        session.close()
    finally:
        database.close()


def test_checkpoint_drops_a_consumed_source_below_its_floor(tmp_path: Path, advised) -> None:
    """A topic the transactions only read (a move's source) is not synced by the
    checkpoint, which still drops what its consumer committed past
    (``PartitionLog.drop_consumed``): a filled-then-moved topic keeps a flat page-cache
    footprint. Nothing at or above the consumer's offset is dropped."""
    database = Database.open(str(tmp_path / "db"), retention_interval_s=None)
    try:
        session = database.connect()
        session.execute("CREATE TOPIC a (CONSUMER mover); CREATE TOPIC b")
        _insert(session, "a", 100, 4)
        database.committer.checkpoint()  # a synced; the mover is at 0: nothing dropped
        source = database.topic_log(database.catalog.entry("a").topic_id).partition(0)
        (segment,) = source._segments
        assert _dropped_end(advised, segment.log_path) == 0
        for _ in range(2):
            session.execute("BEGIN")
            session.execute("INSERT INTO TOPIC b (data) SELECT data FROM TOPIC a "
                            "WITH (consumer = 'mover', max_messages = 100)")  # fmt: skip
            session.execute("COMMIT")
        assert database.committer.moved_shares == 2
        database.committer.checkpoint()  # publishes to b only; a was read
        dropped = _dropped_end(advised, segment.log_path)
        assert 0 < dropped <= segment.offset_index.lookup(200)
        rows = session.execute("SELECT count(*) FROM TOPIC a WITH (from_offset = 0)")[-1]
        assert rows.table.column(0).to_pylist() == [400]
        session.close()
    finally:
        database.close()
