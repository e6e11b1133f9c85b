"""Bounded resources of ``topicbase serve`` against a hostile client (issue 10, part 5).

Real servers on loopback; psycopg logins with SCRAM; raw sockets for what no client
library would do. Every test also shows that a second client is served throughout.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import asyncpg
import psycopg
import pytest

from engine.staged_writes import SPILL_DIRECTORY
from sql.pgwire.codec import messages as m
from sql.pgwire.limits import ServerLimits
from sql.pgwire.server import ServerThread
from storage import limits
from storage.errors import InvalidParameterValueError
from tests.security.resource_servers import (
    ADMIN,
    ADMIN_PASSWORD,
    ALICE,
    ALICE_PASSWORD,
    BOB,
    BOB_PASSWORD,
    login,
    running_server,
    timed,
    wait_until,
)

IDLE_SOCKETS = 100
REPO = Path(__file__).resolve().parents[2]


def _idle_sockets(port: int, count: int, *, send_startup: bool) -> list[socket.socket]:
    """Sockets that connect and then say nothing (or only a startup packet, then nothing)."""
    opened = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        if send_startup:
            body = struct.pack("!i", m.PROTOCOL_V3) + m.cstr("user") + m.cstr(ALICE) + b"\0"
            sock.sendall(struct.pack("!i", len(body) + 4) + body)
        opened.append(sock)
    return opened


def _closed_by_server(sock: socket.socket) -> bool:
    """True once the server has closed ``sock`` (reads what it sent first, if anything)."""
    sock.settimeout(5)
    try:
        while chunk := sock.recv(65536):
            del chunk
    except (ConnectionResetError, TimeoutError):
        return False
    return True


# -- sockets that never log in ------------------------------------------------------------------
def test_idle_unauthenticated_sockets_do_not_lock_out_a_login(tmp_path: Path) -> None:
    limits = ServerLimits(connections_max=10, unauthenticated_max=16)
    with running_server(tmp_path, limits=limits) as server:
        bystander = login(server, BOB, BOB_PASSWORD)
        silent = _idle_sockets(server.port, IDLE_SOCKETS // 2, send_startup=False)
        stalled = _idle_sockets(server.port, IDLE_SOCKETS // 2, send_startup=True)
        try:
            # Far more idle sockets than slots of either kind, yet a real login goes in
            # at once, and the session already in carries on.
            connection, elapsed_s = timed(lambda: login(server, ALICE, ALICE_PASSWORD))
            with connection:
                assert connection.execute("SELECT 41 + 1").fetchone() == (42,)
            assert elapsed_s < 3.0, elapsed_s
            assert bystander.execute("SELECT 'still here'").fetchone() == ("still here",)
            admission = server.server.admission
            assert admission.unauthenticated <= limits.unauthenticated_max
            assert admission.pushed_out >= IDLE_SOCKETS - limits.unauthenticated_max
            assert admission.sessions == 1  # the idle sockets never took a session slot
        finally:
            for sock in silent + stalled:
                sock.close()
        bystander.close()


def test_a_socket_that_does_not_log_in_is_closed_at_the_deadline(tmp_path: Path) -> None:
    limits = ServerLimits(authentication_timeout_s=0.5)
    with running_server(tmp_path, limits=limits) as server:
        bystander = login(server, BOB, BOB_PASSWORD)
        silent = _idle_sockets(server.port, 3, send_startup=False)
        stalled = _idle_sockets(server.port, 3, send_startup=True)
        _, elapsed_s = timed(lambda: [_closed_by_server(sock) for sock in silent + stalled])
        assert all(_closed_by_server(sock) for sock in silent + stalled)
        assert elapsed_s < 4.0
        wait_until(lambda: server.server.admission.unauthenticated == 0)
        assert bystander.execute("SELECT 1").fetchone() == (1,)
        for sock in silent + stalled:
            sock.close()
        bystander.close()


def test_default_authentication_deadline_is_short() -> None:
    from sql.pgwire import auth

    assert auth.AUTHENTICATION_TIMEOUT_S <= 10.0
    assert ServerLimits().unauthenticated_max >= 1


# -- reserved connection slots ------------------------------------------------------------------
def test_last_slots_are_reserved_for_superusers(tmp_path: Path) -> None:
    limits = ServerLimits(connections_max=4, superuser_reserved_connections=2)
    with running_server(tmp_path, limits=limits) as server:
        ordinary = [login(server, ALICE, ALICE_PASSWORD), login(server, BOB, BOB_PASSWORD)]
        with pytest.raises(psycopg.OperationalError, match="reserved for roles with the "
                           "SUPERUSER attribute"):  # fmt: skip
            login(server, BOB, BOB_PASSWORD)
        assert _login_sqlstate(server.port, BOB, BOB_PASSWORD) == "53300"
        admins = [login(server, ADMIN, ADMIN_PASSWORD) for _ in range(2)]
        with pytest.raises(psycopg.OperationalError, match="too many clients already"):
            login(server, ADMIN, ADMIN_PASSWORD)
        for connection in ordinary + admins:  # everyone in is served
            assert connection.execute("SELECT current_user IS NOT NULL").fetchone() == (True,)
        admins.pop().close()
        wait_until(lambda: server.server.admission.sessions == 3)
        with pytest.raises(psycopg.OperationalError, match="reserved"):  # still reserved
            login(server, ALICE, ALICE_PASSWORD)
        admins.pop().close()  # superusers count too: 2 sessions left 2 slots, reserved
        wait_until(lambda: server.server.admission.sessions == 2)
        with pytest.raises(psycopg.OperationalError, match="reserved"):
            login(server, ALICE, ALICE_PASSWORD)
        ordinary.pop().close()
        wait_until(lambda: server.server.admission.sessions == 1)
        with login(server, ALICE, ALICE_PASSWORD) as again:  # an ordinary slot is free again
            assert again.execute("SELECT 7").fetchone() == (7,)
        for connection in ordinary + admins:
            connection.close()


def _login_sqlstate(port: int, user: str, password: str) -> str | None:
    """The SQLSTATE of a refused login (psycopg does not expose it at connect; asyncpg does)."""

    async def attempt() -> str | None:
        try:
            connection = await asyncpg.connect(host="127.0.0.1", port=port, user=user,
                                               password=password, database="topicbase",
                                               ssl=False, timeout=10)  # fmt: skip
        except asyncpg.PostgresError as error:
            return str(error.sqlstate)
        await connection.close()
        return None

    return asyncio.run(attempt())


def test_reserved_slots_leave_one_for_anyone(tmp_path: Path) -> None:
    limits = ServerLimits(connections_max=1)  # default reservation 3 > 1: clamped to 0
    assert limits.reserved_connections == 0
    with running_server(tmp_path, limits=limits) as server, \
            login(server, BOB, BOB_PASSWORD) as only:
        assert only.execute("SELECT 1").fetchone() == (1,)


def test_serve_options_reach_the_limits_and_settings() -> None:
    import argparse

    from sql.pgwire.limits import add_serve_arguments, serve_configuration

    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    limits, settings = serve_configuration(parser.parse_args([
        "--max-connections", "20", "--superuser-reserved-connections", "5",
        "--max-unauthenticated-connections", "7", "--authentication-timeout", "2.5",
        "--idle-session-timeout", "10min", "--idle-in-transaction-session-timeout", "30s",
        "--log-statement", "ddl",
    ]))  # fmt: skip
    assert (limits.connections_max, limits.reserved_connections) == (20, 5)
    assert (limits.unauthenticated_max, limits.authentication_timeout_s) == (7, 2.5)
    assert settings == {"idle_session_timeout": "10min",
                        "idle_in_transaction_session_timeout": "30s",
                        "log_statement": "ddl"}  # fmt: skip
    with pytest.raises(SystemExit):
        parser.parse_args(["--superuser-reserved-connections", "-1"])


def test_statement_size_limit_option_bounds_a_query_text(tmp_path: Path) -> None:
    """``serve --statement-size-limit KIB`` reaches the server: a Query longer than it is
    54000 unread, one within it runs (the front's work grows with the text: round 27)."""
    import argparse

    from sql.pgwire.limits import add_serve_arguments, serve_configuration
    from storage.limits import STATEMENT_BYTES_MAX_DEFAULT

    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    default, _ = serve_configuration(parser.parse_args([]))
    assert default.statement_bytes_max == STATEMENT_BYTES_MAX_DEFAULT
    limits, _ = serve_configuration(parser.parse_args(["--statement-size-limit", "8"]))
    assert limits.statement_bytes_max == 8 * 1024
    with pytest.raises(SystemExit):
        parser.parse_args(["--statement-size-limit", "0"])
    with running_server(tmp_path, limits=limits) as server, \
            login(server, BOB, BOB_PASSWORD) as client:
        assert client.execute("SELECT '" + "a" * 7000 + "'").fetchone() == ("a" * 7000,)
        with pytest.raises(psycopg.Error) as caught:
            client.execute("SELECT '" + "a" * 9000 + "'")
        assert caught.value.sqlstate == "54000"
        assert client.execute("SELECT 1").fetchone() == (1,)


# -- idle sessions --------------------------------------------------------------------------------
def _fatal_on_next_statement(connection: psycopg.Connection) -> psycopg.Error:
    with pytest.raises(psycopg.Error) as caught:
        connection.execute("SELECT 1")
    return caught.value


def test_idle_in_transaction_timeout_rolls_back_and_frees_staged_writes(tmp_path: Path) -> None:
    with running_server(tmp_path, auth="trust") as server:
        bystander = login(server, BOB, "")
        bystander.execute("CREATE TOPIC events")
        idler = login(server, ALICE, "")
        idler.execute("SET idle_in_transaction_session_timeout = '300ms'")
        idler.execute("BEGIN")
        idler.execute("INSERT INTO TOPIC events (data) VALUES ('staged, never committed')")
        _stage(idler, 12)  # past the in-memory buffer: a spill file too
        database = server.database
        assert database.open_transactions == 1
        assert database.staged_writes.spill_files()
        time.sleep(1.0)
        error = _fatal_on_next_statement(idler)
        assert error.sqlstate == "25P03"
        assert "idle-in-transaction timeout" in str(error)
        assert idler.closed or idler.broken
        wait_until(lambda: database.open_transactions == 0)
        assert database.staged_writes.total_bytes == 0  # its staged writes were freed
        assert database.staged_writes.spill_files() == []
        count = "SELECT count(*) FROM TOPIC events WITH (partition = 0)"
        assert bystander.execute(count).fetchone() == (0,)
        bystander.execute("INSERT INTO TOPIC events (data) VALUES ('bystander')")
        assert bystander.execute(count).fetchone() == (1,)
        bystander.close()


def test_idle_session_timeout_closes_an_idle_session(tmp_path: Path) -> None:
    with running_server(tmp_path, auth="trust",
                        settings={"idle_session_timeout": "400ms"}) as server:  # fmt: skip
        patient = login(server, BOB, "")
        patient.execute("SET idle_session_timeout = 0")  # per session, as in PostgreSQL
        idler = login(server, ALICE, "")
        assert idler.execute("SHOW idle_session_timeout").fetchone() == ("400ms",)
        for _ in range(8):  # statements every 0.1 s keep a session alive
            assert idler.execute("SELECT 1").fetchone() == (1,)
            time.sleep(0.1)
        time.sleep(0.8)
        error = _fatal_on_next_statement(idler)
        assert error.sqlstate == "57P05"
        assert "idle-session timeout" in str(error)
        assert patient.execute("SELECT 2").fetchone() == (2,)
        patient.close()


def test_idle_timeouts_refuse_bad_values(tmp_path: Path) -> None:
    with running_server(tmp_path, auth="trust") as server, login(server, BOB, "") as connection:
        with pytest.raises(psycopg.Error) as caught:
            connection.execute("SET idle_session_timeout = 'soon'")
        assert caught.value.sqlstate == "22023"
        assert connection.execute("SELECT 3").fetchone() == (3,)
    with pytest.raises(InvalidParameterValueError):  # a bad server default: not started
        ServerThread(str(tmp_path / "data"), settings={"idle_session_timeout": "-1"})


# -- staged writes of open transactions: spilled to disk, capped in all ---------------------------
MIB = 1024 * 1024
PAYLOAD = "x" * (256 * 1024)  # 256 KiB messages


def _stage(connection: psycopg.Connection, mebibytes: int) -> None:
    rows = ", ".join(["(%s)"] * 4)
    for _ in range(mebibytes):
        connection.execute(f"INSERT INTO TOPIC events (data) VALUES {rows}", [PAYLOAD] * 4)


def test_staged_writes_spill_to_disk_and_commit_whole(tmp_path: Path) -> None:
    with running_server(tmp_path, auth="trust") as server:
        staged = server.database.staged_writes
        bystander = login(server, BOB, "")
        bystander.execute("CREATE TOPIC events")
        writer = login(server, ALICE, "", autocommit=False)
        _stage(writer, 24)  # three times the in-memory buffer of a transaction
        assert staged.total_bytes >= 24 * MIB
        assert staged.memory_bytes <= limits.TRANSACTION_MEMORY_BYTES_MAX
        spill_files = staged.spill_files()
        assert len(spill_files) == 1
        assert (Path(staged.directory) / spill_files[0]).stat().st_size >= 15 * MIB
        count = "SELECT count(*), sum(octet_length(data)) FROM TOPIC events WITH (partition = 0)"
        assert bystander.execute(count).fetchone() == (0, None)  # invisible until COMMIT
        writer.commit()
        assert bystander.execute(count).fetchone() == (96, 96 * len(PAYLOAD))
        assert staged.spill_files() == [] and staged.total_bytes == staged.memory_bytes == 0
        _stage(writer, 12)
        assert staged.spill_files()
        writer.rollback()  # a rollback frees its share too
        assert staged.spill_files() == [] and staged.total_bytes == 0
        assert bystander.execute(count).fetchone()[0] == 96
        writer.close()
        bystander.close()


def test_commits_reading_spilled_writes_back_take_turns(tmp_path: Path) -> None:
    with running_server(tmp_path, auth="trust") as server:
        staged = server.database.staged_writes
        bystander = login(server, BOB, "")
        bystander.execute("CREATE TOPIC events")
        writer = login(server, ALICE, "", autocommit=False)
        _stage(writer, 12)
        turns = limits.SPILLED_COMMITS_MAX
        for _ in range(turns):  # other large commits hold every turn
            assert staged.read_back.acquire(blocking=False)
        committing = threading.Thread(target=writer.commit)
        committing.start()
        committing.join(timeout=0.5)
        assert committing.is_alive()  # waits for a turn, holding no lock of the commit path
        count = "SELECT count(*) FROM TOPIC events WITH (partition = 0)"
        assert bystander.execute(count).fetchone() == (0,)
        bystander.execute("INSERT INTO TOPIC events (data) VALUES ('others commit meanwhile')")
        staged.read_back.release()
        committing.join(timeout=30)
        assert not committing.is_alive()
        assert bystander.execute(count).fetchone() == (49,)
        for _ in range(turns - 1):
            staged.read_back.release()
        for _ in range(turns):  # every turn was given back
            assert staged.read_back.acquire(blocking=False)
        writer.close()
        bystander.close()


def test_a_partition_share_too_big_to_publish_is_refused_before_the_commit_point(
    tmp_path: Path,
) -> None:
    with running_server(tmp_path, auth="trust") as server:
        bystander = login(server, BOB, "")
        bystander.execute("CREATE TOPIC events")
        writer = login(server, ALICE, "", autocommit=False)
        _stage(writer, limits.BATCH_BYTES_MAX // MIB + 2)  # one partition, one publish
        with pytest.raises(psycopg.Error) as caught:
            writer.commit()
        assert caught.value.sqlstate == "54000"
        assert "to one partition" in str(caught.value)
        count = "SELECT count(*) FROM TOPIC events WITH (partition = 0)"
        assert bystander.execute(count).fetchone() == (0,)  # nothing committed, all rolled back
        assert server.database.staged_writes.total_bytes == 0
        _stage(writer, 2)  # the database and the session carry on
        writer.commit()
        bystander.execute("INSERT INTO TOPIC events (data) VALUES ('after')")
        assert bystander.execute(count).fetchone() == (9,)
        writer.close()
        bystander.close()


def test_staged_writes_have_a_global_cap(tmp_path: Path) -> None:
    with running_server(tmp_path, auth="trust") as server:
        staged = server.database.staged_writes
        staged.total_bytes_max = 20 * MIB  # for the test; the default is 4 GiB
        bystander = login(server, BOB, "")
        bystander.execute("CREATE TOPIC events")
        first = login(server, ALICE, "", autocommit=False)
        second = login(server, ALICE, "", autocommit=False)
        _stage(first, 12)
        with pytest.raises(psycopg.Error) as caught:
            _stage(second, 12)  # each is under the per-transaction limit; together over
        assert caught.value.sqlstate == "54000"
        assert "in all" in str(caught.value)
        second.rollback()
        first.commit()  # the first transaction is not harmed
        count = "SELECT count(*) FROM TOPIC events WITH (partition = 0)"
        assert bystander.execute(count).fetchone() == (48,)
        assert staged.total_bytes == 0 and staged.spill_files() == []
        _stage(second, 12)  # room again
        second.commit()
        assert bystander.execute(count).fetchone() == (96,)
        first.close()
        second.close()
        bystander.close()


_KILLED_WRITER = """
import sys, time
from engine.database import Database
database = Database.open(sys.argv[1], retention_interval_s=None)
session = database.connect()
session.execute("CREATE TOPIC IF NOT EXISTS events")
session.execute("BEGIN")
for _ in range(16):
    session.execute("INSERT INTO TOPIC events (data) VALUES ($1), ($1), ($1), ($1)",
                    ["x" * 262144])
print(len(database.staged_writes.spill_files()), flush=True)
time.sleep(600)
"""


def test_spill_file_of_a_killed_process_is_removed_at_open(tmp_path: Path) -> None:
    data = tmp_path / "data"
    child = subprocess.Popen([sys.executable, "-c", _KILLED_WRITER, str(data)],
                             stdout=subprocess.PIPE, text=True, cwd=REPO)  # fmt: skip
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "1"  # it spilled, and waits uncommitted
        spill_directory = data / SPILL_DIRECTORY
        assert [p.stat().st_size >= 4 * MIB for p in spill_directory.iterdir()] == [True]
    finally:
        child.kill()
        child.wait(timeout=30)
    with running_server(tmp_path, auth="trust") as server:
        assert server.database.staged_writes.removed_at_open == 1
        assert list(spill_directory.iterdir()) == []
        with login(server, BOB, "") as connection:  # the lost transaction left nothing
            count = "SELECT count(*) FROM TOPIC events WITH (partition = 0)"
            assert connection.execute(count).fetchone() == (0,)
            connection.execute("INSERT INTO TOPIC events (data) VALUES ('after the kill')")
            assert connection.execute(count).fetchone() == (1,)
