"""Review R2-B1 (session 15): bytes the page-cache drop hands back (``storage.page_cache``)
are read from the disk next time, so ``storage.verified_frames`` forgets them at the drop
and their next read checks each frame's CRC-32C again."""

from __future__ import annotations

import os
from typing import Any

import pytest

from storage import limits, page_cache
from storage.config import FsyncPolicy
from storage.errors import CorruptSegmentError

SEGMENT = 64 * 1024
ALL = 2**63 - 1


def test_a_dropped_frame_read_back_wrong_from_disk_fails_its_check(
    open_partition: Any, batch: Any, read_all: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(page_cache, "ENABLED", True)
    monkeypatch.setattr(limits, "PAGE_CACHE_KEEP_BYTES", 50_000)
    partition = open_partition(fsync_policy=FsyncPolicy.NEVER, segment_bytes=SEGMENT)
    for i in range(60):
        partition.append(batch(4, first=4 * i, size_bytes=2500))
    read_all(partition)  # every frame verified (written from memory, then read)
    partition.sync(drop_below=ALL)
    first = partition._segments[0]
    assert first.dropped_to > 0  # its pages were handed back: the next read is the disk's
    assert all(start >= first.dropped_to for start, _ in first.verified.snapshot())
    # stand-in for the disk returning a wrong byte on that re-read (no error reported)
    with open(first.log_path, "rb") as handle:
        body = int.from_bytes(handle.read(48)[28:32], "little")
    fd = os.open(first.log_path, os.O_WRONLY)
    try:
        os.pwrite(fd, b"\xff", 48 + body - 600)  # a byte of a message's data
    finally:
        os.close(fd)
    with pytest.raises(CorruptSegmentError):
        read_all(partition)


def test_forget_below_keeps_only_what_lies_past_the_position() -> None:
    from storage.verified_frames import VerifiedRuns

    runs = VerifiedRuns()
    runs.add(0, 100)
    runs.add(200, 300)
    runs.forget_below(250)
    assert runs.snapshot() == ((250, 300),)
    runs.forget_below(400)
    assert runs.snapshot() == ()


def _reopened_cached_segment(open_partition: Any, batch: Any) -> Any:
    """The segment of 40 frames a partition wrote and closed, opened again: nothing of it
    verified, and its bytes taken as cached, not yet dropped (the open dropped the loaded
    log: ``dropped_to`` set back as before a checkpoint's drop)."""
    writer = open_partition(fsync_policy=FsyncPolicy.NEVER, segment_bytes=1 << 26)
    for i in range(40):
        writer.append(batch(4, first=4 * i, size_bytes=2500))
    writer.close()
    segment = open_partition(fsync_policy=FsyncPolicy.NEVER, segment_bytes=1 << 26)._segments[-1]
    assert segment.verified.snapshot() == ()
    segment.dropped_to = 0
    return segment


def test_a_frame_checked_while_its_pages_are_dropped_is_not_marked_verified(
    open_partition: Any, batch: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review R2-16-1: a mapped read checks a frame, a drop (another thread) forgets the
    runs and hands the pages back, then the read would mark the frame verified over bytes
    that left the page cache. The read's generation, taken before it checked anything,
    voids its marks. The interleaving is forced by running the drop inside the check."""
    from types import SimpleNamespace

    import crc32c

    from storage import segment as segment_module
    from storage.record_batch import HEADER_BYTES
    from storage.verified_frames import covered

    segment = _reopened_cached_segment(open_partition, batch)
    real = crc32c.crc32c
    fired: list[bool] = []

    def check_then_drop(data: Any) -> int:
        value = real(data)
        if not fired:
            fired.append(True)
            segment.drop_cache(segment.size_bytes)
        return value

    monkeypatch.setattr(segment_module, "crc32c", SimpleNamespace(crc32c=check_then_drop))
    frames = list(segment.scan(0, segment.size_bytes, 1 << 20, mapped=True))
    monkeypatch.setattr(segment_module, "crc32c", crc32c)
    assert fired and len(frames) == 40
    first = frames[0]
    end = first.position + HEADER_BYTES + first.header.body_bytes
    assert not covered(segment.verified.snapshot(), first.position, end)
    assert segment.verified.snapshot() == ()  # the whole scan's marks are void
    frames = list(segment.scan(0, segment.size_bytes, 1 << 20, mapped=True))
    assert covered(segment.verified.snapshot(), 0, segment.size_bytes)  # a clean read marks


def test_a_mark_taken_before_a_cut_or_a_forget_is_ignored() -> None:
    from storage.verified_frames import VerifiedRuns

    runs = VerifiedRuns()
    taken = runs.generation
    runs.forget_below(10)
    runs.add(0, 100, taken)
    assert runs.snapshot() == ()
    taken = runs.generation
    runs.add(0, 100, taken)
    runs.cut(50)
    runs.add(50, 80, taken)  # checked before the cut: not marked
    assert runs.snapshot() == ((0, 50),)
    runs.add(50, 80)  # the writer's own bytes: always marked
    assert runs.snapshot() == ((0, 80),)


def test_a_read_between_the_drops_forget_and_its_advice_marks_nothing(
    open_partition: Any, batch: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review R2-16-5: a mapped read that takes the generation after the drop's first
    ``forget_below`` checks and marks pages that the advice then hands back; the forget
    after the advice voids those marks."""
    from storage.verified_frames import covered

    segment = _reopened_cached_segment(open_partition, batch)
    real = os.posix_fadvise
    scanned: list[int] = []

    def advise(fd: int, offset: int, length: int, advice: int) -> None:
        if advice == os.POSIX_FADV_DONTNEED and not scanned:  # another thread's read
            scanned.append(len(list(segment.scan(0, segment.size_bytes, 1 << 20, mapped=True))))
        real(fd, offset, length, advice)

    monkeypatch.setattr(os, "posix_fadvise", advise)
    segment.drop_cache(segment.size_bytes)
    assert scanned == [40]
    runs = segment.verified.snapshot()
    assert not any(covered(runs, p, p + 1) for p in range(0, segment.size_bytes, 4096)), runs
