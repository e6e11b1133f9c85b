"""The staging log wakes a committer waiting for its sync only when a sync ends.

An append wakes the syncer alone (``StagingLog._wanted``); before, every append
notified the condition every waiting committer sleeps on, so with 16 sessions
committing each append woke all of them only to sleep again (each needing the
GIL). The count is of wake-ups of one waiting thread: exactly one, the end of
the sync that covers its write, however many appends happen meanwhile.
"""

from __future__ import annotations

import random
import threading
import types
from typing import Any, ClassVar

import pytest

import storage.staging as staging_module
from storage.fs import FileSystem
from storage.record_batch import build_wire_batch
from storage.staging import StagingLog
from tests.storage.test_staging import WAIT_S, GatedFileSystem
from tests.storage.test_staging_leader import _commit


class CountingCondition(threading.Condition):
    """A condition that counts, per thread name, the waits that returned."""

    woken: ClassVar[dict[str, int]] = {}
    waiting: ClassVar[dict[str, threading.Event]] = {}

    def wait(self, timeout: float | None = None) -> bool:
        name = threading.current_thread().name
        CountingCondition.waiting.setdefault(name, threading.Event()).set()
        try:
            return super().wait(timeout)
        finally:
            CountingCondition.woken[name] = CountingCondition.woken.get(name, 0) + 1


def test_appends_during_a_sync_do_not_wake_the_committers_waiting_for_it(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    shim = types.SimpleNamespace(Lock=threading.Lock, Condition=CountingCondition,
                                 Thread=threading.Thread)  # fmt: skip
    monkeypatch.setattr(staging_module, "threading", shim)
    monkeypatch.setattr(CountingCondition, "woken", {})
    monkeypatch.setattr(CountingCondition, "waiting", {})
    fs = GatedFileSystem()
    staging = StagingLog(fs, str(tmp_path / "staging"))
    try:
        first = staging.write(1, [build_wire_batch([b"t1"])])
        assert fs.sync_started.wait(WAIT_S)  # the syncer holds the first sync
        waiter = threading.Thread(target=staging.wait_durable, args=(first,), name="committer")
        waiter.start()
        assert CountingCondition.waiting.setdefault("committer", threading.Event()).wait(WAIT_S)
        pause = threading.Event()  # never set: gives the waiter a chance to run
        for transaction_id in range(2, 7):
            staging.write(transaction_id, [build_wire_batch([b"more"])])
            pause.wait(0.02)
        assert CountingCondition.woken.get("committer", 0) == 0
        fs.gate.set()
        waiter.join(WAIT_S)
        assert not waiter.is_alive()
        assert CountingCondition.woken["committer"] == 1  # the end of the covering sync
    finally:
        fs.gate.set()
        staging.close()


class SteppedFileSystem(GatedFileSystem):
    """Every ``sync`` of a ``.stage`` file waits for its own gate (the n-th sync for
    ``gates[n]``) and reports that it started (``started[n]``)."""

    def __init__(self, syncs: int) -> None:
        super().__init__()
        self.gates = [threading.Event() for _ in range(syncs)]
        self.started = [threading.Event() for _ in range(syncs)]

    def sync(self, fd: int) -> None:
        if self._paths.get(fd, "").endswith(".stage"):
            number = self.stage_syncs
            self.stage_syncs += 1
            self.started[number].set()
            assert self.gates[number].wait(WAIT_S), "the test never opened the gate"
        FileSystem.sync(self, fd)


def test_the_end_of_a_sync_wakes_only_the_waiters_it_covered_and_one_leader(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Five commits wait while a leader's sync runs; its end wakes one of them to lead the
    next sync and no other (a ``notify_all`` woke all five, four only to sleep again);
    the next sync's end wakes the four. Each waiter is woken exactly once."""
    shim = types.SimpleNamespace(Lock=threading.Lock, Condition=CountingCondition,
                                 Thread=threading.Thread)  # fmt: skip
    monkeypatch.setattr(staging_module, "threading", shim)
    monkeypatch.setattr(CountingCondition, "woken", {})
    monkeypatch.setattr(CountingCondition, "waiting", {})
    fs = SteppedFileSystem(2)
    staging = StagingLog(fs, str(tmp_path / "staging"))
    names = [f"committer-{n}" for n in range(2, 7)]
    try:
        first = _commit(staging, 1, "t1")
        leader = threading.Thread(target=staging.wait_durable, args=(first,), name="leader")
        leader.start()
        assert fs.started[0].wait(WAIT_S)  # the first committer leads, held in its sync
        waiters = []
        for number, name in zip(range(2, 7), names, strict=True):
            ticket = _commit(staging, number, f"t{number}")
            waiters.append(threading.Thread(target=staging.wait_durable, args=(ticket,),
                                            name=name))  # fmt: skip
            waiters[-1].start()
        for name in names:
            assert CountingCondition.waiting.setdefault(name, threading.Event()).wait(WAIT_S)
        fs.gates[0].set()
        leader.join(WAIT_S)
        assert not leader.is_alive()
        assert fs.started[1].wait(WAIT_S)  # one of the five leads the second sync
        pause = threading.Event()  # never set: gives wrongly woken waiters a chance to run
        pause.wait(0.1)
        assert sum(CountingCondition.woken.get(name, 0) for name in names) == 1
        fs.gates[1].set()
        for waiter in waiters:
            waiter.join(WAIT_S)
            assert not waiter.is_alive()
        assert [CountingCondition.woken.get(name, 0) for name in names] == [1] * 5
        assert fs.stage_syncs == 2
    finally:
        for gate in fs.gates:
            gate.set()
        staging.close()


class JitteredFileSystem(FileSystem):
    """Real files; every ``sync`` of a ``.stage`` file yields the CPU a random number of
    times first, so that appends, leaders and the syncer interleave differently."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        self._random = random.Random(seed)
        self._lock = threading.Lock()

    def sync(self, fd: int) -> None:
        with self._lock:
            spins = self._random.randrange(0, 4)
        pause = threading.Event()
        for _ in range(spins):
            pause.wait(0.0005)
        super().sync(fd)


@pytest.mark.parametrize("plain_writers", [0, 2])
@pytest.mark.parametrize("seed", range(3))
def test_every_waiter_returns_durable_under_concurrent_commits_and_plain_writes(
    tmp_path: Any, seed: int, plain_writers: int
) -> None:
    """Eight committers (a record each time, leaders) and, in one variant, two writers
    without a record (whose bytes the syncer thread syncs, covering records too) append at
    once: every ``wait_durable`` returns (none is left asleep by the targeted wake-ups:
    without the syncer, only a leader's wake-up of the next leader keeps them going) and
    only once its bytes are synced."""
    fs = JitteredFileSystem(seed)
    staging = StagingLog(fs, str(tmp_path / "staging"), file_bytes_max=64 * 1024)
    errors: list[BaseException] = []
    finished: list[int] = []

    def committer(first: int) -> None:
        try:
            for number in range(first, first + 40):
                ticket = _commit(staging, number, f"t{number}")
                staging.wait_durable(ticket)
                with staging._lock:
                    assert staging._durable.get(ticket.file_number, 0) >= ticket.end
                finished.append(number)
        except BaseException as error:  # reported below
            errors.append(error)

    def plain(first: int) -> None:
        try:
            for number in range(first, first + 40):
                staging.wait_durable(staging.write(number, [build_wire_batch([b"plain"])]))
                finished.append(number)
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=committer, args=(1000 * (i + 1),)) for i in range(8)]
    threads += [threading.Thread(target=plain, args=(100_000 * (i + 1),))
                for i in range(plain_writers)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(WAIT_S)
            assert not thread.is_alive(), "a waiter was never woken"
        assert not errors, errors
        assert len(finished) == (8 + plain_writers) * 40
        assert len(staging.file_numbers()) > 1  # files rotated meanwhile
    finally:
        staging.close()
