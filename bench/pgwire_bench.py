"""Postgres-wire benchmark: psycopg via ``topicbase serve`` vs embedded vs PostgreSQL 15.

In one run, with the same 1 KiB JSON-like messages (``storage_bench.make_messages``):

1. **embedded**: ``Database.open`` + ``Session`` in this process. Produce: ``INSERT
   INTO TOPIC t (data) VALUES ($1), ..., ($1000)`` with 1000 ``bytes`` parameters
   per statement, autocommit. Consume: ``SELECT data FROM TOPIC t WITH (consumer
   = 'c', max_messages = 1000)`` until all is read (each read commits its offsets);
   the result stays an Arrow table.
2. **wire**: ``topicbase serve --auth trust`` as a subprocess on loopback, driven by
   psycopg 3 from this process with the same statements (``%s`` placeholders: psycopg
   sends the 1000 values as binary ``bytea`` parameters). Consume twice, with
   psycopg's default text results (``bytea`` as hex) and with binary results
   (``cursor(binary=True)``); psycopg turns every row into Python objects.
3. **PostgreSQL 15** (``bench.postgres.Cluster``, durable defaults) on loopback,
   same client: ``INSERT INTO t (data) VALUES (%s), ...`` into ``t (id bigserial
   primary key, data bytea)``; consume as a log table with an offset row (``SELECT
   id, data FROM t WHERE id > %s ORDER BY id LIMIT 1000``, ``UPDATE offsets``,
   COMMIT in one transaction), text results.
   Produce is measured twice on both servers: with psycopg's default cursor (``%s``,
   rewritten to ``$n`` by the client on every execute: milliseconds of client CPU for
   this 1000-parameter statement) and with ``RawCursor`` and ``$n`` as written.
4. **SELECT 1 round trip**: ``conn.execute("SELECT 1").fetchone()`` repeated, p50/p99,
   on the Topicbase server and on PostgreSQL (embedded shown for context).

All three systems are up at once and take turns (``ROUNDS`` rounds, in rotating
order): each round every system produces (then consumes, then samples ``SELECT 1``)
its share, so a change of machine load during the run hits them alike; throughput
is the median over the rounds, latency percentiles pool every sample. (On these
shared 2-core machines single runs swung 2-3x before the rounds were interleaved.)

Targets: wire produce and consume throughput >= 0.5x embedded; Topicbase ``SELECT
1`` p50 <= 2x PostgreSQL's. The server is a separate process (as PostgreSQL's
backends are), so client and server do not share a GIL. Temp dirs go under
``$TOPICBASE_BENCH_DIR`` (or ``$TMPDIR``) and are deleted.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from bench import postgres
from bench.results import REPO_DIR, Recorder, ratio_target
from bench.storage_bench import make_messages
from engine.database import Database

ROWS_PER_STATEMENT = 1000
MESSAGE_BYTES = 1024
LATENCY_TARGET = 2.0  # SELECT 1 p50 at most this times PostgreSQL's
THROUGHPUT_TARGET = 0.5  # wire at least this times embedded
ROUNDS = 5  # the systems take turns, so that load changes hit them alike
SERVER_START_TIMEOUT_S = 60
G_THROUGHPUT = (
    "pgwire: produce/consume through psycopg vs embedded vs PostgreSQL 15 "
    "(1 KiB messages, 1000 rows per statement, loopback)"
)
G_LATENCY = "pgwire: SELECT 1 round trip through psycopg (loopback)"

TOPIC_SETUP = (
    "CREATE TOPIC t (CONSUMER c, CONSUMER c_text, CONSUMER c_binary) "
    "WITH (min_active_partitions = 1)"
)
PG_SETUP = (
    "CREATE TABLE t (id BIGSERIAL PRIMARY KEY, data BYTEA NOT NULL); "
    "CREATE TABLE offsets (consumer TEXT PRIMARY KEY, pos BIGINT NOT NULL); "
    "INSERT INTO offsets VALUES ('c', 0)"
)


@dataclass(frozen=True)
class Params:
    statements: int  # produce statements of ROWS_PER_STATEMENT rows
    round_trips: int  # SELECT 1 samples

    @property
    def messages(self) -> int:
        return self.statements * ROWS_PER_STATEMENT


FULL = Params(statements=100, round_trips=5000)
QUICK = Params(statements=20, round_trips=1000)


def insert_sql(placeholder: Callable[[int], str]) -> str:
    values = ", ".join(f"({placeholder(i)})" for i in range(1, ROWS_PER_STATEMENT + 1))
    return f"INSERT INTO TOPIC t (data) VALUES {values}"


def consume_sql(consumer: str) -> str:
    return (
        f"SELECT data FROM TOPIC t WITH (consumer = '{consumer}', "
        f"max_messages = {ROWS_PER_STATEMENT})"
    )


def batches(pool: list[bytes], params: Params) -> Iterator[list[bytes]]:
    for i in range(params.statements):
        start = (i * ROWS_PER_STATEMENT) % (len(pool) - ROWS_PER_STATEMENT)
        yield pool[start : start + ROWS_PER_STATEMENT]


def percentiles_us(samples_ns: list[int]) -> tuple[float, float]:
    values = np.array(samples_ns, dtype=np.float64) / 1000.0
    return float(np.percentile(values, 50)), float(np.percentile(values, 99))


@dataclass
class Figures:
    """Medians over the rounds (rates) and percentiles over all samples (latency)."""

    produce_msgs_s: float
    consume_msgs_s: float
    select1_p50_us: float
    select1_p99_us: float
    consume_binary_msgs_s: float | None = None


@dataclass
class Way:
    """One way to run the workload: each callable does one unit of work."""

    name: str
    produce: Callable[[list[bytes]], None] | None  # one INSERT of 1000 rows
    consume: Callable[[], int] | None  # one read of up to 1000 messages; returns how many
    select1: Callable[[], None] | None


def _rotated(ways: list[Way], round_index: int) -> list[Way]:
    shift = round_index % len(ways)
    return ways[shift:] + ways[:shift]


def produce_rounds(ways: list[Way], pool: list[bytes], params: Params) -> dict[str, float]:
    """Median msgs/s per way; the ways take turns, ROUNDS times, in rotating order."""
    rates: dict[str, list[float]] = {w.name: [] for w in ways if w.produce}
    chunks = list(batches(pool, params))
    per_round = len(chunks) // ROUNDS
    for index in range(ROUNDS):
        for way in _rotated([w for w in ways if w.produce], index):
            assert way.produce is not None
            started = time.perf_counter()
            for chunk in chunks[index * per_round : (index + 1) * per_round]:
                way.produce(chunk)
            rates[way.name].append(per_round * ROWS_PER_STATEMENT / (time.perf_counter() - started))
    return {name: float(np.median(values)) for name, values in rates.items()}


def consume_rounds(ways: list[Way], params: Params) -> dict[str, float]:
    """Median msgs/s per way, reading what ``produce_rounds`` wrote, in turns."""
    consumers = [w for w in ways if w.consume]
    rates: dict[str, list[float]] = {w.name: [] for w in consumers}
    per_round = params.messages // ROUNDS
    for index in range(ROUNDS):
        for way in _rotated(consumers, index):
            assert way.consume is not None
            started = time.perf_counter()
            read = 0
            while read < per_round:
                got = way.consume()
                assert got > 0, f"{way.name}: the consumer ran dry after {read}"
                read += got
            rates[way.name].append(read / (time.perf_counter() - started))
    return {name: float(np.median(values)) for name, values in rates.items()}


def select1_rounds(ways: list[Way], params: Params) -> dict[str, tuple[float, float]]:
    """p50 and p99 (us) of ``SELECT 1`` per way, sampled in turns."""
    samples: dict[str, list[int]] = {w.name: [] for w in ways if w.select1}
    per_round = params.round_trips // ROUNDS
    for index in range(ROUNDS):
        for way in _rotated([w for w in ways if w.select1], index):
            assert way.select1 is not None
            for _ in range(per_round):
                begun = time.perf_counter_ns()
                way.select1()
                samples[way.name].append(time.perf_counter_ns() - begun)
    return {name: percentiles_us(values) for name, values in samples.items()}


# -- the three systems ----------------------------------------------------------------------------
def embedded_way(session: Any, pool: list[bytes]) -> Way:
    session.execute(TOPIC_SETUP)
    statement = insert_sql(lambda i: f"${i}")
    session.execute(statement, pool[:ROWS_PER_STATEMENT])  # warm-up: parse, first append
    session.execute(consume_sql("c").replace(f"{ROWS_PER_STATEMENT})", "1)"))
    read = consume_sql("c")

    def consume() -> int:
        table = session.execute(read)[-1].table
        return 0 if table is None else table.num_rows

    return Way(
        "embedded",
        lambda chunk: session.execute(statement, chunk),
        consume,
        lambda: session.execute("SELECT 1"),
    )


def wire_ways(conn: Any, pool: list[bytes]) -> list[Way]:
    """Text results (psycopg's default) and binary results, from one connection."""
    conn.execute(TOPIC_SETUP)
    statement = insert_sql(lambda i: "%s")
    conn.execute(statement, pool[:ROWS_PER_STATEMENT])
    ways = []
    for binary in (False, True):
        cursor = conn.cursor(binary=binary)
        consumer = "c_binary" if binary else "c_text"
        cursor.execute(consume_sql(consumer).replace(f"{ROWS_PER_STATEMENT})", "1)"))
        cursor.fetchall()
        read = consume_sql(consumer)

        def consume(cursor: Any = cursor, read: str = read) -> int:
            return len(cursor.execute(read).fetchall())

        ways.append(
            Way(
                "wire binary" if binary else "wire",
                None if binary else (lambda chunk: conn.execute(statement, chunk)),
                consume,
                None if binary else (lambda: conn.execute("SELECT 1").fetchone()),
            )
        )
    ways.append(raw_produce_way("wire $n", conn))
    return ways


def raw_produce_way(name: str, conn: Any) -> Way:
    """Produce through psycopg's ``RawCursor``: ``$n`` placeholders go to the server as
    they are. psycopg's default cursor rewrites ``%s`` to ``$n`` on every execute and
    caches that only for queries of at most 4096 bytes and 50 parameters, so for this
    7 KB, 1000-parameter INSERT it costs milliseconds of client CPU per statement, the
    same against either server; ``$n`` leaves the wire and the server to measure."""
    from psycopg import RawCursor

    cursor = RawCursor(conn)
    statement = insert_sql(lambda i: f"${i}")
    if name.startswith("postgres"):
        statement = statement.replace("INSERT INTO TOPIC t", "INSERT INTO t")
    return Way(name, lambda chunk: cursor.execute(statement, chunk), None, None)


def postgres_way(conn: Any, pool: list[bytes]) -> Way:
    """A table with a bigserial key; consume = a log-table read plus an offset-row UPDATE."""
    conn.execute(PG_SETUP)
    statement = "INSERT INTO t (data) VALUES " + ", ".join(["(%s)"] * ROWS_PER_STATEMENT)
    conn.execute(statement, pool[:ROWS_PER_STATEMENT])

    def consume() -> int:
        with conn.transaction():
            (position,) = conn.execute("SELECT pos FROM offsets WHERE consumer = 'c'").fetchone()
            rows = conn.execute(
                "SELECT id, data FROM t WHERE id > %s ORDER BY id LIMIT %s",
                [position, ROWS_PER_STATEMENT],
            ).fetchall()
            if rows:
                conn.execute("UPDATE offsets SET pos = %s WHERE consumer = 'c'", [rows[-1][0]])
        return len(rows)

    return Way(
        "postgres",
        lambda chunk: conn.execute(statement, chunk),
        consume,
        lambda: conn.execute("SELECT 1").fetchone(),
    )


def postgres_ways(conn: Any, pool: list[bytes]) -> list[Way]:
    return [postgres_way(conn, pool), raw_produce_way("postgres $n", conn)]


# -- through the server ---------------------------------------------------------------------------
@contextlib.contextmanager
def topicbase_server(directory: str) -> Iterator[int]:
    """``topicbase serve --auth trust`` on a free loopback port; yields the port."""
    code = "import sys; from sql.console import main; sys.exit(main(sys.argv[1:]))"
    command = [
        sys.executable,
        "-c",
        code,
        "--data-dir",
        directory,
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--flight-port",
        "0",
        "--auth",
        "trust",
    ]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, cwd=REPO_DIR)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        if "serving" not in line:
            raise RuntimeError(f"topicbase serve did not start: {line!r}")
        yield int(line.rsplit(":", 1)[1])
    finally:
        process.terminate()
        try:
            process.wait(timeout=SERVER_START_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


# -- the run --------------------------------------------------------------------------------------
def run(recorder: Recorder) -> None:
    params = QUICK if recorder.quick else FULL
    psycopg = postgres.ensure_psycopg(recorder.progress)
    pool = make_messages(count=max(4 * ROWS_PER_STATEMENT, 4096), size=MESSAGE_BYTES)
    parent = os.environ.get("TOPICBASE_BENCH_DIR") or None
    with contextlib.ExitStack() as stack:
        root = stack.enter_context(
            tempfile.TemporaryDirectory(prefix="topicbase-pgwire-", dir=parent)
        )
        database = Database.open(os.path.join(root, "embedded"))
        stack.callback(database.close)
        session = database.connect()
        stack.callback(session.close)
        port = stack.enter_context(topicbase_server(os.path.join(root, "served")))
        wire = stack.enter_context(
            psycopg.connect(host="127.0.0.1", port=port, user="bench", autocommit=True)
        )
        cluster = stack.enter_context(postgres.Cluster(parent=parent, log=recorder.progress))
        baseline = stack.enter_context(psycopg.connect(cluster.dsn, autocommit=True))
        recorder.progress(
            f"{cluster.version} on 127.0.0.1:{cluster.port}; topicbase serve on "
            f"127.0.0.1:{port}; {params.messages} messages, {ROUNDS} rounds"
        )
        ways = [embedded_way(session, pool), *wire_ways(wire, pool), *postgres_ways(baseline, pool)]
        produce = produce_rounds(ways, pool, params)
        baseline.execute("VACUUM ANALYZE t")
        consume = consume_rounds(ways, params)
        latency = select1_rounds(ways, params)
        figures = {
            name: Figures(produce.get(name, 0.0), consume[name], *latency.get(name, (0.0, 0.0)))
            for name in ("embedded", "wire", "postgres")
        }
        figures["wire"].consume_binary_msgs_s = consume["wire binary"]
        raw = (produce["wire $n"], produce["postgres $n"])
        _record(
            recorder, figures["embedded"], figures["wire"], figures["postgres"], cluster.version
        )
        _record_raw_produce(recorder, *raw, figures["embedded"].produce_msgs_s, cluster.version)


def _record_raw_produce(
    rec: Recorder, wire: float, pg: float, embedded: float, version: str
) -> None:
    """Produce with server-side ``$n`` placeholders (``raw_produce_way``)."""
    rec.add(
        "pgwire produce, $n placeholders (psycopg RawCursor): topicbase serve",
        wire,
        "msgs/s",
        group=G_THROUGHPUT,
        baseline="embedded Session",
        baseline_value=embedded,
        target=ratio_target(THROUGHPUT_TARGET, "embedded"),
        met=wire >= THROUGHPUT_TARGET * embedded,
        note="the same statement with $1..$1000 sent as written: no client-side %s rewrite",
    )
    rec.add(
        "pgwire produce, $n placeholders (psycopg RawCursor): topicbase serve vs PostgreSQL",
        wire,
        "msgs/s",
        group=G_THROUGHPUT,
        baseline=version,
        baseline_value=pg,
    )


def _record(rec: Recorder, embedded: Figures, wire: Figures, pg: Figures, version: str) -> None:
    unit = "msgs/s"
    target = ratio_target(THROUGHPUT_TARGET, "embedded")
    for name, value, base in (
        ("produce", wire.produce_msgs_s, embedded.produce_msgs_s),
        ("consume (text results)", wire.consume_msgs_s, embedded.consume_msgs_s),
        ("consume (binary results)", wire.consume_binary_msgs_s or 0.0, embedded.consume_msgs_s),
    ):
        rec.add(
            f"pgwire {name}: psycopg via topicbase serve",
            value,
            unit,
            group=G_THROUGHPUT,
            baseline="embedded Session",
            baseline_value=base,
            target=target,
            met=value >= THROUGHPUT_TARGET * base,
        )
    rec.add("pgwire produce: embedded Session", embedded.produce_msgs_s, unit, group=G_THROUGHPUT)
    rec.add(
        "pgwire consume: embedded Session (Arrow result)",
        embedded.consume_msgs_s,
        unit,
        group=G_THROUGHPUT,
    )
    rec.add(
        "pgwire produce: topicbase serve vs PostgreSQL table INSERT",
        wire.produce_msgs_s,
        unit,
        group=G_THROUGHPUT,
        baseline=version,
        baseline_value=pg.produce_msgs_s,
    )
    rec.add(
        "pgwire consume (text): topicbase serve vs PostgreSQL log table + offset row",
        wire.consume_msgs_s,
        unit,
        group=G_THROUGHPUT,
        baseline=version,
        baseline_value=pg.consume_msgs_s,
    )
    rec.add(
        "pgwire SELECT 1 p50: topicbase serve",
        wire.select1_p50_us,
        "us",
        group=G_LATENCY,
        baseline=version,
        baseline_value=pg.select1_p50_us,
        target=f"<= {LATENCY_TARGET:g}x PostgreSQL",
        met=wire.select1_p50_us <= LATENCY_TARGET * pg.select1_p50_us,
        note=f"the engine alone takes {embedded.select1_p50_us:.0f} us: a DuckDB statement",
    )
    rec.add(
        "pgwire SELECT 1 p99: topicbase serve",
        wire.select1_p99_us,
        "us",
        group=G_LATENCY,
        baseline=version,
        baseline_value=pg.select1_p99_us,
    )
    rec.add(
        "pgwire SELECT 1 p50: embedded Session (no network)",
        embedded.select1_p50_us,
        "us",
        group=G_LATENCY,
    )
