"""Why the batched-append ratio swings: ``python -m bench.append_stability [--reps N]``.

Runs the ``storage.append.never.batch1000`` case of ``bench.storage_bench`` (256
prebuilt 1000-message batches, 0.4 s cap) against three raw baselines, in turn,
``--reps`` times, in two modes:

- ``as-is``: one run after the other, as the benchmark does;
- ``settled``: before every run, ``os.sync()`` and a wait until the kernel's
  Dirty + Writeback (``/proc/meminfo``) is under 32 MB (note: ``sync`` is
  machine-wide).

Baselines: ``raw`` (``os.write`` per batch, ``fdatasync`` per 64 MiB written, the
storage's seal pattern: what the benchmark compares with) and ``raw+hint`` (the
same plus ``sync_file_range(SYNC_FILE_RANGE_WRITE)`` after each write, as the
storage does). For each run it prints wall-clock MB/s, MB per CPU-second
(``time.process_time``) and Dirty + Writeback at its start; then the ranges of
the storage/raw ratios in wall-clock and CPU terms. Findings: ``bench/findings.md``.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Sequence

from bench import storage_bench as sb
from storage.config import FsyncPolicy

SETTLE_MB = 32.0
SETTLE_TIMEOUT_S = 20.0
SYNC_FILE_RANGE_WRITE = 2
_LIBC = ctypes.CDLL(None, use_errno=True)


def settle() -> None:
    os.sync()
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while sb.dirty_mb() > SETTLE_MB and time.monotonic() < deadline:
        time.sleep(0.05)


def raw_hinted(parent: str, frames: Sequence[bytes], messages: int) -> sb.Run:
    """The raw baseline plus a writeback hint after each write, as the storage gives."""
    path = os.path.join(parent, "raw-hinted.log")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        position = unsealed = 0
        cpu = time.process_time()
        start = time.perf_counter()
        for frame in frames:
            if unsealed >= sb.SEGMENT_BYTES:
                os.fdatasync(fd)
                unsealed = 0
            written = os.write(fd, frame)
            _LIBC.sync_file_range(fd, ctypes.c_longlong(position), ctypes.c_longlong(written),
                                  SYNC_FILE_RANGE_WRITE)  # fmt: skip
            position += written
            unsealed += written
        elapsed = time.perf_counter() - start
        cpu = time.process_time() - cpu
    finally:
        os.close(fd)
        os.remove(path)
    return sb.Run(len(frames), messages, position, elapsed, 0, cpu)


def _span(values: list[float]) -> str:
    return f"median {statistics.median(values):.2f}, {min(values):.2f}-{max(values):.2f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.append_stability")
    parser.add_argument("--reps", type=int, default=6)
    parser.add_argument("--modes", default="as-is,settled")
    args = parser.parse_args(argv)
    parent = tempfile.mkdtemp(prefix="topicbase-append-stability-",
                              dir=os.environ.get("TOPICBASE_BENCH_DIR") or None)  # fmt: skip
    try:
        pool = sb.make_messages()
        sb.warm_up(parent, pool)
        batches = sb.build_batches(sb.message_lists(pool, 1000, 256), sb.PRODUCER)
        frames = sb.frames_of(batches)
        sb.append_prebuilt(parent, FsyncPolicy.NEVER, batches, 0.4)  # warm-up
        print(f"load average {os.getloadavg()}; {sb.dirty_settings()}")
        for mode in args.modes.split(","):
            wall: dict[str, list[float]] = {"raw": [], "raw+hint": []}
            cpu: dict[str, list[float]] = {"raw": [], "raw+hint": []}
            for rep in range(args.reps):
                line = []
                if mode == "settled":
                    settle()
                start_dirty = sb.dirty_mb()
                ours = sb.append_prebuilt(parent, FsyncPolicy.NEVER, batches, 0.4)
                line.append(f"storage {ours.mb_s:5.0f} MB/s {ours.mb_per_cpu_s:5.0f} MB/cpu-s "
                            f"(dirty {start_dirty:.0f} MB)")  # fmt: skip
                written = frames[: ours.batches]
                for name in ("raw", "raw+hint"):
                    if mode == "settled":
                        settle()
                    start_dirty = sb.dirty_mb()
                    if name == "raw":
                        base = sb.raw_write(parent, written, ours.messages, False, sb.SEGMENT_BYTES)
                    else:
                        base = raw_hinted(parent, written, ours.messages)
                    wall[name].append(ours.mb_s / base.mb_s)
                    cpu[name].append(ours.mb_per_cpu_s / base.mb_per_cpu_s)
                    line.append(f"{name} {base.mb_s:5.0f} MB/s {base.mb_per_cpu_s:5.0f} MB/cpu-s "
                                f"(dirty {start_dirty:.0f} MB)")  # fmt: skip
                print(f"{mode} rep {rep + 1}: " + "; ".join(line), flush=True)
            for name in wall:
                print(f"{mode}: storage / {name}: wall {_span(wall[name])}; "
                      f"per CPU-second {_span(cpu[name])}")  # fmt: skip
    finally:
        shutil.rmtree(parent, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
