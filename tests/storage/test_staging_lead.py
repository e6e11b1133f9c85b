"""A committer waiting for its staged bytes syncs the file itself when no sync is under
way (``StagingLog.wait_durable`` leads), instead of waking the syncer thread and waiting
to be woken back; a sync under way is waited for and shared; ``close`` waits for a
leading committer's sync before it closes the file."""

from __future__ import annotations

import threading
from typing import Any

from storage.fs import FileSystem
from storage.staging import StagingLog

WAIT_S = 30  # a bound on waits for other threads, never a timing assertion


class ThreadsOfSyncs(FileSystem):
    """Real files; records the thread of every ``.stage`` sync, and can hold syncs back."""

    def __init__(self) -> None:
        super().__init__()
        self.threads: list[str] = []
        self.gate = threading.Event()
        self.gate.set()
        self.sync_started = threading.Event()
        self.closed_during_sync = False
        self._in_sync = 0

    def sync(self, fd: int) -> None:
        if self._paths.get(fd, "").endswith(".stage"):
            self.threads.append(threading.current_thread().name)
            self._in_sync += 1
            self.sync_started.set()
            try:
                assert self.gate.wait(WAIT_S), "the test never opened the gate"
                super().sync(fd)
            finally:
                self._in_sync -= 1
            return
        super().sync(fd)

    def close(self, fd: int) -> None:
        if self._in_sync and self._paths.get(fd, "").endswith(".stage"):
            self.closed_during_sync = True
        super().close(fd)


def _record(text: str) -> bytes:
    return text.encode().ljust(64, b".")


def test_a_lone_committer_syncs_on_its_own_thread(tmp_path: Any) -> None:
    fs = ThreadsOfSyncs()
    staging = StagingLog(fs, str(tmp_path / "staging"))
    try:
        for transaction_id in range(1, 6):
            ticket = staging.append(transaction_id, [], [], _record("commit"), wake_syncer=False)
            staging.wait_durable(ticket)
        assert fs.threads == [threading.current_thread().name] * 5
        assert staging.syncs == 5
    finally:
        staging.close()


def test_a_committer_waits_for_a_sync_under_way_and_bytes_after_it_get_another(
    tmp_path: Any,
) -> None:
    fs = ThreadsOfSyncs()
    staging = StagingLog(fs, str(tmp_path / "staging"))
    fs.gate.clear()
    first = staging.append(1, [], [], _record("first"), wake_syncer=False)
    leader = threading.Thread(target=staging.wait_durable, args=(first,), name="leader")
    leader.start()
    try:
        assert fs.sync_started.wait(WAIT_S)
        second = staging.append(2, [], [], _record("second"), wake_syncer=False)  # during it
        done: list[str] = []
        follower = threading.Thread(
            target=lambda: (staging.wait_durable(second), done.append("second")), name="follower"
        )
        follower.start()
        fs.gate.set()
        leader.join(WAIT_S)
        follower.join(WAIT_S)
        assert not leader.is_alive() and not follower.is_alive() and done == ["second"]
        assert fs.threads[0] == "leader" and len(fs.threads) == 2  # one sync could not cover it
    finally:
        fs.gate.set()
        staging.close()


def test_close_waits_for_a_leading_committers_sync(tmp_path: Any) -> None:
    fs = ThreadsOfSyncs()
    staging = StagingLog(fs, str(tmp_path / "staging"))
    fs.gate.clear()
    ticket = staging.append(1, [], [], _record("commit"), wake_syncer=False)
    leader = threading.Thread(target=staging.wait_durable, args=(ticket,), name="leader")
    leader.start()
    assert fs.sync_started.wait(WAIT_S) and fs.threads == ["leader"]
    closer = threading.Thread(target=staging.close, name="closer")
    closer.start()
    closer.join(0.2)  # not a timing assertion: close must still be waiting either way
    fs.gate.set()
    closer.join(WAIT_S)
    leader.join(WAIT_S)
    assert not closer.is_alive() and not leader.is_alive()
    assert not fs.closed_during_sync, "the file was closed under a committer's sync"

