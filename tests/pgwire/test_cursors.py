"""SQL cursors through the wire server: psycopg 3 named (server-side) cursors and the
DECLARE / FETCH / MOVE / CLOSE statements themselves, with PostgreSQL's errors."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable

import psycopg
import pytest

from sql.pgwire.cursors import Fetch, parse_cursor_command
from sql.pgwire.server import ServerThread

Connect = Callable[..., psycopg.Connection]


@pytest.fixture
def numbers(connect: Connect) -> psycopg.Connection:
    """A connection (not autocommit) with table n holding 1..25."""
    admin = connect(autocommit=True)
    admin.execute("CREATE TABLE n AS SELECT range::INTEGER AS i, 'v' || range AS label "
                  "FROM range(1, 26)")  # fmt: skip
    return connect()


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
