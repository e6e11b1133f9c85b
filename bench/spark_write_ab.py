"""Same-session A/B of the Spark batch write: Parquet against one or more servers' trees.

One SparkSession (``local[2]``, the bench's settings) with one catalog per tree, each
catalog on its own ``topicbase serve`` started from that tree (the server's working
directory is the tree, so ``python -c`` imports that tree's code). Each round writes the
bench's rows (N x 1 KiB, 8 tasks, 4 partitions) as Parquet, then to a fresh topic behind
every tree, the trees' order alternating round by round. Printed per write: wall s, the
driver's COMMIT WRITES s, the server's and the Spark JVM's CPU s; at the end per tree the
ratio to Parquet (Parquet s / wire s) of the medians and per round (median and range),
and ``uptime`` before and after.

Usage (from any tree; loopback only)::

    python -m bench.spark_write_ab --count 200000 --rounds 3 \
        --tree main=/work/main --tree adopt=/tmp/h2wt

``--frame-codec name=zstd`` gives tree ``name``'s writes the option ``frameCodec`` (``raw``,
``zstd``, ``column``; without it the writer's default, ``auto``: since round 22 frames whose
data column is compressed whole, where that saves CPU, for a topic that accepts raw
messages, which a topic's default codecs do); ``--write-option name=key=value`` any
write option (e.g. ``frameCodecLevel``); a tree may be named twice under two names (e.g.
``--tree raw=/tmp/h2wt --tree zstd=/tmp/h2wt --frame-codec raw=raw``). ``--data json``
(or ``text``, ``mixed``) writes JSON log lines instead of the bench's rows
(``bench.spark_bench._rows``). The
codec each write used is printed. The JVM writer is the jar of the tree this runs from,
for every tree: the trees differ in their servers only.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import tempfile
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from bench.demo_spark import PASSWORD, USER, kill_group, start_server
from bench.spark_bench import (
    PARTITIONS,
    _cpu_s,
    _rows,
    _timed,
    codec_used,
    messages_sent,
    spark_builder,
)
from sql.pgwire.users import add_user, default_users_path


def _uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()


def _start(tree: str, data_dir: str) -> tuple[subprocess.Popen, int, int]:
    """A server from ``tree`` (its working directory: ``python -c`` puts it first)."""
    here = os.getcwd()
    os.chdir(tree)
    try:
        return start_server(data_dir)
    finally:
        os.chdir(here)


def session(servers: dict[str, tuple[int, int]], app: str) -> Any:
    """One SparkSession with a catalog ``tb_<name>`` per server (wire and Flight ports)
    and the ``topicbase`` source registered."""
    import spark_sql_ext

    builder = spark_builder(app)
    for name, (wire, flight) in servers.items():
        builder = spark_sql_ext.configure(
            builder, url=f"topicbase://127.0.0.1:{flight}", user=USER, password=PASSWORD,
            catalog=f"tb_{name}", wire_url=f"127.0.0.1:{wire}")  # fmt: skip
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    spark_sql_ext.register(spark)
    return spark


@contextmanager
def served_trees(trees: dict[str, str], prefix: str
                 ) -> Iterator[tuple[dict[str, subprocess.Popen], dict[str, tuple[int, int]], str]]:
    """A server per tree over a fresh data directory (user ``USER``), in a scratch
    directory: yields the processes, their (wire, Flight) ports and the directory;
    stops the servers and removes it after."""
    work = tempfile.mkdtemp(prefix=prefix)
    processes: dict[str, subprocess.Popen] = {}
    ports: dict[str, tuple[int, int]] = {}
    try:
        for name, tree in trees.items():
            data_dir = os.path.join(work, name)
            os.makedirs(data_dir)
            add_user(default_users_path(data_dir), USER, PASSWORD, superuser=True)
            process, wire, flight = _start(tree, data_dir)
            processes[name], ports[name] = process, (wire, flight)
        yield processes, ports, work
    finally:
        for process in processes.values():
            kill_group(process, signal.SIGTERM)
        shutil.rmtree(work, ignore_errors=True)


def print_ratios(seconds: dict[str, list[float]], names: Iterable[str]) -> None:
    """Per tree: Parquet s / wire s of the medians and per round (median and range)."""
    base = seconds["parquet"]
    for name in names:
        runs = seconds[name]
        per_round = [p / t for p, t in zip(base, runs, strict=True)]
        print(f"{name}: ratio of medians {statistics.median(base) / statistics.median(runs):.2f}x;"
              f" per round median {statistics.median(per_round):.2f}x, range "
              f"{min(per_round):.2f}-{max(per_round):.2f}; wire s "
              + " ".join(f"{t:.2f}" for t in runs) + "; parquet s "
              + " ".join(f"{t:.2f}" for t in base))  # fmt: skip


def _execute(flight: int, sql: str) -> None:
    from spark_sql_ext.client import TopicbaseClient

    with TopicbaseClient(f"topicbase://127.0.0.1:{flight}", USER, PASSWORD) as client:
        client.action("execute", {"sql": sql})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--count", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tree", action="append", required=True, help="name=path")
    parser.add_argument("--frame-codec", action="append", default=[], help="name=zstd")
    parser.add_argument("--write-option", action="append", default=[],
                        help="name=key=value: a write option of tree name's writes")
    parser.add_argument("--data", choices=("bench", "json", "text", "mixed"), default="bench",
                        help="the rows written (bench.spark_bench._rows)")
    args = parser.parse_args()
    trees = dict(item.split("=", 1) for item in args.tree)
    extra: dict[str, dict[str, str]] = {name: {} for name in trees}
    for item in args.frame_codec:
        name, codec = item.split("=", 1)
        extra[name]["frameCodec"] = codec
    for item in args.write_option:
        name, key, value = item.split("=", 2)
        extra[name][key] = value
    with served_trees(trees, "topicbase-write-ab-") as (processes, ports, work):
        spark = session(ports, "topicbase-write-ab")
        try:
            _run(spark, args.count, args.rounds, processes, ports, work, extra, args.data)
        finally:
            spark.stop()


def _run(spark: Any, count: int, rounds: int, processes: dict[str, subprocess.Popen],
         ports: dict[str, tuple[int, int]], work: str, extra: dict[str, dict[str, str]],
         data: str) -> None:  # fmt: skip
    parquet = os.path.join(work, "parquet")
    jvm_pid = spark._jvm.java.lang.ProcessHandle.current().pid()
    stats = spark._jvm.io.topicbase.spark.WireWriteStats
    _rows(spark, 1000, data).write.mode("overwrite").parquet(parquet)  # warm up

    def create(flight: int, topic: str) -> None:
        _execute(flight, f"CREATE TOPIC {topic} WITH (min_active_partitions = {PARTITIONS})")

    def write(name: str, rows: int, topic: str) -> None:
        writer = _rows(spark, rows, data).writeTo(f"tb_{name}.main.{topic}")
        for key, value in extra[name].items():
            writer = writer.option(key, value)
        writer.append()

    for name, (_, flight) in ports.items():
        create(flight, "w0")
        write(name, 1000, "w0")
        _execute(flight, "DROP TOPIC w0")
    print(f"start {time.strftime('%H:%M:%S', time.gmtime())} UTC; {_uptime()}", flush=True)
    seconds: dict[str, list[float]] = {"parquet": [], **{name: [] for name in ports}}
    order = list(ports)
    for round_ in range(1, rounds + 1):
        jvm = _cpu_s(jvm_pid)
        seconds["parquet"].append(_timed(
            lambda: _rows(spark, count, data).write.mode("overwrite").parquet(parquet)))
        print(f"round {round_} parquet {seconds['parquet'][-1]:.2f} s, JVM CPU "
              f"{_cpu_s(jvm_pid) - jvm:.2f} s", flush=True)
        for name in order:
            flight = ports[name][1]
            topic = f"w{round_}"
            create(flight, topic)
            server, jvm = _cpu_s(processes[name].pid), _cpu_s(jvm_pid)
            sent = messages_sent(stats)
            seconds[name].append(_timed(lambda name=name, topic=topic: write(name, count, topic)))
            print(f"round {round_} {name} ({codec_used(stats, sent)}) "
                  f"{seconds[name][-1]:.2f} s, COMMIT WRITES "
                  f"{stats.lastCommitSeconds():.2f} s, server CPU "
                  f"{_cpu_s(processes[name].pid) - server:.2f} s, JVM CPU "
                  f"{_cpu_s(jvm_pid) - jvm:.2f} s", flush=True)
            _execute(flight, f"DROP TOPIC {topic}")
        order.reverse()
    print(f"end {time.strftime('%H:%M:%S', time.gmtime())} UTC; {_uptime()}")
    print_ratios(seconds, ports)


if __name__ == "__main__":
    main()
