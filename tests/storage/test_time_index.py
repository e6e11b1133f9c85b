"""Tests of storage/time_index.py."""

from __future__ import annotations

import os
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from storage.fs import FileSystem
from storage.time_index import ENTRY, TimeIndex

BASE = 500


def _index(tmp_path: Any) -> TimeIndex:
    return TimeIndex(FileSystem(), os.path.join(str(tmp_path), "x.timeindex"), BASE)


def test_lookup_on_empty_index_returns_the_base_offset(tmp_path: Any) -> None:
    assert _index(tmp_path).lookup(123) == BASE


def test_lookup_returns_an_offset_written_before_the_time(tmp_path: Any) -> None:
    index = _index(tmp_path)
    index.add(1_000, BASE)
    index.add(2_000, BASE + 10)
    index.add(3_000, BASE + 20)
    assert index.lookup(500) == BASE, "nothing before: start at the base"
    assert index.lookup(1_000) == BASE, "an entry *at* the time may hide earlier messages"
    assert index.lookup(2_000) == BASE
    assert index.lookup(2_001) == BASE + 10
    assert index.lookup(10**9) == BASE + 20


def test_entries_load_back_and_a_torn_file_does_not(tmp_path: Any) -> None:
    index = _index(tmp_path)
    index.add(1_000, BASE)
    index.add(2_000, BASE + 4)
    index.close()
    assert os.path.getsize(index.path) == 2 * ENTRY.size
    again = _index(tmp_path)
    assert again.load() and again.entries() == [(1_000, 0), (2_000, 4)]
    with open(index.path, "ab") as file:
        file.write(b"\x00" * (ENTRY.size - 1))
    assert not _index(tmp_path).load()


def test_consistency_check(tmp_path: Any) -> None:
    index = _index(tmp_path)
    index.add(1_000, BASE)
    index.add(1_000, BASE + 3)  # equal times are allowed
    assert index.is_consistent(next_offset=BASE + 4)
    assert not index.is_consistent(next_offset=BASE + 3), "an offset at or past the end"
    index.add(1_500, BASE + 3)
    assert not index.is_consistent(next_offset=BASE + 10), "offsets must increase"


def test_consistency_check_catches_time_going_backwards(tmp_path: Any) -> None:
    index = _index(tmp_path)
    index.rewrite([(2_000, 0), (1_000, 5)])
    assert not index.is_consistent(next_offset=BASE + 10)


@settings(max_examples=40, deadline=None)
@given(
    steps=st.lists(st.tuples(st.integers(1, 1000), st.integers(1, 30)), min_size=1, max_size=30),
    probe=st.integers(0, 40_000),
)
def test_lookup_never_passes_the_first_message_at_or_after_the_time(
    tmp_path_factory: Any, steps: list[tuple[int, int]], probe: int
) -> None:
    index = _index(tmp_path_factory.mktemp("timeindex"))
    written_at, offset = 0, BASE
    entries = []
    for time_step, offset_step in steps:
        written_at += time_step
        entries.append((written_at, offset))
        index.add(written_at, offset)
        offset += offset_step
    result = index.lookup(probe)
    earlier = [o for t, o in entries if t < probe]
    assert result == (earlier[-1] if earlier else BASE)
    assert all(o >= result for t, o in entries if t >= probe)
