"""Disk faults: ENOSPC and EIO on write, EIO on fsync, torn writes, power cuts.

The behaviour asked for: "After a failed fsync the partition refuses further
writes until reopened (the PostgreSQL fsyncgate lesson), and nothing
acknowledged is lost". Every test runs a store or a staging log on
``tests/sim/faulty_fs.FaultyFileSystem`` (see its docstring for what it models),
injects one fault, and checks what was acknowledged against what reads back
after a reopen: offsets dense, payloads intact, producer state equal to the
log (a resend of a stored message is a duplicate, of a lost one is written).

Messages come from one producer ``p`` with seq_nos 0, 1, 2... and payload
``m<seq_no>`` padded to ``PAYLOAD_BYTES``, so seq_no ``s`` of a fully kept log
sits at offset ``s``. Deterministic: every random choice comes from the seed
in the test's id.
"""

from __future__ import annotations

import errno
import os
import random
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pytest

from storage.clock import ManualClock
from storage.config import FsyncPolicy, TopicConfig
from storage.errors import PartitionFencedError, StorageIOError
from storage.fs import FileSystem
from storage.partition_log import DUPLICATE, WRITTEN, PartitionLog
from storage.record_batch import build_wire_batch
from storage.staging import StagingLog
from storage.store import Store
from tests.sim.faulty_fs import PAGE_BYTES, Fault, FaultyFileSystem, SimulatedCrash

MakeBatch = Callable[..., pa.RecordBatch]
ReadAll = Callable[..., list[dict[str, Any]]]

PRODUCER = "p"
PAYLOAD_BYTES = 600
SEGMENT_BYTES = 8 * 1024
SYNCED_POLICIES = [FsyncPolicy.ALWAYS, FsyncPolicy.GROUP]
ALL_POLICIES = [FsyncPolicy.ALWAYS, FsyncPolicy.GROUP, FsyncPolicy.NEVER]


# -- helpers ------------------------------------------------------------------------------------
def open_store(
    root: str, fs: FileSystem, clock: ManualClock, policy: FsyncPolicy = FsyncPolicy.ALWAYS
) -> tuple[Store, PartitionLog]:
    """Open the store at ``root`` and its one topic's partition 0 (created on first open)."""
    store = Store.open(root, fs=fs, clock=clock)
    if store.topic_ids():
        topic = store.topic(store.topic_ids()[0])
    else:
        config = TopicConfig(fsync_policy=policy, segment_bytes=SEGMENT_BYTES)
        topic = store.create_topic(config)
    return store, topic.partition(0)


def send(partition: PartitionLog, batch: MakeBatch, first: int, count: int) -> dict[int, int]:
    """Append seq_nos ``first..first+count-1``; returns seq_no -> offset of those WRITTEN."""
    seq_nos = list(range(first, first + count))
    wire = batch(count, first=first, size_bytes=PAYLOAD_BYTES, producer=PRODUCER, seq_nos=seq_nos)
    result = partition.append(wire)
    return {
        seq: int(offset)
        for seq, status, offset in zip(seq_nos, result.status, result.offsets, strict=True)
        if status == WRITTEN
    }


def started(
    tmp_path: Any, seed: int, clock: ManualClock, batch: MakeBatch, policy: FsyncPolicy
) -> tuple[str, FaultyFileSystem, Store, PartitionLog, dict[int, int]]:
    """A store on a faulty file system (no fault yet) with seq_nos 0..9 acknowledged:
    its root, file system, store, partition 0 and the acknowledged seq_no -> offset."""
    root = str(tmp_path / "store")
    fs = FaultyFileSystem(seed=seed)
    store, partition = open_store(root, fs, clock, policy)
    return root, fs, store, partition, send_many(partition, batch, 10)


def send_many(partition: PartitionLog, batch: MakeBatch, count: int) -> dict[int, int]:
    """Append seq_nos ``0..count-1`` in batches of two; all must be acknowledged as written."""
    acked: dict[int, int] = {}
    for first in range(0, count, 2):
        acked.update(send(partition, batch, first, min(2, count - first)))
    assert len(acked) == count
    return acked


def check_log(partition: PartitionLog, read_all: ReadAll, acked: dict[int, int]) -> list[int]:
    """Assert the log is whole and holds every acknowledged message; return its seq_nos.

    Whole: offsets dense from the log start, payloads intact, seq_nos a gap-free
    prefix ``0..k-1`` of what was sent (losing a tail is all a crash may do), and
    the producer's ``last_seq_no`` equal to the largest one stored.
    """
    rows = read_all(partition)
    offsets = [row["offset"] for row in rows]
    assert offsets == list(range(partition.start_offset, partition.end_offset)), "offsets dense"
    seq_nos = [row["seq_no"] for row in rows]
    assert seq_nos == list(range(len(rows))), f"seq_nos not a prefix: {seq_nos}"
    for row in rows:
        assert row["producer_id"] == PRODUCER
        assert row["data"] == f"m{row['seq_no']}".encode().ljust(PAYLOAD_BYTES, b".")
    for seq, offset in acked.items():
        assert offset < len(rows) and rows[offset]["seq_no"] == seq, f"acked {seq} lost"
    expected_last = seq_nos[-1] if seq_nos else None
    assert partition.last_seq_no(PRODUCER) == expected_last, "producer state != log"
    return seq_nos


def check_resends(partition: PartitionLog, batch: MakeBatch, stored: int, sent: int) -> None:
    """Resend seq_nos ``0..sent-1``: those stored are duplicates, the rest are written anew.

    A duplicate reports its first offset when the producer state still knows it, else -1.
    """
    seq_nos = list(range(sent))
    wire = batch(sent, size_bytes=PAYLOAD_BYTES, producer=PRODUCER, seq_nos=seq_nos)
    result = partition.append(wire)
    expected = [DUPLICATE] * stored + [WRITTEN] * (sent - stored)
    assert result.status.tolist() == expected
    for seq, offset in enumerate(result.offsets[:stored].tolist()):
        assert offset in (seq, -1), f"duplicate {seq} reported at {offset}"  # -1: not known
    assert result.offsets[stored:].tolist() == list(range(stored, sent))


# -- the simulator itself -------------------------------------------------------------------------
def test_power_cut_keeps_synced_bytes_and_forgets_unsynced_names(tmp_path: Any) -> None:
    fs = FaultyFileSystem(seed=1)
    directory = str(tmp_path)
    synced, unsynced = os.path.join(directory, "synced"), os.path.join(directory, "unsynced")
    fd = fs.open_write(synced)
    fs.pwrite(fd, b"durable", 0)
    fs.sync(fd)
    fs.sync_directory(directory)
    fs.pwrite(fd, b" and lost", 7)
    other = fs.open_write(unsynced)
    fs.pwrite(other, b"x", 0)
    fs.sync(other)  # data synced, but its name never was
    assert fs.unsynced_paths() == [synced, unsynced]
    fs.power_cut()
    with pytest.raises(SimulatedCrash):
        fs.pread(fd, 10, 0)
    fs.restart()
    assert fs.read_file(synced) == b"durable"
    assert not fs.exists(unsynced)


def test_failed_fsync_loses_its_pages_even_after_a_later_successful_sync(tmp_path: Any) -> None:
    fs = FaultyFileSystem(seed=2)
    path = os.path.join(str(tmp_path), "f")
    fd = fs.open_write(path)
    fs.sync_directory(str(tmp_path))
    fs.pwrite(fd, b"a" * PAGE_BYTES, 0)
    fs.sync(fd)
    fs.pwrite(fd, b"b" * PAGE_BYTES, PAGE_BYTES)
    fs.add_fault(Fault("sync", errno.EIO))
    with pytest.raises(StorageIOError):
        fs.sync(fd)
    fs.pwrite(fd, b"c" * PAGE_BYTES, 2 * PAGE_BYTES)
    fs.sync(fd)
    assert fs.pread(fd, 3 * PAGE_BYTES, 0)[PAGE_BYTES:-PAGE_BYTES] == b"b" * PAGE_BYTES
    fs.power_cut()
    fs.restart()
    on_disk = fs.read_file(path)
    assert on_disk == b"a" * PAGE_BYTES + bytes(PAGE_BYTES) + b"c" * PAGE_BYTES


# -- ENOSPC and EIO on write --------------------------------------------------------------------
@pytest.mark.parametrize("policy", ALL_POLICIES, ids=lambda p: p.value)
@pytest.mark.parametrize("torn", [False, True], ids=["nothing-written", "prefix-written"])
@pytest.mark.parametrize("error", [errno.ENOSPC, errno.EIO], ids=errno.errorcode.get)
def test_write_error_fails_the_append_fences_the_partition_and_loses_nothing_acked(
    tmp_path: Any,
    clock: ManualClock,
    batch: MakeBatch,
    read_all: ReadAll,
    policy: FsyncPolicy,
    torn: bool,
    error: int,
) -> None:
    root, fs, store, partition, acked = started(tmp_path, error, clock, batch, policy)
    fault = fs.add_fault(Fault("write", error, path_contains=".log", torn=torn))
    with pytest.raises(StorageIOError) as raised:
        send(partition, batch, 10, 2)
    assert fault.fired == 1
    assert not isinstance(raised.value, PartitionFencedError), "the first error is the cause"
    assert raised.value.sqlstate == "58030"
    assert raised.value.context["errno"] == error
    log_path = partition.segments[-1].log_path
    assert raised.value.context["path"] == log_path and log_path in str(raised.value)
    with pytest.raises(PartitionFencedError) as fenced:
        send(partition, batch, 10, 2)
    assert fenced.value.sqlstate == "58030"
    with pytest.raises(PartitionFencedError):
        partition.sync()
    assert partition.end_offset == 10, "the failed append never became visible"
    check_log(partition, read_all, acked)
    store.close()

    store, partition = open_store(root, FileSystem(), clock)
    try:
        assert check_log(partition, read_all, acked) == list(range(10))
        active = partition.segments[-1]
        assert os.path.getsize(active.log_path) == active.size_bytes, "no torn bytes are left"
        check_resends(partition, batch, stored=10, sent=12)
        assert send(partition, batch, 12, 1) == {12: 12}, "the reopened partition takes writes"
    finally:
        store.close()


# -- EIO on fsync -------------------------------------------------------------------------------
@pytest.mark.parametrize("policy", SYNCED_POLICIES, ids=lambda p: p.value)
def test_failed_fsync_is_not_acknowledged_and_fences_until_reopen(
    tmp_path: Any,
    clock: ManualClock,
    batch: MakeBatch,
    read_all: ReadAll,
    policy: FsyncPolicy,
) -> None:
    root, fs, store, partition, acked = started(tmp_path, 3, clock, batch, policy)
    fs.add_fault(Fault("sync", errno.EIO, path_contains=".log"))
    with pytest.raises(StorageIOError) as raised:
        send(partition, batch, 10, 2)
    assert raised.value.context["errno"] == errno.EIO
    assert "could not fsync" in str(raised.value)
    assert partition.end_offset == 10, "readers never saw the unsynced append"
    with pytest.raises(PartitionFencedError):
        send(partition, batch, 12, 1)
    store.close()

    store, partition = open_store(root, FileSystem(), clock)
    try:
        stored = len(check_log(partition, read_all, acked))
        assert stored in (10, 12), "the unacknowledged batch is kept whole or not at all"
        assert send(partition, batch, 12, 1) == {12: stored}
    finally:
        store.close()


@pytest.mark.parametrize("policy", SYNCED_POLICIES, ids=lambda p: p.value)
def test_reopen_after_a_failed_fsync_keeps_every_later_ack_through_a_power_cut(
    tmp_path: Any,
    clock: ManualClock,
    batch: MakeBatch,
    read_all: ReadAll,
    policy: FsyncPolicy,
) -> None:
    """fsyncgate: the failed fsync's pages are still in the page cache but not on disk.

    The store is reopened in the same process (same page cache), the producer
    resends the failed batch and goes on; then the power fails. Whatever the
    reopened store acknowledged, as written *or as a duplicate*, must be on disk.
    """
    root, fs, store, partition, acked = started(tmp_path, 4, clock, batch, policy)
    fs.add_fault(Fault("sync", errno.EIO, path_contains=".log"))
    with pytest.raises(StorageIOError):
        send(partition, batch, 10, 2)
    store.close()

    store, partition = open_store(root, fs, clock)
    result = partition.append(
        batch(2, first=10, size_bytes=PAYLOAD_BYTES, producer=PRODUCER, seq_nos=[10, 11])
    )
    acked.update({10: int(result.offsets[0]), 11: int(result.offsets[1])})
    acked.update(send(partition, batch, 12, 2))
    assert sorted(acked) == list(range(14))
    fs.power_cut()
    fs.restart()

    store, partition = open_store(root, fs, clock)
    try:
        assert check_log(partition, read_all, acked) == list(range(14))
    finally:
        store.close()


# -- torn write, then a crash ---------------------------------------------------------------------
@pytest.mark.parametrize("policy", ALL_POLICIES, ids=lambda p: p.value)
def test_torn_write_then_crash_reopens_at_the_last_whole_frame(
    tmp_path: Any,
    clock: ManualClock,
    batch: MakeBatch,
    read_all: ReadAll,
    policy: FsyncPolicy,
) -> None:
    root, fs, _, partition, acked = started(tmp_path, 5, clock, batch, policy)
    fs.add_fault(Fault("write", None, path_contains=".log", torn=True))
    with pytest.raises(SimulatedCrash):
        send(partition, batch, 10, 2)
    with pytest.raises(SimulatedCrash):
        fs.list_directory(root)  # the process is dead: the store object is abandoned

    store, partition = open_store(root, FileSystem(), clock)
    try:
        assert partition.recovery.truncated_bytes > 0, "the torn frame was cut"
        assert check_log(partition, read_all, acked) == list(range(10))
        check_resends(partition, batch, stored=10, sent=12)
    finally:
        store.close()


# -- power cuts ----------------------------------------------------------------------------------
@pytest.mark.parametrize("policy", SYNCED_POLICIES, ids=lambda p: p.value)
def test_power_cut_keeps_the_first_acknowledged_append_of_a_new_partition(
    tmp_path: Any,
    clock: ManualClock,
    batch: MakeBatch,
    read_all: ReadAll,
    policy: FsyncPolicy,
) -> None:
    """The first segment's log file is created by the first append; its name must be durable
    before that append is acknowledged, not only at the first roll."""
    root = str(tmp_path / "store")
    fs = FaultyFileSystem(seed=6)
    _, partition = open_store(root, fs, clock, policy)
    acked = send(partition, batch, 0, 2)
    fs.power_cut()
    fs.restart()

    store, partition = open_store(root, fs, clock)
    try:
        assert check_log(partition, read_all, acked) == [0, 1]
    finally:
        store.close()


def test_power_cut_keeps_a_new_topic_whose_directories_need_their_parent_synced(
    tmp_path: Any, clock: ManualClock, batch: MakeBatch, read_all: ReadAll
) -> None:
    """Strict POSIX: a new directory's entry is durable once its parent is synced, not before.

    (ext4 and XFS commit a mkdir with any later fsync's journal flush; other file
    systems need the parent synced, as PostgreSQL does in ``fsync_parent_path``.)
    """
    root = str(tmp_path / "store")
    fs = FaultyFileSystem(seed=9, strict_directories=True)
    _, partition = open_store(root, fs, clock, FsyncPolicy.ALWAYS)
    acked = send_many(partition, batch, 30)
    assert len(partition.segments) > 1, "rolled: the segments' own names were synced"
    fs.power_cut()
    fs.restart()

    store, partition = open_store(root, fs, clock)
    try:
        assert check_log(partition, read_all, acked) == list(range(30))
    finally:
        store.close()


def _write_until_cut(
    partition: PartitionLog, batch: MakeBatch, fs: FaultyFileSystem, seed: int
) -> tuple[dict[int, int], int]:
    """Append random-sized batches over several segments; the last one tears and crashes.

    Returns the acknowledged seq_nos and how many seq_nos were sent in all.
    """
    rng = random.Random(seed)
    acked: dict[int, int] = {}
    sent = 0
    for _ in range(rng.randint(20, 40)):
        count = rng.randint(1, 4)
        acked.update(send(partition, batch, sent, count))
        sent += count
    assert len(partition.segments) > 2, "the workload spans several segments"
    fs.add_fault(Fault("write", None, path_contains=".log", torn=True))
    with pytest.raises(SimulatedCrash):
        send(partition, batch, sent, 3)
    return acked, sent + 3


@pytest.mark.parametrize("seed", [11, 12, 13])
@pytest.mark.parametrize("partial", [False, True], ids=["cache-lost", "partial-writeback"])
@pytest.mark.parametrize("policy", SYNCED_POLICIES, ids=lambda p: p.value)
def test_power_cut_keeps_every_acknowledged_message_when_appends_are_synced(
    tmp_path: Any,
    clock: ManualClock,
    batch: MakeBatch,
    read_all: ReadAll,
    policy: FsyncPolicy,
    partial: bool,
    seed: int,
) -> None:
    root = str(tmp_path / "store")
    fs = FaultyFileSystem(seed=seed)
    _, partition = open_store(root, fs, clock, policy)
    acked, sent = _write_until_cut(partition, batch, fs, seed)
    fs.power_cut(partial_writeback=partial)
    fs.restart()

    store, partition = open_store(root, fs, clock)
    try:
        stored = check_log(partition, read_all, acked)
        assert len(stored) == len(acked), f"seed {seed}: only acknowledged messages are kept"
        check_resends(partition, batch, stored=len(stored), sent=sent)
    finally:
        store.close()


@pytest.mark.parametrize("seed", [21, 22, 23, 24])
@pytest.mark.parametrize("partial", [False, True], ids=["cache-lost", "partial-writeback"])
def test_power_cut_under_never_may_lose_acknowledged_tail_but_reopens_consistent(
    tmp_path: Any,
    clock: ManualClock,
    batch: MakeBatch,
    read_all: ReadAll,
    partial: bool,
    seed: int,
) -> None:
    root = str(tmp_path / "store")
    fs = FaultyFileSystem(seed=seed)
    _, partition = open_store(root, fs, clock, FsyncPolicy.NEVER)
    acked, sent = _write_until_cut(partition, batch, fs, seed)
    assert fs.unsynced_paths(), "NEVER leaves acknowledged data in the page cache only"
    fs.power_cut(partial_writeback=partial)
    fs.restart()

    store, partition = open_store(root, fs, clock)
    try:
        survivors = {seq: offset for seq, offset in acked.items() if offset < partition.end_offset}
        stored = check_log(partition, read_all, survivors)
        check_resends(partition, batch, stored=len(stored), sent=sent)
    finally:
        store.close()


# -- the staging log ----------------------------------------------------------------------------
def _staged_batch(index: int) -> pa.RecordBatch:
    return build_wire_batch([f"staged {index}".encode().ljust(PAYLOAD_BYTES, b".")])


def test_staging_fsync_error_fails_stage_so_the_transaction_cannot_commit(
    tmp_path: Any,
) -> None:
    fs = FaultyFileSystem(seed=7)
    directory = str(tmp_path / "staging")
    staging = StagingLog(fs, directory)
    first = staging.stage(1, [_staged_batch(1)])
    fs.add_fault(Fault("sync", errno.EIO, path_contains=".stage"))
    with pytest.raises(StorageIOError) as raised:
        staging.stage(2, [_staged_batch(2)])  # no placements: no commit record can name them
    assert raised.value.context["errno"] == errno.EIO
    third = staging.stage(3, [_staged_batch(3)])
    fs.power_cut()
    fs.restart()

    reopened = StagingLog(fs, directory)
    try:
        for placed, index in ((first, 1), (third, 3)):
            data = reopened.read(placed[0]).column("data").to_pylist()
            assert data == [f"staged {index}".encode().ljust(PAYLOAD_BYTES, b".")]
    finally:
        reopened.close()


def test_staging_directory_sync_error_is_retried_before_a_later_stage_is_acknowledged(
    tmp_path: Any,
) -> None:
    """A staging file whose name never reached the disk must not receive acknowledged stages."""
    fs = FaultyFileSystem(seed=8)
    directory = str(tmp_path / "staging")
    staging = StagingLog(fs, directory)
    fs.add_fault(Fault("sync_directory", errno.EIO, path_contains="staging"))
    with pytest.raises(StorageIOError):
        staging.stage(1, [_staged_batch(1)])
    placed = staging.stage(2, [_staged_batch(2)])
    fs.power_cut()
    fs.restart()

    reopened = StagingLog(fs, directory)
    try:
        data = reopened.read(placed[0]).column("data").to_pylist()
        assert data == [b"staged 2".ljust(PAYLOAD_BYTES, b".")]
    finally:
        reopened.close()
