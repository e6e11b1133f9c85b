"""The staged-write protocol over SQL against the real server with psycopg:
``COPY ... FROM STDIN (FORMAT arrow, WRITE_ID 'id')`` stages rows and publishes nothing,
``COMMIT WRITES (...) SINK 's' BATCH n`` publishes a set of staged writes exactly once,
``ABORT WRITES (...)`` discards them. The semantics are the Flight door's ``stage`` and
commit/abort actions (``engine.bulk_write``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pyarrow as pa
import pytest

from engine.bulk_write import WRITES_DIRECTORY
from sql.pgwire.server import ServerThread
from tests.pgwire.scram_users import login, scram_server

Connect = Callable[..., psycopg.Connection]


def arrow_stream(table: pa.Table, max_chunksize: int | None = None) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=max_chunksize)
    return sink.getvalue().to_pybytes()


def stage(connection: psycopg.Connection, target: str, write_id: str, data: bytes,
          piece: int = 65536) -> int:  # fmt: skip
    """COPY ``data`` (cut in CopyData of ``piece`` bytes) under ``write_id``; the rows."""
    cursor = connection.cursor()
    with cursor.copy(f"COPY {target} FROM STDIN (FORMAT arrow, WRITE_ID '{write_id}')") as copy:
        for start in range(0, len(data), piece):
            copy.write(data[start:start + piece])
    return cursor.rowcount


def messages(count: int, start: int = 0, partitions: int | None = None) -> pa.Table:
    columns = {"data": pa.array([f"m{i}".encode() for i in range(start, start + count)],
                                pa.binary())}  # fmt: skip
    if partitions is not None:
        columns["partition"] = pa.array([i % partitions for i in range(count)], pa.int32())
    return pa.table(columns)


def topic_rows(connection: psycopg.Connection, topic: str) -> list[tuple]:
    return connection.execute(
        f'SELECT partition, "offset", data FROM TOPIC {topic} ORDER BY partition, "offset"'
    ).fetchall()


def staged_ids(server: ServerThread) -> list[str]:
    root = os.path.join(server.database.path, WRITES_DIRECTORY)
    return sorted(os.listdir(root)) if os.path.isdir(root) else []


@pytest.fixture
def db(connect: Connect) -> psycopg.Connection:
    connection = connect(autocommit=True)
    connection.execute("CREATE TOPIC events WITH (min_active_partitions = 2)")
    return connection


# -- stage, commit, replay, abort ----------------------------------------------------------
def test_staging_publishes_nothing_and_commit_publishes_every_write_once(
        db: psycopg.Connection, server: ServerThread) -> None:  # fmt: skip
    first = arrow_stream(messages(3000, 0, partitions=2), max_chunksize=700)
    second = arrow_stream(messages(1000, 3000, partitions=2))
    assert stage(db, "TOPIC events (data, partition)", "w-1", first, piece=1000) == 3000
    assert stage(db, "TOPIC events (data, partition)", "w-2", second) == 1000
    assert topic_rows(db, "events") == []
    assert staged_ids(server) == ["w-1", "w-2"]
    row = db.execute("COMMIT WRITES ('w-1', 'w-2') SINK 'spark-1' BATCH 0").fetchone()
    assert row == ("committed", 4000)
    rows = topic_rows(db, "events")
    assert len(rows) == 4000
    for partition in (0, 1):  # each partition keeps the order of the rows sent
        datas = [r[2] for r in rows if r[0] == partition]
        expected = [f"m{i}".encode() for i in range(4000) if i % 2 == partition]
        assert datas == expected
    assert staged_ids(server) == []


def test_a_replayed_commit_is_a_duplicate_and_publishes_nothing(db: psycopg.Connection,
                                                               server: ServerThread) -> None:
    stage(db, "TOPIC events", "w-a", arrow_stream(messages(10)))
    assert db.execute("COMMIT WRITES ('w-a') SINK 's' BATCH 7").fetchone() == ("committed", 10)
    # a re-run of the batch stages its rows again under new ids: the replay drops them
    stage(db, "TOPIC events", "w-b", arrow_stream(messages(10)))
    assert db.execute("COMMIT WRITES ('w-b') SINK 's' BATCH 7").fetchone() == ("duplicate", 0)
    assert len(topic_rows(db, "events")) == 10
    assert staged_ids(server) == []
    # another batch of the same sink is new
    stage(db, "TOPIC events", "w-c", arrow_stream(messages(5)))
    assert db.execute("COMMIT WRITES ('w-c') SINK 's' BATCH 8").fetchone() == ("committed", 5)
    assert len(topic_rows(db, "events")) == 15


def test_an_empty_batch_records_its_sink_and_batch(db: psycopg.Connection) -> None:
    assert db.execute("COMMIT WRITES () SINK 's' BATCH 0").fetchone() == ("committed", 0)
    assert db.execute("COMMIT WRITES () SINK 's' BATCH 0").fetchone() == ("duplicate", 0)


def test_abort_leaves_nothing_staged_nor_published(db: psycopg.Connection,
                                                  server: ServerThread) -> None:
    stage(db, "TOPIC events", "gone-1", arrow_stream(messages(100)))
    stage(db, "TOPIC events", "gone-2", arrow_stream(messages(100)))
    assert db.execute("ABORT WRITES ('gone-1', 'gone-2', 'never')").fetchone() == (2,)
    assert staged_ids(server) == []
    assert db.execute("ABORT WRITES ('gone-1')").fetchone() == (0,)  # a replay: no-op
    with pytest.raises(psycopg.errors.UndefinedObject, match="no staged write gone-1"):
        db.execute("COMMIT WRITES ('gone-1') SINK 's' BATCH 0")
    assert topic_rows(db, "events") == []


def test_a_table_write_is_staged_and_committed(db: psycopg.Connection) -> None:
    db.execute('CREATE TABLE "Totals" (k INTEGER, v BIGINT)')
    table = pa.table({"a": pa.array([1, 2], pa.int32()), "b": pa.array([10, 20], pa.int64())})
    assert stage(db, '"Totals"', "t-1", arrow_stream(table)) == 2
    assert db.execute('SELECT count(*) FROM "Totals"').fetchone() == (0,)
    assert db.execute("COMMIT WRITES ('t-1') SINK 't' BATCH 1").fetchone() == ("committed", 2)
    assert db.execute('SELECT * FROM "Totals" ORDER BY k').fetchall() == [(1, 10), (2, 20)]


def test_a_large_stream_flows_through_the_bounded_pipe(db: psycopg.Connection) -> None:
    """More than the pipe holds (8 MiB), with one batch message larger than the pipe."""
    payload = os.urandom(1024)
    table = pa.table({"data": pa.array([payload] * 12_000, pa.binary())})  # ~12 MiB, 1 batch
    assert stage(db, "TOPIC events", "big", arrow_stream(table), piece=1 << 20) == 12_000
    assert db.execute("COMMIT WRITES ('big') SINK 'b' BATCH 0").fetchone() == ("committed",
                                                                               12_000)
    assert db.execute("SELECT count(*), min(data) = max(data) FROM TOPIC events").fetchone() \
        == (12_000, True)  # fmt: skip


# -- bad input ----------------------------------------------------------------------------
def test_bad_input_is_refused_with_its_sqlstate_and_stages_nothing(
        db: psycopg.Connection, server: ServerThread) -> None:  # fmt: skip
    data = arrow_stream(messages(3))
    with pytest.raises(psycopg.errors.UndefinedTable):
        stage(db, "TOPIC nope", "x-1", data)
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="write id"):
        stage(db, "TOPIC events", "bad id!", data)
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="WRITE_ID"):
        db.execute("COPY TOPIC events FROM STDIN (FORMAT csv, WRITE_ID 'x-2')")
    with pytest.raises(psycopg.errors.BadCopyFileFormat, match="not one Arrow IPC stream"):
        stage(db, "TOPIC events", "x-3", b"definitely not arrow")
    with pytest.raises(psycopg.errors.BadCopyFileFormat, match="2 columns"):
        stage(db, "TOPIC events", "x-4", arrow_stream(messages(3, partitions=2)))
    with pytest.raises(psycopg.errors.BadCopyFileFormat):  # cut short
        stage(db, "TOPIC events", "x-5", data[: len(data) - 20])
    copy_sql = "COPY TOPIC events FROM STDIN (FORMAT arrow, WRITE_ID 'x-6')"
    with pytest.raises(RuntimeError), db.cursor().copy(copy_sql) as copy:
        copy.write(data[:10])  # the client gives up: psycopg sends CopyFail
        raise RuntimeError("client failure")
    assert db.execute("SELECT 1").fetchone() == (1,)  # the connection is usable
    # each failed stream left nothing, not even its write: it was the write's only stream
    # (round 21: a Spark task's failed COPY after its job's abort left an empty write)
    assert staged_ids(server) == []
    with pytest.raises(psycopg.errors.SyntaxError):
        db.execute("COMMIT WRITES ('a', 'a') SINK 's' BATCH 0")
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="sink"):
        db.execute("COMMIT WRITES () SINK '' BATCH 0")
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="write id"):
        db.execute("ABORT WRITES ('no good')")
    with db.transaction():
        with pytest.raises(psycopg.errors.ActiveSqlTransaction):
            db.execute("COMMIT WRITES () SINK 's' BATCH 0")
        raise psycopg.Rollback
    assert topic_rows(db, "events") == []


def test_a_bad_value_fails_the_commit_and_keeps_the_writes(db: psycopg.Connection) -> None:
    """Rows staged as they came (a codec column keeps them out of the frames format)
    keep their Arrow types until the commit, whose cast refuses a bad value."""
    table = messages(3).append_column("partition", pa.array([0, -1, 0]))
    table = table.append_column("codec", pa.array(["raw"] * 3))
    stage(db, "TOPIC events (data, partition, codec)", "v-1", arrow_stream(table))
    with pytest.raises(psycopg.errors.NumericValueOutOfRange):
        db.execute("COMMIT WRITES ('v-1') SINK 'v' BATCH 0")
    assert topic_rows(db, "events") == []
    assert db.execute("ABORT WRITES ('v-1')").fetchone() == (1,)


def test_a_bad_value_of_a_stream_staged_as_frames_fails_its_copy(
        db: psycopg.Connection) -> None:  # fmt: skip
    """Rows that all name their partition are encoded as the partitions' frames when
    staged (``storage.staged_frames``): a bad value fails the COPY with the SQLSTATE the
    commit gave, and nothing of that COPY stays staged (an earlier COPY of the write does)."""
    stage(db, "TOPIC events (data, partition)", "v-1",
          arrow_stream(messages(3).append_column("partition", pa.array([0, 1, 0]))))
    with pytest.raises(psycopg.errors.NumericValueOutOfRange):
        stage(db, "TOPIC events (data, partition)", "v-1",
              arrow_stream(messages(3).append_column("partition", pa.array([0, -1, 0]))))
    assert db.execute("COMMIT WRITES ('v-1') SINK 'v' BATCH 0").fetchone() == ("committed", 3)
    assert len(topic_rows(db, "events")) == 3


# -- privileges -----------------------------------------------------------------------------
@pytest.fixture
def users_server(tmp_path: Path) -> Iterator[ServerThread]:
    with scram_server(tmp_path) as running:
        yield running


_login = login


def test_staging_needs_insert_and_a_write_is_its_owners(users_server: ServerThread) -> None:
    data = arrow_stream(messages(4))
    with _login(users_server, "alice") as alice:
        alice.execute("CREATE TOPIC events")
        stage(alice, "TOPIC events", "alices", data)
    with _login(users_server, "bob") as bob:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            stage(bob, "TOPIC events", "bobs", data)
        assert bob.execute("SELECT 1").fetchone() == (1,)
        for statement in ("COMMIT WRITES ('alices') SINK 'b' BATCH 0",
                          "ABORT WRITES ('alices')"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="another user"):
                bob.execute(statement)
    with _login(users_server, "alice") as alice:
        alice.execute("GRANT INSERT ON TOPIC events TO bob")
    with _login(users_server, "bob") as bob:
        assert stage(bob, "TOPIC events", "bobs", data) == 4
        assert bob.execute("COMMIT WRITES ('bobs') SINK 'b' BATCH 0").fetchone() == (
            "committed", 4)
    with _login(users_server, "alice") as alice:
        alice.execute("REVOKE INSERT ON TOPIC events FROM bob")
        assert alice.execute("SELECT count(*) FROM TOPIC events").fetchone() == (4,)
        assert alice.execute("COMMIT WRITES ('alices') SINK 'a' BATCH 0").fetchone() == (
            "committed", 4)


def test_staged_copies_collect_abandoned_writes(db: psycopg.Connection, server: ServerThread,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A server without the Flight door still deletes writes nobody committed or aborted."""
    from sql.pgwire.connection import copy_staged

    stage(db, "TOPIC events", "forgotten", arrow_stream(messages(10)))
    session = server.database.connect()
    writes = session.bulk_writes()
    monkeypatch.setattr(writes, "abandon_after_s", 0.0)  # everything idle is abandoned now
    monkeypatch.setattr(copy_staged, "_last_collect", [float("-inf")])
    stage(db, "TOPIC events", "fresh", arrow_stream(messages(5)))  # collects first
    session.close()
    assert staged_ids(server) == ["fresh"]
    with pytest.raises(psycopg.errors.UndefinedObject):
        db.execute("COMMIT WRITES ('forgotten') SINK 'f' BATCH 0")
    assert db.execute("COMMIT WRITES ('fresh') SINK 'f' BATCH 0").fetchone() == ("committed", 5)
    stage(db, "TOPIC events", "later", arrow_stream(messages(5)))  # within the minute: kept
    assert staged_ids(server) == ["later"]
