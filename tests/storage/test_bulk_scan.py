"""A read of many partitions into one buffer (``storage.bulk_scan``; issue 14, consume at
1000 partitions).

Property: for any plan it accepts, ``scan_many`` finds exactly the slices that
``read_frames`` of each partition in turn finds (frames, skips, rows, sizes), the same
next offsets, and decodes to the same read batch; it makes one read per partition and
no per-partition ``read_frames``. Everything it does not handle is refused (None)
before the caller's own reads: a range over two segments or below the log start, a
large frame, a damaged frame, a byte budget the frames reach, a window over the cap.
"""

from __future__ import annotations

import gc
import os
import random
from typing import Any

import pytest

from storage import buffer_pool, bulk_scan, file_map, limits, verified_frames
from storage import segment as segment_module
from storage.bulk_scan import scan_many
from storage.errors import CorruptSegmentError
from storage.frame_read import decode_small
from storage.partition_log import PartitionLog
from tests.checksum_spy import count_checksums

BIG = 1 << 26


def _partitions(open_partition: Any, tmp_path: Any, count: int, **settings: Any) -> list:
    return [
        open_partition(directory=os.path.join(str(tmp_path), f"p{index}"), **settings)
        for index in range(count)
    ]


def _reference(plan: list[tuple[int, PartitionLog, int, int]]) -> tuple[list, dict[int, int]]:
    slices, nexts = [], {}
    for partition_id, log, start, count in plan:
        found = log.read_frames(start, max_messages=count, max_bytes=BIG)
        slices += [(partition_id, piece) for piece in found.slices]
        nexts[partition_id] = found.next_offset
    return slices, nexts


def _check_same(plan: list[tuple[int, PartitionLog, int, int]]) -> None:
    expected, nexts = _reference(plan)
    scanned = scan_many(plan, BIG)
    assert scanned is not None
    assert scanned.next_offsets == nexts
    got = list(zip(
        scanned.partitions.tolist(), scanned.firsts.tolist(), scanned.skips.tolist(),
        scanned.rows.tolist(), scanned.counts.tolist(), strict=True,
    ))  # fmt: skip
    assert got == [(p, s.first_offset, s.skip, s.rows, s.header.record_count) for p, s in expected]
    assert scanned.message_count == sum(s.rows for _, s in expected)
    assert scanned.size == sum(s.size for _, s in expected)
    decoded = scanned.decode()
    decoded.validate(full=True)
    assert decoded.equals(decode_small([s for _, s in expected]))


@pytest.mark.parametrize("index_every", [limits.INDEX_INTERVAL_BYTES, 1])  # sparse, each frame
@pytest.mark.parametrize("vector_min", [1, 16, 10**9])  # numpy steps, both, Python only
@pytest.mark.parametrize("seed", range(6))
def test_the_slices_of_read_frames_in_turn(
    open_partition: Any,
    batch: Any,
    tmp_path: Any,
    monkeypatch: pytest.MonkeyPatch,
    seed: int,
    vector_min: int,
    index_every: int,
) -> None:
    """With an index entry at every frame, each window ends at the first frame past the
    offsets asked (``PartitionLog.frame_window``, round 38), never at the segment's end
    unless the read reaches it."""
    monkeypatch.setattr(bulk_scan, "_WALK_VECTOR_MIN", vector_min)
    monkeypatch.setattr(limits, "INDEX_INTERVAL_BYTES", index_every)
    rng = random.Random(seed)
    logs = _partitions(open_partition, tmp_path, 30)
    ends = []
    for log in logs:
        offset = 0
        for _ in range(rng.randrange(1, 12)):
            count = rng.randrange(1, 65)
            log.append(batch(count, first=offset, size_bytes=rng.randrange(1, 300)))
            offset += count
        ends.append(offset)
    for _ in range(10):
        plan = []
        for index in rng.sample(range(len(logs)), rng.randrange(1, len(logs) + 1)):
            start = rng.randrange(ends[index])  # anywhere: inside a frame, after many
            count = rng.randrange(1, ends[index] - start + 1)  # to the end or inside a frame
            plan.append((index, logs[index], start, count))
        _check_same(plan)


def test_a_window_ends_at_the_first_indexed_frame_past_the_offsets_asked(
    open_partition: Any, batch: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Round 38: a read of a segment's first frames asks only for them, not for the rest
    of the segment (a consumer catching up over many partitions of long segments went
    over its byte budget and lost the one-buffer read); a read to the end, or inside the
    last indexed stretch, still reaches the published end."""
    monkeypatch.setattr(limits, "INDEX_INTERVAL_BYTES", 1)  # an entry at every frame
    (log,) = _partitions(open_partition, tmp_path, 1)
    for index in range(10):
        log.append(batch(10, first=10 * index, size_bytes=200))
    segment = log.segments[0]
    positions = [segment.offset_index.lookup(10 * index) for index in range(10)]
    assert positions == sorted(set(positions)) and positions[0] == 0
    end = segment.size_bytes
    assert log.frame_window(0, 10, BIG) == (segment, 0, positions[1])
    assert log.frame_window(5, 20, BIG) == (segment, 0, positions[3])  # inside a frame
    assert log.frame_window(20, 11, BIG) == (segment, positions[2], positions[4])
    assert log.frame_window(30, 70, BIG) == (segment, positions[3], end)
    assert log.frame_window(95, 5, BIG) == (segment, positions[9], end)
    # a window that fits the cap only when cut to the frames asked
    assert log.frame_window(0, 10, positions[1]) == (segment, 0, positions[1])
    assert log.frame_window(0, 10, positions[1] - 1) is None
    monkeypatch.setattr(limits, "INDEX_INTERVAL_BYTES", 1 << 30)  # (appends only)
    sparse = _partitions(open_partition, tmp_path / "sparse", 1)[0]
    for index in range(10):
        sparse.append(batch(10, first=10 * index, size_bytes=200))
    # one entry only (the first frame): the window runs to the published end
    assert sparse.frame_window(0, 10, BIG) == (sparse.segments[0], 0,
                                              sparse.segments[0].size_bytes)  # fmt: skip


def _count_reads(segment_type: Any, monkeypatch: pytest.MonkeyPatch) -> dict[str, list]:
    """Record each segment read by ``pread`` (``read_into``) and each map asked for."""
    reads: dict[str, list] = {"pread": [], "map": []}
    pread, mapped = segment_type.read_into, segment_type.mapped

    def counted_pread(self: Any, *args: Any) -> int:
        reads["pread"].append(self)
        return pread(self, *args)

    def counted_map(self: Any, *args: Any) -> Any:
        found = mapped(self, *args)
        if found is not None:
            reads["map"].append(self)
        return found

    monkeypatch.setattr(segment_type, "read_into", counted_pread)
    monkeypatch.setattr(segment_type, "mapped", counted_map)
    return reads


@pytest.mark.parametrize("maps", [True, False])
def test_one_read_per_partition_and_no_read_frames(
    open_partition: Any, batch: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch, maps: bool
) -> None:
    """With maps (the default) each window is copied from its segment's map, no
    ``pread``; without them, one ``pread`` a partition."""
    monkeypatch.setattr(file_map, "ENABLED", maps)
    logs = _partitions(open_partition, tmp_path, 20)
    for log in logs:
        for index in range(4):
            log.append(batch(5, first=5 * index))
    reads = _count_reads(type(logs[0].segments[0]), monkeypatch)

    def refused(*_: Any, **__: Any) -> Any:
        raise AssertionError("read_frames called")

    monkeypatch.setattr(PartitionLog, "read_frames", refused)
    scanned = scan_many([(i, log, 0, 20) for i, log in enumerate(logs)], BIG)
    assert scanned is not None and scanned.message_count == 400 and len(scanned) == 80
    expected = [log.segments[0] for log in logs]
    assert reads == ({"pread": [], "map": expected} if maps else {"pread": expected, "map": []})
    rows = scanned.decode().to_pylist()
    assert [r["offset"] for r in rows] == list(range(20)) * 20
    assert [bytes(r["data"]).rstrip(b".") for r in rows] == [
        f"m{o}".encode() for o in range(20)
    ] * 20


def test_in_order_groups_partitions_as_asked(open_partition: Any, batch: Any, tmp_path: Any):
    logs = _partitions(open_partition, tmp_path, 3)
    for log in logs:
        log.append(batch(2))
        log.append(batch(3, first=2))
    scanned = scan_many([(2, logs[2], 0, 5), (0, logs[0], 1, 4), (1, logs[1], 4, 1)], BIG)
    assert scanned is not None
    ordered = scanned.in_order([0, 1, 2])
    assert ordered.partitions.tolist() == [0, 0, 1, 2, 2]
    assert ordered.firsts.tolist() == [1, 2, 4, 0, 2]
    rows = ordered.decode().to_pylist()
    assert [r["offset"] for r in rows] == [1, 2, 3, 4, 4, 0, 1, 2, 3, 4]


def test_what_it_does_not_handle_is_refused(
    open_partition: Any, batch: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    small, large, rolled, tiny = _partitions(open_partition, tmp_path, 4)
    for index in range(4):
        small.append(batch(5, first=5 * index))
    large.append(batch(65))  # over SMALL_SLICE_ROWS: read alone and zero-copy
    rolled.append(batch(5))
    rolled.roll()
    rolled.append(batch(5, first=5))
    tiny.append(batch(1))
    assert scan_many([(0, small, 0, 20), (1, large, 0, 65)], BIG) is None
    assert scan_many([(0, small, 0, 20), (2, rolled, 0, 10)], BIG) is None  # two segments
    assert scan_many([(0, small, 0, 20), (2, rolled, 5, 5)], BIG) is not None
    assert scan_many([(0, small, 0, 20), (3, tiny, 0, 2)], BIG) is None  # past the end
    frame_bytes = small.segments[0].size_bytes
    assert scan_many([(0, small, 0, 20), (3, tiny, 0, 1)], frame_bytes) is None  # budget
    assert scan_many([(0, small, 0, 20)], frame_bytes + 1) is not None
    assert scan_many([(0, small, 15, 5)], frame_bytes // 4) is None  # the window is over it
    monkeypatch.setattr(bulk_scan, "SCAN_WINDOW_BYTES", frame_bytes - 1)
    assert scan_many([(0, small, 0, 20)], BIG) is None


@pytest.mark.parametrize("vector_min", [1, 10**9])
@pytest.mark.parametrize("damage", ["body", "magic"])
def test_a_damaged_frame_is_refused_and_read_frames_reports_it(
    open_partition: Any,
    batch: Any,
    tmp_path: Any,
    monkeypatch: pytest.MonkeyPatch,
    damage: str,
    vector_min: int,
) -> None:
    monkeypatch.setattr(bulk_scan, "_WALK_VECTOR_MIN", vector_min)
    # Damage under the live process after it wrote the frames: read_frames finds it when
    # every read is checked (TOPICBASE_VERIFY_READS=always); by default a frame this
    # process wrote or verified is not checked again (tests/storage/test_verified_frames.py).
    monkeypatch.setattr(verified_frames, "ONCE", False)
    first, second = _partitions(open_partition, tmp_path, 2)
    for log in (first, second):
        for index in range(3):
            log.append(batch(5, first=5 * index))
    segment = second.segments[0]
    third = segment.size_bytes // 3 * 2 if damage == "magic" else None  # frames of one size
    with open(segment.log_path, "r+b") as file:
        if third is None:
            file.seek(segment.size_bytes - 3)
            file.write(b"\xff\xff\xff")  # the last frame's body
        else:
            file.seek(third)
            file.write(b"XXXX")  # the last frame's header
    plan = [(0, first, 0, 15), (1, second, 0, 15)]
    assert scan_many(plan, BIG) is None
    assert scan_many([plan[0], (1, second, 0, 10)], BIG) is not None  # not read
    with pytest.raises(CorruptSegmentError):
        second.read_frames(0, max_messages=15)


def test_a_first_window_of_large_frames_reads_no_other(
    open_partition: Any, batch: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    large, small = _partitions(open_partition, tmp_path, 2)
    large.append(batch(65))
    small.append(batch(5))
    reads = _count_reads(type(large.segments[0]), monkeypatch)
    assert scan_many([(0, large, 0, 65), (1, small, 0, 5)], BIG) is None
    assert reads["pread"] + reads["map"] == [large.segments[0]]


def test_the_buffer_is_reused_and_earlier_results_stay_intact(
    open_partition: Any, batch: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scan buffer goes back to the pool after the decode and the next scan reads
    into it; what the first decode returned does not change (it copied what it keeps)."""
    monkeypatch.setattr(buffer_pool, "POOLED_BYTES_MIN", 1)
    monkeypatch.setattr(bulk_scan, "BUFFERS", buffer_pool.BufferPool())
    logs = _partitions(open_partition, tmp_path, 20)
    for index, log in enumerate(logs):
        for frame in range(3):
            log.append(batch(5, first=5 * frame, size_bytes=40 + index))
    first = scan_many([(i, log, 0, 15) for i, log in enumerate(logs)], BIG)
    assert first is not None
    decoded = first.decode()
    expected = decoded.to_pylist()
    assert first.released and bulk_scan.BUFFERS.idle_bytes == first.buffer.base.size
    second = scan_many([(i, log, 5, 10) for i, log in enumerate(logs)], BIG)
    assert second is not None and second.buffer.base is first.buffer.base  # reused
    assert second.decode().to_pylist() != expected
    assert decoded.to_pylist() == expected
    with pytest.raises(AssertionError):
        first.decode()  # once only: its buffer is someone else's now


def test_a_batch_read_through_maps_holds_no_map(
    open_partition: Any, batch: Any, tmp_path: Any
) -> None:
    """The windows are copied out of the segments' maps: once the segments are closed
    (their maps let go), no map is live, and the decoded batch still reads the same."""
    logs = _partitions(open_partition, tmp_path, 20)
    for log in logs:
        for index in range(3):
            log.append(batch(5, first=5 * index))
    gc.collect()  # maps of earlier tests' segments freed now, not during this one
    before = file_map.live_maps()
    scanned = scan_many([(i, log, 0, 15) for i, log in enumerate(logs)], BIG)
    assert scanned is not None
    assert file_map.live_maps() == before + 20  # read through the segments' maps
    decoded = scanned.decode()
    expected = decoded.to_pylist()
    for log in logs:
        log.close()
    assert file_map.live_maps() == before
    assert decoded.to_pylist() == expected


def _four_frames_each(open_partition: Any, batch: Any, tmp_path: Any, count: int) -> list:
    logs = _partitions(open_partition, tmp_path, count)
    for log in logs:
        for index in range(4):
            log.append(batch(5, first=5 * index, size_bytes=200))
    return logs


def test_frames_this_process_wrote_are_scanned_without_a_checksum(
    open_partition: Any, batch: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As a single partition's read through its map (``verified_frames``): a frame this
    process wrote from memory is not checked again; with TOPICBASE_VERIFY_READS=always,
    or through ``pread`` (maps off), every frame is."""
    logs = _four_frames_each(open_partition, batch, tmp_path, 20)
    sizes = count_checksums(monkeypatch, bulk_scan)
    plan = [(i, log, 0, 20) for i, log in enumerate(logs)]
    scanned = scan_many(plan, BIG)
    assert scanned is not None and scanned.message_count == 400
    assert sizes == [], "the frames were verified as written"
    monkeypatch.setattr(verified_frames, "ONCE", False)
    assert scan_many(plan, BIG) is not None
    assert len(sizes) == 80, "always: every frame checked"
    monkeypatch.setattr(verified_frames, "ONCE", True)
    monkeypatch.setattr(file_map, "ENABLED", False)
    for log in logs:
        log.segments[0]._drop_map()
    sizes.clear()
    assert scan_many(plan, BIG) is not None
    assert len(sizes) == 80, "a pread window is checked whatever this process verified"


def test_after_a_reopen_a_scan_checks_each_frame_once_and_damage_is_refused(
    open_partition: Any, batch: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a restart nothing is verified: the first scan checks every frame it takes
    (a damaged one refuses the scan, and ``read_frames`` reports it) and marks what it
    checked, so the next scan and a single partition's read of those frames check
    nothing; frames it did not take stay unverified."""
    logs = _four_frames_each(open_partition, batch, tmp_path, 20)
    for log in logs:
        log.close()
    again = [
        open_partition(directory=os.path.join(str(tmp_path), f"p{index}")) for index in range(20)
    ]
    damaged = again[7].segments[0]
    with open(damaged.log_path, "r+b") as file:
        file.seek(damaged.size_bytes - 3)
        file.write(b"\xff\xff\xff")  # the last frame's body
    sizes = count_checksums(monkeypatch, bulk_scan)
    plan = [(i, log, 0, 20) for i, log in enumerate(again)]
    assert scan_many(plan, BIG) is None
    with pytest.raises(CorruptSegmentError):
        again[7].read_frames(0, max_messages=20)
    del plan[7]
    sizes.clear()
    partial = [(i, log, 0, 10) for i, log, _, _ in plan]  # the first 2 frames of each
    assert scan_many(partial, BIG) is not None
    assert len(sizes) == 38, "the first scan after a reopen checks each frame it takes"
    for _, log, _, _ in partial:
        assert log.segments[0].verified.snapshot() == ((0, log.segments[0].size_bytes // 2),)
    sizes.clear()
    assert scan_many(partial, BIG) is not None
    assert sizes == [], "and marks them verified"
    assert scan_many(plan, BIG) is not None
    assert len(sizes) == 38, "the frames not taken before are checked now"
    segment_sizes = count_checksums(monkeypatch, segment_module)
    assert again[0].read_frames(0, max_messages=20).message_count == 20
    assert segment_sizes == [], "a single partition's read through the map trusts them too"


def test_a_scan_whose_pages_are_dropped_before_it_marks_marks_nothing(
    open_partition: Any, batch: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review R2-16-1: a window's frames are copied, then a drop of the page cache (another
    thread) forgets the segment's runs, then the scan would mark what it checked over bytes
    that left the cache. The generation taken before the copy voids that window's marks;
    the other windows are marked."""
    logs = _four_frames_each(open_partition, batch, tmp_path, 4)
    for log in logs:
        log.close()
    again = [
        open_partition(directory=os.path.join(str(tmp_path), f"p{index}")) for index in range(4)
    ]
    dropped = again[2].segments[0]
    real = bulk_scan._checked

    def checked_then_dropped(*args: Any) -> bool:
        ok = real(*args)
        dropped.verified.forget_below(dropped.size_bytes)  # as ``LogSegment.drop_cache``
        return ok

    monkeypatch.setattr(bulk_scan, "_checked", checked_then_dropped)
    assert scan_many([(i, log, 0, 20) for i, log in enumerate(again)], BIG) is not None
    assert dropped.verified.snapshot() == ()
    for index in (0, 1, 3):
        segment = again[index].segments[0]
        assert segment.verified.snapshot() == ((0, segment.size_bytes),)
