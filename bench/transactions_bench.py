"""Transaction benchmarks: the move transaction against PostgreSQL, and YDB's latency test.

1. **The move workloads** (``WORKLOADS``), each against PostgreSQL 15 in the same
   run, the two sides alternating (``bench.harness``: Topicbase, PostgreSQL,
   Topicbase, …, ``reps`` timed repetitions each after one warm-up each):
   ``move_topics`` (100 messages of 1 KiB from topic ``a`` with consumer ``mover``
   to topic ``b``, no table: 4 and 16 sessions), ``move`` (the same plus an upsert
   of the session's counter row in a DuckDB table: 1, 4, 16 sessions) and
   ``bulk_move`` (1000 messages, no table, 4 sessions; messages/s). Topicbase runs
   in this process (sessions in threads; each a consumer member ``w<i>`` of topic
   ``a``, which has one partition per session, at least 4): ``INSERT INTO TOPIC b
   SELECT data FROM TOPIC a WITH (consumer, member, max_messages)``, the upsert,
   COMMIT; a 40001 is retried and counted. Topic ``a`` is filled through the
   storage API (untimed) before each repetition. Figures per repetition:
   transactions/s (or messages/s), p50/p99 of COMMIT and of the whole transaction,
   and fsyncs per commit on the commit path: our counted syncs
   (``store.fs.fsync_count`` + ``directory_fsync_count``) minus the background's
   (checkpoints' partition syncs, staging files made ahead), plus one DuckDB WAL
   ``fdatasync`` per session COMMIT that writes in DuckDB (not in our counter, so
   counted as COMMIT statements through ``engine.tables.run``; the COMMIT ending a
   topic-only transaction's read-only DuckDB transaction writes no WAL and is not
   counted, ``DuckDBCommitCounter``). In the full suite
   a short extra phase under ``strace -f -c`` counts every ``fsync``/``fdatasync``
   of the process as a cross-check.
2. **PostgreSQL's side** (``bench.postgres``): queue table -> log table, durable
   (``synchronous_commit = on``), over loopback TCP with psycopg 3 clients in
   threads: ``WITH moved AS (DELETE FROM queue_a WHERE id IN (SELECT id FROM
   queue_a ORDER BY id LIMIT n FOR UPDATE SKIP LOCKED) RETURNING payload) INSERT
   INTO log_b (payload) SELECT payload FROM moved``, the counter upsert for
   ``move``, COMMIT. Filled with binary COPY and vacuumed before each repetition.
3. **YDB's article test, scaled down**: a topic with 100 partitions; a writer
   session generates 1 KiB messages at a fixed rate (open loop: each message
   is stamped ``created_at`` with its scheduled time on the writer's clock),
   inserts them every 50 ms into its open transaction with an explicit
   ``partition`` (round robin) and COMMITs every 0.5 s; a reader thread
   long-polls with a consumer (``wait = Interval('PT1S')``). Write-ack latency
   = COMMIT returned - generated; end-to-end = reader saw it - ``created_at``.
   The first second is warm-up and left out of the percentiles.

Temp dirs go under ``$TOPICBASE_BENCH_DIR`` (or ``$TMPDIR``) and are deleted.
``$TOPICBASE_BENCH_WORKLOADS`` (comma-separated workload names, e.g. ``bulk_move``) runs
only those move workloads and skips the YDB-style test (one record, measured alone).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import resource
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

from bench import harness, postgres
from bench.results import Recorder
from bench.storage_bench import make_messages, zstd_ratio
from engine import tables
from engine.database import Database
from engine.session import Session
from storage.errors import SerializationFailure
from storage.record_batch import build_wire_batch

MB = 1_000_000
MOVE_BATCH = 100
PARTITIONS_A = 4  # at least; one per session when there are more sessions
FILL_BATCH = 1000
YDB_PARTITIONS = 100
YDB_TICK_S = 0.05
YDB_COMMIT_S = 0.5
YDB_WARMUP_S = 1.0
G_YDB = "transactions: YDB-style write/read latency (100 partitions, COMMIT every 0.5 s)"

TB_SETUP = (
    "CREATE TOPIC a (CONSUMER mover) WITH (min_active_partitions = {partitions}); "
    "CREATE TOPIC b WITH (min_active_partitions = {partitions}); "
    "CREATE TABLE counters (k VARCHAR PRIMARY KEY, n BIGINT NOT NULL)"
)
TB_MOVE = (
    "INSERT INTO TOPIC b (data) SELECT data FROM TOPIC a "
    "WITH (consumer = 'mover', member = '{{member}}', max_messages = {batch})"
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
    "SELECT id FROM queue_a ORDER BY id LIMIT {batch} FOR UPDATE SKIP LOCKED) "
    "RETURNING payload) INSERT INTO log_b (payload) SELECT payload FROM moved"
)
PG_UPSERT = (
    "INSERT INTO counters VALUES (%s, %s) ON CONFLICT (k) DO UPDATE SET n = counters.n + EXCLUDED.n"
)


@dataclass(frozen=True)
class Params:
    move_seconds: float  # one timed repetition of one side
    warmup_seconds: float
    reps: int
    strace_seconds: float  # 0: no strace cross-check
    ydb_seconds: float
    ydb_mb_s: float


QUICK = Params(
    move_seconds=0.8, warmup_seconds=0.3, reps=3, strace_seconds=0.0, ydb_seconds=4.0,
    ydb_mb_s=1.0,
)  # fmt: skip
FULL = Params(
    move_seconds=6.0, warmup_seconds=2.0, reps=5, strace_seconds=3.0, ydb_seconds=20.0,
    ydb_mb_s=4.0,
)  # fmt: skip


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
    duckdb_commits: int = 0  # COMMIT statements that write, checkpoints' included
    duckdb_read_only_commits: int = 0  # COMMITs ending read-only DuckDB transactions (no sync)
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
    """Counts the DuckDB commits that write: every ``COMMIT`` statement through
    ``engine.tables.run`` (sessions' and background checkpoints' alike), except the
    COMMIT that ends the read-only DuckDB transaction of an explicit transaction that
    touched no table (``Session._end_read_only_duckdb_transaction``, counted apart in
    ``read_only``). A DuckDB COMMIT without changes writes no WAL and makes no
    fdatasync (strace, 200 of each: read-only COMMITs 0 fdatasyncs, writing ones 200),
    so counting it as one attributed a sync the commit path never makes (topic-only
    moves at 4 sessions: 1.69 "fsyncs per commit" against 0.75 fsync+fdatasync per
    commit counted by strace over all threads, background included)."""

    def __init__(self) -> None:
        self.count = 0
        self.read_only = 0
        self._lock = threading.Lock()
        self._local = threading.local()

    def __enter__(self) -> DuckDBCommitCounter:
        self._run = original_run = tables.run
        self._end = original_end = Session._end_read_only_duckdb_transaction

        def counting_run(cursor: Any, sql: str, parameters: Any = None) -> None:
            if sql.strip().upper() == "COMMIT":
                with self._lock:
                    if getattr(self._local, "read_only", False):
                        self.read_only += 1
                    else:
                        self.count += 1
            original_run(cursor, sql, parameters)

        def marked_end(session: Session) -> None:
            self._local.read_only = True
            try:
                original_end(session)
            finally:
                self._local.read_only = False

        tables.run = counting_run
        Session._end_read_only_duckdb_transaction = marked_end  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        tables.run = self._run
        Session._end_read_only_duckdb_transaction = self._end  # type: ignore[method-assign]


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


# -- the move workloads -----------------------------------------------------------------
@dataclass(frozen=True)
class Workload:
    """A move transaction: ``batch`` messages from topic ``a`` to ``b``, with or without the
    counter upsert; records ``transactions.<name>.c<clients>``."""

    name: str
    batch: int
    counter: bool
    clients: tuple[int, ...]
    targets: dict[int, float]  # clients -> ratio asked of Topicbase / PostgreSQL
    per_message: bool = False  # the headline in messages/s instead of txn/s
    fsync_target: float | None = None  # fsyncs per commit on the commit path

    def describe(self) -> str:
        what = f"move {self.batch} msgs A->B" + (" + counter upsert" if self.counter else "")
        return f"transactions: {what}, COMMIT (1 KiB messages)"


WORKLOADS = (
    Workload("move_topics", MOVE_BATCH, False, (4, 16), {4: 1.5, 16: 1.5}, fsync_target=1.0),
    Workload("move", MOVE_BATCH, True, (1, 4, 16), {1: 0.6, 4: 0.6, 16: 1.0}, fsync_target=2.0),
    Workload("bulk_move", 1000, False, (4,), {4: 5.0}, per_message=True),
)


def _partitions(clients: int) -> int:
    """Topic ``a``'s partitions: each session is a consumer member owning at least one."""
    return max(PARTITIONS_A, clients)


def _fill_topic(
    database: Database, pool: Sequence[bytes], per_partition: int, start: int, partitions: int
) -> int:
    """Append ``per_partition`` pool messages to each partition of ``a`` (storage API)."""
    topic = database.topic_log(database.catalog.entry("a").topic_id)
    position = start
    for partition in range(partitions):
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


def _messages_for(rate: float, seconds: float, batch: int) -> int:
    """Messages that ``seconds`` at 2.5 times ``rate`` txn/s (at least 50) need (both
    sides: a phase faster than the one before by more than that would run dry, which its
    note says; 1.6 let 7 of 16 loaded runs of round 20 run dry and understate the rate)."""
    return int(max(rate, 50.0) * 2.5 * seconds * batch)


def _phase_figures(phase: Phase, per_message: bool) -> dict[str, float]:
    figures = {
        "rate": phase.messages / phase.seconds if per_message else phase.rate,
        "commit_p50_ms": phase.pct_ms("commit", 50),
        "commit_p99_ms": phase.pct_ms("commit", 99),
        "txn_p50_ms": phase.pct_ms("txn", 50),
        "txn_p99_ms": phase.pct_ms("txn", 99),
        "retries_per_txn": phase.retries / max(phase.transactions, 1),
        "ran_dry": float(phase.ran_dry),
    }
    return figures


class TopicbaseMove:
    """Topicbase's side of one point: a fresh database, ``clients`` sessions in threads."""

    def __init__(
        self, parent: str, work: Workload, clients: int, pool: Sequence[bytes], strace: float
    ) -> None:
        self.work, self.clients, self.pool, self.strace = work, clients, pool, strace
        self.partitions = _partitions(clients)
        self.root = tempfile.mkdtemp(prefix="tb-move-", dir=parent)
        self.database = Database.open(os.path.join(self.root, "data"))
        self.sessions: list[Any] = []
        self.position = 0
        self.rate = 600.0 if work.batch <= MOVE_BATCH else 60.0
        self.traced: tuple[int, int] | None = None
        setup = self.database.connect()
        setup.execute(TB_SETUP.format(partitions=self.partitions))
        setup.close()
        self.sessions = [self.database.connect() for _ in range(clients)]
        self.move = TB_MOVE.format(batch=work.batch)

    def close(self) -> None:
        for session in self.sessions:
            with contextlib.suppress(Exception):
                session.close()
        self.database.close()
        shutil.rmtree(self.root, ignore_errors=True)

    def transaction(self, index: int) -> tuple[int, float, float]:
        session = self.sessions[index]
        member = f"w{index + 1}"
        session.execute("BEGIN")
        tag = session.execute(self.move.format(member=member))[-1].tag
        moved = int(tag.split()[-1])
        if moved == 0:
            session.execute("ROLLBACK")
            return 0, 0.0, 0.0
        if self.work.counter:
            session.execute(TB_UPSERT, [member, moved])
        started = time.perf_counter()
        session.execute("COMMIT")
        return moved, time.perf_counter() - started, started

    def rollback(self, index: int) -> None:
        self.sessions[index].execute("ROLLBACK")  # a notice only if already rolled back

    @staticmethod
    def retryable(error: BaseException) -> bool:
        return isinstance(error, SerializationFailure)

    def top_up(self, seconds: float) -> None:
        missing = _messages_for(self.rate, seconds, self.work.batch) - _remaining(self.database)
        if missing > 0:
            per_partition = -(-missing // self.partitions // FILL_BATCH) * FILL_BATCH
            self.position = _fill_topic(
                self.database, self.pool, per_partition, self.position, self.partitions
            )

    def warm_up(self, seconds: float) -> Phase:
        self.top_up(seconds)
        phase = run_phase(self.clients, seconds, self.transaction, self.retryable, self.rollback)
        self.rate = max(phase.rate, 1.0)
        return phase

    def timed(self, seconds: float) -> dict[str, float]:
        self.top_up(seconds)
        fs, committer = self.database.store.fs, self.database.committer
        with DuckDBCommitCounter() as duck:
            fsyncs = fs.fsync_count + fs.directory_fsync_count
            checkpoints, checkpoint_syncs = committer.checkpoints, committer.checkpoint_syncs
            spare = committer.staging.spare_directory_syncs
            cpu = time.process_time()
            usage = resource.getrusage(resource.RUSAGE_SELF)
            phase = run_phase(self.clients, seconds, self.transaction, self.retryable,
                              self.rollback)  # fmt: skip
            cpu = time.process_time() - cpu
            after = resource.getrusage(resource.RUSAGE_SELF)
            phase.our_fsyncs = fs.fsync_count + fs.directory_fsync_count - fsyncs
            phase.duckdb_commits = duck.count
            phase.duckdb_read_only_commits = duck.read_only
            phase.checkpoints = committer.checkpoints - checkpoints
            phase.checkpoint_syncs = committer.checkpoint_syncs - checkpoint_syncs
            phase.spare_syncs = committer.staging.spare_directory_syncs - spare
        self.rate = max(phase.rate, 1.0)
        count = max(phase.transactions, 1)
        session_commits = phase.duckdb_commits - phase.checkpoints
        background_ours = phase.checkpoint_syncs + phase.spare_syncs
        ours = (phase.our_fsyncs - background_ours) / count
        figures = _phase_figures(phase, self.work.per_message)
        figures["fsyncs_per_commit"] = ours + session_commits / count
        figures["our_fsyncs_per_commit"] = ours
        figures["duckdb_commits_per_txn"] = session_commits / count
        figures["duckdb_read_only_commits_per_txn"] = phase.duckdb_read_only_commits / count
        figures["background_fsyncs_per_commit"] = (background_ours + phase.checkpoints) / count
        # The process's CPU (every thread: the engine's and the clients' loops, which are
        # a small part of it) per transaction: the currency of these points (issue 14).
        figures["cpu_ms_per_txn"] = cpu * 1000 / count
        # Its kernel part and the process's minor page faults per transaction: the same code
        # read 0.72-0.88 ms a transaction in one run and 1.15-1.27 in the next (session 23,
        # move_topics c4), and only these say whether the difference was the kernel's (page
        # cache, faults: docs/move_profile.md, round 24) or the interpreter's.
        figures["sys_ms_per_txn"] = (after.ru_stime - usage.ru_stime) * 1000 / count
        figures["minor_faults_per_txn"] = (after.ru_minflt - usage.ru_minflt) / count
        return figures

    def strace_sample(self, progress: Callable[[str], None]) -> None:
        """``strace -f -c`` over a short extra phase: every fsync/fdatasync of the process."""
        if not SyscallCounter.available() or self.strace <= 0:
            return
        self.top_up(self.strace)
        try:
            with SyscallCounter(self.root) as counter:
                sample = run_phase(self.clients, self.strace, self.transaction, self.retryable,
                                   self.rollback)  # fmt: skip
        except (OSError, RuntimeError) as error:
            progress(f"strace sample skipped: {error}")
            return
        if sample.transactions:
            self.traced = (counter.calls, sample.transactions)
            progress(
                f"strace sample: {counter.calls} fsync+fdatasync for {sample.transactions} "
                f"commits = {counter.calls / sample.transactions:.2f} per commit (all threads)"
            )


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


class PostgresMove:
    """PostgreSQL's side: queue table -> log table (+ the counter upsert), psycopg clients."""

    def __init__(
        self, dsn: str, psycopg: Any, work: Workload, clients: int, pool: Sequence[bytes]
    ) -> None:
        self.dsn, self.psycopg, self.work, self.clients, self.pool = (
            dsn, psycopg, work, clients, pool
        )  # fmt: skip
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute(PG_SETUP)
        self.conns = [psycopg.connect(dsn) for _ in range(clients)]
        self.move = PG_MOVE.format(batch=work.batch)
        self.position = 0
        self.rate = 600.0 if work.batch <= MOVE_BATCH else 60.0

    def close(self) -> None:
        for conn in self.conns:
            with contextlib.suppress(Exception):
                conn.close()

    def transaction(self, index: int) -> tuple[int, float, float]:
        conn = self.conns[index]
        with conn.cursor() as cur:
            cur.execute(self.move)  # psycopg opens the transaction (BEGIN)
            moved = cur.rowcount
            if moved <= 0:
                conn.rollback()
                return 0, 0.0, 0.0
            if self.work.counter:
                cur.execute(PG_UPSERT, (f"w{index + 1}", moved))
        started = time.perf_counter()
        conn.commit()
        return moved, time.perf_counter() - started, started

    def rollback(self, index: int) -> None:
        self.conns[index].rollback()

    def retryable(self, error: BaseException) -> bool:
        errors = self.psycopg.errors
        return isinstance(error, errors.SerializationFailure | errors.DeadlockDetected)

    def top_up(self, seconds: float) -> None:
        conn = self.conns[0]
        with conn.cursor() as cur:
            left = cur.execute("SELECT count(*) FROM queue_a").fetchone()[0]
        conn.commit()
        missing = _messages_for(self.rate, seconds, self.work.batch) - left
        if missing > 0:
            self.position = _pg_fill(conn, self.pool, missing, self.position)
        _pg_vacuum(self.dsn, self.psycopg)

    def warm_up(self, seconds: float) -> Phase:
        self.top_up(seconds)
        phase = run_phase(self.clients, seconds, self.transaction, self.retryable, self.rollback)
        self.rate = max(phase.rate, 1.0)
        return phase

    def timed(self, seconds: float) -> dict[str, float]:
        self.top_up(seconds)
        phase = run_phase(self.clients, seconds, self.transaction, self.retryable, self.rollback)
        self.rate = max(phase.rate, 1.0)
        return _phase_figures(phase, self.work.per_message)


def move_point(
    rec: Recorder,
    parent: str,
    cluster: postgres.Cluster | None,
    psycopg: Any,
    work: Workload,
    clients: int,
    params: Params,
    pool: Sequence[bytes],
) -> tuple[dict[str, harness.Spread], dict[str, harness.Spread] | None, TopicbaseMove]:
    """Warm both sides up, then Topicbase and PostgreSQL alternately, ``params.reps`` times."""
    ours = TopicbaseMove(parent, work, clients, pool, params.strace_seconds)
    theirs = None
    try:
        warm = ours.warm_up(params.warmup_seconds)
        rec.progress(f"topicbase {work.name} c{clients} warm-up: {warm.describe()}")
        sides = [harness.Side("topicbase", lambda rep: ours.timed(params.move_seconds))]
        if cluster is not None:
            theirs = PostgresMove(cluster.dsn, psycopg, work, clients, pool)
            warm = theirs.warm_up(params.warmup_seconds)
            rec.progress(f"postgres {work.name} c{clients} warm-up: {warm.describe()}")
            sides.append(harness.Side("postgres", lambda rep: theirs.timed(params.move_seconds)))
        spreads = harness.alternate(sides, params.reps, rec.progress)
        if work.fsync_target is not None:
            ours.strace_sample(rec.progress)
        return spreads["topicbase"], spreads.get("postgres"), ours
    finally:
        ours.close()
        if theirs is not None:
            theirs.close()


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
def _record_point(
    rec: Recorder,
    work: Workload,
    clients: int,
    ours: dict[str, harness.Spread],
    theirs: dict[str, harness.Spread] | None,
    pg_label: str,
    traced: tuple[int, int] | None,
) -> None:
    name = f"transactions.{work.name}.c{clients}"
    who = f"{clients} session{'s' if clients > 1 else ''}"
    group = work.describe()
    baseline = f"{pg_label} queue table -> log table" + (" + counter" if work.counter else "")
    retries = ours["retries_per_txn"].median
    dry = ours["ran_dry"].high > 0
    harness.record(
        rec, name, ours["rate"], theirs["rate"] if theirs else None,
        unit="msgs/s" if work.per_message else "txn/s", group=group,
        baseline=baseline if theirs else None, target_ratio=work.targets[clients],
        target_label="PostgreSQL",
        note=f"{who}, {work.batch} msgs/txn; {retries:.3f} 40001 retries/txn"
        + ("; source ran dry early" if dry else "")
        + "; in-process engine vs PostgreSQL over loopback TCP (synchronous_commit on)",
    )  # fmt: skip
    for metric, label in (
        ("commit_p50_ms", "COMMIT p50"),
        ("commit_p99_ms", "COMMIT p99"),
        ("txn_p50_ms", "whole transaction p50"),
        ("txn_p99_ms", "whole transaction p99"),
    ):
        harness.record(
            rec, f"{name}.{metric}", ours[metric], theirs[metric] if theirs else None,
            unit="ms", group=group, baseline=baseline if theirs else None,
            higher_is_better=False, note=f"{label}, {who}",
        )  # fmt: skip
    fsyncs = ours["fsyncs_per_commit"]
    cross = (
        f"; strace cross-check: {traced[0] / traced[1]:.2f} fsync+fdatasync/commit over all "
        "threads, background included"
        if traced
        else ""
    )
    rec.add(
        f"{name}.fsyncs_per_commit",
        fsyncs.median,
        "fsyncs/commit",
        group=group,
        spread=(fsyncs.low, fsyncs.high),
        reps=fsyncs.reps,
        target=None if work.fsync_target is None else f"<= {work.fsync_target:g} (commit path)",
        met=None if work.fsync_target is None else fsyncs.median <= work.fsync_target,
        note=(
            f"{who}; commit path = ours {ours['our_fsyncs_per_commit'].median:.3f} (staging or "
            "topic-log group commit, segment rolls: fs.fsync_count + directory syncs, minus "
            "the background's) + DuckDB "
            f"{ours['duckdb_commits_per_txn'].median:.3f} (one WAL fdatasync per session "
            "COMMIT that writes, counted as COMMITs; the "
            f"{ours['duckdb_read_only_commits_per_txn'].median:.3f} read-only COMMITs per "
            "transaction that end a topic-only transaction's DuckDB reads write no WAL and "
            "make no sync, so they are left out); background (checkpoints, "
            f"staging files made ahead) adds {ours['background_fsyncs_per_commit'].median:.3f}"
            + cross
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
    bench_dir = os.environ.get("TOPICBASE_BENCH_DIR") or None
    parent = tempfile.mkdtemp(prefix="topicbase-bench-", dir=bench_dir)
    try:
        pool = make_messages()
        single, joined = zstd_ratio(pool)
        rec.progress(
            f"data: {len(pool)} distinct 1 KiB messages, zstd-1 ratio {single:.2f}x per message, "
            f"{joined:.2f}x joined; temp dir {parent}; {params.reps} alternating repetitions "
            f"of {params.move_seconds:g}s per side"
        )
        with contextlib.ExitStack() as stack:
            cluster, psycopg, pg_label = None, None, "PostgreSQL"
            try:
                psycopg = postgres.ensure_psycopg(rec.progress)
                cluster = stack.enter_context(postgres.Cluster(parent=bench_dir, log=rec.progress))
                pg_label = postgres.short_version(cluster.version)
                rec.progress(f"{cluster.version} on 127.0.0.1:{cluster.port}")
            except Exception as error:  # the Topicbase figures stand without the baseline
                rec.progress(f"PostgreSQL baseline FAILED: {type(error).__name__}: {error}")
            only = [n for n in os.environ.get("TOPICBASE_BENCH_WORKLOADS", "").split(",") if n]
            for work in WORKLOADS:
                if only and work.name not in only:
                    continue
                for clients in work.clients:
                    rec.progress(f"-- {work.name}, {clients} session(s)")
                    ours, theirs, tb = move_point(
                        rec, parent, cluster, psycopg, work, clients, params, pool
                    )
                    _record_point(rec, work, clients, ours, theirs, pg_label, tb.traced)
        if only:
            return
        latency = ydb_latency(rec, parent, params, pool)
        rec.progress(
            f"ydb-style: {latency.messages:,} msgs, {latency.commits} commits, "
            f"ack p50 {np.percentile(latency.ack_s, 50) * 1000:.0f} ms, "
            f"e2e p50 {np.percentile(latency.e2e_s, 50) * 1000:.0f} ms"
        )
        _record_ydb(rec, latency, params)
    finally:
        shutil.rmtree(parent, ignore_errors=True)
