"""glibc malloc settings for the ``topicbase serve`` process.

Every 1000-row INSERT brings a ~1 MiB Bind message; asyncio's stream reader builds it from
256 KiB reads into a fresh buffer, copies it out and frees both. With glibc's defaults
each such block is a new ``mmap`` (or heap top trimmed back after use), so its pages are
faulted in and zeroed again on every statement: ~530 minor page faults and ~2 ms of
server CPU per statement, measured. Raising the mmap threshold to 32 MiB (glibc's
maximum) and the trim threshold to 128 MiB lets such blocks come from the heap and be
reused. Cost: up to ``TRIM_THRESHOLD_BYTES`` of freed memory stays with the process.

Only the server process calls this (``sql.pgwire.server.serve``); an embedding process
(tests, ``ServerThread``) keeps its own settings.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import sys

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1  # mallopt parameters, from glibc's malloc.h
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 32 * 1024 * 1024  # glibc refuses more (HEAP_MAX_SIZE / 2)
TRIM_THRESHOLD_BYTES = 128 * 1024 * 1024


def reuse_large_blocks() -> bool:
    """Apply the settings above; True when glibc accepted both. Elsewhere (no glibc: musl,
    macOS) nothing changes and the answer is False."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    applied = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(
        mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)
    )
    if not applied:
        log.info("malloc tuning refused: large message buffers are mapped afresh each time")
    return applied
