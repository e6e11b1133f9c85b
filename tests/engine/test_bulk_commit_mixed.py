"""A bulk commit whose topic has rows staged as frames AND rows staged as Arrow (review
R1-5's fix): each partition's frames are published as staged and its Arrow rows by
reference, as ONE share (frames, then rows) of the commit's one transaction; nothing is
decoded into memory, whatever the frames' size. The crash tests of this path are in
``test_bulk_commit_crash.py`` (format ``mixed``, and the split partition's)."""

from __future__ import annotations

import json
import os

import pyarrow as pa

from engine import bulk_publish, bulk_write, staged_refs
from engine.catalog import SCHEMA
from engine.database import Database
from storage import limits, staged_frames
from tests.engine.bulk_helpers import commit_writes, messages_by_partition


def _open(tmp_path) -> Database:
    database = Database.open(str(tmp_path / "data"), retention_interval_s=None)
    session = database.connect()
    session.execute("CREATE TOPIC t WITH (min_active_partitions = 2)")
    session.close()
    return database


def _rows(start: int, count: int, *, extra: bool = False, group: str | None = None
          ) -> pa.RecordBatch:  # fmt: skip
    """Rows as Spark's writer sends them (every write column, the unset ones null);
    ``extra``: a codec given (a column frames cannot hold), ``group``: a message group."""
    return pa.record_batch({
        "data": pa.array([b"m%05d" % i for i in range(start, start + count)], pa.binary()),
        "producer_id": pa.nulls(count, pa.string()),
        "seq_no": pa.nulls(count, pa.int64()),
        "message_group_id": pa.array([group] * count, pa.string()),
        "partition": pa.array([i % 2 for i in range(start, start + count)], pa.int32()),
        "created_at": pa.nulls(count, pa.timestamp("us", tz="UTC")),
        "metadata": pa.nulls(count, pa.map_(pa.string(), pa.binary())),
        "codec": pa.array(["raw" if extra else None] * count, pa.string()),
    })  # fmt: skip


def _stage(database, write_id: str, *streams: list[pa.RecordBatch]) -> None:
    """Each stream staged as one append (one COPY) of write ``write_id``."""
    session = database.connect()
    try:
        bulk = bulk_write.for_database(database)
        bulk.start(session, write_id, "topic", "t")
        for batches in streams:
            bulk.append(session, write_id, batches, batches[0].schema)
    finally:
        session.close()


_partitions = messages_by_partition


def _expected(*ranges: tuple[int, int]) -> dict[int, list[bytes]]:
    found: dict[int, list[bytes]] = {0: [], 1: []}
    for start, count in ranges:
        for i in range(start, start + count):
            found[i % 2].append(b"m%05d" % i)
    return found


def _suffixes(database, write_id: str) -> list[str]:
    directory = os.path.join(bulk_write.for_database(database).root, write_id)
    return [n.rsplit(".", 1)[1] for n in sorted(os.listdir(directory)) if n != "write.json"]


def _refuse_decoding(monkeypatch) -> None:
    def refused(*args, **kwargs):
        raise AssertionError("frames were decoded")

    monkeypatch.setattr(staged_refs, "framed_table", refused)
    monkeypatch.setattr(staged_refs, "decode_frames", refused)
    monkeypatch.setattr(staged_frames, "decode", refused)


def _records(database) -> list[list]:
    cursor = database.root.cursor()
    try:
        return [json.loads(items) for (items,) in cursor.execute(
            f"SELECT items FROM {SCHEMA}.transactions").fetchall() if json.loads(items)]
    finally:
        cursor.close()


def test_frames_and_arrow_rows_of_one_partition_are_one_share_of_one_transaction(
        tmp_path, monkeypatch) -> None:  # fmt: skip
    """Write a: frames (800 rows); write b: Arrow rows of the same partitions (a codec
    given). Before: a's frames were decoded to be copied with b's rows, and over
    TRANSACTION_STAGED_BYTES_MAX (lowered here below a's frames, as a Spark write of
    256 MiB of frames is over the default) the commit was refused with 54000. Now: one
    transaction, one record row whose every partition names a's frames then b's files,
    nothing decoded; each partition holds a's rows then b's."""
    database = _open(tmp_path)
    try:
        _stage(database, "a", [_rows(0, 400), _rows(400, 400)])
        _stage(database, "b", [_rows(800, 10, extra=True)])
        assert _suffixes(database, "a") == ["frames"] and _suffixes(database, "b") == ["arrows"]
        frames_bytes = sum(
            os.path.getsize(os.path.join(bulk_write.for_database(database).root, "a", n))
            for n in os.listdir(os.path.join(bulk_write.for_database(database).root, "a"))
            if n.endswith(".frames"))  # fmt: skip
        monkeypatch.setattr(limits, "TRANSACTION_STAGED_BYTES_MAX", frames_bytes - 1)
        _refuse_decoding(monkeypatch)
        database.committer.checkpoint()
        assert commit_writes(database, 1, ["a", "b"]) == {"status": "committed", "rows": 810}
        assert _partitions(database) == _expected((0, 800), (800, 10))
        (items,) = _records(database)  # one transaction
        assert sorted(partition for _, partition, _ in items) == [0, 1]
        for _, _, by_reference in items:
            kinds = ["frames" if "frames" in r else "files" for r in by_reference["references"]]
            assert kinds == ["frames", "files"]
        assert commit_writes(database, 1, ["a", "b"]) == {"status": "duplicate", "rows": 0}
        bulk = bulk_write.for_database(database)
        database.committer.checkpoint()
        assert os.listdir(bulk.root) == [] and os.listdir(bulk.commits_root) == []
    finally:
        database.close()
    database = Database.open(str(tmp_path / "data"), retention_interval_s=None)
    try:
        assert _partitions(database) == _expected((0, 800), (800, 10))
    finally:
        database.close()


def test_a_stream_whose_rest_is_staged_as_arrow_keeps_its_order_undecoded(
        tmp_path, monkeypatch) -> None:  # fmt: skip
    """One stream: two batches of frames, then a batch with a message group (frames
    cannot hold it: the rest of the stream is an Arrow file sorting after the frames
    file), as the JVM writer's task that meets such a row. Committed as one share per
    partition, frames then rows: each partition keeps the stream's order and the group,
    nothing decoded; a restart before the checkpoint publishes nothing twice."""
    database = _open(tmp_path)
    try:
        _stage(database, "a", [_rows(0, 100), _rows(100, 100), _rows(200, 100, group="g"),
                               _rows(300, 100)])  # fmt: skip
        assert _suffixes(database, "a") == ["frames", "arrows"]
        _refuse_decoding(monkeypatch)
        assert commit_writes(database, 1, ["a"]) == {"status": "committed", "rows": 400}
        assert _partitions(database) == _expected((0, 400))
    finally:
        database.close()
    database = Database.open(str(tmp_path / "data"), retention_interval_s=None)
    try:
        assert _partitions(database) == _expected((0, 400))
        session = database.connect()
        groups = session.execute(
            "SELECT count(*) AS n FROM TOPIC t WHERE message_group_id = 'g'")[-1].table
        session.close()
        assert groups.column("n").to_pylist() == [100]
    finally:
        database.close()


def test_a_write_with_frames_after_arrow_rows_is_decoded_in_its_order(tmp_path) -> None:
    """A write whose Arrow file sorts before a frames file (a COPY of Arrow rows, then
    one of frames): its partitions' rows must keep the order of its files, which one
    share of frames followed by rows cannot: decoded and copied in order, as before."""
    database = _open(tmp_path)
    try:
        _stage(database, "a", [_rows(0, 100, extra=True)], [_rows(100, 100)])
        assert _suffixes(database, "a") == ["arrows", "frames"]
        assert commit_writes(database, 1, ["a"]) == {"status": "committed", "rows": 200}
        assert _partitions(database) == _expected((0, 200))
    finally:
        database.close()


def test_arrow_rows_over_a_partitions_limit_beside_frames_go_as_before(
        tmp_path, monkeypatch) -> None:  # fmt: skip
    """b's Arrow rows are over what one transaction may write to a partition (300): the
    share of frames then rows would be refused at COMMIT (the rows are held to the
    limit), and parts cannot hold frames, so the commit goes the way it went before this
    path: a's frames decoded (under the bound) and copied with b's rows, in parts."""
    monkeypatch.setattr(limits, "BATCH_MESSAGES_MAX", 300)
    monkeypatch.setattr(bulk_publish, "PART_ROWS", 270)
    database = _open(tmp_path)
    try:
        _stage(database, "a", [_rows(0, 200)])
        _stage(database, "b", [_rows(200, 800, extra=True)])
        assert commit_writes(database, 1, ["a", "b"]) == {"status": "committed", "rows": 1000}
        assert _partitions(database) == _expected((0, 1000))
        bulk = bulk_write.for_database(database)
        assert os.listdir(bulk.root) == []
        assert commit_writes(database, 1, ["a", "b"]) == {"status": "duplicate", "rows": 0}
    finally:
        database.close()
