"""Streaming reads and exactly-once streaming writes: a topic-to-topic query run with
``Trigger.AvailableNow`` in rounds from one checkpoint, a replayed micro-batch, read limits."""

from __future__ import annotations

import os
import shutil

from tests.spark.conftest import finish, sql_rows


def _produce(database, topic: str, start: int, count: int, partitions: int = 2) -> None:
    session = database.connect()
    values = ", ".join(f"('m{i}', {i % partitions})" for i in range(start, start + count))
    session.execute(f"INSERT INTO TOPIC {topic} (data, partition) VALUES {values}")
    session.close()


def _run(spark, options, checkpoint: str, **read_options: str) -> None:
    stream = (spark.readStream.format("topicbase")
              .options(**options, topic="src", columns="partition,offset,data",
                       startingOffsets="earliest", **read_options).load())  # fmt: skip
    query = (stream.selectExpr("data", "CAST(partition AS INT) AS partition")
             .writeStream.format("topicbase")
             .options(**options, topic="dst", sinkId="copy-src")
             .option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start())  # fmt: skip
    finish(query)


def _copied(database) -> list[str]:
    rows = sql_rows(database, "SELECT CAST(data AS VARCHAR) AS d FROM TOPIC dst "
                    "WITH (max_messages = 100000)")  # fmt: skip
    return [r["d"] for r in rows]


def test_stream_resumes_exactly_and_a_replayed_batch_publishes_once(
        spark, database, options, client, tmp_path) -> None:  # fmt: skip
    session = database.connect()
    session.execute("CREATE TOPIC src (CONSUMER pipeline) WITH (min_active_partitions = 2)")
    session.execute("CREATE TOPIC dst WITH (min_active_partitions = 2)")
    session.close()
    checkpoint = str(tmp_path / "checkpoint")
    _produce(database, "src", 0, 500)
    _run(spark, options, checkpoint, maxMessagesPerTrigger="200", consumer="pipeline")
    assert sorted(_copied(database)) == sorted(f"m{i}" for i in range(500))
    commits = sorted(int(n) for n in os.listdir(os.path.join(checkpoint, "commits"))
                     if n.isdigit())  # fmt: skip
    assert commits == [0, 1, 2]  # 500 messages in batches of at most 200
    # The restarted query continues where the checkpoint says, not from "earliest".
    _produce(database, "src", 500, 300)
    _run(spark, options, checkpoint, maxMessagesPerTrigger="200", consumer="pipeline")
    assert sorted(_copied(database)) == sorted(f"m{i}" for i in range(800))
    # A crash after the sink committed batch N but before Spark recorded it: Spark runs
    # batch N again with the same id, and Topicbase publishes nothing the second time.
    last = max(int(n) for n in os.listdir(os.path.join(checkpoint, "commits")) if n.isdigit())
    for name in (str(last), f".{last}.crc"):
        os.remove(os.path.join(checkpoint, "commits", name))
    shutil.rmtree(os.path.join(checkpoint, "state"), ignore_errors=True)
    _run(spark, options, checkpoint, maxMessagesPerTrigger="200", consumer="pipeline")
    copied = _copied(database)
    assert len(copied) == 800 and sorted(copied) == sorted(f"m{i}" for i in range(800))
    assert os.path.exists(os.path.join(checkpoint, "commits", str(last)))  # it ran again
    assert client.action("last_batch", {"sink_id": "copy-src"}) == {"batch_id": last}
    # Per-partition order is kept: dst's partition p holds src's partition p in order.
    for partition in range(2):
        rows = sql_rows(database, "SELECT CAST(data AS VARCHAR) AS d FROM TOPIC dst WITH "
                        f"(partition = {partition}, max_messages = 100000)")  # fmt: skip
        numbers = [int(r["d"][1:]) for r in rows]
        assert numbers == sorted(numbers) and all(n % 2 == partition for n in numbers)
    # The consumer's committed offsets followed the batches (they lag at most one, the
    # last batch of 100 messages after the replay; 50 per partition).
    rows = sql_rows(database, "SELECT partition, committed_offset, end_offset FROM "
                    "sys.consumers WHERE topic = 'src' ORDER BY partition")
    assert [r["end_offset"] for r in rows] == [400, 400]
    assert all(r["committed_offset"] is not None and r["committed_offset"] >= 300
               for r in rows), rows


def test_a_stream_reads_a_split_parent_before_its_children(spark, database, options,
                                                           tmp_path) -> None:  # fmt: skip
    """Across an autopartitioning split (storage's ``TopicLog.split``), a stream with a read
    limit finishes the parent before it reads the children, so every producer's messages
    reach the sink in the order they were written."""
    session = database.connect()
    session.execute("CREATE TOPIC src WITH (auto_partitioning_strategy = 'paused')")
    session.execute("CREATE TOPIC dst")
    topic = database.topic_log(database.catalog.entry("src").topic_id)

    def produce(phase: int) -> None:
        values = ", ".join(f"('{phase}-{i:02d}-k{i % 4}', 'k{i % 4}')" for i in range(40))
        session.execute(f"INSERT INTO TOPIC src (data, producer_id) VALUES {values}")

    produce(0)
    assert topic.split(0) == (1, 2)
    produce(1)  # into the children, by producer id
    session.close()
    assert {p: topic.partition(p).end_offset for p in (0, 1, 2)}[0] == 40
    stream = (spark.readStream.format("topicbase")
              .options(**options, topic="src", columns="partition,offset,data",
                       startingOffsets="earliest", maxMessagesPerTrigger="15").load())  # fmt: skip
    query = (stream.selectExpr("data", "0 AS partition").writeStream.format("topicbase")
             .options(**options, topic="dst", sinkId="split-src")
             .option("checkpointLocation", str(tmp_path / "cp"))
             .trigger(availableNow=True).start())  # fmt: skip
    finish(query)
    rows = sql_rows(database, "SELECT CAST(data AS VARCHAR) AS d FROM TOPIC dst "
                    "WITH (max_messages = 1000) ORDER BY offset")  # fmt: skip
    copied = [r["d"] for r in rows]
    assert sorted(copied) == sorted(f"{p}-{i:02d}-k{i % 4}" for p in (0, 1) for i in range(40))
    for key in ("k0", "k1", "k2", "k3"):
        mine = [d for d in copied if d.endswith(key)]
        assert mine == sorted(mine), mine  # phase 0 (the parent) first, each in order
    # The parent alone filled the first batches: no child was read before its end.
    assert copied[:40] == sorted(copied[:40]) and all(d.startswith("0-") for d in copied[:40])


def test_finish_stops_a_query_still_running_and_fails_saying_so() -> None:
    """``finish`` does not let a test check a running query's partial output: a query
    still running after the wait is stopped and the test fails naming it."""
    import pytest

    from tests.spark import conftest

    class Query:
        name, id = "copy", "q-1"

        def __init__(self, ends: bool, error: str | None = None) -> None:
            self.ends, self.error, self.stopped, self.waited = ends, error, False, None

        def awaitTermination(self, seconds: float) -> bool:  # pyspark's name
            self.waited = seconds
            return self.ends

        def stop(self) -> None:
            self.stopped = True

        def exception(self) -> str | None:
            return self.error

    running = Query(ends=False)
    with pytest.raises(AssertionError, match=r"streaming query copy still ran after 300 s"):
        conftest.finish(running)
    assert running.stopped and running.waited == conftest.QUERY_S == 300.0
    with pytest.raises(AssertionError, match="boom"):
        conftest.finish(Query(ends=True, error="boom"))
    done = Query(ends=True)
    conftest.finish(done)
    assert not done.stopped
