"""A transaction's keyless share is routed as one partition (``TopicLog.keyless_target``,
round 19): no per-message array; keyed shares still go through ``TopicLog.route``."""

from __future__ import annotations

from typing import Any

import pytest

from engine.database import Database
from engine.session import Session
from storage.topic_log import TopicLog


def _spy_route(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    routed: list[int] = []
    real = TopicLog.route

    def spy(self: TopicLog, batch: Any) -> Any:
        routed.append(batch.num_rows)
        return real(self, batch)

    monkeypatch.setattr(TopicLog, "route", spy)
    return routed


def _partitions_holding(session: Session, topic: str) -> dict[int, int]:
    rows = session.execute(f"SELECT partition, count(*) AS n FROM TOPIC {topic} GROUP BY 1")
    table = rows[-1].table
    return dict(zip(table.column("partition").to_pylist(), table.column("n").to_pylist(),
                    strict=True))  # fmt: skip


def test_a_keyless_share_is_routed_without_route_and_lands_whole_in_one_partition(
    database: Database, session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    session.execute(
        "CREATE TOPIC a (CONSUMER mover) WITH (min_active_partitions = 3); "
        "CREATE TOPIC b WITH (min_active_partitions = 3)"
    )
    session.execute("INSERT INTO TOPIC a (data) SELECT 'm' || range::VARCHAR FROM range(50)")
    routed = _spy_route(monkeypatch)
    for _ in range(3):  # keyless shares of a move and of literal values, round-robin
        session.execute("BEGIN")
        session.execute("INSERT INTO TOPIC b (data) VALUES ('x'), ('y'), ('z')")
        session.execute("COMMIT")
    session.execute("BEGIN")
    moved = session.execute(
        "INSERT INTO TOPIC b (data) SELECT data FROM TOPIC a WITH (consumer = 'mover')"
    )[-1].tag
    session.execute("COMMIT")
    assert routed == []  # main routed each share with ``route`` (a per-message array)
    held = _partitions_holding(session, "b")
    assert sum(held.values()) == 9 + int(moved.split()[-1])
    assert sorted(held)[:3] == [0, 1, 2] and all(n >= 3 for n in held.values())


def test_a_keyed_share_still_goes_through_route(
    session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    session.execute("CREATE TOPIC k WITH (min_active_partitions = 4)")
    routed = _spy_route(monkeypatch)
    session.execute("BEGIN")
    session.execute(
        "INSERT INTO TOPIC k (data, producer_id, seq_no) VALUES "
        "('a', 'p1', 1), ('b', 'p2', 1), ('c', 'p1', 2), ('d', 'p3', 1)"
    )
    session.execute("COMMIT")
    assert routed == [4]
    table = session.execute("SELECT producer_id, partition FROM TOPIC k")[-1].table
    placed: dict[str, set[int]] = {}
    for producer, partition in zip(table.column("producer_id").to_pylist(),
                                   table.column("partition").to_pylist(), strict=True):  # fmt: skip
        placed.setdefault(producer, set()).add(partition)
    assert sorted(placed) == ["p1", "p2", "p3"]
    assert all(len(partitions) == 1 for partitions in placed.values())
