"""Child process of ``test_moved_refs_crash.py``: fills topic ``a`` and moves it to ``b``
by reference (``engine.moved_refs``), until ``a`` is drained or ``--moves`` ran.

``python tests/engine/moved_refs_child.py <data dir> [--moves N] [--fill N] [--seed S]``:
opens (and so recovers) the directory, creates the topics if missing, appends ``--fill``
messages to ``a`` (autocommit, durable), then runs move transactions of 1-40 messages
(``INSERT INTO TOPIC b (data) SELECT data FROM TOPIC a WITH (consumer = 'mover', ...)``),
with a checkpoint every 4 commits. Crashed by ``TOPICBASE_FAILPOINTS`` or SIGKILL; prints
``done <moves>`` when it ends by itself."""

from __future__ import annotations

import argparse
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from engine import commit
from engine.database import Database


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("path")
    parser.add_argument("--moves", type=int, default=60)
    parser.add_argument("--fill", type=int, default=400)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    commit.CHECKPOINT_TRANSACTIONS = 4
    rng = random.Random(args.seed)
    database = Database.open(args.path, retention_interval_s=None)
    session = database.connect()
    session.execute(
        "CREATE TOPIC IF NOT EXISTS a (CONSUMER mover) WITH (min_active_partitions = 3); "
        "CREATE TOPIC IF NOT EXISTS b WITH (min_active_partitions = 2)"
    )
    print("started", flush=True)
    stamp = time.time_ns()
    for start in range(0, args.fill, 100):
        rows = [f"{stamp}.{i}:".encode() + b"x" * 500 for i in range(start, start + 100)]
        session.execute("INSERT INTO TOPIC a (data) SELECT unnest(?)", [rows])
    moves = 0
    while moves < args.moves:
        session.execute("BEGIN")
        tag = session.execute(
            "INSERT INTO TOPIC b (data) SELECT data FROM TOPIC a "
            f"WITH (consumer = 'mover', max_messages = {rng.randint(1, 40)})"
        )[-1].tag
        session.execute("COMMIT")
        if tag.endswith(" 0"):
            break
        moves += 1
    print(f"done {moves} log_commits {database.committer.log_commits}", flush=True)
    session.close()
    database.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
