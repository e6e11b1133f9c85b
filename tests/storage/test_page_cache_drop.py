"""Synced log bytes dropped from the page cache after a sync (``storage.page_cache``, issue 14).

The hint (``POSIX_FADV_DONTNEED``) must cover synced bytes only, never the newest
``PAGE_CACHE_KEEP_BYTES`` of the partition, nor bytes appended while the sync ran, nor
bytes at or above the caller's offset floor (``sync(drop_below=...)``), and only a sync
given a floor drops; data read after a drop is the same (checksums verified by a fresh
open); a kill right after a drop loses nothing; retention and reopened (sealed,
unopened) segments are handled.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from typing import Any

import pytest

from storage import file_map, limits, page_cache
from storage.config import FsyncPolicy
from storage.fs import FileSystem
from tests import page_cache_spy
from tests.page_cache_spy import record_drops

KEEP = 50_000
SEGMENT = 64 * 1024
WAIT_S = 10.0
ALL = 2**63 - 1  # the floor of a topic no consumer reads: every offset may be dropped


@pytest.fixture
def advised(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int, int]]:
    """Turn the drop on (keep ``KEEP`` bytes) and record every DONTNEED as (file, start, end)."""
    return record_drops(monkeypatch, KEEP)


def _dropped(calls: list[tuple[str, int, int]]) -> dict[str, int]:
    """Per file, the end of the dropped prefix; asserts the ranges are contiguous from 0."""
    ends: dict[str, int] = {}
    for path, start, end in calls:
        assert start == ends.get(path, 0), (path, start, ends.get(path))
        assert end > start
        ends[path] = end
    return ends


def _kept(segments: Any, ends: dict[str, int]) -> int:
    """Bytes of ``segments`` not dropped, given the dropped prefix of each file."""
    kept = 0
    for segment in segments:
        dropped = ends.get(os.path.realpath(segment.log_path), 0)
        assert dropped <= segment.size_bytes
        kept += segment.size_bytes - dropped
    return kept


def _fill(partition: Any, batch: Any, count: int) -> None:
    for i in range(count):
        partition.append(batch(4, first=4 * i, size_bytes=2500))


def test_sync_drops_synced_bytes_but_the_kept_tail(open_partition, batch, advised) -> None:
    partition = open_partition(fsync_policy=FsyncPolicy.NEVER, segment_bytes=SEGMENT)
    _fill(partition, batch, 60)
    assert advised == []  # NEVER: nothing synced by the appends, so nothing dropped
    partition.sync(drop_below=ALL)
    segments = partition._segments
    assert len(segments) > 3
    # exactly the newest KEEP bytes stay, everything older is dropped
    assert _kept(segments, _dropped(advised)) == KEEP
    assert sum(s.size_bytes for s in segments) > 3 * KEEP
    # A second sync with nothing new drops nothing more; new synced bytes are dropped on.
    first = list(advised)
    advised.clear()
    partition.sync(drop_below=ALL)
    assert advised == []
    _fill(partition, batch, 5)
    partition.sync(drop_below=ALL)
    assert advised
    assert _kept(partition._segments, _dropped(first + advised)) == KEEP


class _BlockingSync(FileSystem):
    """``sync`` waits for ``release`` once ``block`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.block = False
        self.entered = threading.Event()
        self.release = threading.Event()

    def sync(self, fd: int) -> None:
        if self.block:
            self.entered.set()
            assert self.release.wait(WAIT_S)
        super().sync(fd)


def test_bytes_appended_during_the_sync_are_not_dropped(open_partition, batch, advised) -> None:
    fs = _BlockingSync()
    partition = open_partition(file_system=fs, fsync_policy=FsyncPolicy.NEVER,
                               segment_bytes=16 * 1024 * 1024)  # fmt: skip
    _fill(partition, batch, 40)
    synced_end = partition._segments[-1].size_bytes
    fs.block = True
    thread = threading.Thread(target=partition.sync, kwargs={"drop_below": ALL}, daemon=True)
    thread.start()
    assert fs.entered.wait(WAIT_S)
    fs.block = False
    _fill(partition, batch, 40)  # appended outside the lock while the sync runs: not synced
    assert partition._segments[-1].size_bytes > synced_end + KEEP
    fs.release.set()
    thread.join(WAIT_S)
    assert not thread.is_alive()
    ends = _dropped(advised)
    assert list(ends.values()) == [synced_end - KEEP]  # the synced end, not the grown size


def test_reads_after_a_drop_are_identical_and_verified(
    open_partition, batch, advised, read_all, partition_dir
) -> None:
    partition = open_partition(fsync_policy=FsyncPolicy.NEVER, segment_bytes=SEGMENT)
    _fill(partition, batch, 60)
    before = read_all(partition)
    partition.sync(drop_below=ALL)
    assert advised
    assert read_all(partition) == before
    partition.close()
    # A fresh open checks every frame's CRC as it reads it (nothing verified in memory).
    reopened = open_partition(fsync_policy=FsyncPolicy.NEVER, segment_bytes=SEGMENT)
    assert read_all(reopened) == before
    assert len(before) == 240


def test_a_reopened_log_drops_only_what_this_process_wrote(open_partition, batch, advised) -> None:
    """Bytes loaded at the open are never dropped: a reader catching up after a restart
    finds the log as cached as before, also after the first write and sync (review
    R2-F5 of round 13: that sync dropped the whole history but the kept tail)."""
    partition = open_partition(fsync_policy=FsyncPolicy.NEVER, segment_bytes=SEGMENT)
    _fill(partition, batch, 60)
    partition.close()
    advised.clear()
    reopened = open_partition(fsync_policy=FsyncPolicy.NEVER, segment_bytes=SEGMENT)
    loaded = {segment.log_path: segment.size_bytes for segment in reopened._segments}
    assert advised == []
    reopened.sync(drop_below=ALL)
    assert advised == []
    _fill(reopened, batch, 60)
    reopened.sync(drop_below=ALL)
    dropped = _dropped(advised)
    assert dropped  # the new bytes past the kept tail were dropped
    for path, end in loaded.items():  # none of the loaded bytes
        assert all(not (p == path and start < end) for p, start, _ in advised), path


def test_a_log_renamed_by_retention_during_the_drop_does_not_fail_the_sync(
    open_partition, batch, advised, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Retention may rename a sealed log to ``*.deleted`` between the walk and the open
    (review R2-F3 of round 13): the drop skips it and the sync succeeds."""
    partition = open_partition(fsync_policy=FsyncPolicy.NEVER, segment_bytes=SEGMENT)
    _fill(partition, batch, 60)
    partition.sync(drop_below=ALL)
    for segment in partition._segments[:-1]:  # sealed: dropped through a new descriptor
        segment.dropped_to = 0
        segment.close()
    original = partition.fs.open_read

    def renamed_first(path: str) -> int:
        os.rename(path, path + ".deleted")
        return original(path)

    monkeypatch.setattr(partition.fs, "open_read", renamed_first)
    _fill(partition, batch, 1)
    partition.sync(drop_below=ALL)  # raised FileNotFoundError before the fix
    monkeypatch.setattr(partition.fs, "open_read", original)
    assert partition._durable_end == partition._segments[-1].next_offset


def test_retention_deleting_segments_then_a_sync(open_partition, batch, advised, read_all) -> None:
    partition = open_partition(fsync_policy=FsyncPolicy.NEVER, segment_bytes=SEGMENT)
    _fill(partition, batch, 60)
    cut = partition._segments[2].base_offset
    assert partition.delete_segments_before(cut) == 2
    before = read_all(partition, cut)
    partition.sync(drop_below=ALL)
    paths = {path for path, _, _ in advised}
    assert paths  # the surviving segments were dropped
    assert all(os.path.exists(path) and not path.endswith(".deleted") for path in paths)
    _fill(partition, batch, 10)
    partition.sync(drop_below=ALL)
    assert read_all(partition, cut)[: len(before)] == before
    assert partition.start_offset == cut


def test_on_by_default_and_off_with_the_environment_variable_at_zero() -> None:
    code = "from storage import page_cache; print(page_cache.ENABLED)"
    env = {k: v for k, v in os.environ.items() if k != "TOPICBASE_DROP_SYNCED_PAGES"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True, cwd=os.getcwd())  # fmt: skip
    assert out.stdout.strip() == "True"
    env["TOPICBASE_DROP_SYNCED_PAGES"] = "0"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True, cwd=os.getcwd())  # fmt: skip
    assert out.stdout.strip() == "False"


def test_a_sync_without_a_floor_drops_nothing(open_partition, batch, advised) -> None:
    """Only a caller that knows the readers' floor drops (the engine's checkpoint): a
    move's source made durable (``make_durable`` from a commit) or any plain sync keeps
    the cache, which a consumer is about to read."""
    partition = open_partition(fsync_policy=FsyncPolicy.NEVER, segment_bytes=SEGMENT)
    _fill(partition, batch, 60)
    partition.sync()
    partition.make_durable()
    assert advised == []
    partition.make_durable(drop_below=ALL)  # nothing new to sync: nothing dropped either
    _fill(partition, batch, 5)
    partition.make_durable(drop_below=ALL)
    assert _kept(partition._segments, _dropped(advised)) == KEEP


def test_nothing_at_or_above_the_floor_is_dropped(open_partition, batch, advised) -> None:
    """A consumer committed up to ``floor``: the bytes it reads next stay cached, in the
    segment that holds the floor (dropped to the indexed frame at or before it) and in
    every later one; a later sync with a higher floor drops on from there."""
    partition = open_partition(fsync_policy=FsyncPolicy.NEVER, segment_bytes=SEGMENT)
    _fill(partition, batch, 60)
    segments = partition._segments
    assert len(segments) > 3
    holder = segments[1]
    floor = holder.base_offset + (holder.next_offset - holder.base_offset) // 2
    partition.sync(drop_below=floor)
    ends = _dropped(advised)
    for segment in segments:
        dropped = ends.get(os.path.realpath(segment.log_path), 0)
        if segment.base_offset >= floor:
            assert dropped == 0, segment.base_offset
        elif segment.next_offset <= floor:
            assert dropped == segment.size_bytes
        else:  # the floor's segment: up to a frame start at or below the floor, not past it
            assert 0 < dropped <= segment.offset_index.lookup(floor)
            assert dropped == holder.offset_index.lookup(floor)
    _fill(partition, batch, 5)
    partition.sync(drop_below=segments[3].base_offset)
    ends = _dropped(advised)
    assert ends.get(os.path.realpath(segments[2].log_path)) == segments[2].size_bytes
    assert os.path.realpath(segments[3].log_path) not in ends


_CHILD = """
import os, signal, sys
from storage import file_map, limits, page_cache
from storage.clock import ManualClock
from storage.config import FsyncPolicy, TopicConfig
from storage.fs import FileSystem
from storage.partition_log import PartitionLog
from storage.record_batch import build_wire_batch
assert page_cache.ENABLED
limits.PAGE_CACHE_KEEP_BYTES = 50_000
real = os.posix_fadvise
def advise(fd, offset, length, advice):
    real(fd, offset, length, advice)
    if advice == os.POSIX_FADV_DONTNEED:
        os.kill(os.getpid(), signal.SIGKILL)  # killed right after the first drop
os.posix_fadvise = advise
config = TopicConfig(fsync_policy=FsyncPolicy.NEVER, segment_bytes=64 * 1024).validate()
log = PartitionLog(FileSystem(), sys.argv[1], 0, config, ManualClock())
for i in range(60):
    data = [f"m{4 * i + j}".encode().ljust(2500, b".") for j in range(4)]
    log.append(build_wire_batch(data))
log.sync(drop_below=2**63 - 1)
raise SystemExit("not killed")
"""


def test_kill_right_after_a_drop_loses_nothing(open_partition, read_all, partition_dir) -> None:
    env = dict(os.environ, TOPICBASE_DROP_SYNCED_PAGES="1")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    done = subprocess.run([sys.executable, "-c", _CHILD, partition_dir], env=env, cwd=root,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == -9, done.stderr
    reopened = open_partition(fsync_policy=FsyncPolicy.NEVER, segment_bytes=SEGMENT)
    assert reopened.recovery is not None
    rows = read_all(reopened)
    assert [bytes(r["data"])[:8].rstrip(b".") for r in rows] == [
        f"m{i}".encode() for i in range(240)
    ]


@pytest.fixture
def released(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """Every ``file_map.release_pages`` as (map address, bytes asked)."""
    calls: list[tuple[int, int]] = []
    real = file_map.release_pages

    def spy(buffer: Any, size: int) -> None:
        calls.append((buffer.address, size))
        real(buffer, size)

    monkeypatch.setattr(file_map, "release_pages", spy)
    return calls


def test_drop_consumed_drops_durable_bytes_below_the_floor_and_their_map_pages(
    open_partition, batch, advised, released, read_all
) -> None:
    """What every consumer committed past leaves the cache, its read map's pages first
    (the kernel keeps mapped pages); nothing at or above the floor; reads after it (the
    same maps, faulted in again) return the same messages."""
    partition = open_partition(fsync_policy=FsyncPolicy.ALWAYS, segment_bytes=SEGMENT)
    _fill(partition, batch, 60)
    before = read_all(partition)  # maps every segment (file_map), as a consumer's reads do
    segments = partition._segments
    mapped = {id(s): s._map[0].address for s in segments if s._map is not None}
    assert len(mapped) == len(segments) > 3
    holder = segments[2]
    floor = holder.base_offset + (holder.next_offset - holder.base_offset) // 2
    partition.drop_consumed(floor)
    ends = _dropped(advised)
    for segment in segments:
        dropped = ends.get(os.path.realpath(segment.log_path), 0)
        if segment.next_offset <= floor:
            assert dropped == segment.size_bytes
            assert (mapped[id(segment)], segment.size_bytes) in released
        elif segment.base_offset < floor:
            assert dropped == holder.offset_index.lookup(floor) > 0
            assert (mapped[id(segment)], dropped) in released
        else:
            assert dropped == 0
    assert {address for address, _ in released} <= set(mapped.values())
    assert read_all(partition) == before


def test_drop_consumed_keeps_what_is_not_durable(open_partition, batch, advised) -> None:
    """``durable_end`` bounds it: bytes of a NEVER-synced log are not dropped whatever the
    consumers did (only a checkpoint's sync, which passes its own floor, drops those)."""
    partition = open_partition(fsync_policy=FsyncPolicy.NEVER, segment_bytes=SEGMENT)
    _fill(partition, batch, 60)
    assert partition.durable_end == 0
    partition.drop_consumed(ALL)
    assert advised == []
    partition.sync()  # durable now; a sync without a floor drops nothing itself
    assert advised == []
    partition.drop_consumed(ALL)
    assert _kept(partition._segments, _dropped(advised)) == KEEP


def _resident_pages(path: str) -> tuple[int, int]:
    """(pages of the file in the page cache, pages of the file)."""
    pages = page_cache_spy.resident(path)
    return sum(pages), len(pages)


def test_consumed_mapped_pages_really_leave_the_page_cache(
    open_partition, batch, read_all, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kernel keeps pages a process maps: without releasing the reader's map the
    advice drops nothing of a segment a consumer read. With it, the segment leaves the
    cache (``mincore``), and reading it again brings the same bytes back."""
    monkeypatch.setattr(page_cache, "ENABLED", True)
    monkeypatch.setattr(limits, "PAGE_CACHE_KEEP_BYTES", KEEP)
    partition = open_partition(fsync_policy=FsyncPolicy.ALWAYS, segment_bytes=SEGMENT)
    _fill(partition, batch, 60)
    before = read_all(partition)
    first = partition._segments[0]
    assert first._map is not None
    resident, pages = _resident_pages(first.log_path)
    assert resident == pages  # written and read: all cached
    partition.drop_consumed(partition._segments[-1].base_offset)
    resident, pages = _resident_pages(first.log_path)
    assert pages > 8 and resident <= 1, (resident, pages)  # a partial last page may stay
    assert read_all(partition) == before
