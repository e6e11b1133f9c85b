"""Tests of storage/segment.py: writing frames, scanning them back, indexes, damage."""

from __future__ import annotations

import itertools
import os
import struct
from typing import Any

import pytest

from storage import limits
from storage.errors import CorruptSegmentError
from storage.fs import FileSystem
from storage.record_batch import (
    HEADER_BYTES,
    FrameHeader,
    build_wire_batch,
    decode_body,
    encode_frame,
    serialize_body,
)
from storage.segment import LogSegment

BASE = 40


def _frame(base_offset: int, count: int, size_bytes: int = 100) -> tuple[bytes, FrameHeader]:
    data = [f"m{base_offset + i}".encode().ljust(size_bytes, b".") for i in range(count)]
    body = serialize_body(build_wire_batch(data))
    frame = encode_frame(
        body, base_offset=base_offset, written_at_us=base_offset, record_count=count
    )
    return frame, FrameHeader(0, base_offset, base_offset, count, len(body), 0)


def _segment(tmp_path: Any, frame_count: int = 0, per_frame: int = 3) -> LogSegment:
    segment = LogSegment(FileSystem(), str(tmp_path), BASE)
    for _ in range(frame_count):
        segment.append_frame(*_frame(segment.next_offset, per_frame))
    return segment


def _offsets(segment: LogSegment, start: int, budget_bytes: int = 1 << 20) -> list[int]:
    found = []
    for frame in segment.scan(start, segment.size_bytes, budget_bytes):
        found.extend(decode_body(frame.header, frame.body).column("offset").to_pylist())
    return found


def test_file_names_carry_the_20_digit_base_offset(tmp_path: Any) -> None:
    segment = _segment(tmp_path, frame_count=1)
    names = sorted(os.listdir(tmp_path))
    assert "00000000000000000040.log" in names
    assert segment.log_path.endswith("00000000000000000040.log")
    assert segment.offset_index.path.endswith("00000000000000000040.index")
    assert segment.time_index.path.endswith("00000000000000000040.timeindex")


def test_append_moves_next_offset_and_size(tmp_path: Any) -> None:
    segment = _segment(tmp_path)
    frame, header = _frame(BASE, 3)
    segment.append_frame(frame, header)
    assert (segment.next_offset, segment.size_bytes) == (BASE + 3, len(frame))
    assert segment.first_written_at_us == segment.last_written_at_us == BASE


def test_scan_of_empty_segment_yields_nothing(tmp_path: Any) -> None:
    segment = _segment(tmp_path, frame_count=1)
    assert list(segment.scan(BASE, 0, 1024)) == []


def test_scan_returns_every_frame_in_order(tmp_path: Any) -> None:
    segment = _segment(tmp_path, frame_count=10)
    assert _offsets(segment, BASE) == list(range(BASE, BASE + 30))


def test_scan_from_mid_batch_starts_at_the_frame_holding_the_offset(tmp_path: Any) -> None:
    segment = _segment(tmp_path, frame_count=10)
    assert _offsets(segment, BASE + 14)[0] == BASE + 12


def test_scan_stops_at_the_byte_limit(tmp_path: Any) -> None:
    segment = _segment(tmp_path, frame_count=4)
    frame_bytes = segment.size_bytes // 4
    frames = list(segment.scan(BASE, 2 * frame_bytes, 1024))
    assert [f.header.base_offset for f in frames] == [BASE, BASE + 3]


def test_offset_index_gets_an_entry_per_interval(tmp_path: Any) -> None:
    segment = _segment(tmp_path, frame_count=40)
    entries = segment.offset_index.entries()
    assert entries[0] == (0, 0)
    assert len(entries) >= segment.size_bytes // (limits.INDEX_INTERVAL_BYTES + 1000)
    for (_, first), (_, second) in itertools.pairwise(entries):
        assert limits.INDEX_INTERVAL_BYTES <= second - first < 2 * limits.INDEX_INTERVAL_BYTES
    assert segment.offset_index.is_consistent(segment.size_bytes)


def test_scan_from_far_into_the_segment_uses_the_index(tmp_path: Any) -> None:
    segment = _segment(tmp_path, frame_count=40)
    target = BASE + 100
    frames = list(segment.scan(target, segment.size_bytes, 1024))
    assert frames[0].header.base_offset <= target < frames[0].header.next_offset
    assert frames[0].position >= segment.offset_index.lookup(target) > 0


def test_frame_larger_than_the_read_window_is_read_whole(tmp_path: Any) -> None:
    segment = _segment(tmp_path)
    segment.append_frame(*_frame(BASE, 2, size_bytes=1_500_000))
    segment.append_frame(*_frame(BASE + 2, 1))
    assert _offsets(segment, BASE, budget_bytes=1) == [BASE, BASE + 1, BASE + 2]


class _ReadCountingFileSystem(FileSystem):
    """Counts the bytes ``pread`` returns."""

    def __init__(self) -> None:
        super().__init__()
        self.bytes_read = 0

    def pread(self, fd: int, size: int, position: int) -> bytes:
        data = super().pread(fd, size, position)
        self.bytes_read += len(data)
        return data


def test_frame_a_little_over_the_read_window_is_read_once(tmp_path: Any) -> None:
    fs = _ReadCountingFileSystem()
    segment = LogSegment(fs, str(tmp_path), BASE)
    segment.append_frame(*_frame(BASE, 1000, size_bytes=1100))  # ~1.1 MB > the 1 MiB window
    frame_bytes = segment.size_bytes
    frames = list(segment.scan(BASE + 10, segment.size_bytes, 100 * 1100))
    assert [f.header.record_count for f in frames] == [1000]
    assert fs.bytes_read <= frame_bytes + 64, "the frame was read twice"


def test_sealed_segment_indexes_are_on_disk(tmp_path: Any) -> None:
    segment = _segment(tmp_path, frame_count=20)
    entries = segment.offset_index.entries()
    segment.seal(durable=True)
    assert segment.fs.fsync_count == 3, "the log and both indexes"
    reopened = _segment(tmp_path)
    assert reopened.offset_index.load() and reopened.offset_index.entries() == entries
    assert reopened.time_index.load()


def test_sync_counts_one_fsync(tmp_path: Any) -> None:
    segment = _segment(tmp_path, frame_count=2)
    segment.sync()
    assert segment.fs.fsync_count == 1


def test_truncate_to_cuts_the_file(tmp_path: Any) -> None:
    segment = _segment(tmp_path, frame_count=3)
    first_frame_bytes = segment.size_bytes // 3
    segment.truncate_to(first_frame_bytes, BASE + 3)
    assert os.path.getsize(segment.log_path) == first_frame_bytes
    assert (segment.size_bytes, segment.next_offset) == (first_frame_bytes, BASE + 3)
    segment.append_frame(*_frame(BASE + 3, 1))
    assert _offsets(segment, BASE) == [BASE, BASE + 1, BASE + 2, BASE + 3]


def test_corrupt_frame_body_raises_naming_file_and_position(tmp_path: Any) -> None:
    segment = _segment(tmp_path, frame_count=3)
    frame_bytes = segment.size_bytes // 3
    _flip(segment.log_path, frame_bytes + HEADER_BYTES + 20)
    with pytest.raises(CorruptSegmentError) as raised:
        _offsets(segment, BASE)
    assert raised.value.sqlstate == "XX001"
    assert raised.value.path == segment.log_path and raised.value.position == frame_bytes
    assert segment.log_path in str(raised.value)
    skipped = list(segment.scan(BASE, segment.size_bytes, 1024, skip_corrupt=True))
    assert [f.header.base_offset for f in skipped] == [BASE, BASE + 6]
    assert _offsets(segment, BASE + 6) == [BASE + 6, BASE + 7, BASE + 8]


def test_bad_frame_header_raises_corrupt_segment(tmp_path: Any) -> None:
    segment = _segment(tmp_path, frame_count=2)
    frame_bytes = segment.size_bytes // 2
    _flip(segment.log_path, frame_bytes)  # the magic of the second frame
    with pytest.raises(CorruptSegmentError, match="bad frame header") as raised:
        _offsets(segment, BASE)
    assert raised.value.position == frame_bytes


def test_frame_length_past_the_segment_end_raises_instead_of_looping(tmp_path: Any) -> None:
    segment = _segment(tmp_path, frame_count=2)
    frame_bytes = segment.size_bytes // 2
    _patch(segment.log_path, frame_bytes + 28, struct.pack("<I", 1 << 28))  # body_bytes
    with pytest.raises(CorruptSegmentError) as raised:
        _offsets(segment, BASE)
    assert raised.value.position == frame_bytes


def test_delete_files_removes_log_and_indexes(tmp_path: Any) -> None:
    segment = _segment(tmp_path, frame_count=2)
    segment.seal(durable=False)
    segment.delete_files()
    assert os.listdir(tmp_path) == []


def _flip(path: str, position: int) -> None:
    with open(path, "r+b") as file:
        file.seek(position)
        value = file.read(1)[0]
        file.seek(position)
        file.write(bytes([value ^ 0xFF]))


def _patch(path: str, position: int, data: bytes) -> None:
    with open(path, "r+b") as file:
        file.seek(position)
        file.write(data)
