"""Whether a latency benchmark's client and serving thread ran on the same CPU.

Why (docs/statement_cost.md, round 11): on this benchmark's 2-vCPU VM a round trip whose
client and serving thread run on *different* vCPUs costs each side 2-3x the CPU of one
whose two threads take turns on one vCPU (the woken side's vCPU comes out of idle for
every message). Pinned by hand at load ~8: PostgreSQL's backend 8 -> 46 us of CPU a
``SELECT 1`` and 17 -> 61 us a lookup; Topicbase's server 46 -> 112 and 70 -> 155 us;
psycopg's client CPU tripled against either. Left to the scheduler, which placement a
pair gets depends on the machine's load, so a latency figure means little without it:
the latency rounds sample it (``Placement``) and record the share of round trips whose
two threads were apart.

Linux only (``/proc``); elsewhere every answer is None and nothing is recorded.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field

PROCESSOR_FIELD = 36  # 0-based among /proc/.../stat's fields after "(comm)": "processor"


def thread_times(pid: int) -> dict[int, int]:
    """Run time (ns) of each live thread of process ``pid`` so far (empty: no /proc or
    the process ended)."""
    times: dict[int, int] = {}
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return times
    for task in tasks:
        path = f"/proc/{pid}/task/{task}/schedstat"
        with contextlib.suppress(OSError, ValueError, IndexError), open(path) as stat:
            times[int(task)] = int(stat.read().split()[0])
    return times


def busiest(pid: int, before: dict[int, int]) -> int | None:
    """The thread of ``pid`` that ran longest since ``before`` (``thread_times``), or None."""
    now = thread_times(pid)
    if not now:
        return None
    return max(now, key=lambda tid: now[tid] - before.get(tid, 0))


def last_cpu(pid: int, tid: int) -> int | None:
    """The CPU thread ``tid`` of ``pid`` runs on or last ran on (None: gone or no /proc)."""
    try:
        with open(f"/proc/{pid}/task/{tid}/stat") as stat:
            text = stat.read()
        return int(text[text.rindex(")") + 2 :].split()[PROCESSOR_FIELD])
    except (OSError, ValueError, IndexError):
        return None


def own_cpu() -> int | None:
    """The CPU the calling thread runs on now."""
    try:
        with open("/proc/thread-self/stat") as stat:
            text = stat.read()
        return int(text[text.rindex(")") + 2 :].split()[PROCESSOR_FIELD])
    except (OSError, ValueError, IndexError):
        return None


@dataclass
class Placement:
    """Samples of one round: was the serving process's busiest thread on another CPU than
    the client's thread, right after a round trip? ``start`` before the round's first call,
    ``found`` after it, ``sample`` after later calls (outside their timing)."""

    pid: int
    before: dict[int, int] = field(default_factory=dict)
    tid: int | None = None
    apart: int = 0
    samples: int = 0

    def start(self) -> None:
        self.before = thread_times(self.pid)

    def found(self) -> None:
        self.tid = busiest(self.pid, self.before)

    def sample(self) -> None:
        if self.tid is None:
            return
        theirs, mine = last_cpu(self.pid, self.tid), own_cpu()
        if theirs is None or mine is None:
            return
        self.samples += 1
        self.apart += theirs != mine

    @property
    def share(self) -> float | None:
        """Share of the samples taken with the two threads apart (None: no sample)."""
        return self.apart / self.samples if self.samples else None
