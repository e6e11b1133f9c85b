"""Tests of storage/check.py: the offline check and careful repair of a store's files.

A store of one topic (one partition, several segments, producer snapshots) and a
staging directory are written once per module and copied for each test, which
damages the copy as a crash or a disk would, then checks it with and without repair.
Every test compares file hashes: a check never changes a file unless repairing, and
a repair never touches a valid frame.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from storage import check_report as check
from storage.check import check_store
from storage.check_report import CheckReport, Problem
from storage.clock import ManualClock
from storage.config import FsyncPolicy, TopicConfig
from storage.fs import FileSystem
from storage.record_batch import HEADER_BYTES, FrameHeader, build_wire_batch, decode_header
from storage.staging import StagingLog
from storage.store import Store

BATCHES = 60
MESSAGES_PER_BATCH = 4


@dataclass(frozen=True)
class Written:
    root: Path  # the store
    staging: Path
    partition_dir: Path
    end_offset: int


def write_store(base: Path) -> Written:
    clock = ManualClock()
    root, staging = base / "store", base / "staging"
    config = TopicConfig(partition_count=1, fsync_policy=FsyncPolicy.NEVER, segment_bytes=16 * 1024)
    # The ledger off whatever the lane (``pytest --ledger``): a topic with a ledger lets
    # its snapshots claim offsets past their names (``check_frames.snapshot_issue``), which
    # a case below damages on purpose; the ledger's own files: tests/storage/test_check_ledger.
    with Store.open(str(root), fs=FileSystem(), clock=clock, ledger=False) as store:
        topic = store.create_topic(config)
        for number in range(BATCHES):
            first = number * MESSAGES_PER_BATCH
            data = [f"message {first + i}".encode().ljust(64, b".") for i in range(4)]
            seq_nos = list(range(first + 1, first + 1 + MESSAGES_PER_BATCH))
            topic.append(build_wire_batch(data, producer_id="producer", seq_no=seq_nos))
            clock.advance(microseconds=1000)
        partition = topic.partition(0)
        assert len(partition.segments) >= 3
        end_offset = partition.end_offset
        partition_dir = Path(partition.directory)
    staging_log = StagingLog(FileSystem(), str(staging))
    for transaction_id in (7, 8, 9):
        staging_log.stage(transaction_id, [build_wire_batch([b"staged"] * 3)] * 2)
    staging_log.close()
    return Written(root, staging, partition_dir, end_offset)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Written:
    return write_store(tmp_path_factory.mktemp("pristine"))


@pytest.fixture
def data(pristine: Written, tmp_path: Path) -> Written:
    """A private copy of the pristine store and staging for one test to damage."""
    base = pristine.root.parent
    shutil.copytree(base, tmp_path / "data")
    moved = tmp_path / "data"
    return Written(
        moved / "store",
        moved / "staging",
        moved / pristine.partition_dir.relative_to(base),
        pristine.end_offset,
    )


# -- helpers ---------------------------------------------------------------------------------------
def run_check(written: Written, *, repair: bool = False) -> CheckReport:
    return check_store(
        str(written.root), repair, staging_directory=str(written.staging), fs=FileSystem()
    )


def file_hashes(written: Written) -> dict[str, str]:
    """Every file of store and staging with its hash; the lock file is the lock, not data."""
    base = written.root.parent
    return {
        str(path.relative_to(base)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(base.rglob("*"))
        if path.is_file() and path.name != "LOCK"
    }


def log_files(written: Written) -> list[Path]:
    return sorted(written.partition_dir.glob("*.log"))


def frames_of(path: Path) -> list[tuple[int, FrameHeader]]:
    """The frames of a log or staging file, up to a staging file's zero tail."""
    raw = path.read_bytes()
    frames, position = [], 0
    while position + HEADER_BYTES <= len(raw):
        if not any(raw[position : position + HEADER_BYTES]):
            break  # a staging file's pre-written window (storage.staging): its end
        header = decode_header(raw[position : position + HEADER_BYTES])
        assert header is not None, (path, position)
        frames.append((position, header))
        position += header.frame_bytes
    return frames


def flip_byte(path: Path, position: int) -> None:
    raw = bytearray(path.read_bytes())
    raw[position] ^= 0x5A
    path.write_bytes(bytes(raw))


def only(report: CheckReport, kind: str) -> Problem:
    found = [problem for problem in report.problems if problem.kind == kind]
    assert len(found) == 1, report.lines()
    return found[0]


def read_all_offsets(written: Written) -> list[int]:
    with Store.open(str(written.root), fs=FileSystem(), clock=ManualClock()) as store:
        partition = store.topic(store.topic_ids()[0]).partition(0)
        offsets: list[int] = []
        result = partition.read(0, max_messages=100_000)
        for batch in result.batches:
            offsets.extend(batch.column("offset").to_pylist())
        return offsets


# -- a clean store ---------------------------------------------------------------------------------
def test_clean_store_checks_clean_and_counts_what_it_saw(data: Written) -> None:
    report = run_check(data)
    assert report.problems == [], report.lines()
    assert report.ok
    assert (report.topics, report.partitions) == (1, 1)
    assert report.segments == len(log_files(data)) >= 3
    assert report.frames == BATCHES
    assert report.staging_files == 1
    assert report.lines()[-1].startswith("ok: no problems in 1 topic, 1 partition")


def test_check_without_repair_changes_no_file(data: Written) -> None:
    first, last = log_files(data)[0], log_files(data)[-1]
    flip_byte(first, frames_of(first)[1][0] + HEADER_BYTES + 5)
    with open(last, "ab") as file:
        file.write(b"\x00" * 40)
    (data.partition_dir / "00000000000000000000.index").write_bytes(b"\x01" * 12)
    next(data.partition_dir.glob("*.snapshot")).write_bytes(b"{not json")
    (data.partition_dir / "00000000000000000000.index.tmp").write_bytes(b"partial")
    (data.partition_dir / "00000000000000099999.timeindex").write_bytes(b"")
    with open(next(data.staging.glob("*.stage")), "ab") as file:
        file.write(b"TBb1torn")
    before = file_hashes(data)
    report = run_check(data)
    assert file_hashes(data) == before
    kinds = sorted(problem.kind for problem in report.problems)
    expected = ["corrupt_frame", "bad_index", "bad_snapshot", "leftover", "leftover"]
    assert kinds == sorted([*expected, "torn_tail", "torn_tail"]), report.lines()
    assert not report.ok
    assert not any(problem.repaired for problem in report.problems)


# -- damage in the middle: reported, never repaired ------------------------------------------------
@pytest.mark.parametrize(
    ("where", "kind"),
    [
        ("body of a middle frame", "corrupt_frame"),
        ("magic of a middle frame", "broken_frame"),
        ("body of the last frame of a sealed segment", "broken_frame"),
    ],
)
def test_flipped_byte_in_a_sealed_segment_is_reported_with_file_and_position_never_repaired(
    data: Written, where: str, kind: str
) -> None:
    segment = log_files(data)[0]
    frames = frames_of(segment)
    frame_position = frames[-1 if "last" in where else 1][0]
    flip_byte(segment, frame_position + (0 if "magic" in where else HEADER_BYTES + 9))
    logs_before = {path.name: path.read_bytes() for path in log_files(data)}
    names_before = sorted(file_hashes(data))
    for repair in (False, True):
        report = run_check(data, repair=repair)
        problem = only(report, kind)
        assert (problem.path, problem.position) == (str(segment), frame_position)
        assert not problem.repairable and not problem.repaired
        assert not report.ok
        assert f"{segment} at byte {frame_position}" in problem.line()
        assert {path.name: path.read_bytes() for path in log_files(data)} == logs_before
        assert sorted(file_hashes(data)) == names_before  # nothing deleted


def test_a_gap_between_segments_is_reported_and_not_repairable(data: Written) -> None:
    middle = log_files(data)[1]
    for path in data.partition_dir.glob(middle.stem + ".*"):
        path.unlink()
    before = file_hashes(data)
    report = run_check(data, repair=True)
    problem = only(report, "offset_gap")
    assert problem.path == str(log_files(data)[0])
    assert not problem.repaired and not report.ok
    assert file_hashes(data) == before


# -- torn tails: reported, cut by repair, then clean -----------------------------------------------
@pytest.mark.parametrize("damage", ["garbage appended", "last frame cut short"])
def test_torn_tail_is_reported_then_cut_by_repair_then_the_store_checks_clean(
    data: Written, damage: str
) -> None:
    last = log_files(data)[-1]
    frames = frames_of(last)
    if damage == "garbage appended":
        valid_bytes = last.stat().st_size
        with open(last, "ab") as file:
            file.write(last.read_bytes()[: HEADER_BYTES + 20])  # a frame's start, torn
        kept_offsets = data.end_offset
    else:
        valid_bytes = frames[-1][0]
        with open(last, "r+b") as file:
            file.truncate(last.stat().st_size - 10)
        kept_offsets = frames[-1][1].base_offset
    before = file_hashes(data)
    report = run_check(data)
    problem = only(report, "torn_tail")
    assert (problem.path, problem.position, problem.repairable) == (str(last), valid_bytes, True)
    assert problem.line().startswith("repairable: torn_tail: ")
    assert file_hashes(data) == before

    repaired = run_check(data, repair=True)
    assert repaired.ok, repaired.lines()
    assert only(repaired, "torn_tail").repaired
    assert last.stat().st_size == valid_bytes
    assert run_check(data).problems == []
    assert read_all_offsets(data) == list(range(kept_offsets))


def test_a_torn_staging_file_tail_is_cut_and_a_damaged_staged_frame_kept(data: Written) -> None:
    """The tail is torn garbage past the pre-written window's zeros (zeros alone end the
    file cleanly: ``test_staging_prewrite``): the cut is at the last frame's end."""
    stage = next(data.staging.glob("*.stage"))
    frames = frames_of(stage)
    size = frames[-1][0] + frames[-1][1].frame_bytes
    assert stage.stat().st_size > size  # the pre-written zeros
    flip_byte(stage, frames[1][0] + HEADER_BYTES + 3)
    with open(stage, "ab") as file:
        file.write(b"\x5a" * 24)
    report = run_check(data, repair=True)
    assert (only(report, "torn_tail").position, only(report, "torn_tail").repaired) == (size, True)
    corrupt = only(report, "corrupt_frame")
    assert (corrupt.path, corrupt.position, corrupt.repaired) == (str(stage), frames[1][0], False)
    assert stage.stat().st_size == size


# -- indexes: reported, rebuilt from the frames ----------------------------------------------------
@pytest.mark.parametrize(
    ("suffix", "damage"),
    [
        (".index", "deleted"),
        (".index", "entry points inside a frame"),
        (".index", "torn"),
        (".timeindex", "deleted"),
        (".timeindex", "time changed"),
        (".timeindex", "torn"),
    ],
)
def test_a_broken_index_is_reported_and_rebuilt_by_repair(
    data: Written, suffix: str, damage: str
) -> None:
    path = log_files(data)[0].with_suffix(suffix)
    original = path.read_bytes()
    assert len(original) >= 24, "the test needs an index of several entries"
    if damage == "deleted":
        path.unlink()
    elif damage == "torn":
        path.write_bytes(original[:-3])
    elif damage == "entry points inside a frame":
        raw = bytearray(original)
        raw[12:16] = (int.from_bytes(raw[12:16], "little") + 8).to_bytes(4, "little")
        path.write_bytes(bytes(raw))
    else:
        raw = bytearray(original)
        raw[12:20] = (int.from_bytes(raw[12:20], "little") - 1).to_bytes(8, "little")
        path.write_bytes(bytes(raw))
    report = run_check(data)
    problem = only(report, "bad_index")
    assert problem.path == str(path) and problem.repairable and not problem.repaired
    # a missing index is what a stop before its first write leaves: the open rebuilds it
    assert problem.recovered_at_open == (damage == "deleted")
    assert report.ok == (damage == "deleted"), report.lines()

    repaired = run_check(data, repair=True)
    assert only(repaired, "bad_index").repaired and repaired.ok
    assert path.read_bytes() == original
    assert run_check(data).problems == []


# -- snapshots and leftovers: reported, deleted by repair ------------------------------------------
@pytest.mark.parametrize("damage", ["garbage", "past the log end", "claims a later offset"])
def test_a_bad_producer_snapshot_is_reported_and_removed_by_repair(
    data: Written, damage: str
) -> None:
    snapshots = sorted(data.partition_dir.glob("*.snapshot"))
    newest = snapshots[-1]
    assert newest.name == f"{data.end_offset:020d}.snapshot"
    if damage == "garbage":
        newest.write_bytes(b'{"offset": ')
    elif damage == "past the log end":
        newest = newest.rename(newest.with_name(f"{data.end_offset + 5:020d}.snapshot"))
    else:
        payload = json.loads(newest.read_bytes())
        payload["producers"]["producer"][1] = data.end_offset + 1
        newest.write_text(json.dumps(payload))
    problem = only(run_check(data), "bad_snapshot")
    assert problem.path == str(newest) and problem.repairable
    assert newest.exists()

    repaired = run_check(data, repair=True)
    assert only(repaired, "bad_snapshot").repaired and repaired.ok
    assert not newest.exists()
    assert all(path.exists() for path in snapshots[:-1])
    assert run_check(data).problems == []


def test_leftover_files_are_removed_by_repair_but_unlisted_directories_are_kept(
    data: Written,
) -> None:
    leftovers = [
        data.partition_dir / "00000000000000000000.log.deleted",
        data.partition_dir / "00000000000000000040.snapshot.tmp",
        data.partition_dir / "00000000000000099999.index",
        data.root / "store.json.tmp",
    ]
    for path in leftovers:
        path.write_bytes(b"x")
    unlisted = data.root / "topics" / "t0000000099"
    (unlisted / "p0").mkdir(parents=True)
    report = run_check(data, repair=True)
    found = {problem.path: problem for problem in report.problems if problem.kind == "leftover"}
    assert set(found) == {*map(str, leftovers), str(unlisted)}
    assert all(found[str(path)].repaired for path in leftovers)
    assert not any(path.exists() for path in leftovers)
    assert not found[str(unlisted)].repaired and unlisted.is_dir()
    assert not report.ok


def test_unreadable_topic_metadata_is_reported(data: Written) -> None:
    metadata = data.partition_dir.parent / "topic.json"
    metadata.write_text("{")
    problem = only(run_check(data, repair=True), "bad_metadata")
    assert problem.path == str(metadata) and not problem.repairable
    assert metadata.read_text() == "{"


# -- the lock --------------------------------------------------------------------------------------
def test_check_refuses_a_store_another_process_holds(data: Written) -> None:
    holder = FileSystem()
    lock_fd = holder.lock_directory(str(data.root))  # a separate open file: flock conflicts
    try:
        before = file_hashes(data)
        report = run_check(data, repair=True)
    finally:
        holder.unlock_directory(lock_fd)
    problem = only(report, check.IN_USE)
    assert f"pid {os.getpid()}" in problem.message
    assert not report.ran and not report.ok
    assert report.segments == 0
    assert file_hashes(data) == before


def test_check_of_a_missing_store_reports_it(tmp_path: Path) -> None:
    report = check_store(str(tmp_path / "nothing"), fs=FileSystem())
    assert only(report, check.MISSING).path == str(tmp_path / "nothing")
    assert not report.ok
    assert not (tmp_path / "nothing").exists()


@pytest.mark.parametrize(
    ("suffix", "emptied"), [(".index", False), (".timeindex", False), (".index", True)]
)
def test_a_missing_index_is_what_the_next_open_rebuilds(
    data: Written, suffix: str, emptied: bool
) -> None:
    """The checker says what recovery does: a sealed segment's index gone or empty (a
    kill before it was written; an empty time index is well-formed) is no damage; opening
    the store rebuilds it, and the check is then clean."""
    path = log_files(data)[0].with_suffix(suffix)
    original = path.read_bytes()
    if emptied:
        path.write_bytes(b"")
    else:
        path.unlink()
    report = run_check(data)
    (problem,) = report.problems
    assert problem.status == "recovered at open" and report.ok, report.lines()
    assert "1 recovered by the next open" in report.summary()
    assert report.summary().startswith("ok: ")
    with Store.open(str(data.root), fs=FileSystem(), clock=ManualClock()):
        pass
    assert path.read_bytes() == original
    assert run_check(data).problems == []
