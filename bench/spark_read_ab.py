"""Same-session A/B of the Spark batch read: Parquet against one or more servers' trees.

One SparkSession (``local[2]``, the bench's settings) with one catalog per tree, each on its
own ``topicbase serve`` started from that tree (``bench.spark_write_ab._start``). Every
server's topic ``bench`` is filled as ``bench.spark_bench`` fills it (the Python source's
writes of 240k rows, N x 1 KiB, 4 partitions: stored as raw frames), or, for a tree named
in ``--fill NAME=jvm``, by one write of the JVM writer's default through that tree's
catalog (``frameCodec`` auto: on these rows frames whose data column is zstd-compressed
whole, ``storage.column_codec``); the same tree may be given twice under two names to
read both kinds in one session. Parquet is written once; then each round
runs the bench's scan (``sum(length(data))`` and ``groupBy(partition).count()``) over the
Parquet files and over every tree's catalog (``topicbase.main.bench`` read in the JVM over
the wire), the trees' order alternating round by round. Printed per scan: wall s, the
server's and the Spark JVM's CPU s; at the end per tree the ratio to Parquet (Parquet s /
wire s) of the medians and per round (median and range), and ``uptime``.

Usage (from any tree; loopback only; the JVM reader is the jar of the tree this runs
from, for every tree: the trees differ in their servers only)::

    python -m bench.spark_read_ab --count 1000000 --rounds 5 \
        --tree main=/work/main --tree new=/tmp/h3wt
"""

from __future__ import annotations

import argparse
import os
import subprocess
import time
from typing import Any

from bench.demo_spark import PASSWORD, USER
from bench.spark_bench import PARTITIONS, _cpu_s, _rows, _scan, _timed
from bench.spark_write_ab import _execute, _uptime, print_ratios, served_trees, session

CHUNK = PARTITIONS * 60_000  # the bench's Python-source writes (bench.spark_bench.run)


FILLS = ("python", "jvm")


def _fill(spark: Any, flight: int, count: int, fill: str = "python", catalog: str = "") -> None:
    """The topic ``bench``: ``python`` as the bench writes it (the Python source, 240k rows
    a write: raw frames); ``jvm`` one write of the JVM writer's default through
    ``catalog`` (column-compressed frames on these rows)."""
    assert fill in FILLS, fill
    _execute(flight, f"CREATE TOPIC bench WITH (min_active_partitions = {PARTITIONS})")
    if fill == "jvm":
        _rows(spark, count).writeTo(f"{catalog}.main.bench").append()
        return
    options = {"url": f"topicbase://127.0.0.1:{flight}", "user": USER, "password": PASSWORD}
    for start in range(0, count, CHUNK):
        (_rows(spark, min(CHUNK, count - start)).write.format("topicbase")
         .options(**options, topic="bench").mode("append").save())  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--count", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tree", action="append", required=True, help="name=path")
    parser.add_argument(
        "--fill",
        action="append",
        default=[],
        help="name=python|jvm: how that tree's topic is written (python)",
    )
    args = parser.parse_args()
    trees = dict(item.split("=", 1) for item in args.tree)
    fills = {name: "python" for name in trees} | dict(item.split("=", 1) for item in args.fill)
    if set(fills) != set(trees) or not set(fills.values()) <= set(FILLS):
        parser.error(f"--fill: name=python|jvm for names of --tree, got {args.fill}")
    with served_trees(trees, "topicbase-read-ab-") as (processes, ports, work):
        spark = session(ports, "topicbase-read-ab")
        try:
            _run(spark, args.count, args.rounds, processes, ports, work, fills)
        finally:
            spark.stop()


def _run(spark: Any, count: int, rounds: int, processes: dict[str, subprocess.Popen],
         ports: dict[str, tuple[int, int]], work: str, fills: dict[str, str]) -> None:  # fmt: skip
    parquet = os.path.join(work, "parquet")
    jvm_pid = spark._jvm.java.lang.ProcessHandle.current().pid()
    _rows(spark, count).write.mode("overwrite").parquet(parquet)
    for name, (_, flight) in ports.items():
        _fill(spark, flight, count, fills[name], f"tb_{name}")
    print("fills: " + ", ".join(f"{name} {fill}" for name, fill in fills.items()), flush=True)
    _scan(spark.read.parquet(parquet))  # warm up every path once, as the bench does
    for name in ports:
        _scan(spark.table(f"tb_{name}.main.bench"))
    print(f"start {time.strftime('%H:%M:%S', time.gmtime())} UTC; {_uptime()}", flush=True)
    seconds: dict[str, list[float]] = {"parquet": [], **{name: [] for name in ports}}
    order = list(ports)
    for round_ in range(1, rounds + 1):
        jvm = _cpu_s(jvm_pid)
        seconds["parquet"].append(_timed(lambda: _scan(spark.read.parquet(parquet))))
        print(
            f"round {round_} parquet {seconds['parquet'][-1]:.2f} s, JVM CPU "
            f"{_cpu_s(jvm_pid) - jvm:.2f} s",
            flush=True,
        )
        for name in order:
            server, jvm = _cpu_s(processes[name].pid), _cpu_s(jvm_pid)
            seconds[name].append(
                _timed(lambda name=name: _scan(spark.table(f"tb_{name}.main.bench")))
            )
            print(
                f"round {round_} {name} {seconds[name][-1]:.2f} s, server CPU "
                f"{_cpu_s(processes[name].pid) - server:.2f} s, JVM CPU "
                f"{_cpu_s(jvm_pid) - jvm:.2f} s",
                flush=True,
            )
        order.reverse()
    print(f"end {time.strftime('%H:%M:%S', time.gmtime())} UTC; {_uptime()}")
    print_ratios(seconds, ports)


if __name__ == "__main__":
    main()
