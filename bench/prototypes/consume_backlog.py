"""A consumer reading a backlog at 1000 partitions, copied or not yet (round 32).

    python bench/prototypes/consume_backlog.py [PARTITIONS] [SECONDS]

``scale.partitions_1000``'s statements (5,000 messages of 1 KiB from 2,000 producer ids)
into a topic of PARTITIONS (1000) for SECONDS (4), then read it all with consumer ``c``
in reads of 20,000, twice: ``copied`` once the ledger's rows were copied into the
partitions and synced (``TopicLedger.settle_all`` and ``copy_all``, as a copier's pass),
``live`` right after producing, while the copier copies the last second's rows (the
bench's case). Prints messages a second and process CPU a message read (all threads: the
copier's too). Not a test; run from the repository's root. Figures: docs/scale.md,
"Round 32".
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.getcwd())

from bench import scale_bench as sb
from bench.storage_bench import make_messages
from sql import dbapi

PARTITIONS = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
SECONDS = float(sys.argv[2]) if len(sys.argv) > 2 else 4.0


def main() -> None:
    parent = tempfile.mkdtemp(prefix="topicbase-backlog-")
    conn = dbapi.connect(os.path.join(parent, "store"), autocommit=True)
    try:
        cursor = conn.cursor()
        cursor.execute(f"CREATE TOPIC t (CONSUMER c) WITH (min_active_partitions = {PARTITIONS})")
        pool = make_messages()
        data = [pool[i % len(pool)] for i in range(sb.PRODUCE_BATCH)]
        ids = [f"producer-{i % sb.PRODUCERS}" for i in range(sb.PRODUCE_BATCH)]
        sb._warmed(conn, cursor, "t", data, ids)
        statement = sb.INSERT.format(topic="t")
        for mode in ("copied", "live"):
            produced, started = 0, time.perf_counter()
            while time.perf_counter() - started < SECONDS:
                cursor.execute(statement, [data, ids])
                produced += sb.PRODUCE_BATCH
            if mode == "copied":
                sb._drained(conn, "t")
            cpu = time.process_time()
            rate = sb._read_all(cursor, "t", produced)
            cpu_us = (time.process_time() - cpu) / produced * 1e6
            print(f"{PARTITIONS} partitions, {mode}: {produced:,} messages read at "
                  f"{rate:,.0f} msgs/s, {cpu_us:.2f} us of process CPU a message")  # fmt: skip
            sb._drained(conn, "t")
    finally:
        conn.close()
        shutil.rmtree(parent, ignore_errors=True)


if __name__ == "__main__":
    main()
