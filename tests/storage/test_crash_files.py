"""Crash safety on damaged files: torn tails, garbage, bit flips, lost indexes and snapshots.

Data is written in-process with ``crash_writer``'s message ids and payloads
(producers ``p0-0``/``p0-1`` with dense seq_nos, plus keyless messages),
the store is closed, files are damaged as a crash or a disk might damage
them, and the store is reopened and checked with ``crash_writer.check_topic``
(dense offsets, intact payloads, no duplicates, producer state equal to the
log) plus checks specific to each kind of damage.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from storage.config import FsyncPolicy, TopicConfig
from storage.errors import CorruptSegmentError
from storage.partition_log import DUPLICATE, WRITTEN
from storage.record_batch import HEADER_BYTES, FrameHeader, decode_header
from storage.store import Store

HERE = Path(__file__).resolve().parent


def _load_writer_module():
    spec = importlib.util.spec_from_file_location("crash_writer", HERE / "crash_writer.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("crash_writer", module)
    spec.loader.exec_module(module)
    return module


cw = sys.modules.get("crash_writer") or _load_writer_module()

PRODUCERS = ("p0-0", "p0-1")


@dataclass
class Written:
    root: str
    topic_id: str
    partition_dir: Path
    last_seq: dict[str, int]
    end_offset: int


def write_data(root: Path, *, batches: int = 150, segment_bytes: int = 16 * 1024) -> Written:
    """Write a one-partition topic of many segments in-process, then close the store."""
    rng = random.Random(7)
    next_seq = dict.fromkeys(PRODUCERS, 0)
    with Store.open(str(root)) as store:
        config = TopicConfig(
            partition_count=1,
            fsync_policy=FsyncPolicy.NEVER,
            segment_bytes=segment_bytes,
            retention_ms=None,
        )
        topic = store.create_topic(config)
        for batch in range(batches):
            streams = []
            for pid in rng.sample(PRODUCERS, rng.choice((1, 2))):
                count = rng.randint(1, 8)
                streams.append([f"{pid}|{next_seq[pid] + i}" for i in range(count)])
                next_seq[pid] += count
            if rng.random() < 0.3:
                streams.append([f"K{batch}.{i}|0" for i in range(rng.randint(1, 3))])
            result = topic.append(cw.wire_batch(cw.interleave(streams, rng)))
            assert (result.status == WRITTEN).all()
        partition = topic.partition(0)
        assert len(partition.segments) >= 5
        written = Written(
            str(root),
            topic.topic_id,
            Path(partition.directory),
            {pid: seq - 1 for pid, seq in next_seq.items()},
            partition.end_offset,
        )
    return written


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Written:
    return write_data(tmp_path_factory.mktemp("pristine") / "store")


@pytest.fixture
def data(pristine: Written, tmp_path: Path) -> Written:
    """A private copy of the pristine store for one test to damage."""
    import shutil

    root = tmp_path / "store"
    shutil.copytree(pristine.root, root)
    partition_dir = root / pristine.partition_dir.relative_to(pristine.root)
    return Written(
        str(root), pristine.topic_id, partition_dir, dict(pristine.last_seq), pristine.end_offset
    )


def log_files(written: Written) -> list[Path]:
    return sorted(written.partition_dir.glob("*.log"))


def frames_of(path: Path) -> list[tuple[int, FrameHeader]]:
    """(position, header) of every frame of a log file, walking headers only."""
    raw = path.read_bytes()
    frames, position = [], 0
    while position + HEADER_BYTES <= len(raw):
        header = decode_header(raw[position : position + HEADER_BYTES])
        assert header is not None, (path, position)
        frames.append((position, header))
        position += header.frame_bytes
    assert position == len(raw), (path, position, len(raw))
    return frames


def flip_byte(path: Path, position: int) -> None:
    with open(path, "r+b") as file:
        file.seek(position)
        value = file.read(1)[0]
        file.seek(position)
        file.write(bytes([value ^ 0x5A]))


def reopen_and_check(written: Written):
    """Open the store, run the full check, and return (store, topic, partition, stats)."""
    store = Store.open(written.root)
    topic = store.topic(written.topic_id)
    stats = cw.check_topic(topic)
    return store, topic, topic.partition(0), stats


def resend(topic, pid: str, first: int, last: int):
    mids = [f"{pid}|{seq}" for seq in range(first, last + 1)]
    return topic.append(cw.wire_batch(mids))


def assert_resends_behave(topic, stored_last: dict[str, int], original_last: dict[str, int]):
    """Resending around the cut: surviving messages are duplicates, cut ones are written."""
    for pid in PRODUCERS:
        first = max(0, stored_last[pid] - 3)
        result = resend(topic, pid, first, original_last[pid])
        expected = [
            DUPLICATE if seq <= stored_last[pid] else WRITTEN
            for seq in range(first, original_last[pid] + 1)
        ]
        assert result.status.tolist() == expected, pid
    for pid in PRODUCERS:
        assert topic.last_seq_no(pid) == original_last[pid]
    cw.check_topic(topic)


# -- torn tails --------------------------------------------------------------------------
@pytest.mark.parametrize("seed", range(6))
def test_torn_active_segment_is_cut_and_producers_resend(data: Written, seed: int) -> None:
    """Cut the active log mid-frame (in a header or a body); reopen keeps whole frames only."""
    rng = random.Random(seed)
    active = log_files(data)[-1]
    frames = frames_of(active)
    index = rng.randrange(max(0, len(frames) - 4), len(frames))
    position, header = frames[index]
    inside = (
        rng.randrange(1, HEADER_BYTES)
        if seed % 2
        else rng.randrange(HEADER_BYTES, header.frame_bytes)
    )
    os.truncate(active, position + inside)
    store, topic, partition, _ = reopen_and_check(data)
    try:
        assert partition.end_offset == header.base_offset
        assert partition.recovery.truncated_bytes == inside
        assert active.stat().st_size == position
        stored_last = {pid: topic.last_seq_no(pid) for pid in PRODUCERS}
        assert any(stored_last[p] < data.last_seq[p] for p in PRODUCERS)
        assert_resends_behave(topic, stored_last, data.last_seq)
    finally:
        store.close()
    with Store.open(data.root) as store:  # and the repaired log reopens as it was left
        topic = store.topic(data.topic_id)
        cw.check_topic(topic)
        assert {p: topic.last_seq_no(p) for p in PRODUCERS} == data.last_seq


def test_torn_first_frame_of_fresh_segment_empties_it(data: Written) -> None:
    """A crash right after a roll can leave a new segment with only part of its first frame."""
    active = log_files(data)[-1]
    position, header = frames_of(active)[-1]
    fresh = active.with_name(f"{header.next_offset:020d}.log")
    fresh.write_bytes(active.read_bytes()[position : position + header.frame_bytes // 2])
    store, topic, partition, _ = reopen_and_check(data)
    try:
        assert partition.end_offset == data.end_offset
        assert fresh.stat().st_size == 0
        assert {p: topic.last_seq_no(p) for p in PRODUCERS} == data.last_seq
        last = data.last_seq["p0-0"]
        stored_at = _locate(partition, f"p0-0|{last}")
        result = resend(topic, "p0-0", last, last + 1)
        assert result.status.tolist() == [DUPLICATE, WRITTEN]
        assert result.offsets.tolist() == [stored_at, data.end_offset]
        cw.check_topic(topic)
    finally:
        store.close()


@pytest.mark.parametrize("garbage", ["zeros", "random", "header-only", "bad-checksum-frame"])
def test_garbage_after_active_log_is_cut(data: Written, garbage: str) -> None:
    active = log_files(data)[-1]
    size = active.stat().st_size
    last_position, last_header = frames_of(active)[-1]
    raw = active.read_bytes()
    rng = random.Random(garbage)
    if garbage == "zeros":
        tail = bytes(4096)
    elif garbage == "random":
        tail = rng.randbytes(3000)
    else:
        # a copy of the last frame renumbered to the next offset (what a torn write
        # of the next frame could look like), whole or header only, checksum now wrong
        frame = bytearray(raw[last_position : last_position + last_header.frame_bytes])
        frame[8:16] = last_header.next_offset.to_bytes(8, "little")
        tail = bytes(frame[:HEADER_BYTES] if garbage == "header-only" else frame)
    with open(active, "ab") as file:
        file.write(tail)
    store, topic, partition, _ = reopen_and_check(data)
    try:
        assert partition.end_offset == data.end_offset
        assert partition.recovery.truncated_bytes == len(tail)
        assert active.stat().st_size == size
        assert {p: topic.last_seq_no(p) for p in PRODUCERS} == data.last_seq
        assert_resends_behave(topic, data.last_seq, {p: s + 2 for p, s in data.last_seq.items()})
    finally:
        store.close()


# -- corruption inside the log -----------------------------------------------------------
def test_flipped_byte_in_sealed_segment(data: Written) -> None:
    """The damaged frame fails to read with file and position; everything else reads."""
    sealed = log_files(data)[len(log_files(data)) // 2]
    frames = frames_of(sealed)
    assert len(frames) >= 3
    position, header = frames[1]
    flip_byte(sealed, position + HEADER_BYTES + header.body_bytes // 2)
    with Store.open(data.root) as store:
        partition = store.topic(data.topic_id).partition(0)
        assert partition.end_offset == data.end_offset
        with pytest.raises(CorruptSegmentError) as caught:
            partition.read(header.base_offset)
        assert caught.value.path == str(sealed)
        assert caught.value.position == position
        assert str(sealed) in str(caught.value) and f"position {position}" in str(caught.value)
        with pytest.raises(CorruptSegmentError):
            partition.read(frames[0][1].base_offset, max_messages=1000)
        before = partition.read(0, max_messages=header.base_offset, max_bytes=64 << 20)
        offsets = [o for b in before.batches for o in b.column("offset").to_pylist()]
        assert offsets == list(range(header.base_offset))
        after = _read_all_from(partition, header.next_offset)
        assert after == list(range(header.next_offset, data.end_offset))
        last = header.next_offset - 1  # a read inside the damaged frame fails too
        with pytest.raises(CorruptSegmentError):
            partition.read(last)
    with Store.open(data.root) as store:  # the corruption is kept, not "repaired" away
        partition = store.topic(data.topic_id).partition(0)
        assert partition.end_offset == data.end_offset
        with pytest.raises(CorruptSegmentError):
            partition.read(header.base_offset)


@pytest.mark.parametrize("damaged", [1, 2])
def test_damaged_frames_inside_active_segment_are_kept(data: Written, damaged: int) -> None:
    """Checksum failures followed by valid frames are corruption, not a torn tail: no cut.

    The log loader promises "nothing valid is ever cut". With one damaged frame
    the next frame is valid and recovery keeps everything; with two adjacent
    damaged frames recovery must still find the valid frames after them.
    """
    active = log_files(data)[-1]
    frames = frames_of(active)
    assert len(frames) >= damaged + 2
    for position, header in frames[:damaged]:
        flip_byte(active, position + HEADER_BYTES + header.body_bytes // 2)
    size = active.stat().st_size
    first_bad = frames[0][1]
    first_good = frames[damaged][1]
    with Store.open(data.root) as store:
        partition = store.topic(data.topic_id).partition(0)
        assert active.stat().st_size == size, "valid frames after the damage were cut"
        assert partition.end_offset == data.end_offset
        assert partition.recovery.truncated_bytes == 0
        assert partition.recovery.corrupt_frames == [
            (str(active), position) for position, _ in frames[:damaged]
        ]
        with pytest.raises(CorruptSegmentError):
            partition.read(first_bad.base_offset)
        assert _read_all_from(partition, first_good.base_offset) == list(
            range(first_good.base_offset, data.end_offset)
        )


def _locate(partition, mid: str) -> int:
    """The offset of message ``mid`` in a partition."""
    table = cw.read_partition(partition)
    mids = [cw.mid_of(d) for d in table.column("data").to_pylist()]
    return table.column("offset")[mids.index(mid)].as_py()


def _read_all_from(partition, offset: int) -> list[int]:
    offsets = []
    while offset < partition.end_offset:
        result = partition.read(offset, max_messages=100_000, max_bytes=64 << 20)
        for batch in result.batches:
            offsets.extend(batch.column("offset").to_pylist())
        offset = result.next_offset
    return offsets


@pytest.mark.parametrize(
    ("max_messages", "max_bytes"), [(1000, 8 << 20), (7, 8 << 20), (1000, 3000)]
)
def test_paged_reads_resume_at_next_offset(data: Written, max_messages: int, max_bytes: int):
    """Reading page by page from ``next_offset`` returns every message once, in order.

    A reader resuming after a crash (or a consumer of the recovered log) pages
    through with ``next_offset``; a page that ends inside a segment (limit of
    messages or bytes reached) must not jump to the next segment's base.
    """
    with Store.open(data.root) as store:
        partition = store.topic(data.topic_id).partition(0)
        offsets, offset = [], 0
        while offset < partition.end_offset:
            result = partition.read(offset, max_messages=max_messages, max_bytes=max_bytes)
            page = [o for b in result.batches for o in b.column("offset").to_pylist()]
            assert page and page[0] == offset
            assert result.next_offset == page[-1] + 1, (
                f"read from {offset} returned offsets {page[0]}..{page[-1]} "
                f"but next_offset {result.next_offset}"
            )
            offsets.extend(page)
            offset = result.next_offset
        assert offsets == list(range(data.end_offset))


# -- indexes ----------------------------------------------------------------------------
@pytest.mark.parametrize("which", ["sealed", "active"])
@pytest.mark.parametrize(
    "damage", ["delete-index", "delete-timeindex", "odd-index", "odd-timeindex", "empty-index"]
)
def test_damaged_index_is_rebuilt(data: Written, which: str, damage: str) -> None:
    logs = log_files(data)
    log = logs[1] if which == "sealed" else logs[-1]
    suffix = ".timeindex" if "timeindex" in damage else ".index"
    index = log.with_suffix(suffix)
    original = index.read_bytes()
    assert len(original) >= (24 if suffix == ".index" else 36) or which == "active"
    with Store.open(data.root) as store:  # answers before the damage
        partition = store.topic(data.topic_id).partition(0)
        probes = _probe_offsets_and_times(partition)
    if damage.startswith("delete"):
        index.unlink()
    elif damage.startswith("odd"):
        os.truncate(index, len(original) - 3)
    else:
        os.truncate(index, 0)
    store, _, partition, _ = reopen_and_check(data)
    try:
        if damage != "empty-index":  # an empty index only slows reads (they scan from 0)
            assert partition.recovery.rebuilt_indexes == (which == "sealed")
            assert index.read_bytes() == original
        assert _probe_offsets_and_times(partition) == probes
    finally:
        store.close()


def _probe_offsets_and_times(partition) -> list[tuple[int, int, int]]:
    """For a spread of offsets: the first offset a read returns, and offset_for_time."""
    answers = []
    for offset in range(0, partition.end_offset, max(1, partition.end_offset // 97)):
        batch = partition.read(offset, max_messages=1).batches[0]
        written_at = batch.column("written_at").cast("int64")[0].as_py()
        answers.append(
            (offset, batch.column("offset")[0].as_py(), partition.offset_for_time(written_at))
        )
    return answers


# -- producer snapshots ---------------------------------------------------------------------
def test_deleted_snapshots_are_rebuilt_from_the_log(data: Written) -> None:
    snapshots = sorted(data.partition_dir.glob("*.snapshot"))
    assert snapshots
    for path in snapshots:
        path.unlink()
    store, topic, _, _ = reopen_and_check(data)
    try:
        assert {p: topic.last_seq_no(p) for p in PRODUCERS} == data.last_seq
        assert_resends_behave(topic, data.last_seq, {p: s + 3 for p, s in data.last_seq.items()})
    finally:
        store.close()
    assert list(data.partition_dir.glob("*.snapshot"))  # a clean close snapshots again


@pytest.mark.parametrize(
    "content",
    [
        b"\x00\xff garbage \x13",
        b'{"offset": 1, "producers": {"p0-0": [3, ',
        b"",
        b"[1, 2, 3]",
        b'{"offset": 0, "producers": {}}',
        b'{"offset": OFFSET, "producers": {"p0-0": [1, 2]}}',
        b'{"offset": OFFSET, "producers": {"p0-0": "x"}}',
        b'{"offset": OFFSET, "producers": null}',
        b'{"offset": OFFSET, "producers": []}',
    ],
    ids=[
        "binary",
        "torn",
        "empty",
        "list",
        "wrong-offset",
        "short-entry",
        "string-entry",
        "null-producers",
        "list-producers",
    ],
)
def test_corrupt_snapshot_is_ignored(data: Written, content: bytes) -> None:
    """An unreadable newest snapshot is dropped; state comes from an older one plus the log."""
    snapshots = sorted(data.partition_dir.glob("*.snapshot"))
    newest = snapshots[-1]
    offset = int(newest.name.split(".")[0])
    newest.write_bytes(content.replace(b"OFFSET", str(offset).encode()))
    store, topic, _, _ = reopen_and_check(data)
    try:
        assert {p: topic.last_seq_no(p) for p in PRODUCERS} == data.last_seq
        assert_resends_behave(topic, data.last_seq, {p: s + 1 for p, s in data.last_seq.items()})
    finally:
        store.close()


def test_every_snapshot_corrupt(data: Written) -> None:
    for path in data.partition_dir.glob("*.snapshot"):
        path.write_bytes(b"{not json")
    store, topic, _, _ = reopen_and_check(data)
    try:
        assert {p: topic.last_seq_no(p) for p in PRODUCERS} == data.last_seq
    finally:
        store.close()


# -- metadata leftovers -----------------------------------------------------------------
def test_torn_metadata_temp_files_are_ignored(data: Written) -> None:
    """Torn ``*.tmp`` leftovers of atomic replaces never replace the real files."""
    root = Path(data.root)
    topic_dir = root / "topics" / data.topic_id
    topic_json = (topic_dir / "topic.json").read_bytes()
    store_json = (root / "store.json").read_bytes()
    (topic_dir / "topic.json.tmp").write_bytes(topic_json[: len(topic_json) // 2])
    (root / "store.json.tmp").write_bytes(store_json[: len(store_json) // 2])
    partition_tmp = [
        data.partition_dir / "00000000000000000000.snapshot.tmp",
        data.partition_dir / "00000000000000000000.index.tmp",
    ]
    for path in partition_tmp:
        path.write_bytes(b"torn")
    stray = root / "topics" / "t0000000099"  # a create that died before store.json listed it
    stray.mkdir()
    (stray / "topic.json.tmp").write_bytes(b"{")
    store, topic, _, _ = reopen_and_check(data)
    try:
        assert store.topic_ids() == [data.topic_id]
        assert topic.config.segment_bytes == 16 * 1024
        assert {p: topic.last_seq_no(p) for p in PRODUCERS} == data.last_seq
        assert not stray.exists()
        assert not any(path.exists() for path in partition_tmp)
        second = store.create_topic(TopicConfig(partition_count=2))  # metadata writes still work
        topic.alter(TopicConfig(partition_count=2, segment_bytes=16 * 1024, retention_ms=None))
        second_id = second.topic_id
    finally:
        store.close()
    assert json.loads((root / "store.json").read_bytes())["topics"] == sorted(
        [data.topic_id, second_id]
    )
    with Store.open(data.root) as store:
        assert store.topic_ids() == sorted([data.topic_id, second_id])
        topic = store.topic(data.topic_id)
        assert topic.partition_ids() == [0, 1]
        assert topic.partition(0).end_offset == data.end_offset
