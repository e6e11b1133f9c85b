"""psycopg 3 against ``sql.pgwire``: topics, tables, parameters, transactions, errors."""

from __future__ import annotations

import datetime
import decimal
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psycopg
import pytest
from psycopg import errors


def test_startup_parameters(connect) -> None:
    conn = connect(autocommit=True)
    assert conn.info.server_version == 150000
    assert conn.info.parameter_status("server_version") == "15.0 (Topicbase 0.1)"
    assert conn.info.parameter_status("client_encoding") == "UTF8"
    assert conn.info.parameter_status("standard_conforming_strings") == "on"
    assert conn.info.parameter_status("DateStyle") == "ISO, MDY"
    assert conn.info.parameter_status("integer_datetimes") == "on"
    assert conn.info.parameter_status("TimeZone") == "UTC"
    assert conn.info.backend_pid > 0
    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


def test_topic_create_insert_select(connect) -> None:
    conn = connect(autocommit=True)
    cur = conn.execute("CREATE TOPIC events (CONSUMER reader)")
    assert cur.statusmessage == "CREATE TOPIC"
    cur = conn.execute("INSERT INTO TOPIC events (data) VALUES ('a'), ('b')")
    assert cur.statusmessage == "INSERT 0 2"
    assert cur.rowcount == 2
    cur = conn.execute("INSERT INTO TOPIC events (data) VALUES (%s), (%s)", [b"\x00\xff", "c"])
    assert cur.rowcount == 2
    rows = conn.execute(
        "SELECT \"offset\", data FROM TOPIC events WITH (consumer = 'reader')"
    ).fetchall()
    assert rows == [(0, b"a"), (1, b"b"), (2, b"\x00\xff"), (3, b"c")]
    again = conn.execute("SELECT data FROM TOPIC events WITH (consumer = 'reader')")
    assert again.fetchall() == []
    assert again.statusmessage == "SELECT 0"


def test_tables_and_types(connect) -> None:
    conn = connect(autocommit=True)
    conn.execute("CREATE TABLE t (id INTEGER, name VARCHAR, blob BLOB, ok BOOLEAN)")
    conn.execute("INSERT INTO t VALUES (%s, %s, %s, %s)", [1, "ann", b"\x01\x02", True])
    conn.execute("INSERT INTO t VALUES (%s, %s, %s, %s)", [2, None, None, False])
    rows = conn.execute("SELECT * FROM t WHERE id >= %s ORDER BY id", [1]).fetchall()
    assert rows == [(1, "ann", b"\x01\x02", True), (2, None, None, False)]
    cur = conn.execute(
        "SELECT 1::SMALLINT a, 2::BIGINT b, 1.5::DOUBLE c, 2.5::DECIMAL(4, 1) d, "
        "DATE '2024-01-02' e, TIMESTAMP '2024-01-02 03:04:05' f, 'x' g, NULL::INTEGER h"
    )
    assert cur.fetchone() == (
        1, 2, 1.5, decimal.Decimal("2.5"), datetime.date(2024, 1, 2),
        datetime.datetime(2024, 1, 2, 3, 4, 5), "x", None,
    )  # fmt: skip
    assert [c.type_code for c in cur.description] == [21, 20, 701, 1700, 1082, 1114, 25, 23]
    assert conn.execute("SELECT %s::BIGINT + 1", [2**40]).fetchone() == (2**40 + 1,)


def test_many_statements_and_prepared(connect) -> None:
    conn = connect(autocommit=True)
    cur = conn.execute("SELECT 1 AS one; SELECT 2 AS two")
    assert cur.fetchall() == [(1,)]
    assert cur.nextset()
    assert cur.fetchall() == [(2,)]
    for value in range(8):  # psycopg prepares the statement after a few runs
        assert conn.execute("SELECT %s::INTEGER * 2", [value]).fetchone() == (value * 2,)
    assert conn.execute("SELECT 3", prepare=True).fetchone() == (3,)
    assert conn.execute("SELECT 3", prepare=True).fetchone() == (3,)


def test_transactions(connect) -> None:
    conn = connect()
    conn.execute("CREATE TABLE acc (n INTEGER)")
    conn.commit()
    with conn.transaction():
        conn.execute("INSERT INTO acc VALUES (%s)", [1])
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
    with pytest.raises(RuntimeError), conn.transaction():
        conn.execute("INSERT INTO acc VALUES (%s)", [2])
        raise RuntimeError("roll back")
    conn.execute("INSERT INTO acc VALUES (3)")
    conn.rollback()
    assert conn.execute("SELECT n FROM acc ORDER BY n").fetchall() == [(1,)]
    conn.commit()


def test_errors_and_failed_transaction(connect) -> None:
    conn = connect()
    with pytest.raises(errors.SyntaxError) as caught:
        conn.execute("SELEC 1")
    assert caught.value.sqlstate == "42601"
    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INERROR
    with pytest.raises(errors.InFailedSqlTransaction) as failed:
        conn.execute("SELECT 1")
    assert failed.value.sqlstate == "25P02"
    with pytest.raises(psycopg.Error) as again:
        conn.execute("SELECT %s", [1])
    assert again.value.sqlstate == "25P02"
    conn.rollback()
    assert conn.execute("SELECT 1").fetchone() == (1,)
    conn.rollback()
    with pytest.raises(psycopg.Error) as missing:
        conn.execute("SELECT * FROM no_such_table")
    assert missing.value.sqlstate == "42P01"
    conn.rollback()


def test_autocommit_error_keeps_connection(connect) -> None:
    conn = connect(autocommit=True)
    with pytest.raises(psycopg.Error) as caught:
        conn.execute("SELECT * FROM TOPIC nope")
    assert caught.value.sqlstate == "42P01"
    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    with pytest.raises(psycopg.Error):
        conn.execute("SELECT %s + ", [1])
    assert conn.execute("SELECT %s", ["still here"]).fetchone() == ("still here",)


def test_empty_query_and_notice(connect) -> None:
    conn = connect(autocommit=True)
    notices: list[str] = []
    conn.add_notice_handler(lambda d: notices.append(d.message_primary))
    cur = conn.execute("")
    assert cur.pgresult.status == psycopg.pq.ExecStatus.EMPTY_QUERY
    conn.execute("COMMIT")
    assert notices == ["there is no transaction in progress"]


def test_cancel_request(connect) -> None:
    conn = connect(autocommit=True)
    conn.execute("CREATE TOPIC quiet (CONSUMER waiter)")
    # cancel_safe: the blocking cancel() holds the GIL, and this server runs in-process.
    timer = threading.Timer(0.5, conn.cancel_safe)
    timer.start()
    started = time.monotonic()
    with pytest.raises(psycopg.Error) as caught:
        conn.execute(
            "SELECT data FROM TOPIC quiet WITH (consumer = 'waiter', wait = Interval('PT20S'))"
        )
    timer.join()
    assert caught.value.sqlstate == "57014"
    assert time.monotonic() - started < 15
    assert conn.execute("SELECT 1").fetchone() == (1,)


def test_serve_command(tmp_path) -> None:
    code = "import sys; from sql.console import main; sys.exit(main(sys.argv[1:]))"
    process = subprocess.Popen(
        [sys.executable, "-c", code, "--data-dir", str(tmp_path / "d"), "serve", "--port", "0",
         "--flight-port", "0", "--auth", "trust"],  # scram, the default, needs a users file
        stdout=subprocess.PIPE, text=True, cwd=Path(__file__).parents[2],
    )  # fmt: skip
    try:
        line = process.stdout.readline()
        assert "serving" in line, line
        port = int(line.rsplit(":", 1)[1])
        with psycopg.connect(host="127.0.0.1", port=port, autocommit=True) as conn:
            conn.execute("CREATE TOPIC served")
            assert conn.execute("SHOW TOPICS").fetchone()[0] == "served"
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_connections_run_concurrently(connect) -> None:
    writer = connect(autocommit=True)
    writer.execute("CREATE TOPIC feed (CONSUMER poller)")
    poller = connect(autocommit=True)
    got: list[object] = []

    def poll() -> None:
        got.extend(
            poller.execute(
                "SELECT data FROM TOPIC feed WITH (consumer = 'poller', wait = Interval('PT10S'))"
            ).fetchall()
        )

    thread = threading.Thread(target=poll)
    started = time.monotonic()
    thread.start()
    time.sleep(0.3)
    assert writer.execute("SELECT 41 + 1").fetchone() == (42,)  # not held up by the poll
    writer.execute("INSERT INTO TOPIC feed (data) VALUES ('wake')")
    thread.join(timeout=15)
    assert got == [(b"wake",)]
    assert time.monotonic() - started < 8


def test_parameters_written_without_spaces(connect) -> None:
    """``$1,$2`` (what ``%s,%s`` becomes) parses; sqlglot alone reads it as a dollar quote."""
    conn = connect(autocommit=True)
    conn.execute("CREATE TABLE pairs (a INTEGER, b VARCHAR)")
    conn.execute("INSERT INTO pairs VALUES (%s,%s)", (1, "$1,$2"))
    assert conn.execute("SELECT %s+%s,b FROM pairs", (2, 3)).fetchall() == [(5, "$1,$2")]
    conn.execute("CREATE TOPIC notes")
    conn.execute("INSERT INTO TOPIC notes (data,message_group_id) VALUES (%s,%s)", [b"x", "g"])
    rows = conn.execute("SELECT message_group_id,data FROM TOPIC notes").fetchall()
    assert rows == [("g", b"x")]


def test_isolation_level_through_the_extended_protocol(connect) -> None:
    """psycopg sends ``BEGIN ISOLATION LEVEL …`` with Parse/Bind when a level is set (e.g.
    in executemany); REPEATABLE READ and READ COMMITTED are what every transaction has."""
    with connect() as conn:
        conn.execute("CREATE TABLE iso (id INTEGER)")
        conn.commit()
        levels = psycopg.IsolationLevel
        for level in (levels.REPEATABLE_READ, levels.READ_COMMITTED):
            conn.isolation_level = level
            with conn.cursor() as cursor:
                cursor.executemany("INSERT INTO iso VALUES (%s)", [(1,), (2,)])
            conn.commit()
        assert conn.execute("SELECT count(*) FROM iso").fetchone() == (4,)
        conn.commit()
        conn.isolation_level = psycopg.IsolationLevel.SERIALIZABLE
        with pytest.raises(errors.SyntaxError):
            conn.execute("SELECT 1")
        conn.rollback()
