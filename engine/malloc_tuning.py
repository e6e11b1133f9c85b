"""glibc malloc settings: for the ``topicbase serve`` process, and (round 35) any process
that opens a database.

Every 1000-row INSERT brings a ~1 MiB Bind message; asyncio's stream reader builds it from
256 KiB reads into a fresh buffer, copies it out and frees both. With glibc's defaults
each such block is a new ``mmap`` (or heap top trimmed back after use), so its pages are
faulted in and zeroed again on every statement: ~530 minor page faults and ~2 ms of
server CPU per statement, measured. Raising the mmap threshold to 32 MiB (glibc's
maximum) and the trim threshold to 128 MiB lets such blocks come from the heap and be
reused. Cost: up to ``TRIM_THRESHOLD_BYTES`` of freed memory may stay with each of glibc's
arenas (below).

The server process calls ``reuse_large_blocks`` (``sql.pgwire.server.serve``). Since round
35 ``configure`` applies the same once per process when a database opens, embedded too (as
``engine.gc_tuning`` tunes the collector): a DB-API consumer's ``fetchall`` of 20,000 1 KiB
messages frees its ~20 MB of ``bytes`` and the next poll's come back from pages trimmed
off the heap, ~0.23 page faults a message (70,000 for 300,000 messages, read at 0.9-1.0 us
of CPU a message against 0.41-0.47 without the faults, docs/scale.md round 35). Whether
that happened depended on what the process freed before: DuckDB's large parameter
buffers, freed, raise glibc's dynamic thresholds; Arrow's allocations do not.

Setting: ``TOPICBASE_MALLOC`` when ``configure`` runs: unset or ``tuned`` (the default)
applies the thresholds; ``glibc`` leaves glibc's own (so does an unknown value, with a
warning). A process that set either threshold through glibc's environment
(``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_``, or ``glibc.malloc.mmap_threshold``
/ ``trim_threshold`` in ``GLIBC_TUNABLES``) keeps its own; so does ``topicbase serve``'s
(it calls ``configure`` too, before its database opens). The trim threshold holds for
each of glibc's arenas (a thread may get its own), so up to that much freed memory may
stay with each.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys
import threading

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1  # mallopt parameters, from glibc's malloc.h
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 32 * 1024 * 1024  # glibc refuses more (HEAP_MAX_SIZE / 2)
TRIM_THRESHOLD_BYTES = 128 * 1024 * 1024
ENVIRONMENT_VARIABLE = "TOPICBASE_MALLOC"
MODES = ("tuned", "glibc")
_GLIBC_VARIABLES = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")
_GLIBC_TUNABLES = ("glibc.malloc.mmap_threshold", "glibc.malloc.trim_threshold")

_lock = threading.Lock()
_configured: str | None = None  # the mode the first ``configure`` applied


def reuse_large_blocks() -> bool:
    """Apply the settings above; True when glibc accepted both. Elsewhere (no glibc: musl,
    macOS) nothing changes and the answer is False."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        # the process's own symbols (libc's among them): no ``ldconfig -p`` child, as
        # ``ctypes.util.find_library`` runs
        mallopt = ctypes.CDLL(None).mallopt
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


def configure() -> str:
    """Apply ``reuse_large_blocks`` once per process when a database opens, unless
    ``TOPICBASE_MALLOC`` or glibc's own variables say otherwise (the module doc). Returns
    the mode in effect: ``tuned`` (applied, or refused by a libc without ``mallopt``) or
    ``glibc`` (left as it is); later calls return the first call's answer."""
    global _configured
    with _lock:
        if _configured is not None:
            return _configured
        mode = os.environ.get(ENVIRONMENT_VARIABLE, "").strip().lower() or "tuned"
        if mode not in MODES:
            log.warning("%s=%r is not one of %s: glibc's malloc left as it is",
                        ENVIRONMENT_VARIABLE, mode, ", ".join(MODES))  # fmt: skip
            mode = "glibc"
        tunables = os.environ.get("GLIBC_TUNABLES", "")
        if any(os.environ.get(name) for name in _GLIBC_VARIABLES) or any(
                name in tunables for name in _GLIBC_TUNABLES):  # fmt: skip
            mode = "glibc"  # the process chose for itself
        if mode == "tuned":
            reuse_large_blocks()
        _configured = mode
        return mode
