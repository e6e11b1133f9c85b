"""Plain rows combined across sessions (``engine.spread_append.PlainCombiner``) across
SIGKILLs: ``plain_combine_worker.py`` writes one-message statements from 12 sessions at
once, journaling each acknowledged value, and is SIGKILLed at a random moment after
combined rounds ran; the data directory is then reopened (recovery) and the next run
writes on. Checked after every kill: every acknowledged value is in the topic, and no
value is there twice (a statement's message is stored once or, unacknowledged, not at
all). ``PLAIN_COMBINE_KILLS`` (default 3), ``PLAIN_COMBINE_SEED`` (printed on failure).
"""

from __future__ import annotations

import collections
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from engine.database import Database

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
WORKER = HERE / "plain_combine_worker.py"
KILLS = int(os.environ.get("PLAIN_COMBINE_KILLS", "3"))
STARTUP_TIMEOUT_S = 120  # catches a hung worker only (two shared cores under load)


def _stored(data: Path) -> collections.Counter[bytes]:
    database = Database.open(str(data))
    try:
        topic = database.topic_log(database.catalog.entry("t").topic_id)
        counts: collections.Counter[bytes] = collections.Counter()
        for partition in topic.partition_ids():
            offset = 0
            while True:
                read = topic.read(partition, offset, max_messages=5000)
                if not read.batches:
                    break
                for batch in read.batches:
                    counts.update(batch.column("data").to_pylist())
                offset = read.next_offset
        return counts
    finally:
        database.close()


def test_sigkill_while_statements_are_combined(tmp_path: Path) -> None:
    seed = int(os.environ.get("PLAIN_COMBINE_SEED") or random.SystemRandom().randrange(2**32))
    chance = random.Random(seed)
    data, journal = tmp_path / "data", tmp_path / "journal"
    for run in range(KILLS):
        process = subprocess.Popen(
            [sys.executable, str(WORKER), str(data), str(journal), str(run)],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            assert process.stdout is not None
            line = process.stdout.readline()  # blocks until combined rounds ran
            assert line.strip() == "combined", (seed, line, process.stderr.read())
            time.sleep(chance.uniform(0.0, 0.3))  # a random moment, not a timed assertion
            process.send_signal(signal.SIGKILL)
            assert process.wait(STARTUP_TIMEOUT_S) == -signal.SIGKILL
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
        acknowledged = journal.read_bytes().split(b"\n")[:-1]
        assert acknowledged, seed
        stored = _stored(data)
        twice = [value for value, count in stored.items() if count > 1]
        assert twice == [], (seed, run, twice[:5])
        missing = [value for value in acknowledged if value not in stored]
        assert missing == [], (seed, run, len(missing), missing[:5])
