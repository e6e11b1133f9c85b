"""Reads of partitions written by many small statements (issue 14, Scale).

Each storage read becomes one batch, however many frames it spans, and a read's small
batches become one batch of the topic relation (``relation_batch`` once, the partition
column repeated per batch): the per-batch work is paid once per read, not once per
frame or per partition. The rows are the same, in the same order; large batches are
built one by one (no copy).
"""

from __future__ import annotations

from typing import Any

import pytest

from engine import reads
from tests.engine.conftest import rows


def test_one_relation_batch_per_read_of_small_batches(
    session: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    session.execute("CREATE TOPIC t (CONSUMER c) WITH (min_active_partitions = 2)")
    for index in range(20):  # 20 statements: 20 frames in each partition
        session.execute(
            f"INSERT INTO TOPIC t (data, partition) VALUES ('a{index}', 0), ('b{index}', 1)"
        )
    built = []
    original = reads.relation_batch

    def counted(partition: int, batch: Any, **options: Any) -> Any:
        built.append((partition, batch.num_rows))
        return original(partition, batch, **options)

    monkeypatch.setattr(reads, "relation_batch", counted)
    found = rows(session, "SELECT partition, data FROM TOPIC t WITH (consumer = 'c')")
    assert built == [(0, 40)]  # both partitions' reads, 20 frames each, in one
    for partition, letter in ((0, b"a"), (1, b"b")):
        data = [bytes(r["data"]) for r in found if r["partition"] == partition]
        assert data == [letter + str(i).encode() for i in range(20)]
    again = rows(session, "SELECT data FROM TOPIC t WITH (consumer = 'c')")
    assert again == []  # the offsets moved past all 40


def test_a_bounded_read_stops_inside_the_frames(session: Any) -> None:
    session.execute("CREATE TOPIC t (CONSUMER c) WITH (min_active_partitions = 1)")
    for index in range(10):
        session.execute(f"INSERT INTO TOPIC t (data) VALUES ('m{index}')")
    read = "SELECT offset, data FROM TOPIC t WITH (consumer = 'c', max_messages = 4)"
    seen = []
    for _ in range(3):
        seen += [(r["offset"], bytes(r["data"])) for r in rows(session, read)]
    assert seen == [(i, f"m{i}".encode()) for i in range(10)]


def test_large_batches_are_built_one_by_one(session: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    session.execute("CREATE TOPIC t (CONSUMER c) WITH (min_active_partitions = 2)")
    for partition in (0, 1):
        session.execute(
            f"INSERT INTO TOPIC t (data, partition) "
            f"SELECT 'm' || i::VARCHAR, {partition} FROM range(100) r(i)"
        )
    built = []
    original = reads.relation_batch

    def counted(partition: int, batch: Any, **options: Any) -> Any:
        built.append((partition, batch.num_rows))
        return original(partition, batch, **options)

    monkeypatch.setattr(reads, "relation_batch", counted)
    found = rows(session, "SELECT partition, offset FROM TOPIC t WITH (consumer = 'c')")
    assert sorted(built) == [(0, 100), (1, 100)]
    assert sorted((r["partition"], r["offset"]) for r in found) == [
        (p, o) for p in (0, 1) for o in range(100)
    ]
