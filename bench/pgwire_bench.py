"""Postgres-wire benchmark: psycopg via ``topicbase serve`` vs embedded vs PostgreSQL 15.

In one run, with the same 1 KiB JSON-like messages (``storage_bench.make_messages``):

1. **embedded**: ``Database.open`` + ``Session`` in this process. Produce: ``INSERT
   INTO TOPIC t (data) VALUES ($1), ..., ($1000)`` with 1000 ``bytes`` parameters
   per statement, autocommit. Consume: ``SELECT data FROM TOPIC t WITH (consumer
   = 'c', max_messages = 1000)`` until all is read (each read commits its offsets);
   the result stays an Arrow table.
2. **wire**: ``topicbase serve --auth trust`` as a subprocess on loopback, driven by
   psycopg 3 from this process with the same statements (``%s`` placeholders: psycopg
   sends the 1000 values as binary ``bytea`` parameters). Consume three ways, with
   psycopg's default text results (``bytea`` as hex), with binary results
   (``cursor(binary=True)``; psycopg turns every row into Python objects) and as
   ``COPY (<the read>) TO STDOUT (FORMAT arrow)`` decoded by pyarrow into a table (the
   server commits the offsets once the COPY was sent).
3. **PostgreSQL 15** (``bench.postgres.Cluster``, durable defaults) on loopback,
   same client: ``INSERT INTO t (data) VALUES (%s), ...`` into ``t (id bigserial
   primary key, data bytea)``; consume as a log table with an offset row (``SELECT
   id, data FROM t WHERE id > %s ORDER BY id LIMIT 1000``, ``UPDATE offsets``,
   COMMIT in one transaction), text and binary results, and (``postgres COPY binary``)
   with the rows read by ``COPY (SELECT ...) TO STDOUT (FORMAT binary)``.
   Produce is measured twice on both servers: with psycopg's default cursor (``%s``,
   rewritten to ``$n`` by the client on every execute: milliseconds of client CPU for
   this 1000-parameter statement) and with ``RawCursor`` and ``$n`` as written.
4. **SELECT 1 round trip**: ``conn.execute("SELECT 1").fetchone()`` repeated, p50/p99
   (psycopg sends it as a simple query, and prepared, Bind/Execute/Sync, once it ran 5 times),
   on the Topicbase server and on PostgreSQL (embedded shown for context).

All three systems are up at once and take turns (``ROUNDS`` rounds, in rotating
order): each round every system produces (then consumes, then samples ``SELECT 1``)
its share, so a change of machine load during the run hits them alike; throughput
is the median over the rounds, latency percentiles pool every sample. (On these
shared 2-core machines single runs swung 2-3x before the rounds were interleaved.)

Targets: wire produce and binary consume >= 0.5x embedded; ``consume.wire`` (the better of
binary results and COPY arrow) >= 2x PostgreSQL's log-table consumer (binary results);
``pgwire.select1`` p50 <= 8x and ``pgwire.point_lookup`` (1M-row table, extended
protocol) p50 <= 5x PostgreSQL's (latency ratios are baseline / Topicbase; the earlier
``SELECT 1`` <= 2x and text consume >= 0.5x embedded were retired in issue 14). The
server is a separate process (as PostgreSQL's backends are), so client and server do not
share a GIL. Temp dirs go under ``$TOPICBASE_BENCH_DIR`` (or ``$TMPDIR``) and are deleted.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bench import harness, placement, postgres
from bench.results import REPO_DIR, Recorder, ratio_target
from bench.storage_bench import make_messages
from engine.database import Database

ROWS_PER_STATEMENT = 1000
MESSAGE_BYTES = 1024
THROUGHPUT_TARGET = 0.5  # wire at least this times embedded
ROUNDS = 5  # the systems take turns, so that load changes hit them alike
LOOKUP_ROWS = 1_000_000
SELECT1_TARGET = 8.0  # pgwire.select1: p50 at most this times PostgreSQL's
LOOKUP_TARGET = 5.0  # pgwire.point_lookup: p50 at most this times PostgreSQL's
CONSUME_WIRE_TARGET = 2.0  # consume.wire: binary results vs PostgreSQL's log-table consumer
G_TARGETS = "pgwire: the issue's targets (psycopg, loopback, extended protocol)"
SERVER_START_TIMEOUT_S = 60
G_THROUGHPUT = (
    "pgwire: produce/consume through psycopg vs embedded vs PostgreSQL 15 "
    "(1 KiB messages, 1000 rows per statement, loopback)"
)
G_LATENCY = "pgwire: SELECT 1 round trip through psycopg (loopback)"

TOPIC_SETUP = (
    "CREATE TOPIC t (CONSUMER c, CONSUMER c_text, CONSUMER c_binary, CONSUMER c_arrow) "
    "WITH (min_active_partitions = 1)"
)
PG_SETUP = (
    "CREATE TABLE t (id BIGSERIAL PRIMARY KEY, data BYTEA NOT NULL); "
    "CREATE TABLE offsets (consumer TEXT PRIMARY KEY, pos BIGINT NOT NULL); "
    "INSERT INTO offsets VALUES ('c', 0), ('c_binary', 0), ('c_copy', 0)"
)
KV_TABLE = "CREATE TABLE kv (k BIGINT PRIMARY KEY, v VARCHAR NOT NULL)"
TB_KV_FILL = f"INSERT INTO kv SELECT i, 'value ' || i FROM range({LOOKUP_ROWS}) t(i)"
PG_KV_FILL = (
    f"INSERT INTO kv SELECT i, 'value ' || i FROM generate_series(0, {LOOKUP_ROWS - 1}) i"
)
LOOKUP = "SELECT v FROM kv WHERE k = %s"
# pgwire.select_expr: as small as SELECT 1, but not a SELECT of literals alone (a cast and an
# operator: DuckDB looks both up in the catalog), so the engine runs it on the session's own
# DuckDB connection (docs/statement_cost.md, round 7): the per-statement cost of the rest.
SELECT_EXPR = "SELECT %s::int + 1"


@dataclass(frozen=True)
class Params:
    statements: int  # produce statements of ROWS_PER_STATEMENT rows
    round_trips: int  # SELECT 1 samples

    @property
    def messages(self) -> int:
        return self.statements * ROWS_PER_STATEMENT


FULL = Params(statements=100, round_trips=5000)
QUICK = Params(statements=100, round_trips=1000)  # 20 reads a round: 8 gave 0.6-2.8x


def insert_sql(placeholder: Callable[[int], str]) -> str:
    values = ", ".join(f"({placeholder(i)})" for i in range(1, ROWS_PER_STATEMENT + 1))
    return f"INSERT INTO TOPIC t (data) VALUES {values}"


def consume_sql(consumer: str) -> str:
    return (
        f"SELECT data FROM TOPIC t WITH (consumer = '{consumer}', "
        f"max_messages = {ROWS_PER_STATEMENT})"
    )


def copy_arrow_consumer(conn: Any, consumer: str) -> Callable[[], int]:
    """A consumer's read as ``COPY (...) TO STDOUT (FORMAT arrow)``: the client decodes the
    Arrow IPC stream with pyarrow into a table, as a consumer would get the data, and counts
    its rows; the server commits the offsets once the COPY was sent."""
    import pyarrow.ipc

    cursor = conn.cursor()
    statement = f"COPY ({consume_sql(consumer)}) TO STDOUT (FORMAT arrow)"

    def consume() -> int:
        with cursor.copy(statement) as copy:
            table = pyarrow.ipc.open_stream(b"".join(copy)).read_all()
        return table.num_rows

    return consume


def batches(pool: list[bytes], params: Params) -> Iterator[list[bytes]]:
    for i in range(params.statements):
        start = (i * ROWS_PER_STATEMENT) % (len(pool) - ROWS_PER_STATEMENT)
        yield pool[start : start + ROWS_PER_STATEMENT]


@dataclass
class Way:
    """One way to run the workload: each callable does one unit of work."""

    name: str
    produce: Callable[[list[bytes]], None] | None  # one INSERT of 1000 rows
    consume: Callable[[], int] | None  # one read of up to 1000 messages; returns how many
    select1: Callable[[], None] | None
    lookup: Callable[[int], None] | None = None  # one primary-key lookup of the 1M-row table
    # The CPU seconds (user + system) of the process serving this way so far, or None: the
    # latency rounds record the server's CPU per round trip, which the machine's other
    # load disturbs far less than wall time.
    server_cpu_s: Callable[[], float] | None = None
    select_expr: Callable[[int], None] | None = None  # one SELECT_EXPR with a parameter
    # The process serving this way's connection (Topicbase's server, PostgreSQL's backend):
    # the latency rounds sample whether its busiest thread ran on the client's CPU.
    serving_pid: int | None = None


def _rotated(ways: list[Way], round_index: int) -> list[Way]:
    shift = round_index % len(ways)
    return ways[shift:] + ways[:shift]


def produce_rounds(ways: list[Way], pool: list[bytes], params: Params) -> dict[str, list[float]]:
    """msgs/s of each round per way; the ways take turns, ROUNDS times, in rotating order."""
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
    return rates


def consume_rounds(ways: list[Way], params: Params) -> dict[str, list[float]]:
    """msgs/s of each round per way, reading what ``produce_rounds`` wrote, in turns."""
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
    return rates


def process_cpu_s(pid: int) -> float:
    """CPU seconds of process ``pid``'s live threads so far, in nanoseconds' resolution
    (``bench.consume_cpu.process_cpu_s``: ``/proc/<pid>/task/*/schedstat``; a round of
    PostgreSQL's ``SELECT 1`` is a few milliseconds of its backend, under one tick of
    ``/proc/<pid>/stat``)."""
    from bench.consume_cpu import process_cpu_s as schedstat_cpu_s  # it imports this module

    return schedstat_cpu_s(pid)


PLACEMENT_EVERY = 20  # a latency round samples placement after every 20th round trip


@dataclass
class Latency:
    """Round trips (us) of each way, one array per round, and the serving process's CPU
    per round trip (us, one figure per round) for the ways that tell it; ``apart``: per
    round, the share of sampled round trips after which the serving thread had last run
    on another CPU than the client (``bench.placement``)."""

    samples: dict[str, list[np.ndarray]]
    server_cpu_us: dict[str, list[float]]
    apart: dict[str, list[float]] = field(default_factory=dict)


def latency_rounds(
    ways: list[Way], count: int, pick: Callable[[Way], Callable[[int], None] | None]
) -> Latency:
    """Round trips (us) of ``pick(way)(i)`` per way and round, sampled in turns."""
    chosen = [w for w in ways if pick(w) is not None]
    samples: dict[str, list[np.ndarray]] = {w.name: [] for w in chosen}
    cpu: dict[str, list[float]] = {w.name: [] for w in chosen if w.server_cpu_s is not None}
    apart: dict[str, list[float]] = {w.name: [] for w in chosen if w.serving_pid is not None}
    per_round = count // ROUNDS
    keys = np.random.default_rng(7).integers(0, LOOKUP_ROWS, size=per_round * ROUNDS)
    for index in range(ROUNDS):
        for way in _rotated(chosen, index):
            call = pick(way)
            assert call is not None
            taken = np.empty(per_round)
            place = None if way.serving_pid is None else placement.Placement(way.serving_pid)
            if place is not None:
                place.start()
            cpu_before = None if way.server_cpu_s is None else way.server_cpu_s()
            for i in range(per_round):
                key = int(keys[index * per_round + i])
                begun = time.perf_counter_ns()
                call(key)
                taken[i] = (time.perf_counter_ns() - begun) / 1000.0
                if place is not None and i % PLACEMENT_EVERY == 0:  # outside the timing
                    if i == 0:
                        place.found()
                    else:
                        place.sample()
            cpu_after = None if way.server_cpu_s is None else way.server_cpu_s()
            samples[way.name].append(taken)
            if cpu_after is not None and cpu_before is not None:
                cpu[way.name].append((cpu_after - cpu_before) / per_round * 1e6)
            if place is not None and place.share is not None:
                apart[way.name].append(place.share)
    return Latency(samples, cpu, apart)


def select1_rounds(ways: list[Way], params: Params) -> Latency:
    return latency_rounds(
        ways, params.round_trips, lambda w: None if w.select1 is None else (lambda k: w.select1())
    )


def lookup_rounds(ways: list[Way], params: Params) -> Latency:
    return latency_rounds(ways, params.round_trips, lambda w: w.lookup)


def select_expr_rounds(ways: list[Way], params: Params) -> Latency:
    return latency_rounds(ways, params.round_trips, lambda w: w.select_expr)


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


def wire_ways(conn: Any, pool: list[bytes], server_pid: int) -> list[Way]:
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
                None if binary else (lambda key: conn.execute(LOOKUP, [key]).fetchone()),
                None if binary else (lambda: process_cpu_s(server_pid)),
                None if binary else (lambda key: conn.execute(SELECT_EXPR, [key]).fetchone()),
                None if binary else server_pid,
            )
        )
    with conn.cursor().copy(f"COPY ({consume_sql('c_arrow').replace('1000)', '1)')}) TO "
                            "STDOUT (FORMAT arrow)") as copy:  # fmt: skip
        b"".join(copy)  # warm-up, as the binary reads' (one message)
    ways.append(Way("wire COPY arrow", None, copy_arrow_consumer(conn, "c_arrow"), None))
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


def postgres_consumer(conn: Any, consumer: str, binary: bool) -> Callable[[], int]:
    """A log-table consumer: read past its offset row, move the row, COMMIT, as one txn."""
    cursor = conn.cursor(binary=binary)

    def consume() -> int:
        with conn.transaction():
            (position,) = cursor.execute(
                "SELECT pos FROM offsets WHERE consumer = %s", [consumer]
            ).fetchone()
            rows = cursor.execute(
                "SELECT id, data FROM t WHERE id > %s ORDER BY id LIMIT %s",
                [position, ROWS_PER_STATEMENT],
            ).fetchall()
            if rows:
                cursor.execute(
                    "UPDATE offsets SET pos = %s WHERE consumer = %s", [rows[-1][0], consumer]
                )
        return len(rows)

    return consume


def postgres_copy_consumer(conn: Any, consumer: str) -> Callable[[], int]:
    """The log-table consumer reading its rows with ``COPY (...) TO STDOUT (FORMAT binary)``
    (psycopg parses the binary tuples into Python objects, as ``fetchall`` does), in the
    same transaction as the offset row's read and UPDATE."""
    cursor = conn.cursor(binary=True)

    def consume() -> int:
        with conn.transaction():
            (position,) = cursor.execute(
                "SELECT pos FROM offsets WHERE consumer = %s", [consumer]
            ).fetchone()
            query = (
                f"COPY (SELECT id, data FROM t WHERE id > {int(position)} ORDER BY id "
                f"LIMIT {ROWS_PER_STATEMENT}) TO STDOUT (FORMAT binary)"
            )
            with cursor.copy(query) as copy:
                copy.set_types(["int8", "bytea"])
                rows = list(copy.rows())
            if rows:
                cursor.execute(
                    "UPDATE offsets SET pos = %s WHERE consumer = %s", [rows[-1][0], consumer]
                )
        return len(rows)

    return consume


def postgres_way(conn: Any, pool: list[bytes]) -> Way:
    """A table with a bigserial key; consume = a log-table read plus an offset-row UPDATE."""
    conn.execute(PG_SETUP)
    statement = "INSERT INTO t (data) VALUES " + ", ".join(["(%s)"] * ROWS_PER_STATEMENT)
    conn.execute(statement, pool[:ROWS_PER_STATEMENT])
    row = conn.execute("SELECT pg_backend_pid()").fetchone()
    assert row is not None
    backend = int(row[0])  # this connection's backend process (same machine, loopback)
    return Way(
        "postgres",
        lambda chunk: conn.execute(statement, chunk),
        postgres_consumer(conn, "c", False),
        lambda: conn.execute("SELECT 1").fetchone(),
        lambda key: conn.execute(LOOKUP, [key]).fetchone(),
        lambda: process_cpu_s(backend),
        lambda key: conn.execute(SELECT_EXPR, [key]).fetchone(),
        backend,
    )


def postgres_ways(conn: Any, pool: list[bytes]) -> list[Way]:
    return [
        postgres_way(conn, pool),
        Way("postgres binary", None, postgres_consumer(conn, "c_binary", True), None),
        Way("postgres COPY binary", None, postgres_copy_consumer(conn, "c_copy"), None),
        raw_produce_way("postgres $n", conn),
    ]


def lookup_tables(wire: Any, baseline: Any, progress: Callable[[str], None]) -> None:
    """The 1M-row ``kv`` table on both servers (untimed), then a few lookups to warm up."""
    started = time.perf_counter()
    wire.execute(KV_TABLE)
    wire.execute(TB_KV_FILL)
    baseline.execute(KV_TABLE)
    baseline.execute(PG_KV_FILL)
    baseline.execute("VACUUM ANALYZE kv")
    for conn in (wire, baseline):
        for key in range(10):
            assert conn.execute(LOOKUP, [key * 99_991]).fetchone() is not None
    progress(f"kv: {LOOKUP_ROWS:,} rows on both servers in {time.perf_counter() - started:.1f}s")


# -- through the server ---------------------------------------------------------------------------
@contextlib.contextmanager
def topicbase_server(directory: str) -> Iterator[tuple[int, int]]:
    """``topicbase serve --auth trust`` on a free loopback port; yields the port and the
    server's process id."""
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
        yield int(line.rsplit(":", 1)[1]), process.pid
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
        port, server_pid = stack.enter_context(topicbase_server(os.path.join(root, "served")))
        wire = stack.enter_context(
            psycopg.connect(host="127.0.0.1", port=port, user="bench", autocommit=True)
        )
        cluster = stack.enter_context(postgres.Cluster(parent=parent, log=recorder.progress))
        baseline = stack.enter_context(psycopg.connect(cluster.dsn, autocommit=True))
        recorder.progress(
            f"{cluster.version} on 127.0.0.1:{cluster.port}; topicbase serve on "
            f"127.0.0.1:{port}; {params.messages} messages, {ROUNDS} rounds"
        )
        ways = [embedded_way(session, pool), *wire_ways(wire, pool, server_pid),
                *postgres_ways(baseline, pool)]  # fmt: skip
        lookup_tables(wire, baseline, recorder.progress)
        produce = produce_rounds(ways, pool, params)
        baseline.execute("VACUUM ANALYZE t")
        consume = consume_rounds(ways, params)
        latency = select1_rounds(ways, params)
        lookups = lookup_rounds(ways, params)
        expressions = select_expr_rounds(ways, params)
        _record(recorder, produce, consume, latency.samples, cluster.version)
        _record_raw_produce(recorder, produce, cluster.version)
        label = postgres.short_version(cluster.version)
        _record_targets(recorder, consume, latency, lookups, label, expressions)


def _record_targets(
    rec: Recorder,
    consume: dict[str, list[float]],
    select1: Latency,
    lookups: Latency,
    pg_label: str,
    expressions: Latency,
) -> None:
    """consume.wire, pgwire.select1, pgwire.point_lookup (and pgwire.select_expr beside
    pgwire.select1, without a target): per-round figures, min-max."""
    postgres_binary = harness.Spread.of(consume["postgres binary"])
    ways = {
        "wire binary": "binary results (psycopg fetchall)",
        "wire COPY arrow": "COPY (...) TO STDOUT (FORMAT arrow), decoded by pyarrow",
    }
    best = max(ways, key=lambda way: harness.Spread.of(consume[way]).median)
    harness.record(
        rec, "consume.wire", harness.Spread.of(consume[best]), postgres_binary,
        unit="msgs/s", group=G_TARGETS,
        baseline=f"{pg_label} log table + offset row, binary results",
        target_ratio=CONSUME_WIRE_TARGET, target_label="PostgreSQL",
        note=f"the better of the two ways here: {ways[best]}; reads of 1000 x 1 KiB "
        "through psycopg; Topicbase: SELECT FROM TOPIC with a consumer (its offsets committed "
        "once its rows or its COPY were sent); PostgreSQL: offset row read, 1000 rows past "
        "it with a binary cursor, row updated, COMMIT",
    )  # fmt: skip
    for way, how in ways.items():
        harness.record(
            rec, f"consume.wire: {how}", harness.Spread.of(consume[way]), postgres_binary,
            unit="msgs/s", group=G_TARGETS,
            baseline=f"{pg_label} log table + offset row, binary results",
        )  # fmt: skip
    harness.record(
        rec, "consume.wire: PostgreSQL reading with COPY (FORMAT binary) instead",
        harness.Spread.of(consume[best]), harness.Spread.of(consume["postgres COPY binary"]),
        unit="msgs/s", group=G_TARGETS,
        baseline=f"{pg_label} log table + offset row, COPY (SELECT ...) TO STDOUT (FORMAT "
        "binary) parsed by psycopg",
        note="the same consumer with PostgreSQL's rows read by a binary COPY, against "
        "Topicbase's better way",
    )  # fmt: skip
    for name, latency, target, what in (
        ("pgwire.select1", select1, SELECT1_TARGET,
         "SELECT 1 (no parameter: psycopg's simple query, prepared from the 6th run on)"),
        ("pgwire.point_lookup", lookups, LOOKUP_TARGET,
         f"SELECT v FROM kv WHERE k = %s on a {LOOKUP_ROWS:,}-row table, random keys "
         "(extended protocol: Parse/Bind/Execute, named after 5 runs)"),
        ("pgwire.select_expr", expressions, None,
         f"{SELECT_EXPR} with random ints (extended protocol, named after 5 runs): as small "
         "as SELECT 1 but not a SELECT of literals alone, so not on the engine's literal "
         "path (it pays DuckDB's worker hand-off); beside pgwire.select1, no target"),
    ):  # fmt: skip
        samples = latency.samples
        for q in (50, 99):
            ours = harness.Spread.of([float(np.percentile(r, q)) for r in samples["wire"]])
            base = harness.Spread.of([float(np.percentile(r, q)) for r in samples["postgres"]])
            harness.record(
                rec, name if q == 50 else f"{name}.p99", ours, base, unit=f"us p{q}",
                group=G_TARGETS, baseline=pg_label, higher_is_better=False,
                target_ratio=1 / target if q == 50 and target is not None else None,
                target_label="PostgreSQL",
                note=f"{what}: round trip through psycopg, p{q} of each round, median over "
                "the rounds",
            )  # fmt: skip
        apart = latency.apart
        if apart.get("wire") and apart.get("postgres"):
            harness.record(
                rec, f"{name}.apart", harness.Spread.of(apart["wire"]),
                harness.Spread.of(apart["postgres"]), unit="share apart", group=G_TARGETS,
                baseline=f"{pg_label} backend", higher_is_better=False,
                note=f"{what}: share of the round trips (every {PLACEMENT_EVERY}th sampled, "
                "after it) whose serving thread had last run on another CPU than the client "
                "(bench.placement), median over the rounds; on this 2-vCPU VM a round trip "
                "between two vCPUs costs either system 2-3x the CPU of one on a single vCPU, "
                "so the latency figures above follow this share (docs/statement_cost.md, "
                "round 11)",
            )  # fmt: skip
        cpu = latency.server_cpu_us
        if cpu.get("wire") and cpu.get("postgres"):
            harness.record(
                rec, f"{name}.server_cpu", harness.Spread.of(cpu["wire"]),
                harness.Spread.of(cpu["postgres"]), unit="us CPU", group=G_TARGETS,
                baseline=f"{pg_label} backend", higher_is_better=False,
                note=f"{what}: CPU time of the serving process per round trip (topicbase "
                "serve's threads; PostgreSQL's backend of the connection), from /proc, "
                "median over the rounds; less disturbed by the machine's other load than "
                "the round trip",
            )  # fmt: skip


def _spread(rounds: dict[str, list[float]], name: str) -> harness.Spread:
    return harness.Spread.of(rounds[name])


def _record_raw_produce(rec: Recorder, produce: dict[str, list[float]], version: str) -> None:
    """Produce with server-side ``$n`` placeholders (``raw_produce_way``)."""
    harness.record(
        rec, "pgwire produce, $n placeholders (psycopg RawCursor): topicbase serve",
        _spread(produce, "wire $n"), _spread(produce, "embedded"), unit="msgs/s",
        group=G_THROUGHPUT, baseline="embedded Session", target_ratio=THROUGHPUT_TARGET,
        target=ratio_target(THROUGHPUT_TARGET, "embedded"),
        note="the same statement with $1..$1000 sent as written: no client-side %s rewrite",
    )  # fmt: skip
    harness.record(
        rec, "pgwire produce, $n placeholders (psycopg RawCursor): topicbase serve vs PostgreSQL",
        _spread(produce, "wire $n"), _spread(produce, "postgres $n"), unit="msgs/s",
        group=G_THROUGHPUT, baseline=version,
    )  # fmt: skip


def _record(
    rec: Recorder,
    produce: dict[str, list[float]],
    consume: dict[str, list[float]],
    select1: dict[str, list[np.ndarray]],
    version: str,
) -> None:
    unit = "msgs/s"
    target = ratio_target(THROUGHPUT_TARGET, "embedded")
    for name, rounds, way, targeted in (
        ("produce", produce, "wire", True),
        ("consume (text results)", consume, "wire", False),
        ("consume (binary results)", consume, "wire binary", True),
    ):
        harness.record(
            rec, f"pgwire {name}: psycopg via topicbase serve", _spread(rounds, way),
            _spread(rounds, "embedded"), unit=unit, group=G_THROUGHPUT,
            baseline="embedded Session", target=target if targeted else None,
            target_ratio=THROUGHPUT_TARGET if targeted else None,
            note=None if targeted else "target retired in issue 14 (psycopg's own text bytea "
            "parser costs as much as the embedded read)",
        )  # fmt: skip
    harness.record(rec, "pgwire produce: embedded Session", _spread(produce, "embedded"), None,
                   unit=unit, group=G_THROUGHPUT)  # fmt: skip
    harness.record(rec, "pgwire consume: embedded Session (Arrow result)",
                   _spread(consume, "embedded"), None, unit=unit, group=G_THROUGHPUT)  # fmt: skip
    harness.record(
        rec, "pgwire produce: topicbase serve vs PostgreSQL table INSERT", _spread(produce, "wire"),
        _spread(produce, "postgres"), unit=unit, group=G_THROUGHPUT, baseline=version,
    )  # fmt: skip
    harness.record(
        rec, "pgwire consume (text): topicbase serve vs PostgreSQL log table + offset row",
        _spread(consume, "wire"), _spread(consume, "postgres"), unit=unit, group=G_THROUGHPUT,
        baseline=version,
    )  # fmt: skip
    embedded = harness.Spread.of([float(np.percentile(r, 50)) for r in select1["embedded"]])
    harness.record(
        rec, "pgwire SELECT 1 p50: embedded Session (no network)", embedded, None, unit="us",
        group=G_LATENCY, note="the engine alone; through the wire see pgwire.select1",
    )  # fmt: skip
