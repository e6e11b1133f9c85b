"""Tests of storage/offset_index.py (and the IndexFile mechanism under it)."""

from __future__ import annotations

import os
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from storage.fs import FileSystem
from storage.offset_index import ENTRY, OffsetIndex

BASE = 1000


def _index(tmp_path: Any, fs: FileSystem | None = None) -> OffsetIndex:
    return OffsetIndex(fs or FileSystem(), os.path.join(str(tmp_path), "x.index"), BASE)


def test_lookup_on_empty_index_returns_position_zero(tmp_path: Any) -> None:
    assert _index(tmp_path).lookup(BASE + 50) == 0


def test_lookup_returns_the_last_entry_at_or_before_the_offset(tmp_path: Any) -> None:
    index = _index(tmp_path)
    for offset, position in [(BASE, 0), (BASE + 10, 4096), (BASE + 25, 8200)]:
        index.add(offset, position)
    assert index.lookup(BASE) == 0
    assert index.lookup(BASE + 9) == 0
    assert index.lookup(BASE + 10) == 4096
    assert index.lookup(BASE + 24) == 4096
    assert index.lookup(BASE + 10_000) == 8200
    assert index.entries()[1] == (10, 4096), "entries hold offsets relative to the base"


def test_a_reader_between_an_entrys_two_appends_sees_no_entry_and_no_error(
    tmp_path: Any,
) -> None:
    """Readers do not take the writer's lock (a read of many partitions asks where a frame
    ends, round 38): an entry half appended, its value in and its key not yet (the order
    ``append`` uses) or the other way round, is not an entry yet for either lookup, and
    neither raises (a review found ``ceiling_value_of_key`` raising ``IndexError`` on a
    key seen before its value)."""
    index = _index(tmp_path)
    index.add(BASE, 0)
    index.add(BASE + 10, 4096)
    index._values.append(8200)  # the writer stopped between its two appends
    assert index.ceiling_value_of_key(11) is None
    assert index.lookup(BASE + 30) == 4096
    index._keys.append(25)
    assert index.ceiling_value_of_key(11) == 8200 and index.lookup(BASE + 30) == 8200
    other = _index(tmp_path / "other")
    other.add(BASE, 0)
    other._keys.append(10)  # a key before its value: ignored, no IndexError
    assert other.ceiling_value_of_key(5) is None
    assert other.lookup(BASE + 30) == 0


def test_flushed_entries_load_back(tmp_path: Any) -> None:
    index = _index(tmp_path)
    index.add(BASE, 0)
    index.add(BASE + 3, 4104)
    index.flush()
    assert os.path.getsize(index.path) == 2 * ENTRY.size
    index.close()
    again = _index(tmp_path)
    assert again.load()
    assert again.entries() == [(0, 0), (3, 4104)]
    assert again.lookup(BASE + 5) == 4104


def test_unflushed_entries_are_not_on_disk(tmp_path: Any) -> None:
    index = _index(tmp_path)
    index.add(BASE, 0)
    assert not os.path.exists(index.path)
    assert len(index) == 1


def test_missing_index_file_does_not_load(tmp_path: Any) -> None:
    assert not _index(tmp_path).load()


def test_torn_index_file_does_not_load(tmp_path: Any) -> None:
    index = _index(tmp_path)
    index.add(BASE, 0)
    index.add(BASE + 1, 4096)
    index.close()
    with open(index.path, "ab") as file:
        file.write(b"\x01\x02\x03")  # a torn third entry
    again = _index(tmp_path)
    assert not again.load()
    assert len(again) == 0


def test_consistency_check_catches_bad_entries(tmp_path: Any) -> None:
    index = _index(tmp_path)
    index.add(BASE, 0)
    index.add(BASE + 5, 4096)
    assert index.is_consistent(log_bytes=5000)
    assert not index.is_consistent(log_bytes=4096), "a position at or past the log end"
    index.add(BASE + 6, 4096)
    assert not index.is_consistent(log_bytes=10_000), "positions must increase"


def test_consistency_check_catches_repeated_offsets(tmp_path: Any) -> None:
    index = _index(tmp_path)
    index.add(BASE, 0)
    index.add(BASE, 4096)
    assert not index.is_consistent(log_bytes=10_000)


def test_rewrite_replaces_every_entry(tmp_path: Any) -> None:
    index = _index(tmp_path)
    index.add(BASE, 0)
    index.add(BASE + 9, 9000)
    index.flush()
    index.rewrite([(0, 0), (4, 4096)])
    assert index.entries() == [(0, 0), (4, 4096)]
    again = _index(tmp_path)
    assert again.load() and again.entries() == [(0, 0), (4, 4096)]
    assert not os.path.exists(index.path + ".tmp")


def test_append_after_rewrite_extends_the_file(tmp_path: Any) -> None:
    index = _index(tmp_path)
    index.rewrite([(0, 0)])
    index.add(BASE + 7, 5000)
    index.close()
    again = _index(tmp_path)
    assert again.load() and again.entries() == [(0, 0), (7, 5000)]


@settings(max_examples=40, deadline=None)
@given(
    steps=st.lists(st.tuples(st.integers(1, 50), st.integers(8, 9000)), min_size=1, max_size=40),
    probes=st.lists(st.integers(0, 3000), max_size=20),
)
def test_lookup_matches_a_linear_search_and_survives_reload(
    tmp_path_factory: Any, steps: list[tuple[int, int]], probes: list[int]
) -> None:
    directory = tmp_path_factory.mktemp("index")
    index = _index(directory)
    offset, position = BASE, 0
    entries = []
    for offset_step, position_step in steps:
        entries.append((offset, position))
        index.add(offset, position)
        offset += offset_step
        position += position_step
    index.close()
    loaded = _index(directory)
    assert loaded.load()
    assert loaded.is_consistent(position)
    for probe in probes:
        target = BASE + probe
        expected = [p for o, p in entries if o <= target]
        assert loaded.lookup(target) == (expected[-1] if expected else 0)
