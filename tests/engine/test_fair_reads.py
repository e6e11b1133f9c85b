"""Reads that are fair and never silently partial (engine.reads).

A consumer read is a poll, and consecutive polls take the partitions that have data in
turn (round robin from where the last one stopped, no starvation); a bounded peek shares
its budget within the read; a peek without bounds is whole or refused (54000); a whole
cut of any size streams in bounded batches.
"""

from __future__ import annotations

import itertools

import pyarrow as pa
import pytest

from engine import tables
from engine.database import Database
from engine.reads import fair_shares, stream_records
from planner.operations import ReadRecords
from planner.planner import require_topic
from storage import limits
from storage.errors import LimitExceededError
from storage.limits import POLL_MESSAGES_MAX_DEFAULT as DEFAULT_MAX_MESSAGES
from tests.engine.conftest import rows


def _lags(session, topic: str = "t") -> dict[int, int]:
    found = rows(
        session,
        f"SELECT partition, lag_messages FROM sys.consumers WHERE topic = '{topic}' "
        "AND consumer = 'c' ORDER BY partition",
    )
    return {r["partition"]: r["lag_messages"] for r in found}


def _fill(session, partition: int, count: int, topic: str = "t") -> None:
    session.execute(
        f"INSERT INTO TOPIC {topic} (data, partition) "
        f"SELECT 'm' || i::VARCHAR, {partition} FROM range({count}) r(i)"
    )


def _partitions_read(session, sql: str) -> list[int]:
    return [r["partition"] for r in rows(session, sql)]


@pytest.fixture
def four(session):
    session.execute("CREATE TOPIC t (CONSUMER c) WITH (min_active_partitions = 4)")
    return session


def test_a_flooded_partition_does_not_starve_the_others(four) -> None:
    """The issue's loop: 10 messages into partition 0, then a read of 10, again and again."""
    for partition in range(4):
        _fill(four, partition, 30)
    read = "SELECT partition FROM TOPIC t WITH (consumer = 'c', max_messages = 10)"
    for _ in range(20):
        _fill(four, 0, 10)
        assert len(_partitions_read(four, read)) == 10
    lags = _lags(four)
    assert lags[1] == lags[2] == lags[3] == 0, lags
    # Partition 0 took what the others left: its backlog did not run away.
    assert lags[0] == 30 + 20 * 10 - (200 - 90), lags
    for _ in range(lags[0] // 10):
        _partitions_read(four, read)
    assert set(_lags(four).values()) == {0}


def test_the_budget_goes_round_robin_from_where_the_last_read_stopped(four) -> None:
    for partition in range(4):
        _fill(four, partition, 2)
    read = "SELECT partition FROM TOPIC t WITH (consumer = 'c', max_messages = 1)"
    order = [_partitions_read(four, read)[0] for _ in range(8)]
    assert sorted(order[:4]) == [0, 1, 2, 3], order
    assert sorted(order[4:]) == [0, 1, 2, 3], order


def test_consecutive_polls_take_turns_and_a_short_partition_passes_the_rest_on(four) -> None:
    _fill(four, 0, 100)
    _fill(four, 1, 100)
    _fill(four, 3, 2)  # less than a poll: the rest of that poll goes to the next partition
    poll = "SELECT partition FROM TOPIC t WITH (consumer = 'c', max_messages = 20)"
    polls = [_partitions_read(four, poll) for _ in range(4)]
    counts = [{p: got.count(p) for p in dict.fromkeys(got)} for got in polls]
    assert counts == [{0: 20}, {1: 20}, {3: 2, 0: 18}, {1: 20}], counts
    # each partition's messages come together, in offset order
    offsets = rows(four, 'SELECT partition, "offset" FROM TOPIC t WITH '
                   "(consumer = 'c', max_messages = 30)")  # fmt: skip
    assert offsets == sorted(offsets, key=lambda r: (r["partition"] != 0, r["offset"]))


def test_a_bounded_peek_shares_its_budget_within_the_read(four) -> None:
    _fill(four, 0, 100)
    _fill(four, 1, 100)
    _fill(four, 3, 2)  # less than its share: the rest goes to the others
    got = _partitions_read(four, "SELECT partition FROM TOPIC t WITH (max_messages = 20)")
    counts = {p: got.count(p) for p in set(got)}
    assert counts == {0: 9, 1: 9, 3: 2}, counts
    assert got == sorted(got), "each partition's messages come together, in partition order"


def _one_frame_per_message(session) -> None:
    session.execute("CREATE TOPIC t (CONSUMER c) WITH (min_active_partitions = 2)")
    payload = "x" * 1000
    for _ in range(10):  # one frame per message, so a byte budget can stop between them
        for partition in (0, 1):
            session.execute(
                f"INSERT INTO TOPIC t (data, partition) VALUES ('{payload}', {partition})"
            )


def test_the_byte_budget_bounds_a_poll_and_polls_take_turns(session) -> None:
    _one_frame_per_message(session)
    poll = "SELECT partition FROM TOPIC t WITH (consumer = 'c', max_bytes = 5000)"
    first, second = _partitions_read(session, poll), _partitions_read(session, poll)
    assert 0 < len(first) < 10 and set(first) == {0}, first
    assert 0 < len(second) < 10 and set(second) == {1}, second


def test_a_peek_shares_its_byte_budget_too(session) -> None:
    _one_frame_per_message(session)
    got = _partitions_read(session, "SELECT partition FROM TOPIC t WITH (max_bytes = 9000)")
    assert 0 < len(got) < 20, got
    assert abs(got.count(0) - got.count(1)) <= 1, got


def test_members_read_their_own_partitions_fairly(database) -> None:
    first, second = database.connect(), database.connect()
    try:
        first.execute("CREATE TOPIC t (CONSUMER c) WITH (min_active_partitions = 4)")
        member_read = "SELECT partition FROM TOPIC t WITH (consumer = 'c', member = '{}', {})"
        first.execute(member_read.format("w1", "max_messages = 10"))
        second.execute(member_read.format("w2", "max_messages = 10"))
        # w1 owns partitions 0 and 2, w2 owns 1 and 3 (leases: partition i to member i mod 2).
        _fill(first, 2, 40)
        for _ in range(10):
            _fill(first, 0, 10)
            got = _partitions_read(first, member_read.format("w1", "max_messages = 10"))
            assert set(got) <= {0, 2}
        assert _lags(first)[2] == 0
    finally:
        second.close()
        first.close()


def test_a_consumer_read_without_bounds_is_a_poll_of_the_documented_default(session) -> None:
    session.execute("CREATE TOPIC t (CONSUMER c)")
    _fill(session, 0, DEFAULT_MAX_MESSAGES + 5)
    read = "SELECT count(*) AS n FROM TOPIC t WITH (consumer = 'c')"
    assert rows(session, read) == [{"n": DEFAULT_MAX_MESSAGES}]
    assert rows(session, read) == [{"n": 5}]


def test_a_peek_without_bounds_is_whole(session) -> None:
    """800,003 messages: the issue's count, once 10,000 (partition 0 only)."""
    session.execute("CREATE TOPIC big WITH (min_active_partitions = 4)")
    for _ in range(8):
        session.execute("INSERT INTO TOPIC big (data) SELECT 'm' FROM range(100000)")
    session.execute("INSERT INTO TOPIC big (data) VALUES ('a'), ('b'), ('c')")
    assert rows(session, "SELECT count(*) AS n FROM TOPIC big") == [{"n": 800_003}]
    assert rows(session, "SELECT count(*) AS n FROM big") == [{"n": 800_003}]
    per_partition = rows(
        session, "SELECT partition, count(*) AS n FROM TOPIC big GROUP BY 1 ORDER BY 1"
    )
    assert sum(r["n"] for r in per_partition) == 800_003 and len(per_partition) == 4


def test_a_peek_with_bounds_stays_bounded(session) -> None:
    session.execute("CREATE TOPIC t WITH (min_active_partitions = 2)")
    _fill(session, 0, 50)
    _fill(session, 1, 50)
    got = _partitions_read(session, "SELECT partition FROM TOPIC t WITH (max_messages = 10)")
    assert sorted(got) == [0] * 5 + [1] * 5


def test_a_peek_over_the_single_read_limit_is_refused_not_cut(session, monkeypatch) -> None:
    monkeypatch.setattr(limits, "READ_MESSAGES_MAX", 1000)
    session.execute("CREATE TOPIC t WITH (min_active_partitions = 2)")
    _fill(session, 0, 600)
    _fill(session, 1, 600)
    with pytest.raises(LimitExceededError) as refused:
        session.execute("SELECT count(*) FROM TOPIC t")
    assert refused.value.sqlstate == "54000"
    assert rows(session, "SELECT count(*) AS n FROM TOPIC t WITH (partition = 1)") == [{"n": 600}]


def _peek(database: Database, name: str, **options) -> ReadRecords:
    info = require_topic(database, name)
    return ReadRecords(info.name, info.topic_id, info.partitions, "scan", None, options)


def test_a_stream_reads_a_whole_cut_in_bounded_batches(session, database, monkeypatch) -> None:
    monkeypatch.setattr(limits, "READ_MESSAGES_MAX", 1000)  # no single-read limit applies
    session.execute("CREATE TOPIC t WITH (min_active_partitions = 3)")
    for partition in range(3):
        _fill(session, partition, 700)
    operation = _peek(database, "t")
    topic = database.topic_log(operation.topic_id)
    reader = stream_records(
        operation, topic, database.clock, database.publish_lock, batch_messages=100
    )
    _fill(session, 0, 5)  # after the cut: not part of this read
    sizes, offsets = [], {}
    for batch in reader:
        sizes.append(batch.num_rows)
        for partition, offset in zip(
            batch.column("partition").to_pylist(), batch.column("offset").to_pylist(), strict=True
        ):
            offsets.setdefault(partition, []).append(offset)
    assert max(sizes) <= 100 and sum(sizes) == 2100
    assert all(offsets[p] == list(range(700)) for p in range(3))


def test_duckdb_scans_a_stream_batch_by_batch(session, database) -> None:
    session.execute("CREATE TOPIC t WITH (min_active_partitions = 2)")
    _fill(session, 0, 3000)
    _fill(session, 1, 1000)
    operation = _peek(database, "t")
    reader = stream_records(
        operation, database.topic_log(operation.topic_id), database.clock, batch_messages=256
    )
    cursor = database.root.cursor()
    try:
        tables.register(cursor, "stream_scan", reader)
        result = tables.query_arrow(
            cursor, "SELECT partition, count(*) AS n FROM stream_scan GROUP BY 1 ORDER BY 1"
        )
        assert result is not None
        assert result.to_pylist() == [{"partition": 0, "n": 3000}, {"partition": 1, "n": 1000}]
    finally:
        cursor.close()


def test_a_consumer_read_cannot_be_streamed(session, database) -> None:
    session.execute("CREATE TOPIC t (CONSUMER c)")
    info = require_topic(database, "t")
    operation = ReadRecords("t", info.topic_id, info.partitions, "scan", "c", {})
    with pytest.raises(Exception, match="poll"):
        stream_records(operation, database.topic_log(info.topic_id), database.clock)


@pytest.mark.parametrize(
    ("demands", "budget", "expected"),
    [
        ([(0, 100), (1, 100), (2, 100), (3, 100)], 10, {0: 3, 1: 3, 2: 2, 3: 2}),
        ([(2, 100), (3, 100), (0, 100), (1, 100)], 10, {2: 3, 3: 3, 0: 2, 1: 2}),
        ([(0, 100), (1, 1), (2, 0)], 10, {0: 9, 1: 1, 2: 0}),
        ([(0, 3), (1, 4)], 10, {0: 3, 1: 4}),
        ([(0, 5), (1, 5), (2, 5)], 1, {0: 1, 1: 0, 2: 0}),
    ],
)
def test_fair_shares_are_max_min_fair_with_a_round_robin_remainder(
    demands, budget, expected
) -> None:
    assert fair_shares(demands, budget) == expected


def test_fair_shares_never_exceed_budget_or_demand() -> None:
    for sizes in itertools.product((0, 1, 3, 7, 50), repeat=3):
        demands = list(enumerate(sizes))
        for budget in (1, 2, 5, 11, 100):
            shares = fair_shares(demands, budget)
            assert sum(shares.values()) == min(budget, sum(sizes))
            assert all(0 <= shares[p] <= d for p, d in demands)
            # max-min: a partition below another's share got all it had
            for p, d in demands:
                if shares[p] < d:
                    assert all(shares[q] <= shares[p] + 1 for q, _ in demands)


def test_the_stream_schema_is_the_topic_relation(session, database) -> None:
    session.execute("CREATE TOPIC t")
    reader = stream_records(
        _peek(database, "t"), database.topic_log(_peek(database, "t").topic_id), database.clock
    )
    assert reader.read_all() == pa.Table.from_batches([], schema=reader.schema)


def test_a_batch_read_past_the_cut_is_trimmed_to_it() -> None:
    """Storage reads from the log start when retention moved it under a read; the cut
    still bounds what the read returns (engine.reads._within_cut)."""
    from engine.reads import _within_cut

    batch = pa.record_batch({"offset": pa.array(range(5, 10), pa.int64())})
    assert _within_cut(batch, 8).column("offset").to_pylist() == [5, 6, 7]
    assert _within_cut(batch, 10) is batch
    assert _within_cut(batch, 5).num_rows == 0


def test_one_members_polls_do_not_move_anothers_turn(database) -> None:
    """w2 polling its partition 1 between w1's polls must not keep w1 on partition 2."""
    first, second = database.connect(), database.connect()
    try:
        first.execute("CREATE TOPIC t (CONSUMER c) WITH (min_active_partitions = 4)")
        member_read = "SELECT partition FROM TOPIC t WITH (consumer = 'c', member = '{}', {})"
        first.execute(member_read.format("w1", "max_messages = 10"))
        second.execute(member_read.format("w2", "max_messages = 10"))
        _fill(first, 0, 30)
        w1_partitions: list[int] = []
        for _ in range(6):
            _fill(first, 2, 10)  # partition 2 always has a poll's worth
            _fill(first, 1, 10)
            w1_partitions += _partitions_read(first, member_read.format("w1", "max_messages = 10"))
            assert set(_partitions_read(second, member_read.format("w2", "max_messages = 10"))) \
                <= {1, 3}  # fmt: skip
        assert w1_partitions.count(0) == 30, w1_partitions  # partition 0 had its turns
    finally:
        second.close()
        first.close()


def test_round_robin_positions_are_bounded_forgetting_the_least_recently_polled(
    monkeypatch,
) -> None:
    from engine.reads import RoundRobin
    from storage import limits

    monkeypatch.setattr(limits, "ROUND_ROBIN_POSITIONS_MAX", 3)
    positions = RoundRobin()
    for member in ("a", "b", "c"):
        positions.note(("t", "c", member), 1)
    positions.note(("t", "c", "a"), 2)  # a is the most recent again
    positions.note(("t", "c", "d"), 0)  # b, the least recent, is forgotten
    assert positions.order(("t", "c", "b"), [0, 1, 2]) == [0, 1, 2]
    assert positions.order(("t", "c", "a"), [0, 1, 2, 3]) == [3, 0, 1, 2]
    assert positions.order(("t", "c", "d"), [0, 1, 2]) == [1, 2, 0]
    assert len(positions._last) == 3
