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

The ceiling is ``limits.PROCESS_DATA_FRACTION`` of the machine's physical memory, or of
the container's cgroup limit (``memory.max``, v1 ``memory.limit_in_bytes``) if that is
smaller (on a
small host DuckDB's share plus ``PROCESS_DATA_OVERHEAD_BYTES`` if that is more: the limit
counts address space, thread stacks whole), well above what the server's own bounds add
up to (DuckDB's ``DUCKDB_MEMORY_FRACTION``, the
wire's held bytes, the transactions' staged memory), so it is a safety net against what
no other bound catches, not a budget: below it one statement can still take memory far
past ``memory_limit`` (the open finding in ``tests/security/test_open_findings_h3.py``).
RLIMIT_DATA counts private writable memory (heap, anonymous maps, thread stacks), not the
read-only maps of segment files. An existing lower limit is kept.

Only the server process calls this (``sql.pgwire.server.serve``, and ``topicbase serve``
before it starts the Flight door, so both doors of that one process run under it); an
embedding process (tests, ``ServerThread``, a program that opens ``engine.api.Database``
itself, ``topicbase`` scripts) keeps its own limits. ``topicbase serve --memory-cap MIB``
sets another ceiling, ``--memory-cap 0`` none.

Why a failed allocation anywhere is safe for the store (round 24, ``docs/security_review.md``):
a ``MemoryError`` is an ``Exception`` like any other; before a commit point a commit rolls
back (nothing durable names it); past one the committer stops (``engine.commit``'s
``_stop``: no commit, no checkpoint until reopen, recovery publishes); a partition whose
write it interrupted is fenced (``PartitionLog.fence_if_unpublished``), as after an I/O
error. ``tests/engine/test_nomem_matrix.py`` raises one at every failpoint of the commit
paths among concurrent commits and checks the reopened store.
"""

from __future__ import annotations

import logging
import os
import sys

from storage.limits import (
    DUCKDB_MEMORY_FRACTION,
    PROCESS_DATA_FRACTION,
    PROCESS_DATA_OVERHEAD_BYTES,
)

log = logging.getLogger(__name__)


def physical_memory_bytes() -> int:
    """The machine's physical memory, 0 when the system does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


CGROUP_LIMIT_FILES = (
    "/sys/fs/cgroup/memory.max",  # cgroup v2
    "/sys/fs/cgroup/memory/memory.limit_in_bytes",  # cgroup v1
)


def cgroup_memory_limit(paths: tuple[str, ...] = CGROUP_LIMIT_FILES) -> int:
    """The container's memory limit in bytes from the first readable file of ``paths``;
    0 when none is set (``max``, a v1 value at or past 2**60, no file, unreadable)."""
    for path in paths:
        try:
            with open(path, encoding="ascii") as handle:
                text = handle.read().strip()
        except (OSError, ValueError):
            continue
        if not text.isdigit():
            return 0  # "max": no limit
        value = int(text)
        return value if 0 < value < 1 << 60 else 0
    return 0


def effective_memory_bytes(cgroup_paths: tuple[str, ...] = CGROUP_LIMIT_FILES) -> int:
    """The memory this process may use: physical memory, or the container's cgroup
    limit if one is set and smaller; 0 when neither is known."""
    physical = physical_memory_bytes()
    cgroup = cgroup_memory_limit(cgroup_paths)
    if cgroup and (physical <= 0 or cgroup < physical):
        return cgroup
    return physical


def default_cap(physical: int) -> int:
    """The cap for a machine of ``physical`` bytes: ``PROCESS_DATA_FRACTION`` of it, or
    DuckDB's share plus ``PROCESS_DATA_OVERHEAD_BYTES`` if more (small hosts)."""
    return max(int(physical * PROCESS_DATA_FRACTION),
               int(physical * DUCKDB_MEMORY_FRACTION) + PROCESS_DATA_OVERHEAD_BYTES)  # fmt: skip


def cap_process_data(bytes_max: int | None = None) -> int | None:
    """Lower RLIMIT_DATA's soft limit to ``bytes_max`` (default ``default_cap`` of physical
    memory; 0: no cap, nothing set), never raising a limit already lower; the
    limit in force, or None where there is none to set (not Linux, physical memory
    unknown, ``bytes_max`` 0)."""
    if not sys.platform.startswith("linux") or bytes_max == 0:
        return None
    import resource  # POSIX only

    if bytes_max is None:
        physical = effective_memory_bytes()
        if physical <= 0:
            return None
        bytes_max = default_cap(physical)
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
