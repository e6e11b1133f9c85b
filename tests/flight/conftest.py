"""Fixtures of the Flight door tests: a data directory with two users, the door on a free
loopback port, clients logged in as either user (no Spark needed), and calls held in
progress at will (``blocked``)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from engine.database import Database
from spark_sql_ext.client import TopicbaseClient
from sql.flight import server as flight_server
from sql.flight.server import TopicbaseFlightServer, start_flight
from sql.pgwire.users import add_user, default_users_path

PASSWORDS = {"alice": "alice-secret", "bob": "bob-secret"}


@pytest.fixture
def database(tmp_path: Path) -> Iterator[Database]:
    db = Database.open(str(tmp_path / "data"), retention_interval_s=None)
    add_user(default_users_path(db.path), "alice", PASSWORDS["alice"], superuser=True)
    add_user(default_users_path(db.path), "bob", PASSWORDS["bob"])
    yield db
    db.close()


@pytest.fixture
def door(database: Database) -> Iterator[TopicbaseFlightServer]:
    server = start_flight(database, "127.0.0.1", 0, "scram")
    yield server
    server.stop()


@pytest.fixture
def client(door: TopicbaseFlightServer) -> Iterator[Callable[[str], TopicbaseClient]]:
    opened: list[TopicbaseClient] = []

    def connect(user: str = "alice", password: str | None = None) -> TopicbaseClient:
        connection = TopicbaseClient(f"topicbase://127.0.0.1:{door.port}", user,
                                     PASSWORDS[user] if password is None else password)
        opened.append(connection)
        return connection

    yield connect
    for connection in opened:
        connection.close()


def wait_until(condition: Callable[[], Any], timeout_s: float = 10.0) -> None:
    """Poll ``condition`` every 10 ms until it holds; AssertionError after ``timeout_s``."""
    pause = threading.Event()
    for _ in range(int(timeout_s / 0.01)):
        if condition():
            return
        pause.wait(0.01)
    raise AssertionError("condition not reached")


@pytest.fixture
def blocked(monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    """The door's ``relations`` action waits for the event: calls held in progress at will."""
    gate = threading.Event()
    relations = flight_server.TopicbaseFlightServer._relations

    def waiting(session: Any) -> Any:
        assert gate.wait(20)
        return relations(session)

    monkeypatch.setattr(flight_server.TopicbaseFlightServer, "_relations",
                        staticmethod(waiting))  # fmt: skip
    yield gate
    gate.set()
