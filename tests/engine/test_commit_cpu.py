"""The commit CPU (``engine.commit_cpu``, docs/move_profile.md round 27): which threads run
on it and when, and that it stays off where it cannot help or is not permitted."""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine import commit_cpu
from engine.commit_cpu import CommitCpu
from engine.database import Database

ALLOWED = frozenset(os.sched_getaffinity(0))
two_cpus = pytest.mark.skipif(len(ALLOWED) < 2, reason="needs a process allowed two CPUs")
MOVE = (
    "INSERT INTO TOPIC b (data) SELECT data FROM TOPIC a "
    "WITH (consumer = 'c', member = 'w1', max_messages = 5)"
)


def _mine() -> set[int]:
    return set(os.sched_getaffinity(0))


@pytest.fixture(autouse=True)
def _restore_affinity() -> Iterator[None]:
    yield
    os.sched_setaffinity(0, ALLOWED)


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@two_cpus
def test_a_window_pins_its_thread_to_the_highest_cpu_and_the_last_leave_frees_it() -> None:
    cpu = CommitCpu(set(ALLOWED), enabled=True)
    assert cpu.cpu == max(ALLOWED)
    outer = cpu.enter()
    assert outer == threading.get_native_id()
    assert _mine() == {max(ALLOWED)}
    inner = cpu.enter()  # nested: still pinned, one pin counted
    cpu.leave(inner)
    assert _mine() == {max(ALLOWED)}
    assert cpu.pinned() == {outer}
    cpu.leave(outer)
    assert _mine() == set(ALLOWED)
    assert cpu.pinned() == set()
    assert cpu.pins == 1


@two_cpus
def test_a_window_left_from_another_thread_frees_the_pinned_one() -> None:
    cpu = CommitCpu(set(ALLOWED), enabled=True)
    entered: list[int | None] = []
    go_on, checked = threading.Event(), threading.Event()
    seen: list[set[int]] = []

    def committer() -> None:
        entered.append(cpu.enter())
        go_on.set()
        checked.wait(10)
        seen.append(_mine())

    thread = threading.Thread(target=committer)
    thread.start()
    assert go_on.wait(10)
    cpu.leave(entered[0])  # e.g. a session closed by another thread
    checked.set()
    thread.join(10)
    assert seen == [set(ALLOWED)]


def test_off_with_one_cpu_and_off_by_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[int, set[int]]] = []

    def record(tid: int, cpus: set[int]) -> None:
        calls.append((tid, cpus))

    one = CommitCpu({0}, set_affinity=record)
    assert not one.enabled and one.enter() is None
    monkeypatch.setenv(commit_cpu.ENVIRONMENT_VARIABLE, "0")
    off = CommitCpu({0, 1}, set_affinity=record)
    assert not off.enabled and off.enter() is None
    off.leave(None)
    assert calls == []
    monkeypatch.setenv(commit_cpu.ENVIRONMENT_VARIABLE, "1")
    assert CommitCpu({0, 1}, set_affinity=record).enabled


def test_a_refused_affinity_turns_it_off_for_good() -> None:
    calls: list[set[int]] = []

    def refuse(tid: int, cpus: set[int]) -> None:
        calls.append(cpus)
        raise PermissionError(1, "Operation not permitted")

    cpu = CommitCpu({0, 1}, enabled=True, set_affinity=refuse)
    assert cpu.enter() is None
    assert not cpu.enabled
    assert isinstance(cpu.refused, PermissionError)
    assert cpu.enter() is None  # no second attempt
    assert calls == [{1}]
    assert cpu.pinned() == set()


@two_cpus
def test_threads_started_inside_a_window_get_every_cpu_back_at_the_next_scan() -> None:
    clock = _Clock()
    cpu = CommitCpu(set(ALLOWED), enabled=True, scan_s=1.0, clock=clock)
    stop = threading.Event()
    started = threading.Event()
    child_tid: list[int] = []

    def child() -> None:
        child_tid.append(threading.get_native_id())
        started.set()
        stop.wait(10)

    tid = cpu.enter()
    thread = threading.Thread(target=child)
    thread.start()  # inherits the commit CPU
    assert started.wait(10)
    assert set(os.sched_getaffinity(child_tid[0])) == {cpu.cpu}
    cpu.leave(tid)  # before the scan is due: the child keeps what it inherited
    assert set(os.sched_getaffinity(child_tid[0])) == {cpu.cpu}
    clock.now = 2.0
    tid = cpu.enter()
    cpu.leave(tid)  # the scan is due: the new thread is freed, not the windows' thread
    try:
        assert set(os.sched_getaffinity(child_tid[0])) == set(ALLOWED)
        assert cpu.freed == 1
        assert _mine() == set(ALLOWED)
    finally:
        stop.set()
        thread.join(10)


@two_cpus
def test_the_scan_leaves_threads_in_a_window_and_threads_it_saw_before() -> None:
    cpu = CommitCpu(set(ALLOWED), enabled=True, scan_s=3600.0)
    stop = threading.Event()
    ready = threading.Barrier(3)
    tids: dict[str, int] = {}

    def in_window() -> None:
        tids["window"] = threading.get_native_id()
        cpu.enter()  # stays in its window until the end of the test
        ready.wait(10)
        stop.wait(10)

    def old() -> None:
        tids["old"] = threading.get_native_id()
        ready.wait(10)
        stop.wait(10)

    threads = [threading.Thread(target=in_window), threading.Thread(target=old)]
    for thread in threads:
        thread.start()
    ready.wait(10)
    try:
        cpu.free_inherited()  # sees both: the windowed one is left pinned
        assert set(os.sched_getaffinity(tids["window"])) == {cpu.cpu}
        os.sched_setaffinity(tids["old"], {cpu.cpu})  # pinned by someone else, later
        assert cpu.free_inherited() == 0
        assert set(os.sched_getaffinity(tids["old"])) == {cpu.cpu}
    finally:
        stop.set()
        for thread in threads:
            thread.join(10)


# -- the sessions ------------------------------------------------------------------------
@pytest.fixture
def database(tmp_path: Path) -> Iterator[Database]:
    previous = commit_cpu.set_process_commit_cpu(CommitCpu(set(ALLOWED), enabled=True))
    database = Database.open(str(tmp_path / "data"))
    session = database.connect()
    session.execute(
        "CREATE TOPIC a (CONSUMER c) WITH (min_active_partitions = 1); "
        "CREATE TOPIC b WITH (min_active_partitions = 1); "
        "CREATE TABLE t (k INTEGER PRIMARY KEY, v INTEGER)"
    )
    values = ", ".join(f"('m{i}')" for i in range(40))
    session.execute(f"INSERT INTO TOPIC a (data) VALUES {values}")
    session.close()
    database.commit_cpu.pins = 0  # the setup's DDL and writes pinned too
    yield database
    database.close()
    commit_cpu.set_process_commit_cpu(previous)


@two_cpus
def test_a_move_transaction_runs_on_the_commit_cpu_from_its_move_to_its_commit(
    database: Database,
) -> None:
    cpu = database.commit_cpu
    session = database.connect()
    try:
        session.execute("BEGIN")
        assert _mine() == set(ALLOWED)  # BEGIN alone pins nothing
        session.execute("SELECT count(*) FROM t")
        assert _mine() == set(ALLOWED)  # nor does a plain query
        session.execute(MOVE)
        assert _mine() == {cpu.cpu}
        session.execute("SELECT count(*) FROM t")
        assert _mine() == {cpu.cpu}  # the window lasts to the transaction's end
        session.execute("COMMIT")
        assert _mine() == set(ALLOWED)
        assert cpu.pins == 1 and cpu.pinned() == set()
        session.execute("BEGIN")
        session.execute(MOVE)
        assert _mine() == {cpu.cpu}
        session.execute("ROLLBACK")
        assert _mine() == set(ALLOWED)
    finally:
        session.close()


@two_cpus
def test_autocommit_writes_pin_for_their_statement_and_queries_never(
    database: Database,
) -> None:
    cpu = database.commit_cpu
    session = database.connect()
    try:
        session.execute("SELECT count(*) FROM t")
        session.execute("SELECT data FROM TOPIC a")  # a peek: no consumer
        assert cpu.pins == 0
        session.execute("INSERT INTO t VALUES (1, 1)")
        assert cpu.pins == 1
        session.execute(MOVE)
        assert cpu.pins == 2
        assert _mine() == set(ALLOWED) and cpu.pinned() == set()
        with pytest.raises(Exception, match=r"(?i)duplicate|constraint"):
            session.execute("INSERT INTO t VALUES (1, 2)")  # fails: the window ends too
        assert _mine() == set(ALLOWED) and cpu.pinned() == set()
    finally:
        session.close()


@two_cpus
def test_a_consumer_read_alone_pins_nothing_and_still_commits_its_offsets(
    database: Database,
) -> None:
    """A consumer's read (autocommit, or in a transaction with nothing but reads) runs
    unpinned: its one offset commit has no other committer to hand the lock to
    (docs/consume_wire.md round 28); its offsets still move."""
    cpu = database.commit_cpu
    session = database.connect()
    try:
        read = "SELECT data FROM TOPIC a WITH (consumer = 'c', max_messages = 5)"
        first = session.execute(read)
        assert cpu.pins == 0 and _mine() == set(ALLOWED)
        assert first[-1].table.column("data").to_pylist() == [b"m0", b"m1", b"m2", b"m3", b"m4"]
        session.execute("BEGIN")
        session.execute(read)
        assert _mine() == set(ALLOWED)
        session.execute("COMMIT")
        assert cpu.pins == 0
        third = session.execute(read)
        messages = third[-1].table.column("data").to_pylist()
        assert messages == [b"m10", b"m11", b"m12", b"m13", b"m14"]
        session.execute("BEGIN")
        session.execute(read)
        session.execute("INSERT INTO t VALUES (1, 1)")  # a write in the same transaction
        assert _mine() == {cpu.cpu} and cpu.pins == 1
        session.execute("COMMIT")
        assert _mine() == set(ALLOWED)
    finally:
        session.close()


@two_cpus
def test_a_failed_transaction_and_a_closed_session_end_their_windows(
    database: Database,
) -> None:
    cpu = database.commit_cpu
    session = database.connect()
    session.execute("BEGIN")
    session.execute(MOVE)
    with pytest.raises(Exception, match=r"(?i)no_such|not exist|not found"):
        session.execute("INSERT INTO no_such VALUES (1)")
    assert _mine() == {cpu.cpu}  # FAILED: still in the transaction until ROLLBACK
    session.execute("ROLLBACK")
    assert _mine() == set(ALLOWED)
    session.execute("BEGIN")
    session.execute(MOVE)
    session.close()  # rolls back
    assert _mine() == set(ALLOWED) and cpu.pinned() == set()


def test_off_the_session_commits_as_before(tmp_path: Path) -> None:
    calls: list[set[int]] = []

    def refuse(tid: int, cpus: set[int]) -> None:
        calls.append(cpus)
        raise PermissionError(1, "Operation not permitted")

    previous = commit_cpu.set_process_commit_cpu(
        CommitCpu({0, 1}, enabled=True, set_affinity=refuse)
    )
    database = Database.open(str(tmp_path / "data"))
    try:
        session = database.connect()
        session.execute("CREATE TABLE t (k INTEGER)")
        session.execute("BEGIN")
        session.execute("INSERT INTO t VALUES (1)")
        session.execute("COMMIT")
        session.execute("INSERT INTO t VALUES (2)")
        assert session.execute("SELECT count(*) FROM t")[-1].table.column(0).to_pylist() == [2]
        session.close()
        assert len(calls) == 1 and not database.commit_cpu.enabled
    finally:
        database.close()
        commit_cpu.set_process_commit_cpu(previous)


@pytest.mark.skipif(commit_cpu._LIBC_SET_AFFINITY is None, reason="no libc sched_setaffinity")
def test_the_affinity_call_is_libcs_and_acts_as_oss() -> None:
    """The default setter is libc's (round 33: called through ``ctypes.CDLL``, which lets go
    of the interpreter lock for the call, as ctypes documents; not checked here); it moves
    the thread as ``os.sched_setaffinity`` does and fails as it does."""
    set_affinity = commit_cpu._LIBC_SET_AFFINITY
    assert set_affinity is not None
    assert CommitCpu(set(ALLOWED), enabled=True)._set is set_affinity
    for cpus in ({min(ALLOWED)}, {max(ALLOWED)}, set(ALLOWED)):
        set_affinity(0, cpus)
        assert _mine() == cpus
    set_affinity(threading.get_native_id(), {min(ALLOWED)})  # by thread id, as ``leave`` does
    assert _mine() == {min(ALLOWED)}
    with pytest.raises(OSError) as empty:
        set_affinity(0, set())
    assert empty.value.errno == errno.EINVAL
    with pytest.raises(OSError):
        set_affinity(0, {-1})
    with pytest.raises(ProcessLookupError):
        set_affinity(2**22 + 12345, set(ALLOWED))  # above the kernel's largest pid
    assert _mine() == {min(ALLOWED)}  # a refused call changed nothing
