"""``LogSegment.append_body``: a spread publish's frame of an encoded body, in one step.

What must hold: the bytes on disk, the indexes, the segment's ends and write times and
its verified runs are exactly those of ``framed_body`` + ``append_frame_parts`` (one
format, one bookkeeping: readers, recovery and ``check`` know only it); the frames read
back; the torn-write failpoint and a failing write behave as on the other append paths
(half a frame, then the failure; a partition that fails its write is fenced and
publishes nothing).
"""

from __future__ import annotations

import os
import random
from typing import Any

import pyarrow as pa
import pytest

from storage import failpoints, limits
from storage.clock import ManualClock
from storage.config import FsyncPolicy, TopicConfig
from storage.errors import PartitionFencedError, StorageIOError
from storage.fs import FileSystem
from storage.partition_log import PartitionLog
from storage.record_batch import build_wire_batch, framed_body, serialize_body_buffer
from storage.segment import LogSegment
from tests.sim.faulty_fs import Fault, FaultyFileSystem

BASE = 100


def _bodies(seed: int, count: int) -> list[tuple[pa.Buffer, int]]:
    """Encoded bodies of 1-9 messages of 10 B to 3 KiB (some frames under the index
    interval, some over it, so entries are both made and skipped)."""
    rng = random.Random(seed)
    out = []
    for index in range(count):
        rows = rng.randint(1, 9)
        data = [bytes([index % 251]) * rng.randint(10, 3000) for _ in range(rows)]
        out.append((serialize_body_buffer(build_wire_batch(data, producer_id="p")), rows))
    return out


def _state(segment: LogSegment) -> tuple[Any, ...]:
    return (
        segment.size_bytes,
        segment.next_offset,
        segment.first_written_at_us,
        segment.last_written_at_us,
        segment.offset_index.entries(),
        segment.time_index.entries(),
        segment.verified.snapshot(),
    )


def test_the_frames_and_bookkeeping_are_those_of_framed_parts(tmp_path: Any) -> None:
    one = LogSegment(FileSystem(), str(tmp_path / "one"), BASE)
    two = LogSegment(FileSystem(), str(tmp_path / "two"), BASE)
    os.makedirs(one.log_path.rsplit("/", 1)[0])
    os.makedirs(two.log_path.rsplit("/", 1)[0])
    written_at = 1_000
    for index, (body, rows) in enumerate(_bodies(7, 60)):
        written_at += index % 3  # some frames at the same time: no time index entry
        transaction_id = 0 if index % 5 == 0 else 1_000 + index
        parts, header = framed_body(body, rows, one.next_offset, written_at, transaction_id)
        one.append_frame_parts(parts, header)
        base = two.append_body(body, rows, written_at, transaction_id)
        assert base == header.base_offset
        assert _state(two) == _state(one)
    assert len(one.offset_index.entries()) < 60  # the interval skipped some frames
    one.sync()
    two.sync()
    with open(one.log_path, "rb") as a, open(two.log_path, "rb") as b:
        assert a.read() == b.read()
    frames = list(two.scan(BASE, two.size_bytes, 1 << 30))
    assert [frame.header.base_offset for frame in frames] == [
        frame.header.base_offset for frame in one.scan(BASE, one.size_bytes, 1 << 30)
    ]
    assert frames[-1].header.next_offset == two.next_offset
    one.close()
    two.close()


def test_the_torn_write_failpoint_writes_half_a_frame(tmp_path: Any) -> None:
    segment = LogSegment(FileSystem(), str(tmp_path), BASE)
    (body, rows), (second, second_rows) = _bodies(3, 2)
    segment.append_body(body, rows, 5, 9)
    whole = segment.size_bytes
    failpoints.activate("segment.torn_write=error")
    try:
        with pytest.raises(StorageIOError):
            segment.append_body(second, second_rows, 6, 10)
    finally:
        failpoints.activate("")
    assert segment.size_bytes == whole  # nothing noted
    assert os.path.getsize(segment.log_path) == whole + (48 + second.size) // 2
    segment.close()


def test_a_failed_write_of_a_framed_body_fences_the_partition(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = []
    original = LogSegment.append_body

    def spied(segment: LogSegment, *args: Any) -> int:
        calls.append(args[1])
        return original(segment, *args)

    monkeypatch.setattr(LogSegment, "append_body", spied)
    fs = FaultyFileSystem(seed=1)
    directory = os.path.join(str(tmp_path), "p0")
    os.makedirs(directory)
    config = TopicConfig(fsync_policy=FsyncPolicy.GROUP, retention_ms=None)
    log = PartitionLog(fs, directory, 0, config, ManualClock())
    first = build_wire_batch([b"a", b"b"], seq_no=[0, 1], producer_id="p")
    log.publish_transactional([first], 7, [serialize_body_buffer(first)])
    end = log.end_offset
    second = build_wire_batch([b"c"], seq_no=[2], producer_id="p")
    fs.add_fault(Fault("write", path_contains=".log"))
    with pytest.raises(StorageIOError):
        log.publish_transactional([second], 8, [serialize_body_buffer(second)])
    assert calls == [2, 1]  # both publishes framed their given bodies in one step
    assert log.end_offset == end  # nothing published
    with pytest.raises(PartitionFencedError):
        log.append(build_wire_batch([b"d"], seq_no=[3], producer_id="p"))
    log.close()


def test_frames_over_the_index_interval_are_each_indexed(tmp_path: Any) -> None:
    segment = LogSegment(FileSystem(), str(tmp_path), BASE)
    body = serialize_body_buffer(build_wire_batch([b"x" * limits.INDEX_INTERVAL_BYTES]))
    for index in range(3):
        segment.append_body(body, 1, 10 + index, 0)
    assert [offset for offset, _ in segment.offset_index.entries()] == [0, 1, 2]
    assert [position for _, position in segment.offset_index.entries()] == [
        0, 48 + body.size, 2 * (48 + body.size)
    ]  # fmt: skip
    segment.close()
