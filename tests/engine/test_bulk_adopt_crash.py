"""Staged frames adopted as segments (``storage.staged_frames`` own files,
``PartitionLog._adopt_locked``), killed at each step of the adoption.

``bulk_commit_child.py`` stages 4 writes of 2 COPYs each over 4 partitions with
``BULK_ADOPT=1024,2``: each COPY stages partitions 0 and 1 in files of their own (~13 KiB,
adopted: over 1024 bytes; 4 frames of at most 16 messages) and partitions 2 and 3 in
its shared file (copied). So the commit
adopts 8 files into each of partitions 0 and 1 and copies 8 frames into each of 2 and 3.
Killed at each adoption step (the first adoption, or a later one: ``@n``), then opened
here (recovery runs, adopting again what was not renamed, ``limits`` as the child's):
the batch is published whole and exactly once, each partition's messages in their staged
order at offsets 0.. without a gap, the storage checker accepts the store, and a retry of
the commit is a duplicate. Damage recovery must refuse (a patched file's body changed,
an adopted segment lost) stops it with ``CorruptSegmentError``.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

import pytest

from engine import bulk_write
from engine.database import Database
from storage import failpoints, limits
from storage.check import check_store
from storage.errors import CorruptSegmentError, PartitionFencedError
from storage.staged_frames import OWN_FILE
from tests.fork_server import ModuleForkServer

HERE = Path(__file__).resolve().parent
CHILD = HERE / "bulk_commit_child.py"
sys.path.insert(0, str(HERE))
import bulk_commit_child as child  # noqa: E402

CRASHED = 137
FRAME_TARGET = limits.FRAME_TARGET_MESSAGES
# adopt own files over 1 KiB; 2 partitions of each COPY in files of their own from their
# first frame (switch 0); frames of 16 messages: each own file holds 4 (a patch can be cut
# halfway); the shares published one at a time in partition order (a failpoint's ``@n``
# then counts the same hits in every run: with the shares at once, partitions 0 and 1
# adopt side by side)
ENVIRONMENT = {"BULK_STAGE_FORMAT": "frames", "BULK_ADOPT": "1024,2,0",
               "BULK_FRAME_MESSAGES": "16", "BULK_PUBLISH_THREADS": "1"}  # fmt: skip
# ... or from their third frame: each partition's first two frames (~4.6 KiB each, under
# the switch: a frame that large would go to the own file at once) in the shared file
# (copied)
SWITCHED = {**ENVIRONMENT, "BULK_ADOPT": "1024,2,6000"}
_SERVER = ModuleForkServer(CHILD)
_fork_server = _SERVER.fixture()


@pytest.fixture(autouse=True)
def _adopt_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process (recovery, the retry) adopts as the child does."""
    monkeypatch.setattr(limits, "ADOPT_BYTES_MIN", 1024)
    monkeypatch.setattr(limits, "ADOPT_FILES_MAX", 2)


def _run(data: Path, action: str, failpoints: str = "",
         environment: dict[str, str] = ENVIRONMENT) -> int:  # fmt: skip
    done = _SERVER.run([str(data), action], environment=environment, failpoints=failpoints)
    assert done.returncode in (0, CRASHED), done.stderr
    return done.returncode


def _messages(database: Database) -> dict[int, list[tuple[int, bytes]]]:
    """Each partition's (offset, message) in offset order, read through the partitions."""
    topic = database.topic_log(database.catalog.entry("t").topic_id)
    found: dict[int, list[tuple[int, bytes]]] = {}
    for partition in topic.partition_ids():
        log = topic.partition(partition)
        rows: list[tuple[int, bytes]] = []
        offset = log.start_offset
        while offset < log.end_offset:
            read = log.read(offset, max_messages=100_000)
            for batch in read.batches:
                rows += zip(batch.column("offset").to_pylist(),
                            batch.column("data").to_pylist(), strict=True)  # fmt: skip
            offset = read.next_offset
        found[partition] = rows
    return found


def _in_order(database: Database) -> str:
    """"all" or "nothing", checked: every partition holds its messages once, in the order
    they were staged (the writes' files in name order: ascending), at offsets 0.. ."""
    found = _messages(database)
    everything = child.expected()
    counts = {p: len(rows) for p, rows in found.items()}
    if all(not rows for rows in found.values()):
        return "nothing"
    for partition, rows in found.items():
        assert [o for o, _ in rows] == list(range(len(rows))), (partition, counts)
        assert [m for _, m in rows] == everything[partition], (partition, counts)
    return "all"


def _check_store(data: Path) -> None:
    report = check_store(str(data / "store"))
    assert report.ok, report.lines()


def _adopted_segments(database: Database, partition: int) -> int:
    topic = database.topic_log(database.catalog.entry("t").topic_id)
    return len([s for s in topic.partition(partition).segments if s.size_bytes])


def _recover_and_retry(data: Path) -> str:
    database = Database.open(str(data), retention_interval_s=None)
    try:
        bulk = bulk_write.for_database(database)
        outcome = _in_order(database)
        session = database.connect()
        try:
            retry = bulk.commit(session, child.SINK, child.BATCH, child.write_ids())
        finally:
            session.close()
        assert retry["status"] == ("committed" if outcome == "nothing" else "duplicate")
        database.committer.checkpoint()
        assert _in_order(database) == "all"
        assert os.listdir(bulk.root) == [] and os.listdir(bulk.commits_root) == []
        assert bulk.staged_bytes == 0
        # partitions 0 and 1: whole own files adopted as segments (8 files, one per COPY)
        assert _adopted_segments(database, 0) >= 8 and _adopted_segments(database, 1) >= 8
        assert _adopted_segments(database, 2) == 1 and _adopted_segments(database, 3) == 1
    finally:
        database.close()
    _check_store(data)
    return outcome


@pytest.mark.parametrize("environment", [ENVIRONMENT, SWITCHED])
def test_a_clean_commit_adopts_whole_own_files_and_copies_the_rest(
        tmp_path: Path, environment: dict[str, str]) -> None:  # fmt: skip
    data = tmp_path / "data"
    assert _run(data, "stage", environment=environment) == 0
    staged = [n for w in os.listdir(data / bulk_write.WRITES_DIRECTORY)
              for n in os.listdir(data / bulk_write.WRITES_DIRECTORY / w)]  # fmt: skip
    own = [n for n in staged if OWN_FILE.match(n)]
    assert len(own) == 16 and {n.split(".~p")[1][0] for n in own} == {"0", "1"}, staged
    assert _run(data, "commit", environment=environment) == 0
    database = Database.open(str(data), retention_interval_s=None)
    try:
        assert _in_order(database) == "all"
        topic = database.topic_log(database.catalog.entry("t").topic_id)
        for partition in (0, 1):
            segments = [s for s in topic.partition(partition).segments if s.size_bytes]
            # one per COPY, each a whole adopted file (the first COPY's copied frame
            # before them, switched: a later COPY's goes into the adopted one before it)
            assert len(segments) == 8 + (environment is SWITCHED)
            assert [s.base_offset for s in segments] == sorted(s.base_offset for s in segments)
    finally:
        database.close()
    _check_store(data)
    assert _recover_and_retry(data) == "all"


@pytest.mark.parametrize("failpoint", [
    "adopt.before_patch=crash",
    "adopt.before_patch=crash@5",
    "adopt.mid_patch=crash",
    "adopt.mid_patch=crash@6",
    "adopt.before_sync=crash",
    "adopt.before_sync=crash@2",
    "adopt.before_rename=crash",
    "adopt.before_rename=crash@4",
    "adopt.before_dir_sync=crash",
    "adopt.before_dir_sync=crash@7",
    "adopt.before_visible=crash",
    "adopt.before_visible=crash@3",
    "adopt.after_visible=crash",
    "publish.mid_share=crash@3",
    "commit.checkpoint_before_delete=crash",
    "commit.checkpoint_before_release=crash",
])  # fmt: skip
def test_an_adoption_killed_at_each_step_publishes_the_batch_once_in_order(
        tmp_path: Path, failpoint: str) -> None:  # fmt: skip
    data = tmp_path / "data"
    assert _run(data, "stage") == 0
    assert _run(data, "commit", failpoint) == CRASHED
    assert _recover_and_retry(data) == "all"


# The default publish threads: partitions 0 and 1 adopt side by side (round 16: a framed
# commit publishes every share at once), so a failpoint's ``@n`` falls on either one (the
# hits of both together reach ``n`` in every run; which partition's is the threads' choice;
# review R2, round 16).
SIDE_BY_SIDE = {k: v for k, v in ENVIRONMENT.items() if k != "BULK_PUBLISH_THREADS"}


@pytest.mark.parametrize("failpoint", ["adopt.mid_patch=crash@3", "adopt.before_rename=crash@3",
                                       "adopt.before_visible=crash@5",
                                       "commit.mid_publish=crash"])  # fmt: skip
def test_an_adoption_killed_while_partitions_adopt_side_by_side_publishes_once(
        tmp_path: Path, failpoint: str) -> None:  # fmt: skip
    data = tmp_path / "data"
    assert _run(data, "stage", environment=SIDE_BY_SIDE) == 0
    assert _run(data, "commit", failpoint, environment=SIDE_BY_SIDE) == CRASHED
    assert _recover_and_retry(data) == "all"


@pytest.mark.parametrize("failpoint", ["adopt.mid_patch=crash@2", "adopt.before_rename=crash@3",
                                       "adopt.before_dir_sync=crash@2",
                                       "publish.mid_share=crash@2"])
def test_a_share_copied_then_adopted_killed_between_is_finished_once_in_order(
        tmp_path: Path, failpoint: str) -> None:  # fmt: skip
    """Each partition's first frame of a COPY in the shared file (copied), the rest in
    its own file (adopted): killed inside the second COPY's adoption, or between a
    copied frame and the adoption after it."""
    data = tmp_path / "data"
    assert _run(data, "stage", environment=SWITCHED) == 0
    assert _run(data, "commit", failpoint, environment=SWITCHED) == CRASHED
    assert _recover_and_retry(data) == "all"


@pytest.mark.parametrize("failpoint", ["adopt.mid_patch=crash", "adopt.before_rename=crash",
                                       "adopt.before_dir_sync=crash"])
def test_recovery_killed_while_it_adopts_again_finishes_at_the_next_open(
        tmp_path: Path, failpoint: str) -> None:  # fmt: skip
    """The commit killed inside an adoption, then recovery killed inside its own
    (re-patching the file from the log's end): the third open finishes, once."""
    data = tmp_path / "data"
    assert _run(data, "stage") == 0
    assert _run(data, "commit", "adopt.before_rename=crash@2") == CRASHED
    assert _run(data, "open", failpoint) == CRASHED
    assert _recover_and_retry(data) == "all"


@pytest.mark.parametrize("failpoint", ["adopt.before_patch", "adopt.mid_patch",
                                       "adopt.before_sync", "adopt.before_rename",
                                       "adopt.before_dir_sync",
                                       "adopt.before_visible", "fs.before_sync"])
@pytest.mark.parametrize("action", ["error", "nomem"])  # an I/O error, a MemoryError
def test_an_adoption_failing_with_an_io_error_fences_and_the_reopen_finishes_it(
        tmp_path: Path, failpoint: str, action: str) -> None:  # fmt: skip
    """An I/O error (or, round 24, a ``MemoryError``: ``nomem``) at each step of the second
    adoption of the commit (``fs.before_sync``: the patched file's fdatasync): the
    partition is fenced (before the rename its
    unpublished tail is cut, after it nothing is: the adopted file is synced), the
    commit stands, and the reopen publishes the rest once, in order."""
    data = tmp_path / "data"
    assert _run(data, "stage") == 0
    database = Database.open(str(data), retention_interval_s=None)
    try:
        limits.FRAME_TARGET_MESSAGES = 16  # as the child (restored below)
        failpoints.activate(f"{failpoint}={action}@2")
        session = database.connect()
        try:  # past its commit point: the publish's error is the committer's
            outcome = bulk_write.for_database(database).commit(
                session, child.SINK, child.BATCH, child.write_ids())
        except MemoryError:  # not an I/O error: reported (the commit stands: a replay of
            outcome = {"status": "committed"}  # the batch is a duplicate, see the reopen)
        finally:
            session.close()
        assert outcome["status"] == "committed"
        topic = database.topic_log(database.catalog.entry("t").topic_id)
        with pytest.raises(PartitionFencedError) as caught:
            for partition in topic.partition_ids():
                topic.partition(partition).check_writable()
        assert f"failpoint {failpoint}" in str(caught.value)
    finally:
        failpoints.deactivate()
        limits.FRAME_TARGET_MESSAGES = FRAME_TARGET
        with contextlib.suppress(PartitionFencedError):  # its last checkpoint
            database.close()
    assert _recover_and_retry(data) == "all"


@pytest.mark.parametrize("failpoint", ["adopt.before_rename=crash@2",
                                       "adopt.before_dir_sync=crash@3", "adopt.after_visible"])
def test_own_files_published_to_a_split_partition_are_adopted_by_its_child_once(
        tmp_path: Path, failpoint: str) -> None:  # fmt: skip
    """Partition 0 splits after the commit routed its share there: its own files go to
    the child keyless messages go to, adopted there (``_publish_staged_to_lineage``);
    killed inside an adoption, recovery finishes it there once; a retry is a duplicate."""
    data = tmp_path / "data"
    environment = {**ENVIRONMENT, "BULK_SPLIT_BEFORE_PUBLISH": "1"}
    failpoint = failpoint if "=" in failpoint else f"{failpoint}=crash"
    assert _run(data, "stage", environment=environment) == 0
    assert _run(data, "commit", failpoint, environment=environment) == CRASHED
    database = Database.open(str(data), retention_interval_s=None)
    try:
        topic = database.topic_log(database.catalog.entry("t").topic_id)
        assert not topic.partition_info(0).active and topic.partition(0).end_offset == 0
        found = _messages(database)
        everything = child.expected()
        assert sorted(m for rows in found.values() for _, m in rows) == sorted(
            m for ms in everything.values() for m in ms)
        for partition, rows in found.items():  # each partition's offsets 0.. without a gap
            assert [o for o, _ in rows] == list(range(len(rows))), partition
        children = [p for p in topic.partition_ids() if p >= child.PARTITIONS]
        adopted = [len([s for s in topic.partition(p).segments if s.size_bytes])
                   for p in children]  # fmt: skip
        assert max(adopted) >= 8, adopted  # the 8 own files of partition 0, in one child
        session = database.connect()
        try:
            outcome = bulk_write.for_database(database).commit(
                session, child.SINK, child.BATCH, child.write_ids())
        finally:
            session.close()
        assert outcome["status"] == "duplicate"
        assert _messages(database) == found
    finally:
        database.close()
    _check_store(data)


def _own_files(data: Path) -> list[Path]:
    return sorted(p for p in (data / bulk_write.COMMITS_DIRECTORY).rglob("*.frames")
                  if OWN_FILE.match(p.name))  # fmt: skip


def test_a_patched_own_file_whose_body_changed_stops_recovery(tmp_path: Path) -> None:
    """Killed once the first partition's files are patched and synced (before the first
    rename): a body byte of one of them changed meanwhile is found (each frame checked
    as a segment's) instead of being published."""
    data = tmp_path / "data"
    assert _run(data, "stage") == 0
    assert _run(data, "commit", "adopt.before_rename=crash") == CRASHED
    patched = _patched_files(data)
    raw = bytearray(patched[0].read_bytes())
    raw[48 + 200] ^= 0xFF
    patched[0].write_bytes(bytes(raw))
    with pytest.raises(CorruptSegmentError):
        Database.open(str(data), retention_interval_s=None)


def test_a_torn_own_file_of_a_committed_batch_stops_recovery(tmp_path: Path) -> None:
    data = tmp_path / "data"
    assert _run(data, "stage") == 0
    assert _run(data, "commit", "adopt.before_patch=crash") == CRASHED
    victim = _own_files(data)[-1]
    with open(victim, "r+b") as handle:
        handle.truncate(victim.stat().st_size - 100)
    with pytest.raises(CorruptSegmentError):
        Database.open(str(data), retention_interval_s=None)


def test_an_adopted_segment_lost_from_its_partition_stops_recovery(tmp_path: Path) -> None:
    """The file renamed into the partition (gone from the commit directory), then lost
    there (as if the rename had reached no disk while the commit directory's did):
    recovery finds the partition lacks the committed rows and refuses to go on."""
    data = tmp_path / "data"
    assert _run(data, "stage") == 0
    assert _run(data, "commit", "adopt.before_dir_sync=crash") == CRASHED
    logs = [p for p in (data / "store").rglob("*.log") if p.stat().st_size]
    assert len(logs) == 1, logs  # the adopted one (every other segment is empty)
    os.remove(logs[0])
    with pytest.raises(CorruptSegmentError):
        Database.open(str(data), retention_interval_s=None)


def test_a_torn_own_file_before_the_commit_is_refused_and_stays_staged(tmp_path: Path) -> None:
    data = tmp_path / "data"
    assert _run(data, "stage") == 0
    victim = sorted(p for p in (data / bulk_write.WRITES_DIRECTORY).rglob("*.frames")
                    if OWN_FILE.match(p.name))[0]  # fmt: skip
    with open(victim, "r+b") as handle:
        handle.truncate(victim.stat().st_size - 8)
    database = Database.open(str(data), retention_interval_s=None)
    try:
        session = database.connect()
        try:
            with pytest.raises(CorruptSegmentError):
                bulk_write.for_database(database).commit(session, child.SINK, child.BATCH,
                                                         child.write_ids())  # fmt: skip
        finally:
            session.close()
        assert _in_order(database) == "nothing"
        assert sorted(os.listdir(data / bulk_write.WRITES_DIRECTORY)) == sorted(
            child.write_ids())
    finally:
        database.close()


@pytest.mark.parametrize("cut", [24, 16, 32])
def test_a_header_torn_by_a_power_cut_mid_patch_is_recovered(tmp_path: Path, cut: int) -> None:
    """A power cut while the headers are patched in place (before their fdatasync) can
    leave a header whose bytes before ``cut`` are patched and whose rest is staged (a
    header across a 4 KiB page boundary: the kernel wrote back one page; review R2-A2 of
    round 14). Count and body size are the same in both versions and the file's staged
    CRC-32C is in its name: recovery rebuilds the staged headers, checks the file and
    publishes the batch whole (before: CorruptSegmentError, the database did not open)."""
    data = tmp_path / "data"
    assert _run(data, "stage") == 0
    staged = {p.name: p.read_bytes() for p in (data / bulk_write.WRITES_DIRECTORY).rglob("*.frames")
              if OWN_FILE.match(p.name)}  # fmt: skip
    assert _run(data, "commit", "adopt.before_rename=crash") == CRASHED
    for path in _patched_files(data):  # each of them torn so
        raw = bytearray(path.read_bytes())
        before = staged[path.name]
        second = 48 + int.from_bytes(raw[28:32], "little")  # the second frame's header
        raw[second + cut : second + 48] = before[second + cut : second + 48]
        path.write_bytes(bytes(raw))
    assert _recover_and_retry(data) == "all"


def _patched_files(data: Path) -> list[Path]:
    """The own files patched (killed before the first rename): all 8 of the partition
    published first (0), its files adopted together (round 15: every file patched and
    synced before the first rename), none of another."""
    patched = [p for p in _own_files(data) if p.read_bytes()[:4] == b"TBb1"]
    assert len(patched) == 8 and all(".~p0-" in p.name for p in patched), patched
    return patched


def test_time_lookups_and_every_offset_over_adopted_segments(tmp_path: Path) -> None:
    """Adopted segments answer time lookups and a read of each of their offsets (their
    indexes are built from the patched headers)."""
    data = tmp_path / "data"
    assert _run(data, "stage") == 0
    assert _run(data, "commit") == 0
    database = Database.open(str(data), retention_interval_s=None)
    try:
        topic = database.topic_log(database.catalog.entry("t").topic_id)
        for partition in (0, 1):
            log = topic.partition(partition)
            segments = [s for s in log.segments if s.size_bytes]
            assert len(segments) >= 8
            for s in segments:
                assert log.offset_for_time(s.first_written_at_us) <= s.base_offset, s.base_offset
                assert log.offset_for_time(s.last_written_at_us + 1) >= s.next_offset
                # the index: a lookup of every offset of the segment lands in it
                for offset in range(s.base_offset, s.next_offset):
                    read = log.read(offset, max_messages=1)
                    assert read.batches[0].column("offset")[0].as_py() == offset
    finally:
        database.close()


@pytest.mark.parametrize("failpoint", ["adopt.before_dir_sync=crash",
                                       "adopt.before_dir_sync=crash@7", "adopt.mid_patch=crash@3",
                                       "adopt.before_visible=crash@5", "adopt.before_sync=crash",
                                       "adopt.before_rename=crash@4"])  # fmt: skip
def test_checker_on_a_crashed_store_before_recovery(tmp_path: Path, failpoint: str) -> None:
    """The offline checker on a store killed mid-adoption, before any recovery: it finds
    no damage (a kill between the rename and the indexes' write leaves an adopted segment
    without its indexes, which the next open rebuilds: said so, review R2-A4), and after
    the next open none at all, with the write whole."""
    data = tmp_path / "data"
    assert _run(data, "stage") == 0
    assert _run(data, "commit", failpoint) == CRASHED
    report = check_store(str(data / "store"))
    assert report.ok, report.lines()
    assert all(problem.recovered_at_open for problem in report.problems), report.lines()
    assert _recover_and_retry(data) == "all"
    after = check_store(str(data / "store"))
    assert after.ok, after.lines()


@pytest.mark.parametrize("failpoint", ["bulk.mid_move=crash@2", "bulk.before_commit=crash",
                                       "recovery.after_republish=crash"])
def test_other_bulk_points_with_adoption(tmp_path: Path, failpoint: str) -> None:
    """The bulk commit's own crash points with own files staged: before the commit point
    nothing is published and the retry commits all; recovery itself killed after it
    published again: the next open finishes it."""
    data = tmp_path / "data"
    assert _run(data, "stage") == 0
    code = _run(data, "commit", failpoint if not failpoint.startswith("recovery")
                else "adopt.before_rename=crash@3")
    assert code == CRASHED
    if failpoint.startswith("recovery"):
        assert _run(data, "open", failpoint) in (0, CRASHED)
    expected = "nothing" if failpoint.startswith("bulk.") else "all"  # before the commit point
    assert _recover_and_retry(data) == expected  # and "all" after its retry (checked inside)
