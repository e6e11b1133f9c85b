"""A frame's checksum is verified once per process (storage/verified_frames.py): when this
process wrote it from memory or first read it; a cut forgets what it cut; every read is
checked again with TOPICBASE_VERIFY_READS=always, and after a reopen."""

from __future__ import annotations

import os
from typing import Any

import pytest

from storage import segment as segment_module
from storage import verified_frames
from storage.errors import CorruptSegmentError
from storage.fs import FileSystem
from storage.limits import VERIFIED_RUNS_MAX as RUNS_MAX
from storage.record_batch import FrameHeader, build_wire_batch, encode_frame, serialize_body
from storage.segment import LogSegment
from storage.verified_frames import VerifiedRuns, covered
from tests.checksum_spy import count_checksums

KIB = 1024


def _fill(partition: Any, batch: Any, frames: int) -> None:
    for _ in range(frames):
        partition.append(batch(50, first=partition.end_offset, size_bytes=KIB))


def _read_all(partition: Any) -> int:
    count, offset = 0, 0
    while offset < partition.end_offset:
        result = partition.read(offset, max_messages=70)  # stops inside frames too
        count += result.message_count
        offset = result.next_offset
    return count


def test_frames_this_process_wrote_are_read_without_a_checksum(
    open_partition: Any, batch: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    partition = open_partition(segment_bytes=256 * KIB)
    _fill(partition, batch, frames=8)
    sizes = count_checksums(monkeypatch, segment_module)
    assert _read_all(partition) == 400
    assert sizes == [], "a frame written from memory is verified as written"
    monkeypatch.setattr(verified_frames, "ONCE", False)  # TOPICBASE_VERIFY_READS=always
    assert _read_all(partition) == 400
    assert len(sizes) >= 8 and min(sizes) > 50 * KIB, "every frame checked on every read"


def test_after_a_reopen_each_frame_is_checked_on_its_first_read_only(
    open_partition: Any, batch: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    partition = open_partition(segment_bytes=256 * KIB)
    _fill(partition, batch, frames=8)
    partition.close()
    again = open_partition(segment_bytes=256 * KIB)
    sizes = count_checksums(monkeypatch, segment_module)
    assert _read_all(again) == 400
    frames = [s for s in sizes if s > 50 * KIB]
    assert len(frames) == 8, "the first read after a restart checks each frame once"
    assert _read_all(again) == 400
    assert [s for s in sizes if s > 50 * KIB] == frames, "and the next reads do not"


def test_damage_before_a_reopen_fails_the_first_read(
    open_partition: Any, batch: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    partition = open_partition(segment_bytes=256 * KIB)
    _fill(partition, batch, frames=8)
    assert _read_all(partition) == 400  # verified in this process
    segment = partition.segments[0]
    frame = list(segment.scan(0, segment.size_bytes, 1, mapped=True))[1]
    partition.close()
    fd = os.open(segment.log_path, os.O_RDWR)
    try:
        os.pwrite(fd, b"\x5a", frame.position + 200)
    finally:
        os.close(fd)
    again = open_partition(segment_bytes=256 * KIB)
    with pytest.raises(CorruptSegmentError) as raised:
        _read_all(again)
    assert raised.value.position == frame.position


def _raw_frame(base_offset: int, count: int, damaged: bool) -> tuple[bytes, FrameHeader]:
    data = [f"m{base_offset + i}".encode().ljust(100, b".") for i in range(count)]
    body = serialize_body(build_wire_batch(data))
    frame = bytearray(
        encode_frame(body, base_offset=base_offset, written_at_us=1, record_count=count)
    )
    if damaged:
        frame[-5] ^= 0x5A
    return bytes(frame), FrameHeader(0, base_offset, 1, count, len(body), 0)


def test_a_cut_forgets_what_it_cut(tmp_path: Any) -> None:
    """Bytes written again at a cut position are not trusted for what stood there before."""
    segment = LogSegment(FileSystem(), str(tmp_path), 0)
    for number in range(3):
        parts, header = _raw_frame(3 * number, 3, damaged=False)
        segment.append_frame_parts([parts], header)  # written from memory: verified
    assert list(segment.verified.snapshot()) == [(0, segment.size_bytes)]
    second = list(segment.scan(0, segment.size_bytes, 1, mapped=True))[1]
    segment.truncate_to(second.position, 3)
    assert list(segment.verified.snapshot()) == [(0, second.position)]
    segment.append_frame(*_raw_frame(3, 3, damaged=True))  # raw bytes: not marked
    assert [f.position for f in segment.scan(0, second.position, 1, mapped=True)] == [0]
    with pytest.raises(CorruptSegmentError) as raised:
        list(segment.scan(0, segment.size_bytes, 1, mapped=True))
    assert raised.value.position == second.position
    segment.close()


def test_runs_merge_are_bounded_and_cover_only_whole_ranges() -> None:
    runs = VerifiedRuns()
    runs.add(0, 10)
    runs.add(10, 20)  # adjacent: one run
    runs.add(30, 40)
    assert runs.snapshot() == ((0, 20), (30, 40))
    assert covered(runs.snapshot(), 5, 20) and not covered(runs.snapshot(), 15, 35)
    runs.add(20, 30)  # fills the gap
    assert runs.snapshot() == ((0, 40),)
    runs.cut(25)
    assert runs.snapshot() == ((0, 25),)
    runs.cut(0)
    assert runs.snapshot() == ()
    for index in range(RUNS_MAX + 3):
        runs.add(100 * index, 100 * index + 10)
    kept = runs.snapshot()
    assert len(kept) == RUNS_MAX and kept[-1] == (100 * (RUNS_MAX + 2), 100 * (RUNS_MAX + 2) + 10)
