"""Batch reads and exactly-once batch writes of the ``topicbase`` source in real Spark."""

from __future__ import annotations

import json
import time

import pyarrow as pa
import pytest

from tests.spark.conftest import sql_rows


def _fill(database, topic: str = "events", partitions: int = 2, rows: int = 300) -> None:
    session = database.connect()
    session.execute(f"CREATE TOPIC {topic} WITH (min_active_partitions = {partitions})")
    for index in range(partitions if rows else 0):
        values = ", ".join(f"('{{\"user\": \"u{i % 7}\", \"n\": {i}}}', 'srv-{index}', "
                           f"{i + 1}, {index})" for i in range(rows))
        session.execute(f"INSERT INTO TOPIC {topic} (data, producer_id, seq_no, partition) "
                        f"VALUES {values}")
    session.close()


def test_batch_read_equals_a_sql_read_of_the_same_cut(spark, database, options) -> None:
    _fill(database)
    frame = spark.read.format("topicbase").options(**options, topic="events",
                                                   splitRows="128").load()
    assert frame.rdd.getNumPartitions() == 6  # 2 partitions x ceil(300 / 128)
    got = [r.asDict() for r in frame.orderBy("partition", "offset").collect()]
    expected = []
    for partition in range(2):
        expected += sql_rows(database, 'SELECT partition, "offset", seq_no, producer_id, '
                             "message_group_id, created_at, written_at, CAST(codec AS VARCHAR) "
                             "AS codec, data, metadata FROM TOPIC events WITH (partition = "
                             f"{partition}, max_messages = 1000) ORDER BY 2")
    assert len(got) == 600
    for row in expected:
        row["created_at"] = row["created_at"].replace(tzinfo=None)
        row["written_at"] = row["written_at"].replace(tzinfo=None)
        row["metadata"] = dict(row["metadata"] or [])
    for row in got:
        row["data"] = bytes(row["data"])
        row["metadata"] = dict(row["metadata"] or {})
    assert got == expected
    assert frame.schema.simpleString().startswith("struct<partition:int,offset:bigint,seq_no:")


def test_columns_offsets_and_pushed_filters(spark, database, options) -> None:
    _fill(database)
    def reader():  # a DataFrameReader keeps the options set on it: one per read
        return spark.read.format("topicbase").options(**options, topic="events",
                                                      columns="partition,offset,data",
                                                      pushFilters="true")

    frame = reader().option("startingOffsets", json.dumps({"0": 290, "1": -2})).option(
        "endingOffsets", json.dumps({"0": -1, "1": 5})).load()
    assert frame.columns == ["partition", "offset", "data"]
    assert sorted((r.partition, r.offset) for r in frame.collect()) == [
        *[(0, o) for o in range(290, 300)], *[(1, o) for o in range(5)]]
    full = reader().load()
    narrowed = full.where("partition = 1 AND offset >= 100 AND offset < 103")
    assert narrowed.rdd.getNumPartitions() == 1  # pushed: only partition 1's range is read
    assert [r.offset for r in narrowed.orderBy("offset").collect()] == [100, 101, 102]
    users = reader().load().selectExpr("get_json_object(CAST(data AS STRING), '$.user') AS user")
    counts = {r.user: r["count"] for r in users.groupBy("user").count().collect()}
    assert sum(counts.values()) == 600 and set(counts) == {f"u{i}" for i in range(7)}


def test_a_table_reads_through_sql(spark, database, options) -> None:
    session = database.connect()
    session.execute("CREATE TABLE t (k VARCHAR, n BIGINT); INSERT INTO t VALUES ('a', 1), ('b', 2)")
    session.close()
    frame = spark.read.format("topicbase").options(**options, table="t").load()
    assert sorted((r.k, r.n) for r in frame.collect()) == [("a", 1), ("b", 2)]


def test_batch_write_to_a_topic_and_a_table_exactly_once(spark, database, options, client
                                                        ) -> None:  # fmt: skip
    _fill(database, topic="out", partitions=2, rows=0)
    session = database.connect()
    session.execute("CREATE TABLE totals (k VARCHAR, n BIGINT)")
    session.close()
    frame = spark.range(0, 5000, numPartitions=4).selectExpr(
        "CAST(concat('m', id) AS BINARY) AS data", "'p' || (id % 3) AS producer_id",
        "id + 1 AS seq_no", "CAST(id % 2 AS INT) AS partition")
    frame.write.format("topicbase").options(**options, topic="out").mode("append").save()
    stats = sql_rows(database, "SELECT partition, count(*) AS n, count(DISTINCT data) AS d "
                     "FROM TOPIC out WITH (max_messages = 100000) GROUP BY 1 ORDER BY 1")
    assert stats == [{"partition": 0, "n": 2500, "d": 2500}, {"partition": 1, "n": 2500, "d": 2500}]
    spark.createDataFrame([("a", 1), ("b", 2)], "k STRING, n BIGINT").write.format(
        "topicbase").options(**options, table="totals").mode("append").save()
    assert sql_rows(database, "SELECT * FROM totals ORDER BY k") == [
        {"k": "a", "n": 1}, {"k": "b", "n": 2}]
    assert client.staged() == []


def test_a_failed_task_aborts_and_leaves_nothing_staged(spark, database, options, client
                                                        ) -> None:  # fmt: skip
    _fill(database, topic="out", partitions=1, rows=0)
    frame = spark.range(0, 1000, numPartitions=3).selectExpr(
        "CAST(concat('m', id) AS BINARY) AS data",
        "CASE WHEN id = 900 THEN raise_error('task failure on purpose') ELSE id END AS seq_no")
    with pytest.raises(Exception, match="task failure on purpose"):
        frame.write.format("topicbase").options(**options, topic="out").mode("append").save()
    assert client.staged() == []
    assert sql_rows(database, "SELECT count(*) AS n FROM TOPIC out") == [{"n": 0}]


def test_a_replayed_driver_commit_publishes_once(spark, database, options, client) -> None:
    """The writer Spark pickles is the one whose commit runs: committing it again (the
    driver's commit replayed after a crash) publishes nothing more."""
    from pyspark.sql.types import StructType

    from spark_sql_ext.datasource import StagedMessage, TopicbaseDataSource

    _fill(database, topic="out", partitions=1, rows=0)
    source = TopicbaseDataSource({**options, "topic": "out"})
    writer = source.writer(StructType.fromDDL("data BINARY"), False)
    batch = pa.record_batch({"data": pa.array([b"x", b"y"])})
    ids = [writer.write(iter([batch])), writer.write(iter([batch]))]
    assert all(isinstance(m, StagedMessage) and m.rows == 2 for m in ids)
    writer.commit(ids)
    assert writer.last_outcome == {"status": "committed", "rows": 4}
    writer.commit(ids)
    assert writer.last_outcome == {"status": "duplicate", "rows": 0}
    assert sql_rows(database, "SELECT count(*) AS n FROM TOPIC out") == [{"n": 4}]


def test_reads_work_with_spark_filter_pushdown_off(spark, database, options) -> None:
    """Spark's default: pushdown off. The plain reader (no pushFilters) must serve it."""
    _fill(database, partitions=1, rows=5)
    spark.conf.set("spark.sql.python.filterPushdown.enabled", "false")
    try:
        frame = spark.read.format("topicbase").options(**options, topic="events").load()
        assert sorted(r.offset for r in frame.where("offset > 2").collect()) == [3, 4]
    finally:
        spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")


@pytest.mark.parametrize("zone", ["UTC", "America/New_York"])
def test_written_at_pushdown_narrows_the_ranges_and_loses_nothing(spark, database, options,
                                                                  zone) -> None:  # fmt: skip
    """``written_at >= t`` (pushed) starts each range at the first message written at or
    after ``t``: fewer tasks, the same rows as Spark's own filter, whatever the session's
    time zone (Spark hands the source the instant; a wall-clock reading would shift it)."""
    session = database.connect()
    session.execute("CREATE TOPIC events")
    session.execute("INSERT INTO TOPIC events (data) VALUES " + ", ".join(
        f"('early-{i}')" for i in range(5)))  # fmt: skip
    session.close()
    time.sleep(0.01)
    session = database.connect()
    session.execute("INSERT INTO TOPIC events (data) VALUES " + ", ".join(
        f"('late-{i}')" for i in range(5)))  # fmt: skip
    session.close()
    written = sql_rows(database, 'SELECT written_at FROM TOPIC events WHERE "offset" = 5')
    moment_us = round(written[0]["written_at"].timestamp() * 1_000_000)
    previous = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", zone)
    try:
        frame = spark.read.format("topicbase").options(
            **options, topic="events", splitRows="1", pushFilters="true").load().where(
            f"written_at >= timestamp_micros({moment_us})")  # an instant, in any zone
        assert sorted(r.offset for r in frame.collect()) == [5, 6, 7, 8, 9]
        assert frame.rdd.getNumPartitions() == 5  # one task a message, from offset 5 on
    finally:
        spark.conf.set("spark.sql.session.timeZone", previous)
