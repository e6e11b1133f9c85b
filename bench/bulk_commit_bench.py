"""In-process CPU of a bulk commit (``engine.bulk_write.BulkWrites.commit``): the server
side of a Spark batch write, without Spark, Flight or the network.

Each repetition opens a fresh data directory, creates a topic of ``--partitions``
partitions, stages ``--rows`` messages of ``--size`` bytes across ``--writes`` write ids
(each write's rows name their partition, ``row % partitions``, as Spark's tasks do), then
commits them all in one call and reports the CPU seconds (``time.process_time``: every
thread of this process, the staging syncer's included) and wall seconds of that call
alone. Staging is not measured (it is the Flight ``stage`` side).

Usage: ``python -m bench.bulk_commit_bench [--reps 5] [--rows 200000] [--profile]``.
To compare two trees, run this file in each alternately (A B A B): the script has no
dependency on the tree's commit path beyond ``BulkWrites``' public functions.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import pstats
import shutil
import statistics
import tempfile
import time

import pyarrow as pa

from engine import bulk_write
from engine.database import Database


def _rows(start: int, count: int, size: int, partitions: int) -> pa.RecordBatch:
    payload = b"x" * (size - 12)
    data = pa.array([b"%012d" % i + payload for i in range(start, start + count)], pa.binary())
    parts = pa.array([i % partitions for i in range(start, start + count)], pa.int32())
    return pa.record_batch({"data": data, "partition": parts})


def one_commit(rows: int, size: int, writes: int, partitions: int,
               profile: cProfile.Profile | None = None) -> tuple[float, float]:  # fmt: skip
    """Stage and commit once in a fresh directory; (CPU s, wall s) of the commit."""
    work = tempfile.mkdtemp(prefix="topicbase-bulk-commit-")
    database = Database.open(work, retention_interval_s=None)
    try:
        session = database.connect()
        session.execute(f"CREATE TOPIC bench WITH (min_active_partitions = {partitions})")
        bulk = bulk_write.for_database(database)
        ids = []
        per_write = rows // writes
        for index in range(writes):
            write_id = f"w{index}"
            bulk.start(session, write_id, "topic", "bench")
            batch = _rows(index * per_write, per_write, size, partitions)
            for start in range(0, per_write, 8192):
                bulk.append(session, write_id, [batch.slice(start, 8192)], batch.schema)
            ids.append(write_id)
        gc.collect()
        cpu, wall = time.process_time(), time.perf_counter()
        if profile is not None:
            profile.enable()
        result = bulk.commit(session, "bench-sink", 1, ids)
        if profile is not None:
            profile.disable()
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        assert result == {"status": "committed", "rows": per_write * writes}, result
        topic = database.topic_log(database.catalog.entry("bench").topic_id)
        ends = [topic.partition(p).end_offset for p in topic.partition_ids()]
        assert sum(ends) == per_write * writes, ends
        session.close()
        return cpu, wall
    finally:
        database.close()
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--writes", type=int, default=8)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--profile", action="store_true", help="cProfile the commits")
    args = parser.parse_args()
    profile = cProfile.Profile() if args.profile else None
    cpus, walls = [], []
    for rep in range(args.reps):
        cpu, wall = one_commit(args.rows, args.size, args.writes, args.partitions, profile)
        cpus.append(cpu)
        walls.append(wall)
        print(f"rep {rep}: commit CPU {cpu:.3f} s, wall {wall:.3f} s", flush=True)
    print(f"commit of {args.rows:,} x {args.size} B ({args.writes} writes, {args.partitions} "
          f"partitions): CPU median {statistics.median(cpus):.3f} s "
          f"[{min(cpus):.3f}..{max(cpus):.3f}], wall median {statistics.median(walls):.3f} s "
          f"[{min(walls):.3f}..{max(walls):.3f}]")  # fmt: skip
    if profile is not None:
        pstats.Stats(profile).sort_stats("cumulative").print_stats(40)


if __name__ == "__main__":
    main()
