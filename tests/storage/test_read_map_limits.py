"""Limits of reads through maps and ``pread`` (R1's review of the read maps).

What must hold: a segment file shorter than its published size (cut by something
outside the server) makes a ``pread`` scan fail with ``CorruptSegmentError``, never
read the same bytes for ever; the active segment is mapped through the writer's
descriptor (a tail read needs no new descriptor, so it works with none left), and a
map whose ``open`` fails reads with ``pread`` instead of failing; a map refused at
the bound on live maps is tried again once there is room, and cached maps of idle
sealed segments are released, least recently used first, when the bound is near
(batches read through them keep their bytes).
"""

from __future__ import annotations

import gc
import os
import resource
from typing import Any

import pytest

from storage import file_map, limits
from storage.errors import CorruptSegmentError, StorageIOError
from storage.fs import FileSystem

KIB = 1024


def _data(batches: list[Any]) -> list[bytes]:
    return [value for b in batches for value in b.column("data").to_pylist()]


def _fill(partition: Any, batch: Any, frames: int, per_frame: int = 100) -> None:
    for _ in range(frames):
        partition.append(batch(per_frame, first=partition.end_offset, size_bytes=KIB))


def test_a_segment_file_shorter_than_published_fails_its_pread_scan(
    open_partition: Any, batch: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(file_map, "ENABLED", False)  # every read preads
    partition = open_partition(segment_bytes=1 << 20)
    _fill(partition, batch, 30)
    segment = partition.segments[0]
    os.truncate(segment.log_path, 4096)  # cut by something outside the server
    preads = 0
    original = FileSystem.pread

    def counted(self: FileSystem, fd: int, size: int, position: int) -> Any:
        nonlocal preads
        preads += 1
        assert preads < 100, "the scan reads the same short bytes again and again"
        return original(self, fd, size, position)

    monkeypatch.setattr(FileSystem, "pread", counted)
    for max_messages in (1000, 3000):  # a window in the file's cut, one past its end
        with pytest.raises(CorruptSegmentError, match="shorter than its published size") as e:
            partition.read(0, max_messages=max_messages)
        assert e.value.path == segment.log_path


def _hold_every_descriptor() -> list[int]:
    """Open ``/dev/null`` until the process has no descriptor left (EMFILE); the caller
    lowers the soft limit first, so that this takes a few hundred."""
    held: list[int] = []
    while True:
        try:
            held.append(os.open("/dev/null", os.O_RDONLY))
        except OSError:
            return held


def test_a_tail_read_of_the_active_segment_needs_no_new_descriptor(
    open_partition: Any, batch: Any
) -> None:
    partition = open_partition()
    _fill(partition, batch, 3)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, 512), hard))
    held = _hold_every_descriptor()
    try:
        result = partition.read(0, max_messages=1000)  # mapped through the writer's descriptor
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert result.message_count == 300
    assert partition.segments[-1]._map is not None


def test_a_map_whose_open_fails_reads_with_pread_instead(
    open_partition: Any, batch: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    partition = open_partition(segment_bytes=64 * KIB)
    _fill(partition, batch, 80)
    assert len(partition.segments) > 2
    expected = _data(partition.read(0, max_messages=200).batches)
    for segment in partition.segments:
        segment.close()  # no writer's descriptor (sealed), no cached map
    failed: list[str] = []
    original = FileSystem.open_read

    def once(self: FileSystem, path: str) -> int:
        if not failed:
            failed.append(path)
            raise StorageIOError(f"could not open {path}: Too many open files (EMFILE)")
        return original(self, path)

    monkeypatch.setattr(FileSystem, "open_read", once)
    assert _data(partition.read(0, max_messages=200).batches) == expected
    assert failed == [partition.segments[0].log_path]
    assert partition.segments[0]._map is None  # this read preaded; the next one maps
    assert partition.segments[0]._map_refused is None
    assert _data(partition.read(0, max_messages=200).batches) == expected
    assert partition.segments[0]._map is not None


def test_a_map_refused_at_the_bound_is_made_once_there_is_room(
    open_partition: Any, batch: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    partition = open_partition()
    _fill(partition, batch, 3)
    gc.collect()
    monkeypatch.setattr(limits, "READ_MAPS_MAX", file_map.live_maps())  # the bound reached now
    assert partition.read(0, max_messages=1000).message_count == 300  # with pread
    assert partition.segments[-1]._map_refused is not None
    assert partition.segments[-1]._map is None
    monkeypatch.setattr(limits, "READ_MAPS_MAX", file_map.live_maps() + 1)  # room again
    assert partition.read(0, max_messages=1000).message_count == 300
    assert partition.segments[-1]._map is not None


def _scan_mapped(segment: Any) -> list[bool]:
    """Scan the whole segment asking for its map: whether each frame came through one."""
    frames = segment.scan(segment.base_offset, segment.size_bytes, 64 * KIB, mapped=True)
    return [frame.mapped for frame in frames]


def test_a_map_refused_is_made_once_a_map_was_freed(
    open_partition: Any, batch: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    partition = open_partition(segment_bytes=64 * KIB)
    _fill(partition, batch, 80)
    sealed, last = partition.segments[0], partition.segments[-1]
    kept = list(sealed.scan(0, sealed.size_bytes, 64 * KIB, mapped=True))  # its map lives
    assert [frame.mapped for frame in kept] == [True]
    gc.collect()
    monkeypatch.setattr(limits, "READ_MAPS_MAX", file_map.live_maps())  # the bound reached now
    assert _scan_mapped(last) == [False]
    assert last._map_refused is not None
    assert _scan_mapped(last) == [False]  # nothing freed: still no room
    del kept  # sealed's map freed (its cached reference was released): room for one
    gc.collect()
    assert _scan_mapped(last) == [True]
    assert last._map is not None


def test_idle_sealed_segments_release_their_maps_least_recently_read_first(
    open_partition: Any, batch: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    partition = open_partition(segment_bytes=64 * KIB)
    _fill(partition, batch, 300)
    segments = partition.segments
    assert len(segments) > 20
    gc.collect()
    # Room for 16 maps: a catch-up over every segment must keep mapping.
    monkeypatch.setattr(limits, "READ_MAPS_MAX", file_map.live_maps() + 16)
    expected = _data(partition.read(0, max_messages=100).batches)
    held = partition.read(0, max_messages=100).batches  # keeps the first segment's map
    first = segments[0]
    hot = segments[1]
    preads = 0
    original = FileSystem.pread

    def counted(self: FileSystem, fd: int, size: int, position: int) -> Any:
        nonlocal preads
        preads += 1
        return original(self, fd, size, position)

    monkeypatch.setattr(FileSystem, "pread", counted)
    for segment in segments:
        partition.read(hot.base_offset, max_messages=1)  # one segment read all along
        result = partition.read(segment.base_offset, max_messages=1)
        assert result.message_count == 1
        assert segment._map is not None, f"segment {segment.base_offset} read with pread"
    assert preads == 0
    assert hot._map is not None
    assert first._map is None  # released, least recently read
    assert file_map.live_maps() <= limits.READ_MAPS_MAX
    assert _data(held) == expected  # a batch read through a released map keeps its bytes
