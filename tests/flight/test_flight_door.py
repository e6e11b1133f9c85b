"""The Arrow Flight door: authentication, privileges, range reads equal to SQL reads, and
staged writes published exactly once (replays, aborts, abandoned writers)."""

from __future__ import annotations

import os

import pyarrow as pa
import pytest

from engine.bulk_write import WRITES_DIRECTORY
from spark_sql_ext.client import TopicbaseFlightError


def _fill(database, topic: str = "events", partitions: int = 3, rows: int = 600) -> None:
    session = database.connect()
    session.execute(
        f"CREATE TOPIC {topic} (CONSUMER c) WITH (min_active_partitions = {partitions})")
    for index in range(partitions if rows else 0):
        values = ", ".join(f"('m-{index}-{i}', {index})" for i in range(rows))
        session.execute(f"INSERT INTO TOPIC {topic} (data, partition) VALUES {values}")
    session.close()


def _sql_rows(database, sql: str) -> list[dict]:
    session = database.connect()
    try:
        return session.execute(sql)[-1].table.to_pylist()
    finally:
        session.close()


def test_wrong_password_is_refused(client) -> None:
    with pytest.raises(TopicbaseFlightError) as caught:
        client("bob", "wrong")
    assert caught.value.sqlstate == "28P01"


def test_range_reads_equal_a_sql_read_of_the_same_cut(database, client) -> None:
    _fill(database)
    schema, tickets = client().tickets(
        {"topic": "events", "columns": ["partition", "offset", "data"], "split_rows": 250})
    assert schema.names == ["partition", "offset", "data"]
    # 600 messages per partition split in 250s: 3 ranges per partition, contiguous.
    assert [(t["partition"], t["start"], t["end"]) for t in tickets] == [
        (p, s, min(s + 250, 600)) for p in range(3) for s in (0, 250, 500)]
    got = pa.Table.from_batches(
        [b for t in tickets for b in client().read_ticket(t)], schema=schema).to_pylist()
    expected = []
    for p in range(3):
        expected += _sql_rows(database, 'SELECT partition, "offset", data FROM TOPIC events '
                              f"WITH (partition = {p}, max_messages = 1000) ORDER BY 2")
    assert got == expected
    assert len(got) == 1800


def test_a_read_of_partition_and_offset_reads_no_frame(database, client, monkeypatch) -> None:
    """A count or a GROUP BY partition moves no message: the range gives both columns, equal
    to a SQL read of them; a range past the partition's end is still refused."""
    _fill(database, partitions=2, rows=300)
    expected = _sql_rows(database, 'SELECT "offset", partition FROM TOPIC events WITH '
                         "(max_messages = 1000) ORDER BY partition, 1")  # fmt: skip
    from storage.partition_log import PartitionLog

    def no_frames(*args, **kwargs):
        raise AssertionError("a frame was read")

    monkeypatch.setattr(PartitionLog, "read", no_frames)
    got = client().read_all({"topic": "events", "columns": ["offset", "partition"],
                             "split_rows": 100}).to_pylist()  # fmt: skip
    assert got == expected and len(got) == 600
    with pytest.raises(TopicbaseFlightError) as caught:
        list(client().read_ticket({"topic": "events", "partition": 0, "start": 250, "end": 301,
                                   "columns": ["partition"]}))  # fmt: skip
    assert caught.value.sqlstate == "22023"


def test_read_from_offsets_to_ends_and_a_table(database, client) -> None:
    _fill(database, partitions=2, rows=10)
    table = client().read_all({"topic": "events", "columns": ["offset"],
                               "starts": {"0": 7}, "ends": {"1": 3}})
    assert table.column("offset").to_pylist() == [7, 8, 9, 0, 1, 2]
    session = database.connect()
    session.execute("CREATE TABLE t (k INTEGER, v VARCHAR); "
                    "INSERT INTO t VALUES (1, 'a'), (2, 'b')")
    session.close()
    assert client().read_all({"table": "t"}).to_pylist() == [{"k": 1, "v": "a"}, {"k": 2, "v": "b"}]
    with pytest.raises(TopicbaseFlightError) as caught:
        client().read_all({"topic": "events", "columns": ["nope"]})
    assert caught.value.sqlstate == "22023"
    with pytest.raises(TopicbaseFlightError) as caught:
        client().read_all({"topic": "missing"})
    assert caught.value.sqlstate == "42P01"


def test_a_user_without_the_privilege_is_refused(database, client) -> None:
    _fill(database, rows=5)
    session = database.connect()
    session.execute("CREATE TABLE secret (k INTEGER)")
    session.close()
    for command in ({"topic": "events"}, {"table": "secret"}):
        with pytest.raises(TopicbaseFlightError) as caught:
            client("bob").read_all(command)
        assert caught.value.sqlstate == "42501"
    batch = pa.record_batch({"data": pa.array([b"x"], pa.binary())})
    with pytest.raises(TopicbaseFlightError) as caught:
        client("bob").put({"topic": "events"}, [batch], batch.schema)
    assert caught.value.sqlstate == "42501"
    assert client("alice").read_all({"topic": "events"}).num_rows == 15


def _count(database, topic: str = "events") -> int:
    return _sql_rows(database, f"SELECT count(*) AS n FROM TOPIC {topic} "
                     "WITH (max_messages = 1000000)")[0]["n"]


def test_a_replayed_commit_publishes_once(database, client) -> None:
    _fill(database, partitions=2, rows=0)
    session = database.connect()
    session.execute("CREATE TABLE totals (k VARCHAR, n BIGINT)")
    session.close()
    writer = client()
    messages = pa.record_batch({"data": pa.array([f"d{i}".encode() for i in range(1000)]),
                                "partition": pa.array([i % 2 for i in range(1000)], pa.int64())})
    rows = pa.record_batch({"k": ["a", "b"], "n": pa.array([1, 2], pa.int64())})
    ids = [writer.put({"topic": "events"}, [messages.slice(0, 400), messages.slice(400)],
                      messages.schema),
           writer.put({"table": "totals"}, [rows], rows.schema)]
    assert writer.commit("sink-1", 7, ids) == {"status": "committed", "rows": 1002}
    # The driver crashed before it saw the answer: the tasks stage again, the commit repeats.
    again = [writer.put({"topic": "events"}, [messages], messages.schema),
             writer.put({"table": "totals"}, [rows], rows.schema)]
    assert writer.commit("sink-1", 7, again) == {"status": "duplicate", "rows": 0}
    assert _count(database) == 1000
    assert _sql_rows(database, "SELECT k, n FROM totals ORDER BY k") == rows.to_pylist()
    assert writer.action("last_batch", {"sink_id": "sink-1"}) == {"batch_id": 7}
    assert writer.staged() == []  # both the published and the replayed writes are gone


def test_tasks_writes_publish_in_order_per_partition_and_bad_partitions_are_refused(
        database, client) -> None:  # fmt: skip
    """The commit publishes every task's rows of a topic as one batch per partition: each
    partition holds its rows in task order, then row order; a partition named for some rows
    only, or negative, is refused as INSERT INTO TOPIC refuses it."""
    _fill(database, partitions=3, rows=0)
    writer = client()
    ids = []
    for task in range(3):
        batch = pa.record_batch({
            "data": pa.array([f"t{task}-{i}".encode() for i in range(30)]),
            "partition": pa.array([(i + task) % 3 for i in range(30)], pa.int32())})
        ids.append(writer.put({"topic": "events"}, [batch.slice(0, 10), batch.slice(10)],
                              batch.schema))  # fmt: skip
    routed = pa.record_batch({"data": pa.array([b"r0", b"r1"])})
    ids.append(writer.put({"topic": "events"}, [routed], routed.schema))
    assert writer.commit("sink-order", 1, ids) == {"status": "committed", "rows": 92}
    for partition in range(3):
        got = [r["d"] for r in _sql_rows(
            database, "SELECT CAST(data AS VARCHAR) AS d FROM TOPIC events WITH "
            f"(partition = {partition}, max_messages = 1000) ORDER BY offset")]  # fmt: skip
        expected = [f"t{task}-{i}" for task in range(3) for i in range(30)
                    if (i + task) % 3 == partition]  # fmt: skip
        assert [d for d in got if d.startswith("t")] == expected
    assert _count(database) == 92
    # Rows that all name their partition are encoded as frames when staged
    # (``storage.staged_frames``): a negative one fails the put itself.
    bad = {"22023": pa.array([0, None], pa.int64()), "22003": pa.array([0, -1], pa.int64())}
    for sqlstate, partitions in bad.items():
        batch = pa.record_batch({"data": pa.array([b"a", b"b"]), "partition": partitions})
        with pytest.raises(TopicbaseFlightError) as caught:
            write_id = writer.put({"topic": "events"}, [batch], batch.schema)
            writer.commit(f"sink-{sqlstate}", 1, [write_id])
        assert caught.value.sqlstate == sqlstate
    assert _count(database) == 92


def test_an_abort_leaves_nothing_staged(database, client) -> None:
    _fill(database, partitions=1, rows=0)
    writer = client()
    batch = pa.record_batch({"data": pa.array([b"x"] * 100)})
    write_id = writer.put({"topic": "events"}, [batch], batch.schema)
    assert [w["write_id"] for w in writer.staged()] == [write_id]
    assert writer.abort([write_id]) == 1
    assert writer.staged() == []
    assert os.listdir(os.path.join(database.path, WRITES_DIRECTORY)) == []
    assert writer.commit("sink-2", 0, []) == {"status": "committed", "rows": 0}
    assert _count(database) == 0


def test_a_killed_writers_staged_data_is_collected(database, door, client) -> None:
    _fill(database, partitions=1, rows=0)
    batch = pa.record_batch({"data": pa.array([b"y"] * 10)})
    kept = client().put({"topic": "events"}, [batch], batch.schema)
    # A writer killed mid-stream leaves a partial file behind its write's directory.
    root = os.path.join(database.path, WRITES_DIRECTORY)
    os.makedirs(os.path.join(root, "dead-writer"))
    with open(os.path.join(root, "dead-writer", "x.part"), "wb") as handle:
        handle.write(b"\0" * 1000)
    old = os.path.getmtime(os.path.join(root, kept)) - 10_000
    for name in ("dead-writer", kept):
        for entry in [os.path.join(root, name), *[os.path.join(root, name, f)
                      for f in os.listdir(os.path.join(root, name))]]:
            os.utime(entry, (old, old))
    assert sorted(door.writes.collect()) == sorted(["dead-writer", kept])
    assert os.listdir(root) == []
    with pytest.raises(TopicbaseFlightError) as caught:
        client().commit("sink-3", 0, [kept])
    assert caught.value.sqlstate == "42704"
    assert _count(database) == 0


def test_staging_is_bounded_by_its_disk_cap(database, door, client) -> None:
    _fill(database, partitions=1, rows=0)
    door.writes.staging_bytes_max = 64 * 1024
    batch = pa.record_batch({"data": pa.array([b"z" * 1024] * 200)})
    with pytest.raises(TopicbaseFlightError) as caught:
        client().put({"topic": "events"}, [batch], batch.schema)
    assert caught.value.sqlstate == "54000"
    assert door.writes.staged_bytes == 0
    assert client().staged() == [] or all(w["files"] == 0 for w in client().staged())


def test_table_writes_append_upsert_and_add_by_key(database, client) -> None:
    session = database.connect()
    session.execute("CREATE TABLE totals (k VARCHAR PRIMARY KEY, n BIGINT)")
    session.close()
    writer = client()
    rows = pa.record_batch({"k": ["a", "b", "a"], "n": pa.array([1, 2, 3], pa.int64())})
    add = {"table": "totals", "mode": "add", "key": ["k"]}
    writer.commit("fold", 0, [writer.put(add, [rows], rows.schema)])
    assert _sql_rows(database, "SELECT * FROM totals ORDER BY k") == [
        {"k": "a", "n": 4}, {"k": "b", "n": 2}]
    writer.commit("fold", 1, [writer.put(add, [rows], rows.schema)])
    writer.commit("fold", 1, [writer.put(add, [rows], rows.schema)])  # a replay: no-op
    assert _sql_rows(database, "SELECT * FROM totals ORDER BY k") == [
        {"k": "a", "n": 8}, {"k": "b", "n": 4}]
    latest = pa.record_batch({"k": ["b"], "n": pa.array([10], pa.int64())})
    upsert = {"table": "totals", "mode": "upsert", "key": ["k"]}
    writer.commit("fold", 2, [writer.put(upsert, [latest], latest.schema)])
    assert _sql_rows(database, "SELECT * FROM totals ORDER BY k") == [
        {"k": "a", "n": 8}, {"k": "b", "n": 10}]
    with pytest.raises(TopicbaseFlightError) as caught:
        writer.put({"topic": "nope", "mode": "add"}, [latest], latest.schema)
    assert caught.value.sqlstate in ("42P01", "22023")


def test_a_batch_over_the_partition_limit_goes_in_parts_exactly_once(
        database, client, monkeypatch) -> None:  # fmt: skip
    from engine import bulk_publish

    _fill(database, partitions=1, rows=0)
    count = bulk_publish.PART_ROWS * 2 + 10  # three parts into one partition
    batch = pa.record_batch({"data": pa.array([b"%d" % i for i in range(count)])})
    writer = client()
    real = bulk_publish._transaction
    calls = []

    def crash_at_third(*args, **kwargs):  # the process dies after two parts committed
        calls.append(1)
        if len(calls) == 4:  # 1: the whole batch (refused, 54000), 2-3: parts, 4: crash
            raise RuntimeError("killed")
        return real(*args, **kwargs)

    monkeypatch.setattr(bulk_publish, "_transaction", crash_at_third)
    with pytest.raises(TopicbaseFlightError):
        writer.commit("big", 0, [writer.put({"topic": "events"}, [batch], batch.schema)])
    monkeypatch.setattr(bulk_publish, "_transaction", real)
    assert _count(database) == 2 * bulk_publish.PART_ROWS  # two parts are out
    again = writer.put({"topic": "events"}, [batch], batch.schema)  # the replay
    assert writer.commit("big", 0, [again]) == {"status": "committed", "rows": count}
    assert writer.commit("big", 0, []) == {"status": "duplicate", "rows": 0}
    rows = _sql_rows(database, 'SELECT "offset", data FROM TOPIC events '
                     "WITH (max_messages = 1000000) ORDER BY 1")  # fmt: skip
    assert [r["data"] for r in rows] == [b"%d" % i for i in range(count)]
