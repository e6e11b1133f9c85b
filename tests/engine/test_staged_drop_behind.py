"""Own frames files dropped from the page cache behind their writeback as they are staged
(``storage.staged_frames.DropBehind``) and, while the process that staged them runs,
vouched for by identity at the commit instead of read back from the disk
(``engine.staged_refs.StagedHere``; round 20). A restart forgets them: every file is read
back and checked as before, so a file torn after a kill between staging and commit is
refused (XX001) and stays staged."""

from __future__ import annotations

import errno
import os
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from engine import bulk_write, staged_refs
from engine.database import Database
from storage import limits, page_cache, staged_frames
from storage.errors import CorruptSegmentError, StorageIOError
from storage.fs import FileSystem
from storage.record_batch import HEADER_BYTES
from storage.staged_frames import OWN_FILE
from tests.engine.bulk_helpers import commit_writes, messages_by_partition, stage_batch
from tests.fork_server import ModuleForkServer

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import bulk_commit_child as child  # noqa: E402

PAGE = 4096
ROWS = 2000  # 1 KiB messages over 2 partitions: ~1 MiB an own file, 16 frames of 64
CRASHED = 137
_SERVER = ModuleForkServer(HERE / "bulk_commit_child.py")
_fork_server = _SERVER.fixture()


@pytest.fixture(autouse=True)
def _small_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    """Own files from each partition's first frame, adopted from 1 KiB; frames of 64
    messages; writeback every 16 KiB, dropped 64 KiB behind in steps of 16 KiB."""
    monkeypatch.setattr(limits, "ADOPT_SWITCH_BYTES", 0)
    monkeypatch.setattr(limits, "ADOPT_BYTES_MIN", 1024)
    monkeypatch.setattr(limits, "FRAME_TARGET_MESSAGES", 64)
    monkeypatch.setattr(limits, "WRITEBACK_INTERVAL_BYTES", 16 * 1024)
    monkeypatch.setattr(limits, "DROP_BEHIND_KEEP_BYTES", 64 * 1024)
    monkeypatch.setattr(limits, "DROP_BEHIND_STEP_BYTES", 16 * 1024)
    monkeypatch.setattr(page_cache, "ENABLED", True)


def _message(index: int) -> bytes:
    return b"m%06d-" % index + bytes([index % 251]) * 1016


def _open(tmp_path: Path) -> Database:
    database = Database.open(str(tmp_path / "data"), retention_interval_s=None)
    session = database.connect()
    session.execute("CREATE TOPIC t WITH (min_active_partitions = 2)")
    session.close()
    return database


def _stage(database: Database, write_id: str = "a") -> None:
    batch = pa.record_batch({
        "data": pa.array([_message(i) for i in range(ROWS)], pa.binary()),
        "partition": pa.array([i % 2 for i in range(ROWS)], pa.int32())})  # fmt: skip
    stage_batch(database, write_id, batch, 250)


_partitions = messages_by_partition


def _expected() -> dict[int, list[bytes]]:
    return {p: [_message(i) for i in range(ROWS) if i % 2 == p] for p in (0, 1)}


def _own_files(data: Path) -> list[Path]:
    return sorted(p for p in data.rglob("*.frames") if OWN_FILE.match(p.name))


def _damage(path: Path, position: int, *, keep_time: bool) -> int:
    """Flip the byte at ``position``; its modification time kept (as a damage the file
    system's timestamps do not show) unless not ``keep_time`` (a later write: +1 s)."""
    found = path.stat()
    with open(path, "r+b") as handle:
        handle.seek(position)
        value = handle.read(1)[0]
        handle.seek(position)
        handle.write(bytes([value ^ 0xFF]))
    mtime = found.st_mtime_ns if keep_time else found.st_mtime_ns + 1_000_000_000
    os.utime(path, ns=(found.st_atime_ns, mtime))
    return value


def _a_dropped_body_byte(path: Path) -> int:
    """A position inside a frame body, past the first frame's pages: dropped behind."""
    size = path.stat().st_size
    frames = staged_frames.index_own_file(FileSystem(), str(path), size)
    assert len(frames) >= 8
    return frames[2].body_position + 100


def test_own_files_pages_are_dropped_behind_their_writeback_but_not_their_headers(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    # Before round 20 nothing was dropped: every staged byte stayed in fresh page-cache pages.
    advised: list[tuple[str, int, int]] = []
    drop = FileSystem.drop_cache

    def recorded(self: FileSystem, fd: int, position: int, size: int) -> bool:
        advised.append((os.readlink(f"/proc/self/fd/{fd}"), position, size))
        return drop(self, fd, position, size)

    monkeypatch.setattr(FileSystem, "drop_cache", recorded)
    database = _open(tmp_path)
    try:
        _stage(database)
        own = _own_files(tmp_path / "data")
        assert len(own) == 2
        for path in own:  # renamed at the seal: match by the .part name's partition
            partition = OWN_FILE.match(path.name).group("partition")
            ranges = [(p, n) for name, p, n in advised if name.endswith(f".~p{partition}.part")]
            size = path.stat().st_size
            frames = staged_frames.index_own_file(FileSystem(), str(path), size)
            header_pages = {page for f in frames
                            for page in range((f.body_position - HEADER_BYTES) // PAGE,
                                              (f.body_position - 1) // PAGE + 1)}  # fmt: skip
            dropped = 0
            for position, length in ranges:
                assert position % PAGE == 0 and length % PAGE == 0 and length > 0
                assert position + length <= size - limits.DROP_BEHIND_KEEP_BYTES
                assert not header_pages & set(range(position // PAGE,
                                                    (position + length) // PAGE))  # fmt: skip
                dropped += length
            assert dropped > size // 2, (dropped, size)
            assert len({p for p, _ in ranges}) == len(ranges)  # each range advised once
        assert not [name for name, _, _ in advised if ".~p" not in name]  # the shared file: none
        assert commit_writes(database, 1, ["a"]) == {"status": "committed", "rows": ROWS}
        assert _partitions(database) == _expected()
    finally:
        database.close()


def test_without_drop_behind_nothing_is_dropped_and_every_file_is_read_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.setattr(page_cache, "ENABLED", False)  # TOPICBASE_DROP_SYNCED_PAGES=0
    advised: list[int] = []
    monkeypatch.setattr(FileSystem, "drop_cache", lambda self, fd, p, n: advised.append(n))
    read = _count_reads(monkeypatch)
    database = _open(tmp_path)
    try:
        _stage(database)
        assert advised == []
        assert commit_writes(database, 1, ["a"]) == {"status": "committed", "rows": ROWS}
        assert len([p for p in read if OWN_FILE.match(os.path.basename(p))]) == 2
        assert _partitions(database) == _expected()
    finally:
        database.close()


def _count_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths the commit's check reads back (``staged_refs.file_crc``)."""
    read: list[str] = []
    original = staged_refs.file_crc

    def counted(fs: FileSystem, path: str, size: int) -> int:
        read.append(path)
        return original(fs, path, size)

    monkeypatch.setattr(staged_refs, "file_crc", counted)
    return read


def test_the_commit_does_not_read_back_own_files_this_process_staged_and_dropped(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    # Before round 20 the commit read every staged file back (from the disk, once dropped).
    read = _count_reads(monkeypatch)
    database = _open(tmp_path)
    try:
        _stage(database)
        assert commit_writes(database, 1, ["a"]) == {"status": "committed", "rows": ROWS}
        assert read and not [p for p in read if OWN_FILE.match(os.path.basename(p))], read
        assert _partitions(database) == _expected()
    finally:
        database.close()


def test_an_own_file_written_since_its_staging_is_read_back_and_refused(
        tmp_path: Path) -> None:  # fmt: skip
    database = _open(tmp_path)
    try:
        _stage(database)
        victim = _own_files(tmp_path / "data")[0]
        position = _a_dropped_body_byte(victim)
        value = _damage(victim, position, keep_time=False)
        with pytest.raises(CorruptSegmentError, match="frames file is damaged") as raised:
            commit_writes(database, 1, ["a"])
        assert raised.value.sqlstate == "XX001"
        assert _partitions(database) == {0: [], 1: []}
        _damage(victim, position, keep_time=False)  # repaired (a later write again)
        with open(victim, "rb") as handle:
            handle.seek(position)
            assert handle.read(1)[0] == value
        assert commit_writes(database, 1, ["a"]) == {"status": "committed", "rows": ROWS}
        assert _partitions(database) == _expected()
    finally:
        database.close()


def test_after_a_restart_a_damaged_own_file_is_refused_whatever_its_time(
        tmp_path: Path) -> None:  # fmt: skip
    # The database reopened (a new BulkWrites: it vouches for nothing): the damage keeps
    # the file's size and time, so only a read-back finds it.
    database = _open(tmp_path)
    try:
        _stage(database)
    finally:
        database.close()
    victim = _own_files(tmp_path / "data")[1]
    position = _a_dropped_body_byte(victim)
    _damage(victim, position, keep_time=True)
    database = Database.open(str(tmp_path / "data"), retention_interval_s=None)
    try:
        with pytest.raises(CorruptSegmentError, match="frames file is damaged"):
            commit_writes(database, 1, ["a"])
        assert _partitions(database) == {0: [], 1: []}
        _damage(victim, position, keep_time=True)  # repaired
        assert commit_writes(database, 1, ["a"]) == {"status": "committed", "rows": ROWS}
        assert _partitions(database) == _expected()
    finally:
        database.close()


# The child (bulk_commit_child.py): 8 COPYs of 250 rows of ~208 bytes over 4 partitions,
# partitions 0 and 1 in own files from their first frame (one frame of <= 64 messages,
# ~13 KiB), dropped behind from 0 bytes in steps of a page, writeback every page.
CHILD = {"BULK_STAGE_FORMAT": "frames", "BULK_ADOPT": "1024,2,0", "BULK_FRAME_MESSAGES": "64",
         "BULK_DROP_BEHIND": f"0,{PAGE},{PAGE}"}  # fmt: skip


def _run(data: Path, action: str, failpoints: str = "") -> int:
    done = _SERVER.run([str(data), action], environment=CHILD, failpoints=failpoints)
    assert done.returncode in (0, CRASHED), done.stderr
    return done.returncode


@pytest.mark.parametrize("damaged", [False, True])
def test_killed_between_its_check_and_its_commit_point_the_restart_reads_every_file_back(
        tmp_path: Path, damaged: bool) -> None:  # fmt: skip
    """The child stages (its own files' pages dropped) and is killed in its commit after
    the check (vouched for, not read) and before the commit point (``bulk.before_commit``):
    reopened, the writes are staged again and the commit reads every file back: one torn
    since (a body byte flipped, its size and time kept) is refused and nothing is
    published; untouched, all of it commits once."""
    data = tmp_path / "data"
    assert _run(data, "stage-and-commit", "bulk.before_commit=crash") == CRASHED
    database = Database.open(str(data), retention_interval_s=None)
    database.close()  # recovery moved the writes back to staged
    own = _own_files(data)
    assert len(own) == 16, own
    if damaged:
        frames = staged_frames.index_own_file(FileSystem(), str(own[3]), own[3].stat().st_size)
        _damage(own[3], frames[0].body_position + 5000, keep_time=True)
    database = Database.open(str(data), retention_interval_s=None)
    try:
        session = database.connect()
        try:
            bulk = bulk_write.for_database(database)
            if damaged:
                with pytest.raises(CorruptSegmentError, match="frames file is damaged"):
                    bulk.commit(session, child.SINK, child.BATCH, child.write_ids())
                assert sorted(w.write_id for w in bulk.list(session)) == sorted(
                    child.write_ids())  # fmt: skip
            else:
                outcome = bulk.commit(session, child.SINK, child.BATCH, child.write_ids())
                assert outcome["status"] == "committed"
        finally:
            session.close()
        topic = database.topic_log(database.catalog.entry("t").topic_id)
        counts = {p: topic.partition(p).end_offset for p in topic.partition_ids()}
        expected = child.expected()
        assert counts == ({p: 0 for p in expected} if damaged
                          else {p: len(rows) for p, rows in expected.items()})  # fmt: skip
    finally:
        database.close()


@pytest.mark.parametrize("failpoint", [
    "commit.after_commit_point=crash@2", "adopt.before_patch=crash", "adopt.before_sync=crash",
    "adopt.before_rename=crash@3", "adopt.before_dir_sync=crash@5", "adopt.before_visible=crash",
    "adopt.after_visible=crash", "commit.checkpoint_before_delete=crash"])  # fmt: skip
def test_killed_after_its_commit_point_the_restart_publishes_all_of_it_once(
        tmp_path: Path, failpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """A guard (it passes without drop-behind too; review R1 F6 of round 20): the child
    stages with its own files' pages dropped and commits with the vouch, and is killed
    past the commit point (the publish, each step of adopting an own file, the
    checkpoint): reopened, every message is published once and in order, a replayed
    commit is a duplicate, nothing stays staged, the own files are adopted whole."""
    from tests.engine import test_bulk_adopt_crash as adopt

    monkeypatch.setattr(limits, "ADOPT_BYTES_MIN", 1024)  # the child's adoption, in recovery
    monkeypatch.setattr(limits, "ADOPT_FILES_MAX", 2)
    data = tmp_path / "data"
    environment = {**CHILD, "BULK_PUBLISH_THREADS": "1"}
    done = _SERVER.run([str(data), "stage-and-commit"], environment=environment,
                       failpoints=failpoint)  # fmt: skip
    assert done.returncode == CRASHED, done.stderr
    assert adopt._recover_and_retry(data) == "all"


def _staged(database: Database) -> list[str]:
    session = database.connect()
    try:
        return sorted(w.write_id for w in bulk_write.for_database(database).list(session))
    finally:
        session.close()


def _own_reads(read: list[str]) -> list[str]:
    return [p for p in read if OWN_FILE.match(os.path.basename(p))]


def test_an_own_file_damaged_with_its_time_restored_is_refused(tmp_path: Path) -> None:
    # Review R1-F1 of round 20: os.utime (touch -d, cp -p, a backup's restore) puts the
    # modification time back; the change time it cannot, so the vouch no longer holds.
    database = _open(tmp_path)
    try:
        _stage(database)
        victim = _own_files(tmp_path / "data")[0]
        position = _a_dropped_body_byte(victim)
        _damage(victim, position, keep_time=True)
        with pytest.raises(CorruptSegmentError, match="frames file is damaged") as raised:
            commit_writes(database, 1, ["a"])
        assert raised.value.sqlstate == "XX001"
        assert _partitions(database) == {0: [], 1: []}
        assert _staged(database) == ["a"]
        _damage(victim, position, keep_time=True)  # repaired
        assert commit_writes(database, 1, ["a"]) == {"status": "committed", "rows": ROWS}
        assert _partitions(database) == _expected()
    finally:
        database.close()


def test_a_commit_failing_after_its_check_leaves_its_retry_to_read_every_file_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    # Review R1-F2 of round 20: a vouch is used once. The first commit's fdatasync of an
    # own file fails (EIO, reported once: a retry's fdatasync would not see it again).
    real = os.fdatasync
    failed: list[str] = []

    def fdatasync(fd: int) -> None:
        if OWN_FILE.match(os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))) and not failed:
            failed.append(fd)
            raise OSError(errno.EIO, "Input/output error (injected)")
        real(fd)

    read = _count_reads(monkeypatch)
    database = _open(tmp_path)
    try:
        _stage(database)
        monkeypatch.setattr(os, "fdatasync", fdatasync)
        with pytest.raises(OSError, match="injected"):
            commit_writes(database, 1, ["a"])
        assert failed and _own_reads(read) == []  # vouched for by the first commit
        assert _partitions(database) == {0: [], 1: []}
        assert _staged(database) == ["a"]
        assert commit_writes(database, 1, ["a"]) == {"status": "committed", "rows": ROWS}
        assert len(_own_reads(read)) == 2, read
        assert _partitions(database) == _expected()
    finally:
        database.close()


def test_a_writeback_error_before_a_drop_fails_the_copy_and_stages_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    # Review R1-F3 of round 20: the error is reported on the writer's fd before its pages
    # go (an evicted inode would forget it before the commit's fdatasync).
    waited: list[int] = []
    original = FileSystem.wait_writeback

    def wait_writeback(self: FileSystem, fd: int, position: int, size: int) -> bool:
        waited.append(size)
        raise StorageIOError("wait for the writeback of x: [Errno 5] Input/output error")

    monkeypatch.setattr(FileSystem, "wait_writeback", wait_writeback)
    database = _open(tmp_path)
    try:
        with pytest.raises(StorageIOError):
            _stage(database)
        assert waited
        assert _own_files(tmp_path / "data") == []
        assert not list((tmp_path / "data").rglob("*.part"))
        assert len(bulk_write.for_database(database)._staged_here) == 0
        assert _partitions(database) == {0: [], 1: []}
        monkeypatch.setattr(FileSystem, "wait_writeback", original)
        _stage(database, "b")
        assert commit_writes(database, 1, ["b"]) == {"status": "committed", "rows": ROWS}
        assert _partitions(database) == _expected()
    finally:
        database.close()


@pytest.mark.parametrize("missing", ["start_writeback", "wait_writeback", "posix_fadvise"])
def test_own_files_not_dropped_after_a_checked_wait_are_read_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, missing: str) -> None:  # fmt: skip
    # A writeback that could not be started (its error suppressed), a platform without
    # sync_file_range's wait or without posix_fadvise (nothing dropped): not vouched for.
    if missing == "start_writeback":
        def failing(self: FileSystem, fd: int, position: int, size: int) -> None:
            raise StorageIOError("start writeback of x: [Errno 5] Input/output error")
        monkeypatch.setattr(FileSystem, "start_writeback", failing)
    elif missing == "wait_writeback":
        monkeypatch.setattr(FileSystem, "wait_writeback", lambda self, fd, p, n: False)
    else:
        monkeypatch.delattr(os, "posix_fadvise")
    read = _count_reads(monkeypatch)
    database = _open(tmp_path)
    try:
        _stage(database)
        assert len(bulk_write.for_database(database)._staged_here) == 0
        assert commit_writes(database, 1, ["a"]) == {"status": "committed", "rows": ROWS}
        assert len(_own_reads(read)) == 2, read
        assert _partitions(database) == _expected()
    finally:
        database.close()


def test_remember_holds_the_size_the_crc_covers(tmp_path: Path) -> None:
    # Review R1-F4 of round 20: the size recorded is the writer's, not what stat finds.
    database = _open(tmp_path)
    try:
        _stage(database)
        own = _own_files(tmp_path / "data")[0]
        here = staged_refs.StagedHere()
        with pytest.raises(AssertionError):
            here.remember([(str(own), own.stat().st_size - 1)])
        here.remember([(str(own), own.stat().st_size)])
        assert len(here) == 1
    finally:
        database.close()


@pytest.mark.parametrize("how", ["abort", "collect"])
def test_an_aborted_or_collected_write_is_forgotten(tmp_path: Path, how: str) -> None:
    # Review R1-F5 of round 20: no entry outlives its write's files.
    database = _open(tmp_path)
    try:
        _stage(database)
        bulk = bulk_write.for_database(database)
        assert len(bulk._staged_here) == 2
        if how == "abort":
            session = database.connect()
            assert bulk.abort(session, ["a"]) == 1
            session.close()
        else:
            bulk.abandon_after_s = 0
            assert bulk.collect() == ["a"]
        assert len(bulk._staged_here) == 0
    finally:
        database.close()
