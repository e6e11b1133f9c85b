"""The catalog's JVM writes of topics over the PostgreSQL wire (``WireWrite.java``): each
task stages its rows with ``COPY TOPIC t (...) FROM STDIN (FORMAT arrow, WRITE_ID 'id')``
on its own connection, the driver publishes them with one ``COMMIT WRITES`` (per
micro-batch for a streaming write, as ``(sinkId, epoch)``).

The wire server runs in this process (``_Wire``), so the tests see which door the rows
took (``copy_staged`` counted) and what is left staged on disk.
"""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pyarrow as pa
import pytest

from engine import staged_refs
from engine.bulk_write import WRITES_DIRECTORY, BulkWrites
from sql.flight.server import TopicbaseFlightServer
from sql.pgwire.connection import copy_staged
from sql.pgwire.users import add_user, default_users_path
from storage import limits
from storage.column_codec import compressed_values
from storage.record_batch import WIRE_SCHEMA, serialize_body_buffer
from storage.wire_columns import decode_wire_bodies
from tests.spark.conftest import finish, sql_rows
from tests.spark.test_wire_read import _catalog, _Wire


@pytest.fixture
def wire(database):
    server = _Wire(database)
    yield server
    server.stop()


@pytest.fixture
def staged_copies(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The write ids of the staged COPYs the wire server ran."""
    seen: list[str] = []
    original = copy_staged.copy_staged_from_client

    async def counting(context, write_id, kind, name, columns, *args, **options):
        seen.append(write_id)
        return await original(context, write_id, kind, name, columns, *args, **options)

    monkeypatch.setattr(copy_staged, "copy_staged_from_client", counting)
    return seen


@pytest.fixture
def copy_formats(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The format of each staged COPY the wire server ran: ``frames`` or ``arrow``."""
    seen: list[str] = []
    original = copy_staged.copy_staged_from_client

    async def recording(context, write_id, kind, name, columns, *args, frames=False):
        seen.append("frames" if frames else "arrow")
        return await original(context, write_id, kind, name, columns, *args, frames=frames)

    monkeypatch.setattr(copy_staged, "copy_staged_from_client", recording)
    return seen


@pytest.fixture
def no_flight_puts(monkeypatch: pytest.MonkeyPatch) -> None:
    """A write through the Flight door (the Python source) fails the test."""

    def refuse(*args, **kwargs):
        raise AssertionError("the write went through the Python source's stage action")

    monkeypatch.setattr(TopicbaseFlightServer, "_stage", refuse)


def _staged(database) -> list[str]:
    root = os.path.join(database.path, WRITES_DIRECTORY)
    return sorted(os.listdir(root)) if os.path.isdir(root) else []


def _until_nothing_staged(database) -> None:
    """Every staged write gone within 60 s (a killed task's abort may end just after the
    job's error reached the test)."""
    deadline = time.monotonic() + 60
    while _staged(database) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _staged(database) == []


def _create(database, topic: str = "events", partitions: int = 3) -> None:
    session = database.connect()
    session.execute(f"CREATE TOPIC {topic} WITH (min_active_partitions = {partitions})")
    session.close()


def test_insert_into_publishes_every_row_once_through_the_jvm(
        spark, database, url, wire, staged_copies, no_flight_puts) -> None:  # fmt: skip
    _create(database)
    tb = _catalog(spark, url, wire)
    spark.sql(f"INSERT INTO {tb}.main.events (data) VALUES (CAST('w1' AS BINARY)), "
              "(CAST('w2' AS BINARY))")  # fmt: skip
    assert sorted(r["d"] for r in sql_rows(
        database, "SELECT CAST(data AS VARCHAR) AS d FROM TOPIC events")) == ["w1", "w2"]
    assert staged_copies and _staged(database) == []
    before = len(staged_copies)

    frame = spark.range(0, 3000, numPartitions=4).selectExpr(
        "CAST(CONCAT('m', id) AS BINARY) AS data", "CAST(id % 3 AS INT) AS partition",
        "CAST(id AS BIGINT) AS seq_no", "'p1' AS producer_id")  # fmt: skip
    frame.writeTo(f"{tb}.main.events").append()
    rows = sql_rows(database, 'SELECT partition, "offset", CAST(data AS VARCHAR) AS d, seq_no '
                    'FROM TOPIC events WHERE producer_id = \'p1\' ORDER BY partition, "offset"')
    assert len(rows) == 3000
    assert sorted(int(r["d"][1:]) for r in rows) == list(range(3000))
    assert all(int(r["d"][1:]) % 3 == r["partition"] for r in rows)
    for partition in range(3):  # each task's rows keep their order within a partition
        ids = [r["seq_no"] for r in rows if r["partition"] == partition]
        assert ids == sorted(ids)
    assert _staged(database) == []
    assert len(staged_copies) - before == 4  # one COPY per task


def test_a_replayed_sink_and_batch_publishes_nothing(spark, database, url, wire,
                                                     staged_copies) -> None:  # fmt: skip
    _create(database)
    tb = _catalog(spark, url, wire)
    frame = spark.range(0, 100, numPartitions=2).selectExpr(
        "CAST(CONCAT('r', id) AS BINARY) AS data")
    for _ in range(2):
        frame.writeTo(f"{tb}.main.events").option("sinkId", "job-7").option(
            "batchId", "3").append()
    assert sql_rows(database, "SELECT count(*) AS n FROM TOPIC events") == [{"n": 100}]
    session = database.connect()
    assert session.bulk_writes().committed_rows(session, "job-7", 3) == 100
    session.close()
    assert len(staged_copies) == 4 and _staged(database) == []


def test_a_failing_task_leaves_nothing_staged_nor_published(spark, database, url, wire,
                                                            staged_copies) -> None:  # fmt: skip
    _create(database)
    tb = _catalog(spark, url, wire)
    frame = spark.range(0, 4000, numPartitions=4).selectExpr(
        "CASE WHEN id = 3999 THEN CAST(raise_error('boom in the last task') AS BINARY) "
        "ELSE CAST(CONCAT('x', id) AS BINARY) END AS data")  # fmt: skip
    with pytest.raises(Exception, match="boom in the last task"):
        frame.writeTo(f"{tb}.main.events").append()
    assert len(staged_copies) >= 2  # tasks had staged rows before the failure
    # The failed task's write and the committed tasks' (the driver's abort) go at once; a
    # task still running when the job failed is killed and aborts its own on the executor,
    # which may end just after the job's error reached us: wait for it.
    _until_nothing_staged(database)
    assert sql_rows(database, "SELECT count(*) AS n FROM TOPIC events") == [{"n": 0}]


def test_a_task_that_staged_as_the_job_failed_leaves_nothing_staged(
        spark, database, url, wire, monkeypatch) -> None:  # fmt: skip
    """A task whose COPY ends (its rows staged, its commit granted) just as another task
    fails the job: Spark drops its commit message, so the driver's abort cannot name its
    write id; the abort of the job's prefix discards it. The wire server holds that
    task's COPY reply until the driver's abort has come (the race, made certain)."""
    _create(database)
    tb = _catalog(spark, url, wire)
    driver_aborted = threading.Event()
    original_abort, original_append = BulkWrites.abort, BulkWrites.append

    def abort(self, session, write_ids):
        write_ids = list(write_ids)
        if any(w.endswith("*") or w.split("-")[2] != "3" for w in write_ids):
            driver_aborted.set()  # not the failing task's own abort (partition 3)
        return original_abort(self, session, write_ids)

    def append(self, session, write_id, *args, **kwargs):
        rows = original_append(self, session, write_id, *args, **kwargs)
        if write_id.split("-")[2] == "2":
            driver_aborted.wait(60)  # bounded: without the driver's abort, it goes on
        return rows

    monkeypatch.setattr(BulkWrites, "abort", abort)
    monkeypatch.setattr(BulkWrites, "append", append)
    frame = spark.range(0, 4000, numPartitions=4).selectExpr(
        "CASE WHEN id = 3999 THEN CAST(raise_error('boom in the last task') AS BINARY) "
        "ELSE CAST(CONCAT('x', id) AS BINARY) END AS data")  # fmt: skip
    with pytest.raises(Exception, match="boom in the last task"):
        frame.writeTo(f"{tb}.main.events").append()
    assert driver_aborted.wait(60)
    # The held task's COPY ends after the driver's abort; it may still be ending now.
    _until_nothing_staged(database)
    assert sql_rows(database, "SELECT count(*) AS n FROM TOPIC events") == [{"n": 0}]


def test_a_user_without_insert_gets_42501(spark, database, url, wire, staged_copies) -> None:
    _create(database)
    add_user(default_users_path(database.path), "reader", "reader-secret")
    session = database.connect()
    session.execute("GRANT SELECT ON TOPIC events TO reader")
    session.close()
    tb = _catalog(spark, url, wire, user="reader", password="reader-secret")
    with pytest.raises(Exception, match=r"permission denied for topic events.*42501"):
        spark.sql(f"INSERT INTO {tb}.main.events (data) VALUES (CAST('no' AS BINARY))")
    assert staged_copies  # refused by the wire's staged COPY, before any data
    assert sql_rows(database, "SELECT count(*) AS n FROM TOPIC events") == [{"n": 0}]
    assert _staged(database) == []


def test_a_streaming_write_publishes_each_micro_batch_once_through_the_jvm(
        spark, database, url, wire, staged_copies, no_flight_puts, tmp_path) -> None:  # fmt: skip
    _create(database, "src", partitions=1)
    _create(database, "events")
    tb = _catalog(spark, url, wire)

    def insert(*values: str) -> None:
        session = database.connect()
        rows = ", ".join(f"('{v}')" for v in values)
        session.execute(f"INSERT INTO TOPIC src (data) VALUES {rows}")
        session.close()

    def run_stream() -> None:  # AvailableNow from the checkpoint (the first run: earliest)
        query = (spark.readStream.option("startingOffsets", "earliest").table(f"{tb}.main.src")
                 .select("data").writeStream
                 .option("checkpointLocation", str(tmp_path / "cp")).option("sinkId", "stream-1")
                 .trigger(availableNow=True).toTable(f"{tb}.main.events"))  # fmt: skip
        finish(query)

    insert("s1", "s2", "s3")
    run_stream()
    insert("s4")
    run_stream()
    assert sorted(r["d"] for r in sql_rows(database, "SELECT CAST(data AS VARCHAR) AS d FROM "
                                           "TOPIC events")) == ["s1", "s2", "s3", "s4"]
    assert staged_copies and _staged(database) == []
    session = database.connect()
    writes = session.bulk_writes()
    assert writes.last_batch(session, "stream-1") is not None  # micro-batches by epoch
    session.close()


def test_a_streaming_write_needs_a_sink_id(spark, database, url, wire, tmp_path) -> None:
    _create(database, "src", partitions=1)
    _create(database, "events")
    tb = _catalog(spark, url, wire)
    with pytest.raises(Exception, match="sinkId"):
        query = (spark.readStream.table(f"{tb}.main.src").select("data").writeStream
                 .option("checkpointLocation", str(tmp_path / "cp"))
                 .trigger(availableNow=True).toTable(f"{tb}.main.events"))  # fmt: skip
        query.awaitTermination(60)
        if query.exception() is not None:
            raise Exception(str(query.exception()))


def test_every_write_column_keeps_its_value(spark, database, url, wire, staged_copies) -> None:
    """Spark's types of the topic's write columns (TIMESTAMP, MAP<STRING, BINARY> ...) as
    the JVM's Arrow sends them are what the server takes; a read's offset is dropped."""
    _create(database, partitions=2)
    tb = _catalog(spark, url, wire)
    spark.sql(f"INSERT INTO {tb}.main.events SELECT 1 AS partition, 99 AS offset, 7 AS seq_no, "
              "'prod' AS producer_id, 'g1' AS message_group_id, "
              "TIMESTAMP '2024-05-06 07:08:09.123456' AS created_at, "
              "TIMESTAMP '2000-01-01' AS written_at, CAST(NULL AS STRING) AS codec, "
              "CAST('payload' AS BINARY) AS data, "
              "map('k', CAST('v' AS BINARY)) AS metadata")  # fmt: skip
    rows = sql_rows(database, 'SELECT partition, "offset", seq_no, producer_id, '
                    "message_group_id, created_at, CAST(data AS VARCHAR) AS d, metadata "
                    "FROM TOPIC events")  # fmt: skip
    assert len(rows) == 1 and staged_copies
    row = rows[0]
    assert (row["partition"], row["offset"], row["seq_no"], row["producer_id"],
            row["message_group_id"], row["d"]) == (1, 0, 7, "prod", "g1", "payload")
    assert row["created_at"].isoformat().startswith("2024-05-06T07:08:09.123456")
    assert dict(row["metadata"]) == {"k": b"v"}


@pytest.fixture
def frame_bodies(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, pa.Buffer]]:
    """The bodies of the staged frames the server checked: (messages, a copy)."""
    seen: list[tuple[int, pa.Buffer]] = []
    original = staged_refs.check_incoming_frame

    def recording(frame, body, *zstd):
        original(frame, body, *zstd)
        seen.append((frame.record_count, pa.py_buffer(body.to_pybytes())))

    monkeypatch.setattr(staged_refs, "check_incoming_frame", recording)
    return seen


def test_rows_naming_their_partition_go_as_frames_exactly_once(
        spark, database, url, wire, copy_formats, no_flight_puts,
        frame_bodies) -> None:  # fmt: skip
    """Tasks whose rows name their partition group them by partition in the JVM and send
    them as staged frames (``WireFrames``: ``COPY ... (FORMAT frames)``); every row is
    published once, each task's rows in order within a partition, ``seq_no`` and a given
    ``created_at`` kept, a missing one filled; a replayed (sink, batch) publishes nothing.
    1 KiB rows, 5000 a partition: frames cut at the target (4096 rows, 4 MiB) + 904."""
    _create(database, partitions=3)
    tb = _catalog(spark, url, wire)
    frame = spark.range(0, 15000, numPartitions=1).selectExpr(
        "CAST(CONCAT(lpad(CAST(id AS STRING), 8, '0'), repeat('z', 1016)) AS BINARY) AS data",
        "CAST(id % 3 AS INT) AS partition", "id AS seq_no",
        "CASE WHEN id % 2 = 0 THEN TIMESTAMP '2024-05-06 07:08:09.123456' END AS created_at",
    )  # fmt: skip
    before = time.time()
    for _ in range(2):  # raw frames: the fast path below reads uncompressed bodies
        frame.writeTo(f"{tb}.main.events").option("sinkId", "frames-1").option(
            "batchId", "1").option("frameCodec", "raw").append()
    assert copy_formats == ["frames"] * 2  # one task, twice
    rows = sql_rows(database, 'SELECT partition, "offset", seq_no, created_at, '
                    'CAST(data AS VARCHAR) AS d FROM TOPIC events ORDER BY partition, "offset"')
    assert len(rows) == 15000
    assert sorted(r["seq_no"] for r in rows) == list(range(15000))
    for row in rows:
        assert row["seq_no"] % 3 == row["partition"]
        assert row["d"] == f"{row['seq_no']:08d}" + "z" * 1016
        if row["seq_no"] % 2 == 0:
            assert row["created_at"].isoformat().startswith("2024-05-06T07:08:09.123456")
        else:
            assert before - 5 <= row["created_at"].timestamp() <= time.time() + 5
    for partition in range(3):  # the task's rows keep their order within a partition
        assert [r["seq_no"] for r in rows if r["partition"] == partition] == list(
            range(partition, 15000, 3))
    assert _staged(database) == []
    # The JVM's raw bodies have one layout: a read decodes runs of them column by column
    # (``wire_columns``' fast path), as it does pyarrow's; a run mixing the two writers'
    # bodies goes through Arrow frame by frame (as do column-compressed bodies: the
    # default's, round 22).
    assert len(frame_bodies) == 12 and sorted(c for c, _ in frame_bodies) == [904] * 6 + [
        4096] * 6  # fmt: skip
    counts = np.array([c for c, _ in frame_bodies], dtype=np.int64)
    bodies = [b for _, b in frame_bodies]
    fast = decode_wire_bodies(bodies, counts, np.zeros_like(counts), counts)
    assert fast is not None
    assert fast.equals(pa.concat_batches(
        [pa.ipc.read_record_batch(b, WIRE_SCHEMA) for b in bodies]))  # fmt: skip
    mine = serialize_body_buffer(pa.ipc.read_record_batch(bodies[0], WIRE_SCHEMA))
    mixed = decode_wire_bodies([bodies[0], mine], counts[:1].repeat(2), np.zeros(2, np.int64),
                               counts[:1].repeat(2))  # fmt: skip
    assert mixed is None  # the two writers lay their metadata out differently


def test_a_row_frames_cannot_hold_sends_the_rest_of_the_task_as_arrow(
        spark, database, url, wire, copy_formats) -> None:  # fmt: skip
    """A task's rows go as frames until one that a frame cannot hold (here a producer id
    from the 60th row on): the frames' COPY ends and the rest go in an Arrow COPY of the
    same write id; every row once, each partition's rows in the task's order."""
    _create(database, partitions=2)
    tb = _catalog(spark, url, wire)
    frame = spark.range(0, 100, numPartitions=1).selectExpr(
        "CAST(CONCAT('n', id) AS BINARY) AS data", "CAST(id % 2 AS INT) AS partition",
        "id AS seq_no", "CASE WHEN id >= 60 THEN 'p' END AS producer_id")  # fmt: skip
    frame.writeTo(f"{tb}.main.events").append()
    assert copy_formats == ["frames", "arrow"]
    rows = sql_rows(database, 'SELECT partition, seq_no, producer_id FROM TOPIC events '
                    'ORDER BY partition, "offset"')  # fmt: skip
    assert [(r["partition"], r["seq_no"]) for r in rows] == (
        [(0, i) for i in range(0, 100, 2)] + [(1, i) for i in range(1, 100, 2)])
    assert [r["seq_no"] for r in rows if r["producer_id"] == "p"] == (
        list(range(60, 100, 2)) + list(range(61, 100, 2)))
    assert _staged(database) == []


def test_write_frames_false_sends_one_arrow_stream(spark, database, url, wire,
                                                   copy_formats) -> None:  # fmt: skip
    _create(database, partitions=2)
    tb = _catalog(spark, url, wire)
    frame = spark.range(0, 10, numPartitions=1).selectExpr(
        "CAST(CONCAT('a', id) AS BINARY) AS data", "CAST(id % 2 AS INT) AS partition")
    frame.writeTo(f"{tb}.main.events").option("writeFrames", "false").append()
    assert copy_formats == ["arrow"]
    assert sql_rows(database, "SELECT count(*) AS n FROM TOPIC events") == [{"n": 10}]


def test_a_write_mixing_frames_and_arrow_rows_commits_them_in_one_transaction_undecoded(
        spark, database, url, wire, copy_formats, monkeypatch) -> None:  # fmt: skip
    """Review R1-5's fix, through Spark: each of two tasks sends its rows as frames until
    one a frame cannot hold (a producer id from the 300th row of the job on), then the
    rest as Arrow rows under the same write id. The commit publishes each partition's
    frames as staged, then its Arrow rows, in one transaction: nothing decoded, so no
    bound applies (lowered here to 1 byte: before, such a write over the bound, 256 MiB of
    frames by default, failed with 54000 and a retry failed the same way)."""
    from storage import limits, staged_frames

    _create(database, partitions=2)
    tb = _catalog(spark, url, wire)

    def refused(*args, **kwargs):
        raise AssertionError("frames were decoded")

    monkeypatch.setattr(limits, "TRANSACTION_STAGED_BYTES_MAX", 1)
    monkeypatch.setattr(staged_refs, "framed_table", refused)
    monkeypatch.setattr(staged_frames, "decode", refused)
    frame = spark.range(0, 400, numPartitions=2).selectExpr(
        "CAST(CONCAT('n', id) AS BINARY) AS data", "CAST(id % 2 AS INT) AS partition",
        "id AS seq_no", "CASE WHEN id % 200 >= 150 THEN 'p' END AS producer_id")  # fmt: skip
    frame.writeTo(f"{tb}.main.events").option("sinkId", "mixed-1").option(
        "batchId", "1").append()
    assert sorted(copy_formats) == ["arrow", "arrow", "frames", "frames"]
    rows = sql_rows(database, 'SELECT partition, seq_no, producer_id FROM TOPIC events '
                    'ORDER BY partition, "offset"')  # fmt: skip
    assert sorted(r["seq_no"] for r in rows) == list(range(400))
    for partition in range(2):  # each task's rows in its order within a partition
        mine = [r["seq_no"] for r in rows if r["partition"] == partition]
        for task in (range(0, 200), range(200, 400)):
            assert [s for s in mine if s in task] == [s for s in task if s % 2 == partition]
    assert sorted(r["seq_no"] for r in rows if r["producer_id"] == "p") == [
        s for s in range(400) if s % 200 >= 150]
    assert _staged(database) == []


def test_rows_of_any_length_go_as_frames_byte_for_byte(
        spark, database, url, wire, copy_formats, no_flight_puts,
        frame_bodies) -> None:  # fmt: skip
    """Rows of every length through the frames path (the JVM copies each row's bytes
    straight from Spark's row into its partition's pending frame, whose arrays the next
    frames reuse): empty, 10 B to 2 KiB (several frames a partition, cut by bytes), and
    one message over a frame's 4 MiB target (a frame of its own, between others); every
    row's bytes kept, in order."""
    _create(database, partitions=2)
    tb = _catalog(spark, url, wire)
    frame = spark.range(0, 9001, numPartitions=1).selectExpr(
        "CASE WHEN id = 7 THEN '' WHEN id = 4000 THEN repeat('q', 5000000) "
        "ELSE concat(CAST(id AS STRING), '-é€𝄞-', repeat('t', CAST(id % 2048 AS INT))) END "
        "AS text", "CAST(id % 2 AS INT) AS partition", "id AS seq_no",
    ).selectExpr("CAST(text AS BINARY) AS data", "partition", "seq_no")  # fmt: skip
    frame.writeTo(f"{tb}.main.events").option("frameCodec", "raw").append()
    assert copy_formats == ["frames"]
    rows = sql_rows(database, 'SELECT partition, seq_no, data FROM TOPIC events '
                    'ORDER BY partition, "offset"')  # fmt: skip
    expected = {i: (b"" if i == 7 else b"q" * 5000000 if i == 4000 else
                    f"{i}-é€𝄞-{'t' * (i % 2048)}".encode()) for i in range(9001)}  # fmt: skip
    assert len(rows) == 9001
    for row in rows:
        assert row["data"] == expected[row["seq_no"]], row["seq_no"]
    for partition in range(2):
        assert [r["seq_no"] for r in rows if r["partition"] == partition] == list(
            range(partition, 9001, 2))
    assert max(c for c, _ in frame_bodies) < 4096 < len(frame_bodies) * 1000  # cut by bytes
    assert [c for c, b in frame_bodies if b.size > 5000000] == [1]


def test_frame_codec_zstd_compresses_each_message_in_the_jvm_and_reads_back_byte_for_byte(
        spark, database, url, wire, copy_formats, no_flight_puts,
        frame_bodies) -> None:  # fmt: skip
    """``frameCodec=zstd`` (round 17): each message compressed with zstd in the task as
    it is copied from Spark's row, the frames marked codec 4 and checked by the server
    (every message decoded once); reads give the bytes back, in order, whatever their
    length (empty, 10 B-2 KiB, one of 5 MB)."""
    _create(database, partitions=2)
    tb = _catalog(spark, url, wire)
    frame = spark.range(0, 3001, numPartitions=1).selectExpr(
        "CASE WHEN id = 7 THEN '' WHEN id = 2000 THEN repeat('q', 5000000) "
        "ELSE concat(CAST(id AS STRING), '-é€𝄞-', repeat('t', CAST(id % 2048 AS INT))) END "
        "AS text", "CAST(id % 2 AS INT) AS partition", "id AS seq_no",
    ).selectExpr("CAST(text AS BINARY) AS data", "partition", "seq_no")  # fmt: skip
    frame.writeTo(f"{tb}.main.events").option("frameCodec", "zstd").append()
    assert copy_formats == ["frames"]
    bodies = [pa.ipc.read_record_batch(b, WIRE_SCHEMA) for _, b in frame_bodies]
    assert {v for batch in bodies for v in batch.column(4).to_pylist()} == {4}
    sent = sum(len(v) for batch in bodies for v in batch.column(5).to_pylist())
    assert sent < 5_000_000 // 10  # compressed: the 5 MB message alone is ~5 MB raw
    rows = sql_rows(database, 'SELECT partition, seq_no, codec, data FROM TOPIC events '
                    'ORDER BY partition, "offset"')  # fmt: skip
    expected = {i: (b"" if i == 7 else b"q" * 5000000 if i == 2000 else
                    f"{i}-é€𝄞-{'t' * (i % 2048)}".encode()) for i in range(3001)}  # fmt: skip
    assert len(rows) == 3001 and {r["codec"] for r in rows} == {"zstd"}
    for row in rows:
        assert row["data"] == expected[row["seq_no"]], row["seq_no"]
    for partition in range(2):
        assert [r["seq_no"] for r in rows if r["partition"] == partition] == list(
            range(partition, 3001, 2))
    assert _staged(database) == []


def test_frame_codec_zstd_into_a_topic_without_zstd_fails_and_leaves_nothing(
        spark, database, url, wire) -> None:  # fmt: skip
    session = database.connect()
    session.execute("CREATE TOPIC events WITH (min_active_partitions = 2, "
                    "supported_codecs = 'raw')")  # fmt: skip
    session.close()
    tb = _catalog(spark, url, wire)
    frame = spark.range(0, 100, numPartitions=2).selectExpr(
        "CAST(CONCAT('z', id) AS BINARY) AS data", "CAST(id % 2 AS INT) AS partition")
    with pytest.raises(Exception, match=r"22P04|compressed messages"):
        frame.writeTo(f"{tb}.main.events").option("frameCodec", "zstd").append()
    with pytest.raises(Exception, match="frameCodec must be auto, raw, zstd or column"):
        frame.writeTo(f"{tb}.main.events").option("frameCodec", "lz4").append()
    _until_nothing_staged(database)
    assert sql_rows(database, "SELECT count(*) AS n FROM TOPIC events") == [{"n": 0}]


def test_frame_codec_zstd_cuts_frames_by_the_messages_plain_size(
        spark, database, url, wire, frame_bodies, monkeypatch) -> None:  # fmt: skip
    """A frame of zstd messages is cut at the frame target of their plain bytes, not of
    the compressed ones: 40 messages of 512 KiB that compress to ~60 bytes each go as
    frames of 8, each decoding to 4 MiB, within what the server lets a frame declare
    (here 8 MiB: one frame of all 40 would declare 20 MiB and be refused, 54000)."""
    monkeypatch.setattr(limits, "BATCH_BYTES_MAX", 8 * 1024 * 1024)
    _create(database, partitions=1)
    tb = _catalog(spark, url, wire)
    frame = spark.range(0, 40, numPartitions=1).selectExpr(
        "CAST(concat(CAST(id AS STRING), repeat('q', 524280)) AS BINARY) AS data",
        "0 AS partition", "id AS seq_no")  # fmt: skip
    frame.writeTo(f"{tb}.main.events").option("frameCodec", "zstd").append()
    assert [count for count, _ in frame_bodies] == [8] * 5
    rows = sql_rows(database, 'SELECT seq_no, octet_length(data) AS n FROM TOPIC events '
                    'ORDER BY "offset"')  # fmt: skip
    assert [(r["seq_no"], r["n"]) for r in rows] == [
        (i, len(str(i)) + 524280) for i in range(40)]  # fmt: skip


def _codecs_sent(frame_bodies) -> list[int]:
    """The codec of each message of the frames the server checked, in the order sent."""
    return [v for _, body in frame_bodies
            for v in pa.ipc.read_record_batch(body, WIRE_SCHEMA).column(4).to_pylist()]


def _columns_sent(frame_bodies) -> list[bool]:
    """Whether each frame the server checked, in the order sent, had its data column
    compressed whole (``storage.column_codec``)."""
    return [bool((packed := compressed_values(body)) and packed.compressed)
            for _, body in frame_bodies]  # fmt: skip


def test_the_default_compresses_frames_data_columns_for_a_topic_that_takes_raw(
        spark, database, url, wire, copy_formats, frame_bodies) -> None:  # fmt: skip
    """``frameCodec`` defaults to ``auto``; since round 22 a topic that accepts raw
    messages (the default codecs, or raw and gzip) gets frames whose data column is
    compressed whole (``column-auto``), its messages raw; a topic that accepts zstd and not
    raw gets each message zstd-compressed (before round 22: raw after a sample, which it
    refused). All read back byte for byte, with the codec each message was given."""
    _create(database, "events", partitions=2)
    session = database.connect()
    session.execute("CREATE TOPIC plain WITH (min_active_partitions = 2, "
                    "supported_codecs = 'raw,gzip')")  # fmt: skip
    session.execute("CREATE TOPIC zonly WITH (min_active_partitions = 2, "
                    "supported_codecs = 'zstd')")  # fmt: skip
    session.close()
    tb = _catalog(spark, url, wire)
    stats = spark._jvm.io.topicbase.spark.WireWriteStats
    frame = spark.range(0, 3000, numPartitions=1).selectExpr(
        "CAST(concat(lpad(CAST(id AS STRING), 8, '0'), repeat('y', 1016)) AS BINARY) AS data",
        "CAST(id % 2 AS INT) AS partition", "id AS seq_no")  # fmt: skip
    expected = {i: f"{i:08d}".encode() + b"y" * 1016 for i in range(3000)}
    for topic in ("events", "plain"):
        frame_bodies.clear()
        frame.writeTo(f"{tb}.main.{topic}").append()
        assert stats.lastFrameCodec() == "column-auto"
        assert set(_codecs_sent(frame_bodies)) == {1} and len(_codecs_sent(frame_bodies)) == 3000
        assert _columns_sent(frame_bodies) == [True, True]  # one frame a partition
        assert sum(b.size for _, b in frame_bodies) < 3000 * 1024 // 20
    frame_bodies.clear()
    frame.writeTo(f"{tb}.main.zonly").append()
    assert stats.lastFrameCodec() == "zstd"
    assert set(_codecs_sent(frame_bodies)) == {4} and len(_codecs_sent(frame_bodies)) == 3000
    assert copy_formats == ["frames", "frames", "frames"]
    for topic, codec in (("events", "raw"), ("plain", "raw"), ("zonly", "zstd")):
        rows = sql_rows(database, f"SELECT seq_no, codec, data FROM TOPIC {topic}")
        assert len(rows) == 3000 and {r["codec"] for r in rows} == {codec}
        assert all(r["data"] == expected[r["seq_no"]] for r in rows)
    assert _staged(database) == []


# 1 KiB a row of which 832 bytes are hash bytes and 192 one byte: a frame's data column
# compresses to ~82 %, below a frame's bar (7/8), but saves too few bytes for the CPU its
# compression takes (WireFrames.pays).
_MOSTLY_HASHES = ("concat(" + ", ".join(f"unhex(sha2(CAST(id * 16 + {k} AS STRING), 512))"
                                        for k in range(13)) + ", repeat('x', 192))")  # fmt: skip
# 1 KiB of hash bytes a row: zstd cannot shrink it
_HASHES = ("concat(" + ", ".join(f"unhex(sha2(CAST(id * 16 + {k} AS STRING), 512))"
                                 for k in range(16)) + ")")  # fmt: skip


@pytest.mark.parametrize(("data", "default", "column"), [
    (_HASHES, [False] * 3, [False] * 3),  # no frame shrinks to 7/8: each goes plain
    (_MOSTLY_HASHES, [True, False, False], [True] * 3),  # the sample stops the default
])  # fmt: skip
def test_the_default_stops_compressing_once_the_tasks_first_mib_does_not_shrink(
        spark, database, url, wire, frame_bodies, data, default, column) -> None:  # fmt: skip
    """``column-auto`` (the default) compresses frames' data columns while it pays: a frame
    whose values do not come down to 7/8 goes plain, and once the task's first MiB (its
    first frame here: 4,096 rows) took more CPU to compress than the bytes it saved would
    cost to send and store, every later frame goes plain;
    ``frameCodec=column`` compresses every frame that comes down to 7/8. One partition,
    9,000 rows: frames of 4,096, 4,096 and 808 rows. All read back byte for byte, in
    order, codec raw."""
    _create(database, partitions=1)
    tb = _catalog(spark, url, wire)
    frame = spark.range(0, 9000, numPartitions=1).selectExpr(
        f"CAST({data} AS BINARY) AS data", "0 AS partition", "id AS seq_no")
    frame.writeTo(f"{tb}.main.events").append()
    assert [c for c, _ in frame_bodies] == [4096, 4096, 808]
    assert _columns_sent(frame_bodies) == default
    frame_bodies.clear()
    frame.writeTo(f"{tb}.main.events").option("frameCodec", "column").append()
    assert _columns_sent(frame_bodies) == column
    assert _codecs_sent(frame_bodies) == [1] * 9000
    expected = {r["seq_no"]: bytes(r["data"]) for r in frame.collect()}
    rows = sql_rows(database, 'SELECT seq_no, codec, data FROM TOPIC events ORDER BY "offset"')
    assert [r["seq_no"] for r in rows] == 2 * list(range(9000))
    assert all(r["data"] == expected[r["seq_no"]] and r["codec"] == "raw" for r in rows)
    assert _staged(database) == []


def test_frame_codec_level_sets_the_zstd_level(spark, database, url, wire,
                                               frame_bodies) -> None:  # fmt: skip
    """``frameCodecLevel`` (default 1) is the tasks' zstd level: negative levels are
    faster and compress less (text here: level -7 sends more bytes than level 19); a
    value that is not a zstd level fails the write before anything is staged."""
    _create(database, partitions=1)
    tb = _catalog(spark, url, wire)
    frame = spark.range(0, 2000, numPartitions=1).selectExpr(
        "CAST(concat_ws(' ', CAST(id AS STRING), sha2(CAST(id % 97 AS STRING), 256), "
        "'GET /api/v1/orders', CAST(id % 13 AS STRING), 'status', CAST(id % 7 AS STRING)) "
        "AS BINARY) AS data", "0 AS partition", "id AS seq_no")  # fmt: skip
    sent = {}
    for level in ("-7", "19"):
        frame_bodies.clear()
        frame.writeTo(f"{tb}.main.events").option("frameCodec", "zstd").option(
            "frameCodecLevel", level).append()
        assert _codecs_sent(frame_bodies) == [4] * 2000
        sent[level] = sum(len(v) for _, body in frame_bodies
                          for v in pa.ipc.read_record_batch(body, WIRE_SCHEMA).column(5)
                          .to_pylist())  # fmt: skip
    assert sent["19"] < sent["-7"]
    for bad in ("fast", "0", "99"):
        with pytest.raises(Exception, match="frameCodecLevel must be a zstd level"):
            frame.writeTo(f"{tb}.main.events").option("frameCodec", "zstd").option(
                "frameCodecLevel", bad).append()
    _until_nothing_staged(database)
    expected = {r["seq_no"]: bytes(r["data"]) for r in frame.collect()}
    rows = sql_rows(database, "SELECT seq_no, data FROM TOPIC events")
    assert len(rows) == 4000 and all(r["data"] == expected[r["seq_no"]] for r in rows)
