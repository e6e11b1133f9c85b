"""Reads of published bytes through a read-only map of the segment (``storage.file_map``,
``LogSegment.scan(mapped=True)``): no ``pread`` copy, the batches views of the map.

What must hold: every segment is read through its map, the active one too (its map
reaching past the end of the file covers what is appended later; a segment grown past
its map is mapped again); a batch the caller holds keeps its bytes (the map lives as
long as any view of it) across later reads, appends, a fence cutting the active
segment, retention deleting the segment and the partition closing, also with readers
racing the writer; a frame damaged on disk, even after the map was made, is still
refused with its file and position, and a frame running past the mapped limit too; a
file system that models reads itself, the bound on live maps and maps turned off send
reads back to ``pread`` with the same results.
"""

from __future__ import annotations

import gc
import os
import threading
from typing import Any

import pytest

from storage import file_map, limits, verified_frames
from storage.config import FsyncPolicy
from storage.errors import CorruptSegmentError, StorageIOError
from storage.fs import FileSystem
from storage.segment import LogSegment

KIB = 1024


def _count_preads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    positions: list[int] = []
    original = FileSystem.pread

    def counted(self: FileSystem, fd: int, size: int, position: int) -> Any:
        positions.append(position)
        return original(self, fd, size, position)

    monkeypatch.setattr(FileSystem, "pread", counted)
    return positions


def _fill(partition: Any, batch: Any, frames: int, per_frame: int = 100) -> None:
    for _ in range(frames):
        partition.append(batch(per_frame, first=partition.end_offset, size_bytes=KIB))


def _flip(path: str, position: int) -> None:
    """Damage one byte in place (the map is shared: it sees the change)."""
    fd = os.open(path, os.O_RDWR)
    try:
        value = os.pread(fd, 1, position)[0]
        os.pwrite(fd, bytes([value ^ 0x5A]), position)
    finally:
        os.close(fd)


def _live() -> int:
    """Live maps once garbage (earlier tests' batches in cycles) is collected."""
    gc.collect()
    return file_map.live_maps()


def _data(batches: list[Any]) -> list[bytes]:
    return [value for b in batches for value in b.column("data").to_pylist()]


def test_every_segment_is_read_through_its_map_without_pread(
    open_partition: Any, batch: Any, read_all: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    partition = open_partition(segment_bytes=256 * KIB)
    _fill(partition, batch, frames=12)  # ~100 KiB a frame (large: zero-copy): 4 segments
    assert len(partition.segments) >= 3
    preads = _count_preads(monkeypatch)
    live = _live()
    rows = read_all(partition)
    assert [row["offset"] for row in rows] == list(range(partition.end_offset))
    assert [row["data"][:4] for row in rows[:2]] == [b"m0..", b"m1.."]
    assert file_map.live_maps() == live + len(partition.segments)  # one map each
    assert preads == []
    assert partition.read(0).message_count == 1000 and preads == []


def test_the_active_segment_map_covers_what_is_appended_after_it_was_made(
    open_partition: Any, batch: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    partition = open_partition(segment_bytes=4 * 1024 * KIB)
    _fill(partition, batch, frames=2)
    preads = _count_preads(monkeypatch)
    live = _live()
    held = partition.read(0, max_messages=100).batches
    assert file_map.live_maps() == live + 1
    _fill(partition, batch, frames=3)  # past the end of the file when it was mapped
    result = partition.read(100, max_messages=400)
    assert [row["offset"] for b in result.batches for row in b.to_pylist()] == list(range(100, 500))
    assert _data(result.batches)[-1] == b"m499".ljust(KIB, b".")
    assert file_map.live_maps() == live + 1 and preads == []  # the same map, no pread
    assert _data(held) == [f"m{i}".encode().ljust(KIB, b".") for i in range(100)]


def test_a_segment_grown_past_its_map_is_mapped_again_and_old_batches_keep_theirs(
    open_partition: Any, batch: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    partition = open_partition(segment_bytes=64 * KIB)  # frames of ~100 KiB: one a segment
    _fill(partition, batch, frames=1)
    partition.append(batch(20, first=100, size_bytes=KIB))  # rolls: a new segment
    preads = _count_preads(monkeypatch)
    live = _live()
    held = partition.read(100, max_messages=20).batches  # its map: 64 KiB, past the file
    first_map = partition.segments[-1]._map
    assert first_map is not None and first_map[0].size == 64 * KIB
    partition.append(batch(100, first=120, size_bytes=KIB))  # grows it past that map
    again = partition.read(120).batches
    assert _data(again) == [f"m{i}".encode().ljust(KIB, b".") for i in range(120, 220)]
    assert partition.segments[-1]._map[0].size >= 128 * KIB and preads == []
    assert _data(held) == [f"m{i}".encode().ljust(KIB, b".") for i in range(100, 120)]
    assert file_map.live_maps() == live + 2  # the old map lives while views of it do
    del first_map, held
    assert _live() == live + 1


def test_a_fence_cutting_the_active_segment_leaves_its_map_and_held_batches_whole(
    open_partition: Any, batch: Any, monkeypatch: pytest.MonkeyPatch, failing_sync: Any
) -> None:
    failing = failing_sync
    partition = open_partition(file_system=failing, fsync_policy=FsyncPolicy.ALWAYS)
    _fill(partition, batch, frames=2)
    preads = _count_preads(monkeypatch)
    held = partition.read(0).batches
    failing.fail = True
    with pytest.raises(StorageIOError):
        partition.append(batch(100, first=200, size_bytes=KIB))
    # The unsynced frame was cut from the file; the published ones stay readable.
    assert os.path.getsize(partition.segments[-1].log_path) == partition.size_bytes
    expected = [f"m{i}".encode().ljust(KIB, b".") for i in range(200)]
    assert _data(held) == expected
    assert _data(partition.read(0).batches) == expected and preads == []


def test_a_held_batch_keeps_its_bytes_across_later_reads_retention_and_close(
    open_partition: Any, batch: Any
) -> None:
    partition = open_partition(segment_bytes=256 * KIB)
    _fill(partition, batch, frames=12)
    live = _live()
    first = partition.segments[0]
    held = partition.read(0, max_messages=first.next_offset).batches
    expected = [f"m{i}".encode().ljust(KIB, b".") for i in range(first.next_offset)]
    assert _data(held) == expected
    assert file_map.live_maps() == live + 1  # the batches are views of the map
    for offset in range(0, partition.end_offset, 7):  # later reads, other frames
        partition.read(offset, max_messages=30)
    assert partition.delete_segments_before(first.next_offset) == 1
    assert not os.path.exists(first.log_path)
    partition.close()
    gc.collect()
    assert _data(held) == expected  # unmapped only when the last view goes
    assert file_map.live_maps() == live + 1
    del held
    gc.collect()
    assert file_map.live_maps() == live


def test_a_frame_damaged_after_the_map_was_made_is_refused_with_its_position(
    open_partition: Any, batch: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every read checked (TOPICBASE_VERIFY_READS=always): by default a frame this process
    # wrote or verified is not checked again (tests/storage/test_verified_frames.py).
    monkeypatch.setattr(verified_frames, "ONCE", False)
    partition = open_partition(segment_bytes=256 * KIB)
    _fill(partition, batch, frames=12)
    segment = partition.segments[0]
    frames = list(segment.scan(0, segment.size_bytes, 1, mapped=True))
    assert all(frame.mapped for frame in frames) and len(frames) >= 2
    preads = _count_preads(monkeypatch)
    bad = frames[1]
    assert partition.read(0, max_messages=50).message_count == 50  # the map exists now
    _flip(segment.log_path, bad.position + 100)
    assert partition.read(0, max_messages=bad.header.base_offset).message_count == (
        bad.header.base_offset
    )
    with pytest.raises(CorruptSegmentError) as raised:
        partition.read(bad.header.base_offset)
    assert (raised.value.path, raised.value.position) == (segment.log_path, bad.position)
    assert preads == []  # found through the map, not a pread
    # Recovery's replay passes over it; the frames after it still come.
    kept = list(segment.scan(0, segment.size_bytes, 1, skip_corrupt=True, mapped=True))
    assert [f.position for f in kept] == [f.position for f in frames if f is not bad]


def test_a_frame_running_past_the_mapped_limit_is_refused(open_partition: Any, batch: Any) -> None:
    partition = open_partition(segment_bytes=256 * KIB)
    _fill(partition, batch, frames=12)
    segment: LogSegment = partition.segments[0]
    last = list(segment.scan(0, segment.size_bytes, 1, mapped=True))[-1]
    torn = LogSegment(segment.fs, os.path.dirname(segment.log_path), segment.base_offset)
    with pytest.raises(CorruptSegmentError, match="runs past") as raised:
        list(torn.scan(0, segment.size_bytes - 8, 1, mapped=True))
    assert raised.value.position == last.position
    with pytest.raises(CorruptSegmentError, match="inside a frame header"):
        list(torn.scan(0, last.position + 8, 1, mapped=True, position=last.position))
    torn.close()


def test_a_file_system_with_its_own_pread_is_never_bypassed(
    tmp_path: Any, open_partition: Any, batch: Any, read_all: Any
) -> None:
    class Modelled(FileSystem):
        def __init__(self) -> None:
            super().__init__()
            self.preads = 0

        def pread(self, fd: int, size: int, position: int) -> bytes:
            self.preads += 1
            return super().pread(fd, size, position)

    fs = Modelled()
    partition = open_partition(segment_bytes=256 * KIB, file_system=fs)
    _fill(partition, batch, frames=12)
    live = _live()
    fs.preads = 0
    assert len(read_all(partition)) == partition.end_offset
    assert fs.preads >= len(partition.segments) and file_map.live_maps() == live


def test_past_the_bound_on_live_maps_reads_fall_back_to_pread(
    open_partition: Any, batch: Any, read_all: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    partition = open_partition(segment_bytes=256 * KIB)
    _fill(partition, batch, frames=12)
    live = _live()
    monkeypatch.setattr(limits, "READ_MAPS_MAX", live)
    preads = _count_preads(monkeypatch)
    rows = read_all(partition)
    assert [row["offset"] for row in rows] == list(range(partition.end_offset))
    assert file_map.live_maps() == live
    assert len(preads) >= len(partition.segments)  # each segment read with pread


def test_maps_turned_off_read_everything_with_pread(
    open_partition: Any, batch: Any, read_all: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    partition = open_partition(segment_bytes=256 * KIB)
    _fill(partition, batch, frames=12)
    monkeypatch.setattr(file_map, "ENABLED", False)
    live = _live()
    preads = _count_preads(monkeypatch)
    rows = read_all(partition)
    assert [row["offset"] for row in rows] == list(range(partition.end_offset))
    assert file_map.live_maps() == live and len(preads) >= len(partition.segments)


def test_readers_racing_appends_rolls_and_retention_see_whole_frames(
    open_partition: Any, batch: Any
) -> None:
    partition = open_partition(segment_bytes=256 * KIB)
    stop = threading.Event()
    errors: list[BaseException] = []
    held: list[tuple[int, list[Any]]] = []

    def reader() -> None:
        try:
            while not stop.is_set():
                start = partition.start_offset
                result = partition.read(start, max_messages=150)
                for found in result.batches:
                    first = found.column("offset")[0].as_py()
                    assert _data([found]) == [
                        f"m{i}".encode().ljust(KIB, b".")
                        for i in range(first, first + found.num_rows)
                    ]
                    if len(held) < 50:
                        held.append((first, [found]))
        except BaseException as error:  # reported by the main thread
            errors.append(error)

    threads = [threading.Thread(target=reader) for _ in range(2)]
    for thread in threads:
        thread.start()
    try:
        for _ in range(40):
            _fill(partition, batch, frames=1)
            if len(partition.segments) > 3:
                partition.delete_segments_before(partition.segments[-2].base_offset)
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert not errors, errors
    assert partition.start_offset > 0 and held  # retention ran under the readers
    for first, batches in held:  # still whole after their segments were deleted
        count = batches[0].num_rows
        assert _data(batches) == [
            f"m{i}".encode().ljust(KIB, b".") for i in range(first, first + count)
        ]
