"""The staging log: writes now, syncs in its background syncer, waits before the commit point.

What must hold (``storage/staging.py``): a ticket is durable only after a sync
that began after its write; concurrent writes share syncs; a failed sync fails
every waiter on that file and the next write goes to a new file; a rotation
syncs the old file before closing it; ``close`` wakes waiters with an error.
Faults come from ``tests.sim.faulty_fs`` (power cuts drop what was not synced);
a ``GatedFileSystem`` holds syncs back so that the interleavings are fixed.
"""

from __future__ import annotations

import errno
import threading
from typing import Any

import pyarrow as pa
import pytest

from storage.errors import StorageIOError
from storage.fs import FileSystem
from storage.record_batch import build_wire_batch
from storage.staging import StagingLog
from tests.sim.faulty_fs import Fault, FaultyFileSystem

WAIT_S = 30  # a bound on waits for other threads, never a timing assertion


def _batch(text: str) -> pa.RecordBatch:
    return build_wire_batch([text.encode()])


def _payload(staging: StagingLog, placed: Any) -> list[bytes]:
    return staging.read(placed).column("data").to_pylist()


class GatedFileSystem(FileSystem):
    """Real files; every ``sync`` of a ``.stage`` file waits until the test opens the gate."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.sync_started = threading.Event()
        self.stage_syncs = 0

    def sync(self, fd: int) -> None:
        if self._paths.get(fd, "").endswith(".stage"):
            self.stage_syncs += 1
            self.sync_started.set()
            assert self.gate.wait(WAIT_S), "the test never opened the gate"
        super().sync(fd)


def test_a_waited_write_survives_a_power_cut(tmp_path: Any) -> None:
    fs = FaultyFileSystem(seed=1)
    directory = str(tmp_path / "staging")
    staging = StagingLog(fs, directory)
    ticket = staging.write(1, [_batch("one"), _batch("two")])
    staging.wait_durable(ticket)
    staging.close()
    fs.power_cut()
    fs.restart()
    reopened = StagingLog(fs, directory)
    try:
        assert [_payload(reopened, p) for p in ticket.placed] == [[b"one"], [b"two"]]
    finally:
        reopened.close()


def test_writes_made_during_a_sync_share_the_next_sync(tmp_path: Any) -> None:
    """The first write's sync is held; five more writes meanwhile need one more sync."""
    fs = GatedFileSystem()
    staging = StagingLog(fs, str(tmp_path / "staging"))
    try:
        first = staging.write(1, [_batch("t1")])
        assert fs.sync_started.wait(WAIT_S)
        others = [staging.write(n, [_batch(f"t{n}")]) for n in range(2, 7)]
        fs.gate.set()
        for ticket in [first, *others]:
            staging.wait_durable(ticket)
        assert fs.stage_syncs == 2, fs.stage_syncs
        assert _payload(staging, others[-1].placed[0]) == [b"t6"]
    finally:
        fs.gate.set()
        staging.close()


def test_a_failed_sync_fails_its_waiters_and_the_next_write_starts_a_new_file(
    tmp_path: Any,
) -> None:
    fs = FaultyFileSystem(seed=2)
    directory = str(tmp_path / "staging")
    staging = StagingLog(fs, directory)
    first = staging.stage(1, [_batch("kept")])
    fs.add_fault(Fault("sync", errno.EIO, path_contains=".stage"))
    failed = staging.write(2, [_batch("lost")])
    with pytest.raises(StorageIOError) as raised:
        staging.wait_durable(failed)
    assert raised.value.context["errno"] == errno.EIO
    with pytest.raises(StorageIOError):
        staging.wait_durable(failed)  # asking again gives the same answer
    later = staging.write(3, [_batch("later")])
    assert later.file_number == failed.file_number + 1
    staging.wait_durable(later)
    staging.close()
    fs.power_cut()
    fs.restart()
    reopened = StagingLog(fs, directory)
    try:
        assert _payload(reopened, first[0]) == [b"kept"]
        assert _payload(reopened, later.placed[0]) == [b"later"]
    finally:
        reopened.close()


def test_a_rotation_syncs_the_old_file_before_closing_it(tmp_path: Any) -> None:
    """With the syncer held, a write past the size limit rotates: the old file's
    frames become durable by the rotation's own sync, the new file's by the syncer."""
    fs = GatedFileSystem()
    directory = str(tmp_path / "staging")
    staging = StagingLog(fs, directory, file_bytes_max=1)
    try:
        first = staging.write(1, [_batch("old file")])
        assert fs.sync_started.wait(WAIT_S)  # the syncer now holds the old file
        second: list = []
        rotating = threading.Thread(
            target=lambda: second.append(staging.write(2, [_batch("new file")]))
        )
        rotating.start()
        fs.gate.set()
        rotating.join(WAIT_S)
        assert not rotating.is_alive() and len(second) == 1
        staging.wait_durable(first)
        staging.wait_durable(second[0])
        assert second[0].file_number == first.file_number + 1
        assert _payload(staging, first.placed[0]) == [b"old file"]
        assert _payload(staging, second[0].placed[0]) == [b"new file"]
    finally:
        fs.gate.set()
        staging.close()


def test_the_syncer_prepares_the_next_file_and_a_release_keeps_it(tmp_path: Any) -> None:
    """Past ``SPARE_AT_FRACTION`` of the size limit the syncer creates the next file; a
    release of every transaction keeps it (it is about to be written) and the rotation
    then writes into it."""
    fs = FaultyFileSystem(seed=3)
    staging = StagingLog(fs, str(tmp_path / "staging"), file_bytes_max=100)
    try:
        first = staging.stage(1, [_batch("fills the first file")])
        pause = threading.Event()  # never set: a sleep that ruff accepts
        for _ in range(WAIT_S * 100):  # the syncer prepares the spare after its sync
            if staging.spare_directory_syncs:
                break
            pause.wait(0.01)
        assert staging.file_numbers() == [first[0].file_number, first[0].file_number + 1]
        assert staging.spare_directory_syncs == 1
        staging.release({1})
        assert staging.file_numbers() == [first[0].file_number, first[0].file_number + 1]
        second = staging.stage(2, [_batch("goes to the spare")])
        assert second[0].file_number == first[0].file_number + 1
        assert _payload(staging, second[0]) == [b"goes to the spare"]
    finally:
        staging.close()


def test_close_wakes_a_waiter_with_an_error(tmp_path: Any) -> None:
    fs = GatedFileSystem()
    staging = StagingLog(fs, str(tmp_path / "staging"))
    ticket = staging.write(1, [_batch("never synced")])
    assert fs.sync_started.wait(WAIT_S)
    outcome: list[BaseException | None] = []

    def wait() -> None:
        try:
            staging.wait_durable(ticket)
            outcome.append(None)
        except StorageIOError as error:
            outcome.append(error)

    waiter = threading.Thread(target=wait)
    waiter.start()
    closing = threading.Thread(target=staging.close)
    closing.start()
    waiter.join(WAIT_S)
    fs.gate.set()  # the syncer finishes its sync and stops
    closing.join(WAIT_S)
    assert not waiter.is_alive() and not closing.is_alive()
    assert len(outcome) == 1 and isinstance(outcome[0], StorageIOError), outcome
    with pytest.raises(StorageIOError):
        staging.write(2, [_batch("after close")])
