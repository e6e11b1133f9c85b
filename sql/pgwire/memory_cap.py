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
smaller, or, if more (small hosts), what the server reserves when busy within its own
bounds: DuckDB's share (``DUCKDB_MEMORY_FRACTION``) plus ``PROCESS_DATA_OVERHEAD_BYTES``
plus ``PROCESS_DATA_PER_CONNECTION_BYTES`` for each of ``max_connections`` (the limit
counts address space, thread stacks whole), but never more than
``PROCESS_DATA_CEILING_FRACTION`` of that memory: a cap above the host's memory would catch
nothing. So it is a safety net against what no other
bound catches, not a budget: below it one statement can still take memory far past
``memory_limit`` (the open finding in ``tests/security/test_open_findings_h3.py``).
RLIMIT_DATA counts private writable memory (heap, anonymous maps, thread stacks), not the
read-only maps of segment files. An existing lower limit is kept.

Two things keep the server's own address space small enough for that floor to stay under
a small host's memory (round 26): under a cap below ``SYSTEM_POOL_CAP_BYTES``,
``arrow_pool_reserves_lazily`` has pyarrow allocate through the system allocator (its
default pool, mimalloc, reserves a ~1 GiB arena up front, but is faster on the wire's
paths, so larger caps keep it), which must happen before pyarrow is first imported, so
``topicbase serve`` calls it before it imports the server; and each wire connection's
thread has a stack of ``limits.CONNECTION_THREAD_STACK_BYTES``
(``sql.pgwire.connection.own_thread``), not 8 MiB.

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
from collections.abc import MutableMapping

from storage.limits import (
    CONNECTIONS_MAX_DEFAULT,
    DUCKDB_MEMORY_FRACTION,
    PROCESS_DATA_CEILING_FRACTION,
    PROCESS_DATA_FRACTION,
    PROCESS_DATA_OVERHEAD_BYTES,
    PROCESS_DATA_PER_CONNECTION_BYTES,
)

log = logging.getLogger(__name__)

# pyarrow's default pool (mimalloc) commits a ~1 GiB arena of address space when it first
# allocates (VmData 1.3 GiB at rest, 0.3 GiB without, the same resident memory). The system
# allocator has none, and with it Arrow's buffers come from the heap ``engine.malloc_tuning``
# tunes; but it is slower on the wire's hot paths: round 26 (lead), ``bench.run --only
# pgwire,streams`` alternated, 5 pairs, load 2.5-3.4: wire consume (binary) 634 k msgs/s
# median with mimalloc against 461 k with the system allocator (mimalloc ahead in all 5),
# SELECT 1 p50 139 against 180 us; ``MIMALLOC_ARENA_EAGER_COMMIT=0`` in between (2 runs).
# So the system allocator is chosen only where the arena would be a large share of the cap.
ARROW_POOL_SETTING = ("ARROW_DEFAULT_MEMORY_POOL", "system")
# Caps below this take the system allocator (the 1 GiB arena would be an eighth or more).
SYSTEM_POOL_CAP_BYTES = 8 << 30


def arrow_pool_reserves_lazily(
    cap_bytes: int | None = 0, environ: MutableMapping[str, str] = os.environ
) -> bool:
    """Set ``ARROW_POOL_SETTING`` in ``environ`` when the process will run under a cap
    ``cap_bytes`` below ``SYSTEM_POOL_CAP_BYTES`` (None or 0: no cap, nothing set), unless
    the user chose pyarrow's pool or tuned mimalloc (``ARROW_DEFAULT_MEMORY_POOL`` or any
    ``MIMALLOC_*`` set: theirs wins) or pyarrow is imported already (its pool is chosen
    then: too late). True when set."""
    if not cap_bytes or cap_bytes >= SYSTEM_POOL_CAP_BYTES:
        return False
    if "pyarrow" in sys.modules:
        return False
    if any(name == ARROW_POOL_SETTING[0] or name.startswith("MIMALLOC_") for name in environ):
        return False
    name, value = ARROW_POOL_SETTING
    environ[name] = value
    return True


def planned_cap(memory_cap_mib: int | None, connections: int = CONNECTIONS_MAX_DEFAULT) -> int:
    """The cap ``cap_process_data`` will set for ``--memory-cap`` (MiB; None: the default,
    0: none), in bytes (0: none), without importing anything heavy: ``topicbase serve``
    chooses pyarrow's pool from it before pyarrow is imported."""
    if memory_cap_mib is not None:
        return memory_cap_mib << 20
    if not sys.platform.startswith("linux"):
        return 0
    physical = effective_memory_bytes()
    return default_cap(physical, connections) if physical > 0 else 0


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


def default_cap(physical: int, connections: int = CONNECTIONS_MAX_DEFAULT) -> int:
    """The cap for a machine of ``physical`` bytes serving at most ``connections``
    sessions: ``PROCESS_DATA_FRACTION`` of it, or what the server reserves when busy if
    more (small hosts: DuckDB's share, ``PROCESS_DATA_OVERHEAD_BYTES`` and
    ``PROCESS_DATA_PER_CONNECTION_BYTES`` a session), but never more than
    ``PROCESS_DATA_CEILING_FRACTION`` of it: always below the machine's memory."""
    busy = (int(physical * DUCKDB_MEMORY_FRACTION) + PROCESS_DATA_OVERHEAD_BYTES
            + connections * PROCESS_DATA_PER_CONNECTION_BYTES)  # fmt: skip
    return min(max(int(physical * PROCESS_DATA_FRACTION), busy),
               int(physical * PROCESS_DATA_CEILING_FRACTION))  # fmt: skip


def cap_process_data(bytes_max: int | None = None,
                     connections: int = CONNECTIONS_MAX_DEFAULT) -> int | None:  # fmt: skip
    """Lower RLIMIT_DATA's soft limit to ``bytes_max`` (default ``default_cap`` of physical
    memory and ``connections``; 0: no cap, nothing set), never raising a limit already lower; the
    limit in force, or None where there is none to set (not Linux, physical memory
    unknown, ``bytes_max`` 0)."""
    if not sys.platform.startswith("linux") or bytes_max == 0:
        return None
    import resource  # POSIX only

    if bytes_max is None:
        physical = effective_memory_bytes()
        if physical <= 0:
            return None
        bytes_max = default_cap(physical, connections)
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
