"""Crash worker for ``test_plain_combine_crash``: 12 threads, each with its own session,
write one-message autocommit ``INSERT INTO TOPIC t (data) VALUES ($1)`` statements (so
the topic is busy and ``engine.spread_append.PlainCombiner`` combines them) until
killed. Each acknowledged value is appended to the journal right after the
acknowledgement (a line ``<value>``); the kernel keeps it across a SIGKILL of this
process. Prints ``combined`` once combined rounds ran, so the test kills it mid-way.

Usage: ``plain_combine_worker.py DATA JOURNAL RUN``.
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this tree's packages

from engine import spread_append
from engine.database import Database

THREADS = 12


def main(data: str, journal: str, run: str) -> None:
    database = Database.open(data)
    session = database.connect()
    if database.catalog.entry("t") is None:
        session.execute("CREATE TOPIC t WITH (min_active_partitions = 4)")
    topic = database.topic_log(database.catalog.entry("t").topic_id)
    fd = os.open(journal, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    lock = threading.Lock()

    def write(index: int) -> None:
        mine = database.connect()
        for i in range(10**9):
            value = f"{run}.{index}.{i}"
            assert mine.execute("INSERT INTO TOPIC t (data) VALUES ($1)",
                                [value])[-1].tag == "INSERT 0 1"  # fmt: skip
            with lock:
                os.write(fd, value.encode() + b"\n")

    threads = [threading.Thread(target=write, args=(i,), daemon=True) for i in range(THREADS)]
    for thread in threads:
        thread.start()
    told = False
    while True:
        threading.Event().wait(0.01)
        combiner = spread_append._COMBINERS.get(topic)
        if not told and combiner is not None and combiner.rounds >= 20:
            print("combined", flush=True)
            told = True


if __name__ == "__main__":
    main(*sys.argv[1:4])
