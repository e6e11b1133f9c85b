"""What the copy of the ledger into the partitions costs a 1000-partition producer (round 32).

    python bench/prototypes/ledger_no_copy.py [SECONDS] [REPS]

The ``scale.partitions_1000`` workload (5,000-message autocommit INSERTs from 2,000
producer ids, through the DB-API) run on three sides in turn, each for SECONDS (4) a
repetition, REPS (3) times, alternating:

- ``p1000``: a 1000-partition topic as the product runs it (the copier copies the ledger
  into the partitions in the background; what it left is copied after each repetition
  and that copy's time is added, as ``bench.scale_bench`` does);
- ``p1000.no_copy``: the same with the copier held off (its cadence limits raised in
  this process) and nothing copied after: every row stays in the ledger, readable there
  (whole-frame reads), never copied. The design this measures: the ledger as the
  partitions' only storage, its files retired by retention instead of by a copy;
- ``p10``: a 10-partition topic (the statements go the usual way, no ledger).

Prints each side's messages a second and the main thread's CPU a statement, medians,
and the two 1000-partition sides against ``p10``. Not a test; run from the repository's
root. Figures: docs/scale.md, "Round 32".
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.getcwd())

from bench import scale_bench as sb
from bench.storage_bench import make_messages
from sql import dbapi
from storage import limits

SECONDS = float(sys.argv[1]) if len(sys.argv) > 1 else 4.0
REPS = int(sys.argv[2]) if len(sys.argv) > 2 else 3
COPIER_LIMITS = (limits.LEDGER_COPY_FRAMES_MIN, limits.LEDGER_COPY_WAIT_S)
HELD_OFF = (10**9, 10.0**6)


def _copier(held_off: bool) -> None:
    """The copier's cadence (read at each of its waits) as the product has it, or held off."""
    limits.LEDGER_COPY_FRAMES_MIN, limits.LEDGER_COPY_WAIT_S = (
        HELD_OFF if held_off else COPIER_LIMITS)  # fmt: skip


def main() -> None:
    parent = tempfile.mkdtemp(prefix="topicbase-no-copy-")
    conn = dbapi.connect(os.path.join(parent, "store"), autocommit=True)
    try:
        cursor = conn.cursor()
        sides = {"p1000": "a", "p1000.no_copy": "b", "p10": "c"}
        for name, topic in sides.items():
            partitions = 10 if name == "p10" else 1000
            cursor.execute(f"CREATE TOPIC {topic} (CONSUMER c) "
                           f"WITH (min_active_partitions = {partitions})")  # fmt: skip
        pool = make_messages()
        data = [pool[i % len(pool)] for i in range(sb.PRODUCE_BATCH)]
        ids = [f"producer-{i % sb.PRODUCERS}" for i in range(sb.PRODUCE_BATCH)]
        for topic in sides.values():
            sb._warmed(conn, cursor, topic, data, ids)
        rates: dict[str, list[float]] = {name: [] for name in sides}
        cpu_ms: dict[str, list[float]] = {name: [] for name in sides}
        counts_a: list[int] = []  # statements into the product's 1000-partition topic
        for rep in range(REPS):
            for name, topic in sides.items():
                held_off = name.endswith("no_copy")
                _copier(held_off)
                statement = sb.INSERT.format(topic=topic)
                started, cpu, count = time.perf_counter(), time.thread_time(), 0
                while time.perf_counter() - started < SECONDS:
                    cursor.execute(statement, [data, ids])
                    count += 1
                elapsed = time.perf_counter() - started
                if topic == "a":
                    counts_a.append(count)
                cpu_ms[name].append((time.thread_time() - cpu) / count * 1e3)
                drain_s = 0.0 if held_off else sb._drained(conn, topic)[0]
                rates[name].append(count * sb.PRODUCE_BATCH / (elapsed + drain_s))
                print(f"rep {rep} {name}: {rates[name][-1]:,.0f} msgs/s, "
                      f"{cpu_ms[name][-1]:.1f} ms CPU a statement", flush=True)  # fmt: skip
            _copier(False)
        ledger = sb._ledger_of(conn, "a")
        messages = sum(counts_a) * sb.PRODUCE_BATCH
        print(f"p1000's copier: {ledger.copier_cpu_s / messages * 1e6:.1f} us of CPU a "
              f"message in {ledger.copier_passes} passes (its own thread), "
              f"{ledger._syncs.together} syncs of the file system, "
              f"{ledger._syncs.fell_back} failed")  # fmt: skip
        base = statistics.median(rates["p10"])
        for name in sides:
            rate = statistics.median(rates[name])
            print(f"{name}: {rate:,.0f} msgs/s ({rate / base:.2f}x p10), "
                  f"{statistics.median(cpu_ms[name]):.1f} ms CPU a statement")  # fmt: skip
    finally:
        _copier(False)
        conn.close()
        shutil.rmtree(parent, ignore_errors=True)


if __name__ == "__main__":
    main()
