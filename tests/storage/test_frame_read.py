"""Partition reads left as frame slices (``PartitionLog.read_frames``) and decoded later,
many partitions at once (``storage.frame_read.decode_slices``; issue 14, Scale).

The slices of a read name exactly the messages ``read`` returns; decoding slices of
several partitions together gives each slice's own offsets and write times, as
decoding each frame alone and slicing it does; a slice cut at a cut keeps what is
below it.
"""

from __future__ import annotations

import os
import random
from typing import Any

import pyarrow as pa
import pytest

from storage.frame_read import SMALL_SLICE_ROWS, FrameSlice, decode_slices, decode_small
from storage.record_batch import decode_body


def _fill(partition: Any, batch: Any, clock: Any, sizes: list[int]) -> None:
    for size in sizes:
        partition.append(batch(size, first=partition.end_offset))
        clock.advance(seconds=1)  # each frame its own written_at


def _alone(slices: list[FrameSlice]) -> list[dict[str, Any]]:
    """Each slice decoded frame by frame and sliced: the reference."""
    rows: list[dict[str, Any]] = []
    for piece in slices:
        batch = decode_body(piece.header, piece.body).slice(piece.skip, piece.rows)
        rows.extend(batch.to_pylist())
    return rows


def test_read_frames_names_what_read_returns(open_partition: Any, batch: Any, clock: Any) -> None:
    partition = open_partition()
    _fill(partition, batch, clock, [3, 1, 70, 5, 2, 100, 4])
    every = partition.end_offset
    for start in range(0, every, 7):
        for most in (1, 4, 9, 80, 500):
            for budget in (1, 300, 5000, 1 << 20):
                found = partition.read_frames(start, max_messages=most, max_bytes=budget)
                read = partition.read(start, max_messages=most, max_bytes=budget)
                got = [row for b in read.batches for row in b.to_pylist()]
                assert _alone(found.slices) == got
                assert found.next_offset == read.next_offset
                assert found.message_count == len(got)
                assert (found.start_offset, found.end_offset) == (0, every)


def test_slices_of_many_partitions_decode_as_one(
    open_partition: Any, batch: Any, clock: Any, tmp_path: Any
) -> None:
    rng = random.Random(7)
    slices: list[FrameSlice] = []
    for index in range(5):
        directory = os.path.join(str(tmp_path), f"p{index}")
        os.makedirs(directory)
        partition = open_partition(directory=directory)
        sizes = [rng.choice((rng.randint(1, 12), rng.randint(65, 90))) for _ in range(10)]
        _fill(partition, batch, clock, sizes)
        start = rng.randrange(partition.end_offset // 3)
        slices += partition.read_frames(start, max_messages=rng.randint(20, 400)).slices
    small = [s for s in slices if s.header.record_count <= SMALL_SLICE_ROWS]
    assert len(small) >= 5 and any(s.skip or s.rows < s.header.record_count for s in slices)
    together = decode_small(small)
    assert together.to_pylist() == _alone(small)
    decoded = decode_slices(slices)
    assert [row for b in decoded for row in b.to_pylist()] == _alone(slices)
    large = sum(1 for s in slices if s.header.record_count > SMALL_SLICE_ROWS)
    assert large and len(decoded) >= large + 1  # large slices alone, small ones in runs


def test_a_slice_below_a_cut(open_partition: Any, batch: Any, clock: Any) -> None:
    partition = open_partition()
    _fill(partition, batch, clock, [10])
    (whole,) = partition.read_frames(2).slices
    assert (whole.first_offset, whole.next_offset) == (2, 10)
    assert whole.below(10) is whole
    cut = whole.below(6)
    assert cut is not None and (cut.first_offset, cut.next_offset) == (2, 6)
    assert decode_small([cut]).column("offset").to_pylist() == [2, 3, 4, 5]
    assert whole.below(2) is None
    assert cut.size < whole.size


def test_a_slice_must_lie_inside_its_frame(open_partition: Any, batch: Any, clock: Any) -> None:
    partition = open_partition()
    _fill(partition, batch, clock, [3])
    (piece,) = partition.read_frames(0).slices
    with pytest.raises(AssertionError):
        FrameSlice(piece.header, piece.body, 2, 2)
    with pytest.raises(AssertionError):
        FrameSlice(piece.header, piece.body, 0, 0)
    assert isinstance(piece.body, pa.Buffer)
