"""Read-only memory maps of log files, as Arrow buffers: reads of published bytes without a copy.

A read of a segment through a map pays no copy: the page cache's pages are
mapped into the process, the checksum and the Arrow decode read them in place, and
the batches a read returns are views of them (zero-copy). A ``pread`` copies every
byte once more into a fresh buffer first, which cost as much as the checksum (the
read path's two largest costs: docs/storage_read.md).

The map is made with ``mmap(2)`` through libc (``ctypes``), not Python's ``mmap``
module: that one keeps a duplicate of the file's descriptor open for as long as the
map lives (``trackfd`` arrived in Python 3.13), one descriptor per sealed segment read.
Here the descriptor can be closed as soon as the map exists.

Lifetime: the map is owned by a ``_Mapping``; every Arrow buffer over it
(``pa.foreign_buffer`` with the owner as its base, and every slice of it, and every
array decoded from a slice) keeps the owner alive, and the owner unmaps when the last
of them is gone. So a batch a caller holds never sees its bytes unmapped.

Invariants the callers keep (``LogSegment``): only published bytes are read through a
map, and they never change again (appends go after them, a fence cuts only unpublished
bytes, retention unlinks a whole file, which leaves a map valid). A map may reach past
the end of the file (the active segment is mapped as large as it will grow, so it is
not mapped again at every append); those pages are not read until the file holds them
(reading a page wholly past the end would raise ``SIGBUS``).

The price, plainly: a read through a map that the kernel cannot serve raises ``SIGBUS``,
and ``SIGBUS`` KILLS THE SERVER PROCESS (every session, every partition), where
``pread`` would fail that one read with an error (``StorageIOError`` /
``CorruptSegmentError``). It happens when a segment file is truncated or modified by
anything outside the server (another process, an operator, a restore tool, a file
system that loses data), and on a disk read error on a page not in the page cache
(``EIO``). The storage itself never shrinks a published byte, so a healthy disk and
files left alone never see it. ``TOPICBASE_READ_MAPS=0`` in the environment turns
maps off (``ENABLED``): every read then uses ``pread``, trading the maps' read speed
(~1.8x the read throughput of maps off in the storage bench, docs/storage_read.md) for
a failing disk or a file cut under the server being an error on one read, not the end
of the process.

Bounded: at most ``limits.READ_MAPS_MAX`` maps live at once (the kernel's ``vm.max_map_count``
is 65,530 by default, shared with the allocator); past it ``map_file`` returns None and
the caller reads with ``pread``, trying again once ``room()`` changed (a map freed).
Segments release their cached maps, least recently read first, when live maps near the
bound (``storage.segment``). Thread-safe.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import threading

import pyarrow as pa

from storage import limits

ENABLED = os.environ.get("TOPICBASE_READ_MAPS", "1") != "0"


def _load_libc() -> tuple[object, object, object] | None:
    """libc's ``mmap``, ``munmap`` and ``madvise``, or None where they cannot be found."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        map_function, unmap_function = libc.mmap, libc.munmap
        advise_function = libc.madvise
    except (OSError, AttributeError):
        return None
    map_function.argtypes = [
        ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
        ctypes.c_int64,
    ]  # fmt: skip
    map_function.restype = ctypes.c_void_p
    unmap_function.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    unmap_function.restype = ctypes.c_int
    advise_function.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    advise_function.restype = ctypes.c_int
    return map_function, unmap_function, advise_function


_LIBC = _load_libc()
_MAP_FAILED = ctypes.c_void_p(-1).value
_MADV_DONTNEED = getattr(mmap, "MADV_DONTNEED", 4)
_lock = threading.Lock()
_live = 0  # maps made and not yet unmapped
_freed = 0  # maps unmapped so far (``room``)


class _Mapping:
    """One ``mmap(2)`` region; unmapped when this object is freed (its last buffer gone)."""

    __slots__ = ("address", "size")

    def __init__(self, address: int, size: int) -> None:
        self.address = address
        self.size = size

    def __del__(self) -> None:
        global _live, _freed
        libc, lock = _LIBC, _lock
        if libc is None or lock is None:  # interpreter shutdown cleared the module
            return
        libc[1](self.address, self.size)  # type: ignore[operator]
        with lock:
            _live -= 1
            _freed += 1


def live_maps() -> int:
    """How many maps are live (tests, profiles)."""
    return _live


def room() -> tuple[int, int]:
    """A token that changes whenever a map refused before may now be made (a map was
    freed, or the bound moved): a caller refused a map tries again only once it changed,
    not at every read."""
    return _freed, limits.READ_MAPS_MAX


def release_pages(buffer: pa.Buffer, size: int) -> None:
    """Take the pages of the first ``size`` bytes of a map made here (``map_file``) out
    of this process (``MADV_DONTNEED``; whole pages only): a hint so that the kernel may
    then drop them from the page cache (``storage.page_cache``), which it does not do
    for pages a process maps. The map stays valid: a later read of those bytes faults
    them in again from the page cache or the disk (the same bytes: the file never
    changes there). Ignored where libc's ``madvise`` is missing or refuses."""
    whole = min(size, buffer.size) // mmap.PAGESIZE * mmap.PAGESIZE
    if _LIBC is None or whole <= 0:
        return
    assert buffer.address % mmap.PAGESIZE == 0, "a map starts on a page"
    _LIBC[2](buffer.address, whole, _MADV_DONTNEED)  # type: ignore[operator]


def map_file(fd: int, size: int) -> pa.Buffer | None:
    """A read-only map of bytes ``[0, size)`` of the file open as ``fd``, as an Arrow
    buffer that keeps the map alive; None when no map can be made (no libc ``mmap``,
    ``limits.READ_MAPS_MAX`` reached, the kernel refused). The caller closes ``fd`` when it likes.
    The map may reach past the end of the file; no byte past the end may be read, and
    the file must never shrink below a byte that was read, while the map lives."""
    global _live
    assert size > 0
    if _LIBC is None or not ENABLED:
        return None
    with _lock:
        if _live >= limits.READ_MAPS_MAX:
            return None
        _live += 1
    address = _LIBC[0](None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)  # type: ignore[operator]
    if address is None or address == _MAP_FAILED:
        with _lock:
            _live -= 1
        return None
    return pa.foreign_buffer(address, size, base=_Mapping(address, size))
