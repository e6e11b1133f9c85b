"""One count for both doors: an ordinary user's wire sessions and Flight calls in progress
are bounded together by their connection limit (``sql.user_sessions``). Before round 28
each door counted apart, so a user with ``connection_limit`` 1 could hold a wire session
and a Flight call at once (twice the engine sessions they were given)."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import psycopg
import pytest

from engine.api import Database
from spark_sql_ext.client import TopicbaseClient, TopicbaseFlightError
from sql.flight.server import start_flight
from sql.pgwire.server import ServerThread
from sql.pgwire.users import add_user, default_users_path
from sql.user_sessions import UserSessions
from tests.flight.conftest import PASSWORDS, wait_until

REPO = Path(__file__).resolve().parents[2]


def _wire(port: int) -> psycopg.Connection[Any]:
    return psycopg.connect(host="127.0.0.1", port=port, user="bob", password=PASSWORDS["bob"],
                           autocommit=True, connect_timeout=10)  # fmt: skip


def _flight(port: int) -> TopicbaseClient:
    return TopicbaseClient(f"topicbase://127.0.0.1:{port}", "bob", PASSWORDS["bob"])


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _refused_over_flight(port: int) -> None:
    with pytest.raises(TopicbaseFlightError) as caught:  # a login is a call too
        _flight(port)
    assert caught.value.sqlstate == "53300"
    assert 'too many connections for role "bob"' in str(caught.value)


def _refused_over_wire(port: int) -> None:
    with pytest.raises(psycopg.OperationalError) as caught:
        _wire(port)
    assert 'too many connections for role "bob"' in str(caught.value)


def test_wire_sessions_and_flight_calls_share_the_users_limit(
    tmp_path: Path, blocked: threading.Event
) -> None:
    data_dir = str(tmp_path / "data")
    database = Database.open(data_dir, retention_interval_s=None)
    add_user(default_users_path(database.path), "bob", PASSWORDS["bob"], connection_limit=1)
    shared = UserSessions()
    door = start_flight(database, "127.0.0.1", 0, "scram", user_sessions=shared)
    wire = ServerThread(data_dir, auth="scram", user_sessions=shared)
    try:
        with _wire(wire.port) as session:  # the wire session holds bob's one place
            assert session.execute("SELECT 1").fetchone() == (1,)
            assert shared.held() == {"bob": 1}
            _refused_over_flight(door.port)
        wait_until(lambda: shared.held() == {})  # given back when the session ended
        client = _flight(door.port)  # the place is free again
        holder = threading.Thread(target=client.action, args=("relations",))
        holder.start()
        try:
            wait_until(lambda: door.admission.calls["bob"] == 1)
            assert shared.held() == {"bob": 1}
            _refused_over_wire(wire.port)  # a Flight call in progress holds it now
        finally:
            blocked.set()
            holder.join(20)
        client.close()
        with _wire(wire.port) as session:
            assert session.execute("SELECT 2").fetchone() == (2,)
    finally:
        wire.stop()
        wire.database.close()
        door.stop()
        database.close()


def test_topicbase_serve_shares_one_count_between_its_doors(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    add_user(default_users_path(str(data_dir)), "bob", PASSWORDS["bob"], connection_limit=1)
    # (--flight-port 0 would mean no Flight door: a free port is taken)
    command = [sys.executable, "-c", "import sys; from sql.console import main; "
               "sys.exit(main(sys.argv[1:]))", "--data-dir", str(data_dir), "serve",
               "--auth", "scram", "--port", "0",
               "--flight-port", str(_free_port())]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, cwd=REPO)  # fmt: skip
    try:
        assert process.stdout is not None
        serving = process.stdout.readline()
        assert "serving" in serving, serving
        flight_line = process.stdout.readline()
        assert "Arrow Flight" in flight_line, flight_line
        wire_port = int(serving.rsplit(":", 1)[1])
        flight_port = int(flight_line.rsplit(":", 1)[1])
        with _wire(wire_port):
            _refused_over_flight(flight_port)
        for _ in range(1000):  # free again once the server has seen the session end
            try:
                client = _flight(flight_port)
                break
            except TopicbaseFlightError as error:
                assert error.sqlstate == "53300"
                threading.Event().wait(0.01)
        else:
            raise AssertionError("bob's place never came back")
        assert client.action("list") == []
        client.close()
    finally:
        process.terminate()
        process.communicate(timeout=30)
