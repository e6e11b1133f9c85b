"""A read whose statement only takes stored columns (``SELECT data FROM TOPIC ...``) gets
just those, straight from the frames' wire batches (``engine.reads._stored_columns``),
and the same values as the whole relation gives."""

from __future__ import annotations

import pytest

from engine import reads
from engine.session import Session

from .conftest import rows

LARGE = 200  # messages per INSERT: one frame, larger than ``SMALL_SLICE_ROWS``


def _fill(session: Session, topic: str, frames: int, codec: str = "raw") -> list[bytes]:
    """``frames`` INSERTs of ``LARGE`` messages each; the messages in order."""
    sent = []
    for frame in range(frames):
        batch = [f"message {frame}-{i} ".encode() * (1 + i % 5) for i in range(LARGE)]
        values = ", ".join(f"(${i})" for i in range(1, LARGE + 1))
        session.execute(f"INSERT INTO TOPIC {topic} (data) VALUES {values} "
                        f"WITH (codec = '{codec}')", batch)  # fmt: skip
        sent += batch
    return sent


@pytest.fixture
def built(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The row counts of every whole relation batch built (``relation_batch``)."""
    counts: list[int] = []
    original = reads.relation_batch

    def spying(partition, batch, **options):
        counts.append(batch.num_rows)
        return original(partition, batch, **options)

    monkeypatch.setattr(reads, "relation_batch", spying)
    return counts


def test_a_consumer_read_of_data_builds_no_whole_relation(session: Session, built):
    session.execute("CREATE TOPIC t (CONSUMER c) WITH (min_active_partitions = 1)")
    assert rows(session, "SELECT data FROM TOPIC t WITH (consumer = 'c')") == []
    sent = _fill(session, "t", 3)
    got = []
    for _ in range(4):  # reads of 250: each stops inside a frame, the next starts there
        result = session.execute(
            "SELECT data FROM TOPIC t WITH (consumer = 'c', max_messages = 250)")[-1]
        assert result.table is not None and result.table.column_names == ["data"]
        got += result.table.column("data").to_pylist()
    assert got == sent
    assert built == []
    session.execute("INSERT INTO TOPIC t (data) VALUES ('a'), ('b')")  # small: as before
    assert rows(session, "SELECT data FROM TOPIC t WITH (consumer = 'c')") == [
        {"data": b"a"}, {"data": b"b"}]  # fmt: skip


def test_the_stored_columns_equal_the_whole_relations(session: Session, built):
    session.execute("CREATE TOPIC t (CONSUMER c, CONSUMER d) WITH (min_active_partitions = 1)")
    _fill(session, "t", 2)
    columns = "data AS payload, seq_no, producer_id, created_at, metadata"
    narrow = rows(session, f"SELECT {columns} FROM TOPIC t WITH (consumer = 'c')")
    assert built == []
    # ``offset`` among the columns: the whole relation, as before
    whole = rows(session, f'SELECT {columns}, "offset" FROM TOPIC t WITH (consumer = \'d\')')
    assert built
    assert narrow == [{k: v for k, v in row.items() if k != "offset"} for row in whole]
    assert len(narrow) == 2 * LARGE


def test_compressed_messages_come_decoded(session: Session, built):
    session.execute("CREATE TOPIC t (CONSUMER c) WITH (min_active_partitions = 1)")
    sent = _fill(session, "t", 2, codec="zstd")
    got = rows(session, "SELECT data FROM TOPIC t WITH (consumer = 'c')")
    assert [row["data"] for row in got] == sent
    assert built == []
    raw = rows(session, "SELECT data FROM TOPIC t WITH (decode = false)")
    assert [row["data"] for row in raw] != sent  # still compressed: not decoded twice

