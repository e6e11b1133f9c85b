"""Large transient read buffers kept for the next read instead of returned to the
system (issue 14).

A consumer poll over 1000 partitions reads ~24 MB of frames into one array
(``storage.bulk_scan``), decodes them (copying what it keeps) and drops the array. A
fresh array of that size is mapped anew by the allocator (glibc maps one at or above
its dynamic threshold, which its own last free sets; Arrow's mimalloc purges freed
memory after 10 ms), so each poll faulted its pages in again (1,000-2,700 faults, the
poll's CPU doubling from one poll to the next). The pool keeps a few idle arrays,
already faulted in, for the next poll.

Only buffers nothing refers to after the read are pooled. Memory handed on to a result
(the ``data`` column; a 10-partition poll's windows, which its zero-copy batches keep)
stays plain: its frees keep glibc's thresholds where the rows a client makes of a
result find their pages still mapped. Pooling those too (a lease returned when the
last view is gone) made the rows fault instead: ~3,700 pages a poll.

``take(size)`` gives an array of exactly ``size`` bytes (a view of a pooled one when one
is large enough, and not much larger); ``give`` returns it once nothing refers to it.

Bounded: at most ``KEEP_ARRAYS`` idle arrays and ``KEEP_BYTES`` idle bytes (the
smallest dropped first); arrays under ``POOLED_BYTES_MIN`` are not pooled. A forked
child starts empty. Thread-safe.
"""

from __future__ import annotations

import os
import threading

import numpy as np

POOLED_BYTES_MIN = 1024 * 1024
KEEP_ARRAYS = 4
KEEP_BYTES = 64 * 1024 * 1024
# An idle array serves a request of at least this share of its size (a small request
# does not pin a large array).
FIT_SHARE = 4


class BufferPool:
    def __init__(self, keep_arrays: int = KEEP_ARRAYS, keep_bytes: int = KEEP_BYTES) -> None:
        self._idle: list[np.ndarray] = []
        self._keep_arrays = keep_arrays
        self._keep_bytes = keep_bytes
        self._lock = threading.Lock()
        self.takes = self.fresh = 0  # counts, for tests and profiles

    @property
    def idle_bytes(self) -> int:
        with self._lock:
            return sum(array.size for array in self._idle)

    def take(self, size: int) -> np.ndarray:
        """A uint8 array of ``size`` bytes, contents undefined."""
        assert size >= 0
        if size < POOLED_BYTES_MIN:
            return np.empty(size, dtype=np.uint8)
        base = None
        with self._lock:
            best = None  # by index: arrays compare by value, not identity
            for index, array in enumerate(self._idle):
                if size <= array.size <= FIT_SHARE * size and (
                    best is None or array.size < self._idle[best].size
                ):
                    best = index
            if best is not None:
                base = self._idle.pop(best)
        fresh = base is None
        if base is None:
            base = np.empty(size, dtype=np.uint8)
        self.takes += 1
        self.fresh += fresh
        return base[:size]

    def give(self, array: np.ndarray) -> None:
        """Return ``array`` (from ``take``): nothing may refer to it any more."""
        base = array.base if array.base is not None else array
        assert isinstance(base, np.ndarray) and base.dtype == np.uint8
        if base.size >= POOLED_BYTES_MIN:
            self._keep(base)

    def _keep(self, base: np.ndarray) -> None:
        with self._lock:
            if any(array is base for array in self._idle):
                return
            self._idle.append(base)
            self._idle.sort(key=lambda array: array.size, reverse=True)
            while len(self._idle) > self._keep_arrays or (
                sum(array.size for array in self._idle) > self._keep_bytes
            ):
                self._idle.pop()  # the smallest: large polls are the ones to serve

    def forget(self) -> None:
        """Start empty with a new lock (a forked child: the lock may have been held by a
        thread of the parent that the child does not have)."""
        self._lock = threading.Lock()
        self._idle = []


# The process's pool, shared by every read.
BUFFERS = BufferPool()
os.register_at_fork(after_in_child=BUFFERS.forget)
