"""The staging log's pre-written window (``storage.staging``, round 21).

After a small append the staging log writes zeros ahead of its end, so that later
appends overwrite written blocks and their fdatasync changes no file size. What must
hold: small appends pre-write and then stop growing the file, big ones never pre-write;
a file's zero tail is its clean end for recovery (``commit_log.scan``) and for
``topicbase check`` (``walk_staging``), while a non-zero torn tail inside the zeros is
still torn; after a power cut or a kill (``staging_prewrite_worker.py``) every
acknowledged record is found and nothing that was not written whole; a failed zero write
(ENOSPC) leaves the log usable; a restart appends to a new file, after the old one's
records, never into its zeros.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from storage import commit_log, limits
from storage.check import check_store
from storage.check_report import TORN_TAIL
from storage.fs import FileSystem
from storage.record_batch import build_wire_batch
from storage.staging import StagingLog, StagingTicket, encode_batches
from storage.store import Store
from tests.sim.faulty_fs import Fault, FaultyFileSystem

HERE = Path(__file__).resolve().parent
WORKER = HERE / "staging_prewrite_worker.py"
WORKER_S = 300  # catches a hung worker only (two shared cores under load), never timing


class _CountingFileSystem(FaultyFileSystem):
    """Counts the writes to staging files."""

    writes_to_stage = 0

    def _write(self, fd: int, view: memoryview, position: int) -> None:
        if self._paths.get(fd, "").endswith(".stage"):
            self.writes_to_stage += 1
        super()._write(fd, view, position)


def _commit(staging: StagingLog, transaction_id: int, texts: list[str], payload: bytes
            ) -> StagingTicket:  # fmt: skip
    """A topic-only commit's append: its frames, then its record (not waited)."""
    batches = [build_wire_batch([t.encode()]) for t in texts]
    parts, lengths = encode_batches(transaction_id, batches) if batches else ([], [])
    record = commit_log.encode_record(transaction_id, len(lengths), payload)
    return staging.append(transaction_id, parts, lengths, record)


def _path(directory: str, number: int) -> str:
    return os.path.join(directory, f"{number:020d}.stage")


def _found(staging: StagingLog) -> list[int]:
    return [
        found.transaction_id
        for number in staging.file_numbers()
        for found in commit_log.scan(staging.read_file(number))
    ]


def test_small_appends_overwrite_the_prewritten_window_and_big_ones_never_prewrite(
    tmp_path: Any,
) -> None:
    directory = str(tmp_path / "staging")
    staging = StagingLog(FileSystem(), directory)
    try:
        first = _commit(staging, 1, [], b"x" * 300)
        staging.wait_durable(first)
        path = _path(directory, first.file_number)
        size = os.path.getsize(path)
        assert size == first.end + limits.STAGING_PREWRITE_BYTES
        assert Path(path).read_bytes()[first.end :] == bytes(size - first.end)
        ends = []
        for transaction_id in range(2, 40):
            ticket = _commit(staging, transaction_id, ["a message"], b"y" * 500)
            staging.wait_durable(ticket)
            ends.append(ticket.end)
        assert os.path.getsize(path) == size  # every append overwrote zeros
        assert staging.prewrites == 1
        assert _found(staging) == list(range(1, 40))
    finally:
        staging.close()
    bulk = StagingLog(FileSystem(), str(tmp_path / "bulk"))
    try:
        big = "z" * (limits.STAGING_PREWRITE_APPEND_BYTES_MAX + 1)
        for transaction_id in (1, 2):
            ticket = _commit(bulk, transaction_id, [big], b"{}")
            bulk.wait_durable(ticket)
            assert os.path.getsize(_path(str(tmp_path / "bulk"), ticket.file_number)) == ticket.end
        assert bulk.prewrites == 0
    finally:
        bulk.close()


def test_the_window_is_renewed_before_the_appends_reach_it(tmp_path: Any) -> None:
    directory = str(tmp_path / "staging")
    staging = StagingLog(FileSystem(), directory)
    staging._prewrite_bytes = 64 * 1024  # a small window, renewed every ~32 KiB
    try:
        for transaction_id in range(1, 200):
            ticket = _commit(staging, transaction_id, [], b"p" * 1000)
            staging.wait_durable(ticket)
            size = os.path.getsize(_path(directory, ticket.file_number))
            assert size - ticket.end >= 32 * 1024, transaction_id
        assert staging.prewrites > 3
        assert _found(staging) == list(range(1, 200))
    finally:
        staging.close()


def test_the_checker_reads_a_zero_tail_as_the_end_and_garbage_in_it_as_torn(
    tmp_path: Any,
) -> None:
    directory = str(tmp_path / "staging")
    staging = StagingLog(FileSystem(), directory)
    for transaction_id in (1, 2, 3):
        staging.wait_durable(_commit(staging, transaction_id, ["m"], b"{}"))
    number, end = staging.file_numbers()[0], staging._size
    staging.close()
    path = _path(directory, number)
    walk = commit_log.walk_staging(Path(path).read_bytes())
    assert (walk.records, walk.frames, walk.damage, walk.tail_position) == (3, 3, [], None)
    assert walk.zero_tail_bytes == os.path.getsize(path) - end > 0
    store = str(tmp_path / "store")
    Store.open(store, fs=FileSystem()).close()
    report = check_store(store, staging_directory=directory, fs=FileSystem())
    assert report.problems == [], report.problems
    with open(path, "r+b") as file:  # a torn append: a record's first bytes, then zeros
        file.seek(end)
        file.write(commit_log.encode_record(4, 0, b"torn")[:20])
    walk = commit_log.walk_staging(Path(path).read_bytes())
    assert (walk.records, walk.tail_position, walk.zero_tail_bytes) == (3, end, 0)
    assert [found.transaction_id for found in commit_log.scan(Path(path).read_bytes())] == [
        1, 2, 3
    ]  # fmt: skip
    report = check_store(store, staging_directory=directory, fs=FileSystem())
    assert [(p.kind, p.position) for p in report.problems] == [(TORN_TAIL, end)], report.problems


@pytest.mark.parametrize("seed", range(12))
def test_a_power_cut_keeps_every_acknowledged_record_and_no_torn_one(
    tmp_path: Any, seed: int
) -> None:
    """Acknowledged records (waited durable) survive a power cut with or without partial
    writeback of the rest; an unacknowledged one is found only whole, never one after a
    missing one; the zero tail or the partly written-back bytes end the file."""
    fs = FaultyFileSystem(seed=seed)
    directory = str(tmp_path / "staging")
    staging = StagingLog(fs, directory)
    staging._prewrite_bytes = 16 * 1024
    acknowledged = []
    for transaction_id in range(1, 6 + seed):
        staging.wait_durable(_commit(staging, transaction_id, ["m" * seed], b"r" * 900))
        acknowledged.append(transaction_id)
    in_flight = [t for t in range(100, 103)]
    for transaction_id in in_flight:
        _commit(staging, transaction_id, ["late"], b"q" * (300 * seed + 1))
    number = staging.file_numbers()[0]
    assert fs.file_size(staging._fd) > staging._size  # pre-written past the end
    fs.power_cut(partial_writeback=seed % 2 == 1)
    fs.restart()
    reopened = StagingLog(fs, directory)
    try:
        found = [f.transaction_id for f in commit_log.scan(reopened.read_file(number))]
        assert found[: len(acknowledged)] == acknowledged
        assert found[len(acknowledged) :] == in_flight[: len(found) - len(acknowledged)]
    finally:
        reopened.close()


def test_a_failed_zero_write_leaves_the_log_usable_and_stops_prewriting(tmp_path: Any) -> None:
    """ENOSPC on the zero write (the file's 2nd write): the commit that triggered it is
    not failed, later appends grow the file as before, everything survives a power cut."""
    fs = _CountingFileSystem(seed=5)
    directory = str(tmp_path / "staging")
    fs.add_fault(Fault("write", errno.ENOSPC, path_contains=".stage", nth=2, torn=True))
    staging = StagingLog(fs, directory)
    for transaction_id in range(1, 20):
        staging.wait_durable(_commit(staging, transaction_id, ["m"], b"{}"))
    assert staging.prewrites == 0 and not staging._prewrite_ok
    assert fs.writes_to_stage == 20  # 19 appends and the failed zero write, no retry
    tail = fs.pread(staging._fd, fs.file_size(staging._fd), staging._size)
    assert tail == bytes(len(tail))  # what the torn zero write left past the end: zeros
    staging.close()
    fs.power_cut()
    fs.restart()
    reopened = StagingLog(fs, directory)
    try:
        assert _found(reopened) == list(range(1, 20))
        # A new file pre-writes again.
        ticket = _commit(reopened, 30, [], b"{}")
        reopened.wait_durable(ticket)
        assert reopened.prewrites == 1
    finally:
        reopened.close()


def test_a_restart_appends_to_a_new_file_after_the_old_ones_records(tmp_path: Any) -> None:
    directory = str(tmp_path / "staging")
    staging = StagingLog(FileSystem(), directory)
    for transaction_id in (1, 2):
        staging.wait_durable(_commit(staging, transaction_id, ["old"], b"{}"))
    old = staging.file_numbers()[0]
    old_bytes = Path(_path(directory, old)).read_bytes()
    assert old_bytes.endswith(bytes(limits.STAGING_PREWRITE_BYTES // 2))  # pre-written
    staging.close()
    reopened = StagingLog(FileSystem(), directory)
    try:
        ticket = _commit(reopened, 3, ["new"], b"{}")
        reopened.wait_durable(ticket)
        assert ticket.file_number > old
        assert ticket.placed[0].position == 0
        assert Path(_path(directory, old)).read_bytes() == old_bytes
        assert _found(reopened) == [1, 2, 3]
    finally:
        reopened.close()


@pytest.mark.parametrize(
    "failpoint",
    ["staging.prewrite=crash@12", "staging.torn_record=crash@40", "kill"],
)
def test_a_killed_writer_loses_no_acknowledged_record(tmp_path: Any, failpoint: str) -> None:
    """A process appending records to pre-written staging files (an 8 KiB window, so the
    zero writes are frequent) crashes inside a zero write, inside a torn record, or is
    SIGKILLed at a random moment; the ones it acknowledged (after their sync) are all
    found, in order, and the records found are a prefix of the ones it wrote."""
    directory = str(tmp_path / "staging")
    acks = tmp_path / "acks"
    environment = dict(os.environ)
    environment.pop("TOPICBASE_FAILPOINTS", None)
    if failpoint != "kill":
        environment["TOPICBASE_FAILPOINTS"] = failpoint
    command = [sys.executable, str(WORKER), directory, str(acks)]
    if failpoint == "kill":
        process = subprocess.Popen(command, env=environment, stdout=subprocess.PIPE, text=True)
        assert process.stdout is not None
        lines = []
        for _ in range(60):  # acknowledged records, then a kill somewhere in the appends
            lines.append(process.stdout.readline())
            assert lines[-1], "the worker ended early"
        process.kill()
        assert process.wait(WORKER_S) == -9
    else:
        done = subprocess.run(
            command, env=environment, timeout=WORKER_S, capture_output=True, text=True
        )
        assert done.returncode == 137, done.stderr
        lines = done.stdout.splitlines()
    assert int(lines[-1].split()[1]) > 2  # zero writes made: the records went into them
    acknowledged = [int(line) for line in acks.read_text().split()]
    assert acknowledged, "nothing was acknowledged before the crash"
    staging = StagingLog(FileSystem(), directory)
    try:
        found = _found(staging)
        numbers = staging.file_numbers()
    finally:
        staging.close()
    assert found[: len(acknowledged)] == acknowledged
    assert found == list(range(1, len(found) + 1))  # written in this order, none torn
    assert len(numbers) > 1  # the worker's small files: rotations into pre-written files too
    for number in numbers:
        walk = commit_log.walk_staging(Path(_path(directory, number)).read_bytes())
        assert walk.damage == []
