"""A spy on the page-cache drop (``storage.page_cache``), shared by the storage and engine
tests: the drop turned on with a small kept tail, every ``POSIX_FADV_DONTNEED`` recorded
as (file, start, end); and which pages of a file the page cache holds (``resident``)."""

from __future__ import annotations

import os

import pytest

from storage import limits, page_cache


def record_drops(monkeypatch: pytest.MonkeyPatch, keep: int) -> list[tuple[str, int, int]]:
    """Turn the drop on (keep ``keep`` bytes); the list every DONTNEED is appended to."""
    calls: list[tuple[str, int, int]] = []
    real = os.posix_fadvise

    def spy(fd: int, offset: int, length: int, advice: int) -> None:
        if advice == os.POSIX_FADV_DONTNEED:
            calls.append((os.readlink(f"/proc/self/fd/{fd}"), offset, offset + length))
        real(fd, offset, length, advice)

    monkeypatch.setattr(os, "posix_fadvise", spy)
    monkeypatch.setattr(page_cache, "ENABLED", True)
    monkeypatch.setattr(limits, "PAGE_CACHE_KEEP_BYTES", keep)
    return calls


def resident(path: str) -> list[bool]:
    """Per page of the file, whether it is in the page cache (``mincore(2)`` over a
    private map made here, not a reader's map)."""
    import ctypes
    import mmap

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    with open(path, "rb") as file:
        size = os.fstat(file.fileno()).st_size
        region = mmap.mmap(file.fileno(), size, access=mmap.ACCESS_COPY)
    try:
        pages = -(-size // mmap.PAGESIZE)
        vector = ctypes.create_string_buffer(pages)
        address = ctypes.addressof(ctypes.c_char.from_buffer(region))
        assert libc.mincore(address, size, vector) == 0, ctypes.get_errno()
        return [bool(byte & 1) for byte in vector.raw]
    finally:
        region.close()
