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
