"""Staged frame files (``storage.staged_frames``), the CRC combination they rely on
(``storage.crc_combine``) and their publish by copy (``PartitionLog.publish_staged``)."""

from __future__ import annotations

import os
import random

import crc32c
import pyarrow as pa
import pytest

from storage import limits
from storage.clock import ManualClock
from storage.config import TopicConfig
from storage.crc_combine import crc32c_combine
from storage.errors import CorruptSegmentError, LimitExceededError
from storage.fs import FileSystem
from storage.partition_log import PartitionLog
from storage.record_batch import build_wire_batch
from storage.staged_frames import (
    STAGED_HEADER_BYTES,
    FrameFileWriter,
    decode,
    file_crc,
    index_file,
    skip_rows,
)


def test_crc32c_combine_is_the_crc_of_the_concatenation() -> None:
    chooser = random.Random(7)
    for length_a, length_b in [(0, 0), (0, 5), (5, 0), (1, 1), (40, 8), (48, 4 << 20),
                               (3, 1001), *[(chooser.randrange(200), chooser.randrange(5000))
                                            for _ in range(50)]]:  # fmt: skip
        a, b = chooser.randbytes(length_a), chooser.randbytes(length_b)
        combined = crc32c_combine(crc32c.crc32c(a), crc32c.crc32c(b), length_b)
        assert combined == crc32c.crc32c(a + b), (length_a, length_b)


def _rows(start: int, count: int, size: int = 100) -> pa.RecordBatch:
    return build_wire_batch([b"%08d" % i + b"x" * (size - 8) for i in range(start, start + count)],
                            created_at_us=1)  # fmt: skip


def _written(tmp_path, pieces: list[tuple[int, pa.RecordBatch]]) -> tuple[str, FrameFileWriter]:
    path = str(tmp_path / "s.frames")
    writer = FrameFileWriter(FileSystem(), path)
    for partition, batch in pieces:
        writer.add(partition, batch)
    writer.finish()
    return path, writer


def test_a_frames_file_holds_each_partitions_rows_in_order_cut_at_the_frame_target(
        tmp_path, monkeypatch) -> None:  # fmt: skip
    monkeypatch.setattr(limits, "FRAME_TARGET_MESSAGES", 50)
    pieces = [(p, _rows(1000 * p + 30 * i, 30)) for i in range(7) for p in (0, 3)]
    path, writer = _written(tmp_path, pieces)
    fs = FileSystem()
    size = os.path.getsize(path)
    assert writer.size == size and writer.crc == file_crc(fs, path, size)  # combined = read
    found = index_file(fs, path, size)
    assert sorted(found) == [0, 3]
    for partition, frames in found.items():
        # 210 rows: four full frames of 50 written as they filled, the rest at the end
        assert [f.record_count for f in frames] == [50, 50, 50, 50, 10]
        batch = decode(fs, frames)
        expected = pa.concat_batches([b for p, b in pieces if p == partition])
        assert batch.equals(expected)
        for frame, start in zip(frames, range(0, 210, 50), strict=True):
            assert decode(fs, [frame]).equals(expected.slice(start, frame.record_count))


def test_waiting_rows_stay_bounded_whatever_the_partition_count(tmp_path, monkeypatch) -> None:
    """Past ``PENDING_BYTES`` of rows waiting to fill frames, the largest share is
    written as a smaller frame."""
    from storage import staged_frames

    monkeypatch.setattr(staged_frames, "PENDING_BYTES", 10_000)
    pieces = [(p, _rows(p * 100 + i, 1)) for i in range(20) for p in range(50)]
    path = str(tmp_path / "s.frames")
    writer = FrameFileWriter(FileSystem(), path)
    for partition, batch in pieces:
        writer.add(partition, batch)
        assert writer._pending_total <= 10_000
    writer.finish()
    found = index_file(FileSystem(), path, os.path.getsize(path))
    assert sorted(found) == list(range(50))
    assert all(sum(f.record_count for f in frames) == 20 for frames in found.values())


def test_small_batches_are_merged_not_held_one_by_one(tmp_path, monkeypatch) -> None:
    """A partition fed one-row batches holds at most ``MERGE_BATCHES`` of them (each
    held batch costs KiBs whatever its rows); its frames are cut as without merging."""
    from storage import staged_frames

    monkeypatch.setattr(limits, "FRAME_TARGET_MESSAGES", 100)
    pieces = [(p, _rows(1000 * p + i, 1)) for i in range(250) for p in (0, 1)]
    path = str(tmp_path / "s.frames")
    writer = FrameFileWriter(FileSystem(), path)
    for partition, batch in pieces:
        writer.add(partition, batch)
        assert max(map(len, writer._pending.values()), default=0) <= staged_frames.MERGE_BATCHES
    writer.finish()
    fs = FileSystem()
    found = index_file(fs, path, os.path.getsize(path))
    for partition, frames in found.items():
        assert [f.record_count for f in frames] == [100, 100, 50]
        expected = pa.concat_batches([b for p, b in pieces if p == partition])
        assert decode(fs, frames).equals(expected)


def test_the_rows_left_waiting_after_a_frame_do_not_keep_the_whole_batch(
        tmp_path, monkeypatch) -> None:  # fmt: skip
    """A large batch cut into frames leaves its last rows waiting as their own copy:
    the memory held is what is counted, not the whole incoming batch."""
    monkeypatch.setattr(limits, "FRAME_TARGET_MESSAGES", 100)
    big = _rows(0, 1050)
    writer = FrameFileWriter(FileSystem(), str(tmp_path / "s.frames"))
    writer.add(7, big)
    (rest,) = writer._pending[7]
    assert rest.num_rows == 50 and rest.equals(big.slice(1000))
    assert rest.get_total_buffer_size() * 10 < big.get_total_buffer_size()
    writer.close()


def test_held_batches_stay_bounded_by_count_not_only_bytes(tmp_path, monkeypatch) -> None:
    """One-row batches over many partitions: their messages' bytes are far under
    ``PENDING_BYTES`` but the batches held (and their rows' fixed cost) stay under
    ``PENDING_OVERHEAD_BYTES``; every row is staged, in order, per partition."""
    from storage import staged_frames

    bound = 64 * 1024
    monkeypatch.setattr(staged_frames, "PENDING_OVERHEAD_BYTES", bound)
    held_cost, row_cost = staged_frames.HELD_BATCH_BYTES, staged_frames.ROW_BYTES
    partitions, rounds = 40, 100
    pieces = [(p, _rows(p * 1000 + i, 1, size=10))
              for i in range(rounds) for p in range(partitions)]  # fmt: skip
    path = str(tmp_path / "s.frames")
    writer = FrameFileWriter(FileSystem(), path)
    for partition, batch in pieces:
        writer.add(partition, batch)
        batches = sum(len(held) for held in writer._pending.values())
        rows = sum(b.num_rows for held in writer._pending.values() for b in held)
        assert batches * held_cost + rows * row_cost <= bound
        assert writer.pending_batches == batches
    assert writer._pending_total < staged_frames.PENDING_BYTES // 100  # bytes never bound
    writer.finish()
    fs = FileSystem()
    found = index_file(fs, path, os.path.getsize(path))
    assert sorted(found) == list(range(partitions))
    for partition, frames in found.items():
        expected = pa.concat_batches([b for p, b in pieces if p == partition])
        assert decode(fs, frames).equals(expected)


def test_a_held_slice_of_a_large_batch_does_not_keep_the_large_batch(tmp_path) -> None:
    """A zero-copy piece of a large incoming batch (``staged_refs.framed_groups`` gives
    one per partition) is copied when held: held as it is, it would keep the whole
    incoming batch's buffers alive while only its own rows are counted (R5)."""
    big = _rows(0, 65_537, size=1000)
    writer = FrameFileWriter(FileSystem(), str(tmp_path / "s.frames"))
    for partition in range(5):
        writer.add(partition, big.slice(partition, 1))
    held = [b for batches in writer._pending.values() for b in batches]
    assert len(held) == 5
    assert all(b.get_total_buffer_size() < 64 * 1024 for b in held)
    assert big.get_total_buffer_size() > 65_000_000
    writer.finish()
    path = writer.path
    found = index_file(FileSystem(), path, os.path.getsize(path))
    for partition in range(5):
        assert decode(FileSystem(), found[partition]).equals(big.slice(partition, 1))


def test_crossing_the_held_batches_bound_relieves_it_by_a_quarter_at_once(
    tmp_path, monkeypatch
) -> None:
    """Once over ``PENDING_OVERHEAD_BYTES`` the writer merges and writes down to 3/4 of
    it in one pass, so the next adds do not each pay a pass over every partition (R5:
    one pass per add cost ~12x the CPU at 1000 partitions): the bound is crossed at most
    once per quarter of it added."""
    from storage import staged_frames

    bound = 64 * 1024
    monkeypatch.setattr(staged_frames, "PENDING_OVERHEAD_BYTES", bound)
    passes = 0
    flush_down = FrameFileWriter._flush_down

    def counted(self, *args, **kwargs):
        nonlocal passes
        passes += 1
        return flush_down(self, *args, **kwargs)

    monkeypatch.setattr(FrameFileWriter, "_flush_down", counted)
    writer = FrameFileWriter(FileSystem(), str(tmp_path / "s.frames"))
    partitions, rounds = 200, 20
    added = 0
    for i in range(rounds):
        for partition in range(partitions):
            writer.add(partition, _rows(i * partitions + partition, 1, size=10))
            added += staged_frames.HELD_BATCH_BYTES + staged_frames.ROW_BYTES
            assert writer._pending_overhead <= bound
    assert passes <= added // (bound // 4) + 1
    writer.finish()


def test_a_damaged_header_or_a_short_file_is_corrupt(tmp_path) -> None:
    path, _ = _written(tmp_path, [(0, _rows(0, 10)), (1, _rows(10, 10))])
    size = os.path.getsize(path)
    with pytest.raises(CorruptSegmentError):
        index_file(FileSystem(), path, size - 8)  # a frame past the recorded size
    with open(path, "r+b") as handle:
        handle.write(b"XXXX")
    with pytest.raises(CorruptSegmentError):
        index_file(FileSystem(), path, size)


def test_a_damaged_body_fails_its_decode(tmp_path) -> None:
    path, _ = _written(tmp_path, [(0, _rows(0, 10))])
    with open(path, "r+b") as handle:
        handle.seek(STAGED_HEADER_BYTES + 16)
        handle.write(b"\xff")
    frames = index_file(FileSystem(), path, os.path.getsize(path))[0]
    with pytest.raises(CorruptSegmentError):
        decode(FileSystem(), frames)


def test_skip_rows_drops_whole_frames_only(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(limits, "FRAME_TARGET_MESSAGES", 4)
    path, _ = _written(tmp_path, [(0, _rows(0, 10))])
    frames = index_file(FileSystem(), path, os.path.getsize(path))[0]
    assert [f.record_count for f in frames] == [4, 4, 2]
    assert skip_rows(frames, 0) == frames
    assert skip_rows(frames, 8) == frames[2:]
    assert skip_rows(frames, 10) == []
    with pytest.raises(CorruptSegmentError):
        skip_rows(frames, 5)


class _ModelledWrites(FileSystem):
    """A file system with its own ``pwrite`` (as the test ones that model the disk)."""

    def __init__(self) -> None:
        super().__init__()
        self.written = 0

    def pwrite(self, fd, data, position) -> None:
        self.written += len(memoryview(data))
        super().pwrite(fd, data, position)


@pytest.mark.parametrize("fs_class", [FileSystem, _ModelledWrites])
def test_a_published_share_is_the_staged_frames_verified_on_read(tmp_path, monkeypatch,
                                                                 fs_class) -> None:  # fmt: skip
    """The partition's frames are the staged bodies behind headers whose checksums were
    combined (a read verifies every one); with a file system that models writes, the
    copy goes through its ``pwrite``."""
    monkeypatch.setattr(limits, "FRAME_TARGET_MESSAGES", 16)
    path, _ = _written(tmp_path, [(0, _rows(0, 40)), (1, _rows(100, 5)), (0, _rows(40, 30))])
    fs = fs_class()
    frames = index_file(fs, path, os.path.getsize(path))[0]
    log = PartitionLog(fs, str(tmp_path / "p0"), 0, TopicConfig(), ManualClock(5_000_000))
    try:
        log.append(_rows(900, 3))  # something before the share
        assert log.publish_staged(frames, transaction_id=77) == 70
        read = log.read(0, max_messages=1000)
        data = pa.concat_batches(read.batches).column("data").to_pylist()
        assert data == [b"%08d" % i + b"x" * 92 for i in [900, 901, 902, *range(70)]]
        assert log.transaction_rows(77, 0) == 70
        headers = [f.header for s in log.segments for f in s.scan(0, s.size_bytes, 1 << 20)]
        assert [h.record_count for h in headers] == [3, 16, 16, 16, 16, 6]
        assert all(h.transaction_id == 77 for h in headers[1:])
        if isinstance(fs, _ModelledWrites):
            assert fs.written >= sum(f.body_bytes for f in frames)
    finally:
        log.close()


def test_one_partitions_rows_over_a_batchs_bytes_are_cut_into_frames_not_refused(
        tmp_path, monkeypatch) -> None:  # fmt: skip
    # Rows given as a slice of a larger batch, and a partition's waiting rows over the
    # batch limit, are not a batch: they are cut into frames, each within the limits.
    monkeypatch.setattr(limits, "BATCH_BYTES_MAX", 64 * 1024)
    monkeypatch.setattr(limits, "FRAME_TARGET_BYTES", 16 * 1024)
    big = _rows(0, 2000, 200)  # ~400 KiB of buffers
    pieces = [(0, big.slice(s, 100)) for s in range(0, 2000, 100)]
    path, writer = _written(tmp_path, pieces)
    frames = index_file(FileSystem(), path, writer.size)[0]
    assert len(frames) > 1 and all(f.body_bytes <= 64 * 1024 for f in frames)
    assert decode(FileSystem(), frames).column(5).to_pylist() == big.column(5).to_pylist()


def test_a_message_over_the_limit_or_a_frame_over_a_batch_is_refused(
        tmp_path, monkeypatch) -> None:  # fmt: skip
    writer = FrameFileWriter(FileSystem(), str(tmp_path / "m.frames"))
    monkeypatch.setattr(limits, "MESSAGE_BYTES_MAX", 150)
    with pytest.raises(LimitExceededError, match="message of 200 bytes"):
        writer.add(0, _rows(0, 3, 200))
    monkeypatch.setattr(limits, "MESSAGE_BYTES_MAX", 1 << 20)
    monkeypatch.setattr(limits, "BATCH_BYTES_MAX", 100)  # below one message's frame
    with pytest.raises(LimitExceededError, match=r"a frame of \d+ bytes exceeds"):
        writer.add(0, _rows(0, 1, 200))
        writer.finish()
    writer.close()


def test_a_frame_as_large_as_the_switch_opens_its_partitions_own_file_at_once(
        tmp_path, monkeypatch) -> None:  # fmt: skip
    """Round 15: a partition's first frame of at least ``ADOPT_SWITCH_BYTES`` goes to its
    own file (a Spark task's share of a few large frames is adopted whole); smaller first
    frames stay in the shared file until they hold the switch's bytes."""
    monkeypatch.setattr(limits, "FRAME_TARGET_MESSAGES", 20)
    monkeypatch.setattr(limits, "ADOPT_SWITCH_BYTES", 3000)  # a 20-row frame: 3,544 bytes
    base = str(tmp_path / "s")
    writer = FrameFileWriter(FileSystem(), base + ".part", own_files=4)
    writer.add(0, _rows(0, 40))  # two frames of 20 rows: each over the switch
    writer.add(1, _rows(100, 10))  # one frame of 10 rows (2,136 bytes): under it
    paths = writer.seal(base, ".frames")
    own = [p for p in paths if ".~p" in p]
    assert [os.path.basename(p).split(".~p")[1].split("-")[0] for p in own] == ["0"]
    assert ".~p0-r40." in own[0]
    shared = paths[-1]
    frames = index_file(FileSystem(), shared, os.path.getsize(shared))
    assert list(frames) == [1] and sum(f.record_count for f in frames[1]) == 10
