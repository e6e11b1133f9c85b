"""A sparse, append-only index file of fixed-size (key, value) entries.

The shared mechanism under ``OffsetIndex`` and ``TimeIndex``. Entries are kept
in memory (two ``array`` columns, binary-searched) and appended to the file as
they are added. Index files carry no checksum: they are checked for shape on
open and rebuilt from the log when they do not fit (Kafka's approach).

Invariants: keys are non-decreasing; the file holds exactly the in-memory
entries once ``flush`` returned. Thread-safety: appends come from the
partition's single writer; lookups may run concurrently and see a prefix.
"""

from __future__ import annotations

import bisect
import struct
from array import array

from storage import failpoints
from storage.fs import FileSystem


class IndexFile:
    def __init__(self, fs: FileSystem, path: str, entry: struct.Struct) -> None:
        self._fs = fs
        self._path = path
        self._entry = entry
        self._keys: array[int] = array("q")
        self._values: array[int] = array("q")
        self._fd: int | None = None
        self._pending = bytearray()
        self._file_bytes = 0
        # written whole by ``rewrite`` (not synced) and not synced since: a ``flush(sync=
        # True)`` syncs the file even when no descriptor is open (an adopted segment's seal)
        self._rewritten_unsynced = False

    @property
    def path(self) -> str:
        return self._path

    def __len__(self) -> int:
        return len(self._keys)

    def load(self) -> bool:
        """Read entries from disk; False (nothing loaded) if the file is missing or torn."""
        try:
            raw = self._fs.read_file(self._path)
        except FileNotFoundError:
            return False
        if len(raw) % self._entry.size:
            return False
        keys: array[int] = array("q")
        values: array[int] = array("q")
        for key, value in self._entry.iter_unpack(raw):
            keys.append(key)
            values.append(value)
        self._keys, self._values = keys, values
        self._file_bytes = len(raw)
        return True

    def entries(self) -> list[tuple[int, int]]:
        return list(zip(self._keys, self._values, strict=True))

    def last(self) -> tuple[int, int] | None:
        if not self._keys:
            return None
        return self._keys[-1], self._values[-1]

    def append(self, key: int, value: int) -> None:
        assert not self._keys or key >= self._keys[-1], (key, self._keys[-1])
        # the value first: a reader without the writer's lock (``floor``, ``ceiling_value_
        # of_key`` from a read of many partitions) that finds the key finds its value too
        self._values.append(value)
        self._keys.append(key)
        self._pending += self._entry.pack(key, value)

    def floor(self, key: int) -> tuple[int, int] | None:
        """The last entry with entry key <= ``key``, or None."""
        keys = self._keys
        index = bisect.bisect_right(keys, key, 0, min(len(self._values), len(keys))) - 1
        if index < 0:
            return None
        return keys[index], self._values[index]

    def ceiling_value_of_key(self, key: int) -> int | None:
        """The value of the first entry with entry key >= ``key``, or None. Among the
        entries whose values are in (``append`` puts a value before its key; bounded
        here too, so a key seen before its value, in any order, is not an entry yet)."""
        entries = min(len(self._values), len(self._keys))
        index = bisect.bisect_left(self._keys, key, 0, entries)
        if index >= entries:
            return None
        return self._values[index]

    def flush(self, *, sync: bool = False) -> None:
        """Write pending entries to the file; ``sync`` also makes them durable, and a
        file ``rewrite`` wrote unsynced (opened for it if no descriptor is)."""
        if self._pending:
            failpoints.hit("index.before_flush")
            fd = self._open()
            self._fs.pwrite(fd, bytes(self._pending), self._file_bytes)
            self._file_bytes += len(self._pending)
            self._pending.clear()
        if sync and (self._fd is not None or self._rewritten_unsynced):
            self._fs.sync(self._open())
            self._rewritten_unsynced = False

    def rewrite(self, entries: list[tuple[int, int]]) -> None:
        """Replace the whole index (after recovery rebuilt it from the log)."""
        self.close()
        payload = b"".join(self._entry.pack(k, v) for k, v in entries)
        self._fs.write_file_atomic(self._path, payload, durable=False)
        self._keys = array("q", (k for k, _ in entries))
        self._values = array("q", (v for _, v in entries))
        self._file_bytes = len(payload)
        self._pending.clear()
        self._rewritten_unsynced = True

    def close(self) -> None:
        """Write pending entries (opening the file if needed), then release it."""
        self.flush()
        if self._fd is not None:
            self._fs.close(self._fd)
            self._fd = None

    def _open(self) -> int:
        if self._fd is None:
            self._fd = self._fs.open_write(self._path)
            self._fs.truncate(self._fd, self._file_bytes)
        return self._fd
