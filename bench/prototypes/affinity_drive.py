"""The bench's topic-only move in process, with CPU affinity variants (round 26, lead).

    python bench/prototypes/affinity_drive.py CLIENTS MODE [SECONDS] [WORKLOAD] [NAMES]

MODE: ``all`` (no pinning), ``one`` (the whole process on CPU 0, set before anything is
imported), ``pythons`` (every Python thread on CPU 0 once the database is open; later
threads inherit it), ``threads`` (only the session threads, each pinning itself at its
first transaction; NAMES, comma-separated thread-name prefixes such as ``MainThread``,
pins those too), ``list`` (no pinning; prints the process's threads after the run).
WORKLOAD: an index of ``bench.transactions_bench.WORKLOADS`` (0: move_topics).
Prints transactions a second, staging syncs a commit, process CPU, system CPU and
context switches a transaction (docs/move_profile.md, round 26). Not a test; run from
the repository's root.
"""

from __future__ import annotations

import collections
import os
import resource
import sys
import tempfile
import threading
import time

MODE = sys.argv[2]
if MODE == "one":
    os.sched_setaffinity(0, {0})

from bench import transactions_bench as tb  # noqa: E402 (after the affinity)


def main() -> None:
    clients = int(sys.argv[1])
    seconds = float(sys.argv[3]) if len(sys.argv) > 3 else 3.0
    work = tb.WORKLOADS[int(sys.argv[4])] if len(sys.argv) > 4 else tb.WORKLOADS[0]
    names = sys.argv[5].split(",") if len(sys.argv) > 5 else []
    pool = [os.urandom(512).hex().encode() for _ in range(256)]
    side = tb.TopicbaseMove(tempfile.mkdtemp(prefix="pin-"), work, clients, pool, 0.0)
    if MODE == "threads":
        _pin_sessions(side, names)
    if MODE == "pythons":
        for thread in [threading.main_thread(), *threading.enumerate()]:
            if thread.native_id:
                os.sched_setaffinity(thread.native_id, {0})
    staging = side.database.committer.staging
    try:
        side.top_up(seconds + 1)
        tb.run_phase(clients, 0.5, side.transaction, side.retryable, side.rollback)
        side.top_up(seconds + 1)
        syncs = staging.sync_rounds
        before = resource.getrusage(resource.RUSAGE_SELF)
        cpu = time.process_time()
        phase = tb.run_phase(clients, seconds, side.transaction, side.retryable, side.rollback)
        cpu = time.process_time() - cpu
        after = resource.getrusage(resource.RUSAGE_SELF)
        count = max(phase.transactions, 1)
        print(f"{work.name} c{clients} {MODE:7s} rate {phase.rate:6.0f} "
              f"syncs/c {(staging.sync_rounds - syncs) / count:.2f} "
              f"cpu {cpu * 1000 / count:.3f} ms "
              f"sys {(after.ru_stime - before.ru_stime) * 1000 / count:.3f} "
              f"vcsw {(after.ru_nvcsw - before.ru_nvcsw) / count:.1f} "
              f"ivcsw {(after.ru_nivcsw - before.ru_nivcsw) / count:.1f} "
              f"load {os.getloadavg()[0]:.1f}", flush=True)  # fmt: skip
        if MODE == "list":
            print(sorted({t.name.rstrip("0123456789_-") for t in threading.enumerate()}))
            print(dict(collections.Counter(_task_names())))
    finally:
        side.close()


def _pin_sessions(side: tb.TopicbaseMove, names: list[str]) -> None:
    """Each session thread pins itself (and the threads named by ``names``) at its first
    transaction."""
    plain, pinned, mine = side.transaction, set(), threading.local()

    def transaction(index: int) -> tuple[int, float, float]:
        for thread in threading.enumerate():
            named = any(thread.name.startswith(prefix) for prefix in names)
            if named and thread.native_id and thread.native_id not in pinned:
                os.sched_setaffinity(thread.native_id, {0})
                pinned.add(thread.native_id)
        # A thread-local mark: the timed phase's new threads reuse the warm-up threads'
        # idents, so a set of idents left them unpinned (round 27).
        if not getattr(mine, "pinned", False):
            os.sched_setaffinity(0, {0})
            mine.pinned = True
        return plain(index)

    side.transaction = transaction  # type: ignore[method-assign]


def _task_names() -> list[str]:
    tasks = []
    for task in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{task}/comm", encoding="utf-8") as handle:
            tasks.append(handle.read().strip())
    return tasks


if __name__ == "__main__":
    main()
