"""Wall time of the plain combiner's rounds at CLIENTS producers (docs/durable_produce.md,
round 21). Measurement only.

``python bench/prototypes/wire_loop/walls.py TREE CLIENTS SECONDS`` serves TREE with
``bench.served`` in its own process, with wall clocks (``time.perf_counter``) around
``PlainCombiner._round`` (and the round thread's CPU, ``time.thread_time``, kernel time
included), ``FileSystem.sync`` and ``FileSystem.pwritev``, drives it with ``probe.run``
and prints: the rounds' wall time and share of the run (busy), the gap between one
round's end and the next round's start (the next leader's wake-up), messages a round, the
sync's and the write's wall time, and a follower's time from ``GroupCommitter.submit``'s
return to the end of its reply's send. The first tenth of the rounds (warm-up) is left
out. Run with ``--serve DATA_DIR OUT`` it is the server process itself.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import tempfile
import threading
import time
from typing import Any

_events: list[tuple[str, float, float, float]] = []
_local = threading.local()


def _wrap(owner: Any, name: str, make: Any) -> None:
    setattr(owner, name, make(getattr(owner, name)))


def serve(directory: str, out: str) -> None:
    from engine import spread_append
    from sql.pgwire.connection import output
    from storage import fs, group_commit

    clock, cpu = time.perf_counter, time.thread_time

    def rounds(function: Any) -> Any:
        def timed(self: Any, requests: list[Any]) -> Any:
            started, spent = clock(), cpu()
            try:
                return function(self, requests)
            finally:
                _events.append(("round", started, clock(), len(requests)))
                _events.append(("round_cpu", spent, cpu(), 0))
        return timed

    def syscall(kind: str) -> Any:
        def make(function: Any) -> Any:
            def timed(*args: Any, **kwargs: Any) -> Any:
                started = clock()
                try:
                    return function(*args, **kwargs)
                finally:
                    _events.append((kind, started, clock(), 0))
            return timed
        return make

    def submit(function: Any) -> Any:
        def timed(*args: Any, **kwargs: Any) -> Any:
            try:
                return function(*args, **kwargs)
            finally:
                _local.returned = clock()
        return timed

    def flush(function: Any) -> Any:
        def timed(*args: Any, **kwargs: Any) -> Any:
            try:
                return function(*args, **kwargs)
            finally:
                returned = getattr(_local, "returned", None)
                if returned is not None:
                    _events.append(("reply", returned, clock(), 0))
                    _local.returned = None
        return timed

    _wrap(spread_append.PlainCombiner, "_round", rounds)
    _wrap(fs.FileSystem, "sync", syscall("sync"))
    _wrap(fs.FileSystem, "pwritev", syscall("pwritev"))
    _wrap(group_commit.GroupCommitter, "submit", submit)
    _wrap(output.GatheringWriter, "flush", flush)
    from bench import served

    try:
        served.main([directory])
    finally:
        with open(out, "w") as f:
            json.dump(_events, f)


def drive(tree: str, clients: int, seconds: float) -> None:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import numpy as np
    import probe

    out = tempfile.mktemp(suffix=".json")

    served = probe.Served(tree, {"PYTHONPATH": tree}, prefix="walls-",
                          script=[os.path.abspath(__file__), "--serve", "{directory}", out])
    try:
        figures = probe.run(served, clients, seconds)
    finally:
        served.stop()
    with open(out) as f:
        events = json.load(f)
    os.remove(out)
    print({k: round(v, 2) for k, v in figures.items()})

    def us(kind: str) -> Any:
        return np.array([end - start for k, start, end, _ in events if k == kind]) * 1e6

    rounds = sorted((e for e in events if e[0] == "round"), key=lambda e: e[1])
    rounds = rounds[len(rounds) // 10:]
    walls = np.array([end - start for _, start, end, _ in rounds]) * 1e6
    sizes = np.array([size for *_, size in rounds])
    gaps = np.array([b[1] - a[2] for a, b in itertools.pairwise(rounds)]) * 1e6
    span = rounds[-1][2] - rounds[0][1]
    print(f"rounds {len(rounds)} in {span:.2f} s, busy {walls.sum() / 1e6 / span:.2f}; "
          f"wall p50 {np.median(walls):.0f} us (mean {walls.mean():.0f}); round thread CPU "
          f"p50 {np.median(us('round_cpu')):.0f} us; messages a round p50 {np.median(sizes)} "
          f"(mean {sizes.mean():.2f}); gap p50 {np.median(gaps):.0f} us (mean {gaps.mean():.0f})")
    for kind in ("sync", "pwritev", "reply"):
        walls = us(kind)
        print(f"{kind}: wall p50 {np.median(walls):.0f} us (mean {walls.mean():.0f}), "
              f"n {len(walls)}")


if __name__ == "__main__":
    if sys.argv[1] == "--serve":
        sys.path.insert(0, os.getcwd())
        serve(sys.argv[2], sys.argv[3])
    else:
        drive(sys.argv[1], int(sys.argv[2]), float(sys.argv[3]))
