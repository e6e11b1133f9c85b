"""A backlog at 1000 partitions read after the copier kept what it could (round 34).

``python bench/prototypes/kept_backlog.py [KEEP_MIB] [SECONDS]`` from the tree's root: the
scale bench's statements (5,000 messages of 1 KiB from 2,000 producer ids) into a
1000-partition topic for SECONDS (default 5), the ledger drained as a copier's pass would
(``bench.scale_bench._drained``), then read with 20,000-message consumer polls; prints the
files the copier kept (``LEDGER_KEEP_COPIED_BYTES`` = KEEP_MIB, default 256) and the read's
msgs/s and CPU a message. A backlog past the kept bytes reads its dropped part from the
partitions (docs/scale.md round 34); since round 35 the copier keeps past them, up to
``LEDGER_KEEP_UNREAD_BYTES``, the files consumer ``c`` has not read. A diagnostic, not
part of ``bench.run``.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.getcwd())

from bench import scale_bench
from bench.storage_bench import make_messages
from sql import dbapi
from storage import limits


def main(argv: list[str]) -> None:
    if argv:
        limits.LEDGER_KEEP_COPIED_BYTES = int(argv[0]) << 20
    seconds = float(argv[1]) if len(argv) > 1 else 5.0
    parent = tempfile.mkdtemp(prefix="tb-kept-backlog-")
    conn = dbapi.connect(os.path.join(parent, "store"), autocommit=True)
    try:
        cursor = conn.cursor()
        cursor.execute("CREATE TOPIC t (CONSUMER c) WITH (min_active_partitions = 1000)")
        pool = make_messages()
        data = [pool[i % len(pool)] for i in range(scale_bench.PRODUCE_BATCH)]
        ids = [f"producer-{i % scale_bench.PRODUCERS}" for i in range(scale_bench.PRODUCE_BATCH)]
        scale_bench._warmed(conn, cursor, "t", data, ids)
        sent, started = 0, time.perf_counter()
        while time.perf_counter() - started < seconds:
            cursor.execute(scale_bench.INSERT.format(topic="t"), [data, ids])
            sent += scale_bench.PRODUCE_BATCH
        scale_bench._drained(conn, "t")
        ledger = scale_bench._ledger_of(conn, "t").ledger
        files = ledger.file_numbers
        kept = sum(ledger._files[number].size for number in files)
        print(f"produced {sent:,} messages; {len(files)} ledger files, {kept >> 20} MiB "
              f"(kept budget {limits.LEDGER_KEEP_COPIED_BYTES >> 20} MiB)")
        read = ("SELECT data FROM TOPIC t WITH (consumer = 'c', "
                f"max_messages = {scale_bench.CONSUME_BATCH})")
        got, cpu, wall = 0, time.process_time(), time.perf_counter()
        while got < sent:
            cursor.execute(read)
            got += len(cursor.fetchall())
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        print(f"read {got / wall:,.0f} msgs/s, {cpu / got * 1e6:.2f} us of CPU a message")
    finally:
        conn.close()
        shutil.rmtree(parent, ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1:])
