"""A consumer poll over many partitions (round 34): the committed offsets are one snapshot
taken without copying (``CatalogStore.committed_offsets``), and a poll's first read
records a range only for the partitions it read or found moved past their committed offset
(``engine.reads._record_ranges``), as the general path does; a commit replaces only its
consumers' offset maps."""

from __future__ import annotations

import pytest

from engine.database import Database
from tests.engine.conftest import rows


def _fill(session, partition: int, count: int) -> None:
    session.execute(
        f"INSERT INTO TOPIC t (data, partition) SELECT 'm' || i::VARCHAR, {partition} "
        f"FROM range({count}) r(i)"
    )


def _topic_id(database: Database) -> str:
    entry = database.catalog.entry("t")
    assert entry is not None
    return entry.topic_id


def test_a_snapshot_of_committed_offsets_stays_as_taken(database: Database, session) -> None:
    session.execute("CREATE TOPIC t (CONSUMER c, CONSUMER d) WITH (min_active_partitions = 3)")
    _fill(session, 1, 5)
    topic_id = _topic_id(database)
    before = database.catalog.committed_offsets(topic_id, "c")
    assert dict(before) == {}
    other = database.catalog.committed_offsets(topic_id, "d")
    assert len(rows(session, "SELECT data FROM TOPIC t WITH (consumer = 'c')")) == 5
    assert dict(before) == {}  # taken before the commit: unchanged by it
    assert dict(database.catalog.committed_offsets(topic_id, "c")) == {1: 5}
    assert database.catalog.committed(topic_id, "c", 1) == 5
    assert database.catalog.committed(topic_id, "c", 0) is None
    assert dict(other) == {} and dict(database.catalog.committed_offsets(topic_id, "d")) == {}
    with pytest.raises(TypeError):  # read-only: no caller can change the catalog's map
        before[0] = 1  # type: ignore[index]


def test_a_poll_over_many_partitions_records_only_those_it_read(database: Database,
                                                               session) -> None:  # fmt: skip
    session.execute("CREATE TOPIC t (CONSUMER c) WITH (min_active_partitions = 200)")
    for partition in (3, 77, 150):
        _fill(session, partition, 2)
    session.execute("BEGIN")
    got = rows(session, "SELECT partition FROM TOPIC t WITH (consumer = 'c', max_messages = 4)")
    assert len(got) == 4
    transaction = session.transaction
    assert transaction is not None
    recorded = {key[2]: (r.start, r.end) for key, r in transaction.reads.items()}
    read = sorted({r["partition"] for r in got})
    assert sorted(recorded) == read and all(recorded[p] == (0, 2) for p in read)
    # A second read in the same transaction takes the general path: it continues.
    rest = rows(session, "SELECT partition FROM TOPIC t WITH (consumer = 'c')")
    assert sorted(r["partition"] for r in got + rest) == [3, 3, 77, 77, 150, 150]
    session.execute("COMMIT")
    topic_id = _topic_id(database)
    assert dict(database.catalog.committed_offsets(topic_id, "c")) == {3: 2, 77: 2, 150: 2}
    assert rows(session, "SELECT data FROM TOPIC t WITH (consumer = 'c')") == []
