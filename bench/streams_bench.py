"""Durable produce by many connections, and consume with committed offsets, against
PostgreSQL 15 and Redis (streams, AOF).

1. ``produce.durable.c16``: 16 client threads in this process, each with its own
   connection, send one 1 KiB message per autocommit statement for a fixed time:
   - Topicbase: ``INSERT INTO TOPIC t (data) VALUES (%s)`` through psycopg to a
     wire server in its own process (``bench.served``, which reports the
     server's fsync count, so messages per fsync is measured);
   - PostgreSQL 15: ``INSERT INTO t (data) VALUES (%s)`` into a table with a
     bigserial key, ``synchronous_commit = on`` (its default); WAL syncs from
     ``pg_stat_wal.wal_sync``;
   - Redis (beside, no target): ``XADD s * d <msg>`` with ``appendfsync always``.
   The three alternate repetition by repetition (``bench.harness``); each
   repetition also measures this machine's ``fdatasync`` (1 KiB append +
   fdatasync, one thread) p50/p99 right before, so ack latencies can be read
   against the disk's.
2. ``consume.embedded``: a consumer's reads with committed offsets, in this
   process, into Arrow (``SELECT data FROM TOPIC t WITH (consumer = 'c',
   max_messages = 1000)``, each read commits its offsets), against Redis
   ``XREADGROUP GROUP g c COUNT 1000 STREAMS s >`` + ``XACK`` of the ids read
   (``appendfsync everysec``: the acks are written to the AOF). Each repetition
   first adds the messages it reads (untimed: storage-API batches of 1000 for
   Topicbase, pipelined ``XADD`` for Redis).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from bench import harness, postgres
from bench import redis as redis_bench
from bench.results import REPO_DIR, Recorder
from bench.storage_bench import make_messages
from engine.database import Database
from storage.record_batch import build_wire_batch

CLIENTS = 16
CONSUME_BATCH = 1000
CONSUME_PARTITIONS = 4
G_PRODUCE = "produce: durable, 16 connections, one 1 KiB message per autocommit statement"
G_CONSUME = "consume: committed offsets, embedded into Arrow vs Redis XREADGROUP + XACK"


@dataclass(frozen=True)
class Params:
    produce_seconds: float
    consume_messages: int
    probe_syncs: int
    reps: int


QUICK = Params(produce_seconds=1.0, consume_messages=60_000, probe_syncs=200, reps=3)
FULL = Params(produce_seconds=6.0, consume_messages=400_000, probe_syncs=1000, reps=5)


# -- helpers ----------------------------------------------------------------------------
def fdatasync_probe(parent: str, count: int) -> tuple[float, float]:
    """p50 and p99 (ms) of a 1 KiB append + ``fdatasync``, one thread, ``count`` times."""
    path = os.path.join(parent, "fdatasync-probe.log")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    block = b"x" * 1024
    samples = np.empty(count)
    try:
        for i in range(count):
            started = time.perf_counter()
            os.write(fd, block)
            os.fdatasync(fd)
            samples[i] = time.perf_counter() - started
    finally:
        os.close(fd)
        os.remove(path)
    return float(np.percentile(samples, 50)) * 1000, float(np.percentile(samples, 99)) * 1000


def run_clients(
    clients: int, seconds: float, connect: Callable[[int], Any], send: Callable[[Any, int], None]
) -> tuple[float, np.ndarray]:
    """``clients`` threads call ``send(connection, i)`` until the deadline: (msgs/s, acks s)."""
    connections = [connect(i) for i in range(clients)]
    latencies: list[list[float]] = [[] for _ in range(clients)]
    errors: list[BaseException] = []
    barrier = threading.Barrier(clients + 1)
    deadline = [0.0]

    def body(index: int) -> None:
        conn, mine, clock = connections[index], latencies[index], time.perf_counter
        barrier.wait()
        try:
            i = 0
            while clock() < deadline[0]:
                started = clock()
                send(conn, index * 1_000_003 + i)
                mine.append(clock() - started)
                i += 1
        except BaseException as error:  # reported below
            errors.append(error)

    threads = [threading.Thread(target=body, args=(i,), daemon=True) for i in range(clients)]
    try:
        for thread in threads:
            thread.start()
        start = time.perf_counter()
        deadline[0] = start + seconds
        barrier.wait()
        for thread in threads:
            thread.join()
        elapsed = time.perf_counter() - start
    finally:
        for conn in connections:
            with contextlib.suppress(Exception):
                conn.close()
    if errors:
        raise errors[0]
    acks = np.concatenate([np.array(x) for x in latencies])
    return len(acks) / elapsed, acks


@contextlib.contextmanager
def served(directory: str) -> Iterator[tuple[int, Callable[[], dict[str, int]]]]:
    """``bench.served`` in its own process: (port, a function returning its counters)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "bench.served", directory],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO_DIR,
    )  # fmt: skip
    assert process.stdin is not None and process.stdout is not None
    try:
        line = process.stdout.readline()
        if not line.startswith("port "):
            raise RuntimeError(f"bench.served did not start: {line!r}")

        def stats() -> dict[str, int]:
            assert process.stdin is not None and process.stdout is not None
            process.stdin.write("stats\n")
            process.stdin.flush()
            return json.loads(process.stdout.readline())

        yield int(line.split()[1]), stats
    finally:
        with contextlib.suppress(OSError):
            process.stdin.write("stop\n")
            process.stdin.close()
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _ack_figures(rate: float, acks: np.ndarray, fsyncs: int) -> dict[str, float]:
    return {
        "rate": rate,
        "ack_p50_ms": float(np.percentile(acks, 50)) * 1000,
        "ack_p99_ms": float(np.percentile(acks, 99)) * 1000,
        "msgs_per_fsync": len(acks) / fsyncs if fsyncs else float("nan"),
    }


def _redis(
    stack: contextlib.ExitStack, appendfsync: str, parent: str, rec: Recorder
) -> redis_bench.Server | None:
    """A Redis server for the run, or None (reported) when it cannot be had."""
    try:
        return stack.enter_context(redis_bench.Server(appendfsync, parent=parent,
                                                      log=rec.progress))  # fmt: skip
    except Exception as error:  # the other sides' figures stand without it
        rec.progress(f"Redis baseline FAILED: {type(error).__name__}: {error}")
        return None


# -- produce ----------------------------------------------------------------------------
def bench_produce(
    rec: Recorder, stack: contextlib.ExitStack, parent: str, params: Params, pool: Sequence[bytes]
) -> None:
    psycopg = postgres.ensure_psycopg(rec.progress)
    port, stats = stack.enter_context(served(os.path.join(parent, "served")))
    with psycopg.connect(host="127.0.0.1", port=port, user="bench", autocommit=True) as conn:
        conn.execute("CREATE TOPIC t WITH (min_active_partitions = 4)")
    cluster = stack.enter_context(  # not under ``parent``: the cluster's user cannot enter it
        postgres.Cluster(parent=os.environ.get("TOPICBASE_BENCH_DIR") or None, log=rec.progress)
    )
    with psycopg.connect(cluster.dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id BIGSERIAL PRIMARY KEY, data BYTEA NOT NULL)")
    redis_always = _redis(stack, "always", parent, rec)
    pg_label = postgres.short_version(cluster.version)
    rec.progress(f"produce: topicbase on :{port}, {pg_label} on :{cluster.port}"
                 + (f", {redis_always.version} (AOF always) on :{redis_always.port}"
                    if redis_always else ", no Redis"))  # fmt: skip
    probes: list[tuple[float, float]] = []

    def topicbase(rep: int) -> dict[str, float]:
        probes.append(fdatasync_probe(parent, params.probe_syncs))
        before = stats()["fsyncs"]
        rate, acks = run_clients(
            CLIENTS, params.produce_seconds,
            lambda i: psycopg.connect(host="127.0.0.1", port=port, user="bench", autocommit=True),
            lambda conn, i: conn.execute("INSERT INTO TOPIC t (data) VALUES (%s)",
                                         [pool[i % len(pool)]]),
        )  # fmt: skip
        return _ack_figures(rate, acks, stats()["fsyncs"] - before)

    def wal_syncs() -> int:
        with psycopg.connect(cluster.dsn, autocommit=True) as conn:
            return int(conn.execute("SELECT wal_sync FROM pg_stat_wal").fetchone()[0])

    def postgresql(rep: int) -> dict[str, float]:
        before = wal_syncs()
        rate, acks = run_clients(
            CLIENTS, params.produce_seconds,
            lambda i: psycopg.connect(cluster.dsn, autocommit=True),
            lambda conn, i: conn.execute("INSERT INTO t (data) VALUES (%s)",
                                         [pool[i % len(pool)]]),
        )  # fmt: skip
        return _ack_figures(rate, acks, wal_syncs() - before)

    def redis(rep: int) -> dict[str, float]:
        assert redis_always is not None
        rate, acks = run_clients(
            CLIENTS, params.produce_seconds, lambda i: redis_always.client(),
            lambda conn, i: conn.call("XADD", "s", "*", "d", pool[i % len(pool)]),
        )  # fmt: skip
        return _ack_figures(rate, acks, 0)

    sides = [harness.Side("topicbase", topicbase), harness.Side("postgres", postgresql)]
    if redis_always is not None:
        sides.append(harness.Side("redis", redis))
    spreads = harness.alternate(sides, params.reps, rec.progress)
    ours, pg, rd = spreads["topicbase"], spreads["postgres"], spreads.get("redis")
    p50 = harness.Spread.of([p[0] for p in probes])
    p99 = harness.Spread.of([p[1] for p in probes])
    disk = f"this machine's fdatasync (1 KiB, one thread) p50 {p50.median:.3f} ms, p99 " \
           f"{p99.median:.2f} ms in the same run"  # fmt: skip
    name = "produce.durable.c16"
    harness.record(
        rec, name, ours["rate"], pg["rate"], unit="msgs/s", group=G_PRODUCE,
        baseline=f"{pg_label}, 16 clients, single-row autocommit INSERT", target_ratio=1.0,
        target_label="PostgreSQL",
        note=f"Topicbase {ours['msgs_per_fsync'].median:.1f} msgs/fsync, PostgreSQL "
        f"{pg['msgs_per_fsync'].median:.1f} msgs/WAL sync; "
        + (f"Redis AOF always {rd['rate'].median:,.0f} msgs/s; " if rd else "")
        + disk,
    )  # fmt: skip
    if rd is not None and redis_always is not None:
        harness.record(
            rec, f"{name}.vs_redis_always", ours["rate"], rd["rate"], unit="msgs/s",
            group=G_PRODUCE, baseline=f"{redis_always.version}, XADD, appendfsync always",
            note="reported beside the target: no target of its own",
        )  # fmt: skip
    for metric in ("ack_p50_ms", "ack_p99_ms"):
        harness.record(
            rec, f"{name}.{metric}", ours[metric], pg[metric], unit="ms", group=G_PRODUCE,
            baseline=f"{pg_label}", higher_is_better=False,
            note="statement sent -> acknowledged, per client; "
            + (f"Redis {rd[metric].median:.2f} ms; " if rd else "") + disk,
        )  # fmt: skip
    harness.record(
        rec, f"{name}.msgs_per_fsync", ours["msgs_per_fsync"], pg["msgs_per_fsync"],
        unit="msgs/fsync", group=G_PRODUCE, baseline=f"{pg_label} (pg_stat_wal.wal_sync)",
        note="Topicbase: the server's fs.fsync_count (bench.served; a DuckDB WAL fdatasync, "
        "if a commit reaches DuckDB, is not in it); PostgreSQL: pg_stat_wal.wal_sync",
    )  # fmt: skip
    harness.record(rec, "produce.machine.fdatasync_p50_ms", p50, None, unit="ms",
                   group=G_PRODUCE, note="1 KiB append + fdatasync, one thread, before each "
                   "Topicbase repetition")  # fmt: skip
    harness.record(rec, "produce.machine.fdatasync_p99_ms", p99, None, unit="ms",
                   group=G_PRODUCE, note="as p50")  # fmt: skip


# -- consume ----------------------------------------------------------------------------
def bench_consume(
    rec: Recorder, stack: contextlib.ExitStack, parent: str, params: Params, pool: Sequence[bytes]
) -> None:
    database = Database.open(os.path.join(parent, "consume"))
    stack.callback(database.close)
    session = database.connect()
    stack.callback(session.close)
    session.execute(
        f"CREATE TOPIC t (CONSUMER c) WITH (min_active_partitions = {CONSUME_PARTITIONS})"
    )
    topic = database.topic_log(database.catalog.entry("t").topic_id)
    batches = [
        build_wire_batch([pool[(k * CONSUME_BATCH + i) % len(pool)] for i in range(CONSUME_BATCH)])
        for k in range(8)
    ]
    server = _redis(stack, "everysec", parent, rec)
    client = None
    if server is not None:
        client = server.client()
        stack.callback(client.close)
        client.call("XGROUP", "CREATE", "s", "g", "$", "MKSTREAM")
    read = f"SELECT data FROM TOPIC t WITH (consumer = 'c', max_messages = {CONSUME_BATCH})"
    count = params.consume_messages

    def topicbase(rep: int) -> float:
        for k in range(count // CONSUME_BATCH):
            topic.append(batches[k % len(batches)], k % CONSUME_PARTITIONS)
        started = time.perf_counter()
        got = 0
        while got < count:
            table = session.execute(read)[-1].table
            assert table is not None and table.num_rows, f"ran dry after {got}"
            got += table.num_rows
        return got / (time.perf_counter() - started)

    def redis(rep: int) -> float:
        assert client is not None
        for k in range(count // CONSUME_BATCH):
            client.pipeline([("XADD", "s", "*", "d", pool[(k * CONSUME_BATCH + i) % len(pool)])
                             for i in range(CONSUME_BATCH)])  # fmt: skip
        started = time.perf_counter()
        got = 0
        while got < count:
            reply = client.call("XREADGROUP", "GROUP", "g", "c", "COUNT", CONSUME_BATCH,
                                "STREAMS", "s", ">")  # fmt: skip
            assert reply, f"ran dry after {got}"
            ids = [entry[0] for entry in reply[0][1]]
            client.call("XACK", "s", "g", *ids)
            got += len(ids)
        return got / (time.perf_counter() - started)

    sides = [harness.Side("topicbase", topicbase)]
    if server is not None:
        sides.append(harness.Side("redis", redis))
    for side in sides:
        side.run(-1)  # warm-up: code paths, first reads
    spreads = harness.alternate(sides, params.reps, rec.progress)
    harness.record(
        rec, "consume.embedded", spreads["topicbase"][harness.VALUE],
        spreads["redis"][harness.VALUE] if server else None, unit="msgs/s", group=G_CONSUME,
        baseline=f"{server.version} XREADGROUP COUNT 1000 + XACK (AOF everysec)"
        if server else None,
        target_ratio=10.0, target_label="Redis",
        note=f"{count:,} messages of 1 KiB per repetition, reads of up to 1000; Topicbase in "
        "process (an Arrow table per read, offsets committed by each read), Redis over "
        "loopback with a minimal RESP2 client (bench.redis)",
    )  # fmt: skip


# -- entry point ------------------------------------------------------------------------
def run(rec: Recorder) -> None:
    params = QUICK if rec.quick else FULL
    parent = tempfile.mkdtemp(
        prefix="topicbase-streams-", dir=os.environ.get("TOPICBASE_BENCH_DIR") or None
    )
    try:
        pool = make_messages()
        with contextlib.ExitStack() as stack:
            rec.progress("-- produce.durable.c16")
            bench_produce(rec, stack, parent, params, pool)
        with contextlib.ExitStack() as stack:
            rec.progress("-- consume.embedded")
            bench_consume(rec, stack, parent, params, pool)
    finally:
        shutil.rmtree(parent, ignore_errors=True)
