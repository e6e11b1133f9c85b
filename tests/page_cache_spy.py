"""A spy on the page-cache drop (``storage.page_cache``), shared by the storage and engine
tests: the drop turned on with a small kept tail, every ``POSIX_FADV_DONTNEED`` recorded
as (file, start, end)."""

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
