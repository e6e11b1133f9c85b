"""Ledger route crash writer: a topic with its ledger on (``storage.ledger_route``),
spread statements through the ledger, single-partition appends the usual way, and the
topic's own copier thread, until killed.

Run as a subprocess by ``test_ledger_route_crash.py``::

    python ledger_route_writer.py --root DIR --acks FILE --run N [--threads N] [--seed N]

The topic (``DIR/t``, ``PARTITIONS`` partitions) opens as a store opens it: partition logs,
then the ledger with their ends (everything it holds copied in). Thread ``w`` puts, in
statement ``<run>.<w>.<k>``, 1-3 messages into each of 2-12 partitions, producer
``w<w>p<p>`` (one a thread and partition), seq_nos ``run * 10**6 + 10 * k + i``, through
``TopicLog.append_ledger`` (a statement the ledger declines goes ``TopicLog.append`` share
by share, as the engine would); the last thread writes one message at a time to one
partition with ``TopicLog.append`` (a write meeting a ledger tail). Once acknowledged::

    A <statement> <p>:<base>:<count>,...

The copier runs every few frames (``limits`` lowered here). Stdout gets ``ready`` once
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

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from storage import limits  # noqa: E402
from storage.clock import SYSTEM_CLOCK  # noqa: E402
from storage.codecs import Codec  # noqa: E402
from storage.config import TopicConfig  # noqa: E402
from storage.fs import FileSystem  # noqa: E402
from storage.record_batch import build_wire_batch  # noqa: E402
from storage.topic_log import TopicLog  # noqa: E402

PARTITIONS = 24


def payload(statement: str, partition: int, index: int) -> bytes:
    return f"{statement}.{partition}.{index}".encode() * 2


def seq_no(run: int, k: int, index: int) -> int:
    return run * 10**6 + 10 * k + index


def open_topic(root: str) -> TopicLog:
    directory = os.path.join(root, "t")
    create = not os.path.exists(os.path.join(directory, "topic.json"))
    topic = TopicLog(FileSystem(), directory, "t", SYSTEM_CLOCK, create=create, ledger=True)
    if create:
        topic.create(TopicConfig(partition_count=PARTITIONS,
                                 supported_codecs=frozenset({Codec.RAW})))  # fmt: skip
    return topic


def statement_shares(statement: str, run: int, thread: int, k: int, chosen: list[int],
                     counts: list[int]) -> list[tuple[int, np.ndarray, object]]:  # fmt: skip
    return [(p, np.arange(n), build_wire_batch(
        [payload(statement, p, i) for i in range(n)], producer_id=f"w{thread}p{p}",
        seq_no=[seq_no(run, k, i) for i in range(n)]))
        for p, n in zip(chosen, counts, strict=True)]  # fmt: skip


def spread_forever(topic: TopicLog, acks: int, run: int, seed: int, thread: int) -> None:
    rng = random.Random(seed * 100 + thread)
    for k in range(10**9):
        statement = f"{run}.{thread}.{k}"
        chosen = sorted(rng.sample(range(PARTITIONS), rng.randint(2, 12)))
        counts = [rng.randint(1, 3) for _ in chosen]
        shares = statement_shares(statement, run, thread, k, chosen, counts)
        bases = topic.append_ledger(shares)
        if bases is None:  # declined: the usual way, share by share
            bases = [int(topic.append(batch, p).offsets[0]) for p, _, batch in shares]
        line = ",".join(f"{p}:{b}:{n}" for p, b, n in zip(chosen, bases, counts, strict=True))
        os.write(acks, f"A {statement} {line}\n".encode())


def plain_forever(topic: TopicLog, acks: int, run: int, seed: int, thread: int) -> None:
    rng = random.Random(seed * 100 + thread)
    for k in range(10**9):
        statement = f"{run}.{thread}.{k}"
        p = rng.randrange(PARTITIONS)
        batch = build_wire_batch([payload(statement, p, 0)], producer_id=f"w{thread}p{p}",
                                 seq_no=[seq_no(run, k, 0)])  # fmt: skip
        base = int(topic.append(batch, p).offsets[0])
        os.write(acks, f"A {statement} {p}:{base}:1\n".encode())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", required=True)
    parser.add_argument("--acks", required=True)
    parser.add_argument("--run", type=int, required=True)
    parser.add_argument("--threads", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    limits.LEDGER_COPY_FRAMES_MIN = 5
    limits.LEDGER_COPY_WAIT_S = 0.05
    limits.LEDGER_FILE_BYTES_MAX = 16 * 1024
    limits.LEDGER_KEEP_COPIED_BYTES = 32 * 1024  # about two copied files kept, older dropped
    topic = open_topic(args.root)
    acks = os.open(args.acks, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    print("ready", flush=True)
    threads = [threading.Thread(target=spread_forever, args=(topic, acks, args.run, args.seed, t),
                                daemon=True) for t in range(args.threads - 1)]  # fmt: skip
    plain_args = (topic, acks, args.run, args.seed, args.threads - 1)
    threads.append(threading.Thread(target=plain_forever, args=plain_args, daemon=True))
    for thread in threads:
        thread.start()
    ledger = topic.ledger
    assert ledger is not None
    while all(thread.is_alive() for thread in threads):
        if ledger.copier_error is not None:  # a copy that fails is the test's failure
            print(f"copy failed: {ledger.copier_error!r}", file=sys.stderr, flush=True)
            os._exit(3)
        time.sleep(0.02)
    print("a writer thread died", file=sys.stderr, flush=True)
    os._exit(3)


if __name__ == "__main__":
    main()
