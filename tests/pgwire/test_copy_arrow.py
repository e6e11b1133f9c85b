"""``COPY (query) TO STDOUT (FORMAT arrow)`` against the real server with real clients.

The data of the COPY is one Arrow IPC stream (psycopg: ``b"".join(copy)`` then
``pyarrow.ipc.open_stream``; psql: ``\\copy ... TO 'file'``). Results of tables, topics and
sys views equal a SELECT of the same rows, types included; a topic range read
(``SELECT cols FROM TOPIC t WHERE partition = p AND "offset" >= a AND "offset" < b``) goes
straight to storage (``engine.api.read_range``) and equals the same query run as SQL; its
CopyData messages stay within 1 MiB; errors keep their SQLSTATEs and the connection.
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pyarrow as pa
import pytest

from engine.bulk_read import project_schema
from engine.clock import ManualClock
from engine.database import Database
from sql.pgwire.codec.copy_arrow import CHUNK_BYTES
from sql.pgwire.connection import copy_arrow
from sql.pgwire.server import ServerThread
from tests.pgwire.scram_users import login, scram_server

Connect = Callable[..., psycopg.Connection]
RANGE = 'SELECT {columns} FROM TOPIC {topic} WHERE partition = {p} AND "offset" >= {a} ' \
        'AND "offset" < {b}'  # fmt: skip


def copy_arrow_blocks(connection: psycopg.Connection, query: str) -> tuple[list[bytes], int]:
    """The CopyData payloads of ``COPY (query) TO STDOUT (FORMAT arrow)`` and the row count."""
    cursor = connection.cursor()
    with cursor.copy(f"COPY ({query}) TO STDOUT (FORMAT arrow)") as copy:
        blocks = [bytes(block) for block in copy]
    return blocks, cursor.rowcount


def read_arrow(connection: psycopg.Connection, query: str) -> pa.Table:
    blocks, count = copy_arrow_blocks(connection, query)
    table = pa.ipc.open_stream(b"".join(blocks)).read_all()
    assert count == table.num_rows
    return table


@pytest.fixture
def range_reads(monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    """The storage range reads the server makes (the fast path), as (topic, range, columns)."""
    seen: list[tuple] = []
    original = copy_arrow.read_range

    def counting(session, topic, offsets, columns, **options):
        seen.append((topic, offsets, columns))
        return original(session, topic, offsets, columns, **options)

    monkeypatch.setattr(copy_arrow, "read_range", counting)
    return seen


# -- the general path: any query ---------------------------------------------------------------
def test_a_table_result_equals_select_of_the_same_rows_types_included(connect: Connect) -> None:
    db = connect(autocommit=True)
    db.execute("CREATE TABLE t (k INTEGER, big BIGINT, s VARCHAR, b BLOB, ts TIMESTAMP, "
               "flag BOOLEAN, x DOUBLE)")  # fmt: skip
    db.execute("INSERT INTO t VALUES (1, 10000000000, 'a\tb\n', '\\x00\\xFF'::BLOB, "
               "TIMESTAMP '2024-01-02 03:04:05.678901', true, 1.5), "
               "(2, NULL, NULL, NULL, NULL, NULL, NULL), "
               "(3, -1, '', ''::BLOB, TIMESTAMP '1970-01-01', false, -0.25)")  # fmt: skip
    table = read_arrow(db, "SELECT * FROM t ORDER BY k")
    assert table.schema.types == [pa.int32(), pa.int64(), pa.string(), pa.binary(),
                                  pa.timestamp("us"), pa.bool_(), pa.float64()]  # fmt: skip
    assert table.column_names == ["k", "big", "s", "b", "ts", "flag", "x"]
    selected = db.execute("SELECT * FROM t ORDER BY k").fetchall()
    assert [tuple(row.values()) for row in table.to_pylist()] == selected
    assert selected[0][3] == b"\x00\xff" and selected[1][1:] == (None,) * 6
    # COPY table TO STDOUT (FORMAT arrow): the relation form, all its rows.
    cursor = db.cursor()
    with cursor.copy("COPY t TO STDOUT (FORMAT 'arrow')") as copy:
        whole = pa.ipc.open_stream(b"".join(copy)).read_all()
    assert sorted(whole.to_pylist(), key=lambda r: r["k"]) == table.to_pylist()


def test_topic_and_sys_view_results_equal_select(connect: Connect) -> None:
    db = connect(autocommit=True)
    db.execute("CREATE TOPIC events WITH (min_active_partitions = 2)")
    db.execute("INSERT INTO TOPIC events (data, partition, message_group_id) VALUES "
               "('a', 0, 'g1'), ('b', 1, NULL), ('c', 0, 'g2')")  # fmt: skip
    query = ('SELECT partition, "offset", data, message_group_id, written_at, codec '
             'FROM TOPIC events ORDER BY partition, "offset"')  # fmt: skip
    table = read_arrow(db, query)
    assert [tuple(row.values()) for row in table.to_pylist()] == db.execute(query).fetchall()
    assert table.column("data").to_pylist() == [b"a", b"c", b"b"]
    assert table.schema.field("codec").type == pa.string()  # no dictionary is ever sent
    assert table.schema.field("written_at").type == pa.timestamp("us", tz="Etc/UTC")
    view = "SELECT partition, start_offset, end_offset FROM sys.partitions WHERE topic = 'events'"
    assert [tuple(r.values()) for r in read_arrow(db, view + " ORDER BY 1").to_pylist()] == [
        (0, 0, 2), (1, 0, 1)]  # fmt: skip


def test_nested_and_enum_columns_are_sent_without_dictionaries(connect: Connect) -> None:
    db = connect(autocommit=True)
    db.execute("CREATE TYPE mood AS ENUM ('sad', 'ok')")
    db.execute("CREATE TABLE t (k INTEGER, m mood, ms mood[], l INTEGER[])")
    db.execute("INSERT INTO t VALUES (1, 'ok', ['sad', 'ok'], [1, 2]), (2, NULL, [], NULL)")
    table = read_arrow(db, "SELECT k, m, ms, l, {'a': m} AS s, MAP {'x': m} AS mp "
                           "FROM t ORDER BY k")  # fmt: skip
    assert table.schema.types[1:4] == [pa.string(), pa.list_(pa.string()),
                                       pa.list_(pa.int32())]  # fmt: skip
    assert table.schema.field("s").type == pa.struct([("a", pa.string())])
    assert table.column("ms").to_pylist() == [["sad", "ok"], []]
    assert table.column("l").to_pylist() == [[1, 2], None]
    assert table.column("mp").to_pylist() == [[("x", "ok")], [("x", None)]]


def test_an_empty_result_is_a_stream_of_its_schema_alone(connect: Connect) -> None:
    db = connect(autocommit=True)
    table = read_arrow(db, "SELECT 1 AS one, 'x' AS two WHERE false")
    assert table.num_rows == 0 and table.column_names == ["one", "two"]
    assert table.schema.types == [pa.int32(), pa.string()]


def test_a_large_result_comes_in_several_batches(connect: Connect) -> None:
    db = connect(autocommit=True)
    blocks, count = copy_arrow_blocks(db, "SELECT i, i * 2 AS j FROM range(300000) t(i)")
    reader = pa.ipc.open_stream(b"".join(blocks))
    batches = list(reader)
    assert count == 300000 and sum(b.num_rows for b in batches) == 300000
    assert len(batches) > 1  # streamed batch by batch, not gathered into one
    assert pa.Table.from_batches(batches).column("j").to_pylist()[-1] == 599998


# -- the range read ----------------------------------------------------------------------------
def _fill(db: psycopg.Connection, topic: str, partitions: int, rows: int, size: int = 8) -> None:
    db.execute(f"CREATE TOPIC {topic} WITH (min_active_partitions = {partitions})")
    for p in range(partitions):
        for start in range(0, rows, 10000):
            count = min(10000, rows - start)
            db.execute(f"INSERT INTO TOPIC {topic} (data, partition, message_group_id) "
                       f"SELECT CAST(repeat(CAST(i % 10 AS VARCHAR), {size}) AS BLOB), {p}, "
                       f"CASE WHEN i % 3 = 0 THEN NULL ELSE 'g' || i END "
                       f"FROM range({count}) t(i)")  # fmt: skip


def test_a_range_read_goes_to_storage_and_equals_the_general_path(
        connect: Connect, range_reads: list[tuple]) -> None:  # fmt: skip
    db = connect(autocommit=True)
    _fill(db, "events", partitions=2, rows=500)
    columns = 'data, "offset", message_group_id, written_at, partition'
    fast = read_arrow(db, RANGE.format(columns=columns, topic="events", p=1, a=120, b=470))
    assert len(range_reads) == 1
    topic, offsets, asked = range_reads[0]
    assert (topic, offsets.partition, offsets.start, offsets.end) == ("events", 1, 120, 470)
    assert asked == ["data", "offset", "message_group_id", "written_at", "partition"]
    # Columns in the order asked, with the types engine.bulk_read.project_schema gives.
    assert fast.schema == project_schema(asked)
    general = read_arrow(db, RANGE.format(columns=columns, topic="events", p=1, a=120, b=470)
                         + ' ORDER BY "offset"')  # not the shape: the ordinary query
    assert len(range_reads) == 1
    assert fast.num_rows == 350 and fast.to_pylist() == general.to_pylist()
    assert fast.column("offset").to_pylist() == list(range(120, 470))
    # * is every column of the topic relation, codec as text.
    star = read_arrow(db, RANGE.format(columns="*", topic="events", p=0, a=0, b=500))
    assert len(range_reads) == 2 and range_reads[1][2] is None
    assert star.schema == project_schema(None) and star.num_rows == 500
    assert star.to_pylist() == read_arrow(db, RANGE.format(
        columns="*", topic="events", p=0, a=0, b=500) + ' ORDER BY "offset"').to_pylist()
    # The statement text as written in the brief (offset unquoted) is the same read.
    plain = read_arrow(db, "SELECT data FROM TOPIC events WHERE partition = 1 AND "
                           "offset >= 120 AND offset < 470")  # fmt: skip
    assert plain.column("data") == fast.column("data")
    assert len(range_reads) == 3


def test_a_50k_by_1kib_range_streams_in_bounded_copy_data(
        connect: Connect, range_reads: list[tuple]) -> None:  # fmt: skip
    db = connect(autocommit=True)
    _fill(db, "big", partitions=1, rows=50000, size=1024)
    blocks, count = copy_arrow_blocks(
        db, RANGE.format(columns='"offset", data', topic="big", p=0, a=0, b=50000))
    assert len(range_reads) == 1 and count == 50000
    assert max(len(block) for block in blocks) <= CHUNK_BYTES
    assert sum(map(len, blocks)) > 50000 * 1024 and len(blocks) > 50
    batches = list(pa.ipc.open_stream(b"".join(blocks)))
    assert len(batches) > 1  # the frames go out as they are read, not as one batch
    table = pa.Table.from_batches(batches)
    assert table.column("offset").to_pylist() == list(range(50000))
    assert table.column("data")[7].as_py() == b"7" * 1024


def test_a_range_read_goes_out_in_few_writev_calls_from_the_serialised_batches(
        connect: Connect, range_reads: list[tuple],
        monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """The CopyData of a range read are headers and slices of each serialised batch, sent
    with one writev per ~512 KiB (``output.send_views``): not one send per 64 KiB message
    of a joined copy. The data is the same stream."""
    db = connect(autocommit=True)
    _fill(db, "big", partitions=1, rows=20000, size=1024)
    asked: list[int] = []
    real = os.writev

    def counting(fd: int, buffers: list) -> int:
        asked.append(sum(len(b) for b in buffers))
        return real(fd, buffers)

    monkeypatch.setattr(os, "writev", counting)
    blocks, count = copy_arrow_blocks(
        db, RANGE.format(columns="data", topic="big", p=0, a=0, b=20000))
    assert len(range_reads) == 1 and count == 20000
    assert max(len(block) for block in blocks) <= CHUNK_BYTES
    table = pa.ipc.open_stream(b"".join(blocks)).read_all()
    assert table.num_rows == 20000 and table.column("data")[12345].as_py() == b"5" * 1024
    data_bytes = 20000 * 1024
    assert sum(asked) >= data_bytes  # the batches went out through writev
    assert len(asked) <= data_bytes // (256 * 1024) + 10  # not one call per CopyData


def test_range_errors_keep_the_connection(connect: Connect, range_reads: list[tuple]) -> None:
    db = connect(autocommit=True)
    _fill(db, "events", partitions=1, rows=10)
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="ends at 10"):
        read_arrow(db, RANGE.format(columns="data", topic="events", p=0, a=5, b=11))
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="no partition 7"):
        read_arrow(db, RANGE.format(columns="data", topic="events", p=7, a=0, b=1))
    with pytest.raises(psycopg.errors.UndefinedColumn):  # not a column: the ordinary query
        read_arrow(db, RANGE.format(columns="nope", topic="events", p=0, a=0, b=1))
    assert len(range_reads) == 2
    assert db.execute("SELECT count(*) FROM TOPIC events").fetchone() == (10,)


# -- privileges and retention ------------------------------------------------------------------
@pytest.fixture
def users_server(tmp_path: Path) -> Iterator[ServerThread]:
    with scram_server(tmp_path) as running:
        yield running


_login = login


def test_a_user_without_select_gets_42501_and_keeps_the_connection(
        users_server: ServerThread) -> None:  # fmt: skip
    with _login(users_server, "alice") as alice:
        _fill(alice, "events", partitions=1, rows=5)
        alice.execute("CREATE TABLE secret (k INTEGER)")
        alice.execute("CREATE TABLE shared (k INTEGER); INSERT INTO shared VALUES (4)")
        alice.execute("GRANT SELECT ON shared TO bob")
    with _login(users_server, "bob") as bob:
        for query in (RANGE.format(columns="data", topic="events", p=0, a=0, b=5),
                      "SELECT * FROM TOPIC events", "SELECT * FROM secret"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                read_arrow(bob, query)
            assert bob.execute("SELECT 1").fetchone() == (1,)
        assert read_arrow(bob, "SELECT * FROM shared").to_pylist() == [{"k": 4}]
    with _login(users_server, "alice") as alice:
        alice.execute("GRANT SELECT ON TOPIC events TO bob")
    with _login(users_server, "bob") as bob:
        table = read_arrow(bob, RANGE.format(columns="data", topic="events", p=0, a=0, b=5))
        assert table.num_rows == 5


def test_a_range_cut_by_retention_is_22023(tmp_path: Path) -> None:
    data = str(tmp_path / "data")
    clock = ManualClock(1_700_000_000_000_000)
    database = Database.open(data, clock=clock, retention_interval_s=None)
    session = database.connect()
    session.execute("CREATE TOPIC t WITH (retention_period = Interval('PT1H'))")
    for hour in range(4):  # one message an hour: segments roll, the old ones expire
        session.execute(f"INSERT INTO TOPIC t (data) VALUES ('m{hour}')")
        clock.advance(seconds=3600)
    assert database.run_retention().segments_deleted > 0
    session.close()
    database.close()
    server = ServerThread(data, "127.0.0.1", 0)
    try:
        with psycopg.connect(host="127.0.0.1", port=server.port, user="tester",
                             dbname="topicbase", autocommit=True) as db:  # fmt: skip
            with pytest.raises(psycopg.errors.InvalidParameterValue, match="retention"):
                read_arrow(db, RANGE.format(columns="data", topic="t", p=0, a=0, b=4))
            assert db.execute("SELECT 1").fetchone() == (1,)
    finally:
        server.stop()


# -- refusals ----------------------------------------------------------------------------------
def test_options_other_than_format_are_22023(connect: Connect) -> None:
    db = connect(autocommit=True)
    db.execute("CREATE TABLE t (k INTEGER)")
    for options in ("FORMAT arrow, HEADER", "FORMAT arrow, DELIMITER ','",
                    "FORMAT arrow, FREEZE"):  # fmt: skip
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="FORMAT arrow"), \
                db.cursor().copy(f"COPY (SELECT 1) TO STDOUT ({options})") as copy:  # fmt: skip
            list(copy)
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="FORMAT arrow"), \
                db.cursor().copy(f"COPY t FROM STDIN ({options})") as copy:  # fmt: skip
            copy.write(b"")
    assert db.execute("SELECT count(*) FROM t").fetchone() == (0,)


# -- COPY FROM STDIN (FORMAT arrow) ------------------------------------------------------------
def _stream(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=2)
    return sink.getvalue().to_pybytes()


def copy_in_arrow(connection: psycopg.Connection, statement: str, data: bytes,
                  piece: int = 100) -> int:  # fmt: skip
    cursor = connection.cursor()
    with cursor.copy(f"{statement} FROM STDIN (FORMAT arrow)") as copy:
        for start in range(0, len(data), piece):  # CopyData cut anywhere in the stream
            copy.write(data[start:start + piece])
    return cursor.rowcount


def test_copy_from_arrow_round_trips_a_table_and_writes_a_topic(connect: Connect) -> None:
    db = connect(autocommit=True)
    db.execute("CREATE TABLE t (k INTEGER, big BIGINT, s VARCHAR, b BLOB, ts TIMESTAMP, "
               "flag BOOLEAN, x DOUBLE)")  # fmt: skip
    db.execute("INSERT INTO t VALUES (1, 10000000000, 'a', '\\x00\\xFF'::BLOB, "
               "TIMESTAMP '2024-01-02 03:04:05.678901', true, 1.5), "
               "(2, NULL, NULL, NULL, NULL, NULL, NULL), (3, -1, '', '', NULL, false, 0)")
    out = read_arrow(db, "SELECT * FROM t ORDER BY k")
    db.execute("CREATE TABLE u AS SELECT * FROM t WHERE false")
    assert copy_in_arrow(db, "COPY u", _stream(out)) == 3
    assert db.execute("SELECT * FROM u ORDER BY k").fetchall() == \
        db.execute("SELECT * FROM t ORDER BY k").fetchall()  # fmt: skip
    # Columns by position, cast to the column types; a topic keeps the stream's order.
    db.execute("CREATE TOPIC events WITH (min_active_partitions = 2)")
    rows = pa.table({"payload": pa.array([b"m0", b"m1", b"m2", b"m3"], pa.binary()),
                     "p": pa.array([1, 0, 1, 1], pa.int64())})  # fmt: skip
    assert copy_in_arrow(db, "COPY TOPIC events (data, partition)", _stream(rows), 7) == 4
    assert db.execute('SELECT partition, "offset", data FROM TOPIC events '
                      'ORDER BY partition, "offset"').fetchall() == [
        (0, 0, b"m1"), (1, 0, b"m0"), (1, 1, b"m2"), (1, 2, b"m3")]  # fmt: skip


def test_bad_arrow_copy_data_is_22p04_and_writes_nothing(connect: Connect) -> None:
    db = connect(autocommit=True)
    db.execute("CREATE TABLE t (k INTEGER, s VARCHAR)")
    good = _stream(pa.table({"k": [1, 2, 3], "s": ["a", "b", "c"]}))
    for data in (b"not arrow at all", good[:-20],
                 _stream(pa.table({"k": [1]}))):  # fmt: skip
        with pytest.raises(psycopg.errors.BadCopyFileFormat):
            copy_in_arrow(db, "COPY t", data)
        assert db.execute("SELECT count(*) FROM t").fetchone() == (0,)
    with pytest.raises(psycopg.errors.DataError):  # 'x' is not an INTEGER: DuckDB's cast
        copy_in_arrow(db, "COPY t", _stream(pa.table({"k": ["1", "x"], "s": ["a", "b"]})))
    assert db.execute("SELECT count(*) FROM t").fetchone() == (0,)
    assert copy_in_arrow(db, "COPY t", good) == 3


# -- psql --------------------------------------------------------------------------------------
@pytest.mark.skipif(shutil.which("psql") is None, reason="psql is not installed")
def test_psql_copies_arrow_to_a_file_that_pyarrow_reads(server: ServerThread, connect: Connect,
                                                        tmp_path: Path) -> None:  # fmt: skip
    db = connect(autocommit=True)
    _fill(db, "events", partitions=1, rows=300)
    target = tmp_path / "events.arrows"
    query = RANGE.format(columns='"offset", data', topic="events", p=0, a=100, b=300)
    done = subprocess.run(
        [shutil.which("psql") or "psql", "-X", "-h", "127.0.0.1", "-p", str(server.port),
         "-U", "tester", "-d", "topicbase", "-v", "ON_ERROR_STOP=1",
         "-c", f"\\copy ({query}) TO '{target}' (FORMAT arrow)"],
        capture_output=True, text=True, timeout=60, check=False,
        env={**os.environ, "PGCONNECT_TIMEOUT": "10", "PGSSLMODE": "disable"})  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "COPY 200"
    table = pa.ipc.open_stream(target.read_bytes()).read_all()
    assert table.column("offset").to_pylist() == list(range(100, 300))
    assert table.column("data").to_pylist()[0] == b"0" * 8
    # And back: \copy FROM the file into a table, by position.
    db.execute('CREATE TABLE back ("offset" BIGINT, data BLOB)')
    done = subprocess.run(
        [shutil.which("psql") or "psql", "-X", "-h", "127.0.0.1", "-p", str(server.port),
         "-U", "tester", "-d", "topicbase", "-v", "ON_ERROR_STOP=1",
         "-c", f"\\copy back FROM '{target}' (FORMAT arrow)"],
        capture_output=True, text=True, timeout=60, check=False,
        env={**os.environ, "PGCONNECT_TIMEOUT": "10", "PGSSLMODE": "disable"})  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "COPY 200"
    assert db.execute('SELECT min("offset"), max("offset"), count(*) FROM back').fetchone() == (
        100, 299, 200)  # fmt: skip


def test_timestamps_are_utc_microseconds(connect: Connect) -> None:
    db = connect(autocommit=True)
    db.execute("CREATE TOPIC events")
    db.execute("INSERT INTO TOPIC events (data) VALUES ('x')")
    table = read_arrow(db, RANGE.format(columns="written_at", topic="events", p=0, a=0, b=1))
    assert table.schema.field("written_at").type == pa.timestamp("us", tz="UTC")
    written = table.column("written_at")[0].as_py()
    assert written.tzinfo is not None and written.utcoffset() == dt.timedelta(0)
    assert db.execute("SELECT written_at FROM TOPIC events").fetchone() == (written,)


def test_statement_timeout_ends_a_range_read_between_batches(
        connect: Connect, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """The range read checks ``statement_timeout`` before each batch: past it, the COPY
    ends with 57014 after its data began (no end-of-stream marker), and the connection
    stays usable. The clock is the test's: each look at it is one second later."""
    db = connect(autocommit=True)
    _fill(db, "big", partitions=1, rows=30000, size=64)

    class Clock:
        now = 0.0

        def monotonic(self) -> float:
            self.now += 1.0
            return self.now

    monkeypatch.setattr(copy_arrow, "time", Clock())
    db.execute("SET statement_timeout = '1500ms'")
    with pytest.raises(psycopg.errors.QueryCanceled):
        copy_arrow_blocks(db, RANGE.format(columns="data", topic="big", p=0, a=0, b=30000))
    db.execute("SET statement_timeout = 0")
    assert db.execute("SELECT count(*) FROM TOPIC big").fetchone() == (30000,)
    table = read_arrow(db, RANGE.format(columns="data", topic="big", p=0, a=0, b=30000))
    assert table.num_rows == 30000


def test_a_cancel_request_ends_a_range_read_before_its_next_batch(connect: Connect) -> None:
    """A range read streams batch by batch; a CancelRequest that arrives while it streams
    ends it with 57014 before its next batch (no end-of-stream marker), and the connection
    stays usable. 60 MB do not fit the socket buffers, so the server is still reading
    when the client cancels after its first CopyData."""
    db = connect(autocommit=True)
    _fill(db, "huge", partitions=1, rows=60000, size=1024)
    query = RANGE.format(columns="data", topic="huge", p=0, a=0, b=60000)
    received = 0
    with (
        pytest.raises(psycopg.errors.QueryCanceled, match="user request"),
        db.cursor().copy(f"COPY ({query}) TO STDOUT (FORMAT arrow)") as copy,
    ):
        for block in copy:
            if received == 0:
                db.cancel_safe()  # a CancelRequest on its own connection
            received += len(block)
    assert 0 < received < 60000 * 1024  # the stream stopped early
    assert db.execute("SELECT count(*) FROM TOPIC huge").fetchone() == (60000,)
    assert read_arrow(db, RANGE.format(columns="data", topic="huge", p=0, a=0, b=10)
                      ).num_rows == 10  # fmt: skip


def test_a_missing_topic_is_42p01_and_a_failed_transaction_25p02(connect: Connect) -> None:
    admin = connect(autocommit=True)
    admin.execute("CREATE TOPIC events")
    admin.execute("INSERT INTO TOPIC events (data) VALUES ('a')")
    with pytest.raises(psycopg.errors.UndefinedTable):
        read_arrow(admin, RANGE.format(columns="data", topic="missing", p=0, a=0, b=1))
    db = connect()
    with pytest.raises(psycopg.errors.DivisionByZero):
        db.execute("SELECT 1 / 0")
    with pytest.raises(psycopg.errors.InFailedSqlTransaction):
        read_arrow(db, RANGE.format(columns="data", topic="events", p=0, a=0, b=1))
    db.rollback()
    assert read_arrow(db, RANGE.format(columns="data", topic="events", p=0, a=0, b=1)
                      ).to_pylist() == [{"data": b"a"}]  # fmt: skip


def test_a_range_read_in_a_transaction_open_too_long_is_54000(
        connect: Connect, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """The range read makes the session's duration check, as every statement does."""
    from storage import limits

    admin = connect(autocommit=True)
    _fill(admin, "events", partitions=1, rows=3)
    db = connect()
    assert read_arrow(db, RANGE.format(columns="data", topic="events", p=0, a=0, b=3)
                      ).num_rows == 3  # fmt: skip
    monkeypatch.setattr(limits, "TRANSACTION_DURATION_MS_MAX", -1)
    with pytest.raises(psycopg.errors.ProgramLimitExceeded, match="rolled back"):
        read_arrow(db, RANGE.format(columns="data", topic="events", p=0, a=0, b=3))
