"""The commit CPU: a session's thread runs on one CPU while its session writes.

Why (issue 14, ``docs/move_profile.md`` rounds 26 and 27): on a quiet machine with two or
more cores, sessions committing small transactions hand the interpreter lock back and forth
across cores. A thread woken on one core (from a lock, a condition, ``fdatasync``) finds the
lock held by a thread running on the other and sleeps again in the lock's wait: 55 % of the
process's context switches in the 4-session move were such waits, ~12.5 voluntary switches
a transaction, 0.8 staging syncs a commit. With the committing threads on one core the same
code did 3.4-7 switches and 0.42-0.57 syncs a transaction, and ~25 % less CPU: a woken
thread runs only once the running one blocks, by which time the lock is free, and the
commits that gather during a sync share the next one.

What: ``CommitCpu.enter`` pins the calling thread to the commit CPU (the highest of the
CPUs the process may use when the ``CommitCpu`` was made); ``leave`` gives it back the
process's set. ``engine.session`` enters at a transaction's first statement that is not a
read (a topic write, an offset command, a table write, DDL; not a topic read, with or
without a consumer: see ``opens_window``) and leaves when
the transaction ends, so DuckDB's queries outside such a transaction, DuckDB's own
workers and the wire's threads keep every core. Windows nest per thread (a count).

Threads made by a pinned thread inherit its CPU (Arrow's and DuckDB's pools start their
threads lazily, the checkpoint thread starts on the commit path): at most every
``limits.COMMIT_CPU_SCAN_S`` a ``leave`` looks at the threads that appeared since its
last look and gives the process's set back to those pinned to the commit CPU alone that
are in no window. A thread something else pinned to that CPU after its first look is
left alone.

The affinity calls go to libc's ``sched_setaffinity`` through ``ctypes``, which lets go of
the interpreter lock for the call (``os.sched_setaffinity`` holds it): moving the calling
thread onto the commit CPU waits for that CPU, and with the lock held every other thread
waited too (py-spy of the 4-session topic-only move, round 33: ~10 % of the lock's held
time in that call; 7.4 voluntary switches a transaction with ``os``'s call, 3.6 with
this one, and 1,296-1,398 against 1,433-1,525 transactions/s in alternated runs). Where
libc has no such function, ``os.sched_setaffinity`` is used.

Off (``enter`` does nothing) when the process may use fewer than two CPUs, when
``TOPICBASE_COMMIT_CPU=0``, or for good once the kernel refuses a change of affinity
(a sandbox's seccomp, a CPU taken offline): the commit then runs where it did before.

Thread-safety: every method may be called from any thread; one lock guards the windows
and the scan's state; the system calls run outside it except the scan's.
"""

from __future__ import annotations

import ctypes
import errno
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from planner.operations import Introspect, ReadRecords, RunQuery
from storage import limits

ENVIRONMENT_VARIABLE = "TOPICBASE_COMMIT_CPU"
_TASKS = "/proc/self/task"

SetAffinity = Callable[[int, set[int]], None]
GetAffinity = Callable[[int], set[int]]


def opens_window(plan: Any) -> bool:
    """Whether a statement's plan is more than a read: anything but SELECTs that write no
    table, topic reads (peeks, and consumer reads too) and introspection.

    A consumer read alone opens no window (docs/consume_wire.md, round 28): a lone
    consumer's offset commit leads its own staging sync with no other committing thread
    to hand the lock to, so the pin bought nothing there and cost two affinity changes a
    read and the second core (same-run A/Bs of ``consume.wire``'s read: 0-310 us less server CPU a
    read unpinned). A transaction that also writes (a move: a consumer read into an
    INSERT) is pinned by its write, as before."""
    for operation in plan.operations:
        if isinstance(operation, RunQuery):
            if operation.tag != "SELECT" or operation.tables_written:
                return True
        elif not isinstance(operation, ReadRecords | Introspect):
            return True
    return False


def _libc_set_affinity() -> SetAffinity | None:
    """libc's ``sched_setaffinity`` as ``os.sched_setaffinity``'s signature, called without
    the interpreter lock (a ``ctypes.CDLL`` function releases it); None where there is none."""
    try:
        call = ctypes.CDLL(None, use_errno=True).sched_setaffinity
    except (AttributeError, OSError):
        return None
    call.argtypes = [ctypes.c_int, ctypes.c_size_t, ctypes.c_void_p]
    call.restype = ctypes.c_int
    word_bits = 8 * ctypes.sizeof(ctypes.c_ulong)  # glibc's cpu_set_t: unsigned longs

    def set_affinity(tid: int, cpus: set[int]) -> None:
        if any(cpu < 0 for cpu in cpus):
            raise OSError(errno.EINVAL, "negative CPU number")
        # whole words in the machine's own byte order, at least cpu_set_t's 1024 CPUs
        words = max(1024 // word_bits, max(cpus, default=0) // word_bits + 1)
        mask = (ctypes.c_ulong * words)()
        for cpu in cpus:
            mask[cpu // word_bits] |= 1 << (cpu % word_bits)
        if call(tid, ctypes.sizeof(mask), mask) != 0:
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code))  # ESRCH comes out as ProcessLookupError

    return set_affinity


_LIBC_SET_AFFINITY = _libc_set_affinity() if hasattr(os, "sched_setaffinity") else None


def _tasks() -> set[int]:
    """The process's thread ids (empty where /proc is not there)."""
    try:
        return {int(name) for name in os.listdir(_TASKS)}
    except OSError:
        return set()


class CommitCpu:
    """Pins committing threads to one CPU (see the module doc)."""

    def __init__(
        self,
        allowed: set[int] | None = None,
        *,
        enabled: bool | None = None,
        set_affinity: SetAffinity | None = None,
        get_affinity: GetAffinity | None = None,
        scan_s: float = limits.COMMIT_CPU_SCAN_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        has_calls = hasattr(os, "sched_setaffinity") and hasattr(os, "sched_getaffinity")
        if set_affinity is None and has_calls:
            set_affinity = _LIBC_SET_AFFINITY or os.sched_setaffinity
        self._set = set_affinity
        self._get = get_affinity or (os.sched_getaffinity if has_calls else None)
        if allowed is None:
            allowed = set(self._get(0)) if self._get is not None else set()
        self.allowed = frozenset(allowed)
        self.cpu = max(self.allowed) if self.allowed else -1
        if enabled is None:
            enabled = os.environ.get(ENVIRONMENT_VARIABLE, "1").strip() != "0"
        self.enabled = bool(enabled) and len(self.allowed) >= 2 and self._set is not None
        self.refused: BaseException | None = None  # the kernel's refusal that turned it off
        self._lock = threading.Lock()
        self._depth: dict[int, int] = {}  # thread id -> open windows
        self._scan_s = scan_s
        self._clock = clock
        self._next_scan = clock() + scan_s
        self._seen: set[int] = _tasks() if self.enabled else set()
        self.pins = 0  # windows that pinned their thread
        self.freed = 0  # inherited pins undone by the scan

    def enter(self) -> int | None:
        """Pin the calling thread to the commit CPU (or count one more window if it is
        already pinned); returns its thread id, for ``leave``, or None when off."""
        if not self.enabled:
            return None
        tid = threading.get_native_id()
        with self._lock:
            depth = self._depth.get(tid, 0)
            self._depth[tid] = depth + 1
        if depth:
            return tid
        try:
            assert self._set is not None
            self._set(0, {self.cpu})
        except OSError as refused:
            with self._lock:
                self._depth.pop(tid, None)  # never pinned: nothing to give back
            self._turn_off(refused)
            return None
        self.pins += 1
        return tid

    def leave(self, tid: int | None) -> None:
        """End a window ``enter`` opened (``tid`` is what it returned; None: nothing was
        pinned). The last window of the thread gives it back the process's CPUs."""
        if tid is None:
            return
        with self._lock:
            depth = self._depth.get(tid, 0) - 1
            if depth > 0:
                self._depth[tid] = depth
                return
            self._depth.pop(tid, None)
        own = tid == threading.get_native_id()
        # Another thread's id is used only while it is one of this process's threads (an
        # ended thread's id may be another process's by now).
        if self.enabled and (own or os.path.exists(f"{_TASKS}/{tid}")):
            try:
                assert self._set is not None
                self._set(0 if own else tid, set(self.allowed))
            except ProcessLookupError:
                pass  # that thread has ended
            except OSError as refused:
                self._turn_off(refused)
        if self._clock() >= self._next_scan:
            self.free_inherited()

    def pinned(self) -> set[int]:
        """Threads in a window now."""
        with self._lock:
            return set(self._depth)

    def free_inherited(self) -> int:
        """Give the process's CPUs back to threads that appeared since the last scan, are
        in no window and may run on the commit CPU alone (they inherited a pinned
        creator's affinity). Returns how many."""
        freed = 0
        with self._lock:
            self._next_scan = self._clock() + self._scan_s
            tasks = _tasks()
            new, self._seen = tasks - self._seen, tasks
            if not self.enabled or self._get is None or self._set is None:
                return 0
            for tid in sorted(new - set(self._depth)):
                try:
                    if set(self._get(tid)) != {self.cpu}:
                        continue
                    self._set(tid, set(self.allowed))
                except OSError:
                    continue  # ended meanwhile, or not ours to change
                freed += 1
            self.freed += freed
        return freed

    def _turn_off(self, refused: BaseException) -> None:
        """The kernel refused an affinity change: off for good, every pinned thread
        given back the process's CPUs as far as the kernel lets it."""
        self.enabled = False
        self.refused = refused
        with self._lock:
            pinned, self._depth = list(self._depth), {}
        for tid in pinned:
            if not os.path.exists(f"{_TASKS}/{tid}"):
                continue
            try:
                assert self._set is not None
                self._set(tid, set(self.allowed))
            except OSError:
                pass


_process: CommitCpu | None = None
_process_lock = threading.Lock()


def process_commit_cpu() -> CommitCpu:
    """The process's ``CommitCpu`` (made at the first call, from the calling thread's
    CPUs: ``Database.open`` calls it)."""
    global _process
    with _process_lock:
        if _process is None:
            _process = CommitCpu()
        return _process


def set_process_commit_cpu(commit_cpu: CommitCpu | None) -> CommitCpu | None:
    """Replace the process's ``CommitCpu`` (tests); returns the one it had."""
    global _process
    with _process_lock:
        previous, _process = _process, commit_cpu
        return previous
