"""Tests of storage/partition_log.py: appends, reads, rolls, long polls, fsync policies.

Recovery on reopen (storage/log_loader.py) is tested here too, in process: the
files are damaged between a close and a reopen, as a crash or a bad disk would.
Kill-based crash tests live in test_crash_*.py.
"""

from __future__ import annotations

import itertools
import os
import shutil
import threading
import time
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pytest

from storage import file_names, limits
from storage.clock import ManualClock
from storage.config import FsyncPolicy
from storage.errors import (
    CorruptSegmentError,
    InvalidParameterValueError,
    LimitExceededError,
    PartitionFencedError,
    StorageIOError,
)
from storage.fs import FileSystem
from storage.partition_log import DUPLICATE, WRITTEN, PartitionLog
from storage.record_batch import build_wire_batch

OpenPartition = Callable[..., PartitionLog]
MakeBatch = Callable[..., pa.RecordBatch]
ReadAll = Callable[..., list[dict[str, Any]]]


def _fill(partition: PartitionLog, batch: MakeBatch, batches: int, per_batch: int) -> None:
    for _ in range(batches):
        partition.append(batch(per_batch, first=partition.end_offset))


# -- appends and reads ----------------------------------------------------------------------


def test_new_partition_is_empty(open_partition: OpenPartition) -> None:
    partition = open_partition()
    assert (partition.start_offset, partition.end_offset, partition.size_bytes) == (0, 0, 0)
    result = partition.read(0)
    assert result.batches == [] and result.next_offset == 0 and result.end_offset == 0


def test_append_assigns_dense_offsets(open_partition: OpenPartition, batch: MakeBatch) -> None:
    partition = open_partition()
    first = partition.append(batch(3))
    second = partition.append(batch(2, first=3))
    assert first.offsets.tolist() == [0, 1, 2] and second.offsets.tolist() == [3, 4]
    assert first.status.tolist() == [WRITTEN] * 3
    assert (first.written_count, first.duplicate_count) == (3, 0)
    assert partition.end_offset == 5


def test_read_returns_messages_with_offsets_and_written_at(
    open_partition: OpenPartition, batch: MakeBatch, clock: ManualClock
) -> None:
    partition = open_partition()
    partition.append(batch(2, created_at_us=11, metadata=[{"k": b"v"}, None]))
    rows = partition.read(0).batches[0].to_pylist()
    assert [row["offset"] for row in rows] == [0, 1]
    assert rows[0]["data"].startswith(b"m0") and rows[1]["data"].startswith(b"m1")
    assert rows[0]["metadata"] == [("k", b"v")] and rows[1]["metadata"] is None
    written_at = pa.array([rows[0]["written_at"]]).cast(pa.int64())[0].as_py()
    assert written_at == clock.now_us()


def test_read_from_mid_batch_starts_at_that_offset(
    open_partition: OpenPartition, batch: MakeBatch
) -> None:
    partition = open_partition()
    partition.append(batch(10))
    result = partition.read(4)
    assert result.batches[0].column("offset").to_pylist() == list(range(4, 10))
    assert result.next_offset == 10


def test_read_respects_max_messages(
    open_partition: OpenPartition, batch: MakeBatch, read_all: ReadAll
) -> None:
    partition = open_partition()
    _fill(partition, batch, batches=5, per_batch=4)
    result = partition.read(3, max_messages=6)
    offsets = [o for b in result.batches for o in b.column("offset").to_pylist()]
    assert offsets == list(range(3, 9)) and result.next_offset == 9
    assert [row["offset"] for row in read_all(partition)] == list(range(20))


def test_max_bytes_always_returns_at_least_one_batch(
    open_partition: OpenPartition, batch: MakeBatch
) -> None:
    partition = open_partition()
    _fill(partition, batch, batches=3, per_batch=5)
    result = partition.read(0, max_bytes=1)
    assert len(result.batches) == 1 and result.message_count == 5
    assert result.next_offset == 5


def test_max_bytes_stops_after_the_budget(open_partition: OpenPartition, batch: MakeBatch) -> None:
    partition = open_partition()
    _fill(partition, batch, batches=10, per_batch=1)
    frame_bytes = partition.size_bytes // 10
    result = partition.read(0, max_bytes=3 * frame_bytes)
    assert result.message_count == 3


def test_read_past_end_returns_no_records(open_partition: OpenPartition, batch: MakeBatch) -> None:
    partition = open_partition()
    partition.append(batch(3))
    for offset in (3, 4, 1000):
        result = partition.read(offset)
        assert result.batches == [] and result.end_offset == 3


def test_read_below_the_log_start_is_clamped(
    open_partition: OpenPartition, batch: MakeBatch
) -> None:
    partition = open_partition()
    partition.append(batch(3))
    partition.roll()
    partition.append(batch(3, first=3))
    partition.delete_segments_before(3)
    result = partition.read(0)
    assert result.start_offset == 3
    assert result.batches[0].column("offset").to_pylist() == [3, 4, 5]


def test_read_limits_out_of_range_raise_54000(open_partition: OpenPartition) -> None:
    partition = open_partition()
    for limits_ in ({"max_messages": 0}, {"max_bytes": 0}, {"max_messages": 10**9}):
        with pytest.raises(LimitExceededError) as raised:
            partition.read(0, **limits_)
        assert raised.value.sqlstate == "54000"


def test_sliced_batch_appends_only_its_rows(
    open_partition: OpenPartition, batch: MakeBatch, read_all: ReadAll
) -> None:
    partition = open_partition()
    partition.append(batch(5).slice(2, 2))
    assert [row["data"][:2] for row in read_all(partition)] == [b"m2", b"m3"]


def test_append_many_writes_batches_back_to_back(
    open_partition: OpenPartition, batch: MakeBatch, read_all: ReadAll
) -> None:
    partition = open_partition()
    results = partition.append_many([batch(2), batch(3, first=2)])
    assert [r.offsets.tolist() for r in results] == [[0, 1], [2, 3, 4]]
    assert len(read_all(partition)) == 5


def test_written_at_never_goes_backwards(
    open_partition: OpenPartition, batch: MakeBatch, read_all: ReadAll
) -> None:
    partition = open_partition()
    for _ in range(5):
        partition.append(batch(1))
    stamps = [row["written_at"] for row in read_all(partition)]
    assert stamps == sorted(stamps)


# -- rolls ----------------------------------------------------------------------------------


def test_segment_rolls_when_full(open_partition: OpenPartition, batch: MakeBatch) -> None:
    partition = open_partition(segment_bytes=2048)
    _fill(partition, batch, batches=10, per_batch=2)
    segments = partition.segments
    assert len(segments) >= 4
    for segment, following in itertools.pairwise(segments):
        assert segment.next_offset == following.base_offset
        assert segment.size_bytes >= 2048 or segment is segments[-1]
    assert segments[-1].next_offset == partition.end_offset == 20


def test_segment_rolls_when_too_old(
    open_partition: OpenPartition, batch: MakeBatch, clock: ManualClock
) -> None:
    partition = open_partition(segment_ms=60_000)
    partition.append(batch(1))
    clock.advance(seconds=59)
    partition.append(batch(1))
    assert len(partition.segments) == 1
    clock.advance(seconds=1)
    partition.append(batch(1))
    assert [s.base_offset for s in partition.segments] == [0, 2]


def test_roll_seals_and_snapshots(
    open_partition: OpenPartition, batch: MakeBatch, partition_dir: str
) -> None:
    partition = open_partition()
    partition.append(batch(3))
    partition.roll()
    partition.roll()  # an empty active segment is not rolled again
    names = os.listdir(partition_dir)
    assert file_names.snapshot_file(3) in names
    assert file_names.offset_index_file(0) in names and file_names.time_index_file(0) in names
    assert [s.base_offset for s in partition.segments] == [0, 3]


def test_reads_cross_segment_boundaries(
    open_partition: OpenPartition, batch: MakeBatch, read_all: ReadAll
) -> None:
    partition = open_partition(segment_bytes=1024)
    _fill(partition, batch, batches=8, per_batch=3)
    assert [row["offset"] for row in read_all(partition, 4)] == list(range(4, 24))
    assert partition.read(7, max_messages=5).next_offset == 12


# -- reads by time ----------------------------------------------------------------------------


def test_offset_for_time_finds_the_first_message_at_or_after(
    open_partition: OpenPartition, batch: MakeBatch, clock: ManualClock
) -> None:
    partition = open_partition(segment_bytes=4096)
    start = clock.now_us()
    for _ in range(30):
        partition.append(batch(2, first=partition.end_offset, size_bytes=200))
        clock.advance(seconds=1)
    assert len(partition.segments) > 2
    assert partition.offset_for_time(0) == 0
    assert partition.offset_for_time(start) == 0
    assert partition.offset_for_time(start + 1) == 2
    assert partition.offset_for_time(start + 17_000_000) == 34
    assert partition.offset_for_time(start + 17_000_001) == 36
    assert partition.offset_for_time(clock.now_us()) == partition.end_offset == 60


def test_offset_for_time_with_equal_timestamps_gives_the_first(
    open_partition: OpenPartition, batch: MakeBatch, clock: ManualClock
) -> None:
    partition = open_partition()
    _fill(partition, batch, batches=10, per_batch=1)
    assert partition.offset_for_time(clock.now_us()) == 0
    assert partition.offset_for_time(clock.now_us() + 1) == 10


# -- long polls -------------------------------------------------------------------------------


def test_wait_for_data_is_woken_by_an_append(
    open_partition: OpenPartition, batch: MakeBatch
) -> None:
    partition = open_partition()
    writer = threading.Timer(0.05, lambda: partition.append(batch(1)))
    started = time.monotonic()
    writer.start()
    try:
        assert partition.wait_for_data(0, timeout_s=0.45)
    finally:
        writer.join()
    assert time.monotonic() - started < 0.4
    assert partition.end_offset == 1


def test_wait_for_data_times_out_when_nothing_comes(open_partition: OpenPartition) -> None:
    partition = open_partition()
    started = time.monotonic()
    assert not partition.wait_for_data(0, timeout_s=0.1)
    assert 0.09 <= time.monotonic() - started < 0.4


def test_wait_for_data_returns_at_once_when_data_is_there(
    open_partition: OpenPartition, batch: MakeBatch
) -> None:
    partition = open_partition()
    partition.append(batch(2))
    assert partition.wait_for_data(1, timeout_s=0.0)
    assert not partition.wait_for_data(2, timeout_s=0.0)


def test_close_wakes_a_waiter(open_partition: OpenPartition) -> None:
    partition = open_partition()
    closer = threading.Timer(0.05, partition.close)
    closer.start()
    started = time.monotonic()
    try:
        assert not partition.wait_for_data(0, timeout_s=0.45)
    finally:
        closer.join()
    assert time.monotonic() - started < 0.4


def test_wait_over_the_limit_raises_54000(open_partition: OpenPartition) -> None:
    partition = open_partition()
    with pytest.raises(LimitExceededError) as raised:
        partition.wait_for_data(0, timeout_s=301)
    assert raised.value.sqlstate == "54000"


# -- lifecycle -------------------------------------------------------------------------------


def test_closed_partition_refuses_appends(open_partition: OpenPartition, batch: MakeBatch) -> None:
    partition = open_partition()
    partition.close()
    with pytest.raises(StorageIOError, match="closed"):
        partition.append(batch(1))


def test_reopen_keeps_messages_and_offsets(
    open_partition: OpenPartition, batch: MakeBatch, read_all: ReadAll
) -> None:
    partition = open_partition(segment_bytes=2048)
    _fill(partition, batch, batches=10, per_batch=3)
    before = read_all(partition)
    partition.close()
    again = open_partition(segment_bytes=2048)
    assert again.end_offset == 30 and read_all(again) == before
    assert again.append(batch(1)).offsets.tolist() == [30]
    assert again.recovery.truncated_bytes == 0 and again.recovery.rebuilt_indexes == 0


def test_reopen_after_retention_emptied_all_but_a_fresh_segment_keeps_offsets(
    open_partition: OpenPartition, batch: MakeBatch
) -> None:
    partition = open_partition()
    partition.append(batch(5))
    partition.roll()
    assert partition.delete_segments_before(5) == 1
    partition.close()
    again = open_partition()
    assert (again.start_offset, again.end_offset) == (5, 5)
    assert again.append(batch(1)).offsets.tolist() == [5]


# -- exactly-once publish at the partition --------------------------------------------------------


def test_resend_is_skipped_and_reports_earlier_offsets(
    open_partition: OpenPartition, batch: MakeBatch
) -> None:
    partition = open_partition()
    partition.append(batch(1, producer="other", seq_nos=[1]))
    first = partition.append(batch(3, producer="p", seq_nos=[1, 2, 3]))
    again = partition.append(batch(3, producer="p", seq_nos=[1, 2, 3]))
    assert again.status.tolist() == [DUPLICATE] * 3
    assert again.offsets.tolist() == first.offsets.tolist() == [1, 2, 3]
    assert partition.end_offset == 4


def test_partial_resend_writes_only_the_new_messages(
    open_partition: OpenPartition, batch: MakeBatch, read_all: ReadAll
) -> None:
    partition = open_partition()
    partition.append(batch(2, producer="p", seq_nos=[1, 2]))
    result = partition.append(batch(3, producer="p", seq_nos=[2, 3, 4]))
    assert result.status.tolist() == [DUPLICATE, WRITTEN, WRITTEN]
    assert result.offsets.tolist() == [1, 2, 3]
    assert [row["seq_no"] for row in read_all(partition)] == [1, 2, 3, 4]


def test_seq_no_gaps_are_allowed_and_older_seq_nos_are_duplicates(
    open_partition: OpenPartition, batch: MakeBatch
) -> None:
    partition = open_partition()
    assert partition.append(batch(2, producer="p", seq_nos=[5, 100])).written_count == 2
    gap = partition.append(batch(2, producer="p", seq_nos=[50, 101]))
    assert gap.status.tolist() == [DUPLICATE, WRITTEN]
    assert gap.offsets.tolist() == [-1, 2], "seq_no 50 was never written: no earlier offset"
    assert partition.last_seq_no("p") == 101


def test_duplicates_within_one_batch_are_skipped(
    open_partition: OpenPartition, batch: MakeBatch, read_all: ReadAll
) -> None:
    partition = open_partition()
    result = partition.append(batch(4, producer="p", seq_nos=[1, 1, 3, 2]))
    assert result.status.tolist() == [WRITTEN, DUPLICATE, WRITTEN, DUPLICATE]
    assert [row["seq_no"] for row in read_all(partition)] == [1, 3]


def test_null_seq_no_is_assigned_after_the_last(
    open_partition: OpenPartition, batch: MakeBatch, read_all: ReadAll
) -> None:
    partition = open_partition()
    partition.append(batch(1, producer="p", seq_nos=[10]))
    result = partition.append(batch(3, producer="p", seq_nos=[None, 20, None]))
    assert result.status.tolist() == [WRITTEN] * 3
    assert [row["seq_no"] for row in read_all(partition)] == [10, 11, 20, 21]
    assert partition.last_seq_no("p") == 21


def test_assigned_seq_nos_leave_other_producers_nulls_alone(
    open_partition: OpenPartition, read_all: ReadAll
) -> None:
    partition = open_partition()
    partition.append(
        build_wire_batch([b"a", b"b", b"c"], seq_no=[None, None, 7], producer_id=["p", None, None])
    )
    assert [row["seq_no"] for row in read_all(partition)] == [0, None, 7]


def test_messages_without_producer_never_dedup(
    open_partition: OpenPartition, batch: MakeBatch
) -> None:
    partition = open_partition()
    for _ in range(3):
        result = partition.append(batch(2, seq_nos=[1, 1]))
        assert result.status.tolist() == [WRITTEN, WRITTEN]
    grouped = partition.append(batch(2, seq_nos=[1, 1], message_group_id="g"))
    assert grouped.written_count == 2
    assert partition.end_offset == 8


def test_negative_seq_no_is_refused(open_partition: OpenPartition, batch: MakeBatch) -> None:
    partition = open_partition()
    with pytest.raises(InvalidParameterValueError):
        partition.append(batch(1, producer="p", seq_nos=[-1]))
    assert partition.end_offset == 0


def test_producer_state_survives_close_and_reopen(
    open_partition: OpenPartition, batch: MakeBatch, partition_dir: str
) -> None:
    partition = open_partition()
    partition.append(batch(3, producer="p", seq_nos=[1, 2, 3]))
    partition.close()
    assert any(n.endswith(file_names.SNAPSHOT_SUFFIX) for n in os.listdir(partition_dir))
    again = open_partition()
    assert again.last_seq_no("p") == 3
    resend = again.append(batch(4, producer="p", seq_nos=[1, 2, 3, 4]))
    assert resend.status.tolist() == [DUPLICATE, DUPLICATE, DUPLICATE, WRITTEN]
    assert resend.offsets.tolist()[2:] == [2, 3], "the last seq_no's offset is remembered"


def test_producer_state_survives_an_unclean_stop_by_log_replay(
    open_partition: OpenPartition, batch: MakeBatch, partition_dir: str, tmp_path: Any
) -> None:
    partition = open_partition(segment_bytes=1024, fsync_policy=FsyncPolicy.ALWAYS)
    for seq_no in range(1, 11):
        partition.append(batch(1, producer="p", seq_nos=[seq_no]))
    partition.append(batch(1, producer="q", seq_nos=[7]))
    copy = os.path.join(str(tmp_path), "copy")
    shutil.copytree(partition_dir, copy)  # as a crash would leave it: no close
    for name in os.listdir(copy):
        if name.endswith(file_names.SNAPSHOT_SUFFIX):
            os.remove(os.path.join(copy, name))
    again = open_partition(directory=copy)
    assert (again.last_seq_no("p"), again.last_seq_no("q")) == (10, 7)
    result = again.append(batch(3, producer="p", seq_nos=[9, 10, 11]))
    assert result.status.tolist() == [DUPLICATE, DUPLICATE, WRITTEN]
    assert result.offsets.tolist() == [-1, 9, 11]


def test_producer_state_replays_the_log_after_the_newest_snapshot(
    open_partition: OpenPartition, batch: MakeBatch, partition_dir: str, tmp_path: Any
) -> None:
    partition = open_partition()
    partition.append(batch(1, producer="p", seq_nos=[1]))
    partition.roll()  # snapshot at offset 1
    partition.append(batch(1, producer="p", seq_nos=[2]))
    copy = os.path.join(str(tmp_path), "copy")
    shutil.copytree(partition_dir, copy)
    assert open_partition(directory=copy).last_seq_no("p") == 2


def test_producer_expires_after_14_days_and_is_then_written_again(
    open_partition: OpenPartition, batch: MakeBatch, clock: ManualClock
) -> None:
    partition = open_partition()
    partition.append(batch(1, producer="p", seq_nos=[1]))
    clock.advance(seconds=14 * 24 * 3600 - 1)
    assert partition.append(batch(1, producer="p", seq_nos=[1])).status.tolist() == [DUPLICATE]
    clock.advance(seconds=14 * 24 * 3600)
    assert partition.last_seq_no("p") is None
    assert partition.append(batch(1, producer="p", seq_nos=[1])).status.tolist() == [WRITTEN]


def test_expired_producer_stays_forgotten_after_reopen(
    open_partition: OpenPartition, batch: MakeBatch, clock: ManualClock
) -> None:
    partition = open_partition()
    partition.append(batch(1, producer="p", seq_nos=[1]))
    partition.close()
    clock.advance(seconds=15 * 24 * 3600)
    again = open_partition()
    assert again.last_seq_no("p") is None
    assert again.append(batch(1, producer="p", seq_nos=[1])).written_count == 1


# -- fsync policies ------------------------------------------------------------------------------


def test_always_syncs_every_append(
    open_partition: OpenPartition, batch: MakeBatch, fs: FileSystem
) -> None:
    partition = open_partition(fsync_policy=FsyncPolicy.ALWAYS)
    for count in range(1, 6):
        before = fs.fsync_count
        partition.append(batch(count))
        assert fs.fsync_count - before >= 1


def test_never_syncs_only_when_a_segment_is_sealed(
    open_partition: OpenPartition, batch: MakeBatch, fs: FileSystem
) -> None:
    partition = open_partition(fsync_policy=FsyncPolicy.NEVER, segment_bytes=1024)
    before = fs.fsync_count
    _fill(partition, batch, batches=20, per_batch=2)
    rolls = len(partition.segments) - 1
    assert rolls > 0
    # Appends never sync; each roll syncs the sealed segment's log once (recovery
    # trusts sealed segments), and nothing else.
    assert fs.fsync_count - before == rolls


def test_failed_fsync_fences_the_partition_until_reopen(
    open_partition: OpenPartition, batch: MakeBatch, read_all: ReadAll, failing_sync: Any
) -> None:
    failing = failing_sync
    partition = open_partition(file_system=failing, fsync_policy=FsyncPolicy.ALWAYS)
    partition.append(batch(1))
    failing.fail = True
    with pytest.raises(StorageIOError):
        partition.append(batch(1, first=1))
    failing.fail = False
    with pytest.raises(PartitionFencedError) as raised:
        partition.append(batch(1, first=2))
    assert raised.value.sqlstate == "58030"
    assert partition.end_offset == 1, "the unsynced append never became visible"
    partition.close()
    again = open_partition(file_system=failing, fsync_policy=FsyncPolicy.ALWAYS)
    assert again.append(batch(1, first=9)).written_count == 1


class _CountingWriteback(FileSystem):
    """Records writeback hints; fails them when told to."""

    def __init__(self) -> None:
        super().__init__()
        self.hints: list[tuple[int, int]] = []
        self.fail = False

    def start_writeback(self, fd: int, position: int, size: int) -> None:
        if self.fail:
            raise StorageIOError("could not start writeback (test)", path="?")
        self.hints.append((position, size))
        super().start_writeback(fd, position, size)


def test_writeback_is_started_every_interval_and_does_not_count_as_fsync(
    open_partition: OpenPartition, batch: MakeBatch, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(limits, "WRITEBACK_INTERVAL_BYTES", 8192)
    hinting = _CountingWriteback()
    partition = open_partition(file_system=hinting, fsync_policy=FsyncPolicy.NEVER)
    for first in range(0, 40, 2):
        partition.append(batch(2, first=first, size_bytes=1000))
    assert hinting.fsync_count == 0
    assert len(hinting.hints) >= 3
    # The hints cover the log from 0 on, back to back, each at least one interval long.
    position = 0
    for start, size in hinting.hints:
        assert start == position and size >= 8192
        position += size
    assert position <= partition.size_bytes


def test_failed_writeback_fences_the_partition_like_a_failed_write(
    open_partition: OpenPartition, batch: MakeBatch, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(limits, "WRITEBACK_INTERVAL_BYTES", 8192)
    hinting = _CountingWriteback()
    partition = open_partition(file_system=hinting, fsync_policy=FsyncPolicy.NEVER)
    partition.append(batch(2, size_bytes=1000))
    hinting.fail = True
    with pytest.raises(StorageIOError):
        for first in range(2, 40, 2):
            partition.append(batch(2, first=first, size_bytes=1000))
    acknowledged = partition.end_offset
    with pytest.raises(PartitionFencedError):
        partition.append(batch(1, first=100))
    partition.close()
    again = open_partition(file_system=FileSystem(), fsync_policy=FsyncPolicy.NEVER)
    assert again.end_offset == acknowledged, "the append that failed was cut, nothing else"


# -- recovery on reopen ----------------------------------------------------------------------------


def _segment_paths(directory: str) -> list[str]:
    return [
        os.path.join(directory, n)
        for n in sorted(os.listdir(directory))
        if n.endswith(file_names.LOG_SUFFIX)
    ]


def _frame_positions(partition: PartitionLog, segment_index: int) -> list[tuple[int, int]]:
    """(position, base offset) of every frame of a segment."""
    segment = partition.segments[segment_index]
    return [
        (frame.position, frame.header.base_offset)
        for frame in segment.scan(segment.base_offset, segment.size_bytes, 1 << 20)
    ]


def _flip(path: str, position: int) -> None:
    with open(path, "r+b") as file:
        file.seek(position)
        value = file.read(1)[0]
        file.seek(position)
        file.write(bytes([value ^ 0x5A]))


def test_torn_tail_is_cut_back_to_the_last_whole_frame(
    open_partition: OpenPartition, batch: MakeBatch, partition_dir: str, read_all: ReadAll
) -> None:
    partition = open_partition()
    _fill(partition, batch, batches=5, per_batch=2)
    last_position = _frame_positions(partition, 0)[-1][0]
    size = partition.size_bytes
    partition.close()
    (log_path,) = _segment_paths(partition_dir)
    os.truncate(log_path, last_position + (size - last_position) // 2)
    again = open_partition()
    assert again.recovery.truncated_bytes == (size - last_position) // 2
    assert again.end_offset == 8
    assert [row["offset"] for row in read_all(again)] == list(range(8))
    assert again.append(batch(2, first=8)).offsets.tolist() == [8, 9]
    assert [row["offset"] for row in read_all(again)] == list(range(10))


def test_torn_tail_lets_the_producer_resend_what_was_lost(
    open_partition: OpenPartition, batch: MakeBatch, partition_dir: str
) -> None:
    partition = open_partition()
    partition.append(batch(1, producer="p", seq_nos=[1]))
    partition.append(batch(1, producer="p", seq_nos=[2]))
    last_position = _frame_positions(partition, 0)[-1][0]
    partition.close()  # snapshot at offset 2, which the cut makes stale
    (log_path,) = _segment_paths(partition_dir)
    os.truncate(log_path, last_position + 20)
    again = open_partition()
    assert again.end_offset == 1 and again.last_seq_no("p") == 1
    assert again.append(batch(1, producer="p", seq_nos=[2])).offsets.tolist() == [1]


def test_missing_indexes_of_a_sealed_segment_are_rebuilt(
    open_partition: OpenPartition,
    batch: MakeBatch,
    partition_dir: str,
    read_all: ReadAll,
    clock: ManualClock,
) -> None:
    partition = open_partition(segment_bytes=16_384)
    start = clock.now_us()
    for _ in range(40):
        partition.append(batch(2, first=partition.end_offset, size_bytes=300))
        clock.advance(seconds=1)
    before = read_all(partition)
    sealed = partition.segments[0]
    assert len(sealed.offset_index) > 2
    partition.close()
    os.remove(sealed.offset_index.path)
    os.remove(sealed.time_index.path)
    again = open_partition(segment_bytes=16_384)
    assert again.recovery.rebuilt_indexes == 1
    assert os.path.exists(sealed.offset_index.path) and os.path.exists(sealed.time_index.path)
    assert read_all(again) == before
    middle = sealed.next_offset // 2 + 1
    assert again.read(middle).batches[0].column("offset")[0].as_py() == middle
    assert again.offset_for_time(start + 5_000_001) == 12


def test_torn_index_of_a_sealed_segment_is_rebuilt(
    open_partition: OpenPartition, batch: MakeBatch, partition_dir: str, read_all: ReadAll
) -> None:
    partition = open_partition(segment_bytes=8192)
    _fill(partition, batch, batches=30, per_batch=2)
    before = read_all(partition)
    index_path = partition.segments[0].offset_index.path
    partition.close()
    with open(index_path, "ab") as file:
        file.write(b"\x07\x07\x07")
    again = open_partition(segment_bytes=8192)
    assert again.recovery.rebuilt_indexes == 1 and read_all(again) == before


def test_corrupt_frame_in_a_sealed_segment_fails_only_reads_that_reach_it(
    open_partition: OpenPartition, batch: MakeBatch, partition_dir: str, read_all: ReadAll
) -> None:
    partition = open_partition(segment_bytes=4096)
    _fill(partition, batch, batches=12, per_batch=2)
    frames = _frame_positions(partition, 0)
    bad_position, bad_offset = frames[2]
    log_path = partition.segments[0].log_path
    partition.close()
    _flip(log_path, bad_position + 60)
    again = open_partition(segment_bytes=4096)
    assert again.read(0, max_messages=bad_offset).message_count == bad_offset
    with pytest.raises(CorruptSegmentError) as raised:
        again.read(bad_offset)
    assert (raised.value.path, raised.value.position) == (log_path, bad_position)
    assert raised.value.sqlstate == "XX001"
    assert log_path in str(raised.value) and str(bad_position) in str(raised.value)
    later = again.segments[1].base_offset
    assert [row["offset"] for row in read_all(again, later)] == list(range(later, 24))


def test_corrupt_frame_in_the_middle_of_the_active_segment_is_kept_not_cut(
    open_partition: OpenPartition, batch: MakeBatch, partition_dir: str, read_all: ReadAll
) -> None:
    partition = open_partition()
    _fill(partition, batch, batches=6, per_batch=2)
    bad_position, bad_offset = _frame_positions(partition, 0)[3]
    partition.close()
    (log_path,) = _segment_paths(partition_dir)
    _flip(log_path, bad_position + 100)
    again = open_partition()
    assert again.recovery.truncated_bytes == 0
    assert again.recovery.corrupt_frames == [(log_path, bad_position)]
    assert again.end_offset == 12, "the valid frames after the bad one are kept"
    assert again.read(0, max_messages=bad_offset).message_count == bad_offset
    with pytest.raises(CorruptSegmentError) as raised:
        again.read(bad_offset)
    assert raised.value.position == bad_position
    assert [row["offset"] for row in read_all(again, bad_offset + 2)] == list(range(8, 12))
    assert again.append(batch(1, first=12)).offsets.tolist() == [12]


def test_broken_header_in_the_middle_of_the_active_segment_refuses_to_open(
    open_partition: OpenPartition, batch: MakeBatch, partition_dir: str
) -> None:
    partition = open_partition()
    _fill(partition, batch, batches=4, per_batch=1)
    bad_position, _ = _frame_positions(partition, 0)[1]
    partition.close()
    (log_path,) = _segment_paths(partition_dir)
    _flip(log_path, bad_position)  # the magic
    with pytest.raises(CorruptSegmentError) as raised:
        open_partition()
    assert raised.value.position == bad_position


def test_leftover_temp_files_and_orphan_indexes_are_removed(
    open_partition: OpenPartition, batch: MakeBatch, partition_dir: str
) -> None:
    partition = open_partition()
    partition.append(batch(1))
    partition.close()
    for name in ("x.tmp", file_names.offset_index_file(77), file_names.time_index_file(77)):
        with open(os.path.join(partition_dir, name), "wb") as file:
            file.write(b"junk")
    open_partition()
    names = os.listdir(partition_dir)
    assert "x.tmp" not in names and file_names.offset_index_file(77) not in names


def test_read_stopping_inside_a_sealed_segment_resumes_there(
    open_partition: OpenPartition, batch: MakeBatch, read_all: ReadAll
) -> None:
    partition = open_partition()
    _fill(partition, batch, batches=5, per_batch=2)
    partition.roll()
    _fill(partition, batch, batches=2, per_batch=2)
    assert partition.read(0, max_messages=3).next_offset == 3
    frame_bytes = partition.segments[0].size_bytes // 5
    assert partition.read(2, max_bytes=2 * frame_bytes).next_offset == 6
    assert [row["offset"] for row in read_all(partition)] == list(range(14))
