"""A read of a partition written by many small statements (issue 14, Scale).

Each storage read becomes one batch of the topic relation, however many frames it
spans: the per-batch work (the cut, progress, the relation's columns) is paid once
per partition read, not once per frame. The rows are the same, in offset order.
"""

from __future__ import annotations

from typing import Any

import pytest

from engine import reads
from tests.engine.conftest import rows


def test_one_relation_batch_per_storage_read(session: Any, monkeypatch: pytest.MonkeyPatch) -> None:
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
    assert sorted(built) == [(0, 20), (1, 20)]
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
