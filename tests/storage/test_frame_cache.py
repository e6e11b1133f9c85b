"""The large frame a partition read stopped inside is kept for the next read
(``storage.frame_read.FrameCache``; issue 14, the move's read), and a scan window that
ends inside a frame is refilled with that frame and what the budget still wants.

A sequence of small reads from one big frame reads, checks and decodes it once; what
readers see is the same as without the cache, across appends, rolls and retention; the
cache is bounded; a refill after a cut frame does not read a whole window more.
"""

from __future__ import annotations

import random
import threading
from typing import Any

import pyarrow as pa
import pytest

from storage import frame_read
from storage.frame_read import SMALL_SLICE_ROWS, CachedFrame, FrameCache, decode_slices
from storage.fs import FileSystem
from storage.record_batch import HEADER_BYTES, FrameHeader

KIB = 1024


def _rows(partition: Any, start: int, **limits: int) -> tuple[list[dict[str, Any]], int]:
    found = partition.read_frames(start, **limits)
    batches = decode_slices(found.slices)
    return [row for b in batches for row in b.to_pylist()], found.next_offset


def _count_preads(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    reads: list[tuple[int, int]] = []
    original = FileSystem.pread

    def counted(self: FileSystem, fd: int, size: int, position: int) -> Any:
        reads.append((size, position))
        return original(self, fd, size, position)

    monkeypatch.setattr(FileSystem, "pread", counted)
    return reads


def _count_decodes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    decoded: list[int] = []
    original = frame_read.decode_body

    def counted(header: FrameHeader, body: pa.Buffer) -> pa.RecordBatch:
        decoded.append(header.base_offset)
        return original(header, body)

    monkeypatch.setattr(frame_read, "decode_body", counted)
    return decoded


def test_small_reads_from_one_big_frame_read_and_decode_it_once(
    open_partition: Any, batch: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    partition = open_partition()
    partition._frame_cache = FrameCache()
    partition.append(batch(1000, size_bytes=KIB))  # one frame of 1000 messages
    preads = _count_preads(monkeypatch)
    decodes = _count_decodes(monkeypatch)
    offset, seen = 0, []
    while offset < 1000:
        got, offset = _rows(partition, offset, max_messages=100)
        seen += [row["offset"] for row in got]
    assert seen == list(range(1000))
    assert decodes == [0]  # the frame decoded once for the ten reads
    assert len(preads) <= 2  # the first read only (a peek at its header, then the frame)


def test_a_kept_frame_gives_the_same_rows_as_a_plain_read(
    open_partition: Any, batch: Any, clock: Any
) -> None:
    rng = random.Random(14)
    partition = open_partition(segment_bytes=256 * KIB)
    cache = FrameCache()
    offset, kept = 0, 0
    for step in range(300):
        if step % 7 == 0:  # concurrent-ish appends: frames big and small, a roll now and then
            size = rng.choice([3, 70, 150, 400])
            partition.append(batch(size, first=partition.end_offset, size_bytes=200))
            clock.advance(seconds=1)
        if step % 50 == 49:
            partition.delete_segments_before(rng.randrange(partition.end_offset + 1))
        limits = {"max_messages": rng.choice([1, 7, 40, 120, 1000])}
        if rng.random() < 0.3:
            limits["max_bytes"] = rng.choice([1, 500, 20 * KIB, 200 * KIB])
        if rng.random() < 0.1:
            offset = rng.randrange(partition.end_offset + 1)  # another reader elsewhere
        partition._frame_cache = None
        expected = _rows(partition, offset, **limits)
        partition._frame_cache = cache
        assert _rows(partition, offset, **limits) == expected
        kept += cache.get(partition) is not None
        offset = expected[1]
    assert kept > 50  # the cache was used


def test_retention_and_close_drop_the_kept_frame(open_partition: Any, batch: Any) -> None:
    partition = open_partition(segment_bytes=64 * KIB)
    cache = FrameCache()
    partition._frame_cache = cache
    for _ in range(4):
        partition.append(batch(200, first=partition.end_offset, size_bytes=KIB))
    partition.read_frames(10, max_messages=5)
    kept = cache.get(partition)
    assert kept is not None and kept.header.base_offset == 0
    assert partition.delete_segments_before(200) == 1
    assert cache.get(partition) is None and cache.kept_bytes == 0
    partition.read_frames(210, max_messages=5)
    assert cache.get(partition) is not None
    partition.close()
    assert cache.get(partition) is None and cache.kept_bytes == 0


def test_only_a_large_frame_a_read_stopped_inside_is_kept(open_partition: Any, batch: Any) -> None:
    partition = open_partition()
    cache = FrameCache()
    partition._frame_cache = cache
    partition.append(batch(SMALL_SLICE_ROWS, size_bytes=100))
    partition.append(batch(SMALL_SLICE_ROWS + 1, first=SMALL_SLICE_ROWS, size_bytes=100))
    partition.read_frames(0, max_messages=3)  # inside a small frame
    assert cache.get(partition) is None
    partition.read_frames(SMALL_SLICE_ROWS, max_messages=SMALL_SLICE_ROWS + 1)  # to its end
    assert cache.get(partition) is None
    partition.read_frames(SMALL_SLICE_ROWS, max_messages=2)
    kept = cache.get(partition)
    assert kept is not None and kept.header.base_offset == SMALL_SLICE_ROWS


def test_a_frame_from_a_large_window_keeps_only_its_bytes(open_partition: Any, batch: Any) -> None:
    partition = open_partition()
    cache = FrameCache()
    partition._frame_cache = cache
    for _ in range(20):
        partition.append(batch(100, first=partition.end_offset, size_bytes=KIB))
    partition.read_frames(0, max_messages=1950)  # one window of 20 frames, stops in the last
    kept = cache.get(partition)
    assert kept is not None and kept.header.base_offset == 1900
    assert kept.kept_bytes < 2 * kept.header.frame_bytes < partition.size_bytes // 5


def test_the_cache_is_bounded_least_recently_used_first() -> None:
    def entry(size: int) -> CachedFrame:
        header = FrameHeader(0, 0, 0, 100, size - HEADER_BYTES, 0)
        return CachedFrame(object(), 0, header, pa.py_buffer(bytes(size)))

    cache = FrameCache(capacity_bytes=1000)
    owners = [object() for _ in range(4)]
    cache.put(owners[0], entry(400))
    cache.put(owners[1], entry(400))
    assert cache.get(owners[0]) is not None  # now the most recently used
    cache.put(owners[2], entry(400))  # over the bound: owners[1] goes
    assert cache.get(owners[1]) is None and cache.kept_bytes == 800
    cache.put(owners[0], entry(200))  # replaces its own entry
    assert cache.kept_bytes == 600
    cache.put(owners[3], entry(1001))  # larger than the whole cache: not kept
    assert cache.get(owners[3]) is None and cache.kept_bytes == 600


def test_a_kept_frame_is_decoded_once_by_concurrent_readers(
    open_partition: Any, batch: Any
) -> None:
    partition = open_partition()
    partition._frame_cache = FrameCache()
    partition.append(batch(1000, size_bytes=100))
    partition.read_frames(0, max_messages=1)
    results: list[list[int]] = []

    def reader(start: int) -> None:
        got, _ = _rows(partition, start, max_messages=50)
        results.append([row["offset"] for row in got])

    threads = [threading.Thread(target=reader, args=(i * 50,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results) == [list(range(i * 50, i * 50 + 50)) for i in range(8)]


def test_a_refill_after_a_cut_frame_reads_that_frame_not_a_whole_window(
    open_partition: Any, batch: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    partition = open_partition(segment_bytes=64 * 1024 * KIB)
    partition._frame_cache = None
    for _ in range(12):
        partition.append(batch(1000, first=partition.end_offset, size_bytes=KIB))
    frame = partition.size_bytes // 12
    preads = _count_preads(monkeypatch)
    found = partition.read_frames(0, max_messages=100_000, max_bytes=8 * 1024 * KIB)
    assert found.next_offset == 8000  # the 8 MiB budget ends inside the 8th frame
    # Before: the window of 8 MiB that ended inside the 8th frame was followed by another
    # 8 MiB (16 MiB read for 8 frames); now by that frame alone (its head read twice).
    assert sum(size for size, _ in preads) <= 9 * frame


def test_reads_with_kept_frames_see_every_message_once_under_concurrent_appends(
    open_partition: Any, batch: Any
) -> None:
    partition = open_partition(segment_bytes=128 * KIB)
    partition._frame_cache = FrameCache()
    total = 12_000
    done = threading.Event()

    def writer() -> None:
        rng = random.Random(3)
        while partition.end_offset < total:
            size = min(rng.choice([2, 90, 300]), total - partition.end_offset)
            partition.append(batch(size, first=partition.end_offset, size_bytes=64))
        done.set()

    thread = threading.Thread(target=writer)
    thread.start()
    rng = random.Random(4)
    offset, seen = 0, []
    while offset < total:
        got, offset = _rows(partition, offset, max_messages=rng.choice([1, 30, 70, 500]))
        seen += [(row["offset"], bytes(row["data"]).rstrip(b".")) for row in got]
        if not got:
            done.wait(0.001)
    thread.join()
    assert seen == [(i, f"m{i}".encode()) for i in range(total)]


def test_a_column_compressed_frame_is_counted_with_the_data_it_decodes_into() -> None:
    """A body whose data column is compressed whole (``storage.column_codec``) decodes into
    heap memory the kept batch holds: the entry counts it from the start, so a cache of
    such frames stays within its bound in what it really holds (round 22)."""
    from storage.column_codec import compress_body
    from storage.record_batch import WIRE_SCHEMA

    count = 200
    wire = pa.RecordBatch.from_pydict(
        {"seq_no": [None] * count, "producer_id": [None] * count,
         "message_group_id": [None] * count, "created_at": [None] * count,
         "codec": pa.array([1] * count, pa.uint8()), "data": [b"z" * 1000] * count,
         "metadata": [None] * count}, schema=WIRE_SCHEMA)  # fmt: skip
    body = compress_body(wire)
    assert body.size < 10 * KIB
    header = FrameHeader(0, 0, 0, count, body.size, 0)
    entry = CachedFrame(object(), 0, header, body)
    assert entry.kept_bytes == body.size + count * 1000
    assert entry.batch().column("data").to_pylist() == [b"z" * 1000] * count
    cache = FrameCache(capacity_bytes=300 * KIB)  # one such entry, not two
    cache.put(object(), entry)
    cache.put(object(), CachedFrame(object(), 0, header, body))  # over the bound: one goes
    assert cache.kept_bytes == entry.kept_bytes
