"""Large read buffers kept for the next read instead of returned to the system (issue 14).

A read allocates large byte arrays: a consumer poll over 1000 partitions reads ~24 MB
of frames into one array (``storage.bulk_scan``); a poll over 10 partitions reads 2 MB
windows whose frames it decodes in place (``LogSegment.scan``). A fresh array of that
size is mapped anew by the allocator (glibc maps one at or above its dynamic threshold,
Arrow's mimalloc returns freed memory after 10 ms), so each read faulted its pages in
again: 1,000-4,000 faults a poll, up to a third of its CPU, and the count moved with
whatever else the process had freed. The pool keeps idle arrays, already faulted in,
for the next read.

``take(size)`` gives an array of exactly ``size`` bytes (a view of a pooled one when one
is large enough, and not much larger); ``give`` returns it once nothing refers to it
(the scan buffer, after a decode that copied what it keeps). ``take(size, lease=True)``
is for memory handed on (a scan window that frame bodies, cached frames and zero-copy
batches refer to): the array returns by itself once the view given out is gone.

What a result keeps (the ``data`` column of a poll over small frames) is a plain numpy
array, not pooled: its free keeps glibc's thresholds where the rows a client makes of a
result find their pages still mapped (pooling it too made every poll fault ~3,700 pages
for those rows).

Bounded: at most ``KEEP_ARRAYS`` idle arrays and ``KEEP_BYTES`` idle bytes (the
smallest dropped first); arrays under ``POOLED_BYTES_MIN`` are not pooled (small reads
keep their ``pread``). Thread-safe.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections import deque

import numpy as np

POOLED_BYTES_MIN = 1024 * 1024
KEEP_ARRAYS = 32
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
        # Leased arrays whose views are gone, appended by their finalizers without the
        # lock (a finalizer may run in a garbage collection inside a locked section) and
        # taken into ``_idle`` by the next call.
        self._returned: deque[np.ndarray] = deque()
        self.takes = self.leases = self.fresh = 0  # counts, for tests and profiles

    @property
    def idle_bytes(self) -> int:
        with self._lock:
            self._collect_returned()
            return sum(array.size for array in self._idle)

    def take(self, size: int, *, lease: bool = False) -> np.ndarray:
        """A uint8 array of ``size`` bytes, contents undefined. ``lease``: for memory
        handed on (a read window that frame bodies and zero-copy batches refer to): the
        array returns to the pool by itself once the view returned is gone; whoever
        holds the view must not make a numpy slice of it (a slice refers to the pooled
        array, not to the view: Arrow buffers and memoryviews of the view hold it)."""
        assert size >= 0
        if size < POOLED_BYTES_MIN:
            return np.empty(size, dtype=np.uint8)
        base = None
        with self._lock:
            self._collect_returned()
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
        view = base[:size]
        if lease:
            self.leases += 1
            weakref.finalize(view, self._returned.append, base)  # back once it is gone
        else:
            self.takes += 1
        if fresh:
            self.fresh += 1
        return view

    def give(self, array: np.ndarray) -> None:
        """Return ``array`` (from ``take``): nothing may refer to it any more."""
        base = array.base if array.base is not None else array
        assert isinstance(base, np.ndarray) and base.dtype == np.uint8
        if base.size >= POOLED_BYTES_MIN:
            self._keep(base)

    def _keep(self, base: np.ndarray) -> None:
        with self._lock:
            self._add(base)
            self._collect_returned()

    def _collect_returned(self) -> None:
        """Under the lock: the returned arrays into ``_idle``."""
        while self._returned:
            self._add(self._returned.popleft())

    def _add(self, base: np.ndarray) -> None:
        """Under the lock: ``base`` idle, within the bounds."""
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
        self._returned = deque()


# The process's pool, shared by every read.
BUFFERS = BufferPool()
os.register_at_fork(after_in_child=BUFFERS.forget)
