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

import os
from typing import Any

import pytest

from storage import file_map
from storage.errors import CorruptSegmentError
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
