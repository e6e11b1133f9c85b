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
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

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


def append_forever(ledger: Ledger, acks: int, run: int, seed: int, thread: int) -> None:
    """One appending thread until the process dies: statement ``<run>.<thread>.<k>`` puts
    1-3 messages in each of 1-12 partitions, journalled (``A`` line) once ``append``
    returned."""
    rng = random.Random(seed * 100 + thread)
    for k in range(10**9):
        statement = f"{run}.{thread}.{k}"
        chosen = sorted(rng.sample(range(PARTITIONS), rng.randint(1, 12)))
        counts = [rng.randint(1, 3) for _ in chosen]
        shares = [(p, build_wire_batch([payload(statement, p, i) for i in range(n)]))
                  for p, n in zip(chosen, counts, strict=True)]  # fmt: skip
        bases = ledger.append(shares)
        line = ",".join(f"{p}:{b}:{n}" for p, b, n in zip(chosen, bases, counts, strict=True))
        os.write(acks, f"A {statement} {line}\n".encode())


# -- the tests' side: run a writer and kill it ----------------------------------------------
START_S = 60.0
PROGRESS_S = 30.0


def log_rows(log: Any) -> tuple[list[int], list[bytes]]:
    """Every offset and message of a partition log (a ``PartitionLog``), in order."""
    offsets: list[int] = []
    data: list[bytes] = []
    offset = 0
    while offset < log.end_offset:
        result = log.read(offset, max_messages=10_000)
        for batch in result.batches:
            offsets.extend(batch.column("offset").to_pylist())
            data.extend(batch.column("data").to_pylist())
        offset = result.next_offset
    return offsets, data


def crash_seed() -> int:
    """``LEDGER_CRASH_SEED`` to replay a failure, else a fresh random seed."""
    return int(os.environ.get("LEDGER_CRASH_SEED") or random.SystemRandom().randrange(2**32))


def ack_lines(path: Path) -> int:
    """Lines of the ack journal so far (0 before it exists)."""
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def run_and_kill(command: list[str], acks: Path, failpoints: str, kill_after_acks: int) -> None:
    """One writer run (``command``): it dies by its failpoint (``failpoints`` given), or
    is SIGKILLed once ``acks`` has ``kill_after_acks`` more lines. Asserts it died by
    SIGKILL (a failpoint's crash is one), with its stderr."""
    before = ack_lines(acks)
    env = dict(os.environ, TOPICBASE_FAILPOINTS=failpoints)
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        deadline = time.monotonic() + START_S + PROGRESS_S
        while proc.poll() is None and time.monotonic() < deadline:
            if not failpoints and ack_lines(acks) - before >= kill_after_acks:
                break
            time.sleep(0.005)
        if proc.poll() is None:
            assert not failpoints, "the writer outlived its failpoint"
            proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    stderr = proc.stderr.read().decode() if proc.stderr else ""
    assert proc.returncode in (-signal.SIGKILL, 137), (proc.returncode, stderr)


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

    threads = [threading.Thread(target=append_forever, args=(ledger, acks, args.run, args.seed, t),
                                daemon=True) for t in range(args.threads)]  # fmt: skip
    if args.copy:
        threads.append(threading.Thread(target=copy, daemon=True))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


if __name__ == "__main__":
    main()
