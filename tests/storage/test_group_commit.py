"""Tests of storage/group_commit.py and of the GROUP fsync policy of a partition."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from storage.config import FsyncPolicy
from storage.errors import InvalidParameterValueError, PartitionFencedError, StorageIOError
from storage.fs import FileSystem
from storage.group_commit import GroupCommitter, Request
from storage.partition_log import PartitionLog

THREADS = 8


def _run_threads(count: int, target: Callable[[int], Any]) -> list[Any]:
    """Run ``target(i)`` in ``count`` threads started together; results or exceptions."""
    barrier = threading.Barrier(count)
    outcomes: list[Any] = [None] * count

    def run(index: int) -> None:
        barrier.wait()
        try:
            outcomes[index] = target(index)
        except BaseException as error:  # handed back to the test
            outcomes[index] = error

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
        assert not thread.is_alive()
    return outcomes


# -- the committer alone -----------------------------------------------------------------------


def test_single_submit_runs_one_flush_and_returns_its_result() -> None:
    flushed: list[list[Any]] = []

    def flush(requests: list[Request]) -> None:
        flushed.append([r.payload for r in requests])
        for request in requests:
            request.result = request.payload * 2

    committer = GroupCommitter(flush)
    assert committer.submit(21) == 42
    assert flushed == [[21]] and committer.rounds == 1


def test_concurrent_submits_share_flushes() -> None:
    def flush(requests: list[Request]) -> None:
        time.sleep(0.01)  # a slow "fsync": others queue up meanwhile
        for request in requests:
            request.result = request.payload

    committer = GroupCommitter(flush)
    outcomes = _run_threads(THREADS, lambda i: [committer.submit((i, n)) for n in range(5)])
    assert outcomes == [[(i, n) for n in range(5)] for i in range(THREADS)]
    assert committer.rounds < THREADS * 5


def test_flush_error_propagates_to_every_waiter() -> None:
    entered = threading.Event()

    def flush(requests: list[Request]) -> None:
        entered.set()
        time.sleep(0.05)
        raise StorageIOError("disk on fire", path="/dev/null")

    committer = GroupCommitter(flush)
    outcomes = _run_threads(THREADS, lambda i: committer.submit(i))
    assert all(isinstance(o, StorageIOError) for o in outcomes), outcomes
    assert entered.is_set()


def test_error_set_on_one_request_fails_only_that_request() -> None:
    def flush(requests: list[Request]) -> None:
        for request in requests:
            if request.payload == "bad":
                request.error = ValueError("bad request")
            else:
                request.result = "ok"

    committer = GroupCommitter(flush)
    assert committer.submit("good") == "ok"
    with pytest.raises(ValueError, match="bad request"):
        committer.submit("bad")


def test_committer_recovers_after_a_failed_round() -> None:
    fail = [True]

    def flush(requests: list[Request]) -> None:
        if fail[0]:
            raise OSError("once")
        for request in requests:
            request.result = "ok"

    committer = GroupCommitter(flush)
    with pytest.raises(OSError):
        committer.submit(1)
    fail[0] = False
    assert committer.submit(2) == "ok"


def test_window_lets_the_leader_wait_for_company() -> None:
    sizes: list[int] = []

    def flush(requests: list[Request]) -> None:
        sizes.append(len(requests))

    committer = GroupCommitter(flush, window_us=20_000)
    _run_threads(THREADS, lambda i: committer.submit(i))
    assert sum(sizes) == THREADS and len(sizes) < THREADS


# -- the GROUP policy of a partition -------------------------------------------------------------


def test_group_policy_shares_fsyncs_and_acknowledges_every_append_densely(
    open_partition: Callable[..., PartitionLog],
    batch: Callable[..., pa.RecordBatch],
    fs: FileSystem,
) -> None:
    partition = open_partition(fsync_policy=FsyncPolicy.GROUP)
    appends_per_thread = 25
    before = fs.fsync_count

    def append_many(thread: int) -> list[int]:
        offsets: list[int] = []
        for n in range(appends_per_thread):
            result = partition.append(batch(2, producer=f"p{thread}", seq_nos=[2 * n, 2 * n + 1]))
            offsets.extend(result.offsets.tolist())
        return offsets

    outcomes = _run_threads(THREADS, append_many)
    appends = THREADS * appends_per_thread
    fsyncs = fs.fsync_count - before
    assert 1 <= fsyncs < appends
    every = sorted(o for offsets in outcomes for o in offsets)
    assert every == list(range(2 * appends)), "every append acknowledged, offsets dense"
    for offsets in outcomes:
        assert offsets == sorted(offsets), "one thread's appends land in its order"
    assert partition.end_offset == 2 * appends


def test_group_policy_fsync_error_reaches_every_waiter_and_fences(
    open_partition: Callable[..., PartitionLog], batch: Callable[..., pa.RecordBatch]
) -> None:
    class SlowFailingSync(FileSystem):
        fail = False

        def sync(self, fd: int) -> None:
            if self.fail:
                time.sleep(0.02)
                raise StorageIOError("could not fsync (test)", path="?")
            super().sync(fd)

    failing = SlowFailingSync()
    partition = open_partition(file_system=failing, fsync_policy=FsyncPolicy.GROUP)
    partition.append(batch(1))
    failing.fail = True
    outcomes = _run_threads(THREADS, lambda i: partition.append(batch(1)))
    assert all(isinstance(o, StorageIOError) for o in outcomes), outcomes
    assert partition.end_offset == 1, "nothing unsynced became visible"
    with pytest.raises(PartitionFencedError):
        partition.append(batch(1))


def test_group_policy_bad_batch_fails_alone(
    open_partition: Callable[..., PartitionLog], batch: Callable[..., pa.RecordBatch]
) -> None:
    partition = open_partition(fsync_policy=FsyncPolicy.GROUP)

    def append(index: int) -> Any:
        seq_nos = [-1] if index == 0 else [1]
        return partition.append(batch(1, producer=f"p{index}", seq_nos=seq_nos))

    outcomes = _run_threads(4, append)
    assert isinstance(outcomes[0], InvalidParameterValueError)
    assert all(np.array_equal(o.status, [0]) for o in outcomes[1:])
    assert partition.end_offset == 3


class _Interrupted(Exception):
    """Stands for an exception raised in a waiting thread (a signal, say)."""


def _interrupting_lock_factory(victim: str, *, after_wake: bool) -> Callable[[], Any]:
    """``threading.Lock`` stand-in: the thread named ``victim`` raises while it waits.

    Its second ``acquire`` (the wait) raises at once, or, with ``after_wake``,
    once the lock was released for it (the exception comes as it wakes).
    """
    real_lock = threading.Lock

    class Lock:
        def __init__(self) -> None:
            self._lock = real_lock()
            self._calls = 0

        def acquire(self) -> bool:
            self._calls += 1
            victim_waits = threading.current_thread().name == victim and self._calls == 2
            if victim_waits and not after_wake:
                raise _Interrupted
            self._lock.acquire()
            if victim_waits:
                raise _Interrupted
            return True

        def release(self) -> None:
            self._lock.release()

    return Lock


@pytest.mark.parametrize("after_wake", [False, True], ids=["while-waiting", "when-handed-the-lead"])
def test_interrupted_follower_withdraws_and_nobody_is_stranded(
    after_wake: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    from storage import group_commit

    release_first_round = threading.Event()
    flushed: list[list[str]] = []

    def flush(requests: list[Request]) -> None:
        flushed.append([r.payload for r in requests])
        if len(flushed) == 1:
            release_first_round.wait(10)
        for request in requests:
            request.result = request.payload

    committer = GroupCommitter(flush)
    patched = type(
        "patched_threading", (), {"Lock": _interrupting_lock_factory("B", after_wake=after_wake)}
    )
    monkeypatch.setattr(group_commit, "threading", patched)
    outcomes: dict[str, Any] = {}

    def submit(name: str) -> None:
        try:
            outcomes[name] = committer.submit(name)
        except _Interrupted as error:
            outcomes[name] = error

    def start(name: str) -> threading.Thread:
        thread = threading.Thread(target=submit, args=(name,), name=name)
        thread.start()
        return thread

    leader = start("A")
    while not flushed:
        time.sleep(0.001)
    followers = [start("B")]
    while len(committer._queue) < 1 and not (not after_wake and "B" in outcomes):
        time.sleep(0.001)
    followers.append(start("C"))
    while len(committer._queue) < (2 if after_wake else 1):
        time.sleep(0.001)
    release_first_round.set()
    for thread in [leader, *followers]:
        thread.join(timeout=10)
        assert not thread.is_alive(), "a waiter was stranded"
    assert outcomes["A"] == "A" and outcomes["C"] == "C"
    assert isinstance(outcomes["B"], _Interrupted)
    assert flushed == [["A"], ["C"]], "the withdrawn request was never written"


def _release_order_lock_factory(released: list[str]) -> Callable[[], Any]:
    """``threading.Lock`` stand-in noting, at each ``release``, the thread that made the lock."""
    real_lock = threading.Lock

    class Lock:
        def __init__(self) -> None:
            self._lock = real_lock()
            self._owner = threading.current_thread().name

        def acquire(self) -> bool:
            return self._lock.acquire()

        def release(self) -> None:
            released.append(self._owner)
            self._lock.release()

    return Lock


def test_next_leader_is_woken_before_the_requests_of_the_round_that_ended(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from storage import group_commit

    released: list[str] = []
    gates = [threading.Event(), threading.Event(), threading.Event()]
    flushed: list[list[str]] = []

    def flush(requests: list[Request]) -> None:
        round_index = len(flushed)
        flushed.append([r.payload for r in requests])
        gates[round_index].wait(10)
        for request in requests:
            request.result = request.payload

    committer = GroupCommitter(flush)
    patched = type("patched_threading", (), {"Lock": _release_order_lock_factory(released)})
    monkeypatch.setattr(group_commit, "threading", patched)

    def start(name: str) -> threading.Thread:
        thread = threading.Thread(target=committer.submit, args=(name,), name=name)
        thread.start()
        return thread

    def wait_until(condition: Callable[[], bool]) -> None:
        for _ in range(10_000):
            if condition():
                return
            time.sleep(0.001)
        raise AssertionError("the committer did not get there")

    threads = [start("A")]  # leads round 1 alone
    wait_until(lambda: len(flushed) == 1)
    threads += [start("B")]
    wait_until(lambda: len(committer._queue) == 1)
    threads += [start("C")]
    wait_until(lambda: len(committer._queue) == 2)
    gates[0].set()  # round 2: B leads, C follows
    wait_until(lambda: len(flushed) == 2)
    threads += [start("D")]
    wait_until(lambda: len(committer._queue) == 1)
    released.clear()
    gates[1].set()  # round 2 ends: D is handed the lead of round 3
    wait_until(lambda: len(flushed) == 3)
    gates[2].set()
    for thread in threads:
        thread.join(timeout=10)
        assert not thread.is_alive(), "a waiter was stranded"
    assert flushed == [["A"], ["B", "C"], ["D"]]
    assert released[0] == "D", released
    assert released.index("D") < released.index("C"), released
