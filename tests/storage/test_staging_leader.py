"""The staging log's leader syncs: a committer whose commit record no sync is writing yet
syncs it itself (``StagingLog.wait_durable``), without waking the syncer thread.

What must hold: an append that carries a commit record starts and wakes no syncer; its
waiter syncs it (durable across a power cut); records appended while a leader's sync runs
wait for it and share the next sync, which one of them leads (two syncs for six commits);
a failed leader sync fails every waiter on that file and the next append goes to a new
file; ``close`` while a leader syncs waits for that sync before it closes the file.
"""

from __future__ import annotations

import errno
import threading
from typing import Any

import pytest

from storage import commit_log
from storage.errors import StorageIOError
from storage.fs import FileSystem
from storage.staging import StagingLog, encode_batches
from tests.sim.faulty_fs import Fault, FaultyFileSystem
from tests.storage.test_staging import WAIT_S, GatedFileSystem, _batch, _payload


def _commit(staging: StagingLog, transaction_id: int, text: str):
    """Append one batch and its commit record in one write (as ``commit_in_log`` does)."""
    parts, lengths = encode_batches(transaction_id, [_batch(text)])
    record = commit_log.encode_record(transaction_id, 1, b'{"moved": 1}')
    return staging.append(transaction_id, parts, lengths, record)


def test_a_commit_record_is_synced_by_its_waiter_and_survives_a_power_cut(tmp_path: Any) -> None:
    fs = FaultyFileSystem(seed=4)
    directory = str(tmp_path / "staging")
    staging = StagingLog(fs, directory)
    ticket = _commit(staging, 1, "one")
    staging.wait_durable(ticket)
    assert staging._syncer is None  # no thread was started or woken
    assert staging.sync_rounds == 1
    staging.close()
    fs.power_cut()
    fs.restart()
    reopened = StagingLog(fs, directory)
    try:
        assert _payload(reopened, ticket.placed[0]) == [b"one"]
    finally:
        reopened.close()


def test_commits_during_a_leader_sync_share_the_next_one(tmp_path: Any) -> None:
    fs = GatedFileSystem()
    staging = StagingLog(fs, str(tmp_path / "staging"))
    done: list[int] = []
    try:
        first = _commit(staging, 1, "t1")
        leader = threading.Thread(target=lambda: (staging.wait_durable(first), done.append(1)))
        leader.start()
        assert fs.sync_started.wait(WAIT_S)  # the first committer leads, held in its sync
        others = [_commit(staging, n, f"t{n}") for n in range(2, 7)]
        waiters = [threading.Thread(target=lambda t=t, n=n: (staging.wait_durable(t),
                                                             done.append(n)))
                   for n, t in zip(range(2, 7), others, strict=True)]  # fmt: skip
        for waiter in waiters:
            waiter.start()
        fs.gate.set()
        for thread in (leader, *waiters):
            thread.join(WAIT_S)
            assert not thread.is_alive()
        assert sorted(done) == [1, 2, 3, 4, 5, 6]
        assert fs.stage_syncs == 2, fs.stage_syncs
        assert staging._syncer is None
    finally:
        fs.gate.set()
        staging.close()


def test_a_failed_leader_sync_fails_its_waiters_and_the_next_append_starts_a_file(
    tmp_path: Any,
) -> None:
    fs = FaultyFileSystem(seed=5)
    directory = str(tmp_path / "staging")
    staging = StagingLog(fs, directory)
    kept = _commit(staging, 1, "kept")
    staging.wait_durable(kept)
    fs.add_fault(Fault("sync", errno.EIO, path_contains=".stage"))
    failed = _commit(staging, 2, "lost")
    with pytest.raises(StorageIOError) as raised:
        staging.wait_durable(failed)
    assert raised.value.context["errno"] == errno.EIO
    with pytest.raises(StorageIOError):
        staging.wait_durable(failed)  # asking again gives the same answer
    later = _commit(staging, 3, "later")
    assert later.file_number == failed.file_number + 1
    staging.wait_durable(later)
    staging.close()
    fs.power_cut()
    fs.restart()
    reopened = StagingLog(fs, directory)
    try:
        assert _payload(reopened, kept.placed[0]) == [b"kept"]
        assert _payload(reopened, later.placed[0]) == [b"later"]
    finally:
        reopened.close()


class HeldCloseFileSystem(GatedFileSystem):
    """A gated file system that notes whether a ``.stage`` file was closed while its sync
    was held (the gate shut)."""

    def __init__(self) -> None:
        super().__init__()
        self.closed_during_sync = False

    def close(self, fd: int) -> None:
        if (self._paths.get(fd, "").endswith(".stage") and self.sync_started.is_set()
                and not self.gate.is_set()):  # fmt: skip
            self.closed_during_sync = True
        super().close(fd)


def test_close_waits_for_a_leader_sync_before_it_closes_the_file(tmp_path: Any) -> None:
    fs = HeldCloseFileSystem()
    staging = StagingLog(fs, str(tmp_path / "staging"))
    ticket = _commit(staging, 1, "synced before the close")
    outcome: list[BaseException | None] = []

    def lead() -> None:
        try:
            staging.wait_durable(ticket)
            outcome.append(None)
        except BaseException as error:  # handed to the test
            outcome.append(error)

    leader = threading.Thread(target=lead)
    leader.start()
    assert fs.sync_started.wait(WAIT_S)
    closing = threading.Thread(target=staging.close)
    closing.start()
    pause = threading.Event()  # never set: a bounded poll
    for _ in range(WAIT_S * 100):
        if staging._closed:  # close began; were it not to wait, it would close the file now
            break
        pause.wait(0.01)
    closing.join(0.5)  # room for a close that does not wait to close the file (noted)
    fs.gate.set()
    for thread in (leader, closing):
        thread.join(WAIT_S)
        assert not thread.is_alive()
    assert not fs.closed_during_sync
    assert outcome == [None]


class FirstSyncFails(FileSystem):
    """The first ``.stage`` sync is held until released, then fails (EIO); later ones
    succeed. Counts the syncs running at once."""

    def __init__(self) -> None:
        super().__init__()
        self.first_started = threading.Event()
        self.release_first = threading.Event()
        self.calls = 0
        self.running = 0
        self.most = 0
        self.lock = threading.Lock()

    def sync(self, fd: int) -> None:
        if not self._paths.get(fd, "").endswith(".stage"):
            return super().sync(fd)
        with self.lock:
            self.calls += 1
            first = self.calls == 1
            self.running += 1
            self.most = max(self.most, self.running)
        try:
            if first:
                self.first_started.set()
                assert self.release_first.wait(WAIT_S)
                raise StorageIOError("fsync failed", errno=errno.EIO)
            super().sync(fd)
        finally:
            with self.lock:
                self.running -= 1


def test_the_syncer_never_syncs_beside_a_leader_and_a_failure_is_not_masked(
    tmp_path: Any,
) -> None:
    """Review R3-1: a write without a record wakes the syncer while a leader's sync runs;
    the syncer waits for it (before: a second fdatasync of the file at once, whose success
    made the leader's failed commit, and the write, count as durable)."""
    fs = FirstSyncFails()
    staging = StagingLog(fs, str(tmp_path / "staging"))
    outcome: list = []
    first = _commit(staging, 1, "one")

    def lead() -> None:
        try:
            staging.wait_durable(first)
            outcome.append("durable")
        except StorageIOError as error:
            outcome.append(error.context.get("errno"))

    leader = threading.Thread(target=lead)
    leader.start()
    try:
        assert fs.first_started.wait(WAIT_S)
        second = staging.write(2, [_batch("two")])  # wakes the syncer thread
        pause = threading.Event()  # never set: a bounded poll for a second sync
        for _ in range(50):
            if fs.calls > 1:
                break
            pause.wait(0.01)
        fs.release_first.set()
        leader.join(WAIT_S)
        assert not leader.is_alive()
        assert outcome == [errno.EIO]
        assert fs.most == 1, "two syncs of one staging file ran at once"
        for ticket in (first, second):  # both were written before the failed sync ended
            with pytest.raises(StorageIOError):
                staging.wait_durable(ticket)
        later = staging.write(3, [_batch("later")])
        assert later.file_number == first.file_number + 1
        staging.wait_durable(later)  # the syncer syncs the new file
    finally:
        fs.release_first.set()
        staging.close()
