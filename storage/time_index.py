"""Sparse time index of a segment: (written_at in µs, offset relative to base).

Timestamps are non-decreasing within a partition (the writer never lets
``written_at`` go backwards), so the index is sorted by both columns.
``lookup(ts)`` gives an offset at or before the first message written at or
after ``ts``; the reader scans forward from there.
"""

from __future__ import annotations

import struct

from storage.fs import FileSystem
from storage.index_file import IndexFile

ENTRY = struct.Struct("<qI")


class TimeIndex(IndexFile):
    def __init__(self, fs: FileSystem, path: str, base_offset: int) -> None:
        super().__init__(fs, path, ENTRY)
        self.base_offset = base_offset

    def add(self, written_at_us: int, offset: int) -> None:
        self.append(written_at_us, offset - self.base_offset)

    def lookup(self, written_at_us: int) -> int:
        """An offset whose frame was written before ``written_at_us`` (base if none)."""
        entry = self.floor(written_at_us - 1)
        return self.base_offset if entry is None else self.base_offset + entry[1]

    def is_consistent(self, next_offset: int) -> bool:
        previous_time, previous_offset = -(2**63), -1
        for written_at, relative in self.entries():
            offset = self.base_offset + relative
            if written_at < previous_time or offset <= previous_offset or offset >= next_offset:
                return False
            previous_time, previous_offset = written_at, offset
        return True
