"""The staging log wakes a committer waiting for its sync only when a sync ends.

An append wakes the syncer alone (``StagingLog._wanted``); before, every append
notified the condition every waiting committer sleeps on, so with 16 sessions
committing each append woke all of them only to sleep again (each needing the
GIL). The count is of wake-ups of one waiting thread: exactly one, the end of
the sync that covers its write, however many appends happen meanwhile.
"""

from __future__ import annotations

import threading
import types
from typing import Any, ClassVar

import pytest

import storage.staging as staging_module
from storage.record_batch import build_wire_batch
from storage.staging import StagingLog
from tests.storage.test_staging import WAIT_S, GatedFileSystem


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
