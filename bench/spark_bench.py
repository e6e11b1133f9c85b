"""Spark + Topicbase, next to Spark + Parquet in the same run (``bench.run`` name ``spark``).

Data: N messages of 1 KiB (full 1M, quick 200k) in a topic of 4 partitions behind
``topicbase serve`` (its own process, free loopback ports), and the same rows as Parquet
written by Spark. Figures (rows/s):

- batch write: Spark writes the rows to a topic through the catalog (``writeTo``), in the
  JVM over the PostgreSQL wire: each task stages its rows as partition frames with ``COPY
  ... FROM STDIN (FORMAT frames, WRITE_ID ...)``, the driver publishes them with one
  ``COMMIT WRITES`` (one Spark write and one transaction, also at 1M) — next to Spark
  writing them as Parquet (compressed with Snappy, Spark's default); target >= 1x. The
  headline write is the writer's default (no option: ``frameCodec=auto``, which since
  round 22, for a topic that accepts raw messages, as a topic's default codecs do,
  compresses each frame's data column whole with zstd in the JVM while the task's first
  MiB shows that it saves CPU, the messages raw; readers get the bytes back decoded), as
  Parquet compresses its pages by default; its record's
  note names the codec its tasks used (``describe_codec``). The same write without
  compression (``frameCodec=raw``) is recorded beside it. Medians of five rounds of
  Parquet then the two wire writes (their order alternating round by round), each wire
  run into a fresh topic; the server's and the Spark
  JVM's CPU seconds and the driver's commit per wire write are shown in the progress
  lines.
  Recorded beside it: the Python source's write (tasks stage over Flight, the driver
  commits; ``format("topicbase")``, one run), which also fills the topic the reads use.
  Recorded beside it in the full suite only (no target; round 21): the same rounds on
  JSON log lines (``_rows(kind="json")``: ~1 KiB of ids, hashes and phrases), the
  writer's default and ``frameCodec=raw`` each against Spark's Parquet write of the same
  rows, run last in the group so that no figure above changes (the target's rows are a
  12-digit id and 1,012 ``x``; these say how the write compares on data like a user's).
- batch read: ``sum(length(data))`` and a ``groupBy(partition).count()`` over the topic
  through the catalog (``topicbase.main.bench``: read in the JVM over the PostgreSQL wire,
  ``COPY ... (FORMAT arrow)`` into columnar batches, with column pruning, so the groupBy
  reads ``partition`` only, as Parquet's does) — next to the same over the Parquet files
  (which Spark must read, not answer from metadata); target >= 0.8x. Medians of alternating
  runs. Recorded beside it: the catalog without the wire (``topicbase_flight``: the Python
  source over Flight, pruned) and ``format("topicbase")`` (the Python source, no pruning).
- streaming reshard: the ``reshard`` pipeline (AvailableNow) over the topic.
- Flight DoGet of the whole topic (one client) — next to reading the segment files in
  process (``engine.bulk_read``, after the server stopped).
"""

from __future__ import annotations

import functools
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from typing import Any

from bench.demo_spark import PASSWORD, USER, kill_group, start_server
from spark_sql_ext import pipelines
from spark_sql_ext.client import TopicbaseClient
from sql.pgwire.users import add_user, default_users_path

PARTITIONS = 4
READ_JVM_WRITTEN = ("spark batch read (sum + groupBy), topic written by the JVM writer's "
                    "default (no target)")
READ_ROUNDS = 3  # alternating runs of each read; the medians are recorded
WRITE_ROUNDS = 5  # alternating runs of each write (3 before round 18: too few at load 5-12)


# What ``_write_rounds`` returns: seconds per write, codec labels, CPU seconds.
_Rounds = tuple[dict[str, list[float]], dict[str, list[str]], dict[str, list[float]]]


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of process ``pid`` so far (Linux /proc)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def spark_builder(app_name: str) -> Any:
    """The benches' SparkSession builder (local[2], loopback, UI off, 2 shuffle
    partitions, UTC), with the catalog's jar built (make spark-jar)."""
    from pyspark.sql import SparkSession

    from spark_sql_ext.build_jar import build

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = (SparkSession.builder.master("local[2]").appName(app_name)
               .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.driver.memory", "2g")
               .config("spark.sql.session.timeZone", "UTC"))  # fmt: skip
    build()
    return builder


def _spark(url: str, wire_port: int) -> Any:
    import spark_sql_ext

    builder = spark_builder("topicbase-bench")
    builder = spark_sql_ext.configure(builder, url=url, user=USER, password=PASSWORD,
                                      wire_url=f"127.0.0.1:{wire_port}")  # fmt: skip
    builder = spark_sql_ext.configure(builder, url=url, user=USER, password=PASSWORD,
                                      catalog="topicbase_flight")  # fmt: skip
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    spark_sql_ext.register(spark)
    return spark


def _timed(action: Any) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


# Log-like phrases for the JSON rows (``_rows(kind="json")``): each row picks eighteen.
_PHRASES = ("GET /api/v1/orders?page=2 200 12ms", "POST /api/v1/cart/items 201 48ms",
            "user signed in from a new device", "payment authorised by the card issuer",
            "cache miss for the product catalogue", "retrying the upstream call after 503",
            "session refreshed; token valid for 3600 s", "search query returned 37 results",
            "GET /static/app.js 304 1ms", "order shipped to the warehouse in eu-west-1",
            "slow query on orders_by_user: 812 ms", "rate limit reached for client 4471",
            "checkout started with 3 items", "inventory reserved for sku 99182-b",
            "websocket closed by the client (1001)", "feature flag new-checkout is on")


def _rows(spark: Any, count: int, kind: str = "bench") -> Any:
    """``count`` rows of ~1 KiB messages in 8 tasks, ``partition`` = id mod 4. ``bench``:
    a 12-digit id and 1012 ``x`` (compresses to ~3 %); ``json``: a JSON log line of a
    timestamp, user, server, a SHA-256 request id, eighteen of 16 phrases picked by hash
    and a SHA-512 trace id (~1 KiB; zstd level 1 takes it to ~60 %, Snappy less far: a
    log line's text compresses, its hex ids do not); ``text``: the same without the ids
    and with 24 phrases (~1 KiB, ~45 % after zstd level 1, one message at a time);
    ``mixed``: the bench's rows with 192 hex digits of hashes in place of as many ``x``
    (~1 KiB, ~15 % after zstd)."""
    frame = spark.range(0, count, numPartitions=8)
    partition = f"CAST(id % {PARTITIONS} AS INT) AS partition"
    if kind == "mixed":  # the bench's rows with 192 hex digits of hash in them
        return frame.selectExpr(
            "CAST(concat(lpad(CAST(id AS STRING), 12, '0'), sha2(CAST(id AS STRING), 512), "
            "sha2(CAST(id + 1 AS STRING), 256), repeat('x', 820)) AS BINARY) AS data",
            partition)  # fmt: skip
    if kind == "bench":
        return frame.selectExpr(
            "CAST(concat(lpad(CAST(id AS STRING), 12, '0'), repeat('x', 1012)) AS BINARY) "
            "AS data", partition)  # fmt: skip
    phrases = "array(" + ", ".join(f"'{p}'" for p in _PHRASES) + ")"
    if kind == "text":
        return frame.selectExpr(
            "CAST(concat('{\"ts\":\"', CAST(timestamp_seconds(1795000000 + id DIV 50) AS "
            "STRING), '.', lpad(CAST(pmod(hash(id, 1), 1000000) AS STRING), 6, '0'), "
            "'Z\",\"user\":\"u', CAST(pmod(hash(id, 2), 100000) AS STRING), "
            "'\",\"server\":\"s', CAST(id % 8 AS STRING), "
            f"'\",\"events\":[\"', array_join(transform(sequence(1, 24), "
            f"k -> element_at({phrases}, pmod(hash(id, k), 16) + 1)), '\",\"'), "
            "'\"]}') AS BINARY) AS data", partition)  # fmt: skip
    assert kind == "json", kind
    return frame.selectExpr(
        "CAST(concat('{\"ts\":\"', CAST(timestamp_seconds(1795000000 + id DIV 50) AS STRING), "
        "'.', lpad(CAST(pmod(hash(id, 1), 1000000) AS STRING), 6, '0'), "
        "'Z\",\"user\":\"u', CAST(pmod(hash(id, 2), 100000) AS STRING), "
        "'\",\"server\":\"s', CAST(id % 8 AS STRING), "
        "'\",\"req\":\"', sha2(CAST(id AS STRING), 256), "
        f"'\",\"events\":[\"', array_join(transform(sequence(1, 18), "
        f"k -> element_at({phrases}, pmod(hash(id, k), 16) + 1)), '\",\"'), "
        "'\"],\"trace\":\"', sha2(CAST(id + 7 AS STRING), 512), '\"}') AS BINARY) AS data",
        partition)  # fmt: skip


def describe_codec(policy: str, zstd: int, raw: int, column: int = 0) -> str:
    """What a wire write's frames were: ``policy`` (``WireWriteStats.lastFrameCodec``: the
    ``frameCodec`` the driver resolved, raw, zstd, auto, column or column-auto) and the
    messages its tasks sent zstd-compressed and raw, and of the raw ones those in frames
    whose data column was compressed whole (``zstdMessagesSent``/``rawMessagesSent``/
    ``columnMessagesSent`` deltas: the tasks run in the driver's JVM in local mode)."""
    if column:
        total = zstd + raw
        used = ("column zstd" if column == total
                else f"column zstd {100 * column / total:.0f} %, the rest uncompressed")
        if zstd:
            used += f" (zstd {100 * zstd / total:.0f} %)"
    elif zstd and raw:
        used = f"zstd {100 * zstd / (zstd + raw):.0f} %, raw the rest"
    else:
        used = "zstd" if zstd else "raw" if raw else "no frames"
    return f"frameCodec {policy or '?'}: {used}"


def messages_sent(stats: Any) -> tuple[int, int, int]:
    """The JVM's message counts (zstd, raw, raw in column-compressed frames) so far; the
    last 0 with a jar from before round 22 (no ``columnMessagesSent``)."""
    try:
        column = int(stats.columnMessagesSent())
    except Exception:  # py4j: the method does not exist in an older jar
        column = 0
    return int(stats.zstdMessagesSent()), int(stats.rawMessagesSent()), column


def codec_used(stats: Any, before: tuple[int, ...]) -> str:
    """``describe_codec`` of the write just done, given ``stats`` (the JVM's
    ``WireWriteStats``) and its message counts ``before`` it (``messages_sent``)."""
    now = messages_sent(stats)
    column = now[2] - before[2] if len(before) > 2 else 0
    return describe_codec(stats.lastFrameCodec(), now[0] - before[0], now[1] - before[1],
                          column)  # fmt: skip


def _same(labels: list[str]) -> str:
    """The runs' codec labels, once when they agree."""
    return labels[0] if len(set(labels)) == 1 else "; ".join(labels)


def _scan(frame: Any) -> None:
    frame.selectExpr("sum(length(data))").collect()
    frame.groupBy("partition").count().collect()


def run(recorder: Any) -> None:
    count = 1_000_000 if recorder.suite == "full" else 200_000
    # The Python source stages Arrow streams, whose commit may write at most 64 MiB (and
    # 100,000 messages) to one partition in one transaction: a bigger write would go in
    # parts (engine.bulk_publish); several Spark writes keep each one atomic. The JVM
    # writer stages partition frames, which one transaction commits whatever their size
    # (engine.commit ``_check_publishable``): one Spark write, as Parquet's.
    chunk = PARTITIONS * 60_000
    work = tempfile.mkdtemp(prefix="topicbase-spark-bench-")
    data_dir = os.path.join(work, "data")
    os.makedirs(data_dir)
    add_user(default_users_path(data_dir), USER, PASSWORD, superuser=True)
    server, wire_port, port = start_server(data_dir)
    url = f"topicbase://127.0.0.1:{port}"
    options = {"url": url, "user": USER, "password": PASSWORD}
    spark = _spark(url, wire_port)
    json_writes: _Rounds | None = None
    try:
        with TopicbaseClient(url, USER, PASSWORD) as client:
            client.action("execute", {"sql": f"CREATE TOPIC bench WITH (min_active_partitions "
                                              f"= {PARTITIONS})"})  # fmt: skip
            client.action("execute", {"sql": "CREATE TOPIC bench_by_key WITH "
                                              "(min_active_partitions = 2)"})  # fmt: skip
        recorder.progress(f"spark: writing {count:,} x 1 KiB rows as Parquet and to a topic")
        parquet = os.path.join(work, "parquet")
        _rows(spark, 1000).write.mode("overwrite").parquet(parquet)  # warm up
        execute = functools.partial(_execute, url)
        execute(f"CREATE TOPIC bench_w0 WITH (min_active_partitions = {PARTITIONS})")
        _rows(spark, 1000).writeTo("topicbase.main.bench_w0").append()  # warm up
        _rows(spark, 1000).writeTo("topicbase.main.bench_w0").option("frameCodec", "raw").append()
        execute("DROP TOPIC bench_w0")
        jvm_pid = spark._jvm.java.lang.ProcessHandle.current().pid()
        stats = spark._jvm.io.topicbase.spark.WireWriteStats
        rounds = functools.partial(_write_rounds, recorder, spark, execute, stats, jvm_pid,
                                   server.pid, count)  # fmt: skip
        writes, used, _ = rounds("bench", parquet, "bench_w", "")
        median = {name: statistics.median(times) for name, times in writes.items()}
        _record_pair(recorder, "batch write", count, median["wire"], median["parquet"], 1.0,
                     writes["wire"], writes["parquet"],
                     note=f"the writer's default ({_same(used['wire'])}; Parquet compresses "
                          "with Snappy); frameCodec=raw is the next record")  # fmt: skip
        recorder.add("spark batch write, raw frames (frameCodec=raw: no compression)",
                     count / median["raw"], "msgs/s", group="spark",
                     baseline="Spark Parquet batch write",
                     baseline_value=count / median["parquet"],
                     note=_same(used["raw"]))  # fmt: skip

        def write_topic() -> None:
            for start in range(0, count, chunk):
                size = min(chunk, count - start)
                (_rows(spark, size).write.format("topicbase").options(**options, topic="bench")
                 .mode("append").save())  # fmt: skip

        python_write = _timed(write_topic)
        recorder.progress(f"spark: Python source write {python_write:.2f} s")
        recorder.add("spark batch write, format(topicbase) (Python source over Flight)",
                     count / python_write, "msgs/s", group="spark",
                     baseline="Spark Parquet batch write",
                     baseline_value=count / median["parquet"])  # fmt: skip
        # The same rows written by the JVM writer's default (one Spark write): frames whose
        # data column is compressed whole, which the wire read gets as stored (round 23);
        # read beside the target's topic (the Python source's raw frames), no target.
        execute(f"CREATE TOPIC bench_jvm WITH (min_active_partitions = {PARTITIONS})")
        _rows(spark, count).writeTo("topicbase.main.bench_jvm").append()
        recorder.progress("spark: batch reads")
        topic = spark.read.format("topicbase").options(**options, topic="bench",
                                                       columns="partition,data")
        _scan(spark.read.parquet(parquet))  # warm up both paths once
        _scan(topic.option("endingOffsets", '{"0": 1000, "1": 1000, "2": 1000, "3": 1000}')
              .load())  # fmt: skip
        topic = spark.read.format("topicbase").options(**options, topic="bench",
                                                       columns="partition,data")
        _scan(spark.table("topicbase.main.bench"))
        _scan(spark.table("topicbase.main.bench_jvm"))
        _scan(spark.table("topicbase_flight.main.bench"))
        # Through the catalog, the Spark SQL path (column pruning: the groupBy reads no
        # message): over the wire in the JVM, and over Flight through the Python source;
        # then the data source itself (no pruning: both scans read data). Alternating.
        reads: dict[str, list[float]] = {"parquet": [], "wire": [], "wire_jvm": [], "flight": [],
                                          "format": []}  # fmt: skip
        for _ in range(READ_ROUNDS):
            reads["parquet"].append(_timed(lambda: _scan(spark.read.parquet(parquet))))
            reads["wire"].append(_timed(lambda: _scan(spark.table("topicbase.main.bench"))))
            reads["wire_jvm"].append(_timed(
                lambda: _scan(spark.table("topicbase.main.bench_jvm"))))  # fmt: skip
            reads["flight"].append(_timed(
                lambda: _scan(spark.table("topicbase_flight.main.bench"))))
            reads["format"].append(_timed(lambda: _scan(topic.load())))
        median = {name: statistics.median(times) for name, times in reads.items()}
        recorder.progress("spark: batch read seconds (parquet, wire, flight catalog, format): "
                          + "; ".join(f"{name} " + " ".join(f"{t:.2f}" for t in times)
                                      for name, times in reads.items()))  # fmt: skip
        _record_pair(recorder, "batch read (sum + groupBy)", count, median["wire"],
                     median["parquet"], 0.8, reads["wire"], reads["parquet"])  # fmt: skip
        recorder.add(READ_JVM_WRITTEN, count / median["wire_jvm"], "msgs/s", group="spark",
                     baseline="Spark Parquet batch read (sum + groupBy)",
                     baseline_value=count / median["parquet"],
                     spread=(count / max(reads["wire_jvm"]), count / min(reads["wire_jvm"])),
                     baseline_spread=(count / max(reads["parquet"]),
                                      count / min(reads["parquet"])),
                     note="the same rows as the target's read, written by the JVM writer's "
                          "default (frames whose data column is zstd-compressed whole, sent "
                          "as stored and decoded in the task); the target's topic holds the "
                          "Python source's raw frames")  # fmt: skip
        recorder.add("spark batch read (sum + groupBy), catalog over Flight (Python source)",
                     count / median["flight"], "msgs/s", group="spark")  # fmt: skip
        recorder.add("spark batch read (sum + groupBy), format(topicbase), no pruning",
                     count / median["format"], "msgs/s", group="spark")  # fmt: skip
        recorder.progress("spark: streaming reshard")
        connection = pipelines.Connection(url, USER, PASSWORD)
        reshard_s = _timed(lambda: pipelines.reshard(
            spark, connection, "bench", "bench_by_key", "k", os.path.join(work, "cp"),
            max_per_trigger=100_000).awaitTermination())  # fmt: skip
        recorder.add("spark streaming reshard", count / reshard_s, "msgs/s", group="spark")
        recorder.progress("spark: Flight DoGet")
        with TopicbaseClient(url, USER, PASSWORD) as client:
            doget_s = _timed(lambda: client.read_all({"topic": "bench", "columns": ["data"]}))
        if recorder.suite == "full":  # the quick suite's 200k took 64 s more (load 11-12)
            json_writes = _json_writes(recorder, spark, execute, rounds, count, work)
    finally:
        spark.stop()
        kill_group(server, signal.SIGTERM)
    segments_s = _read_segments(data_dir)
    recorder.add("Flight DoGet of the topic (1 client)", count / doget_s, "msgs/s", group="spark",
                 baseline="segment files read in process", baseline_value=count / segments_s)
    if json_writes is not None:
        record_json_writes(recorder, count, *json_writes)
    shutil.rmtree(work, ignore_errors=True)


def _json_writes(recorder: Any, spark: Any, execute: Any, rounds: Any, count: int,
                 work: str) -> _Rounds:
    """The target's write rounds (``rounds``: ``_write_rounds`` with all but its data bound)
    on JSON log lines (``_rows(kind="json")``), after a warm-up of each write on them; run
    last in the group, so that nothing measured before changes."""
    started = time.perf_counter()
    recorder.progress(f"spark: writing {count:,} JSON log lines as Parquet and to topics "
                      "(no target)")  # fmt: skip
    parquet_json = os.path.join(work, "parquet_json")
    _rows(spark, 1000, "json").write.mode("overwrite").parquet(parquet_json)  # warm up
    execute(f"CREATE TOPIC json_w0 WITH (min_active_partitions = {PARTITIONS})")
    _rows(spark, 1000, "json").writeTo("topicbase.main.json_w0").append()  # warm up
    (_rows(spark, 1000, "json").writeTo("topicbase.main.json_w0")
     .option("frameCodec", "raw").append())  # fmt: skip
    execute("DROP TOPIC json_w0")
    json_writes = rounds("json", parquet_json, "json_w", "JSON ")
    shutil.rmtree(parquet_json, ignore_errors=True)
    recorder.progress(f"spark: JSON log lines' writes took "
                      f"{time.perf_counter() - started:.1f} s")  # fmt: skip
    return json_writes


def _write_rounds(recorder: Any, spark: Any, execute: Any, stats: Any, jvm_pid: int,
                  server_pid: int, count: int, data: str, parquet: str, prefix: str,
                  label: str) -> _Rounds:  # fmt: skip
    """``WRITE_ROUNDS`` rounds of ``count`` rows of ``_rows(kind=data)``: Spark's Parquet
    write to ``parquet``, then the writer's default and ``frameCodec=raw`` (their order
    alternating round by round), each into a fresh topic ``{prefix}{round}_{kind}``
    dropped after. Returns each write's seconds (``parquet``, ``wire``, ``raw``), the
    wire writes' codec labels and CPU seconds (``jvm``/``server`` per wire write, in
    ``{kind}_jvm``/``{kind}_server``; Parquet's JVM CPU in ``parquet_jvm``); the progress
    lines start ``spark: {label}wire write``."""
    writes: dict[str, list[float]] = {"parquet": [], "wire": [], "raw": []}
    used: dict[str, list[str]] = {"wire": [], "raw": []}
    cpu: dict[str, list[float]] = {"parquet_jvm": [], "wire_jvm": [], "wire_server": [],
                                   "raw_jvm": [], "raw_server": []}  # fmt: skip
    for round_ in range(1, WRITE_ROUNDS + 1):
        parquet_cpu = _cpu_s(jvm_pid)
        writes["parquet"].append(_timed(lambda: _rows(spark, count, data).write
                                        .mode("overwrite").parquet(parquet)))  # fmt: skip
        parquet_cpu = _cpu_s(jvm_pid) - parquet_cpu
        cpu["parquet_jvm"].append(parquet_cpu)
        kinds = (("wire", None), ("raw", "raw"))
        for kind, codec in kinds if round_ % 2 else kinds[::-1]:  # the order alternates
            name = f"{prefix}{round_}_{kind}"
            execute(f"CREATE TOPIC {name} WITH (min_active_partitions = {PARTITIONS})")
            server_cpu, jvm_cpu, commit_s = _cpu_s(server_pid), _cpu_s(jvm_pid), 0.0
            sent = messages_sent(stats)

            def write_wire(name: str = name, codec: str | None = codec) -> None:
                nonlocal commit_s
                writer = _rows(spark, count, data).writeTo(f"topicbase.main.{name}")
                if codec is not None:  # else the writer's default
                    writer = writer.option("frameCodec", codec)
                writer.append()
                commit_s += stats.lastCommitSeconds()

            writes[kind].append(_timed(write_wire))
            used[kind].append(codec_used(stats, sent))
            cpu[f"{kind}_server"].append(_cpu_s(server_pid) - server_cpu)
            cpu[f"{kind}_jvm"].append(_cpu_s(jvm_pid) - jvm_cpu)
            recorder.progress(
                f"spark: {label}wire write {round_} ({used[kind][-1]}): "
                f"{writes[kind][-1]:.2f} s (Parquet "
                f"{writes['parquet'][-1]:.2f} s, its JVM CPU {parquet_cpu:.2f} s); server "
                f"CPU {cpu[f'{kind}_server'][-1]:.2f} s, Spark JVM CPU "
                f"{cpu[f'{kind}_jvm'][-1]:.2f} s, driver's COMMIT WRITES "
                f"{commit_s:.2f} s")  # fmt: skip
            execute(f"DROP TOPIC {name}")
    return writes, used, cpu


JSON_WRITE = "spark batch write, JSON log lines (writer's default; no target)"
JSON_WRITE_RAW = "spark batch write, JSON log lines, frameCodec=raw (no target)"
JSON_BASELINE = "Spark Parquet batch write of the same JSON log lines"


def record_json_writes(recorder: Any, count: int, writes: dict[str, list[float]],
                       used: dict[str, list[str]], cpu: dict[str, list[float]]) -> None:
    """The records of the JSON log lines' writes (``_rows(kind="json")``: ~1 KiB, ids and
    hashes), beside the target's: the writer's default and ``frameCodec=raw``, each
    against Spark's Parquet write of the same rows in the same rounds (``writes``: seconds
    per round, as ``_write_rounds`` returns them). No target: the issue's target is on
    the bench's rows; these say how the write compares on data like a user's."""
    assert len(writes["parquet"]) == len(writes["wire"]) == len(writes["raw"]) > 0, writes
    parquet = writes["parquet"]
    for kind, name in (("wire", JSON_WRITE), ("raw", JSON_WRITE_RAW)):
        runs = writes[kind]
        recorder.add(name, count / statistics.median(runs), "msgs/s", group="spark",
                     baseline=JSON_BASELINE,
                     baseline_value=count / statistics.median(parquet),
                     spread=(count / max(runs), count / min(runs)),
                     baseline_spread=(count / max(parquet), count / min(parquet)),
                     ratio_range=(min(p / t for p, t in zip(parquet, runs, strict=True)),
                                  max(p / t for p, t in zip(parquet, runs, strict=True))),
                     reps=len(runs),
                     note=f"JSON log lines (~1 KiB: ids, hashes, phrases); no target; "
                          f"{_same(used[kind])}; CPU s per write, medians: Spark JVM "
                          f"{statistics.median(cpu[f'{kind}_jvm']):.2f}, server "
                          f"{statistics.median(cpu[f'{kind}_server']):.2f}, Parquet's JVM "
                          f"{statistics.median(cpu['parquet_jvm']):.2f}")  # fmt: skip


def _read_segments(data_dir: str) -> float:
    from engine.database import Database

    # (the open fixes glibc's thresholds as topicbase serve does: engine.malloc_tuning)
    database = Database.open(data_dir, retention_interval_s=None)
    session = database.connect()
    try:
        started = time.perf_counter()
        for offsets in session.bulk_cut("bench"):
            for _ in session.bulk_read("bench", offsets, ["data"]):
                pass
        return time.perf_counter() - started
    finally:
        session.close()
        database.close()


def _execute(url: str, sql: str) -> None:
    with TopicbaseClient(url, USER, PASSWORD) as client:
        client.action("execute", {"sql": sql})


def _record_pair(recorder: Any, name: str, count: int, topic_s: float, parquet_s: float,
                 target: float, topic_runs: list[float] | None = None,
                 parquet_runs: list[float] | None = None,
                 note: str | None = None) -> None:  # fmt: skip
    ratio = parquet_s / topic_s
    spreads: dict[str, Any] = {}
    if topic_runs and parquet_runs:
        spreads = {"spread": (count / max(topic_runs), count / min(topic_runs)),
                   "baseline_spread": (count / max(parquet_runs), count / min(parquet_runs)),
                   "ratio_range": (min(p / t for p, t in zip(parquet_runs, topic_runs,
                                                             strict=True)),
                                   max(p / t for p, t in zip(parquet_runs, topic_runs,
                                                             strict=True))),
                   "reps": len(topic_runs)}  # fmt: skip
    recorder.add(f"spark {name}", count / topic_s, "msgs/s", group="spark",
                 baseline=f"Spark Parquet {name}", baseline_value=count / parquet_s,
                 target=f">= {target}x Parquet", met=ratio >= target, note=note,
                 **spreads)  # fmt: skip
