"""What bounds the move with the counter upsert: ``python -m bench.move_ceiling MODE``.

Two measurements behind docs/move_profile.md's round 6 (issue 14, ``transactions.move``):

- ``sessions``: the move of ``bench.transactions_bench`` (``--topics-only``: without the
  upsert; ``--batch 1000``: the bulk move) from ``--sessions`` threads of one process for
  ``--seconds``, after a half-second warm-up: transactions per second, the process's CPU
  time per transaction (every thread's) and the split of ``bench.profile_move --split``
  (the committer's steps and each kind of DuckDB statement), wall time summed over the
  sessions' threads, per transaction.
- ``duckdb``: DuckDB alone, no Topicbase: ``--threads`` threads, each with its own
  cursor of one database opened as the engine opens it (``engine.tables.connect``), run
  the DuckDB statements of one move transaction, ``BEGIN TRANSACTION``, the counter
  upsert's UPDATE (the statement ``planner.duckdb_sql.counter_update`` gives for the
  bench's upsert, each thread its own key), the commit record row (``engine.commit``'s
  ``RECORD_INSERT`` and table) and ``COMMIT``, as fast as they can. ``--no-record``
  leaves the record row out; ``--group G`` (one thread) puts G transactions' upserts and
  record rows in one DuckDB transaction (a group commit DuckDB does not do by itself):
  the ceiling of each design's DuckDB part, to compare with PostgreSQL's whole move.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import resource
import shutil
import tempfile
import threading
import time
from collections.abc import Callable

from bench.profile_move import _split_timers
from bench.storage_bench import make_messages
from bench.transactions_bench import (
    FILL_BATCH,
    MOVE_BATCH,
    PARTITIONS_A,
    TB_MOVE,
    TB_SETUP,
    TB_UPSERT,
    _fill_topic,
)
from engine import tables
from engine.catalog import SCHEMA
from engine.commit import RECORD_INSERT, RECORDS_DDL
from engine.database import Database
from storage.errors import SerializationFailure

# Moves a second topic ``a`` is filled for (mode sessions): above any rate measured yet
# (~1,000 txn/s on this machine), so that the fill does not bound the rate (RAN DRY if it does).
FILL_RATE_DEFAULT = 2500.0
# The UPDATE the counter-upsert shortcut runs for TB_UPSERT (``Session._upsert_by_update``).
COUNTER_UPDATE = "UPDATE counters SET n = n + CAST($1 AS BIGINT) WHERE k = CAST($2 AS TEXT)"
# The same for a group of transactions' deltas (keys and amounts as two lists): adding
# each key's sum equals adding each delta in turn, in any order.
GROUP_UPDATE = (
    "UPDATE counters SET n = n + d.v FROM (SELECT k, sum(v)::BIGINT AS v FROM "
    "(SELECT unnest(?::TEXT[]) AS k, unnest(?::BIGINT[]) AS v) GROUP BY k) AS d "
    "WHERE counters.k = d.k"
)
# What a record row holds for a move of one partition (``Committer.write_record``).
ITEMS = json.dumps([["0f1e2d3c4b5a69788796a5b4c3d2e1f0", 3, 12, 1234567, 104_000]])
OFFSETS = json.dumps([["00112233445566778899aabbccddeeff", "mover", 3, 1234567]])


def sessions_run(
    sessions: int, seconds: float, topics_only: bool, batch: int,
    fill_rate: float = FILL_RATE_DEFAULT,
) -> str:  # fmt: skip
    """The move from ``sessions`` threads: a report (rate, CPU, split). Topic ``a`` gets
    enough messages for ``fill_rate`` moves a second (of 100 messages; 10x for a batch over
    100), so that the run does not run dry; if a session finds it empty during the timed
    run, the head line says RAN DRY: the rate is then the fill's, not the engine's (up to
    round 20 the fill was fixed at 800 moves a second, and so was every rate measured)."""
    root = tempfile.mkdtemp(prefix="topicbase-move-ceiling-",
                            dir=os.environ.get("TOPICBASE_BENCH_DIR") or None)  # fmt: skip
    database = Database.open(os.path.join(root, "data"))
    try:
        partitions = max(PARTITIONS_A, sessions)
        setup = database.connect()
        setup.execute(TB_SETUP.format(partitions=partitions))
        setup.close()
        wanted = int(fill_rate * (seconds + 0.5) * MOVE_BATCH * (10 if batch > MOVE_BATCH else 1))
        per_partition = -(-wanted // partitions // FILL_BATCH) * FILL_BATCH
        _fill_topic(database, make_messages(), per_partition, 0, partitions)
        connected = [database.connect() for _ in range(sessions)]
        move = TB_MOVE.format(batch=batch)
        stop = threading.Event()
        counts = [0] * sessions
        retries = [0] * sessions
        dry = [False] * sessions

        def body(index: int) -> None:
            session, member = connected[index], f"w{index + 1}"
            text = move.format(member=member)
            while not stop.is_set():
                session.execute("BEGIN")
                try:
                    moved = int(session.execute(text)[-1].tag.split()[-1])
                    if not moved:
                        session.execute("ROLLBACK")
                        dry[index] = True
                        return
                    if not topics_only:
                        session.execute(TB_UPSERT, [member, moved])
                    session.execute("COMMIT")
                except SerializationFailure:  # a lease moved (members joining): retry
                    session.execute("ROLLBACK")
                    retries[index] += 1
                    continue
                counts[index] += 1

        _run_threads(body, sessions, 0.5, stop)
        counts[:] = [0] * sessions
        retries[:] = [0] * sessions
        dry[:] = [False] * sessions
        spent: dict[str, float] = collections.defaultdict(float)
        calls: collections.Counter = collections.Counter()
        applier = database.committer.deltas.stats
        applied = (applier.groups, applier.records, applier.keys)
        threads_before = _thread_cpu()
        switches = resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw
        cpu, wall = time.process_time(), time.perf_counter()
        with _split_timers(spent, calls):
            _run_threads(body, sessions, seconds, stop)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        switches = resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw - switches
        threads_after = _thread_cpu()
        applied = tuple(b - a for a, b in zip(applied, (applier.groups, applier.records,
                                                        applier.keys), strict=True))  # fmt: skip
        for session in connected:
            session.close()
    finally:
        database.close()
        shutil.rmtree(root, ignore_errors=True)
    total = max(sum(counts), 1)
    kind = "topic-only move" if topics_only else "move + counter upsert"
    lines = [f"{kind} of {batch} messages, {sessions} sessions: {total / wall:.0f} txn/s, "
             f"{cpu / total * 1000:.3f} ms process CPU per transaction, "
             f"{sum(retries) / total:.3f} retries per transaction, "
             f"load {os.getloadavg()[0]:.1f}"
             + (", RAN DRY (raise --fill-rate)" if any(dry) else "")]  # fmt: skip
    lines += [f"    {label:40} {spent[label] / total * 1000:7.3f} ms/txn (summed over threads)"
              for label in sorted(spent, key=spent.__getitem__, reverse=True)]  # fmt: skip
    if applied[0]:
        lines.append(f"  counter-delta applier: {applied[0] / total:.3f} groups per transaction, "
                     f"{applied[1] / applied[0]:.1f} records and {applied[2] / applied[0]:.1f} "
                     "keys per group")  # fmt: skip
    by_kind: dict[str, float] = collections.defaultdict(float)
    switched: dict[str, int] = collections.defaultdict(int)
    for tid, (kind, ns, count) in threads_after.items():
        by_kind[kind] += ns - threads_before.get(tid, (kind, 0, 0))[1]
        switched[kind] += count - threads_before.get(tid, (kind, 0, 0))[2]
    # The session threads start and end within the run: the rest of the process's figures.
    by_kind["sessions"] = max(cpu * 1e9 - sum(by_kind.values()), 0)
    switched["sessions"] = switches - sum(switched.values())
    lines.append("  CPU ms per transaction by thread: " + ", ".join(
        f"{kind} {ns / total / 1e6:.3f}" for kind, ns in sorted(
            by_kind.items(), key=lambda item: -item[1]) if ns > 0))  # fmt: skip
    lines.append("  voluntary context switches per transaction by thread: " + ", ".join(
        f"{kind} {count / total:.1f}" for kind, count in sorted(
            switched.items(), key=lambda item: -item[1]) if count > 0))  # fmt: skip
    return "\n".join(lines)


def _thread_cpu() -> dict[int, tuple[str, int, int]]:
    """Every thread of this process: its kind (the Python thread's name without its
    number, else the OS name: DuckDB's workers), the nanoseconds it ran (schedstat) and
    its voluntary context switches (``/proc``)."""
    names = {t.native_id: re.sub(r"[-_ ]?\d+.*$", "", t.name) or t.name
             for t in threading.enumerate()}  # fmt: skip
    found = {}
    for tid_text in os.listdir("/proc/self/task"):
        tid = int(tid_text)
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as stat:
                ns = int(stat.read().split()[0])
            with open(f"/proc/self/task/{tid}/comm") as comm:
                os_name = comm.read().strip()
            with open(f"/proc/self/task/{tid}/status") as status:
                switches = sum(int(line.split()[1]) for line in status
                               if line.startswith("voluntary_ctxt"))  # fmt: skip
        except OSError:
            continue
        found[tid] = (names.get(tid) or re.sub(r"[-_ ]?\d+$", "", os_name), ns, switches)
    return found


def _run_threads(body: Callable[[int], None], count: int, seconds: float,
                 stop: threading.Event) -> None:  # fmt: skip
    """``count`` threads run ``body(index)`` for ``seconds``: ``stop`` is cleared, the
    threads started, ``stop`` set after ``seconds``; returns when every thread ended."""
    stop.clear()
    workers = [threading.Thread(target=body, args=(i,)) for i in range(count)]
    for worker in workers:
        worker.start()
    time.sleep(seconds)
    stop.set()
    for worker in workers:
        worker.join()


def duckdb_alone(threads: int, seconds: float, record: bool, group: int) -> str:
    """DuckDB's part of the move alone, from ``threads`` threads (or ``group`` transactions
    per DuckDB transaction from one): a report (transactions/s, CPU per transaction)."""
    assert group == 1 or threads == 1, "a group runs from one thread"
    root = tempfile.mkdtemp(prefix="topicbase-duckdb-alone-",
                            dir=os.environ.get("TOPICBASE_BENCH_DIR") or None)  # fmt: skip
    connection = tables.connect(os.path.join(root, tables.TABLES_FILE))
    try:
        connection.execute(f"CREATE SCHEMA {SCHEMA}")
        connection.execute(RECORDS_DDL)
        connection.execute("CREATE TABLE counters (k VARCHAR PRIMARY KEY, n BIGINT NOT NULL)")
        keys = [f"w{i + 1}" for i in range(max(threads, group))]
        connection.execute("INSERT INTO counters SELECT unnest(?::VARCHAR[]), 0", [keys])
        ids = iter(range(1, 1 << 62))
        lock = threading.Lock()
        stop = threading.Event()
        counts = [0] * threads

        def body(index: int) -> None:
            cursor = connection.cursor()
            while not stop.is_set():
                with lock:
                    first = next(ids)
                    for _ in range(group - 1):
                        next(ids)
                cursor.execute("BEGIN TRANSACTION")
                if group == 1:
                    cursor.execute(COUNTER_UPDATE, [MOVE_BATCH, keys[index]])
                else:  # the group's deltas, summed by key, in one UPDATE
                    cursor.execute(GROUP_UPDATE, [keys[:group], [MOVE_BATCH] * group])
                cursor.fetchone()
                if record and group == 1:
                    cursor.execute(RECORD_INSERT, [first, first, ITEMS, OFFSETS])
                elif record:  # the group's record rows in one statement
                    numbers = list(range(first, first + group))
                    cursor.execute(
                        f"INSERT INTO {SCHEMA}.transactions SELECT unnest(?::BIGINT[]), "
                        "unnest(?::BIGINT[]), unnest(?::VARCHAR[]), unnest(?::VARCHAR[])",
                        [numbers, numbers, [ITEMS] * group, [OFFSETS] * group],
                    )
                cursor.execute("COMMIT")
                counts[index] += group
                # As a checkpoint would (one thread: concurrent DELETEs of a row conflict).
                if record and index == 0 and counts[index] % 256 < group:
                    cursor.execute(f"DELETE FROM {SCHEMA}.transactions WHERE transaction_id "
                                   "< ?", [first])  # fmt: skip
            cursor.close()

        cpu, wall = time.process_time(), time.perf_counter()
        _run_threads(body, threads, seconds, stop)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    finally:
        connection.close()
        shutil.rmtree(root, ignore_errors=True)
    total = max(sum(counts), 1)
    what = "BEGIN, UPDATE" + (", record INSERT" if record else "") + ", COMMIT"
    shape = f"{threads} threads" if group == 1 else f"groups of {group} from 1 thread"
    return (
        f"DuckDB alone ({what}), {shape}: {total / wall:.0f} transactions/s, "
        f"{cpu / total * 1000:.3f} ms CPU per transaction, load {os.getloadavg()[0]:.1f}"
    )


def against_postgres(threads: int, seconds: float, rounds: int) -> str:
    """DuckDB alone (with the record row) and PostgreSQL's whole move with the counter
    (``transactions_bench.PostgresMove``, the bench's baseline, on a cluster started here)
    at ``threads`` clients, alternated ``rounds`` times: a report, one line per run."""
    from bench import postgres
    from bench.transactions_bench import WORKLOADS, PostgresMove

    work = next(w for w in WORKLOADS if w.name == "move")
    psycopg = postgres.ensure_psycopg(lambda text: None)
    lines = []
    with postgres.Cluster(log=lambda text: None) as cluster:
        theirs = PostgresMove(cluster.dsn, psycopg, work, threads, make_messages())
        try:
            theirs.warm_up(1.0)
            for _ in range(rounds):
                lines.append(duckdb_alone(threads, seconds, True, 1))
                figures = theirs.timed(seconds)
                lines.append(f"PostgreSQL's whole move + counter, {threads} clients: "
                             f"{figures['rate']:.0f} transactions/s, "
                             f"load {os.getloadavg()[0]:.1f}")  # fmt: skip
        finally:
            theirs.close()
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.move_ceiling")
    parser.add_argument("mode", choices=("sessions", "duckdb"))
    parser.add_argument("--sessions", type=int, default=4, help="sessions (mode sessions)")
    parser.add_argument("--threads", type=int, default=1, help="threads (mode duckdb)")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--topics-only", action="store_true", help="no counter upsert")
    parser.add_argument("--batch", type=int, default=MOVE_BATCH, help="messages per move")
    parser.add_argument("--fill-rate", type=float, default=FILL_RATE_DEFAULT,
                        help="moves a second topic a is filled for (mode sessions)")  # fmt: skip
    parser.add_argument("--no-record", action="store_true", help="no record row (mode duckdb)")
    parser.add_argument(
        "--group",
        type=int,
        default=1,
        help="transactions per DuckDB transaction (mode duckdb, one thread)",
    )
    parser.add_argument(
        "--postgres",
        type=int,
        default=0,
        metavar="ROUNDS",
        help="mode duckdb: alternate with PostgreSQL's whole move, ROUNDS times",
    )
    args = parser.parse_args(argv)
    if args.sessions < 1 or args.threads < 1 or args.group < 1 or args.seconds <= 0:
        parser.error("--sessions, --threads and --group must be >= 1, --seconds > 0")
    if args.mode == "sessions":
        print(sessions_run(args.sessions, args.seconds, args.topics_only, args.batch,
                           args.fill_rate))  # fmt: skip
    else:
        if args.group > 1 and args.threads > 1:
            parser.error("--group runs from one thread")
        if args.postgres:
            print(against_postgres(args.threads, args.seconds, args.postgres))
            return 0
        print(duckdb_alone(args.threads, args.seconds, not args.no_record, args.group))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
