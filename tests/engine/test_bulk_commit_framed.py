"""A bulk write whose rows all name their partition is staged as frames
(``storage.staged_frames``) and its commit copies them into the partitions as they are:
no grouping, no encoding, no spill, no staging log (``engine.staged_refs.FramedWrite``);
writes it cannot take so are decoded and copied as before. Crash points:
``test_bulk_commit_crash.py`` (both formats)."""

from __future__ import annotations

import io
import json
import os
import shutil
import time
from pathlib import Path

import pyarrow as pa
import pytest

from engine import bulk_publish, bulk_write, staged_refs
from engine import commit as commit_module
from engine.catalog import SCHEMA
from engine.database import Database
from engine.staged_writes import TransactionStaging
from storage import limits, staged_frames
from storage.errors import CorruptSegmentError, DuplicateColumnError, LimitExceededError
from storage.partition_log import PartitionLog
from storage.record_batch import FrameEncoder
from tests.engine.bulk_helpers import commit_writes, messages_by_partition


def _open(tmp_path) -> Database:
    database = Database.open(str(tmp_path / "data"), retention_interval_s=None)
    session = database.connect()
    session.execute("CREATE TOPIC t WITH (min_active_partitions = 2)")
    session.close()
    return database


def _stage(database, write_id: str, start: int, count: int, *, extra: bool = False,
           piece: int = 100, topic: str = "t", routed: bool = False) -> None:  # fmt: skip
    columns = {"data": pa.array([b"m%05d" % i for i in range(start, start + count)]),
               "partition": pa.array([i % 2 for i in range(start, start + count)], pa.int32())}
    if extra:  # a column outside the frames format: staged as it came
        columns["codec"] = pa.array(["raw"] * count)
    if routed:  # no partition: the topic routes the rows (round robin), staged as they came
        del columns["partition"]
    batch = pa.record_batch(columns)
    session = database.connect()
    try:
        bulk = bulk_write.for_database(database)
        bulk.start(session, write_id, "topic", topic)
        pieces = [batch.slice(s, piece) for s in range(0, count, piece)]
        bulk.append(session, write_id, pieces, batch.schema)
    finally:
        session.close()


_commit = commit_writes


_partitions = messages_by_partition


def _expected(*ranges: tuple[int, int]) -> dict[int, list[bytes]]:
    found: dict[int, list[bytes]] = {0: [], 1: []}
    for start, count in ranges:
        for i in range(start, start + count):
            found[i % 2].append(b"m%05d" % i)
    return found


def test_a_framed_commit_copies_the_staged_frames_and_encodes_nothing(
        tmp_path, monkeypatch) -> None:  # fmt: skip
    database = _open(tmp_path)
    try:
        _stage(database, "a", 0, 300)
        _stage(database, "b", 300, 200)
        bulk = bulk_write.for_database(database)
        assert [n.endswith(".frames") for w in ("a", "b")
                for n in os.listdir(os.path.join(bulk.root, w)) if n != "write.json"] == [
            True, True]  # fmt: skip

        def refused(*args, **kwargs):
            raise AssertionError("a framed share was spilled, encoded or decoded")

        monkeypatch.setattr(TransactionStaging, "_spill", refused)
        monkeypatch.setattr(FrameEncoder, "encode", refused)
        monkeypatch.setattr(PartitionLog, "publish_transactional", refused)
        monkeypatch.setattr(bulk_write.BulkWrites, "read_write", refused)
        database.committer.checkpoint()
        staging = os.path.join(database.path, "staging")
        before = sum(os.path.getsize(os.path.join(staging, n)) for n in os.listdir(staging))
        assert _commit(database, 1, ["a", "b"]) == {"status": "committed", "rows": 500}
        after = sum(os.path.getsize(os.path.join(staging, n)) for n in os.listdir(staging))
        assert after == before  # nothing went to the staging log
        assert _partitions(database) == _expected((0, 300), (300, 200))
        cursor = database.root.cursor()
        try:
            (items,) = [json.loads(i) for (i,) in cursor.execute(
                f"SELECT items FROM {SCHEMA}.transactions").fetchall() if json.loads(i)]
        finally:
            cursor.close()
        for _, partition, by_reference in items:
            (reference,) = by_reference["references"]
            assert reference["partition"] == partition and len(reference["frames"]) == 2
        assert os.listdir(bulk.root) == [] and len(os.listdir(bulk.commits_root)) == 1
        database.committer.checkpoint()
        assert os.listdir(bulk.commits_root) == []  # released with the record
        assert _commit(database, 1, ["a", "b"]) == {"status": "duplicate", "rows": 0}
    finally:
        database.close()


def test_framed_writes_mixed_with_writes_staged_as_they_came_are_copied_together(
        tmp_path) -> None:  # fmt: skip
    database = _open(tmp_path)
    try:
        _stage(database, "a", 0, 300)
        _stage(database, "b", 300, 200, extra=True)
        assert _commit(database, 1, ["a", "b"]) == {"status": "committed", "rows": 500}
        assert _partitions(database) == _expected((0, 300), (300, 200))
    finally:
        database.close()


def test_framed_writes_over_a_transactions_share_are_one_transaction_copied_as_staged(
        tmp_path, monkeypatch) -> None:  # fmt: skip
    # A framed share is not held to one transaction's per-partition limit: its frames
    # were checked when staged and are copied one by one, so the commit stays one
    # transaction (no parts, nothing decoded), atomic whatever its size.
    monkeypatch.setattr(limits, "BATCH_MESSAGES_MAX", 300)
    monkeypatch.setattr(limits, "FRAME_TARGET_MESSAGES", 100)  # a frame within a batch
    monkeypatch.setattr(bulk_publish, "PART_ROWS", 270)
    database = _open(tmp_path)
    try:
        _stage(database, "a", 0, 800)  # 400 rows a partition: over 300

        def refused(*args, **kwargs):
            raise AssertionError("a framed share was decoded or cut into parts")

        monkeypatch.setattr(bulk_write.BulkWrites, "read_write", refused)
        monkeypatch.setattr(staged_refs.FramedRows, "table", refused)
        monkeypatch.setattr(staged_frames, "decode", refused)
        assert _commit(database, 1, ["a"]) == {"status": "committed", "rows": 800}
        assert _partitions(database) == _expected((0, 800))
        assert os.listdir(bulk_write.for_database(database).root) == []
        cursor = database.root.cursor()
        try:
            assert cursor.execute(
                f"SELECT count(*) FROM {bulk_publish.PARTS_TABLE}").fetchall() == [(0,)]
        finally:
            cursor.close()
    finally:
        database.close()


def test_a_framed_commit_survives_a_restart_before_its_checkpoint(tmp_path) -> None:
    """The record names the frames files; after a clean close and open, nothing is
    published twice and the files are gone."""
    database = _open(tmp_path)
    try:
        _stage(database, "a", 0, 300)
        assert _commit(database, 1, ["a"]) == {"status": "committed", "rows": 300}
    finally:
        database.close()
    database = Database.open(str(tmp_path / "data"), retention_interval_s=None)
    try:
        assert _partitions(database) == _expected((0, 300))
        bulk = bulk_write.for_database(database)
        assert os.listdir(bulk.commits_root) == [] and os.listdir(bulk.root) == []
    finally:
        database.close()


def _spark_like(start: int, count: int, group: str | None = None) -> pa.RecordBatch:
    """Rows as Spark's writer sends them: every write column, the unset ones null."""
    return pa.record_batch({
        "data": pa.array([b"m%05d" % i for i in range(start, start + count)], pa.large_binary()),
        "producer_id": pa.nulls(count, pa.large_string()),
        "seq_no": pa.nulls(count, pa.int64()),
        "message_group_id": pa.array([group] * count, pa.large_string()),
        "partition": pa.array([i % 2 for i in range(start, start + count)], pa.int32()),
        "created_at": pa.nulls(count, pa.timestamp("us", tz="UTC")),
        "metadata": pa.nulls(count, pa.map_(pa.large_string(), pa.large_binary())),
        "codec": pa.nulls(count, pa.large_string()),
    })  # fmt: skip


def test_null_columns_of_every_write_column_are_staged_as_frames(tmp_path) -> None:
    database = _open(tmp_path)
    try:
        session = database.connect()
        bulk = bulk_write.for_database(database)
        bulk.start(session, "a", "topic", "t")
        batches = [_spark_like(0, 100), _spark_like(100, 150)]
        assert bulk.append(session, "a", batches, batches[0].schema) == 250
        session.close()
        names = [n for n in os.listdir(os.path.join(bulk.root, "a")) if n != "write.json"]
        assert len(names) == 1 and names[0].endswith(".frames")
        assert _commit(database, 1, ["a"]) == {"status": "committed", "rows": 250}
        assert _partitions(database) == _expected((0, 250))
    finally:
        database.close()


def test_a_batch_frames_cannot_hold_stages_the_rest_of_its_stream_as_it_came(tmp_path) -> None:
    """A message group in the third batch: the first two are frames, the rest of the
    stream an Arrow file named to sort after them; the commit decodes and copies both,
    in the stream's order, the groups kept."""
    database = _open(tmp_path)
    try:
        session = database.connect()
        bulk = bulk_write.for_database(database)
        bulk.start(session, "a", "topic", "t")
        batches = [_spark_like(0, 100), _spark_like(100, 100), _spark_like(200, 100, "g"),
                   _spark_like(300, 100)]  # fmt: skip
        assert bulk.append(session, "a", batches, batches[0].schema) == 400
        names = sorted(n for n in os.listdir(os.path.join(bulk.root, "a")) if n != "write.json")
        assert [n.rsplit(".", 1)[1] for n in names] == ["frames", "arrows"]
        assert _commit(database, 1, ["a"]) == {"status": "committed", "rows": 400}
        assert _partitions(database) == _expected((0, 400))
        groups = session.execute(
            'SELECT count(*) AS n FROM TOPIC t WHERE message_group_id = \'g\'')[-1].table
        assert groups.column("n").to_pylist() == [100]
        session.close()
    finally:
        database.close()


def _flip_a_body_byte(database, write_id: str) -> tuple[str, int]:
    (path,) = [os.path.join(root, name)
               for root, _, names in os.walk(os.path.join(database.path, "bulk_writes", write_id))
               for name in names if name.endswith(".frames")]  # fmt: skip
    position = 24 + 200  # inside the first frame's body
    with open(path, "r+b") as handle:
        handle.seek(position)
        value = handle.read(1)[0]
        handle.seek(position)
        handle.write(bytes([value ^ 0xFF]))
    return path, value


def test_a_frames_file_damaged_after_staging_is_refused_and_stays_staged(tmp_path) -> None:
    # The commit checks the staged bytes before its commit point: nothing is published
    # (before, the damaged frame was published and its readers failed, and a crash
    # before the checkpoint left a database that refused to open); the write is moved
    # back, still staged: once repaired it commits, or it can be aborted.
    database = _open(tmp_path)
    try:
        _stage(database, "a", 0, 200)
        path, value = _flip_a_body_byte(database, "a")
        with pytest.raises(CorruptSegmentError, match="frames file is damaged") as raised:
            _commit(database, 1, ["a"])
        assert raised.value.sqlstate == "XX001"
        assert _partitions(database) == {0: [], 1: []}
        session = database.connect()
        try:
            assert [w.write_id for w in bulk_write.for_database(database).list(session)] == ["a"]
        finally:
            session.close()
        assert not os.listdir(os.path.join(database.path, "bulk_commits"))
        # A crash now: the files as they are, opened again.
        shutil.copytree(database.path, str(tmp_path / "crash"))
        with open(path, "r+b") as handle:  # repaired: the very write commits
            handle.seek(24 + 200)
            handle.write(bytes([value]))
        assert _commit(database, 1, ["a"]) == {"status": "committed", "rows": 200}
        assert _partitions(database) == _expected((0, 200))
    finally:
        database.close()
    reopened = Database.open(str(tmp_path / "crash"), retention_interval_s=None)
    try:
        assert _partitions(reopened) == {0: [], 1: []}
        session = reopened.connect()
        try:
            bulk = bulk_write.for_database(reopened)
            assert [w.write_id for w in bulk.list(session)] == ["a"]
            with pytest.raises(CorruptSegmentError):
                bulk.commit(session, "s", 1, ["a"])
            assert bulk.abort(session, ["a"]) == 1
        finally:
            session.close()
    finally:
        reopened.close()


def test_a_stream_naming_a_column_twice_is_refused_before_staging(tmp_path) -> None:
    # Before: a KeyError (XX000) while staging, whichever format took the stream.
    database = _open(tmp_path)
    try:
        session = database.connect()
        try:
            bulk = bulk_write.for_database(database)
            bulk.start(session, "a", "topic", "t")
            for names, columns in [
                (["data", "partition", "partition"],
                 [pa.array([b"x", b"y"]), pa.array([0, 1]), pa.array([1, 0])]),
                (["data", "data", "partition", "codec"],
                 [pa.array([b"x"]), pa.array([b"y"]), pa.array([0]), pa.array(["raw"])]),
            ]:  # fmt: skip
                batch = pa.RecordBatch.from_arrays(columns, names=names)
                with pytest.raises(DuplicateColumnError) as raised:
                    bulk.append(session, "a", [batch], batch.schema)
                assert raised.value.sqlstate == "42701"
            assert [w.files for w in bulk.list(session)] == [0]
        finally:
            session.close()
        _stage(database, "a", 0, 10)
        assert _commit(database, 1, ["a"]) == {"status": "committed", "rows": 10}
        assert _partitions(database) == _expected((0, 10))
    finally:
        database.close()


def test_frames_files_are_synced_by_the_commit_that_names_them(tmp_path, monkeypatch) -> None:
    """Staging does not wait for the disk (no fdatasync of a frames file when its stream
    ends); the commit fdatasyncs every frames file its record names, before the record
    commits (``bulk.before_commit``), whichever door staged it (rows framed here, or
    frames a client sent: ``append_frames``)."""
    database = _open(tmp_path)
    synced: list[str] = []
    real_fdatasync = os.fdatasync

    def fdatasync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fdatasync(fd)

    def before_commit() -> None:
        synced.append("<commit point>")

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    monkeypatch.setattr(bulk_write.failpoints, "hit", lambda name: before_commit()
                        if name == "bulk.before_commit" else None)  # fmt: skip
    _stage(database, "w1", 0, 300)
    session = database.connect()
    bulk = bulk_write.for_database(database)
    bulk.start(session, "w2", "topic", "t")
    frames = b"".join(Path(p).read_bytes() for p in _frames_files(database, "w1"))
    stream = io.BytesIO(frames)
    assert bulk.append_frames(session, "w2", stream.read) == 300
    session.close()
    staged = [os.path.basename(p) for w in ("w1", "w2") for p in _frames_files(database, w)]
    assert len(staged) == 2
    assert not [p for p in synced if p.endswith((".frames", ".part"))]  # staging: no sync
    assert _commit(database, 0, ["w1", "w2"])["rows"] == 600
    point = synced.index("<commit point>")
    assert {n for n in staged} <= {os.path.basename(p) for p in synced[:point]}
    assert _partitions(database) == {p: _expected((0, 300))[p] * 2 for p in (0, 1)}


def _frames_files(database, write_id: str) -> list[str]:
    directory = os.path.join(database.path, bulk_write.WRITES_DIRECTORY, write_id)
    return sorted(os.path.join(directory, n) for n in os.listdir(directory)
                  if n.endswith(".frames"))  # fmt: skip


def test_a_framed_commit_is_one_transaction_when_other_sessions_hold_the_staged_bytes_cap(
        tmp_path, monkeypatch) -> None:  # fmt: skip
    # Review R1-2: a framed write is not counted against the open transactions' staged
    # bytes (it is on disk, charged to the bulk staging cap), so a cap taken by others
    # cannot send it to a commit in parts (not atomic, decoded whole).
    monkeypatch.setattr(bulk_publish, "PART_ROWS", 270)
    database = _open(tmp_path)
    try:
        _stage(database, "a", 0, 800)

        def refused(*args, **kwargs):
            raise AssertionError("a framed write was decoded for a commit in parts")

        monkeypatch.setattr(staged_refs.FramedRows, "table", refused)
        database.staged_writes.total_bytes_max = 20_000  # others hold the rest of it
        assert _commit(database, 1, ["a"]) == {"status": "committed", "rows": 800}
        assert _partitions(database) == _expected((0, 800))
        cursor = database.root.cursor()
        try:
            assert cursor.execute(
                f"SELECT count(*) FROM {bulk_publish.PARTS_TABLE}").fetchall() == [(0,)]
        finally:
            cursor.close()
    finally:
        database.close()


def _tree_bytes(root: str) -> int:
    """The staged files' bytes under ``root`` (not the manifests)."""
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(root) for f in fs
               if f.endswith(".frames"))  # fmt: skip


def test_committed_frames_files_stay_charged_to_the_staging_cap_until_deleted(
        tmp_path) -> None:  # fmt: skip
    # Review R1-3: a committed write's files wait in bulk_commits/ for the checkpoint that
    # makes its partitions durable; they stay charged to the staging cap meanwhile, and a
    # write that needs their room runs that checkpoint first.
    database = _open(tmp_path)
    try:
        bulk = bulk_write.for_database(database)
        _stage(database, "probe", 0, 400)
        cap = bulk.staged_bytes + 1000  # room for one such write
        session = database.connect()
        bulk.abort(session, ["probe"])
        session.close()
        bulk_write.for_database(database, staging_bytes_max=cap)
        for n in range(10):
            _stage(database, f"w{n}", 400 * n, 400)
            assert _commit(database, n, [f"w{n}"])["status"] == "committed"
            assert bulk.staged_bytes >= _tree_bytes(bulk.commits_root) > 0
            assert _tree_bytes(bulk.commits_root) <= cap
        assert _partitions(database) == _expected((0, 4000))
        database.committer.checkpoint()
        assert bulk.staged_bytes == 0 and os.listdir(bulk.commits_root) == []
    finally:
        database.close()


def test_committed_frames_files_make_a_checkpoint_due(tmp_path, monkeypatch) -> None:
    # Review R1-3: their bytes count toward CHECKPOINT_STAGED_BYTES, as log commits' do:
    # the background checkpoint runs and deletes them (before: only after 256 commits).
    monkeypatch.setattr(commit_module, "CHECKPOINT_STAGED_BYTES", 1000)
    database = _open(tmp_path)
    try:
        bulk = bulk_write.for_database(database)
        _stage(database, "a", 0, 300)
        assert _commit(database, 1, ["a"]) == {"status": "committed", "rows": 300}
        for _ in range(600):  # the background checkpoint's turn (a wait, not a timing)
            if not os.listdir(bulk.commits_root):
                break
            time.sleep(0.05)
        assert os.listdir(bulk.commits_root) == []
        assert _partitions(database) == _expected((0, 300))
    finally:
        database.close()


def test_a_commit_in_parts_with_framed_writes_is_refused_and_leaves_them_staged(
        tmp_path, monkeypatch) -> None:  # fmt: skip
    # Review R1-4: a framed write beside an Arrow write over the per-partition limit
    # would go in parts, its frames decoded whole into memory: 54000 before the commit
    # point, both writes staged still; committed apart, each is one transaction.
    monkeypatch.setattr(limits, "BATCH_MESSAGES_MAX", 300)
    monkeypatch.setattr(bulk_publish, "PART_ROWS", 270)
    database = _open(tmp_path)
    try:
        session = database.connect()
        session.execute("CREATE TOPIC u WITH (min_active_partitions = 2)")
        session.close()
        _stage(database, "a", 0, 800)  # frames
        _stage(database, "b", 800, 800, extra=True, topic="u")  # as it came: 400 a partition
        with pytest.raises(LimitExceededError, match="frames writes apart"):
            _commit(database, 1, ["a", "b"])
        assert _partitions(database) == {0: [], 1: []}
        assert sorted(os.listdir(bulk_write.for_database(database).root)) == ["a", "b"]
        assert _commit(database, 1, ["a"]) == {"status": "committed", "rows": 800}
        assert _commit(database, 2, ["b"])["status"] == "committed"  # in parts
        assert _partitions(database) == _expected((0, 800))
    finally:
        database.close()


def test_frames_mixed_with_rows_the_topic_routes_are_decoded_only_under_a_bound(
        tmp_path, monkeypatch) -> None:  # fmt: skip
    # Review R1-5's residual: write a (frames) and write b (Arrow rows without a
    # partition: the topic routes them, so they cannot be committed by reference beside
    # the frames) to one topic in one commit: a's frames are decoded into memory to be
    # copied with b's rows. Over TRANSACTION_STAGED_BYTES_MAX (lowered here below a's
    # frames files, as a 16 GiB frames write is over the default) the commit is refused
    # with 54000 before anything is read or moved, both writes staged still; committed
    # apart, each goes.
    database = _open(tmp_path)
    try:
        _stage(database, "a", 0, 800)
        _stage(database, "b", 800, 10, routed=True)
        bulk = bulk_write.for_database(database)
        frames_bytes = sum(os.path.getsize(p) for p in _frames_files(database, "a"))
        monkeypatch.setattr(limits, "TRANSACTION_STAGED_BYTES_MAX", frames_bytes - 1)
        decoded: list[int] = []
        real = staged_refs.framed_table
        monkeypatch.setattr(staged_refs, "framed_table", lambda fs, frames: decoded.append(
            sum(f.record_count for share in frames.values() for f in share))
            or real(fs, frames))  # fmt: skip
        with pytest.raises(LimitExceededError, match="decode") as raised:
            _commit(database, 1, ["a", "b"])
        assert raised.value.sqlstate == "54000"
        assert decoded == []
        assert _partitions(database) == {0: [], 1: []}
        assert sorted(os.listdir(bulk.root)) == ["a", "b"]
        assert os.listdir(bulk.commits_root) == []
        assert _commit(database, 1, ["a"]) == {"status": "committed", "rows": 800}
        assert _commit(database, 2, ["b"]) == {"status": "committed", "rows": 10}
        assert decoded == []  # the frames went as staged
        # Under the bound such a commit decodes and copies them together, as before.
        monkeypatch.setattr(limits, "TRANSACTION_STAGED_BYTES_MAX", frames_bytes)
        _stage(database, "c", 810, 800)
        _stage(database, "d", 1610, 10, routed=True)
        assert _commit(database, 3, ["c", "d"]) == {"status": "committed", "rows": 810}
        assert decoded == [800]
        found = _partitions(database)
        assert sum(len(m) for m in found.values()) == 1620
        assert sorted(m for m in found.values() for m in m) == sorted(
            m for m in _expected((0, 820), (820, 800)).values() for m in m)  # fmt: skip
    finally:
        database.close()


def test_a_commit_decoding_frames_holds_one_of_the_commits_turns(tmp_path, monkeypatch) -> None:
    # Review R1-5 (its residual): each commit may decode up to the bound; at most
    # SPILLED_COMMITS_MAX of them hold decoded frames at once (the turns derived batches
    # take), and a commit takes one turn only (the semaphore is not reentrant).
    database = _open(tmp_path)
    try:
        _stage(database, "a", 0, 800)
        _stage(database, "b", 800, 10, routed=True)
        bulk = bulk_write.for_database(database)
        held: list[int] = []
        decoded_in_turn: list[int] = []

        class Turns:
            def __enter__(self) -> None:
                held.append(1)

            def __exit__(self, *_) -> None:
                held.pop()

        real = staged_refs.framed_table
        monkeypatch.setattr(bulk, "_by_reference_turns", Turns())
        monkeypatch.setattr(staged_refs, "framed_table", lambda fs, frames: decoded_in_turn.append(
            len(held)) or real(fs, frames))  # fmt: skip
        assert _commit(database, 1, ["a", "b"]) == {"status": "committed", "rows": 810}
        assert decoded_in_turn == [1]
        assert held == []
        assert sum(len(m) for m in _partitions(database).values()) == 810
    finally:
        database.close()
