"""Tests of sql/dbapi.py: PEP 249 connections and cursors over an in-process database."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import sql
from sql import dbapi

ConnectionFactory = Callable[..., dbapi.Connection]


@pytest.fixture
def data_dir(tmp_path: Path) -> str:
    return str(tmp_path / "data")


@pytest.fixture
def connect(data_dir: str) -> Iterator[ConnectionFactory]:
    """Opens connections on the test's data directory and closes them all afterwards."""
    opened: list[dbapi.Connection] = []

    def open_connection(autocommit: bool = False) -> dbapi.Connection:
        connection = sql.connect(data_dir, autocommit=autocommit)
        opened.append(connection)
        return connection

    yield open_connection
    for connection in reversed(opened):
        connection.close()


@pytest.fixture
def admin(connect: ConnectionFactory) -> dbapi.Connection:
    """An autocommit connection with a table ``items`` and a topic ``events``."""
    connection = connect(autocommit=True)
    connection.execute("CREATE TABLE items (id INTEGER PRIMARY KEY, name VARCHAR)")
    connection.execute("CREATE TOPIC events (CONSUMER reader) WITH (min_active_partitions = 1)")
    return connection


def count(connection: dbapi.Connection, query: str) -> int:
    row = connection.execute(query).fetchone()
    assert row is not None
    return int(row[0])


# -- module ------------------------------------------------------------------------------------
def test_module_globals_and_exception_hierarchy_follow_pep_249() -> None:
    assert (sql.apilevel, sql.threadsafety, sql.paramstyle) == ("2.0", 2, "qmark")
    assert issubclass(sql.InterfaceError, sql.Error)
    assert issubclass(sql.DatabaseError, sql.Error)
    for kind in (
        sql.DataError,
        sql.OperationalError,
        sql.IntegrityError,
        sql.InternalError,
        sql.ProgrammingError,
        sql.NotSupportedError,
    ):
        assert issubclass(kind, sql.DatabaseError)
    assert issubclass(sql.Error, Exception) and issubclass(sql.Warning, Exception)


def test_connect_creates_the_data_directory(data_dir: str, connect: ConnectionFactory) -> None:
    connection = connect()
    assert Path(data_dir).is_dir()
    assert connection.autocommit is False
    assert connection.execute("SELECT 1").fetchall() == [(1,)]


# -- cursors and fetching ---------------------------------------------------------------------
def test_cursor_fetches_with_fetchone_fetchmany_fetchall_and_iteration(
    connect: ConnectionFactory,
) -> None:
    cursor = connect().cursor()
    cursor.execute("SELECT range AS n FROM range(7)")
    assert cursor.fetchone() == (0,)
    assert cursor.fetchmany() == [(1,)]  # arraysize defaults to 1
    cursor.arraysize = 2
    assert cursor.fetchmany() == [(2,), (3,)]
    assert cursor.fetchmany(10) == [(4,), (5,), (6,)]
    assert cursor.fetchone() is None
    assert cursor.fetchall() == []
    assert [row for row in cursor.execute("SELECT range FROM range(3)")] == [(0,), (1,), (2,)]


def test_description_names_columns_and_type_codes_compare_to_type_objects(
    connect: ConnectionFactory,
) -> None:
    cursor = connect().cursor()
    cursor.execute(
        "SELECT 1 AS i, 'x' AS s, 'y'::BLOB AS b, 1.5::DECIMAL(5, 2) AS d, now() AS t, NULL AS z"
    )
    names = [column[0] for column in cursor.description]
    assert names == ["i", "s", "b", "d", "t", "z"]
    assert all(len(column) == 7 for column in cursor.description)
    i, s, b, d, t, _z = (column[1] for column in cursor.description)
    assert i == sql.NUMBER and s == sql.STRING and b == sql.BINARY and t == sql.DATETIME
    assert i != sql.STRING and d == sql.NUMBER
    assert cursor.description[3][4:6] == (5, 2)
    assert cursor.rowcount == 1


def test_statement_without_rows_has_no_description_and_fetch_raises(
    connect: ConnectionFactory,
) -> None:
    cursor = connect().cursor()
    cursor.execute("CREATE TABLE t (a INTEGER)")
    assert cursor.description is None
    with pytest.raises(sql.ProgrammingError):
        cursor.fetchall()


def test_several_statements_give_one_result_set_each_through_nextset(
    connect: ConnectionFactory,
) -> None:
    cursor = connect().cursor()
    cursor.execute("SELECT 1 AS a; SELECT 2 AS b, 3 AS c")
    assert cursor.fetchall() == [(1,)]
    assert cursor.nextset() is True
    assert [column[0] for column in cursor.description] == ["b", "c"]
    assert cursor.fetchall() == [(2, 3)]
    assert cursor.nextset() is None


# -- parameters -------------------------------------------------------------------------------
def test_qmark_numeric_and_named_parameters_bind_in_table_sql(
    admin: dbapi.Connection,
) -> None:
    cursor = admin.cursor()
    cursor.execute("INSERT INTO items VALUES (?, ?)", (1, "one"))
    cursor.execute("INSERT INTO items VALUES ($1, $2)", [2, "two"])
    cursor.execute("INSERT INTO items VALUES ($id, $name)", {"id": 3, "name": "three"})
    cursor.execute("INSERT INTO items VALUES ($1, $2)", {1: 4, 2: None})
    cursor.execute("SELECT id, name FROM items WHERE id >= ? ORDER BY id", [2])
    assert cursor.fetchall() == [(2, "two"), (3, "three"), (4, None)]


def test_parameters_bind_in_topic_writes_and_read_options(admin: dbapi.Connection) -> None:
    cursor = admin.cursor()
    cursor.execute(
        "INSERT INTO TOPIC events (data, producer_id, seq_no) VALUES (?, ?, ?), (?, ?, ?)",
        ["a", "p", 1, b"\xff\x00", "p", 2],
    )
    assert cursor.rowcount == 2
    cursor.execute(
        'SELECT "offset", data FROM TOPIC events WITH (partition = 0, max_messages = $1) '
        'WHERE "offset" < $1',
        [5],
    )
    assert cursor.fetchall() == [(0, b"a"), (1, b"\xff\x00")]


def test_parameters_of_a_wrong_kind_are_a_programming_error(connect: ConnectionFactory) -> None:
    cursor = connect().cursor()
    with pytest.raises(sql.ProgrammingError):
        cursor.execute("SELECT ?", "abc")
    with pytest.raises(sql.ProgrammingError):
        cursor.execute("SELECT ?", 5)


def test_executemany_runs_once_per_parameter_set_and_sums_rowcount(
    admin: dbapi.Connection,
) -> None:
    cursor = admin.cursor()
    cursor.executemany("INSERT INTO items VALUES (?, ?)", [(i, f"n{i}") for i in range(5)])
    assert cursor.rowcount == 5
    cursor.executemany("INSERT INTO TOPIC events (data) VALUES (?)", [("x",), ("y",)])
    assert cursor.rowcount == 2
    assert count(admin, "SELECT count(*) FROM items") == 5
    assert count(admin, "SELECT count(*) FROM TOPIC events") == 2


def test_rowcount_of_update_delete_and_ddl(admin: dbapi.Connection) -> None:
    cursor = admin.cursor()
    cursor.executemany("INSERT INTO items VALUES (?, ?)", [(1, "a"), (2, "b"), (3, "c")])
    cursor.execute("UPDATE items SET name = 'z' WHERE id < 3")
    assert cursor.rowcount == 2
    cursor.execute("DELETE FROM items WHERE id = 3")
    assert cursor.rowcount == 1
    cursor.execute("CREATE TABLE other (a INTEGER)")
    assert cursor.rowcount == -1


# -- transactions -----------------------------------------------------------------------------
def test_first_statement_opens_a_transaction_that_rollback_discards(
    admin: dbapi.Connection, connect: ConnectionFactory
) -> None:
    connection = connect()
    cursor = connection.cursor()
    cursor.execute("INSERT INTO items VALUES (1, 'a')")
    cursor.execute("INSERT INTO TOPIC events (data) VALUES ('staged')")
    assert connection.in_transaction
    connection.rollback()
    assert not connection.in_transaction
    assert count(connection, "SELECT count(*) FROM items") == 0
    assert count(connection, "SELECT count(*) FROM TOPIC events") == 0


def test_commit_makes_table_and_topic_writes_visible_to_other_connections(
    admin: dbapi.Connection, connect: ConnectionFactory
) -> None:
    writer = connect()
    writer.execute("INSERT INTO items VALUES (1, 'a')")
    writer.execute("INSERT INTO TOPIC events (data) VALUES ('m1'), ('m2')")
    assert count(admin, "SELECT count(*) FROM items") == 0
    assert count(admin, "SELECT count(*) FROM TOPIC events") == 0
    writer.commit()
    assert count(admin, "SELECT count(*) FROM items") == 1
    assert count(admin, "SELECT count(*) FROM TOPIC events") == 2


def test_consumer_offsets_move_only_when_the_transaction_commits(
    admin: dbapi.Connection, connect: ConnectionFactory
) -> None:
    admin.execute("INSERT INTO TOPIC events (data) VALUES ('a'), ('b'), ('c')")
    read = "SELECT CAST(data AS VARCHAR) FROM TOPIC events WITH (consumer = 'reader')"
    connection = connect()
    assert connection.execute(read).fetchall() == [("a",), ("b",), ("c",)]
    connection.rollback()
    assert connection.execute(read).fetchall() == [("a",), ("b",), ("c",)]
    connection.commit()
    assert connection.execute(read).fetchall() == []
    connection.commit()
    consumers = admin.execute(
        "SELECT committed_offset FROM sys.consumers WHERE consumer = 'reader'"
    ).fetchall()
    assert consumers == [(3,)]


def test_commit_offsets_statement_moves_the_consumer_in_the_transaction(
    admin: dbapi.Connection,
) -> None:
    admin.execute("INSERT INTO TOPIC events (data) VALUES ('a'), ('b'), ('c')")
    admin.execute("COMMIT OFFSETS ON TOPIC events FOR CONSUMER reader (PARTITION 0 UPTO 2)")
    rows = admin.execute(
        "SELECT CAST(data AS VARCHAR) FROM TOPIC events WITH (consumer = 'reader')"
    ).fetchall()
    assert rows == [("c",)]


def test_autocommit_makes_each_statement_its_own_transaction(
    admin: dbapi.Connection, connect: ConnectionFactory
) -> None:
    connection = connect(autocommit=True)
    connection.execute("INSERT INTO items VALUES (1, 'a')")
    assert not connection.in_transaction
    assert count(admin, "SELECT count(*) FROM items") == 1
    connection.execute("BEGIN")
    connection.execute("INSERT INTO items VALUES (2, 'b')")
    assert connection.in_transaction
    connection.rollback()
    assert count(admin, "SELECT count(*) FROM items") == 1


def test_autocommit_cannot_change_inside_a_transaction(connect: ConnectionFactory) -> None:
    connection = connect()
    connection.execute("SELECT 1")
    with pytest.raises(sql.ProgrammingError):
        connection.autocommit = True
    connection.commit()
    connection.autocommit = True
    assert connection.autocommit is True


def test_topic_ddl_is_refused_inside_the_implicit_transaction(
    connect: ConnectionFactory,
) -> None:
    connection = connect()
    with pytest.raises(sql.DatabaseError, match="transaction block"):
        connection.execute("CREATE TOPIC later")
    connection.rollback()
    connection.autocommit = True
    connection.execute("CREATE TOPIC later")
    assert connection.execute("SHOW TOPICS").fetchone()[0] == "later"


def test_statements_after_an_error_in_a_transaction_fail_with_25p02_until_rollback(
    admin: dbapi.Connection, connect: ConnectionFactory
) -> None:
    connection = connect()
    connection.execute("INSERT INTO items VALUES (1, 'a')")
    with pytest.raises(sql.DataError) as failure:
        connection.execute("SELECT CAST('x' AS INTEGER)")
    assert failure.value.sqlstate == "22P02"
    with pytest.raises(sql.InternalError) as aborted:
        connection.execute("SELECT 1")
    assert aborted.value.sqlstate == "25P02"
    connection.rollback()
    assert connection.execute("SELECT 1").fetchall() == [(1,)]
    assert count(admin, "SELECT count(*) FROM items") == 0


def test_commit_of_a_failed_transaction_rolls_back_and_raises_25p02(
    admin: dbapi.Connection, connect: ConnectionFactory
) -> None:
    connection = connect()
    connection.execute("INSERT INTO items VALUES (1, 'a')")
    with pytest.raises(sql.IntegrityError):
        connection.execute("INSERT INTO items VALUES (1, 'again')")
    with pytest.raises(sql.InternalError) as failure:
        connection.commit()
    assert failure.value.sqlstate == "25P02"
    assert not connection.in_transaction
    assert count(admin, "SELECT count(*) FROM items") == 0


def test_concurrent_consumer_reads_conflict_at_commit_with_40001(
    admin: dbapi.Connection, connect: ConnectionFactory
) -> None:
    admin.execute("INSERT INTO TOPIC events (data) VALUES ('a')")
    read = "SELECT count(*) FROM TOPIC events WITH (consumer = 'reader')"
    first, second = connect(), connect()
    assert count(first, read) == 1
    assert count(second, read) == 1
    first.commit()
    with pytest.raises(sql.OperationalError) as conflict:
        second.commit()
    assert conflict.value.sqlstate == "40001"


def test_connection_context_manager_commits_on_success_and_rolls_back_on_error(
    admin: dbapi.Connection, data_dir: str
) -> None:
    with sql.connect(data_dir) as connection:
        connection.execute("INSERT INTO items VALUES (1, 'kept')")
    assert connection.closed
    with pytest.raises(RuntimeError), sql.connect(data_dir) as connection:
        connection.execute("INSERT INTO items VALUES (2, 'dropped')")
        raise RuntimeError("boom")
    assert admin.execute("SELECT id FROM items").fetchall() == [(1,)]


# -- errors -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("statement", "kind", "sqlstate"),
    [
        ("CREATE TOPIC (", sql.ProgrammingError, "42601"),
        ("SELECT * FROM TOPIC nowhere", sql.ProgrammingError, "42P01"),
        ("CREATE TOPIC t WITH (retention_period = 5)", sql.DataError, "22023"),
        ("CREATE TOPIC t WITH (no_such_setting = 1)", sql.DataError, "22023"),
        ("CREATE TOPIC t (CONSUMER c WITH (type = 'shared'))", sql.NotSupportedError, "0A000"),
        ("INSERT INTO items VALUES (NULL, 'x')", sql.IntegrityError, "23502"),
        ("CREATE TOPIC events", sql.ProgrammingError, "42P07"),
    ],
)
def test_errors_map_their_sqlstate_class_to_a_pep_249_exception(
    admin: dbapi.Connection, statement: str, kind: type[sql.Error], sqlstate: str
) -> None:
    with pytest.raises(kind) as failure:
        admin.execute(statement)
    error = failure.value
    assert error.sqlstate == sqlstate
    assert error.message == str(error) == str(error.__cause__)
    assert error.__cause__.sqlstate == sqlstate


def test_syntax_error_message_carries_line_and_caret(connect: ConnectionFactory) -> None:
    with pytest.raises(sql.ProgrammingError) as failure:
        connect().execute("SELECT 1;\nCREATE TOPIC x WITH (retention_period = Interval('PT1H')")
    assert failure.value.sqlstate == "42601"
    assert "LINE 2:" in failure.value.message and "^" in failure.value.message


def test_second_process_on_the_data_directory_is_an_operational_error_naming_the_pid(
    data_dir: str, connect: ConnectionFactory, tmp_path: Path
) -> None:
    connect()
    probe = (
        "import sys, sql\n"
        "try:\n    sql.connect(sys.argv[1])\n"
        "except sql.OperationalError as e:\n    print(e.sqlstate, e.message)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe, data_dir], capture_output=True, text=True, timeout=60
    )
    assert result.stdout.startswith("55006 ")
    assert f"pid {os.getpid()}" in result.stdout


def test_closed_connection_and_cursor_raise_interface_error(connect: ConnectionFactory) -> None:
    connection = connect()
    cursor = connection.cursor()
    cursor.close()
    with pytest.raises(sql.InterfaceError):
        cursor.execute("SELECT 1")
    connection.close()
    connection.close()  # a second close is a no-op
    with pytest.raises(sql.InterfaceError):
        connection.cursor()
    with pytest.raises(sql.InterfaceError):
        connection.commit()


def test_close_rolls_back_an_open_transaction(
    admin: dbapi.Connection, connect: ConnectionFactory
) -> None:
    connection = connect()
    connection.execute("INSERT INTO items VALUES (1, 'a')")
    connection.close()
    assert count(admin, "SELECT count(*) FROM items") == 0


# -- threads ----------------------------------------------------------------------------------
def test_connections_in_threads_share_one_database_each_with_its_own_transaction(
    admin: dbapi.Connection, data_dir: str
) -> None:
    threads_count, rounds = 4, 5
    failures: list[BaseException] = []
    barrier = threading.Barrier(threads_count)

    def work(worker: int) -> None:
        try:
            with sql.connect(data_dir) as connection:
                barrier.wait(timeout=30)
                for round_number in range(rounds):
                    key = worker * 100 + round_number
                    connection.execute("INSERT INTO items VALUES (?, ?)", (key, f"w{worker}"))
                    connection.execute(
                        "INSERT INTO TOPIC events (data, producer_id, seq_no) VALUES (?, ?, ?)",
                        (f"{key}", f"worker-{worker}", round_number + 1),
                    )
                    if round_number % 2:
                        connection.rollback()
                    else:
                        connection.commit()
        except BaseException as error:
            failures.append(error)

    workers = [threading.Thread(target=work, args=(n,)) for n in range(threads_count)]
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join(timeout=60)
    assert not failures
    committed_per_worker = (rounds + 1) // 2
    assert count(admin, "SELECT count(*) FROM items") == threads_count * committed_per_worker
    assert count(admin, "SELECT count(*) FROM TOPIC events") == (
        threads_count * committed_per_worker
    )


def test_one_connection_shared_by_threads_serialises_its_statements(
    admin: dbapi.Connection,
) -> None:
    failures: list[BaseException] = []

    def work(worker: int) -> None:
        try:
            for n in range(5):
                admin.execute("INSERT INTO items VALUES (?, 'x')", (worker * 10 + n,))
        except BaseException as error:
            failures.append(error)

    workers = [threading.Thread(target=work, args=(n,)) for n in range(3)]
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join(timeout=60)
    assert not failures
    assert count(admin, "SELECT count(*) FROM items") == 15


# -- behaviours that come from the engine, seen through DB-API ---------------------------------
def test_duckdb_describe_of_a_table_returns_its_columns(admin: dbapi.Connection) -> None:
    cursor = admin.execute("DESCRIBE items")
    assert cursor.description is not None
    assert [row[0] for row in cursor.fetchall()] == ["id", "name"]


def test_syntax_error_in_plain_sql_carries_line_and_caret(connect: ConnectionFactory) -> None:
    with pytest.raises(sql.ProgrammingError) as failure:
        connect().execute("SELECT 1;\nSELEKT 2")
    assert "LINE 2:" in failure.value.message and "^" in failure.value.message


def test_parameter_used_only_in_topic_read_options_binds(admin: dbapi.Connection) -> None:
    admin.execute("INSERT INTO TOPIC events (data) VALUES ('a'), ('b')")
    cursor = admin.execute("SELECT count(*) FROM TOPIC events WITH (max_messages = $1)", [1])
    assert cursor.fetchall() == [(1,)]
    with pytest.raises(sql.NotSupportedError) as refused:
        admin.execute("SELECT count(*) FROM TOPIC events WITH (max_messages = ?)", [1])
    assert refused.value.sqlstate == "0A000"


def test_unknown_topic_inside_a_transaction_fails_the_transaction(
    connect: ConnectionFactory,
) -> None:
    connection = connect()
    connection.execute("SELECT 1")
    with pytest.raises(sql.ProgrammingError):
        connection.execute("SELECT * FROM TOPIC missing")
    with pytest.raises(sql.InternalError) as aborted:
        connection.execute("SELECT 1")
    assert aborted.value.sqlstate == "25P02"


# -- cost ------------------------------------------------------------------------------------
def test_a_repeated_operation_is_parsed_once(
    admin: dbapi.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The DB-API goes through the session's parse cache: a loop of one statement text
    (execute and executemany alike) parses it once, however many times it runs."""
    import grammar.parse
    from engine import session
    from grammar.split import SourceText

    parsed: list[str] = []
    original = grammar.parse._parse_statement

    def counting(source: SourceText, start: int, end: int) -> object:
        parsed.append(source.text[start:end].strip())
        return original(source, start, end)

    monkeypatch.setattr(grammar.parse, "_parse_statement", counting)
    session._parse_cached.cache_clear()  # type: ignore[attr-defined]
    operation = "INSERT INTO items VALUES (?, 'parsed once')"
    cursor = admin.cursor()
    for key in range(20):
        cursor.execute(operation, [key])
    cursor.executemany(operation, [[key] for key in range(20, 40)])
    assert count(admin, "SELECT count(*) FROM items WHERE name = 'parsed once'") == 40
    assert parsed.count(operation) == 1
