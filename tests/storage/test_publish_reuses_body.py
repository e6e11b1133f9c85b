"""A transaction's publish reuses the body its staging frame holds (no second encode).

What must hold: the partition frame built from a given body is, byte for byte, the
frame the encoder makes from the batch (one format: readers, recovery and check know
only it); a publish whose batch loses duplicates writes the filtered batch, not the
given body; a commit (of either kind) hands the staged bodies to the publish.
"""

from __future__ import annotations

import os

import pyarrow as pa
import pytest

from engine.database import Database
from storage import record_batch
from storage.clock import ManualClock
from storage.config import FsyncPolicy, TopicConfig
from storage.fs import FileSystem
from storage.partition_log import PartitionLog
from storage.record_batch import FrameEncoder, build_wire_batch, serialize_body_buffer


def _joined(parts: list) -> bytes:
    return b"".join(bytes(memoryview(part)) for part in parts)


def test_a_frame_from_a_given_body_is_the_encoded_frame() -> None:
    small = build_wire_batch([b"a", b"bc"], seq_no=[0, 1], producer_id="p")
    large = build_wire_batch([b"x" * 1024] * 600, seq_no=list(range(600)), producer_id="p")
    assert large.get_total_buffer_size() > record_batch._JOINED_BELOW_BYTES  # zero-copy path
    for batch in (small, large, large.slice(3)):
        encoded, header = FrameEncoder().encode(
            batch, base_offset=7, written_at_us=11, transaction_id=13
        )
        body = serialize_body_buffer(batch)
        reused, reused_header = FrameEncoder().encode(
            batch, base_offset=7, written_at_us=11, transaction_id=13, body=body
        )
        assert _joined(reused) == _joined(encoded)
        assert reused_header == header
        assert any(part is body for part in reused)  # the body itself, not a copy


def _log(tmp_path: os.PathLike) -> PartitionLog:
    directory = os.path.join(str(tmp_path), "p0")
    os.makedirs(directory)
    config = TopicConfig(fsync_policy=FsyncPolicy.NEVER, retention_ms=None)
    return PartitionLog(FileSystem(), directory, 0, config, ManualClock())


def test_a_publish_that_drops_duplicates_does_not_write_the_given_body(tmp_path) -> None:
    log = _log(tmp_path)
    first = build_wire_batch([b"a", b"b"], seq_no=[1, 2], producer_id="p")
    log.append(first)
    again = build_wire_batch([b"a", b"b", b"c"], seq_no=[1, 2, 3], producer_id="p")
    body = serialize_body_buffer(again)  # the whole batch's: must not be written
    results = log.publish_transactional([again], 99, [body])
    assert results[0].written_count == 1
    read = log.read(0, max_messages=10)
    data = [v for b in read.batches for v in b.column("data").to_pylist()]
    assert data == [b"a", b"b", b"c"]
    log.close()


@pytest.mark.parametrize("kind", ["topic-only", "table"])
def test_a_commit_publishes_the_staged_bodies(tmp_path, monkeypatch, kind) -> None:
    database = Database.open(str(tmp_path / "data"))
    try:
        session = database.connect()
        session.execute("CREATE TOPIC a (CONSUMER c); CREATE TOPIC b; CREATE TABLE t (v INT)")
        session.execute("INSERT INTO TOPIC a (data) SELECT 'm' || i FROM range(50) t(i)")
        given: list[pa.Buffer | None] = []
        original = PartitionLog.publish_transactional

        def spy(self, batches, transaction_id, bodies=None):  # type: ignore[no-untyped-def]
            given.extend(bodies or [None])
            return original(self, batches, transaction_id, bodies)

        monkeypatch.setattr(PartitionLog, "publish_transactional", spy)
        session.execute("BEGIN")
        # Not the read's data alone (that one is not staged but named by reference to its
        # source ranges: engine.moved_refs, tests/engine/test_moved_refs.py): staged.
        session.execute(
            "INSERT INTO TOPIC b (data, message_group_id) SELECT data, 'g' FROM TOPIC a "
            "WITH (consumer = 'c')"
        )
        if kind == "table":
            session.execute("INSERT INTO t VALUES (1)")  # commits through DuckDB
        session.execute("COMMIT")
        assert len(given) == 1 and given[0] is not None
        result = session.execute(
            "SELECT CAST(data AS VARCHAR) AS d FROM TOPIC b WITH (max_messages = 1000)"
        )[-1]
        assert result.table is not None
        assert sorted(result.table.column("d").to_pylist()) == sorted(f"m{i}" for i in range(50))
        session.close()
    finally:
        database.close()


def _bare_log(tmp_path) -> PartitionLog:
    directory = os.path.join(str(tmp_path), "p0")
    os.makedirs(directory, exist_ok=True)
    config = TopicConfig(fsync_policy=FsyncPolicy.NEVER, retention_ms=None)
    return PartitionLog(FileSystem(), directory, 0, config, ManualClock())


def test_server_assigned_seq_nos_reach_the_frame_not_the_staged_body(tmp_path) -> None:
    """A producer's batch without seq_nos is numbered by the producer state at publish
    (last + 1, …): the frame must hold those numbers, so the given (staged, unnumbered)
    body cannot be reused; after a crash the producer's last seq_no comes back from the
    frames, and a resend is a duplicate."""
    log = _bare_log(tmp_path)
    batch = build_wire_batch([b"x1", b"x2"], producer_id="p")
    log.publish_transactional([batch], 99, [serialize_body_buffer(batch)])
    assert log.last_seq_no("p") == 1
    read = log.read(0)
    assert [s for b in read.batches for s in b.column("seq_no").to_pylist()] == [0, 1]
    again = _bare_log(tmp_path)  # reopened without a clean close: replay of the frames
    assert again.last_seq_no("p") == 1


def test_a_transaction_numbers_a_producers_messages_as_autocommit_does(tmp_path) -> None:
    database = Database.open(str(tmp_path / "data"))
    session = database.connect()
    session.execute("CREATE TOPIC t WITH (min_active_partitions = 1)")
    session.execute("BEGIN")
    session.execute("INSERT INTO TOPIC t (data, producer_id) VALUES ('x1', 'p'), ('x2', 'p')")
    session.execute("COMMIT")
    result = session.execute("SELECT seq_no FROM TOPIC t")[-1]
    assert result.table is not None
    assert result.table.column("seq_no").to_pylist() == [0, 1]
    session.close()
    database.close()
