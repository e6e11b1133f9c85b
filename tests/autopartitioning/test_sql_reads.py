"""Autopartitioning through SQL: the settings, the refusal to disable, and the read
order across a split (a consumer, and members with leases, read a parent to its end
before any of its children; peeks keep each producer's order)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from engine.database import Database
from engine.session import Session
from storage import errors
from storage.clock import ManualClock

TOPIC = (
    "CREATE TOPIC ev (CONSUMER c) WITH (auto_partitioning_strategy = 'paused', "
    "partition_write_speed_bytes_per_second = 100000000)"
)


@pytest.fixture
def database(tmp_path) -> Iterator[Database]:
    db = Database.open(str(tmp_path / "data"), retention_interval_s=None)
    yield db
    db.close()


@pytest.fixture
def session(database: Database) -> Iterator[Session]:
    s = database.connect()
    yield s
    s.close()


def rows(session: Session, sql: str) -> list[dict]:
    result = session.execute(sql)[-1]
    assert result.table is not None, result.tag
    return result.table.to_pylist()


def _write(session: Session, producer: str, first: int, count: int) -> None:
    values = ", ".join(
        f"('{producer}:{n}', '{producer}', {n})" for n in range(first, first + count)
    )
    session.execute(f"INSERT INTO TOPIC ev (data, producer_id, seq_no) VALUES {values}")


def _split(database: Database, partition: int) -> tuple[int, int]:
    topic = database.topic_log(database.catalog.entry("ev").topic_id)
    children = topic.split(partition, force=True)
    assert children is not None
    return children


def _poll(session: Session, extra: str = "") -> list[tuple[int, str]]:
    session.execute("BEGIN")
    got = rows(session, f"SELECT partition, CAST(data AS VARCHAR) AS d FROM TOPIC ev "
                        f"WITH (consumer = 'c'{extra})")  # fmt: skip
    session.execute("COMMIT")
    return [(r["partition"], r["d"]) for r in got]


def test_disabling_after_enabling_is_refused_naming_the_rule(session: Session) -> None:
    session.execute(TOPIC)
    with pytest.raises(errors.InvalidParameterValueError) as refused:
        session.execute("ALTER TOPIC ev SET (auto_partitioning_strategy = 'disabled')")
    assert refused.value.sqlstate == "22023"
    assert "can be paused but never set back to 'disabled'" in str(refused.value)
    session.execute("ALTER TOPIC ev SET (auto_partitioning_strategy = 'scale_up_and_down')")
    session.execute("ALTER TOPIC ev SET (auto_partitioning_strategy = 'paused')")


def test_settings_reach_storage(session: Session, database: Database) -> None:
    session.execute(
        "CREATE TOPIC s WITH (auto_partitioning_strategy = 'scale_up', max_active_partitions = 7, "
        "auto_partitioning_up_utilization_percent = 60, "
        "auto_partitioning_stabilization_window = Interval('PT2S'), "
        "partition_write_speed_bytes_per_second = 5000, partition_write_burst_bytes = 7000)"
    )
    auto = database.topic_log(database.catalog.entry("s").topic_id).autopartitioning
    assert (auto.strategy, auto.max_active, auto.up_percent, auto.window_us) == (
        "scale_up", 7, 60, 2_000_000)  # fmt: skip
    assert (auto.write_speed, auto.burst) == (5000, 7000)


def test_a_consumer_reads_the_parent_to_its_end_before_the_children(
    session: Session, database: Database
) -> None:
    session.execute(TOPIC)
    _write(session, "p", 1, 3)
    _split(database, 0)
    _write(session, "p", 4, 3)
    first = _poll(session, ", max_messages = 2")
    assert first == [(0, "p:1"), (0, "p:2")]
    second = _poll(session)
    assert second == [(0, "p:3")]  # the children wait: the parent was not read to its end
    third = _poll(session)
    assert [d for _, d in third] == ["p:4", "p:5", "p:6"]
    assert {p for p, _ in third} <= {1, 2}


def test_a_member_leased_a_child_waits_for_the_parents_reader(
    session: Session, database: Database
) -> None:
    session.execute(TOPIC)
    _write(session, "q", 1, 2)
    _split(database, 0)
    for producer in ("q", "x", "y", "z"):  # both children get some (hashes checked below)
        _write(session, producer, 3, 1)
    other = database.connect()
    try:
        # Members a and b split the partitions 0, 1, 2: a holds 0 and 2, b holds 1.
        key = (database.catalog.entry("ev").topic_id, "c")
        database.leases.join(key, "a", session.session_id, (0, 1, 2))
        database.leases.join(key, "b", other.session_id, (0, 1, 2))
        got_b = _poll(other, ", member = 'b'")
        got_a = _poll(session, ", member = 'a'")
        assert got_b == [] and [d for _, d in got_a] == ["q:1", "q:2"]
        got_b = _poll(other, ", member = 'b'")
        got_a = _poll(session, ", member = 'a'")
        assert sorted(d for _, d in got_a + got_b) == ["q:3", "x:3", "y:3", "z:3"]
        assert {p for p, _ in got_a + got_b} == {1, 2}
    finally:
        other.close()


def test_a_bounded_peek_leaves_out_children_of_a_parent_it_did_not_finish(
    session: Session, database: Database
) -> None:
    session.execute(TOPIC)
    _write(session, "r", 1, 20)
    _split(database, 0)
    _write(session, "r", 21, 5)
    got = rows(session, "SELECT partition, seq_no FROM TOPIC ev WITH (max_messages = 10)")
    assert {r["partition"] for r in got} == {0}
    whole = rows(session, "SELECT seq_no FROM TOPIC ev")
    assert [r["seq_no"] for r in whole] == list(range(1, 26))  # parents first: in order


def test_sys_partitions_describe_and_explain_show_lineage_ranges_and_routing(
    session: Session, database: Database
) -> None:
    session.execute(TOPIC)
    _write(session, "p", 1, 2)
    _split(database, 0)
    got = rows(session, "SELECT partition, parent, children, state, key_range_start, "
                        "key_range_end, write_speed_limit, throttled_ms, split_at IS NOT NULL AS s "
                        "FROM sys.partitions ORDER BY partition")  # fmt: skip
    assert got[0] == {"partition": 0, "parent": None, "children": "1,2", "state": "inactive",
                      "key_range_start": "0000000000000000", "key_range_end": "ffffffffffffffff",
                      "write_speed_limit": 100_000_000, "throttled_ms": 0, "s": True}  # fmt: skip
    children = [
        (r["parent"], r["state"], r["key_range_start"], r["key_range_end"]) for r in got[1:]
    ]
    assert children == [
        (0, "active", "0000000000000000", "7fffffffffffffff"),
        (0, "active", "8000000000000000", "ffffffffffffffff"),
    ]  # fmt: skip
    described = {(r["section"], r["name"]): r["value"] for r in rows(session, "DESCRIBE TOPIC ev")}
    assert "children=1,2" in described[("partition", "0")]
    assert "keys=[8000000000000000..ffffffffffffffff]" in described[("partition", "2")]
    assert "BLAKE2b-64" in described[("routing", "writes")]
    plan = [r["plan"] for r in rows(session, "EXPLAIN INSERT INTO TOPIC ev (data) VALUES ('x')")]
    assert any(
        line.startswith("Routing topic=ev: key hash") and "p1=[0000000000000000..7fffffffffffffff]"
        in line for line in plan
    )  # fmt: skip


def test_a_throttled_write_shows_its_wait_in_sys_partitions(tmp_path) -> None:
    clock = ManualClock()  # stands still: no tokens come back while the writes run
    database = Database.open(str(tmp_path / "manual"), clock=clock, retention_interval_s=None)
    session = database.connect()
    try:
        session.execute("CREATE TOPIC slow WITH (auto_partitioning_strategy = 'paused', "
                        "partition_write_speed_bytes_per_second = 20000)")  # fmt: skip
        topic = database.topic_log(database.catalog.entry("slow").topic_id)
        waits: list[float] = []
        topic.sleep = waits.append
        payload = "x" * 10_000
        for _ in range(3):  # 20000 free (the burst is one second's worth), then 10000: 0.5 s
            session.execute(f"INSERT INTO TOPIC slow (data) VALUES ('{payload}')")
        got = rows(session, "SELECT throttled_ms, end_offset FROM sys.partitions")
        assert got == [{"throttled_ms": 500, "end_offset": 3}]
        assert sum(waits) == pytest.approx(0.5)  # in slices: a cancel may end the wait
    finally:
        session.close()
        database.close()


def test_a_read_of_one_child_sees_the_parent_committed_to_its_end(
    session: Session, database: Database
) -> None:
    session.execute(TOPIC)
    _write(session, "p", 1, 2)
    children = _split(database, 0)
    _write(session, "p", 3, 1)
    child = next(c for c in children if database.topic_log(
        database.catalog.entry("ev").topic_id).partition(c).end_offset)  # fmt: skip
    assert _poll(session, f", partition = {child}") == []  # the parent is not read yet
    assert [d for _, d in _poll(session, ", partition = 0")] == ["p:1", "p:2"]
    assert _poll(session, f", partition = {child}") == [(child, "p:3")]


def test_a_transaction_writing_to_a_split_partition_by_number_is_refused_whole(
    session: Session, database: Database
) -> None:
    """A share written with ``partition = 0`` and a keyed share that routes to a child of
    0 would both land in that child at publish, and the second would be skipped as
    "already holding this transaction": the COMMIT is refused (55000) instead, and
    nothing of the transaction is published."""
    session.execute(TOPIC)
    session.execute("BEGIN")
    session.execute("INSERT INTO TOPIC ev (data, partition) VALUES ('by-number', 0)")
    _split(database, 0)
    session.execute("INSERT INTO TOPIC ev (data, producer_id) VALUES ('by-key', 'q')")
    with pytest.raises(errors.ObjectNotInPrerequisiteStateError) as refused:
        session.execute("COMMIT")
    assert refused.value.sqlstate == "55000"
    assert rows(session, "SELECT count(*) AS n FROM ev") == [{"n": 0}]
    _write(session, "q", 1, 1)  # the topic takes writes as before
    assert rows(session, "SELECT count(*) AS n FROM ev") == [{"n": 1}]
