"""The copy of the ledger into the partitions' logs (``storage.ledger_copy``, round 27 H5):
its CPU per 1000-partition frame copied.

``python -m bench.scale_ledger_copy`` (thread CPU and wall time of ``copy_ledger``, per
ledger frame copied; A/B alternated, ``PAIRS`` pairs, medians and ranges): the statement
of ``bench.scale_ledger_module`` (5,000 messages over 1000 partitions, 5 a share; each
statement's seq_nos follow the last one's), appended to a ledger, then copied into 1000
partition logs:
A, one frame a copy (``max_messages=1``: 1000 appends and 1000 syncs for one frame);
B and C, 8 and 32 frames a copy (1000 appends and syncs for all of them: each
partition's shares of those frames as one frame).
Each runs with the file system's syncs (fdatasync of each partition's log) and with a
file system whose sync does nothing (the copy's own CPU).
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time

import pyarrow as pa

from bench.scale_ledger_module import PARTITIONS, _NoSync, _statement
from storage.clock import SystemClock
from storage.config import FsyncPolicy, TopicConfig
from storage.fs import FileSystem
from storage.ledger import Ledger
from storage.ledger_copy import copy_ledger
from storage.partition_log import PartitionLog

PAIRS = 5  # alternated A B C triples
VARIANTS = (("A", 1), ("B", 8), ("C", 32))  # frames a copy


def _cpu() -> float:
    return time.clock_gettime(time.CLOCK_THREAD_CPUTIME_ID)


def _summary(values: list[float]) -> str:
    ms = [v * 1e3 for v in values]
    return f"{statistics.median(ms):.1f} ms (range {min(ms):.1f}-{max(ms):.1f}, n={len(ms)})"


class _Topic:
    def __init__(self, directory: str, fs: FileSystem) -> None:
        config = TopicConfig(fsync_policy=FsyncPolicy.NEVER).validate()
        self.logs = {p: PartitionLog(fs, os.path.join(directory, f"p{p}"), p, config,
                                     SystemClock()) for p in range(PARTITIONS)}  # fmt: skip
        self.ledger = Ledger(fs, os.path.join(directory, "ledger"))
        self.seq = 0

    def append(self, shares: list[tuple[int, pa.RecordBatch]], frames: int) -> None:
        for _ in range(frames):
            moved = []
            for partition, batch in shares:  # seq_nos past the last statement's
                seq = pa.array([s + self.seq for s in batch.column("seq_no").to_pylist()])
                moved.append((partition, batch.set_column(0, "seq_no", seq)))
            self.seq += 5_000
            self.ledger.append(moved)

    def copy(self, max_messages: int) -> tuple[float, float, int]:
        wall, cpu = time.perf_counter(), _cpu()
        report = copy_ledger(self.ledger, self.logs, max_messages=max_messages)
        return _cpu() - cpu, time.perf_counter() - wall, report.appends

    def close(self) -> None:
        self.ledger.close()
        for log in self.logs.values():
            log.close()


def main() -> None:
    shares = _statement()
    directory = tempfile.mkdtemp(prefix="ledger_copy_")
    print(f"load {os.getloadavg()[0]:.1f}, {time.strftime('%H:%M', time.gmtime())} UTC")
    try:
        for name, fs in (("fdatasync", FileSystem()), ("no sync", _NoSync())):
            topic = _Topic(os.path.join(directory, name.replace(" ", "")), fs)
            results: dict[str, tuple[list[float], list[float]]] = {
                label: ([], []) for label, _ in VARIANTS
            }
            for _ in range(PAIRS):
                for label, frames in VARIANTS:
                    topic.append(shares, frames)
                    cpu, wall, appends = topic.copy(1 if frames == 1 else frames * 5_000)
                    assert appends == PARTITIONS and not topic.ledger.pending()
                    results[label][0].append(cpu / frames)
                    results[label][1].append(wall / frames)
            topic.close()
            for label, (cpus, walls) in results.items():
                what = f"{dict(VARIANTS)[label]} frame(s) a copy"
                print(f"{name}, {label} ({what}), per frame: CPU {_summary(cpus)}; "
                      f"wall {_summary(walls)}")  # fmt: skip
        print(f"load {os.getloadavg()[0]:.1f}, {time.strftime('%H:%M', time.gmtime())} UTC")
    finally:
        shutil.rmtree(directory)


if __name__ == "__main__":
    main()
