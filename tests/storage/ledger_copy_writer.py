"""Ledger copy crash writer: appends statements to a ledger and copies them into the
partitions' own logs (``storage.ledger_copy``) until killed.

Run as a subprocess by ``test_ledger_copy_crash.py``::

    python ledger_copy_writer.py --root DIR --acks FILE --run N [--threads N] [--seed N]

``DIR/p<partition>`` holds each partition's log, ``DIR/ledger`` the ledger. At start the
logs open first (their recovery cuts torn tails) and the ledger opens with their ends, as
a store would. Statements are ``ledger_writer.py``'s (1-3 messages in each of a random set
of partitions, ``payload(statement, p, i)``), journaled once acknowledged::

    A <run>.<thread>.<k> <p>:<base>:<count>,...

A copier thread calls ``copy_ledger`` again and again with a random message limit (1: one
frame at a time; more: many frames a partition append). Stdout gets ``ready`` once all is
open. Failpoints come from the environment (``TOPICBASE_FAILPOINTS``).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from ledger_writer import PARTITIONS, append_forever  # noqa: E402

from storage.clock import SystemClock  # noqa: E402
from storage.config import FsyncPolicy, TopicConfig  # noqa: E402
from storage.fs import FileSystem  # noqa: E402
from storage.ledger import Ledger  # noqa: E402
from storage.ledger_copy import copy_ledger  # noqa: E402
from storage.partition_log import PartitionLog  # noqa: E402


def open_topic(root: str, file_bytes: int = 64 * 1024) -> tuple[Ledger, dict[int, PartitionLog]]:
    """The partitions' logs (recovered first), then the ledger with their ends."""
    fs = FileSystem()
    # NEVER: a copy syncs on its own (``append_copied``), whatever the policy
    config = TopicConfig(fsync_policy=FsyncPolicy.NEVER).validate()
    logs = {p: PartitionLog(fs, os.path.join(root, f"p{p}"), p, config, SystemClock())
            for p in range(PARTITIONS)}  # fmt: skip
    ledger = Ledger(fs, os.path.join(root, "ledger"), file_bytes_max=file_bytes,
                    partition_ends={p: log.end_offset for p, log in logs.items()})  # fmt: skip
    return ledger, logs


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", required=True)
    parser.add_argument("--acks", required=True)
    parser.add_argument("--run", type=int, required=True)
    parser.add_argument("--threads", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    ledger, logs = open_topic(args.root)
    acks = os.open(args.acks, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    print("ready", flush=True)

    def copy() -> None:
        rng = random.Random(args.seed)
        try:
            while True:
                copy_ledger(ledger, logs, max_messages=rng.choice((1, 30, 400)))
                time.sleep(rng.choice((0.0, 0.002, 0.01)))
        except BaseException as error:  # a copy that fails is the test's failure: say so
            print(f"copy failed: {error!r}", file=sys.stderr, flush=True)
            os._exit(3)

    threads = [threading.Thread(target=append_forever, args=(ledger, acks, args.run, args.seed, t),
                                daemon=True) for t in range(args.threads)]  # fmt: skip
    threads.append(threading.Thread(target=copy, daemon=True))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


if __name__ == "__main__":
    main()
