"""Splits under real concurrency: producer threads write with seq_nos (and resend
batches) at a rising rate into a topic that splits as they go; a consumer reads with
commits, and a transactional mover copies into a second splitting topic. Afterwards
every message is in each topic exactly once, and every reader saw each producer's
messages in order (parent before children)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from engine.database import Database
from engine.session import Session

PRODUCERS = 4
BATCHES = 40
BATCH = 5
TOTAL = PRODUCERS * BATCHES * BATCH
PAYLOAD = "v" * 400
SPLITTING = (
    "WITH (auto_partitioning_strategy = 'scale_up', max_active_partitions = 6, "
    "auto_partitioning_up_utilization_percent = 20, "
    "auto_partitioning_stabilization_window = Interval('PT1S'), "
    "partition_write_speed_bytes_per_second = 20000)"
)


@pytest.fixture
def database(tmp_path) -> Iterator[Database]:
    db = Database.open(str(tmp_path / "data"), retention_interval_s=None)
    yield db
    db.close()


def _produce(database: Database, producer: str, errors: list[BaseException]) -> None:
    session = database.connect()
    try:
        for number in range(BATCHES):
            first = number * BATCH + 1
            values = ", ".join(
                f"('{producer}:{seq}:{PAYLOAD}', '{producer}', {seq})"
                for seq in range(first, first + BATCH)
            )
            insert = f"INSERT INTO TOPIC src (data, producer_id, seq_no) VALUES {values}"
            session.execute(insert)
            if number % 7 == 3:  # a resend: every message is a duplicate
                result = session.execute(insert + " RETURNING status")[-1]
                assert result.table is not None
                assert set(result.table.column("status").to_pylist()) == {"duplicate"}
            time.sleep(max(0.0, 0.05 - number * 0.0015))  # a rising rate
    except BaseException as error:
        errors.append(error)
    finally:
        session.close()


def _read_all(session: Session, topic: str, consumer: str, want: int, move: bool = False):
    """Poll (each poll its own transaction) until ``want`` messages came; returns them."""
    got: list[tuple[str, int]] = []
    for _ in range(4000):
        if len(got) >= want:
            break
        session.execute("BEGIN")
        query = (f"SELECT producer_id, seq_no, data FROM TOPIC {topic} "
                 f"WITH (consumer = '{consumer}', max_messages = 37)")  # fmt: skip
        table = session.execute(query)[-1].table
        assert table is not None
        rows = table.to_pylist()
        if move and rows:
            values = ", ".join(
                f"('{r['data'].decode()}', '{r['producer_id']}', {r['seq_no']})" for r in rows
            )
            session.execute(f"INSERT INTO TOPIC dst (data, producer_id, seq_no) VALUES {values}")
        session.execute("COMMIT")
        got += [(r["producer_id"], r["seq_no"]) for r in rows]
        if not rows:
            time.sleep(0.02)
    return got


def _check_exactly_once_in_order(got: list[tuple[str, int]]) -> None:
    by_producer: dict[str, list[int]] = {}
    for producer, seq_no in got:
        by_producer.setdefault(producer, []).append(seq_no)
    assert sorted(by_producer) == [f"p{i}" for i in range(PRODUCERS)]
    for producer, seq_nos in by_producer.items():
        assert seq_nos == list(range(1, BATCHES * BATCH + 1)), producer


def test_producers_consumers_and_a_mover_while_topics_split(database: Database) -> None:
    setup = database.connect()
    setup.execute(f"CREATE TOPIC src (CONSUMER reader, CONSUMER mover) {SPLITTING}")
    setup.execute(f"CREATE TOPIC dst (CONSUMER checker) {SPLITTING}")
    errors: list[BaseException] = []
    results: dict[str, list[tuple[str, int]]] = {}

    def consume(name: str, topic: str, consumer: str, move: bool = False) -> None:
        session = database.connect()
        try:
            if not move:
                time.sleep(2.0)  # lag behind: unread data in parents and children at once
            results[name] = _read_all(session, topic, consumer, TOTAL, move)
        except BaseException as error:
            errors.append(error)
        finally:
            session.close()

    threads = [
        threading.Thread(target=_produce, args=(database, f"p{i}", errors))
        for i in range(PRODUCERS)
    ]
    threads.append(threading.Thread(target=consume, args=("reader", "src", "reader")))
    threads.append(threading.Thread(target=consume, args=("mover", "src", "mover", True)))
    threads.append(threading.Thread(target=consume, args=("checker", "dst", "checker")))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert not errors, errors
    for name in ("reader", "mover", "checker"):
        _check_exactly_once_in_order(results[name])
    for topic in ("src", "dst"):
        log = database.topic_log(database.catalog.entry(topic).topic_id)
        assert log.splits >= 1, topic  # splits happened while all this ran
        stored = sum(log.partition(p).end_offset for p in log.partition_ids())
        assert stored == TOTAL, topic  # exactly once: no resend and no move written twice
    setup.close()
