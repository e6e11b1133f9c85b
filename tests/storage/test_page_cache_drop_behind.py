"""Drop-behind: writes drop what was written back behind them (``page_cache.drop_behind``).

A partition the engine gave a floor (``PartitionLog.drop_floor``) drops, as it writes, the
active segment's bytes handed to writeback more than ``DROP_BEHIND_KEEP_BYTES`` ago and
below the floor, without a sync (round 16, docs/bulk_commit.md). Checked here: nothing
without a floor, nothing at or above it, nothing in the kept tail; the synced drop still
advises the range later (its own watermark); the pages leave the page cache (``mincore``);
a kill right after a drop-behind, or a torn frame written after one, loses nothing
acknowledged and the reopen reads the dropped bytes back from the disk, verified.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from typing import Any, ClassVar

import pytest

from storage import limits
from storage.config import FsyncPolicy
from tests import page_cache_spy
from tests.page_cache_spy import record_drops

KEEP = 50_000
STEP = 20_000
FRAME = 4 * 2500  # about: _fill's batches are 4 messages of 2500 bytes
SEGMENT = 16 * 1024 * 1024  # one active segment throughout
ALL = 2**63 - 1


@pytest.fixture
def advised(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int, int]]:
    """Drop-behind on with a small kept tail and step, writeback hinted every 8 KiB; every
    DONTNEED recorded as (file, start, end)."""
    calls = record_drops(monkeypatch, KEEP)
    monkeypatch.setattr(limits, "DROP_BEHIND_KEEP_BYTES", KEEP)
    monkeypatch.setattr(limits, "DROP_BEHIND_STEP_BYTES", STEP)
    monkeypatch.setattr(limits, "WRITEBACK_INTERVAL_BYTES", 8192)
    return calls


def _fill(partition: Any, batch: Any, count: int, first: int = 0) -> None:
    for i in range(first, first + count):
        partition.append(batch(4, first=4 * i, size_bytes=2500))


def _ends(calls: list[tuple[str, int, int]]) -> list[tuple[int, int]]:
    """The advised ranges of the one log file: each goes further and starts where the one
    before ended, or one step before (advised again: pages under writeback were skipped)."""
    assert len({path for path, _, _ in calls}) <= 1
    ranges = [(start, end) for _, start, end in calls]
    for (_, end), (start, later) in itertools.pairwise(ranges):
        assert max(0, end - STEP) == start or start == end, ranges
        assert later > end, ranges
    return ranges


def test_writes_drop_what_was_written_back_behind_them(open_partition, batch, advised) -> None:
    partition = open_partition(fsync_policy=FsyncPolicy.NEVER, segment_bytes=SEGMENT)
    partition.drop_floor = ALL
    segment = partition._segments[-1]
    for i in range(80):
        _fill(partition, batch, 1, first=i)
        ranges = _ends(advised)
        if ranges:  # never the kept tail of what was handed to writeback
            assert ranges[-1][1] <= segment.written_back_bytes - KEEP
            assert all(end - start >= STEP for start, end in ranges)
            assert all(later - end >= STEP for (_, end), (_, later) in itertools.pairwise(ranges))
    ranges = _ends(advised)
    assert ranges and ranges[0][0] == 0
    # each advice but the first covers the step before again (skipped while under writeback)
    assert all(start == end - STEP for (_, end), (start, _) in itertools.pairwise(ranges))
    # it keeps up: what is left behind is the kept tail and less than a step
    assert segment.written_back_bytes - ranges[-1][1] < KEEP + STEP
    assert segment.behind_to == ranges[-1][1] and segment.dropped_to == 0
    assert partition.durable_end == 0  # nothing was synced for it


def test_rolled_segments_are_dropped_whole_behind_the_writes(
    open_partition, batch, advised
) -> None:
    """A sealed segment's tail, kept while it was the newest bytes, goes once the newer
    segment has grown past the kept tail (it was synced at its seal)."""
    partition = open_partition(fsync_policy=FsyncPolicy.NEVER, segment_bytes=64 * 1024)
    partition.drop_floor = ALL
    _fill(partition, batch, 60)
    segments = partition._segments
    assert len(segments) > 6
    ends: dict[str, int] = {}
    for path, start, end in advised:  # each file's drops: a growing prefix from 0
        assert start <= ends.get(path, 0) < end, (path, start, ends.get(path))
        ends[path] = end
    for segment in segments[:-2]:
        assert segment.behind_to == segment.size_bytes
        assert ends[os.path.realpath(segment.log_path)] == segment.size_bytes
    kept = sum(s.size_bytes - max(s.dropped_to, s.behind_to) for s in segments)
    assert KEEP <= kept <= KEEP + STEP + segments[-1].size_bytes - segments[-1].written_back_bytes


def test_without_a_floor_or_below_it_nothing_is_dropped(open_partition, batch, advised) -> None:
    partition = open_partition(fsync_policy=FsyncPolicy.NEVER, segment_bytes=SEGMENT)
    _fill(partition, batch, 40)
    assert partition.drop_floor is None and advised == []
    segment = partition._segments[-1]
    floor = 40  # message 40: the 11th batch
    partition.drop_floor = floor
    _fill(partition, batch, 40, first=40)
    limit = segment.offset_index.lookup(floor)
    assert 0 < limit < FRAME * 11
    assert all(end <= limit for _, _, end in advised)
    partition.drop_floor = 0  # a consumer at the start: nothing
    advised.clear()
    _fill(partition, batch, 40, first=80)
    assert advised == []


def test_the_synced_drop_advises_again_from_its_own_watermark(
    open_partition, batch, advised
) -> None:
    """Pages dirty at a drop-behind are skipped by the kernel: the checkpoint's synced
    drop covers the range again (``dropped_to`` is not moved by drop-behind)."""
    partition = open_partition(fsync_policy=FsyncPolicy.NEVER, segment_bytes=SEGMENT)
    partition.drop_floor = ALL
    _fill(partition, batch, 60)
    behind = _ends(advised)[-1][1]
    advised.clear()
    partition.sync(drop_below=ALL)
    segment = partition._segments[-1]
    assert [(start, end) for _, start, end in advised] == [(0, segment.size_bytes - KEEP)]
    assert segment.dropped_to > behind
    advised.clear()
    _fill(partition, batch, 3, first=60)  # due again only past both watermarks
    assert all(start >= segment.dropped_to for _, start, _ in advised)


def test_a_cut_lowers_the_watermark(open_partition, batch, advised) -> None:
    partition = open_partition(fsync_policy=FsyncPolicy.NEVER, segment_bytes=SEGMENT)
    partition.drop_floor = ALL
    _fill(partition, batch, 60)
    segment = partition._segments[-1]
    assert segment.behind_to > FRAME
    segment.truncate_to(segment.offset_index.lookup(4), 4)
    assert segment.behind_to <= segment.size_bytes


def test_pages_written_back_leave_the_page_cache_without_a_sync(
    open_partition, batch, advised, read_all
) -> None:
    partition = open_partition(fsync_policy=FsyncPolicy.NEVER, segment_bytes=SEGMENT)
    partition.drop_floor = ALL
    _fill(partition, batch, 60)
    segment = partition._segments[-1]
    # the kernel's writeback, finished (the test's own descriptor: not our sync)
    fd = os.open(segment.log_path, os.O_RDONLY)
    try:
        os.fdatasync(fd)
    finally:
        os.close(fd)
    assert partition.durable_end == 0
    clean = segment.size_bytes  # written back: what the advice can drop
    advised.clear()  # pages dirty at earlier drops stay (the synced drop's to drop)
    _fill(partition, batch, 10, first=60)  # due again: drops what is written back now
    resident = page_cache_spy.resident(segment.log_path)
    gone = [
        page
        for _, start, end in advised
        for page in range(-(-start // 4096), min(end, clean) // 4096)  # whole pages
    ]
    # DONTNEED is best effort (a page the kernel holds a reference to at that moment
    # stays): here at most one whole page per advice stayed, without it all stay
    kept = sum(resident[page] for page in gone)
    assert len(gone) > 8 and kept <= len(advised) < len(gone) // 2, (kept, advised)
    assert all(resident[-(KEEP // 4096):])  # the kept tail stays
    assert len(read_all(partition)) == 280  # read back from the disk, verified


_CHILD = """
import os, sys
from storage import failpoints, limits
from storage.clock import ManualClock
from storage.config import FsyncPolicy, TopicConfig
from storage.fs import FileSystem
from storage.partition_log import PartitionLog
from storage.record_batch import build_wire_batch
limits.DROP_BEHIND_KEEP_BYTES = 50_000
limits.DROP_BEHIND_STEP_BYTES = 20_000
limits.WRITEBACK_INTERVAL_BYTES = 8192
config = TopicConfig(fsync_policy=FsyncPolicy.NEVER, segment_bytes=16 * 1024 * 1024).validate()
log = PartitionLog(FileSystem(), sys.argv[1], 0, config, ManualClock())
log.drop_floor = 2**63 - 1
failpoints.activate(sys.argv[2])
for i in range(100):
    data = [f"m{4 * i + j}".encode().ljust(2500, b".") for j in range(4)]
    log.append(build_wire_batch(data))
    print(i, log._segments[-1].behind_to, flush=True)  # written (a kill keeps the page cache)
raise SystemExit("not killed")
"""


@pytest.mark.parametrize(
    "spec",
    [
        "page_cache.after_drop_behind=crash@2",  # killed right after a drop-behind
        "segment.torn_write=crash@60",  # a torn frame after drop-behinds: cut at the reopen
    ],
)
def test_a_kill_after_drop_behind_loses_nothing(
    open_partition, read_all, partition_dir, spec: str
) -> None:
    env = dict(os.environ, TOPICBASE_DROP_SYNCED_PAGES="1")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    done = subprocess.run([sys.executable, "-c", _CHILD, partition_dir, spec], env=env,
                          cwd=root, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 137, done.stderr
    lines = [line.split() for line in done.stdout.splitlines()]
    acknowledged = len(lines)
    assert int(lines[-1][1]) > 0  # bytes were dropped behind before the kill
    reopened = open_partition(fsync_policy=FsyncPolicy.NEVER, segment_bytes=SEGMENT)
    assert reopened._segments[-1].behind_to == 0  # loaded bytes: not this process's
    rows = read_all(reopened)
    messages = [bytes(r["data"])[:8].rstrip(b".") for r in rows]
    assert len(messages) >= 4 * acknowledged > 4 * 4
    assert messages == [f"m{i}".encode() for i in range(len(messages))]


class _Segment:
    """What ``drop_behind`` reads of a segment, counting how many segments it looked at."""

    looked: ClassVar[set[int]] = set()

    def __init__(self, base_offset: int, size_bytes: int, dropped: bool) -> None:
        self.base_offset = base_offset
        self.next_offset = base_offset + 100
        self._size = size_bytes
        self.written_back_bytes = size_bytes
        self.dropped_to = size_bytes if dropped else 0
        self.behind_to = 0
        self.drops: list[int] = []
        self.offset_index = self  # its ``lookup``: positions in proportion to offsets

    def lookup(self, offset: int) -> int:
        return (offset - self.base_offset) * self._size // 100

    @property
    def size_bytes(self) -> int:
        _Segment.looked.add(self.base_offset)
        return self._size

    def drop_cache(self, upto: int, *, behind: bool, again: int) -> None:
        self.drops.append(upto)


def test_the_walk_jumps_over_the_segments_above_a_lagging_floor() -> None:
    """Review R2-16-3: with a consumer far behind, every append walked all the segments
    above its floor; now the walk counts the kept bytes, then jumps to the floor's."""
    from storage import page_cache

    segments = [_Segment(100 * i, 1 << 20, dropped=i < 3) for i in range(1000)]
    _Segment.looked.clear()
    page_cache.drop_behind(segments, below_offset=450, keep_bytes=1 << 20)  # in segment 4
    assert len(_Segment.looked) <= 5, sorted(_Segment.looked)  # the newest, then 4, 3, 2
    assert [bool(s.drops) for s in segments[:6]] == [False, False, False, True, True, False]
    assert segments[4].drops == [1 << 19]  # up to the floor's frame
    assert not any(s.drops for s in segments[5:])
