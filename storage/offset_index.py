"""Sparse offset index of a segment: (offset relative to base, file position).

One entry per ``limits.INDEX_INTERVAL_BYTES`` of log, always at a frame start.
``lookup(offset)`` gives the position of the last indexed frame starting at or
before ``offset``; the reader scans frame headers forward from there.
"""

from __future__ import annotations

import struct

from storage.fs import FileSystem
from storage.index_file import IndexFile

ENTRY = struct.Struct("<II")


class OffsetIndex(IndexFile):
    def __init__(self, fs: FileSystem, path: str, base_offset: int) -> None:
        super().__init__(fs, path, ENTRY)
        self.base_offset = base_offset

    def add(self, offset: int, position: int) -> None:
        self.append(offset - self.base_offset, position)

    def lookup(self, offset: int) -> int:
        """File position of a frame starting at or before ``offset`` (0 if none)."""
        entry = self.floor(offset - self.base_offset)
        return 0 if entry is None else entry[1]

    def is_consistent(self, log_bytes: int) -> bool:
        """True if positions and offsets both increase and stay inside the log.

        A non-empty log's index starts with the first frame, ``(0, 0)``.
        """
        entries = self.entries()
        if log_bytes > 0 and (not entries or entries[0] != (0, 0)):
            return False
        previous = (-1, -1)
        for relative, position in entries:
            if relative <= previous[0] or position <= previous[1] or position >= log_bytes:
                return False
            previous = (relative, position)
        return True
