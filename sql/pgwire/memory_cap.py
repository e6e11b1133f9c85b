"""The ceiling on the ``topicbase serve`` process's memory (RLIMIT_DATA).

DuckDB's ``memory_limit`` bounds its buffer pool (hash tables, sorts, lists built by
aggregates), not a value a scalar function builds from a small input: ``repeat('x',
5e8)``, ``lpad``/``rpad``/``printf`` widths, the list forms of ``range`` and
``generate_series``, ``list_resize``. One ordinary user's one-line SELECT so took 1.1 GiB
(``repeat``) and 14 GiB (``range(2e8)`` as a list) under a 64 MiB limit (round 23,
measured), enough to have the kernel kill the server, with every session in it, or
other processes of the host. With RLIMIT_DATA set, such an allocation fails instead, and
DuckDB turns the failure into its out-of-memory error: the statement gets 53200 and its
session goes on (``tests/security/test_memory_cap.py``, checked in a process of its own).

The ceiling is ``limits.PROCESS_DATA_FRACTION`` of the machine's physical memory, well
above what the server's own bounds add up to (DuckDB's ``DUCKDB_MEMORY_FRACTION``, the
wire's held bytes, the transactions' staged memory), so it is a safety net against what
no other bound catches, not a budget: below it one statement can still take memory far
past ``memory_limit`` (the open finding in ``tests/security/test_open_findings_h3.py``).
RLIMIT_DATA counts private writable memory (heap, anonymous maps, thread stacks), not the
read-only maps of segment files. An existing lower limit is kept.

Only the server process calls this (``sql.pgwire.server.serve``); an embedding process
(tests, ``ServerThread``) keeps its own limits.
"""

from __future__ import annotations

import logging
import os
import sys

from storage.limits import PROCESS_DATA_FRACTION

log = logging.getLogger(__name__)


def physical_memory_bytes() -> int:
    """The machine's physical memory, 0 when the system does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def cap_process_data(bytes_max: int | None = None) -> int | None:
    """Lower RLIMIT_DATA's soft limit to ``bytes_max`` (default ``PROCESS_DATA_FRACTION``
    of physical memory), never raising a limit already lower; the limit in force, or None
    where there is none to set (not Linux, physical memory unknown)."""
    if not sys.platform.startswith("linux"):
        return None
    import resource  # POSIX only

    if bytes_max is None:
        physical = physical_memory_bytes()
        if physical <= 0:
            return None
        bytes_max = int(physical * PROCESS_DATA_FRACTION)
    soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    limit = bytes_max
    for existing in (soft, hard):
        if existing != resource.RLIM_INFINITY:
            limit = min(limit, existing)
    try:
        resource.setrlimit(resource.RLIMIT_DATA, (limit, hard))
    except (ValueError, OSError) as error:
        log.warning("could not cap the process's memory (RLIMIT_DATA): %s", error)
        return None
    return limit
