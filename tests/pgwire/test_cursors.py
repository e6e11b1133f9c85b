"""SQL cursors through the wire server: psycopg 3 named (server-side) cursors and the
DECLARE / FETCH / MOVE / CLOSE statements themselves, with PostgreSQL's errors."""

from __future__ import annotations

import gc
import os
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pyarrow as pa
import pytest

from engine.streams import RowStream
from sql.pgwire.connection import spill
from sql.pgwire.connection.cursors import Fetch, parse_cursor_command
from sql.pgwire.connection.result_stream import ResultStream
from sql.pgwire.limits import ServerLimits
from sql.pgwire.server import ServerThread
from storage.errors import LimitExceededError

Connect = Callable[..., psycopg.Connection]


NUMBERS = [(i, f"v{i}") for i in range(1, 26)]


def _numbers_connection(server: ServerThread, **options: object) -> psycopg.Connection:
    return psycopg.connect(host="127.0.0.1", port=server.port, user="tester",
                           dbname="topicbase", connect_timeout=10, **options)  # fmt: skip


@pytest.fixture(scope="module")
def numbers_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    """One server for the tests that only read table n (1..25) through cursors, each on
    a connection of its own (a cursor lives in its session); at the end n and the
    server's tables are as they were."""
    running = ServerThread(str(tmp_path_factory.mktemp("numbers") / "data"), "127.0.0.1", 0)
    with _numbers_connection(running, autocommit=True) as admin:
        admin.execute("CREATE TABLE n AS SELECT range::INTEGER AS i, 'v' || range AS label "
                      "FROM range(1, 26)")  # fmt: skip
    yield running
    with _numbers_connection(running, autocommit=True) as admin:
        assert admin.execute("SELECT i, label FROM n ORDER BY i").fetchall() == NUMBERS
        tables = admin.execute("SELECT table_name FROM information_schema.tables "
                               "WHERE table_schema = 'main'").fetchall()  # fmt: skip
        assert tables == [("n",)]
    running.stop()


@pytest.fixture
def numbers(numbers_server: ServerThread) -> Iterator[psycopg.Connection]:
    """A new connection (not autocommit) to the server whose table n holds 1..25."""
    connection = _numbers_connection(numbers_server)
    yield connection
    connection.close()


def test_named_cursor_fetches_in_itersize_steps(numbers: psycopg.Connection) -> None:
    with numbers.cursor(name="walker") as cursor:
        cursor.itersize = 7
        cursor.execute("SELECT i, label FROM n WHERE i > %s ORDER BY i", [0])
        assert [d.name for d in cursor.description] == ["i", "label"]
        assert cursor.fetchone() == (1, "v1")
        assert cursor.fetchmany(3) == [(2, "v2"), (3, "v3"), (4, "v4")]
        rest = list(cursor)
        assert [row[0] for row in rest] == list(range(5, 26))
        assert cursor.fetchall() == []
    numbers.commit()


def test_named_cursor_scroll_absolute_and_relative(numbers: psycopg.Connection) -> None:
    with numbers.cursor(name="scroller", scrollable=True) as cursor:
        cursor.execute("SELECT i FROM n ORDER BY i")
        cursor.fetchmany(10)
        cursor.scroll(-5)
        assert cursor.fetchone() == (6,)
        cursor.scroll(0, mode="absolute")
        assert cursor.fetchone() == (1,)
        cursor.scroll(20, mode="absolute")
        assert cursor.fetchall() == [(21,), (22,), (23,), (24,), (25,)]
    numbers.commit()


def test_no_scroll_cursor_refuses_backward_moves_with_55000(numbers: psycopg.Connection) -> None:
    with numbers.cursor(name="forward_only", scrollable=False) as cursor:
        cursor.execute("SELECT i FROM n ORDER BY i")
        cursor.fetchmany(3)
        with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="forward"):
            cursor.scroll(-1)
    numbers.rollback()


def test_binary_named_cursor(numbers: psycopg.Connection) -> None:
    with numbers.cursor(name="binary_walker", binary=True) as cursor:
        cursor.execute("SELECT i, label FROM n WHERE i <= 3 ORDER BY i")
        assert cursor.fetchall() == [(1, "v1"), (2, "v2"), (3, "v3")]
    numbers.commit()


def test_with_hold_cursor_survives_commit(numbers: psycopg.Connection) -> None:
    with numbers.cursor(name="held", withhold=True) as cursor:
        cursor.execute("SELECT i FROM n ORDER BY i")
        numbers.commit()
        assert cursor.fetchmany(2) == [(1,), (2,)]
        numbers.commit()
        assert len(cursor.fetchall()) == 23


def test_cursor_without_hold_ends_with_its_transaction(numbers: psycopg.Connection) -> None:
    numbers.execute("DECLARE gone CURSOR FOR SELECT i FROM n")
    assert numbers.execute("FETCH 2 FROM gone").fetchall() == [(1,), (2,)]
    numbers.commit()
    with pytest.raises(psycopg.errors.InvalidCursorName, match='cursor "gone" does not exist'):
        numbers.execute("FETCH 1 FROM gone")
    numbers.rollback()


def test_declare_outside_a_transaction_block_is_25p01(connect: Connect) -> None:
    connection = connect(autocommit=True)
    with pytest.raises(psycopg.errors.NoActiveSqlTransaction):
        connection.execute("DECLARE c CURSOR FOR SELECT 1")
    connection.execute("DECLARE c CURSOR WITH HOLD FOR SELECT 1 AS one")
    assert connection.execute("FETCH ALL FROM c").fetchall() == [(1,)]
    connection.execute("CLOSE c")


def test_duplicate_and_undefined_cursor_errors_fail_the_transaction(
    numbers: psycopg.Connection,
) -> None:
    numbers.execute("DECLARE dup CURSOR FOR SELECT i FROM n")
    with pytest.raises(psycopg.errors.DuplicateCursor, match='cursor "dup" already exists'):
        numbers.execute("DECLARE dup CURSOR FOR SELECT i FROM n")
    with pytest.raises(psycopg.errors.InFailedSqlTransaction):
        numbers.execute("FETCH 1 FROM dup")
    numbers.rollback()
    with pytest.raises(psycopg.errors.InvalidCursorName):
        numbers.execute("CLOSE nobody")
    numbers.rollback()
    with pytest.raises(psycopg.errors.InvalidCursorName):
        numbers.execute("MOVE 1 IN nobody")
    numbers.rollback()


def test_fetch_directions_and_move_tags(numbers: psycopg.Connection) -> None:
    cursor = numbers.cursor()
    cursor.execute("DECLARE c SCROLL CURSOR FOR SELECT i FROM n ORDER BY i")
    assert cursor.execute("FETCH LAST FROM c").fetchall() == [(25,)]
    assert cursor.execute("FETCH PRIOR FROM c").fetchall() == [(24,)]
    assert cursor.execute("FETCH BACKWARD 3 FROM c").fetchall() == [(23,), (22,), (21,)]
    assert cursor.execute("FETCH ABSOLUTE 2 FROM c").fetchall() == [(2,)]
    assert cursor.execute("FETCH RELATIVE 3 FROM c").fetchall() == [(5,)]
    assert cursor.execute("FETCH FIRST FROM c").fetchall() == [(1,)]
    assert cursor.execute("FETCH NEXT FROM c").fetchall() == [(2,)]
    assert cursor.execute("FETCH 0 FROM c").fetchall() == [(2,)]
    assert cursor.execute("FETCH RELATIVE 0 FROM c").fetchall() == [(2,)]
    cursor.execute("MOVE FORWARD 10 IN c")
    assert cursor.statusmessage == "MOVE 10"
    assert cursor.execute("FETCH c").fetchall() == [(13,)]
    assert cursor.execute("FETCH FORWARD ALL FROM c").rowcount == 12
    assert cursor.statusmessage == "FETCH 12"
    assert cursor.execute("FETCH 5 FROM c").fetchall() == []
    assert cursor.execute("FETCH BACKWARD ALL FROM c").rowcount == 25
    cursor.execute("CLOSE ALL")
    with pytest.raises(psycopg.errors.InvalidCursorName):
        cursor.execute("FETCH 1 FROM c")
    numbers.rollback()


def test_cursor_over_a_topic_commits_consumer_offsets_with_the_transaction(
    connect: Connect,
) -> None:
    admin = connect(autocommit=True)
    admin.execute("CREATE TOPIC events (CONSUMER reader)")
    admin.execute("INSERT INTO TOPIC events (data) VALUES ('a'), ('b'), ('c')")
    connection = connect()
    with connection.cursor(name="consume") as cursor:
        cursor.execute("SELECT CAST(data AS VARCHAR) AS text FROM TOPIC events "
                       "WITH (consumer = 'reader')")  # fmt: skip
        assert [row[0] for row in cursor] == ["a", "b", "c"]
    connection.commit()
    again = connection.execute("SELECT count(*) FROM TOPIC events WITH (consumer = 'reader')")
    assert again.fetchone() == (0,)
    connection.commit()


def test_declare_with_a_failing_query_reports_its_error(numbers: psycopg.Connection) -> None:
    with pytest.raises(psycopg.errors.UndefinedTable), numbers.cursor(name="broken") as cursor:
        cursor.execute("SELECT * FROM no_such_table")
    numbers.rollback()
    with pytest.raises(psycopg.errors.SyntaxError):
        numbers.execute("DECLARE CURSOR FOR SELECT 1")
    numbers.rollback()


def test_parse_fetch_forms() -> None:
    assert parse_cursor_command("FETCH c") == Fetch("c", False, "forward", 1)
    assert parse_cursor_command('FETCH FORWARD 5 FROM "My C"') == Fetch("My C", False,
                                                                        "forward", 5)
    assert parse_cursor_command("FETCH -2 IN c") == Fetch("c", False, "backward", 2)
    assert parse_cursor_command("MOVE ABSOLUTE -1 FROM c") == Fetch("c", True, "absolute", -1)
    assert parse_cursor_command("FETCH ALL c") == Fetch("c", False, "forward", None)


def _psql(server: ServerThread, *arguments: str) -> subprocess.CompletedProcess[str]:
    command = ["/usr/bin/psql", "-X", "-At", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1",
               "-p", str(server.port), "-U", "tester", "-d", "topicbase", *arguments]  # fmt: skip
    return subprocess.run(command, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PGCONNECT_TIMEOUT": "10"})  # fmt: skip


def test_psql_cursor_script_and_fetch_count(server: ServerThread) -> None:
    script = ("BEGIN; DECLARE c CURSOR FOR SELECT range AS i FROM range(5); FETCH 2 FROM c; "
              "MOVE 1 IN c; FETCH ALL FROM c; COMMIT")  # fmt: skip
    ran = _psql(server, "-c", script)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.splitlines() == ["BEGIN", "DECLARE CURSOR", "0", "1", "MOVE 1", "3", "4",
                                       "COMMIT"]  # fmt: skip
    paged = _psql(server, "-v", "FETCH_COUNT=3", "-c", "SELECT range AS i FROM range(7)")
    assert paged.returncode == 0, paged.stderr
    assert paged.stdout.splitlines() == [str(i) for i in range(7)]
    failed = _psql(server, "-c", "BEGIN; FETCH 1 FROM nowhere; COMMIT")
    assert failed.returncode != 0
    assert 'cursor "nowhere" does not exist' in failed.stderr


# -- WITH HOLD and the outcome of the declaring transaction -------------------------------------
def test_with_hold_cursor_of_a_rolled_back_transaction_is_gone(
    numbers: psycopg.Connection,
) -> None:
    numbers.execute("DECLARE undone CURSOR WITH HOLD FOR SELECT i FROM n ORDER BY i")
    assert numbers.execute("FETCH 2 FROM undone").fetchall() == [(1,), (2,)]
    numbers.rollback()
    with pytest.raises(psycopg.errors.InvalidCursorName, match='"undone" does not exist'):
        numbers.execute("FETCH 1 FROM undone")
    numbers.rollback()
    # A COMMIT of a failed transaction rolls it back: the cursor goes with it.
    numbers.execute("DECLARE failed_with CURSOR WITH HOLD FOR SELECT i FROM n")
    with pytest.raises(psycopg.errors.UndefinedTable):
        numbers.execute("SELECT * FROM no_such_table")
    numbers.commit()
    with pytest.raises(psycopg.errors.InvalidCursorName):
        numbers.execute("CLOSE failed_with")
    numbers.rollback()
    # The name is free again, and a committed WITH HOLD cursor outlives later rollbacks.
    numbers.execute("DECLARE undone CURSOR WITH HOLD FOR SELECT i FROM n ORDER BY i")
    numbers.commit()
    assert numbers.execute("FETCH 1 FROM undone").fetchall() == [(1,)]
    numbers.rollback()
    assert numbers.execute("FETCH 1 FROM undone").fetchall() == [(2,)]
    numbers.execute("CLOSE undone")
    numbers.commit()


def test_with_hold_cursor_closed_in_its_transaction_stays_closed(
    numbers: psycopg.Connection,
) -> None:
    numbers.execute("DECLARE brief CURSOR WITH HOLD FOR SELECT i FROM n")
    numbers.execute("CLOSE brief")
    numbers.commit()
    with pytest.raises(psycopg.errors.InvalidCursorName):
        numbers.execute("FETCH 1 FROM brief")
    numbers.rollback()


def test_with_hold_cursor_of_a_commit_that_fails_is_gone(server: ServerThread) -> None:
    """A COMMIT refused by validation (40001) rolls the transaction back: its WITH HOLD
    cursor goes too, and a Describe of it (psycopg's named cursor) says so."""
    setup = psycopg.connect(host="127.0.0.1", port=server.port, user="tester", autocommit=True)
    setup.execute("CREATE TOPIC src (CONSUMER c)")
    setup.execute("INSERT INTO TOPIC src (data) VALUES ('a'), ('b')")
    first = psycopg.connect(host="127.0.0.1", port=server.port, user="tester")
    other = psycopg.connect(host="127.0.0.1", port=server.port, user="tester")
    try:
        first.execute("SELECT data FROM TOPIC src WITH (consumer = 'c')").fetchall()
        first.execute("DECLARE doomed CURSOR WITH HOLD FOR SELECT 1 AS one")
        other.execute("SELECT data FROM TOPIC src WITH (consumer = 'c')").fetchall()
        other.commit()  # moves c's offset first: first's read range is now stale
        with pytest.raises(psycopg.errors.SerializationFailure):
            first.commit()
        with pytest.raises(psycopg.errors.InvalidCursorName):
            first.cursor(name="doomed").fetchone()  # psycopg describes the portal first
        first.rollback()
    finally:
        for connection in (first, other, setup):
            connection.close()


def test_psql_with_hold_cursor_and_rollback(server: ServerThread) -> None:
    kept = _psql(server, "-c", "BEGIN; DECLARE c CURSOR WITH HOLD FOR SELECT range AS i "
                               "FROM range(3); COMMIT; FETCH ALL FROM c")  # fmt: skip
    assert kept.returncode == 0, kept.stderr
    assert kept.stdout.splitlines() == ["BEGIN", "DECLARE CURSOR", "COMMIT", "0", "1", "2"]
    dropped = _psql(server, "-c", "BEGIN; DECLARE c CURSOR WITH HOLD FOR SELECT 1; ROLLBACK; "
                                  "FETCH ALL FROM c")  # fmt: skip
    assert dropped.returncode != 0
    assert 'cursor "c" does not exist' in dropped.stderr


# -- large results: read in batches, spilled, other statements in between ---------------------
@pytest.fixture
def big(connect: Connect) -> psycopg.Connection:
    """A connection (not autocommit) with table big holding 200,000 rows (~12 MB as Arrow)."""
    admin = connect(autocommit=True)
    admin.execute("CREATE TABLE big AS SELECT range AS i, repeat('x', 40) || range AS s "
                  "FROM range(200000)")  # fmt: skip
    return connect()


def _spill_mappings() -> int:
    """Memory-mapped spill files of this process (the server runs in it), all unlinked."""
    with open("/proc/self/maps") as maps:
        lines = [line for line in maps if spill.SPILL_PREFIX in line]
    assert all(line.rstrip().endswith("(deleted)") for line in lines)
    return len(lines)


def test_large_cursor_spills_and_other_statements_run_between_fetches(
    big: psycopg.Connection,
) -> None:
    before = _spill_mappings()
    big.execute("DECLARE walk CURSOR FOR SELECT i, s FROM big ORDER BY i")
    assert _spill_mappings() == before + 1  # the rows live in a mapped, unlinked file
    assert big.execute("FETCH 3 FROM walk").fetchall() == [(i, "x" * 40 + str(i))
                                                           for i in range(3)]  # fmt: skip
    # Other statements of the same session between FETCHes, COPY and a second cursor too.
    assert big.execute("SELECT count(*) FROM big").fetchone() == (200000,)
    big.execute("CREATE TABLE other (a INTEGER)")
    big.execute("INSERT INTO other VALUES (1)")
    with big.cursor().copy("COPY (SELECT i FROM big WHERE i < 5) TO STDOUT") as copy:
        assert b"".join(bytes(chunk) for chunk in copy) == b"0\n1\n2\n3\n4\n"
    big.execute("DECLARE second CURSOR FOR SELECT i FROM big WHERE i % 50000 = 0 ORDER BY i")
    assert big.execute("FETCH ALL FROM second").fetchall() == [(0,), (50000,), (100000,),
                                                               (150000,)]  # fmt: skip
    assert big.execute("FETCH 2 FROM walk").fetchall() == [(3, "x" * 40 + "3"),
                                                           (4, "x" * 40 + "4")]  # fmt: skip
    big.execute("MOVE FORWARD 199990 IN walk")
    assert big.execute("FETCH ALL FROM walk").fetchall() == [(199995 + k, "x" * 40 +
                                                              str(199995 + k)) for k in range(5)]
    assert big.execute("FETCH ABSOLUTE 100000 FROM walk").fetchone() == (99999, "x" * 40 +
                                                                         "99999")  # fmt: skip
    big.execute("CLOSE walk")
    big.commit()
    gc.collect()
    assert _spill_mappings() == before  # closed: the mapping is gone


def test_named_cursor_over_a_large_result_with_psycopg(big: psycopg.Connection) -> None:
    with big.cursor(name="pages") as cursor:
        cursor.itersize = 5000
        cursor.execute("SELECT i FROM big WHERE i >= %s ORDER BY i", [100])
        total = 0
        for expected, (value,) in enumerate(cursor, start=100):
            assert value == expected
            total += 1
        assert total == 199900
    big.commit()


def test_spill_collect_keeps_small_results_in_memory_and_maps_large_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    table = pa.table({"i": pa.array(range(100000), pa.int64()),
                      "s": pa.array([f"value {k}" for k in range(100000)])})  # fmt: skip
    schema = table.schema

    def stream(source: pa.Table, closed: list[bool]) -> ResultStream:
        rows = RowStream(schema, (), None, iter(source.to_batches(max_chunksize=8192)),
                         lambda: closed.append(True))  # fmt: skip
        return ResultStream(rows, [20, 25], 10**9)

    closed: list[bool] = []
    small = spill.collect(stream(table.slice(0, 10), closed))
    assert small.equals(table.slice(0, 10)) and closed == [True]
    allocated = pa.total_allocated_bytes()
    large = spill.collect(stream(table, closed), spill_bytes=100_000)
    assert large.equals(table) and closed == [True, True]
    assert pa.total_allocated_bytes() - allocated < table.nbytes // 4  # mapped, not on the heap
    assert list(tmp_path.iterdir()) == []  # unlinked at once
    empty = spill.collect(stream(table.slice(0, 0), closed))
    assert empty.num_rows == 0 and empty.schema == schema

    def failing() -> Iterator[pa.RecordBatch]:
        yield from table.to_batches(max_chunksize=8192)[:5]
        raise LimitExceededError("over")

    failed: list[bool] = []
    with pytest.raises(LimitExceededError):
        rows = RowStream(schema, (), None, failing(), lambda: failed.append(True))
        spill.collect(ResultStream(rows, [20, 25], 10**9), spill_bytes=100_000)
    assert failed == [True] and list(tmp_path.iterdir()) == []


def test_declare_holds_batches_within_the_result_limit_and_fetch_is_checked(
    tmp_path: Path,
) -> None:
    running = ServerThread(str(tmp_path / "data"), "127.0.0.1", 0,
                           limits=ServerLimits(result_bytes_max=1_000_000))  # fmt: skip
    try:
        with psycopg.connect(host="127.0.0.1", port=running.port, user="tester",
                             connect_timeout=10) as connection:  # fmt: skip
            connection.execute("CREATE TABLE wide AS SELECT range AS i, repeat('x', 40) || "
                               "range AS s FROM range(100000)")  # fmt: skip
            connection.commit()
            connection.execute("DECLARE c CURSOR FOR SELECT * FROM wide ORDER BY i")  # ~6 MB
            assert len(connection.execute("FETCH 1000 FROM c").fetchall()) == 1000
            assert connection.execute("FETCH 1 FROM c").fetchone() == (1000, "x" * 40 + "1000")
            with pytest.raises(psycopg.errors.ProgramLimitExceeded):
                connection.execute("FETCH ALL FROM c")  # the rest at once is over the limit
            connection.rollback()
            with pytest.raises(psycopg.errors.ProgramLimitExceeded, match="batch"):
                connection.execute("DECLARE w CURSOR FOR SELECT repeat('y', 300) AS s "
                                   "FROM range(10000)")  # fmt: skip
            connection.rollback()
            assert connection.execute("SELECT count(*) FROM wide").fetchone() == (100000,)
    finally:
        running.stop()
