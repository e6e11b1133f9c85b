"""Where one move transaction's time goes: ``python -m bench.profile_move [options]``.

One session (in this process) runs the move of ``bench.transactions_bench``
(``BEGIN``; ``INSERT INTO TOPIC b SELECT data FROM TOPIC a WITH (consumer,
member, max_messages = 100)``; the counter upsert unless ``--topics-only``;
``COMMIT``) ``--transactions`` times under ``cProfile``, after a warm-up, and
prints: the wall time per transaction split by statement (BEGIN, move, upsert,
COMMIT), then the functions with the most own time and the most cumulative
time, per transaction. ``--out FILE`` also writes the pstats file (for
``snakeviz`` or ``python -m pstats``). For RESULTS.md's "why a target is
missed" and the closing note's profile.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import shutil
import tempfile
import time

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
from engine.database import Database


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profile_move")
    parser.add_argument("--transactions", type=int, default=300)
    parser.add_argument("--topics-only", action="store_true", help="no counter upsert")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--out", help="write the pstats file here")
    args = parser.parse_args(argv)
    root = tempfile.mkdtemp(prefix="topicbase-profile-move-",
                            dir=os.environ.get("TOPICBASE_BENCH_DIR") or None)  # fmt: skip
    database = Database.open(os.path.join(root, "data"))
    try:
        session = database.connect()
        session.execute(TB_SETUP.format(partitions=PARTITIONS_A))
        warm = 50
        total = (args.transactions + warm) * MOVE_BATCH
        per_partition = -(-total // PARTITIONS_A // FILL_BATCH) * FILL_BATCH
        _fill_topic(database, make_messages(), per_partition, 0, PARTITIONS_A)
        move = TB_MOVE.format(batch=MOVE_BATCH).format(member="w1")
        steps = {"BEGIN": 0.0, "move": 0.0, "upsert": 0.0, "COMMIT": 0.0}

        def transaction() -> None:
            clock = time.perf_counter
            t0 = clock()
            session.execute("BEGIN")
            t1 = clock()
            session.execute(move)
            t2 = clock()
            if not args.topics_only:
                session.execute(TB_UPSERT, ["w1", MOVE_BATCH])
            t3 = clock()
            session.execute("COMMIT")
            t4 = clock()
            for name, spent in zip(steps, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
                steps[name] += spent

        for _ in range(warm):
            transaction()
        steps = dict.fromkeys(steps, 0.0)
        profiler = cProfile.Profile()
        started = time.perf_counter()
        profiler.enable()
        for _ in range(args.transactions):
            transaction()
        profiler.disable()
        wall = time.perf_counter() - started
        session.close()
    finally:
        database.close()
        shutil.rmtree(root, ignore_errors=True)
    count = args.transactions
    kind = "topic-only move" if args.topics_only else "move + counter upsert"
    print(f"{kind}, 1 session, {count} transactions under cProfile: "
          f"{wall / count * 1000:.2f} ms per transaction (profiling adds overhead)")  # fmt: skip
    for name, spent in steps.items():
        print(f"  {name:7} {spent / count * 1000:6.2f} ms")
    if args.out:
        profiler.dump_stats(args.out)
    for order in ("tottime", "cumulative"):
        text = io.StringIO()
        stats = pstats.Stats(profiler, stream=text)
        stats.sort_stats(order).print_stats(args.top)
        print(f"\n-- by {order} (seconds over {count} transactions) --")
        lines = text.getvalue().splitlines()
        start = next(i for i, line in enumerate(lines) if line.strip().startswith("ncalls"))
        print("\n".join(lines[start:]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
