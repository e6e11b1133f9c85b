"""Scans of the active segment read through the writer's descriptor (issue 14: an
``open`` and a ``close`` per partition per read), and that descriptor is never closed
under a scan: a close while scans read defers to the last of them.
"""

from __future__ import annotations

import os
from typing import Any

from storage.fs import FileSystem
from storage.record_batch import build_wire_batch, decode_header, encode_frame, serialize_body
from storage.segment import LogSegment

BASE = 0


class _CountingFileSystem(FileSystem):
    def __init__(self) -> None:
        super().__init__()
        self.opened_for_read = 0
        self.closed: list[int] = []

    def open_read(self, path: str) -> int:
        self.opened_for_read += 1
        return super().open_read(path)

    def close(self, fd: int) -> None:
        self.closed.append(fd)
        super().close(fd)


def _append(segment: LogSegment, count: int) -> None:
    data = [f"m{segment.next_offset + i}".encode() for i in range(count)]
    body = serialize_body(build_wire_batch(data))
    base = segment.next_offset
    frame = encode_frame(body, base_offset=base, written_at_us=base, record_count=count)
    header = decode_header(frame)
    assert header is not None
    segment.append_frame(frame, header)


def test_scans_of_the_active_segment_open_nothing(tmp_path: Any) -> None:
    fs = _CountingFileSystem()
    segment = LogSegment(fs, str(tmp_path), BASE)
    for _ in range(5):
        _append(segment, 3)
    for start in range(0, 15, 2):
        frames = list(segment.scan(start, segment.size_bytes, 1 << 20))
        assert frames and frames[0].header.base_offset <= start
    assert fs.opened_for_read == 0 and fs.closed == []
    segment.close()
    list(segment.scan(0, segment.size_bytes, 1 << 20))  # closed: a descriptor of its own
    assert fs.opened_for_read == 1
    segment.close()


def test_a_close_during_scans_waits_for_the_last_one(tmp_path: Any) -> None:
    fs = _CountingFileSystem()
    segment = LogSegment(fs, str(tmp_path), BASE)
    for _ in range(4):
        _append(segment, 2)
    write_fd = segment._fd()
    first = segment.scan(0, segment.size_bytes, 1)  # small windows: a pread per frame
    second = segment.scan(0, segment.size_bytes, 1)
    assert next(first).header.base_offset == 0
    assert next(second).header.base_offset == 0
    segment.close()  # the writer lets go; both scans still read through the descriptor
    assert write_fd not in fs.closed
    os.fstat(write_fd)  # still open: its number cannot have gone to another file
    assert [f.header.base_offset for f in first] == [2, 4, 6]
    assert write_fd not in fs.closed  # the second scan still reads
    assert [f.header.base_offset for f in second] == [2, 4, 6]
    assert fs.closed.count(write_fd) == 1  # closed once, by the last scan
    assert fs.opened_for_read == 0


def test_a_scan_left_early_releases_the_descriptor(tmp_path: Any) -> None:
    fs = _CountingFileSystem()
    segment = LogSegment(fs, str(tmp_path), BASE)
    for _ in range(3):
        _append(segment, 2)
    write_fd = segment._fd()
    scan = segment.scan(0, segment.size_bytes, 1)
    next(scan)
    scan.close()  # a reader that stops early (PartitionLog's budgets)
    segment.close()
    assert fs.closed.count(write_fd) == 1  # closed by the writer at once: no scan left
