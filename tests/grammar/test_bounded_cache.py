"""``BoundedCache``: least recently used first, bounded in entries and in bytes, one
process-wide cap over all caches, exact byte counts under concurrent use."""

from __future__ import annotations

import gc
import threading

import pytest

from grammar import bounded_cache
from grammar.bounded_cache import ENTRY_BYTES, BoundedCache


@pytest.fixture
def budget(monkeypatch: pytest.MonkeyPatch) -> bounded_cache._Budget:
    """A fresh process-wide budget of 10 kB for the caches made in the test."""
    fresh = bounded_cache._Budget(10_000)
    monkeypatch.setattr(bounded_cache, "BUDGET", fresh)
    return fresh


def test_the_least_recently_used_entries_go_first_past_the_byte_bound(budget) -> None:
    cache = BoundedCache("t", entries_max=100, bytes_max=3 * (1000 + ENTRY_BYTES))
    for key in "abc":
        cache.put(key, key.upper(), 1000)
    assert cache.get("a") == "A"  # a is now the most recently used
    cache.put("d", "D", 1000)
    assert "b" not in cache and [k in cache for k in "acd"] == [True] * 3
    assert cache.nbytes == 3 * (1000 + ENTRY_BYTES) == budget.nbytes


def test_the_entry_bound_holds_too_and_a_value_may_be_none(budget) -> None:
    cache = BoundedCache("t", entries_max=2, bytes_max=5000)
    for key in "abc":
        cache.put(key, None, 1)
    assert len(cache) == 2 and "a" not in cache
    missing = object()
    assert cache.get("b", missing) is None and cache.get("a", missing) is missing


def test_an_entry_costing_more_than_the_whole_cache_is_not_kept(budget) -> None:
    cache = BoundedCache("t", entries_max=10, bytes_max=2000)
    cache.put("small", 1, 100)
    cache.put("huge", 2, 5000)
    assert "huge" not in cache and "small" in cache
    assert budget.nbytes == cache.nbytes == 100 + ENTRY_BYTES


def test_the_process_wide_cap_shrinks_the_largest_cache(budget) -> None:
    big = BoundedCache("big", entries_max=100, bytes_max=9000)
    small = BoundedCache("small", entries_max=100, bytes_max=9000)
    for number in range(7):
        big.put(number, number, 1000 - ENTRY_BYTES)  # 1000 bytes each
    small.put("x", 1, 1000 - ENTRY_BYTES)
    small.put("y", 1, 3000 - ENTRY_BYTES)  # 11,000 in all: over the 10,000 cap
    assert budget.nbytes <= budget.bytes_max
    assert budget.nbytes == big.nbytes + small.nbytes
    assert len(small) == 2 and len(big) == 6 and 0 not in big  # big's oldest went


def test_a_collected_cache_leaves_the_total(budget) -> None:
    cache = BoundedCache("session", entries_max=10, bytes_max=5000)
    cache.put("a", 1, 1000)
    assert budget.nbytes == 1000 + ENTRY_BYTES
    del cache
    gc.collect()
    other = BoundedCache("other", entries_max=10, bytes_max=5000)
    other.put("b", 1, 0)
    assert budget.nbytes == ENTRY_BYTES


def test_the_counts_stay_exact_under_threads(budget) -> None:
    caches = [BoundedCache(f"c{n}", entries_max=50, bytes_max=4000) for n in range(3)]

    def work(seed: int) -> None:
        for step in range(3000):
            cache = caches[(seed + step) % 3]
            key = (seed * 7 + step) % 120
            if cache.get(key) is None:
                cache.put(key, step, (step % 5) * 60)
            if step % 997 == 0:
                cache.clear()

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for cache in caches:
        assert cache.nbytes == sum(cost for _, cost in cache._entries.values())
        assert cache.nbytes <= cache.bytes_max and len(cache) <= cache.entries_max
    assert budget.nbytes == sum(cache.nbytes for cache in caches) <= budget.bytes_max
