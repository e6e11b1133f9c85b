"""The server's limits (``sql.pgwire.limits``): connections (53300), message, statement and
result sizes (54000). Each is hit through a real server, and after each the server and the
other sessions carry on."""

from __future__ import annotations

import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from sql.pgwire.codec import messages as m
from sql.pgwire.limits import ServerLimits
from sql.pgwire.server import ServerThread
from tests.pgwire.rawclient import RawClient, errors, query, startup_packet

REPO = Path(__file__).resolve().parents[2]
LIMITS = ServerLimits(connections_max=3, message_bytes_max=64 * 1024,
                      statement_bytes_max=4096, result_bytes_max=100_000)  # fmt: skip


@pytest.fixture
def limited(tmp_path: Path) -> Iterator[ServerThread]:
    running = ServerThread(str(tmp_path / "data"), "127.0.0.1", 0, limits=LIMITS)
    yield running
    running.stop()


@pytest.fixture
def open_conn(limited: ServerThread) -> Iterator[Callable[..., psycopg.Connection]]:
    opened: list[psycopg.Connection] = []

    def open_connection(**options: object) -> psycopg.Connection:
        conn = psycopg.connect(host="127.0.0.1", port=limited.port, user="tester",
                               connect_timeout=10, **options)  # fmt: skip
        opened.append(conn)
        return conn

    yield open_connection
    for conn in opened:
        conn.close()


def wait_for_open_sockets(server: ServerThread, count: int) -> None:
    """Wait (bounded) until the server has seen closed sockets close."""
    for _ in range(500):
        if server.server.open_sockets <= count:
            return
        time.sleep(0.01)
    raise AssertionError(f"server still counts {server.server.open_sockets} sockets")


def connect_once_freed(port: int) -> psycopg.Connection:
    """Connect, retrying (bounded) while the server has not yet seen a closed socket close."""
    for _ in range(100):
        try:
            return psycopg.connect(host="127.0.0.1", port=port, autocommit=True,
                                   connect_timeout=10)  # fmt: skip
        except psycopg.OperationalError as error:
            if "too many clients" not in str(error):
                raise
            time.sleep(0.05)
    raise AssertionError("the server never freed the closed connection's slot")


def test_limits_must_be_positive() -> None:
    with pytest.raises(ValueError, match="connections_max"):
        ServerLimits(connections_max=0)
    with pytest.raises(ValueError, match="result_bytes_max"):
        ServerLimits(result_bytes_max=-1)


# -- connections ---------------------------------------------------------------------------
def test_connection_over_the_limit_gets_53300(limited: ServerThread, open_conn) -> None:
    held = [open_conn(autocommit=True) for _ in range(LIMITS.connections_max)]
    with pytest.raises(psycopg.OperationalError, match="too many clients already"):
        open_conn(autocommit=True)
    raw = RawClient(limited.port)  # the refusal as bytes: after SSLRequest and startup
    raw.send(struct.pack("!ii", 8, m.SSL_REQUEST))
    assert raw.read_byte() == b"N"
    raw.send(startup_packet())
    got = raw.read_all()
    assert [kind for kind, _ in got] == [b"E"]
    assert errors(got)[0]["C"] == "53300" and errors(got)[0]["S"] == "FATAL"
    raw.close()
    for conn in held:  # the sessions already in carry on
        assert conn.execute("SELECT 1").fetchone() == (1,)
    held.pop().close()
    wait_for_open_sockets(limited, LIMITS.connections_max - 1)
    fresh = open_conn(autocommit=True)  # a freed slot is taken again
    assert fresh.execute("SELECT 2").fetchone() == (2,)


def test_cancel_is_served_when_full(limited: ServerThread, open_conn) -> None:
    waiter = open_conn(autocommit=True)
    waiter.execute("CREATE TOPIC quiet (CONSUMER c)")
    others = [open_conn(autocommit=True) for _ in range(LIMITS.connections_max - 1)]
    timer = threading.Timer(0.5, waiter.cancel_safe)  # its CancelRequest is the 4th socket
    timer.start()
    with pytest.raises(psycopg.errors.QueryCanceled):
        waiter.execute(
            "SELECT data FROM TOPIC quiet WITH (consumer = 'c', wait = Interval('PT60S'))"
        )
    timer.join()
    assert waiter.execute("SELECT 3").fetchone() == (3,)
    assert others[0].execute("SELECT 4").fetchone() == (4,)


def test_serve_max_connections_flag(tmp_path: Path) -> None:
    code = "import sys; from sql.console import main; sys.exit(main(sys.argv[1:]))"
    command = [sys.executable, "-c", code, "--data-dir", str(tmp_path / "d"), "serve",
               "--auth", "trust", "--flight-port", "0"]  # fmt: skip
    refused = subprocess.run([*command, "--max-connections", "0"], capture_output=True,
                             text=True, cwd=REPO, timeout=60)  # fmt: skip
    assert refused.returncode == 2 and "at least 1" in refused.stderr
    process = subprocess.Popen([*command, "--port", "0", "--max-connections", "1"],
                               stdout=subprocess.PIPE, text=True, cwd=REPO)  # fmt: skip
    try:
        line = process.stdout.readline()
        port = int(line.rsplit(":", 1)[1])
        with psycopg.connect(host="127.0.0.1", port=port, autocommit=True) as first:
            with pytest.raises(psycopg.OperationalError, match="too many clients"):
                psycopg.connect(host="127.0.0.1", port=port, connect_timeout=10)
            assert first.execute("SELECT 5").fetchone() == (5,)
        with connect_once_freed(port) as second:
            assert second.execute("SELECT 6").fetchone() == (6,)
    finally:
        process.terminate()
        process.wait(timeout=20)


# -- message size ---------------------------------------------------------------------------
def test_oversized_message_is_refused_before_its_body(limited: ServerThread, open_conn) -> None:
    other = open_conn(autocommit=True)
    raw = RawClient(limited.port)
    raw.start()
    # Only the header: the server must answer without waiting for 100 MB that never come.
    raw.send(b"Q" + struct.pack("!i", 100_000_000))
    got = raw.read_all()
    assert [kind for kind, _ in got] == [b"E"]
    assert errors(got)[0]["C"] == "54000" and errors(got)[0]["S"] == "FATAL"
    assert "over the limit of 65536 bytes" in errors(got)[0]["M"]
    raw.close()
    assert other.execute("SELECT 7").fetchone() == (7,)


def test_oversized_bind_through_psycopg(open_conn) -> None:
    conn = open_conn(autocommit=True)
    with pytest.raises(psycopg.OperationalError):
        conn.execute("SELECT length(%s)", [b"x" * 100_000])
    if not (conn.closed or conn.broken):  # libpq returned the FATAL before it read the close
        with pytest.raises(psycopg.OperationalError):  # the server closed the connection
            conn.execute("SELECT 1")
    assert open_conn(autocommit=True).execute("SELECT 8").fetchone() == (8,)


# -- statement size ---------------------------------------------------------------------------
def test_oversized_statement_keeps_the_connection(open_conn) -> None:
    conn = open_conn(autocommit=True)
    big = "SELECT '" + "x" * 5000 + "'"
    with pytest.raises(psycopg.errors.ProgramLimitExceeded, match="statement is"):
        conn.execute(big)
    assert conn.execute("SELECT 9").fetchone() == (9,)
    with pytest.raises(psycopg.errors.ProgramLimitExceeded):  # extended protocol: Parse
        conn.execute("SELECT %s::VARCHAR || '" + "y" * 5000 + "'", ["a"])
    assert conn.execute("SELECT %s::INTEGER + 1", [9]).fetchone() == (10,)


def test_oversized_statement_fails_the_transaction(open_conn) -> None:
    conn = open_conn(autocommit=True)
    conn.execute("CREATE TABLE t (k INTEGER)")
    conn.execute("BEGIN")
    conn.execute("INSERT INTO t VALUES (1)")
    with pytest.raises(psycopg.errors.ProgramLimitExceeded):
        conn.execute("INSERT INTO t VALUES (2) -- " + "z" * 5000)
    with pytest.raises(psycopg.errors.InFailedSqlTransaction):
        conn.execute("SELECT 1")
    conn.execute("COMMIT")  # rolls back, as after any error
    assert conn.execute("SELECT count(*) FROM t").fetchone() == (0,)


def test_statement_at_the_limit_runs(limited: ServerThread) -> None:
    raw = RawClient(limited.port)
    raw.start()
    text = "SELECT '" + "a" * (LIMITS.statement_bytes_max - 10) + "'"
    assert len(m.cstr(text)) == LIMITS.statement_bytes_max  # the Query body, exactly
    raw.send(query(text))
    got = raw.until_ready()
    assert [kind for kind, _ in got] == [b"T", b"D", b"C", b"Z"]
    raw.close()


# -- result size ----------------------------------------------------------------------------
def test_oversized_result_gets_54000_unless_streamed(open_conn) -> None:
    conn = open_conn(autocommit=True)
    # A plain query over the simple protocol streams batch by batch (each batch within
    # the limit), so a result of any size arrives whole, as from PostgreSQL.
    streamed = conn.execute("SELECT * FROM range(100000)").fetchall()  # 800 kB of BIGINT
    assert [row[0] for row in streamed] == list(range(100000))
    # A result the engine holds whole (here: a topic-free query through Bind/Execute) is
    # refused over the limit.
    with pytest.raises(psycopg.errors.ProgramLimitExceeded, match="over the limit of 100000"):
        conn.execute("SELECT * FROM range(%s)", [100_000])
    # One batch over the limit is refused even when streamed.
    with pytest.raises(psycopg.errors.ProgramLimitExceeded, match="over the limit of 100000"):
        conn.execute("SELECT repeat('x', 100) AS s FROM range(100000)")
    assert conn.execute("SELECT 1").fetchone() == (1,)
    assert conn.execute("SELECT count(*) FROM range(100000)").fetchone() == (100_000,)
    rows = conn.execute("SELECT * FROM range(100000) LIMIT 1000 OFFSET 5000").fetchall()
    assert rows[0] == (5000,) and len(rows) == 1000


def test_refused_consumer_read_commits_nothing(open_conn) -> None:
    conn = open_conn(autocommit=True)
    conn.execute("CREATE TOPIC t (CONSUMER c) WITH (min_active_partitions = 1)")
    conn.execute("INSERT INTO TOPIC t (data) SELECT repeat('m', 200) FROM range(1000)")
    conn.execute("BEGIN")
    with pytest.raises(psycopg.errors.ProgramLimitExceeded):
        conn.execute("SELECT data FROM TOPIC t WITH (consumer = 'c')")
    with pytest.raises(psycopg.errors.InFailedSqlTransaction):
        conn.execute("SELECT 1")
    conn.execute("COMMIT")
    first = conn.execute(
        "SELECT \"offset\" FROM TOPIC t WITH (consumer = 'c', max_messages = 10)"
    ).fetchall()
    assert first[0] == (0,), "the refused read must not have moved the consumer"
