"""The attack of review R2-N1 (round 13): a client sends distinct wide statements so that
the caches kept by text or shape (parse trees, analyses, result schemas, kept rows) hold
far more than the texts. With every such cache a ``BoundedCache`` the process holds at
most ``limits.TEXT_CACHES_BYTES_MAX`` of their estimated costs; these tests shrink that
cap to 8 MiB and check with tracemalloc (Python's objects) and the process's resident
size after ``malloc_trim`` (Arrow's and DuckDB's too) that distinct wide texts leave no
more behind than the cap and a fixed slack. docs/memory_bounds.md has the figures."""

from __future__ import annotations

import ctypes
import gc
import os
import tracemalloc
from collections.abc import Callable, Iterator

import pytest

from engine.session import Session

CAP_BYTES = 8 * 1024 * 1024
# What a run of statements leaves behind besides the caches (DuckDB's and the allocator's
# own, and the test's): measured 4-10 MB here, against 100-500 MB without the bound.
SLACK_BYTES = 16 * 1024 * 1024
_LIBC = ctypes.CDLL("libc.so.6") if os.path.exists("/proc/self/statm") else None


def resident_bytes() -> int:
    """The process's resident size once freed memory went back to the system."""
    gc.collect()
    if _LIBC is not None:
        _LIBC.malloc_trim(0)
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.fixture
def small_cap(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The process-wide cap lowered to ``CAP_BYTES``, every cache emptied before and after."""
    from grammar import bounded_cache

    for cache in bounded_cache.BUDGET.caches():
        cache.clear()
    monkeypatch.setattr(bounded_cache.BUDGET, "bytes_max", CAP_BYTES)
    yield
    for cache in bounded_cache.BUDGET.caches():
        cache.clear()


def held_after(run: Callable[[int], None], count: int) -> tuple[int, int]:
    """(traced bytes, resident bytes) that ``run(0..count-1)`` left behind, after a first
    run warmed what is built once."""
    run(10_000)
    tracemalloc.start()
    gc.collect()
    traced, resident = tracemalloc.get_traced_memory()[0], resident_bytes()
    try:
        for number in range(count):
            run(number)
        gc.collect()
        return tracemalloc.get_traced_memory()[0] - traced, resident_bytes() - resident
    finally:
        tracemalloc.stop()


@pytest.mark.skipif(_LIBC is None, reason="needs Linux's /proc and glibc")
def test_distinct_wide_literal_selects_hold_no_more_than_the_cap(
    session: Session, small_cap: None
) -> None:
    """40 distinct 4 KB ``SELECT n,1,1,...`` texts (2,000 columns each), twice each: without
    the byte bounds they left ~50 MB of resident memory behind (1.2 MB a text)."""

    def run(number: int) -> None:
        text = (f"SELECT {number}," + ",".join(["1"] * 2040))[:4090]
        for _ in range(2):
            assert session.execute(text)[0].table.num_columns > 2000

    traced, resident = held_after(run, 40)
    print(f'held: traced {traced >> 20} MiB, resident {resident >> 20} MiB')
    assert traced <= CAP_BYTES + SLACK_BYTES, traced
    assert resident <= CAP_BYTES + SLACK_BYTES, resident


@pytest.mark.skipif(_LIBC is None, reason="needs Linux's /proc and glibc")
def test_distinct_wide_point_lookups_hold_no_more_than_the_cap(
    session: Session, small_cap: None
) -> None:
    """20 distinct point lookups of 1,000 aliased columns (~14 KB texts), twice each: on
    main their result schemas alone held ~3 MB each."""
    session.execute("CREATE TABLE kv (k BIGINT PRIMARY KEY, v VARCHAR)")
    session.execute("INSERT INTO kv SELECT i, 'v' || i FROM range(100) t(i)")

    def run(number: int) -> None:
        columns = ", ".join(f"v AS c{column}_{number}" for column in range(1000))
        text = f"SELECT {columns} FROM kv WHERE k = $1"
        for _ in range(2):
            assert session.execute(text, [3])[0].table.num_rows == 1

    traced, resident = held_after(run, 20)
    print(f'held: traced {traced >> 20} MiB, resident {resident >> 20} MiB')
    assert traced <= CAP_BYTES + SLACK_BYTES, traced
    assert resident <= CAP_BYTES + SLACK_BYTES, resident
