"""``BoundedCache``: a least-recently-used cache bounded in entries and in bytes, with one
process-wide byte cap over all of them.

Topicbase keeps what it derives from a client's statements (parse trees, analyses, result
schemas, kept rows) keyed by the statement's text or shape, because clients repeat
statements. Bounding such a cache by its number of entries alone lets a client choose how
much each entry holds: 250 distinct 4 KB ``SELECT 1,1,...`` texts held ~300 MB (review
R2-N1 of round 13, docs/memory_bounds.md). So every entry here is kept with its *cost*,
an estimate in bytes of what it holds (the caller's: a text's length times a factor
measured for what is derived from it, or a count of columns times a measured size of
one), and

- a cache holds at most ``entries_max`` entries of at most ``bytes_max`` bytes together:
  past either, its least recently used entries go first; an entry costing more than
  ``bytes_max`` alone is not kept at all (computed again each time);
- all caches together hold at most ``limits.TEXT_CACHES_BYTES_MAX``: past it, the cache
  holding the most bytes gives up its least recently used entries until the total is
  back under the cap (``_Budget``).

The cost is an estimate, not a measurement: tests/grammar/test_bounded_cache.py and the
attack tests (tests/engine/test_cache_memory_bounds.py) check with tracemalloc that what a
cache holds stays within its budget for the widest shapes a text can have.

Thread-safety: a hit (``get``) takes no lock: ``OrderedDict.get`` and ``move_to_end`` are
single C calls, atomic under the GIL, and a hit changes no cost (a ``move_to_end`` that
finds the entry evicted meanwhile is a hit all the same). ``put``, ``shrink`` and
``clear`` change entries and byte counts under the cache's lock, then the process-wide
total under the budget's lock, never both at once (no lock order to get wrong). The
counts are exact at rest: ``nbytes`` is the sum of the kept entries' costs, and the
budget's total the sum of the caches' ``nbytes``.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Hashable
from typing import Any

from storage import limits

# What an entry costs besides its value: the OrderedDict's slot and link, the (value, cost)
# tuple and a key's own object (a text's characters are counted by the caller's estimate).
ENTRY_BYTES = 256
# What is derived from a statement's text and kept by it, per character of the text, at
# most: the text itself (a key: 1-4 bytes a character) and Topicbase's parse or analysis of
# it (measured with a deep size of the kept values: 2-14 bytes a character for the widest
# shapes, 24 for an INSERT INTO TOPIC skeleton; tests/grammar/test_bounded_cache.py).
TEXT_COST_PER_CHAR = 32
# A kept Arrow schema (or the description of a result) a column, with its name and DuckDB
# type name in the key: a bare pyarrow schema takes ~220 bytes a field and a key ~140, but
# the process's RSS grew by ~700 bytes a column per kept schema of a 2,000-column result
# (allocator overhead beside the fields), so 2 KiB.
SCHEMA_COLUMN_BYTES = 2048


class BoundedCache:
    """A least-recently-used map of at most ``entries_max`` entries and ``bytes_max``
    bytes of estimated cost, part of the process-wide budget. A value may be None (``get``
    with a ``default`` of its own tells it from a miss)."""

    __slots__ = ("__weakref__", "_budget", "_entries", "_lock", "bytes_max", "entries_max",
                 "name", "nbytes")  # fmt: skip

    def __init__(self, name: str, entries_max: int, bytes_max: int | None = None) -> None:
        assert entries_max > 0
        self.name = name
        self.entries_max = entries_max
        self.bytes_max = limits.TEXT_CACHE_BYTES_MAX if bytes_max is None else bytes_max
        assert 0 < self.bytes_max <= limits.TEXT_CACHES_BYTES_MAX
        self._entries: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()
        self._lock = threading.Lock()
        self.nbytes = 0
        # The budget it counts towards, for all its life (``__del__`` included): a test's
        # fresh budget never receives the bytes of caches made before it.
        self._budget = BUDGET
        self._budget.register(self)

    def get(self, key: Hashable, default: Any = None) -> Any:
        """The value kept for ``key`` (now the most recently used), or ``default``."""
        entries = self._entries
        entry = entries.get(key)
        if entry is None:
            return default
        try:  # noqa: SIM105 - contextlib.suppress costs more on the hit path
            entries.move_to_end(key)
        except KeyError:  # evicted by another thread since: still a hit
            pass
        return entry[0]

    def put(self, key: Hashable, value: Any, cost: int) -> None:
        """Keep ``value`` for ``key`` at ``cost`` bytes (plus ``ENTRY_BYTES``), evicting
        the least recently used past the bounds; a value costing more than the whole
        cache is not kept."""
        cost += ENTRY_BYTES
        if cost > self.bytes_max:
            return
        with self._lock:
            old = self._entries.pop(key, None)
            delta = cost - (0 if old is None else old[1])
            self._entries[key] = (value, cost)
            self.nbytes += cost
            if old is not None:
                self.nbytes -= old[1]
            delta -= self._evict_locked(self.bytes_max, self.entries_max)
            assert 0 <= self.nbytes <= self.bytes_max, (self.name, self.nbytes)
        self._budget.add(delta)

    def shrink(self, nbytes: int) -> int:
        """Evict least recently used entries until ``nbytes`` are freed or none is left;
        the bytes freed (the budget's total is the caller's to lower)."""
        with self._lock:
            return self._evict_locked(max(0, self.nbytes - nbytes), self.entries_max)

    def _evict_locked(self, bytes_max: int, entries_max: int) -> int:
        freed = 0
        entries = self._entries
        while entries and (self.nbytes > bytes_max or len(entries) > entries_max):
            _, (_, cost) = entries.popitem(last=False)
            self.nbytes -= cost
            freed += cost
        return freed

    def clear(self) -> None:
        with self._lock:
            freed = self.nbytes
            self._entries.clear()
            self.nbytes = 0
        self._budget.add(-freed)

    def pop(self, key: Hashable) -> Any:
        """Forget ``key``; its value or None."""
        with self._lock:
            entry = self._entries.pop(key, None)
            if entry is None:
                return None
            self.nbytes -= entry[1]
        self._budget.add(-entry[1])
        return entry[0]

    def values(self) -> list[Any]:
        """The kept values, least recently used first (a copy)."""
        with self._lock:
            return [value for value, _ in self._entries.values()]

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._entries

    def __del__(self) -> None:
        # A per-session cache gone with its session leaves the budget's total. Collection
        # may run this while this thread holds a lock of the budget or of a cache, so it
        # takes none: the budget counts what it finds here at its next ``add``.
        if self.nbytes:
            self._budget.released.append(self.nbytes)


class _Budget:
    """The process-wide total of every ``BoundedCache``'s ``nbytes``, held under
    ``bytes_max`` (``limits.TEXT_CACHES_BYTES_MAX``) by shrinking the largest caches."""

    def __init__(self, bytes_max: int) -> None:
        self.bytes_max = bytes_max
        self.nbytes = 0
        self._lock = threading.Lock()
        self._caches: weakref.WeakSet[BoundedCache] = weakref.WeakSet()
        # The bytes of caches collected since (``BoundedCache.__del__``): appended without
        # a lock (a list's append and pop are atomic), taken off the total under it.
        self.released: list[int] = []

    def register(self, cache: BoundedCache) -> None:
        with self._lock:
            self._caches.add(cache)

    def add(self, delta: int) -> None:
        """Count ``delta`` bytes kept (or freed, negative); past the cap, the caches
        holding the most give up their least recently used entries."""
        with self._lock:
            while self.released:
                self.nbytes -= self.released.pop()
            self.nbytes += delta
            excess = self.nbytes - self.bytes_max
        while excess > 0:
            with self._lock:
                largest = max(self._caches, key=lambda cache: cache.nbytes, default=None)
            if largest is None or largest.nbytes == 0:
                return
            freed = largest.shrink(excess)
            with self._lock:
                self.nbytes -= freed
                excess = self.nbytes - self.bytes_max

    def caches(self) -> list[BoundedCache]:
        with self._lock:
            return list(self._caches)


BUDGET = _Budget(limits.TEXT_CACHES_BYTES_MAX)
