"""Ledger crash writer: appends statements to a ``storage.ledger.Ledger`` until killed.

Run as a subprocess by ``test_ledger_crash.py``::

    python ledger_writer.py --root DIR --acks FILE --run N [--threads N] [--seed N]
        [--file-bytes N] [--copy]

Statement ``<run>.<k>`` of a thread puts 1-3 messages in each of a random set of
partitions (of ``PARTITIONS``); message ``i`` of partition ``p`` is ``payload(run, k, p, i)``,
so a checker can rebuild what every acknowledged share holds. Once ``append`` returns,
one ``os.write`` on an ``O_APPEND`` descriptor journals the acknowledgement::

    A <run>.<k> <p>:<base>:<count>,...

(a SIGKILL cannot tear so small a write; a torn last line would be ignored anyway).
``--copy`` adds a thread that plays the copier: it picks a partition, journals
``C <p> <end>`` with an fsync of the journal (standing for the copy's durable write into
the partition's segment), then ``release``s those offsets and calls
``drop_copied_files``. At start the writer passes the journal's largest ``C`` end of each
partition to the ledger as the partition's own end, as a partition log's recovery would.

Stdout gets ``ready`` once the ledger is open. Failpoints come from the environment
(``TOPICBASE_FAILPOINTS``, read at import by ``storage.failpoints``).
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

from storage.fs import FileSystem  # noqa: E402
from storage.ledger import Ledger  # noqa: E402
from storage.record_batch import build_wire_batch  # noqa: E402

PARTITIONS = 40


def payload(statement: str, partition: int, index: int) -> bytes:
    return f"{statement}.{partition}.{index}".encode() * 3


def copied_ends(journal: str) -> dict[int, int]:
    """Each partition's largest journaled copy end (``C`` lines; a torn last line ignored)."""
    ends: dict[int, int] = {}
    try:
        lines = Path(journal).read_text().splitlines()
    except FileNotFoundError:
        return ends
    for line in lines:
        fields = line.split(" ")
        if fields[0] == "C" and len(fields) == 3 and fields[2].isdigit():
            partition, end = int(fields[1]), int(fields[2])
            ends[partition] = max(ends.get(partition, 0), end)
    return ends


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", required=True)
    parser.add_argument("--acks", required=True)
    parser.add_argument("--run", type=int, required=True)
    parser.add_argument("--threads", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--file-bytes", type=int, default=64 * 1024)
    parser.add_argument("--copy", action="store_true")
    args = parser.parse_args()
    ledger = Ledger(FileSystem(), args.root, file_bytes_max=args.file_bytes,
                    partition_ends=copied_ends(args.acks))  # fmt: skip
    acks = os.open(args.acks, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    print("ready", flush=True)

    def copy() -> None:
        rng = random.Random(args.seed)
        while True:
            partition = rng.randrange(PARTITIONS)
            end = ledger.end_offset(partition)
            if end > ledger.start_offset(partition):
                os.write(acks, f"C {partition} {end}\n".encode())
                os.fsync(acks)
                ledger.release(partition, end)
                ledger.drop_copied_files()
            time.sleep(0.001)

    def work(thread: int) -> None:
        rng = random.Random(args.seed * 100 + thread)
        for k in range(10**9):
            statement = f"{args.run}.{thread}.{k}"
            chosen = sorted(rng.sample(range(PARTITIONS), rng.randint(1, 12)))
            counts = [rng.randint(1, 3) for _ in chosen]
            shares = [(p, build_wire_batch([payload(statement, p, i) for i in range(n)]))
                      for p, n in zip(chosen, counts, strict=True)]  # fmt: skip
            bases = ledger.append(shares)
            line = ",".join(f"{p}:{b}:{n}" for p, b, n in zip(chosen, bases, counts, strict=True))
            os.write(acks, f"A {statement} {line}\n".encode())

    threads = [threading.Thread(target=work, args=(t,), daemon=True) for t in range(args.threads)]
    if args.copy:
        threads.append(threading.Thread(target=copy, daemon=True))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


if __name__ == "__main__":
    main()
