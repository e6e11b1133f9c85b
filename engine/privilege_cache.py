"""A per-database cache of owners and grants, so a checked statement costs no DuckDB query.

Each DuckDB round trip costs about half a millisecond here, as much as a small query
itself; an ordinary user's statements would pay it per relation. The cache holds what
``engine.privileges`` read (owner, kind, privileges granted to a user or PUBLIC; a view's
query) keyed by object and user.

Correctness rests on three rules:
- A transaction that writes owners or grants (GRANT, REVOKE, CREATE/DROP/ALTER of a table
  or view) registers itself first (``note_write``); while any such transaction is open,
  nobody uses the cache (its own uncommitted rows must be seen by it alone, and nobody
  may cache what is about to change). When it ends (commit or rollback; noticed by the
  next lookup) the generation moves on and everything cached is dropped.
- Topic DDL commits at once in the catalog; its change counter is part of the generation.
- A value read under one generation is never stored under another, and a session in an
  explicit transaction fills the cache only if the generation has not moved since its
  BEGIN (``generation_now``, taken before DuckDB's snapshot): then no change of owners or
  grants committed after its snapshot, which therefore shows the latest ones. (A topic
  workload runs inside BEGIN … COMMIT; without this every such transaction would read
  owners and grants from DuckDB again.)

Thread-safe: one lock per database guards the cache.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

ENTRIES_MAX = 10_000  # then everything is dropped: a bound, not an LRU


@dataclass
class _Cache:
    lock: threading.Lock = field(default_factory=threading.Lock)
    generation: int = 0
    # (session, its transaction) of open transactions that wrote owners or grants
    writers: list[tuple[weakref.ref[Any], Any]] = field(default_factory=list)
    values: dict[tuple[Any, ...], Any] = field(default_factory=dict)

    def sweep(self) -> None:
        """Forget writers whose transaction ended; then what was cached is stale."""
        if not self.writers:
            return
        alive = [(ref, txn) for ref, txn in self.writers
                 if (session := ref()) is not None and session.transaction is txn]  # fmt: skip
        if len(alive) != len(self.writers):
            # The generation moves before the list shrinks: ``stamp`` reads the list
            # without the lock, and one that sees it emptied must see the new generation
            # too (else a memo kept under the old one would match after the change).
            self.generation += 1
            self.values.clear()
            self.writers = alive


_caches: weakref.WeakKeyDictionary[Any, _Cache] = weakref.WeakKeyDictionary()
_caches_lock = threading.Lock()


# The database last asked for and its cache: a process serves one database, and a
# ``WeakKeyDictionary`` look-up makes a weak reference and runs Python code every time.
_last: tuple[weakref.ref[Any], _Cache] | None = None


def _cache_of(database: Any) -> _Cache:
    global _last
    last = _last
    if last is not None and last[0]() is database:
        return last[1]
    with _caches_lock:
        cache = _caches.get(database)
        if cache is None:
            cache = _caches[database] = _Cache()
        _last = (weakref.ref(database), cache)
        return cache


def note_write(session: Any) -> None:
    """``session``'s transaction is about to write owners or grants."""
    cache = _cache_of(session.database)
    with cache.lock:
        cache.sweep()
        if not any(ref() is session and txn is session.transaction for ref, txn in cache.writers):
            cache.writers.append((weakref.ref(session), session.transaction))
        cache.generation += 1
        cache.values.clear()


def generation_now(database: Any) -> int:
    """The current generation, for a transaction about to begin."""
    cache = _cache_of(database)
    with cache.lock:
        cache.sweep()
        return cache.generation


def stamp(session: Any) -> tuple[int, int] | None:
    """What every value ``cached`` may give stands on: (the generation, the catalog's
    count of topics created and dropped), or None while a transaction that writes owners
    or grants is open (then nothing is cached, nor may a decision made of them be kept:
    ``privileges.check_plan``'s memo). Taken before the values are read, a stamp that is
    still the current one later says that no change of owners, grants, relations'
    existence (their DDL registers as a writer) or topics began since."""
    database = session.database
    cache = _cache_of(database)
    topics_changed = database.catalog.changes
    if not cache.writers:
        # No writer registered (read before the generation: ``note_write`` appends its
        # writer first, and a writer that ended stays listed until a sweep under the
        # lock): the generation as it stands, without the lock.
        return cache.generation, topics_changed
    with cache.lock:
        cache.sweep()
        if cache.writers:
            return None
        return cache.generation, topics_changed


def cached(session: Any, key: tuple[Any, ...], read: Callable[[], Any]) -> Any:
    """``read()``'s value for ``key``, from the cache when the rules above allow."""
    cache = _cache_of(session.database)
    topics_changed = session.database.catalog.changes
    with cache.lock:
        cache.sweep()
        usable = not cache.writers
        generation = cache.generation
        full_key = (topics_changed, *key)
        if usable and full_key in cache.values:
            return cache.values[full_key]
    value = read()
    transaction = session.transaction
    stale_snapshot = (
        transaction is not None
        and transaction.explicit
        and transaction.privilege_generation != generation
    )
    if not usable or stale_snapshot:
        return value
    with cache.lock:
        if cache.generation == generation and not cache.writers:
            if len(cache.values) >= ENTRIES_MAX:
                cache.values.clear()
            cache.values[full_key] = value
    return value
