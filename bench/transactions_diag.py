"""Where a move transaction's COMMIT waits: the transactions bench with per-phase diagnostics.

    python -m bench.transactions_diag [--presync] [--writeback-interval BYTES] [--json PATH]

Runs ``bench.transactions_bench`` (the quick suite; ``$TOPICBASE_BENCH_WORKLOADS`` narrows
it as there) and prints one ``DIAG`` line per timed repetition of either side, after the
source was topped up (the fill is outside the figures):

- the page cache: ``/proc/meminfo`` Dirty and Writeback at the start and their peak;
- the disk (``/sys/block/vda/stat``, or ``$TOPICBASE_DIAG_DISK``): MB written, write
  requests, flushes and their mean time, discards, mean requests in flight (sampled
  every 20 ms);
- who wrote: this process's and PostgreSQL's ``/proc/<pid>/io`` write_bytes;
- CPU: the worker threads' run time and run-queue wait (``/proc/thread-self/schedstat``
  read at each transaction), PostgreSQL's processes' (all their threads);
- Topicbase's COMMITs and its fdatasyncs by file kind (staging log, partition log),
  each split by the calling thread's schedstat into CPU run time + run-queue wait
  (runnable, no CPU) + the rest (asleep: the I/O, or a lock / the GIL);
- PostgreSQL's WAL syncs and their mean time (``pg_stat_wal``, with
  ``track_wal_io_timing``) and its checkpoints (``pg_stat_bgwriter``).

``--presync`` runs ``os.sync()`` before every timed repetition of both sides: a symmetric
diagnostic that starts each repetition without dirty pages; never a benchmark setting.
``--writeback-interval`` overrides ``storage.limits.WRITEBACK_INTERVAL_BYTES`` for an A/B
of the writer's pacing. Results go to a private file (``--json``), never to
``bench/results.json``. Figures: docs/bulk_commit.md, round 12.
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from bench import postgres
from bench import transactions_bench as tb
from bench.results import Recorder
from engine.session import Session
from storage import fs as fs_module
from storage import limits

SAMPLE_S = 0.02
DISK = os.environ.get("TOPICBASE_DIAG_DISK", "vda")


# -- readings -----------------------------------------------------------------------------
def meminfo_mb() -> tuple[int, int]:
    """(Dirty, Writeback) of the page cache, MB."""
    found: dict[str, int] = {}
    with open("/proc/meminfo", encoding="ascii") as file:
        for line in file:
            key, value = line.split(":", 1)
            if key in ("Dirty", "Writeback"):
                found[key] = int(value.split()[0]) // 1024
    return found["Dirty"], found["Writeback"]


def disk_stat() -> dict[str, int]:
    """The disk's cumulative counters (Documentation/block/stat.rst), 0 where absent."""
    try:
        with open(f"/sys/block/{DISK}/stat", encoding="ascii") as file:
            p = [int(x) for x in file.read().split()]
    except OSError:
        p = []
    p += [0] * (17 - len(p))
    return {
        "write_bytes": p[6] * 512, "writes": p[4], "write_ms": p[7], "discards": p[11],
        "discard_bytes": p[13] * 512, "flushes": p[15], "flush_ms": p[16],
    }  # fmt: skip


def in_flight_writes() -> int:
    try:
        with open(f"/sys/block/{DISK}/inflight", encoding="ascii") as file:
            return int(file.read().split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def thread_sched() -> tuple[float, float]:
    """This thread's (CPU run seconds, run-queue wait seconds) so far."""
    with open("/proc/thread-self/schedstat", encoding="ascii") as file:
        run, wait, _ = file.read().split()
    return int(run) / 1e9, int(wait) / 1e9


def process_sched(pids: list[int]) -> dict[int, tuple[float, float]]:
    """Per pid, (run, run-queue wait) seconds over its live threads (absent: exited)."""
    found: dict[int, tuple[float, float]] = {}
    for pid in pids:
        run = wait = 0.0
        paths = glob.glob(f"/proc/{pid}/task/*/schedstat")
        for path in paths:
            try:
                with open(path, encoding="ascii") as file:
                    a, b, _ = file.read().split()
            except (OSError, ValueError):
                continue
            run += int(a) / 1e9
            wait += int(b) / 1e9
        if paths:
            found[pid] = (run, wait)
    return found


def delta(before: dict[int, Any], after: dict[int, Any], index: int | None = None) -> float:
    """The growth summed over the pids present in both readings (a process that started or
    exited in between is left out: its counters would count as a jump or a drop)."""
    total = 0.0
    for pid in before.keys() & after.keys():
        a, b = before[pid], after[pid]
        total += (b[index] - a[index]) if index is not None else (b - a)
    return total


def postgres_pids() -> list[int]:
    pids = []
    for path in glob.glob("/proc/[0-9]*/cmdline"):
        try:
            with open(path, "rb") as file:
                if file.read().startswith(b"postgres"):
                    pids.append(int(path.split("/")[2]))
        except (OSError, ValueError):
            continue
    return pids


def write_bytes(pids: list[int]) -> dict[int, int]:
    """Per pid, ``/proc/<pid>/io`` write_bytes (absent: exited)."""
    found: dict[int, int] = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/io", encoding="ascii") as file:
                for line in file:
                    if line.startswith("write_bytes"):
                        found[pid] = int(line.split()[1])
        except OSError:
            continue
    return found


def file_kind(path: str) -> str:
    if "staging" in path:
        return "staging"
    if path.endswith(".log"):
        return "partition"
    return "other"


# -- the instruments ------------------------------------------------------------------------
class Diagnostics:
    """Patches the bench and the storage for one run; ``phase`` wraps a side's ``timed``."""

    def __init__(self, presync: bool) -> None:
        self.presync = presync
        self.samples: list[tuple[float, int, int, int]] = []  # (t, dirty, writeback, in flight)
        self.syncs: list[tuple[str, float, float, float]] = []  # (kind, wall, run, queue)
        self.commits: list[tuple[float, float, float]] = []  # (wall, run, queue)
        self.workers: dict[int, list[tuple[float, float]]] = {}  # thread -> [first, last]
        self.phases: list[dict[str, Any]] = []
        self.cluster: postgres.Cluster | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()

    def install(self) -> None:
        self._patch_sync()
        self._patch_commit()
        self._patch_cluster()
        for cls, side in ((tb.TopicbaseMove, "topicbase"), (tb.PostgresMove, "postgres")):
            self._patch_side(cls, side)
        threading.Thread(target=self._sample, name="diag-sampler", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def _sample(self) -> None:
        while not self._stop.is_set():
            dirty, writeback = meminfo_mb()
            self.samples.append((time.perf_counter(), dirty, writeback, in_flight_writes()))
            time.sleep(SAMPLE_S)

    def _patch_sync(self) -> None:
        original = fs_module.FileSystem.sync
        syncs = self.syncs

        def sync(fs: fs_module.FileSystem, fd: int) -> None:
            run0, queue0 = thread_sched()
            started = time.perf_counter()
            try:
                original(fs, fd)
            finally:
                wall = time.perf_counter() - started
                run1, queue1 = thread_sched()
                kind = file_kind(fs._paths.get(fd, ""))  # diagnostics only
                syncs.append((kind, wall, run1 - run0, queue1 - queue0))

        fs_module.FileSystem.sync = sync  # type: ignore[method-assign]

    def _patch_commit(self) -> None:
        original = Session.execute
        commits = self.commits

        def execute(session: Session, sql: str, *args: Any, **kwargs: Any) -> Any:
            if sql != "COMMIT":
                return original(session, sql, *args, **kwargs)
            run0, queue0 = thread_sched()
            started = time.perf_counter()
            try:
                return original(session, sql, *args, **kwargs)
            finally:
                wall = time.perf_counter() - started
                run1, queue1 = thread_sched()
                commits.append((wall, run1 - run0, queue1 - queue0))

        Session.execute = execute  # type: ignore[method-assign]

    def _patch_cluster(self) -> None:
        original = postgres.Cluster.__init__
        diag = self

        def init(
            cluster: postgres.Cluster, *args: Any, settings: Any = None, **kwargs: Any
        ) -> None:
            merged = dict(settings or {})
            merged.update({"track_wal_io_timing": "on", "log_checkpoints": "on"})
            original(cluster, *args, settings=merged, **kwargs)
            diag.cluster = cluster

        postgres.Cluster.__init__ = init  # type: ignore[method-assign]

    def _patch_side(self, cls: Any, side: str) -> None:
        original_timed: Callable[[Any, float], dict[str, float]] = cls.timed
        original_transaction = cls.transaction
        diag = self

        def transaction(move: Any, index: int) -> tuple[int, float, float]:
            now = thread_sched()
            key = threading.get_ident()
            with diag._lock:
                diag.workers.setdefault(key, [now, now])
            try:
                return original_transaction(move, index)
            finally:
                diag.workers[key][1] = thread_sched()

        def timed(move: Any, seconds: float) -> dict[str, float]:
            move.top_up(seconds)  # the fill stays out of the figures (``timed``'s is a no-op)
            if diag.presync:
                os.sync()
            figures, phase = diag.measure(lambda: original_timed(move, seconds))
            phase.update(side=side, work=f"{move.work.name}.c{move.clients}",
                         rate=figures["rate"], commit_p50_ms=figures["commit_p50_ms"],
                         transactions=figures["rate"] * seconds
                         / (move.work.batch if move.work.per_message else 1))  # fmt: skip
            diag.phases.append(phase)
            print("DIAG " + json.dumps(phase), flush=True)
            return figures

        cls.transaction = transaction
        cls.timed = timed

    def _pg(self) -> tuple[float, ...] | None:
        if self.cluster is None or not self.cluster.port:
            return None
        import psycopg

        with psycopg.connect(self.cluster.dsn, autocommit=True) as conn:
            wal = conn.execute("SELECT wal_sync, wal_sync_time, wal_bytes FROM pg_stat_wal")
            syncs, sync_ms, wal_bytes = wal.fetchone()
            ckpt = conn.execute(
                "SELECT checkpoints_timed + checkpoints_req, buffers_checkpoint FROM "
                "pg_stat_bgwriter"
            ).fetchone()
        return float(syncs), float(sync_ms), float(wal_bytes), float(ckpt[0]), float(ckpt[1])

    def measure(self, body: Callable[[], dict[str, float]]) -> tuple[dict[str, float], dict]:
        me = [os.getpid()]
        pg_pids = postgres_pids()
        self.workers.clear()
        syncs0, commits0 = len(self.syncs), len(self.commits)
        dirty0, writeback0 = meminfo_mb()
        disk0, pg0, io0, pgio0 = disk_stat(), self._pg(), write_bytes(me), write_bytes(pg_pids)
        own0, pgsched0 = process_sched(me), process_sched(pg_pids)
        start = time.perf_counter()
        figures = body()
        end = time.perf_counter()
        own1, pgsched1 = process_sched(me), process_sched(pg_pids)
        disk1, pg1, io1, pgio1 = disk_stat(), self._pg(), write_bytes(me), write_bytes(pg_pids)
        window = [s for s in self.samples if start <= s[0] <= end]
        worker_run = sum(last[0] - first[0] for first, last in self.workers.values())
        worker_queue = sum(last[1] - first[1] for first, last in self.workers.values())
        d = {k: disk1[k] - disk0[k] for k in disk0}
        phase: dict[str, Any] = {
            "seconds": end - start, "load": os.getloadavg()[0],
            "dirty0_mb": dirty0, "writeback0_mb": writeback0,
            "dirty_max_mb": max((s[1] for s in window), default=0),
            "writeback_max_mb": max((s[2] for s in window), default=0),
            "in_flight_mean": float(np.mean([s[3] for s in window])) if window else 0.0,
            "disk_write_mb": d["write_bytes"] / 1e6, "disk_writes": d["writes"],
            "flushes": d["flushes"], "flush_ms_mean": d["flush_ms"] / max(d["flushes"], 1),
            "discard_mb": d["discard_bytes"] / 1e6,
            "own_write_mb": delta(io0, io1) / 1e6, "pg_write_mb": delta(pgio0, pgio1) / 1e6,
            "workers_run_s": worker_run, "workers_queue_s": worker_queue,
            "own_threads_run_s": delta(own0, own1, 0), "own_threads_queue_s": delta(own0, own1, 1),
            "pg_run_s": delta(pgsched0, pgsched1, 0), "pg_queue_s": delta(pgsched0, pgsched1, 1),
        }  # fmt: skip
        if pg0 and pg1:
            syncs = pg1[0] - pg0[0]
            phase.update(pg_wal_syncs=syncs, pg_wal_sync_ms_mean=(pg1[1] - pg0[1]) / max(syncs, 1),
                         pg_wal_mb=(pg1[2] - pg0[2]) / 1e6, pg_checkpoints=pg1[3] - pg0[3],
                         pg_checkpoint_buffers=pg1[4] - pg0[4])  # fmt: skip
        phase["commit"] = split(self.commits[commits0:])
        by_kind: dict[str, list[tuple[float, float, float]]] = collections.defaultdict(list)
        for kind, *rest in self.syncs[syncs0:]:
            by_kind[kind].append(tuple(rest))  # type: ignore[arg-type]
        phase["fdatasync"] = {kind: split(rows) for kind, rows in by_kind.items()}
        return figures, phase


def split(rows: list[tuple[float, float, float]]) -> dict[str, float] | None:
    """Wall p50/p90 and the mean split into run + run-queue wait + asleep, in ms."""
    if not rows:
        return None
    a = np.array(rows) * 1000
    return {
        "n": len(a), "p50": float(np.percentile(a[:, 0], 50)),
        "p90": float(np.percentile(a[:, 0], 90)), "mean": float(a[:, 0].mean()),
        "run": float(a[:, 1].mean()), "queue": float(a[:, 2].mean()),
        "asleep": float((a[:, 0] - a[:, 1] - a[:, 2]).mean()),
    }  # fmt: skip


def describe(phase: dict[str, Any]) -> str:
    """One phase in a few lines (the JSON has everything)."""
    lines = [
        f"{phase['work']:16s} {phase['side']:9s} {phase['rate']:9.0f}/s COMMIT p50 "
        f"{phase['commit_p50_ms']:5.1f} ms | dirty {phase['dirty0_mb']}->{phase['dirty_max_mb']} "
        f"MB, disk {phase['disk_write_mb']:.0f} MB ({phase['own_write_mb']:.0f} ours, "
        f"{phase['pg_write_mb']:.0f} pg), flush {phase['flush_ms_mean']:.2f} ms, in flight "
        f"{phase['in_flight_mean']:.1f} | workers run {phase['workers_run_s']:.2f} s queue "
        f"{phase['workers_queue_s']:.2f} s, pg run {phase['pg_run_s']:.2f} queue "
        f"{phase['pg_queue_s']:.2f} | load {phase['load']:.1f}"
    ]
    if "pg_wal_syncs" in phase and phase["side"] == "postgres":
        lines.append(f"    pg WAL syncs {phase['pg_wal_syncs']:.0f}, mean "
                     f"{phase['pg_wal_sync_ms_mean']:.2f} ms; checkpoints "
                     f"{phase['pg_checkpoints']:.0f}")  # fmt: skip
    parts = [("COMMIT", phase["commit"]), *sorted(phase["fdatasync"].items())]
    for name, s in parts:
        if s:
            lines.append(
                f"    {name:10s} n {s['n']:4d} p50 {s['p50']:6.2f} p90 {s['p90']:6.2f} mean "
                f"{s['mean']:6.2f} = run {s['run']:.2f} + run queue {s['queue']:.2f} + "
                f"asleep {s['asleep']:.2f} ms"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.transactions_diag",
                                     description=__doc__.split("\n")[0])  # fmt: skip
    parser.add_argument("--presync", action="store_true",
                        help="os.sync() before every timed repetition of both sides")  # fmt: skip
    parser.add_argument("--writeback-interval", type=int, default=0,
                        help="override storage.limits.WRITEBACK_INTERVAL_BYTES")  # fmt: skip
    parser.add_argument("--json", default="/tmp/transactions_diag.json")
    args = parser.parse_args(argv)
    if args.writeback_interval:
        limits.WRITEBACK_INTERVAL_BYTES = args.writeback_interval
    diag = Diagnostics(args.presync)
    diag.install()
    recorder = Recorder("quick", json_path=args.json + ".results", md_path=args.json + ".md")
    try:
        tb.run(recorder)
    finally:
        diag.stop()
        with open(args.json, "w", encoding="utf-8") as file:
            json.dump({"phases": diag.phases, "writeback_interval":
                       limits.WRITEBACK_INTERVAL_BYTES, "presync": args.presync}, file)  # fmt: skip
    print("\n".join(describe(phase) for phase in diag.phases))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
