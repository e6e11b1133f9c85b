"""Quick measurement (not a test, not a bench suite): topic-only move transactions with the
commit in the staging log (``after``) against the same transactions forced through
DuckDB's record row and COMMIT (``before``: today's protocol for table transactions),
alternating A B A B in one run.

    .venv/bin/python bench/log_commit_quick.py [--rounds 2] [--threads 1,4,16]

Each transaction: ``BEGIN; INSERT INTO TOPIC b (data) SELECT data FROM TOPIC a WITH
(consumer = 'c', partition = <thread>, max_messages = 100); COMMIT`` with 1 KiB
messages; each thread moves its own partition of ``a`` (no 40001). Prints txn/s and
fsyncs per commit on the commit path, ``(staging_syncs + table_commits) / commits``
from ``Database.commit_counters()`` (DuckDB's WAL fsync is one per table commit).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine import transaction as transaction_module
from engine.database import Database

MESSAGES = 100
PAYLOAD = "x" * 1024
TRANSACTIONS = {1: 300, 4: 120, 16: 40}  # per thread


def _prepare(path: str, threads: int, per_thread: int) -> Database:
    database = Database.open(path, retention_interval_s=None)
    session = database.connect()
    session.execute(
        f"CREATE TOPIC a (CONSUMER c) WITH (min_active_partitions = {threads}); "
        "CREATE TOPIC b WITH (min_active_partitions = 4)"
    )
    for partition in range(threads):
        left = per_thread * MESSAGES
        while left:
            count = min(left, 5000)
            session.execute(
                f"INSERT INTO TOPIC a (data, partition) SELECT '{PAYLOAD}', {partition} "
                f"FROM range({count})"
            )
            left -= count
    session.close()
    return database


def _run(threads: int, forced_duckdb: bool) -> tuple[float, float]:
    per_thread = TRANSACTIONS[threads]
    original = transaction_module.Transaction.note_plan
    if forced_duckdb:
        def noted(self, plan):  # every transaction counts as touching a table
            self.touches_tables = True
        transaction_module.Transaction.note_plan = noted  # type: ignore[method-assign]
    try:
        with tempfile.TemporaryDirectory(dir="/tmp") as directory:
            database = _prepare(directory, threads, per_thread)
            sessions = [database.connect() for _ in range(threads)]
            start_gate = threading.Barrier(threads + 1)
            before = database.commit_counters()

            def body(index: int) -> None:
                session = sessions[index]
                start_gate.wait()
                for _ in range(per_thread):
                    session.execute("BEGIN")
                    session.execute(
                        "INSERT INTO TOPIC b (data) SELECT data FROM TOPIC a WITH "
                        f"(consumer = 'c', partition = {index}, max_messages = {MESSAGES})"
                    )
                    session.execute("COMMIT")

            workers = [threading.Thread(target=body, args=(i,)) for i in range(threads)]
            for worker in workers:
                worker.start()
            start_gate.wait()
            began = time.perf_counter()
            for worker in workers:
                worker.join()
            elapsed = time.perf_counter() - began
            after = database.commit_counters()
            commits = (after["log_commits"] - before["log_commits"]) + (
                after["table_commits"] - before["table_commits"]
            )
            fsyncs = (after["staging_syncs"] - before["staging_syncs"]) + (
                after["table_commits"] - before["table_commits"]
            )
            assert commits == threads * per_thread, (commits, after)
            for session in sessions:
                session.close()
            database.close()
            return commits / elapsed, fsyncs / commits
    finally:
        transaction_module.Transaction.note_plan = original  # type: ignore[method-assign]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", default="1,4,16")
    args = parser.parse_args()
    for threads in (int(t) for t in args.threads.split(",")):
        results: dict[str, list[tuple[float, float]]] = {"before": [], "after": []}
        for _ in range(args.rounds):
            for name in ("before", "after"):
                results[name].append(_run(threads, forced_duckdb=name == "before"))
        line = [f"threads={threads}"]
        for name in ("before", "after"):
            rates = [r for r, _ in results[name]]
            fsyncs = [f for _, f in results[name]]
            line.append(
                f"{name}: {statistics.median(rates):.0f} txn/s "
                f"({min(rates):.0f}-{max(rates):.0f}), "
                f"{statistics.median(fsyncs):.2f} fsyncs/commit"
            )
        ratio = statistics.median(r for r, _ in results["after"]) / statistics.median(
            r for r, _ in results["before"]
        )
        print("; ".join(line) + f"; after/before {ratio:.2f}x", flush=True)


if __name__ == "__main__":
    main()
