"""A bulk commit by reference (``engine.staged_refs``) killed at each of its steps.

``bulk_commit_child.py`` stages writes (each row names its partition) and one table row,
then commits them as ``(sink, 1)`` and checkpoints, in a child process crashed at a
failpoint (``os._exit(137)``, like SIGKILL: no cleanup, no flush) or killed with SIGKILL
at a random moment. Then the data directory is opened here (recovery runs) and checked:
the topic holds all of the batch or none of it, and the table row with it; the staged
writes are back (none published) or gone (published). A retry of the commit with the same
write ids (as a restarted driver does) then publishes the batch (``committed``) or finds
it recorded (``duplicate``), and the topic holds every message exactly once (in its
partition), and nothing is left in ``bulk_writes``/``bulk_commits``.

Crash points, in the protocol's order:
``bulk.mid_move`` (one write moved to the commit directory), ``bulk.before_commit``
(all moved, files and directories synced, no transaction yet), ``commit.after_commit_point``
(record committed, nothing published), ``commit.mid_publish`` (one partition published),
``publish.mid_share`` (some frames of a share cut into frames, the last maybe torn),
``commit.checkpoint_before_delete`` (partitions synced, record still there),
``commit.checkpoint_before_release`` (record deleted, files not yet),
and recovery itself killed after its first republish
(``recovery.after_republish``). A damaged file of a committed, unpublished batch stops
recovery (``CorruptSegmentError``) instead of publishing other rows.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine import bulk_publish, bulk_write
from engine.check import check_database
from engine.database import Database
from engine.identity import LOCAL_SUPERUSER_NAME
from storage.column_codec import unpacked_bytes
from storage.errors import CorruptSegmentError
from tests.fork_server import ModuleForkServer

HERE = Path(__file__).resolve().parent
CHILD = HERE / "bulk_commit_child.py"
sys.path.insert(0, str(HERE))
import bulk_commit_child as child  # noqa: E402

CRASHED = 137


# how the child stages its topic rows (``bulk_commit_child``): "mixed" is each write's
# first half as frames, its second as Arrow (each partition's share: frames, then rows)
FORMATS = ("frames", "arrows", "mixed")


# Staged data directories by (stage format, batch limit, frame target): the "stage" step
# has no failpoint, so each test copies its result instead of running the child again
# (about a second each); the copy holds no path of its own (checked: no file names it).
_STAGED_TEMPLATES: dict[tuple[str, int | None, int | None], Path] = {}
_TEMPLATE_ROOT: list[Path] = []


@pytest.fixture(scope="module", autouse=True)
def _stage_templates(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    _STAGED_TEMPLATES.clear()
    _TEMPLATE_ROOT[:] = [tmp_path_factory.mktemp("staged")]
    yield
    _STAGED_TEMPLATES.clear()
    _TEMPLATE_ROOT.clear()


def _run(data: Path, action: str, failpoints: str = "", timeout: float = 300,
         frame_messages: int | None = None, stage_format: str = "frames",
         batch_messages: int | None = None) -> int:  # fmt: skip
    # (``_run`` imported by another test module has neither fixture: it starts children
    # cold and stages in place, as before)
    if action == "stage" and not failpoints and _TEMPLATE_ROOT:
        key = (stage_format, batch_messages, frame_messages)
        if key not in _STAGED_TEMPLATES:
            template = _TEMPLATE_ROOT[0] / str(len(_STAGED_TEMPLATES))
            assert _run_child(template, action, "", timeout, frame_messages, stage_format,
                              batch_messages) == 0  # fmt: skip
            _STAGED_TEMPLATES[key] = template
        shutil.copytree(_STAGED_TEMPLATES[key], data)
        return 0
    return _run_child(data, action, failpoints, timeout, frame_messages, stage_format,
                      batch_messages)  # fmt: skip


# Children run by ``tests.fork_server`` (forked from a process that has imported
# everything: ~1 s of imports saved per child; the crash points and checks are the same).
# The random SIGKILL test still starts real processes, so kills also land in a cold start.
_SERVER = ModuleForkServer(CHILD)
_fork_server = _SERVER.fixture()


def _run_child(data: Path, action: str, failpoints: str, timeout: float,
               frame_messages: int | None, stage_format: str,
               batch_messages: int | None) -> int:  # fmt: skip
    environment = {"BULK_STAGE_FORMAT": stage_format}
    if batch_messages is not None:
        environment["BULK_BATCH_MESSAGES"] = str(batch_messages)
    if frame_messages is not None:
        environment["BULK_FRAME_MESSAGES"] = str(frame_messages)
    if _SERVER.server is not None:
        done = _SERVER.run([str(data), action], environment=environment,
                              failpoints=failpoints, timeout=timeout)  # fmt: skip
    else:
        environment = {**{k: v for k, v in os.environ.items()
                          if k != "TOPICBASE_FAILPOINTS" and not k.startswith("BULK_")},
                       **environment, "TOPICBASE_FAILPOINTS": failpoints}  # fmt: skip
        done = subprocess.run([sys.executable, str(CHILD), str(data), action],
                              env=environment, capture_output=True, text=True,
                              timeout=timeout)  # fmt: skip
    assert done.returncode in (0, CRASHED), done.stderr
    return done.returncode


def _published(database: Database) -> dict[int, list[bytes]]:
    entry = database.catalog.entry("t")
    assert entry is not None
    topic = database.topic_log(entry.topic_id)
    found: dict[int, list[bytes]] = {}
    for partition in topic.partition_ids():
        log = topic.partition(partition)
        messages: list[bytes] = []
        offset = log.start_offset
        while offset < log.end_offset:
            read = log.read(offset, max_messages=100_000)
            for batch in read.batches:
                messages += batch.column("data").to_pylist()
            offset = read.next_offset
        found[partition] = sorted(messages)  # a write's files are read in name order
        assert len(set(messages)) == len(messages), "a message published twice"
    return found


def _totals(database: Database) -> list[dict]:
    session = database.connect()
    try:
        table = session.execute("SELECT k, n FROM totals")[-1].table
        assert table is not None
        return table.to_pylist()
    finally:
        session.close()


def _sink_owner(database: Database) -> str | None:
    session = database.connect()
    try:
        return bulk_publish.sink_owner(session, child.SINK)
    finally:
        session.close()


def _check_and_retry(data: Path) -> str:
    """Open (recovery), check all-or-nothing, retry the commit, check exactly once."""
    database = Database.open(str(data), retention_interval_s=None)
    try:
        bulk = bulk_write.for_database(database)  # settles commit directories
        published = _published(database)
        everything = child.expected()
        empty = {p: [] for p in everything}
        assert published in (everything, empty), {p: len(m) for p, m in published.items()}
        assert _totals(database) == ([{"k": "a", "n": 1}] if published == everything else [])
        # The sink's claim commits with its record (``engine.bulk_publish.claim``).
        assert _sink_owner(database) == (None if published == empty else LOCAL_SUPERUSER_NAME)
        assert os.listdir(bulk.commits_root) == []
        staged = sorted(os.listdir(bulk.root))
        if published == empty:
            assert staged == sorted(child.write_ids()), staged  # back to staged writes
        session = database.connect()
        try:
            outcome = bulk.commit(session, child.SINK, child.BATCH, child.write_ids())
        finally:
            session.close()
        assert outcome["status"] == ("committed" if published == empty else "duplicate")
        database.committer.checkpoint()
        assert _published(database) == everything
        assert _totals(database) == [{"k": "a", "n": 1}]
        assert os.listdir(bulk.root) == [] and os.listdir(bulk.commits_root) == []
        assert bulk.staged_bytes == 0
        assert _sink_owner(database) == LOCAL_SUPERUSER_NAME
        return "nothing" if published == empty else "all"
    finally:
        database.close()


@pytest.mark.parametrize("stage_format", FORMATS)
@pytest.mark.parametrize(("failpoint", "outcome"), [
    ("bulk.mid_manifest", "nothing"),
    ("bulk.mid_move", "nothing"),
    ("bulk.before_commit", "nothing"),
    ("commit.after_commit_point", "all"),
    ("commit.mid_publish", "all"),
    ("commit.checkpoint_before_delete", "all"),
    ("commit.checkpoint_before_release", "all"),
])  # fmt: skip
def test_a_commit_crashed_at_each_step_publishes_all_or_nothing_once(
        tmp_path: Path, failpoint: str, outcome: str, stage_format: str) -> None:  # fmt: skip
    data = tmp_path / "data"
    assert _run(data, "stage", stage_format=stage_format) == 0
    assert _run(data, "commit", f"{failpoint}=crash", stage_format=stage_format) == CRASHED
    assert _check_and_retry(data) == outcome


@pytest.mark.parametrize(("failpoint", "outcome"), [
    ("bulk.before_commit", "nothing"),
    ("commit.after_commit_point", "all"),
    ("publish.mid_share=crash@3", "all"),
    ("segment.torn_write=crash@5", "all"),
    ("commit.mid_publish", "all"),
])  # fmt: skip
def test_a_framed_commit_over_a_transactions_partition_limit_is_one_transaction(
        tmp_path: Path, failpoint: str, outcome: str) -> None:  # fmt: skip
    """Each partition's share (500 messages) over what one transaction may write to a
    partition (300 here): staged as frames, it is still committed in ONE transaction
    (not in parts), so a kill at any step publishes all of it or nothing, once."""
    data = tmp_path / "data"
    assert _run(data, "stage", batch_messages=300) == 0
    failpoint = failpoint if "=" in failpoint else f"{failpoint}=crash"
    assert _run(data, "commit", failpoint, batch_messages=300) == CRASHED
    assert _check_and_retry(data) == outcome
    database = Database.open(str(data), retention_interval_s=None)
    try:
        cursor = database.root.cursor()
        try:
            parts = cursor.execute(f"SELECT count(*) FROM {bulk_publish.PARTS_TABLE}").fetchall()
        finally:
            cursor.close()
        assert parts == [(0,)]  # no commit in parts
    finally:
        database.close()


def test_a_commit_killed_while_partition_0_waits_publishes_its_share_once_on_restart(
        tmp_path: Path) -> None:  # fmt: skip
    """Round 16: a framed commit publishes every partition's share at once, the first one
    too (before, partition 0 went alone first). Killed at ``commit.mid_publish`` (another
    share published) while partition 0's publish is held: partition 0 holds nothing of
    the batch on disk, others do; the restart publishes the rest, every message once."""
    data = tmp_path / "data"
    assert _run(data, "stage") == 0
    done = _SERVER.run([str(data), "commit"], environment={
        "BULK_STAGE_FORMAT": "frames", "BULK_HOLD_PARTITION_0": "1"},
        failpoints="commit.mid_publish=crash", timeout=120)  # fmt: skip
    assert done.returncode == CRASHED, done.stderr
    sizes: dict[str, int] = {}
    for path in (data / "store" / "topics").glob("t*/p*/*.log"):  # the topic's partitions
        sizes[path.parent.name] = sizes.get(path.parent.name, 0) + path.stat().st_size
    assert sizes.get("p0", 0) == 0 and any(sizes.get(f"p{p}", 0) for p in (1, 2, 3)), sizes
    assert _check_and_retry(data) == "all"


@pytest.mark.parametrize("failpoint", ["publish.mid_share=crash@2",
                                       "segment.torn_write=crash@2"])
def test_a_framed_share_published_to_a_split_partition_and_killed_is_finished_once(
        tmp_path: Path, failpoint: str) -> None:  # fmt: skip
    """Partition 0 splits after the commit routed its share (8 frames) there: the share
    goes to the child keyless messages go to, copied frame by frame; killed between two
    of its frames, or with a frame torn, recovery publishes the rest there once (review
    R1-7) and a retry is a duplicate."""
    data = tmp_path / "data"
    environment = {"BULK_SPLIT_BEFORE_PUBLISH": "1", "BULK_STAGE_FORMAT": "frames"}
    for action, armed, code in (("stage", "", 0), ("commit", failpoint, CRASHED)):
        done = _SERVER.run([str(data), action], environment=environment, failpoints=armed)
        assert done.returncode == code, done.stderr
    database = Database.open(str(data), retention_interval_s=None)
    try:
        topic = database.topic_log(database.catalog.entry("t").topic_id)
        assert not topic.partition_info(0).active and len(topic.partition_ids()) == 6
        found = sorted(m for m in _published(database).values() for m in m)
        assert found == sorted(m for m in child.expected().values() for m in m)
        assert topic.partition(0).end_offset == 0
        session = database.connect()
        try:
            outcome = bulk_write.for_database(database).commit(
                session, child.SINK, child.BATCH, child.write_ids())
        finally:
            session.close()
        assert outcome["status"] == "duplicate"
        assert sorted(m for m in _published(database).values() for m in m) == found
    finally:
        database.close()


@pytest.mark.parametrize("failpoint", ["segment.torn_write=crash@3", "publish.mid_share=crash@3"])
def test_a_framed_publish_torn_or_killed_inside_a_share_is_finished_by_recovery(
        tmp_path: Path, failpoint: str) -> None:  # fmt: skip
    """Staged as frames, each partition's share is 8 frames (4 writes of 2 files, each
    file's rows of a partition one frame); the publish killed while it writes (the 3rd
    frame's header and half its body copied: a torn frame at the log end) or between
    two frames. Recovery keeps the whole frames, cuts the torn one, copies the rest of
    the share's frames as staged (same frames: 8 of them, every message once)."""
    data = tmp_path / "data"
    assert _run(data, "stage") == 0
    assert _run(data, "commit", failpoint) == CRASHED
    database = Database.open(str(data), retention_interval_s=None)
    try:
        topic = database.topic_log(database.catalog.entry("t").topic_id)
        counts = [[f.header.record_count for s in topic.partition(p).segments
                   for f in s.scan(0, s.size_bytes, 1 << 20)]
                  for p in topic.partition_ids()]  # fmt: skip
        assert [len(c) for c in counts] == [8] * child.PARTITIONS, counts
        assert [sum(c) for c in counts] == [child.ROWS // child.PARTITIONS] * child.PARTITIONS
    finally:
        database.close()
    assert _check_and_retry(data) == "all"


@pytest.mark.parametrize("failpoint", ["segment.torn_write=crash@3", "publish.mid_share=crash@3"])
def test_a_publish_of_column_compressed_frames_torn_or_killed_is_finished_by_recovery(
        tmp_path: Path, failpoint: str) -> None:  # fmt: skip
    """Review R1 L-6 (round 22): staged as a client's frames whose data column is
    compressed whole (``storage.column_codec``, the Spark writer's), each partition's share
    8 frames; the publish killed while it copies the 3rd (a torn compressed frame at the
    partition's tail) or between two frames. Recovery keeps the whole frames, compressed as
    sent, cuts the torn one and publishes the rest; the offline check is clean and every
    message reads back once."""
    data = tmp_path / "data"
    assert _run(data, "stage", stage_format="column") == 0
    assert _run(data, "commit", failpoint, stage_format="column") == CRASHED
    database = Database.open(str(data), retention_interval_s=None)
    try:
        topic = database.topic_log(database.catalog.entry("t").topic_id)
        frames = [[f for s in topic.partition(p).segments for f in s.scan(0, s.size_bytes, 1 << 20)]
                  for p in topic.partition_ids()]  # fmt: skip
        assert [len(f) for f in frames] == [8] * child.PARTITIONS, frames
        assert all(unpacked_bytes(f.body) > 0 for share in frames for f in share)
    finally:
        database.close()
    assert _check_and_retry(data) == "all"
    report = check_database(str(data))
    assert report.ok, report.lines()


@pytest.mark.parametrize("torn", [False, True])
def test_a_publish_crashed_between_the_frames_of_a_share_is_finished_by_recovery(
        tmp_path: Path, torn: bool) -> None:  # fmt: skip
    """Shares cut into frames of 64 messages (500 per partition: 8 frames), the process
    killed after the 4th frame of the first share; with ``torn``, that frame is then torn
    (its segment cut 8 bytes short), so the partition holds only 3 frames of it."""
    data = tmp_path / "data"
    assert _run(data, "stage", stage_format="arrows") == 0
    assert _run(data, "commit", "publish.mid_share=crash@4", frame_messages=64,
                stage_format="arrows") == CRASHED  # fmt: skip
    if torn:
        logs = sorted((p for p in data.rglob("*.log") if "topics" in p.parts),
                      key=lambda p: p.stat().st_size)
        victim = logs[-1]  # the partition published to (the others are empty)
        with open(victim, "r+b") as handle:
            handle.truncate(victim.stat().st_size - 8)
    database = Database.open(str(data), retention_interval_s=None)
    try:
        topic = database.topic_log(database.catalog.entry("t").topic_id)
        counts = sorted([f.header.record_count for s in topic.partition(p).segments
                         for f in s.scan(0, s.size_bytes, 1 << 20)]
                        for p in topic.partition_ids())  # fmt: skip
        kept = 3 if torn else 4  # frames of the first share that survived the crash
        # Recovery (here, with the default frame target) published the rest as one frame.
        assert counts[0] == sorted([64] * kept + [500 - 64 * kept]), counts
    finally:
        database.close()
    assert _check_and_retry(data) == "all"


def _share_frames(data: Path) -> list[list[int]]:
    """Each partition's frames' message counts (its share's frames, then its rows')."""
    database = Database.open(str(data), retention_interval_s=None)
    try:
        topic = database.topic_log(database.catalog.entry("t").topic_id)
        return [[f.header.record_count for s in topic.partition(p).segments
                 for f in s.scan(0, s.size_bytes, 1 << 20)]
                for p in topic.partition_ids()]  # fmt: skip
    finally:
        database.close()


@pytest.mark.parametrize(("failpoint", "outcome"), [
    ("bulk.before_commit", "nothing"),
    ("commit.after_commit_point", "all"),
    ("publish.mid_share=crash@3", "all"),
    ("segment.torn_write=crash@3", "all"),
    ("publish.frames_then_rows=crash@2", "all"),
    ("commit.mid_publish", "all"),
])  # fmt: skip
def test_a_commit_of_frames_and_arrow_rows_of_one_partition_is_one_transaction(
        tmp_path: Path, failpoint: str, outcome: str) -> None:  # fmt: skip
    """Each write holds a frames file then an Arrow file (the JVM writer's task that met
    a row a frame cannot hold): each partition's share is its frames (4 of 62-63
    messages, copied as staged) followed by its Arrow rows (~250, by reference), one share
    of ONE transaction (not decoded, not in parts, the share over one transaction's
    per-partition limit: 300 here). Killed at each step (inside the frames, a frame torn,
    between the frames and the rows of the second share), recovery publishes what each
    partition lacks, once; a retry is a duplicate."""
    data = tmp_path / "data"
    assert _run(data, "stage", stage_format="mixed", batch_messages=300) == 0
    failpoint = failpoint if "=" in failpoint else f"{failpoint}=crash"
    assert _run(data, "commit", failpoint, stage_format="mixed",
                batch_messages=300) == CRASHED  # fmt: skip
    assert _check_and_retry(data) == outcome
    if outcome == "all":
        # the 4 frames files' frames as staged (62 or 63 messages each), then the rows
        # in one frame: nothing decoded and re-cut
        for counts in _share_frames(data):
            assert len(counts) == 5 and set(counts[:4]) <= {62, 63}, counts
            assert sum(counts) == child.ROWS // child.PARTITIONS, counts
    database = Database.open(str(data), retention_interval_s=None)
    try:
        cursor = database.root.cursor()
        try:
            parts = cursor.execute(f"SELECT count(*) FROM {bulk_publish.PARTS_TABLE}").fetchall()
        finally:
            cursor.close()
        assert parts == [(0,)]  # no commit in parts
    finally:
        database.close()


@pytest.mark.parametrize("failpoint", ["publish.mid_share=crash@2",
                                       "publish.frames_then_rows=crash",
                                       "split.mid_redirect=crash"])
def test_frames_and_rows_of_a_split_partition_killed_are_finished_once(
        tmp_path: Path, failpoint: str) -> None:  # fmt: skip
    """Mixed writes; partition 0 splits after the commit routed its share (frames, then
    Arrow rows) there: the frames go to the child keyless messages go to, then the rows
    by key; killed between two frames, between the frames and the rows, or between two
    children's rows, recovery counts the frames first along the keyless chain and
    publishes what is missing once; a retry is a duplicate."""
    data = tmp_path / "data"
    environment = {"BULK_SPLIT_BEFORE_PUBLISH": "1", "BULK_STAGE_FORMAT": "mixed"}
    for action, armed, code in (("stage", "", 0), ("commit", failpoint, CRASHED)):
        done = _SERVER.run([str(data), action], environment=environment, failpoints=armed)
        assert done.returncode == code, done.stderr
    database = Database.open(str(data), retention_interval_s=None)
    try:
        topic = database.topic_log(database.catalog.entry("t").topic_id)
        assert not topic.partition_info(0).active
        found = sorted(m for m in _published(database).values() for m in m)
        assert found == sorted(m for m in child.expected().values() for m in m)
        assert topic.partition(0).end_offset == 0
        session = database.connect()
        try:
            outcome = bulk_write.for_database(database).commit(
                session, child.SINK, child.BATCH, child.write_ids())
        finally:
            session.close()
        assert outcome["status"] == "duplicate"
        assert sorted(m for m in _published(database).values() for m in m) == found
    finally:
        database.close()


@pytest.mark.parametrize("stage_format", FORMATS)
def test_recovery_killed_while_it_republishes_finishes_at_the_next_open(
        tmp_path: Path, stage_format: str) -> None:  # fmt: skip
    data = tmp_path / "data"
    assert _run(data, "stage", stage_format=stage_format) == 0
    assert _run(data, "commit", "commit.after_commit_point=crash",
                stage_format=stage_format) == CRASHED  # fmt: skip
    assert _run(data, "open", "recovery.after_republish=crash@2") == CRASHED
    assert _check_and_retry(data) == "all"


@pytest.mark.parametrize("stage_format", FORMATS)
def test_a_damaged_file_of_a_committed_batch_stops_recovery(
        tmp_path: Path, stage_format: str) -> None:  # fmt: skip
    data = tmp_path / "data"
    assert _run(data, "stage", stage_format=stage_format) == 0
    assert _run(data, "commit", "commit.after_commit_point=crash",
                stage_format=stage_format) == CRASHED  # fmt: skip
    commits = data / bulk_write.COMMITS_DIRECTORY
    (directory,) = list(commits.iterdir())
    suffix = "frames" if stage_format == "mixed" else stage_format
    victim = sorted(directory.glob(f"w0/*.{suffix}"))[0]
    with open(victim, "r+b") as handle:
        handle.truncate(victim.stat().st_size - 8)  # a torn tail
    with pytest.raises(CorruptSegmentError):
        Database.open(str(data), retention_interval_s=None)


@pytest.mark.parametrize("stage_format", ["frames", "mixed"])
def test_sigkill_at_random_moments_of_a_commit(tmp_path: Path, stage_format: str) -> None:
    """SIGKILL anywhere in stage, commit, publish and checkpoint: all or nothing, once."""
    seed = int(os.environ.get("BULK_CRASH_SEED") or random.SystemRandom().randrange(2**32))
    chooser = random.Random(seed)
    environment = {k: v for k, v in os.environ.items() if k != "TOPICBASE_FAILPOINTS"}
    environment["BULK_STAGE_FORMAT"] = stage_format
    killed = 0  # rounds the SIGKILL stopped before the child finished on its own
    window = 0.6  # halved after a round whose child ended first (a fast or quiet machine)
    for round_ in range(4):
        data = tmp_path / f"data{round_}"
        proc = subprocess.Popen([sys.executable, str(CHILD), str(data), "stage-and-commit"],
                                env=environment, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)  # fmt: skip
        # The imports take ~1-3 s and the work itself ~0.25 s (load 2): wait until the
        # child opens the database (its directory appears), then kill it inside the work.
        deadline = time.monotonic() + 60
        while not data.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(chooser.uniform(0.0, window))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        killed += proc.returncode == -signal.SIGKILL
        assert proc.returncode in (0, -signal.SIGKILL), f"the child failed: {proc.returncode}"
        if proc.returncode != -signal.SIGKILL:
            window /= 2
        if not (data / "catalog").exists() and not any(data.glob("*")):
            continue  # killed before the database was created
        if child_topic_missing(data):
            continue
        _check_and_retry(data)
    print(f"BULK_CRASH_SEED={seed}: {killed} of 4 rounds killed before the child's end")
    assert killed > 0, "every child ended before its kill: no crash was checked"  # R3-F5


def child_topic_missing(data: Path) -> bool:
    """Killed before the topic or all writes existed: nothing to check (the retry needs
    the staged writes)."""
    database = Database.open(str(data), retention_interval_s=None)
    try:
        if database.catalog.entry("t") is None:
            return True
        bulk = bulk_write.for_database(database)
        staged = set(os.listdir(bulk.root))
        complete = all(w in staged for w in child.write_ids())
        session = database.connect()
        try:
            recorded = bulk.committed_rows(session, child.SINK, child.BATCH) is not None
        finally:
            session.close()
        if recorded:
            return False
        if not complete:
            return True
        # Every write exists, but the last append may have been cut: count the files.
        return any(len([n for n in os.listdir(os.path.join(bulk.root, w))
                        if n.endswith(bulk_write.STAGED_SUFFIXES)])
                   != (2 if w != child.TABLE_WRITE else 1)
                   for w in child.write_ids())  # fmt: skip
    finally:
        database.close()
