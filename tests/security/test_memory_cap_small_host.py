"""Round 26 (H4): ``topicbase serve``'s memory cap works on a small host.

The cap (RLIMIT_DATA) counts address space. Two things the server reserved without using
kept its floor at 40 % + 6 GiB, above the memory of any host under ~8 GiB: pyarrow's
default pool committing a ~1 GiB arena up front, and 8 MiB thread stacks per connection.
Now ``topicbase serve`` has pyarrow use the system allocator (unless the user chose), its
connection threads have ``limits.CONNECTION_THREAD_STACK_BYTES`` stacks, and the default cap
is what the server reserves busy, at most 90 % of the host's memory. Each server runs in a
process of its own (RLIMIT_DATA is process-wide).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import psycopg
import pytest

from sql.pgwire import memory_cap
from storage import limits
from tests.security.test_memory_cap import _serve, _stop

LINUX = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and RLIMIT_DATA")
GIB = 1 << 30


def _status(pid: int, field: str) -> int:
    """A ``/proc/<pid>/status`` field in KiB (or a count)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def _options(port: int) -> dict[str, object]:
    return {"host": "127.0.0.1", "port": port, "user": "alice", "dbname": "x",
            "autocommit": True, "connect_timeout": 30}  # fmt: skip


# -- step 1: pyarrow's pool ------------------------------------------------------------------
@LINUX
def test_serve_at_rest_reserves_no_arrow_arena(tmp_path: Path) -> None:
    """Both doors, at rest, after a first session read Arrow data: well under the ~1.3 GiB
    of VmData pyarrow's eager mimalloc arena made it (round 25: 1367 MiB; now ~0.5 GiB)."""
    environment_before = {name: os.environ.get(name) for name in ("ARROW_DEFAULT_MEMORY_POOL",)}
    assert all(value is None for value in environment_before.values()), "the runner chose"
    server, port, _ = _serve(tmp_path / "data", "--memory-cap", "2048")  # a small host's cap
    try:
        with psycopg.connect(**_options(port)) as session:
            session.execute("CREATE TOPIC a")
            session.execute("INSERT INTO TOPIC a (data) SELECT 'm' || i FROM range(1000) t(i)")
            assert session.execute("SELECT count(*) FROM TOPIC a").fetchone() == (1000,)
            vm_data_mib = _status(server.pid, "VmData") >> 10
    finally:
        _stop(server)
    assert vm_data_mib < 900, vm_data_mib


def test_the_users_allocator_choice_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "pyarrow")  # as in `topicbase serve` before the import
    small = 2 << 30  # a 2 GiB host's cap
    chosen = {"ARROW_DEFAULT_MEMORY_POOL": "mimalloc"}
    assert not memory_cap.arrow_pool_reserves_lazily(small, chosen)
    assert chosen == {"ARROW_DEFAULT_MEMORY_POOL": "mimalloc"}
    tuned = {"MIMALLOC_ARENA_EAGER_COMMIT": "1"}
    assert not memory_cap.arrow_pool_reserves_lazily(small, tuned)
    assert tuned == {"MIMALLOC_ARENA_EAGER_COMMIT": "1"}
    unset = {"PATH": "/bin"}
    assert memory_cap.arrow_pool_reserves_lazily(small, unset)
    name, value = memory_cap.ARROW_POOL_SETTING
    assert unset == {"PATH": "/bin", name: value}


def test_a_large_cap_or_none_keeps_mimalloc(monkeypatch: pytest.MonkeyPatch) -> None:
    # mimalloc is faster on the wire's paths (round 26): only a small cap trades it away
    monkeypatch.delitem(sys.modules, "pyarrow")
    for cap in (0, None, memory_cap.SYSTEM_POOL_CAP_BYTES, 64 << 30):
        unset: dict[str, str] = {}
        assert not memory_cap.arrow_pool_reserves_lazily(cap, unset)
        assert unset == {}
    assert memory_cap.planned_cap(0) == 0
    assert memory_cap.planned_cap(2048) == 2 << 30


def test_serve_reads_the_cap_before_argparse() -> None:
    from sql.console import _early_memory_cap

    assert _early_memory_cap(["--port", "0", "--memory-cap", "1843"]) == 1843
    assert _early_memory_cap(["--memory-cap=0"]) == 0
    assert _early_memory_cap(["--memory-cap", "-5"]) is None  # argparse refuses it later
    assert _early_memory_cap(["--port", "5433"]) is None


def test_too_late_once_pyarrow_is_imported() -> None:
    import pyarrow  # noqa: F401  (the pool is chosen at import)

    unset: dict[str, str] = {}
    assert not memory_cap.arrow_pool_reserves_lazily(2 << 30, unset)
    assert unset == {}


# -- step 2: the connection threads' stacks --------------------------------------------------
def _stack_map_bytes(pid: int, tid: str) -> int:
    """The size of the mapping that holds thread ``tid``'s stack pointer (read while it
    waits in a system call: ``/proc/<pid>/task/<tid>/syscall``)."""
    for _ in range(500):
        fields = Path(f"/proc/{pid}/task/{tid}/syscall").read_text().split()
        if len(fields) > 2:  # else "running": not in a system call right now
            break
        time.sleep(0.01)
    else:
        raise AssertionError(f"thread {tid} never waited")
    pointer = int(fields[-2], 16)
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        low, high = (int(part, 16) for part in line.split()[0].split("-"))
        if low <= pointer < high:
            return high - low
    raise AssertionError("no mapping holds the stack pointer")


# The chains that need the most stack (measured round 26: a JSON ``->`` chain ~2.4 KiB a
# level in DuckDB's transformer and binder, ``NOT`` and ``+`` ~1.5 KiB): head, link, tail.
CHAINS = {
    "json": ("'{}'::JSON", "->'a'", ""),
    "not": ("", "NOT ", "true"),
    "plus": ("", "1+", "1"),
}
SEARCHED = 40  # how far below DuckDB's expression depth the deepest allowed chain is looked for


def _chain(name: str, depth: int) -> str:
    head, link, tail = CHAINS[name]
    return "SELECT " + head + link * depth + tail


def _deepest_allowed(session: psycopg.Connection, name: str) -> int:
    """The longest chain ``name`` the server runs (each longer one tried is 54001)."""
    top = limits.DUCKDB_EXPRESSION_DEPTH_MAX
    for depth in range(top, top - SEARCHED, -1):
        try:
            session.execute(_chain(name, depth)).fetchall()
        except psycopg.errors.StatementTooComplex:
            continue
        return depth
    raise AssertionError(f"no {name} chain ran within {SEARCHED} of {top}")


@LINUX
def test_the_deepest_statements_run_on_the_smaller_stacks(tmp_path: Path) -> None:
    """A connection's own thread has a stack of ``CONNECTION_THREAD_STACK_BYTES`` (not 8 MiB),
    and the chains that need the most stack, at the deepest depth allowed, run on it over
    the wire (simple and extended protocol); one level more is 54001, not a crash, and the
    connection and the server go on."""
    server, port, _ = _serve(tmp_path / "data", "--memory-cap", "0")
    try:
        tasks_before = set(os.listdir(f"/proc/{server.pid}/task"))
        with psycopg.connect(**_options(port)) as session:
            session.execute("SELECT 1")
            time.sleep(0.3)  # the login's worker thread ends once the socket moved
            new = set(os.listdir(f"/proc/{server.pid}/task")) - tasks_before
            sizes = sorted(_stack_map_bytes(server.pid, tid) for tid in new
                           if os.path.exists(f"/proc/{server.pid}/task/{tid}"))  # fmt: skip
            # its own thread; DuckDB's threads, started with the first session, keep theirs
            assert limits.CONNECTION_THREAD_STACK_BYTES in sizes, sizes
            for name in CHAINS:
                depth = _deepest_allowed(session, name)
                for cursor in (psycopg.ClientCursor(session), session.cursor()):
                    assert len(cursor.execute(_chain(name, depth)).fetchall()) == 1
                with pytest.raises(psycopg.errors.StatementTooComplex):
                    session.execute(_chain(name, depth + 1))
                assert session.execute("SELECT 41 + 1").fetchone() == (42,)
        assert server.poll() is None
        with psycopg.connect(**_options(port)) as other:
            assert other.execute("SELECT 1").fetchone() == (1,)
    finally:
        _stop(server)


# -- step 3: the default cap -----------------------------------------------------------------
def _busy(physical: int, connections: int) -> int:
    """What the server reserves busy: DuckDB's share, the fixed part, a part a session."""
    return (int(physical * limits.DUCKDB_MEMORY_FRACTION) + limits.PROCESS_DATA_OVERHEAD_BYTES
            + connections * limits.PROCESS_DATA_PER_CONNECTION_BYTES)  # fmt: skip


@pytest.mark.parametrize("physical_gib", [2, 4, 16])
@pytest.mark.parametrize("connections", [20, limits.CONNECTIONS_MAX_DEFAULT, 400])
def test_the_default_cap_is_below_the_hosts_memory(physical_gib: int, connections: int) -> None:
    physical = physical_gib * GIB
    cap = memory_cap.default_cap(physical, connections)
    assert cap <= physical * limits.PROCESS_DATA_CEILING_FRACTION < physical
    # the busy server fits under it wherever that fits under the ceiling
    if _busy(physical, connections) <= physical * limits.PROCESS_DATA_CEILING_FRACTION:
        assert cap >= _busy(physical, connections)
    assert cap >= int(physical * limits.PROCESS_DATA_FRACTION)


def test_the_default_cap_on_2_4_and_16_gib_hosts() -> None:
    """The figures (MiB) as README states them: a 2 GiB host with the default 100
    connections is held at 90 % (its busy floor, 2187 MiB, is more); with 20 connections
    the floor (819 + 768 + 120) is under it; 4 and 16 GiB hosts get 75 %."""
    mib = 1 << 20
    assert memory_cap.default_cap(2 * GIB) // mib == 1843  # 0.9 x 2048
    assert memory_cap.default_cap(2 * GIB, 20) // mib == 1707  # 819 + 768 + 20 x 6
    assert memory_cap.default_cap(4 * GIB) // mib == 3072  # 0.75 x 4096 (busy: 3006)
    assert memory_cap.default_cap(16 * GIB) // mib == 12288  # 0.75 x 16384
    # round 24's floor was 40 % + 6 GiB: above the memory of all three
    assert all(memory_cap.default_cap(gib * GIB) < gib * GIB for gib in (2, 4, 16))


@LINUX
def test_a_server_under_a_2_gib_hosts_cap_serves(tmp_path: Path) -> None:
    """``topicbase serve`` under the default cap of a 2 GiB host (given as ``--memory-cap``):
    50 sessions, a topic written and consumed, a DuckDB query, a refused huge statement
    (53200), after which it still serves all of that."""
    cap_mib = memory_cap.default_cap(2 * GIB) >> 20
    server, port, _ = _serve(tmp_path / "data", "--memory-cap", str(cap_mib))
    sessions: list[psycopg.Connection] = []
    try:
        limits_text = Path(f"/proc/{server.pid}/limits").read_text()
        (line,) = [row for row in limits_text.splitlines() if row.startswith("Max data size")]
        assert int(line.split()[3]) == cap_mib << 20
        first = psycopg.connect(**_options(port))
        sessions.append(first)
        first.execute("CREATE TOPIC a (CONSUMER c)")
        first.execute("CREATE TABLE k AS SELECT i, i % 7 AS g FROM range(1000000) t(i)")
        for _ in range(49):
            sessions.append(psycopg.connect(**_options(port)))
        for index, session in enumerate(sessions):
            session.execute("INSERT INTO TOPIC a (data) SELECT %s || '-' || i FROM range(100) "
                            "t(i)", [f"s{index}"])  # fmt: skip
            assert session.execute("SELECT 1").fetchone() == (1,)

        def round_of_work(session: psycopg.Connection, expected_messages: int) -> None:
            read = session.execute("SELECT data FROM TOPIC a WITH (consumer = 'c', "
                                   "max_messages = 100000)").fetchall()  # fmt: skip
            assert len(read) == expected_messages
            groups = session.execute("SELECT g, count(*) FROM k GROUP BY g ORDER BY g").fetchall()
            assert groups == [(g, len(range(g, 1000000, 7))) for g in range(7)]

        round_of_work(first, 50 * 100)
        assert _status(server.pid, "VmData") << 10 < cap_mib << 20
        with pytest.raises(psycopg.Error) as caught:
            first.execute("SELECT length(repeat('x', 1500000000)) AS n")
        assert caught.value.sqlstate == "53200", caught.value
        assert server.poll() is None
        # it still serves: every session, a new one, a topic write and read, DuckDB
        for session in sessions:
            assert session.execute("SELECT 41 + 1").fetchone() == (42,)
        late = psycopg.connect(**_options(port))
        sessions.append(late)
        late.execute("INSERT INTO TOPIC a (data) SELECT 'late' || i FROM range(10) t(i)")
        round_of_work(late, 10)
    finally:
        for session in sessions:
            session.close()
        _stop(server)
