"""Reads of partitions made of many small frames (issue 14, Scale).

Consecutive frames of at most ``SMALL_FRAME_ROWS`` messages are decoded as one read
batch (``decode_bodies``): the same messages, offsets and write times as frame by
frame, sliced to the read's start and ``max_messages``; large frames are still
decoded one by one (no copy of their messages).
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from storage.clock import ManualClock
from storage.fs import FileSystem
from storage.partition_log import SMALL_FRAME_ROWS, PartitionLog
from storage.record_batch import decode_bodies, decode_body
from tests.storage.conftest import read_all_rows


def _fill(partition: PartitionLog, batch: Any, clock: ManualClock, sizes: list[int]) -> None:
    for size in sizes:
        partition.append(batch(size, first=partition.end_offset))
        clock.advance(seconds=1)  # each frame its own written_at


def _frame_by_frame(partition: PartitionLog) -> list[dict[str, Any]]:
    rows = []
    for segment in partition.segments:
        for frame in segment.scan(segment.base_offset, segment.size_bytes, 1 << 20):
            rows.extend(decode_body(frame.header, frame.body).to_pylist())
    return rows


def test_small_frames_are_read_as_one_batch(open_partition: Any, batch: Any, clock: Any) -> None:
    partition = open_partition()
    _fill(partition, batch, clock, [3] * 10)
    result = partition.read(0)
    assert len(result.batches) == 1 and result.message_count == 30
    assert read_all_rows(partition) == _frame_by_frame(partition)
    written = result.batches[0].column("written_at").cast(pa.int64()).to_pylist()
    assert len(set(written)) == 10 and written == sorted(written)


def test_a_run_is_sliced_to_the_start_and_max_messages(
    open_partition: Any, batch: Any, clock: Any
) -> None:
    partition = open_partition()
    _fill(partition, batch, clock, [3] * 10)
    every = _frame_by_frame(partition)
    for start in range(0, 30, 4):
        for most in (1, 2, 5, 13, 40):
            result = partition.read(start, max_messages=most)
            rows = [row for b in result.batches for row in b.to_pylist()]
            assert rows == every[start : start + most]
            assert result.next_offset == min(30, start + most)


def test_large_frames_stay_alone_between_runs(open_partition: Any, batch: Any, clock: Any) -> None:
    partition = open_partition()
    big = SMALL_FRAME_ROWS + 1
    _fill(partition, batch, clock, [2, 2, big, 2, big, big, 1])
    result = partition.read(0, max_messages=10_000)
    assert [b.num_rows for b in result.batches] == [4, big, 2, big, big, 1]
    assert read_all_rows(partition) == _frame_by_frame(partition)


def test_decode_bodies_equals_the_frames_concatenated(open_partition: Any, batch: Any) -> None:
    partition = open_partition()
    for size in (1, 4, 2):
        partition.append(batch(size, first=partition.end_offset))
    (segment,) = partition.segments
    frames = [(f.header, f.body) for f in segment.scan(0, segment.size_bytes, 1 << 20)]
    together = decode_bodies(frames)
    alone = pa.Table.from_batches([decode_body(h, b) for h, b in frames])
    assert pa.Table.from_batches([together]).equals(alone)


def test_a_segment_that_fits_the_window_is_read_with_one_pread(
    open_partition: Any, batch: Any, clock: Any
) -> None:
    reads = []

    class Counted(FileSystem):
        # A file system with its own ``pread`` gets no map: reads take the pread path.
        def pread(self, fd: int, size: int, position: int) -> bytes:
            reads.append((size, position))
            return super().pread(fd, size, position)

    partition = open_partition(file_system=Counted())
    _fill(partition, batch, clock, [3] * 4)
    reads.clear()
    result = partition.read(0)
    assert result.message_count == 12
    assert reads == [(partition.size_bytes, 0)]  # no separate peek at the first header
