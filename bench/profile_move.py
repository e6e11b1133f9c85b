"""Where one move transaction's time goes: ``python -m bench.profile_move [options]``.

One session (in this process) runs the move of ``bench.transactions_bench``
(``BEGIN``; ``INSERT INTO TOPIC b SELECT data FROM TOPIC a WITH (consumer,
member, max_messages = 100)``; the counter upsert unless ``--topics-only``;
``COMMIT``) ``--transactions`` times under ``cProfile``, after a warm-up, and
prints: the wall time per transaction split by statement (BEGIN, move, upsert,
COMMIT), then the functions with the most own time and the most cumulative
time, per transaction. ``--out FILE`` also writes the pstats file (for
``snakeviz`` or ``python -m pstats``); ``--plain`` runs without cProfile and
prints the real wall time per statement and the process's CPU time per
transaction; ``--split`` (a plain run) also times the commit's steps, per
transaction: the committer's calls (``Committer.stage``,
``write_record``, ``wait_staged``, ``enter``, ``commit_in_log``, ``finish``) and each
kind of DuckDB statement through ``engine.tables`` (BEGIN, the upsert's UPDATE, the
record INSERT, COMMIT). As the suite ``profile`` of ``bench.run`` it profiles both moves
(topic-only, and with the counter upsert), records the time per statement and
writes the top functions to ``bench/profile.md``, which ``bench/RESULTS.md``
includes: the profile behind RESULTS.md's "why a target is missed" and the
closing note's.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import cProfile
import io
import os
import pstats
import shutil
import tempfile
import time
from dataclasses import dataclass

from bench.results import REPO_DIR, Recorder
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
from engine.commit import Committer
from engine.database import Database

GROUP = "profile: one move transaction, 1 session, under cProfile"
PROFILE_MD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "profile.md")
TOP = 15


@dataclass
class Profile:
    """One profiled run: wall ms per transaction, ms per statement, the pstats (None for
    a plain run), the process's CPU ms per transaction (all threads)."""

    kind: str
    transactions: int
    wall_ms: float
    steps_ms: dict[str, float]
    stats: pstats.Stats | None
    cpu_ms: float = 0.0
    split_ms: dict[str, tuple[float, float]] | None = None  # step -> (ms, calls) per txn

    def table(self, order: str, top: int) -> str:
        """The ``top`` functions by ``order`` (tottime or cumulative), ms per transaction."""
        rows = []
        assert self.stats is not None, "a plain run has no profile"
        raw = self.stats.stats  # type: ignore[attr-defined]
        key = 2 if order == "tottime" else 3
        ranked = sorted(raw.items(), key=lambda item: item[1][key], reverse=True)[:top]
        for (path, line, function), (_, calls, own, cumulative, _) in ranked:
            where = os.path.relpath(path, REPO_DIR) if path.startswith(REPO_DIR) else path
            where = where if "site-packages" not in where else where.split("site-packages/")[1]
            label = function if path == "~" else f"{where}:{line}({function})"
            rows.append(f"| `{label}` | {calls / self.transactions:.2f} | "
                        f"{own / self.transactions * 1000:.3f} | "
                        f"{cumulative / self.transactions * 1000:.3f} |")  # fmt: skip
        return "\n".join(["| function | calls/txn | own ms/txn | cumulative ms/txn |",
                          "|---|---:|---:|---:|", *rows])  # fmt: skip


SPLIT_METHODS = ("stage", "write_record", "wait_staged", "enter", "commit_in_log", "finish")


@contextlib.contextmanager
def _split_timers(spent: dict[str, float], calls: collections.Counter):
    """Time the committer's steps and each kind of DuckDB statement (its first word) while
    inside: wall seconds and calls, summed into ``spent`` and ``calls``."""

    def timed(label: str, function):
        def wrapper(*args, **kwargs):
            started = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                spent[label] += time.perf_counter() - started
                calls[label] += 1

        return wrapper

    saved = {name: getattr(Committer, name) for name in SPLIT_METHODS}
    saved_run, saved_count = tables.run, tables.execute_count
    for name, method in saved.items():
        setattr(Committer, name, timed(name, method))

    def run(cursor, sql, parameters=None):
        return timed("DuckDB " + sql.split(None, 1)[0], saved_run)(cursor, sql, parameters)

    tables.run = run
    tables.execute_count = timed("DuckDB UPDATE (upsert, execute_count)", saved_count)
    try:
        yield
    finally:
        for name, method in saved.items():
            setattr(Committer, name, method)
        tables.run, tables.execute_count = saved_run, saved_count


def profile(
    transactions: int,
    topics_only: bool,
    *,
    plain: bool = False,
    split: bool = False,
    batch: int = MOVE_BATCH,
) -> Profile:
    """Run ``transactions`` moves of ``batch`` messages by one session under cProfile, after
    50 unprofiled. With ``plain``, without cProfile: the times are then the real ones, and
    ``cpu_ms`` (the process's CPU time, every thread's) is set."""
    root = tempfile.mkdtemp(prefix="topicbase-profile-move-",
                            dir=os.environ.get("TOPICBASE_BENCH_DIR") or None)  # fmt: skip
    database = Database.open(os.path.join(root, "data"))
    try:
        session = database.connect()
        session.execute(TB_SETUP.format(partitions=PARTITIONS_A))
        warm = 50
        total = (transactions + warm) * batch
        per_partition = -(-total // PARTITIONS_A // FILL_BATCH) * FILL_BATCH
        _fill_topic(database, make_messages(), per_partition, 0, PARTITIONS_A)
        move = TB_MOVE.format(batch=batch).format(member="w1")
        steps = {"BEGIN": 0.0, "move": 0.0, "upsert": 0.0, "COMMIT": 0.0}

        def transaction() -> None:
            clock = time.perf_counter
            t0 = clock()
            session.execute("BEGIN")
            t1 = clock()
            session.execute(move)
            t2 = clock()
            if not topics_only:
                session.execute(TB_UPSERT, ["w1", batch])
            t3 = clock()
            session.execute("COMMIT")
            t4 = clock()
            for name, spent in zip(steps, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
                steps[name] += spent

        for _ in range(warm):
            transaction()
        steps = dict.fromkeys(steps, 0.0)
        profiler = cProfile.Profile()
        spent: dict[str, float] = collections.defaultdict(float)
        calls: collections.Counter = collections.Counter()
        timers = _split_timers(spent, calls) if split else contextlib.nullcontext()
        started, cpu_started = time.perf_counter(), time.process_time()
        if not plain:
            profiler.enable()
        with timers:
            for _ in range(transactions):
                transaction()
        profiler.disable()
        wall = time.perf_counter() - started
        cpu = time.process_time() - cpu_started
        session.close()
    finally:
        database.close()
        shutil.rmtree(root, ignore_errors=True)
    if topics_only:
        del steps["upsert"]
    kind = "topic-only move" if topics_only else "move + counter upsert"
    return Profile(
        kind if batch == MOVE_BATCH else f"{kind} of {batch} messages",
        transactions,
        wall / transactions * 1000,
        {name: spent / transactions * 1000 for name, spent in steps.items()},
        None if plain else pstats.Stats(profiler, stream=io.StringIO()),
        cpu / transactions * 1000,
        {label: (spent[label] / transactions * 1000, calls[label] / transactions)
         for label in sorted(spent, key=spent.__getitem__, reverse=True)} if split else None,
    )  # fmt: skip


def run(rec: Recorder) -> None:
    """Suite ``profile``: both moves profiled; records per statement, ``bench/profile.md``."""
    transactions = 200 if rec.quick else 1000
    sections = [
        "## Profile of one move transaction",
        "",
        f"`python -m bench.profile_move` ({transactions} transactions of one session under "
        "cProfile, which adds overhead; run "
        f"{rec.date}, commit `{rec.commit}`, load average {os.getloadavg()[0]:.1f}).",
        "",
    ]
    for topics_only in (True, False):
        result = profile(transactions, topics_only)
        name = "profile.move_topics" if topics_only else "profile.move"
        rec.add(f"{name}.txn_ms", result.wall_ms, "ms/txn (profiled)", group=GROUP,
                note=f"{result.kind}, 1 session, under cProfile")  # fmt: skip
        for step, spent in result.steps_ms.items():
            rec.add(f"{name}.{step.lower()}_ms", spent, "ms/txn (profiled)", group=GROUP,
                    note=f"{result.kind}: wall time in {step}")  # fmt: skip
        split = ", ".join(f"{step} {spent:.2f}" for step, spent in result.steps_ms.items())
        sections += [
            f"### {result.kind}: {result.wall_ms:.2f} ms per transaction ({split} ms)",
            "",
            "Most own time (cProfile measures wall time, so a lock's `acquire` is time spent "
            "waiting, here mostly for the group commit's fsync, which another thread makes):",
            "",
            result.table("tottime", TOP),
            "",
        ]
    _write(PROFILE_MD, "\n".join(sections) + "\n")


def _write(path: str, text: str) -> None:
    with open(path + ".tmp", "w", encoding="utf-8") as file:
        file.write(text)
    os.replace(path + ".tmp", path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profile_move")
    parser.add_argument("--transactions", type=int, default=300)
    parser.add_argument("--topics-only", action="store_true", help="no counter upsert")
    parser.add_argument(
        "--batch", type=int, default=MOVE_BATCH, help="messages per move (1000: the bulk move)"
    )
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--out", help="write the pstats file here")
    parser.add_argument(
        "--plain",
        action="store_true",
        help="no cProfile: real wall and CPU time per transaction and statement",
    )
    parser.add_argument(
        "--split",
        action="store_true",
        help="a plain run that also times the commit's steps and DuckDB calls",
    )
    args = parser.parse_args(argv)
    plain = args.plain or args.split
    result = profile(
        args.transactions, args.topics_only, plain=plain, split=args.split, batch=args.batch
    )
    if plain:
        print(
            f"{result.kind}, 1 session, {result.transactions} transactions: "
            f"{result.wall_ms:.3f} ms wall, {result.cpu_ms:.3f} ms process CPU (all "
            "threads) per transaction"
        )
        for name, spent in result.steps_ms.items():
            print(f"  {name:7} {spent:6.3f} ms")
        for label, (spent, calls) in (result.split_ms or {}).items():
            print(f"    {label:40} {spent:6.3f} ms  ({calls:.2f} calls)")
        return 0
    print(f"{result.kind}, 1 session, {result.transactions} transactions under cProfile: "
          f"{result.wall_ms:.2f} ms per transaction (profiling adds overhead)")  # fmt: skip
    for name, spent in result.steps_ms.items():
        print(f"  {name:7} {spent:6.2f} ms")
    if args.out:
        result.stats.dump_stats(args.out)
    for order in ("tottime", "cumulative"):
        print(f"\n-- by {order}, per transaction --")
        print(result.table(order, args.top))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
