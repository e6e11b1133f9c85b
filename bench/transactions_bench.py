"""Transaction benchmarks: the move transaction against PostgreSQL, and YDB's latency test.

1. **move** (Topicbase): one transaction consumes 100 messages of 1 KiB
   (semi-compressible JSON-like, see ``storage_bench.make_messages``) from the
   4-partition topic ``a`` with consumer ``mover`` (each worker a member
   ``w<i>``, so each owns its partitions), writes them to topic ``b``
   (``INSERT INTO TOPIC b SELECT data FROM TOPIC a ...``), upserts its own
   counter row in a DuckDB table, and COMMITs; 1 and 4 sessions (threads). A
   40001 is retried and counted. Each point runs on a fresh data directory:
   topic ``a`` is prefilled through the storage API (1000-message batches,
   untimed), a warm-up phase (which also settles the members' leases) measures
   the rate, ``a`` is topped up for the timed phase (2x the warm-up rate), then
   the timed phase. Figures: transactions/s, p50/p99 of COMMIT and of the whole
   transaction (first BEGIN to the COMMIT that succeeded, retries included),
   and fsyncs per commit, split in two. *Commit path*: our counted syncs
   (``store.fs.fsync_count`` + ``directory_fsync_count``: the staging group
   commit, and any segment roll while publishing) minus the partition syncs of
   checkpoints, plus one DuckDB WAL ``fdatasync`` per session COMMIT (DuckDB's
   fsync is *not* in our counter). *Background*: the checkpoints, which run in
   their own thread every 256 commits: their partition syncs
   (``committer.checkpoint_syncs``) and one DuckDB commit each
   (``committer.checkpoints``); and the directory sync of each staging file
   the staging syncer creates ahead of need (``spare_directory_syncs``, one per
   64 MiB staged). The target applies to the commit path; the
   total is reported beside it. When ``strace`` is there, a short extra phase
   counts every ``fsync``/``fdatasync`` of the process (all threads, DuckDB's
   and the background's included) as a cross-check.
2. **move** (PostgreSQL 15 baseline, ``bench.postgres``): the same workload on
   queue tables, durable (``synchronous_commit = on``), over loopback TCP with
   psycopg 3: ``WITH moved AS (DELETE FROM queue_a WHERE id IN (SELECT id FROM
   queue_a ORDER BY id LIMIT 100 FOR UPDATE SKIP LOCKED) RETURNING payload)
   INSERT INTO log_b (payload) SELECT payload FROM moved``, a counter upsert
   per client, COMMIT. Prefilled with binary COPY, vacuumed before each phase.
3. **YDB's article test, scaled down**: a topic with 100 partitions; a writer
   session generates 1 KiB messages at a fixed rate (open loop: each message
   is stamped ``created_at`` with its scheduled time on the writer's clock),
   inserts them every 50 ms into its open transaction with an explicit
   ``partition`` (round robin) and COMMITs every 0.5 s; a reader thread
   long-polls with a consumer (``wait = Interval('PT1S')``). Write-ack latency
   = COMMIT returned - generated; end-to-end = reader saw it - ``created_at``.
   The first second is warm-up and left out of the percentiles.

Temp dirs go under ``$TOPICBASE_BENCH_DIR`` (or ``$TMPDIR``) and are deleted.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bench import postgres
from bench.results import Recorder, ratio_target
from bench.storage_bench import make_messages, zstd_ratio
from engine import tables
from engine.database import Database
from storage.errors import SerializationFailure
from storage.record_batch import build_wire_batch

MB = 1_000_000
MOVE_BATCH = 100
PARTITIONS_A = 4
FILL_BATCH = 1000
THROUGHPUT_TARGET = 5.0  # Topicbase move txn/s vs PostgreSQL
FSYNC_TARGET = 2.0  # fsyncs per commit on the commit path, ours + DuckDB's
FACTS_POSTGRES = {1: 134.0, 4: 219.0}  # shared/FACTS.md, this kind of machine
YDB_PARTITIONS = 100
YDB_TICK_S = 0.05
YDB_COMMIT_S = 0.5
YDB_WARMUP_S = 1.0
G_MOVE = "transactions: move 100 msgs A->B + counter upsert, COMMIT (1 KiB messages)"
G_YDB = "transactions: YDB-style write/read latency (100 partitions, COMMIT every 0.5 s)"

TB_SETUP = (
    f"CREATE TOPIC a (CONSUMER mover) WITH (min_active_partitions = {PARTITIONS_A}); "
    f"CREATE TOPIC b WITH (min_active_partitions = {PARTITIONS_A}); "
    "CREATE TABLE counters (k VARCHAR PRIMARY KEY, n BIGINT NOT NULL)"
)
TB_MOVE = (
    "INSERT INTO TOPIC b (data) SELECT data FROM TOPIC a "
    "WITH (consumer = 'mover', member = '{member}', max_messages = " + str(MOVE_BATCH) + ")"
)
TB_UPSERT = "INSERT INTO counters VALUES (?, ?) ON CONFLICT (k) DO UPDATE SET n = n + EXCLUDED.n"
PG_SETUP = """
DROP TABLE IF EXISTS queue_a, log_b, counters;
CREATE TABLE queue_a (id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, payload BYTEA NOT NULL);
CREATE TABLE log_b (id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, payload BYTEA NOT NULL);
CREATE TABLE counters (k TEXT PRIMARY KEY, n BIGINT NOT NULL);
"""
PG_MOVE = (
    "WITH moved AS (DELETE FROM queue_a WHERE id IN ("
    f"SELECT id FROM queue_a ORDER BY id LIMIT {MOVE_BATCH} FOR UPDATE SKIP LOCKED) "
    "RETURNING payload) INSERT INTO log_b (payload) SELECT payload FROM moved"
)
PG_UPSERT = (
    "INSERT INTO counters VALUES (%s, %s) ON CONFLICT (k) DO UPDATE SET n = counters.n + EXCLUDED.n"
)


@dataclass(frozen=True)
class Params:
    move_seconds: float
    warmup_seconds: float
    strace_seconds: float
    ydb_seconds: float
    ydb_mb_s: float
    clients: tuple[int, ...] = (1, 4)


QUICK = Params(
    move_seconds=5.0, warmup_seconds=1.0, strace_seconds=1.5, ydb_seconds=8.0, ydb_mb_s=1.0
)
FULL = Params(
    move_seconds=15.0, warmup_seconds=3.0, strace_seconds=3.0, ydb_seconds=20.0, ydb_mb_s=4.0
)


# -- shared -----------------------------------------------------------------------------
@dataclass
class Phase:
    """What the workers of one timed phase did."""

    clients: int
    seconds: float = 0.0
    transactions: int = 0
    messages: int = 0
    retries: int = 0
    ran_dry: bool = False
    commit_s: list[float] = field(default_factory=list)
    txn_s: list[float] = field(default_factory=list)
    our_fsyncs: int = 0  # fs.fsync_count + directory_fsync_count, all threads
    duckdb_commits: int = 0  # COMMIT statements, checkpoints' included
    checkpoints: int = 0  # checkpoints that committed (one DuckDB commit each)
    checkpoint_syncs: int = 0  # partition syncs made by checkpoints
    spare_syncs: int = 0  # directory syncs the staging syncer makes ahead (next file)

    @property
    def rate(self) -> float:
        return self.transactions / self.seconds if self.seconds else 0.0

    def pct_ms(self, which: str, q: float) -> float:
        values = self.commit_s if which == "commit" else self.txn_s
        return float(np.percentile(values, q)) * 1000 if values else float("nan")

    def describe(self) -> str:
        return (
            f"{self.rate:7.1f} txn/s ({self.transactions} txns, {self.messages:,} msgs in "
            f"{self.seconds:.1f}s), COMMIT p50 {self.pct_ms('commit', 50):.2f} "
            f"p99 {self.pct_ms('commit', 99):.2f} ms, txn p50 {self.pct_ms('txn', 50):.2f} "
            f"p99 {self.pct_ms('txn', 99):.2f} ms, {self.retries} retries"
            + (", RAN DRY" if self.ran_dry else "")
        )


@dataclass
class _Worker:
    commit_s: list[float] = field(default_factory=list)
    txn_s: list[float] = field(default_factory=list)
    transactions: int = 0
    messages: int = 0
    retries: int = 0
    dry: bool = False


def run_phase(
    clients: int,
    seconds: float,
    transaction: Callable[[int], tuple[int, float, float]],
    is_retryable: Callable[[BaseException], bool],
    rollback: Callable[[int], None],
) -> Phase:
    """``clients`` threads run ``transaction(index)`` until the deadline.

    ``transaction`` returns (messages moved, seconds of its COMMIT, start of
    its COMMIT); 0 messages means the source ran dry (the worker stops).
    """
    workers = [_Worker() for _ in range(clients)]
    barrier = threading.Barrier(clients + 1)
    errors: list[BaseException] = []
    deadline = [0.0]

    def body(index: int) -> None:
        me = workers[index]
        clock = time.perf_counter
        barrier.wait()
        try:
            while clock() < deadline[0]:
                started = clock()
                while True:
                    try:
                        moved, commit_s, _ = transaction(index)
                        break
                    except BaseException as error:
                        if not is_retryable(error):
                            raise
                        me.retries += 1
                        rollback(index)
                if moved == 0:
                    me.dry = True
                    return
                me.txn_s.append(clock() - started)
                me.commit_s.append(commit_s)
                me.transactions += 1
                me.messages += moved
        except BaseException as error:  # reported by the caller
            errors.append(error)

    threads = [threading.Thread(target=body, args=(i,), daemon=True) for i in range(clients)]
    for thread in threads:
        thread.start()
    start = time.perf_counter()
    deadline[0] = start + seconds
    barrier.wait()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - start
    if errors:
        raise errors[0]
    phase = Phase(clients, elapsed)
    for w in workers:
        phase.transactions += w.transactions
        phase.messages += w.messages
        phase.retries += w.retries
        phase.ran_dry |= w.dry
        phase.commit_s += w.commit_s
        phase.txn_s += w.txn_s
    return phase


class DuckDBCommitCounter:
    """Counts the DuckDB commits the engine makes: every ``COMMIT`` statement through
    ``engine.tables.run`` (sessions' and background checkpoints' alike)."""

    def __init__(self) -> None:
        self.count = 0
        self._lock = threading.Lock()

    def __enter__(self) -> DuckDBCommitCounter:
        self._run = original_run = tables.run

        def counting_run(cursor: Any, sql: str, parameters: Any = None) -> None:
            if sql.strip().upper() == "COMMIT":
                with self._lock:
                    self.count += 1
            original_run(cursor, sql, parameters)

        tables.run = counting_run
        return self

    def __exit__(self, *exc: object) -> None:
        tables.run = self._run


class SyscallCounter:
    """``strace -f -c`` attached to this process: counts fsync + fdatasync of all threads."""

    def __init__(self, parent: str) -> None:
        self.output = os.path.join(parent, "strace.txt")
        self.process: subprocess.Popen | None = None
        self.calls = 0

    @staticmethod
    def available() -> bool:
        return shutil.which("strace") is not None

    def _traced(self) -> bool:
        with open("/proc/self/status", encoding="ascii") as file:
            for line in file:
                if line.startswith("TracerPid:"):
                    return int(line.split()[1]) != 0
        return False

    def __enter__(self) -> SyscallCounter:
        self.process = subprocess.Popen(
            ["strace", "-f", "-qq", "-c", "-e", "trace=fsync,fdatasync", "-o", self.output,
             "-p", str(os.getpid())],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 5
        while not self._traced():
            if time.monotonic() > deadline or self.process.poll() is not None:
                self.process.kill()
                raise RuntimeError("strace did not attach")
            time.sleep(0.02)
        time.sleep(0.3)  # the other threads get attached right after the first
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        with open(self.output, encoding="utf-8") as file:
            for line in file:
                parts = line.split()
                if parts and parts[-1] in ("fsync", "fdatasync"):
                    self.calls += int(parts[3])


# -- Topicbase move ---------------------------------------------------------------------
def _fill_topic(database: Database, pool: Sequence[bytes], per_partition: int, start: int) -> int:
    """Append ``per_partition`` pool messages to each partition of ``a`` (storage API)."""
    topic = database.topic_log(database.catalog.entry("a").topic_id)
    position = start
    for partition in range(PARTITIONS_A):
        left = per_partition
        while left > 0:
            count = min(FILL_BATCH, left)
            items = [pool[(position + i) % len(pool)] for i in range(count)]
            topic.append(build_wire_batch(items), partition)
            position += count
            left -= count
    return position


def _remaining(database: Database) -> int:
    entry = database.catalog.entry("a")
    topic = database.topic_log(entry.topic_id)
    left = 0
    for partition in topic.partition_ids():
        committed = database.catalog.committed(entry.topic_id, "mover", partition) or 0
        left += topic.partition(partition).end_offset - committed
    return left


def _fill_for(rate: float, seconds: float) -> int:
    """Messages per partition that ``seconds`` at twice ``rate`` txn/s need."""
    need = max(rate, 50.0) * 2.0 * seconds * MOVE_BATCH
    return int(np.ceil(need / PARTITIONS_A / FILL_BATCH)) * FILL_BATCH


def topicbase_move(
    rec: Recorder, parent: str, clients: int, params: Params, pool: Sequence[bytes]
) -> tuple[Phase, tuple[int, int] | None]:
    """One point: the timed phase, and (fsync+fdatasync calls, commits) seen by strace."""
    root = tempfile.mkdtemp(prefix="tb-move-", dir=parent)
    database = Database.open(os.path.join(root, "data"))
    sessions: list[Any] = []
    try:
        setup = database.connect()
        setup.execute(TB_SETUP)
        setup.close()
        position = _fill_topic(database, pool, _fill_for(600, params.warmup_seconds), 0)
        sessions = [database.connect() for _ in range(clients)]

        def transaction(index: int) -> tuple[int, float, float]:
            session = sessions[index]
            member = f"w{index + 1}"
            session.execute("BEGIN")
            tag = session.execute(TB_MOVE.format(member=member))[-1].tag
            moved = int(tag.split()[-1])
            if moved == 0:
                session.execute("ROLLBACK")
                return 0, 0.0, 0.0
            session.execute(TB_UPSERT, [member, moved])
            started = time.perf_counter()
            session.execute("COMMIT")
            return moved, time.perf_counter() - started, started

        def rollback(index: int) -> None:
            sessions[index].execute("ROLLBACK")  # a notice only if already rolled back

        def retryable(error: BaseException) -> bool:
            return isinstance(error, SerializationFailure)

        warm = run_phase(clients, params.warmup_seconds, transaction, retryable, rollback)
        rec.progress(f"topicbase move, {clients} session(s), warm-up: {warm.describe()}")
        timed_seconds = params.move_seconds + params.strace_seconds
        want = _fill_for(warm.rate, timed_seconds) * PARTITIONS_A
        missing = want - _remaining(database)
        if missing > 0:
            per_partition = int(np.ceil(missing / PARTITIONS_A / FILL_BATCH)) * FILL_BATCH
            position = _fill_topic(database, pool, per_partition, position)
        fs, committer = database.store.fs, database.committer
        with DuckDBCommitCounter() as duck:
            fsyncs = fs.fsync_count + fs.directory_fsync_count
            checkpoints, checkpoint_syncs = committer.checkpoints, committer.checkpoint_syncs
            spare_syncs = committer.staging.spare_directory_syncs
            phase = run_phase(clients, params.move_seconds, transaction, retryable, rollback)
            phase.our_fsyncs = fs.fsync_count + fs.directory_fsync_count - fsyncs
            phase.duckdb_commits = duck.count
            phase.checkpoints = committer.checkpoints - checkpoints
            phase.checkpoint_syncs = committer.checkpoint_syncs - checkpoint_syncs
            phase.spare_syncs = committer.staging.spare_directory_syncs - spare_syncs
        rec.progress(f"topicbase move, {clients} session(s): {phase.describe()}")
        traced = None
        if SyscallCounter.available() and params.strace_seconds > 0:
            try:
                with SyscallCounter(root) as counter:
                    sample = run_phase(
                        clients, params.strace_seconds, transaction, retryable, rollback
                    )
                if sample.transactions:
                    rec.progress(
                        f"strace sample: {counter.calls} fsync+fdatasync for "
                        f"{sample.transactions} commits = {counter.calls / sample.transactions:.2f}"
                        " per commit (all threads, DuckDB's included)"
                    )
                    traced = (counter.calls, sample.transactions)
            except (OSError, RuntimeError) as error:
                rec.progress(f"strace sample skipped: {error}")
        return phase, traced
    finally:
        for session in sessions:
            with contextlib.suppress(Exception):
                session.close()
        database.close()
        shutil.rmtree(root, ignore_errors=True)


# -- PostgreSQL move --------------------------------------------------------------------
def _pg_fill(conn: Any, pool: Sequence[bytes], count: int, start: int) -> int:
    copy_sql = "COPY queue_a (payload) FROM STDIN (FORMAT BINARY)"
    with conn.cursor() as cur, cur.copy(copy_sql) as copy:
        copy.set_types(["bytea"])
        for i in range(start, start + count):
            copy.write_row((pool[i % len(pool)],))
    conn.commit()
    return start + count


def _pg_vacuum(dsn: str, psycopg: Any) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE queue_a, log_b, counters")


def postgres_move(
    rec: Recorder, dsn: str, psycopg: Any, clients: int, params: Params, pool: Sequence[bytes]
) -> Phase:
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(PG_SETUP)
    conns = [psycopg.connect(dsn) for _ in range(clients)]
    try:
        position = _pg_fill(conns[0], pool, _fill_for(600, params.warmup_seconds) * PARTITIONS_A, 0)
        _pg_vacuum(dsn, psycopg)

        def transaction(index: int) -> tuple[int, float, float]:
            conn = conns[index]
            with conn.cursor() as cur:
                cur.execute(PG_MOVE)  # psycopg opens the transaction (BEGIN)
                moved = cur.rowcount
                if moved <= 0:
                    conn.rollback()
                    return 0, 0.0, 0.0
                cur.execute(PG_UPSERT, (f"w{index + 1}", moved))
            started = time.perf_counter()
            conn.commit()
            return moved, time.perf_counter() - started, started

        def rollback(index: int) -> None:
            conns[index].rollback()

        def retryable(error: BaseException) -> bool:
            return isinstance(
                error, psycopg.errors.SerializationFailure | psycopg.errors.DeadlockDetected
            )

        warm = run_phase(clients, params.warmup_seconds, transaction, retryable, rollback)
        rec.progress(f"postgres move, {clients} client(s), warm-up: {warm.describe()}")
        with conns[0].cursor() as cur:
            left = cur.execute("SELECT count(*) FROM queue_a").fetchone()[0]
        conns[0].commit()
        missing = _fill_for(warm.rate, params.move_seconds) * PARTITIONS_A - left
        if missing > 0:
            position = _pg_fill(conns[0], pool, missing, position)
        _pg_vacuum(dsn, psycopg)
        phase = run_phase(clients, params.move_seconds, transaction, retryable, rollback)
        rec.progress(f"postgres move, {clients} client(s): {phase.describe()}")
        return phase
    finally:
        for conn in conns:
            with contextlib.suppress(Exception):
                conn.close()


def postgres_points(
    rec: Recorder, params: Params, pool: Sequence[bytes]
) -> tuple[dict[int, Phase], str]:
    psycopg = postgres.ensure_psycopg(rec.progress)
    results: dict[int, Phase] = {}
    with postgres.Cluster(
        parent=os.environ.get("TOPICBASE_BENCH_DIR") or None, log=rec.progress
    ) as cluster:
        rec.progress(f"{cluster.version} on 127.0.0.1:{cluster.port} in {cluster.root}")
        for clients in params.clients:
            results[clients] = postgres_move(rec, cluster.dsn, psycopg, clients, params, pool)
        return results, cluster.version


# -- YDB-style latency ------------------------------------------------------------------
@dataclass
class LatencyRun:
    seconds: float
    messages: int
    bytes: int
    ack_s: np.ndarray
    e2e_s: np.ndarray
    commits: int
    commit_s: list[float]
    unseen: int


def ydb_latency(rec: Recorder, parent: str, params: Params, pool: Sequence[bytes]) -> LatencyRun:
    root = tempfile.mkdtemp(prefix="tb-ydb-", dir=parent)
    database = Database.open(os.path.join(root, "data"))
    writer = database.connect()
    reader = database.connect()
    try:
        writer.execute(
            f"CREATE TOPIC t (CONSUMER reader) WITH (min_active_partitions = {YDB_PARTITIONS})"
        )
        rate = params.ydb_mb_s * MB / len(pool[0])  # messages/s
        insert = (
            "INSERT INTO TOPIC t (data, partition, created_at) "
            "SELECT unnest(?), unnest(?), unnest(?)"
        )
        stop_reading = threading.Event()
        seen: list[tuple[np.ndarray, float]] = []  # (created_at us, seen at wall time)
        errors: list[BaseException] = []

        def read_loop() -> None:
            query = (
                "SELECT created_at FROM TOPIC t WITH (consumer = 'reader', "
                "wait = Interval('PT1S'), max_messages = 10000)"
            )
            try:
                while True:
                    table = reader.execute(query)[-1].table
                    now = time.time()
                    if table is not None and table.num_rows:
                        created = table.column("created_at").cast("int64").to_numpy()
                        seen.append((created, now))
                    elif stop_reading.is_set():
                        return
            except BaseException as error:
                errors.append(error)

        thread = threading.Thread(target=read_loop, daemon=True)
        thread.start()
        wall0, perf0 = time.time(), time.perf_counter()
        total = int(rate * params.ydb_seconds)
        generated = 0
        sent_bytes = 0
        ack: list[np.ndarray] = []
        commit_s: list[float] = []
        pending_scheduled: list[float] = []  # perf-clock schedule of the open transaction
        next_commit = perf0 + YDB_COMMIT_S
        writer.execute("BEGIN")
        while generated < total or pending_scheduled:
            now = time.perf_counter()
            due = min(total, int((now - perf0) * rate))
            if due > generated:
                indexes = range(generated, due)
                scheduled = [i / rate for i in indexes]
                data = [pool[i % len(pool)] for i in indexes]
                partitions = [i % YDB_PARTITIONS for i in indexes]
                created = [dt.datetime.fromtimestamp(wall0 + s, dt.UTC) for s in scheduled]
                writer.execute(insert, [data, partitions, created])
                pending_scheduled += scheduled
                sent_bytes += sum(len(d) for d in data)
                generated = due
            now = time.perf_counter()
            if now >= next_commit or (generated >= total and pending_scheduled):
                started = time.perf_counter()
                writer.execute("COMMIT")
                done = time.perf_counter()
                commit_s.append(done - started)
                ack.append(done - perf0 - np.array(pending_scheduled))
                pending_scheduled = []
                next_commit += YDB_COMMIT_S
                if generated < total:
                    writer.execute("BEGIN")
                continue
            time.sleep(max(0.0, min(next_commit, now + YDB_TICK_S) - time.perf_counter()))
        elapsed = time.perf_counter() - perf0
        stop_reading.set()
        thread.join(timeout=30)
        if errors:
            raise errors[0]
        warm_us = (wall0 + YDB_WARMUP_S) * 1e6
        e2e = []
        count_seen = 0
        for created, now in seen:
            count_seen += len(created)
            keep = created >= warm_us
            e2e.append(now - created[keep] / 1e6)
        ack_all = np.concatenate(ack) if ack else np.array([])
        schedule = np.arange(len(ack_all)) / rate
        return LatencyRun(
            seconds=elapsed,
            messages=generated,
            bytes=sent_bytes,
            ack_s=ack_all[schedule >= YDB_WARMUP_S],
            e2e_s=np.concatenate(e2e) if e2e else np.array([]),
            commits=len(commit_s),
            commit_s=commit_s,
            unseen=generated - count_seen,
        )
    finally:
        for session in (writer, reader):
            with contextlib.suppress(Exception):
                session.close()
        database.close()
        shutil.rmtree(root, ignore_errors=True)


# -- recording --------------------------------------------------------------------------
def _record_move(
    rec: Recorder,
    tb: dict[int, tuple[Phase, tuple[int, int] | None]],
    pg: dict[int, Phase],
    pg_label: str,
) -> None:
    for clients, (phase, traced) in tb.items():
        base = pg.get(clients)
        who = f"{clients} session{'s' if clients > 1 else ''}"
        name = f"transactions.move.c{clients}.topicbase"
        baseline = f"{pg_label}, {clients} client{'s' if clients > 1 else ''}" if base else None
        ratio = phase.rate / base.rate if base and base.rate else None
        rec.add(
            f"{name}.txn_s",
            phase.rate,
            "txn/s",
            group=G_MOVE,
            baseline=baseline,
            baseline_value=base.rate if base else None,
            target=ratio_target(THROUGHPUT_TARGET, "PostgreSQL"),
            met=None if ratio is None else ratio >= THROUGHPUT_TARGET,
            note=(
                f"{who}; {phase.retries} 40001 retries"
                f" ({phase.retries / max(phase.transactions, 1):.3f}/txn)"
                + ("; source ran dry early" if phase.ran_dry else "")
                + "; in-process engine vs PostgreSQL over loopback TCP"
            ),
        )
        for which, label in (("commit", "COMMIT"), ("txn", "whole transaction")):
            for q in (50, 99):
                rec.add(
                    f"{name}.{which}_p{q}_ms",
                    phase.pct_ms(which, q),
                    "ms",
                    group=G_MOVE,
                    baseline=baseline,
                    baseline_value=base.pct_ms(which, q) if base else None,
                    note=f"{label} latency p{q}, {who}"
                    + ("; first BEGIN to COMMIT, retries included" if which == "txn" else ""),
                )
        count = max(phase.transactions, 1)
        session_commits = phase.duckdb_commits - phase.checkpoints
        background_ours = phase.checkpoint_syncs + phase.spare_syncs
        ours_commit_path = (phase.our_fsyncs - background_ours) / count
        commit_path = ours_commit_path + session_commits / count
        background = (background_ours + phase.checkpoints) / count
        rec.add(
            f"{name}.fsyncs_per_commit",
            commit_path,
            "fsyncs/commit",
            group=G_MOVE,
            target=f"<= {FSYNC_TARGET:g} fsyncs/commit on the commit path",
            met=commit_path <= FSYNC_TARGET,
            note=(
                f"{who}; commit path: ours {ours_commit_path:.3f} (staging group commit, "
                "segment rolls; fs.fsync_count + directory syncs, minus the background's) + "
                f"DuckDB {session_commits / count:.3f} (one WAL fdatasync per session COMMIT, "
                "not in our counter, so counted as COMMITs); the background (checkpoints, "
                f"staging's next file made ahead) adds {background:.3f} more (total "
                f"{commit_path + background:.3f})"
                + (
                    f"; strace cross-check: {traced[0] / traced[1]:.2f} fsync+fdatasync/commit"
                    " over all threads, background included"
                    if traced
                    else ""
                )
            ),
        )
        rec.add(
            f"{name}.fsyncs_per_commit_total",
            commit_path + background,
            "fsyncs/commit",
            group=G_MOVE,
            note=(
                f"{who}; commit path {commit_path:.3f} + background {background:.3f} "
                f"({phase.checkpoints} checkpoint(s) in {phase.transactions} commits: "
                f"{phase.checkpoint_syncs} partition syncs + one DuckDB commit each; "
                f"{phase.spare_syncs} directory sync(s) for staging's next file)"
            ),
        )
        rec.add(
            f"{name}.our_fsyncs_per_commit",
            phase.our_fsyncs / count,
            "fsyncs/commit",
            group=G_MOVE,
            note=f"{who}; fs.fsync_count + directory syncs, all threads; DuckDB's WAL "
            "fdatasync not included",
        )
        rec.add(
            f"{name}.duckdb_commits_per_txn",
            phase.duckdb_commits / count,
            "commits/txn",
            group=G_MOVE,
            note=f"{who}; COMMITs issued: sessions' + background checkpoints'",
        )
    for clients, phase in pg.items():
        rec.add(
            f"transactions.move.c{clients}.postgres.txn_s",
            phase.rate,
            "txn/s",
            group=G_MOVE,
            baseline="shared/FACTS.md earlier measurement",
            baseline_value=FACTS_POSTGRES.get(clients),
            note=(
                f"{pg_label}, {clients} client(s), synchronous_commit on; COMMIT p50 "
                f"{phase.pct_ms('commit', 50):.2f} ms p99 {phase.pct_ms('commit', 99):.2f} ms; "
                f"{phase.retries} retries" + ("; queue ran dry early" if phase.ran_dry else "")
            ),
        )


def _record_ydb(rec: Recorder, run: LatencyRun, params: Params) -> None:
    achieved = run.bytes / MB / run.seconds
    rec.add(
        "transactions.ydb100.write_mb_s",
        achieved,
        "MB/s",
        group=G_YDB,
        baseline="offered rate",
        baseline_value=params.ydb_mb_s,
        note=(
            f"{run.messages:,} msgs of 1 KiB in {run.seconds:.1f}s, {run.commits} commits "
            f"(COMMIT p50 {np.percentile(run.commit_s, 50) * 1000:.1f} ms); "
            f"{run.unseen} never seen by the reader"
        ),
    )
    for q in (50, 95, 99):
        rec.add(
            f"transactions.ydb100.write_ack_p{q}_ms",
            float(np.percentile(run.ack_s, q)) * 1000,
            "ms",
            group=G_YDB,
            note=f"generated -> its transaction's COMMIT returned, p{q}; txn every 0.5 s",
        )
    for q in (50, 95, 99):
        rec.add(
            f"transactions.ydb100.e2e_p{q}_ms",
            float(np.percentile(run.e2e_s, q)) * 1000,
            "ms",
            group=G_YDB,
            note=f"created_at -> reader (long poll, consumer) saw it, p{q}",
        )


# -- entry point ------------------------------------------------------------------------
def run(rec: Recorder) -> None:
    params = QUICK if rec.quick else FULL
    parent = tempfile.mkdtemp(
        prefix="topicbase-bench-", dir=os.environ.get("TOPICBASE_BENCH_DIR") or None
    )
    try:
        pool = make_messages()
        single, joined = zstd_ratio(pool)
        rec.progress(
            f"data: {len(pool)} distinct 1 KiB messages, zstd-1 ratio {single:.2f}x per message, "
            f"{joined:.2f}x joined; temp dir {parent}"
        )
        tb: dict[int, tuple[Phase, tuple[int, int] | None]] = {}
        for clients in params.clients:
            tb[clients] = topicbase_move(rec, parent, clients, params, pool)
        pg: dict[int, Phase] = {}
        pg_label = "PostgreSQL queue tables"
        try:
            pg, version = postgres_points(rec, params, pool)
            pg_label = version.replace("postgres (PostgreSQL) ", "PostgreSQL ").split(" (")[0]
        except Exception as error:  # the Topicbase figures stand without the baseline
            rec.progress(f"PostgreSQL baseline FAILED: {type(error).__name__}: {error}")
        _record_move(rec, tb, pg, pg_label)
        latency = ydb_latency(rec, parent, params, pool)
        rec.progress(
            f"ydb-style: {latency.messages:,} msgs, {latency.commits} commits, "
            f"ack p50 {np.percentile(latency.ack_s, 50) * 1000:.0f} ms, "
            f"e2e p50 {np.percentile(latency.e2e_s, 50) * 1000:.0f} ms"
        )
        _record_ydb(rec, latency, params)
    finally:
        shutil.rmtree(parent, ignore_errors=True)
