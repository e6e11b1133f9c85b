"""Fixtures of the security tests: a real SCRAM wire server with an ordinary user and a
superuser, and engine sessions acting as either.

``wire_server`` (for any test here): a ``ServerThread`` on a free loopback port whose
users file holds ``alice`` (ordinary, password ``ALICE_PASSWORD``) and ``admin``
(superuser, ``ADMIN_PASSWORD``). ``wire_server.login(user)`` opens an autocommit psycopg
connection (closed at teardown); ``wire_server.stop()`` stops the server, after which
``wire_server.check()`` runs ``topicbase check``'s offline check of the data directory.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from engine.check import check_database
from engine.database import Database
from sql.pgwire import users
from sql.pgwire.server import ServerThread
from storage.check_report import CheckReport

ALICE, ALICE_PASSWORD = "alice", "alice's long password"
ADMIN, ADMIN_PASSWORD = "admin", "admin's long password"
PASSWORDS = {ALICE: ALICE_PASSWORD, ADMIN: ADMIN_PASSWORD}


class WireServer:
    """A running server with its data directory and users file."""

    def __init__(self, tmp_path: Path) -> None:
        self.data_dir = str(tmp_path / "data")
        self.users_file = str(tmp_path / "users.json")
        users.add_user(self.users_file, ADMIN, ADMIN_PASSWORD, superuser=True)
        users.add_user(self.users_file, ALICE, ALICE_PASSWORD)
        self.server: ServerThread | None = ServerThread(
            self.data_dir, "127.0.0.1", 0, auth="scram", users_file=self.users_file
        )
        self.port = self.server.port
        self._connections: list[psycopg.Connection] = []

    def login(self, user: str = ALICE, **options: Any) -> psycopg.Connection:
        options.setdefault("autocommit", True)
        connection = psycopg.connect(
            host="127.0.0.1", port=self.port, user=user, password=PASSWORDS[user],
            dbname="topicbase", connect_timeout=10, **options,
        )  # fmt: skip
        self._connections.append(connection)
        return connection

    def stop(self) -> None:
        for connection in self._connections:
            connection.close()
        self._connections.clear()
        if self.server is not None:
            self.server.stop()
            self.server = None

    def check(self) -> CheckReport:
        """The offline ``topicbase check`` of the data directory (the server stopped)."""
        assert self.server is None, "stop the server first: the check takes its lock"
        return check_database(self.data_dir)


@pytest.fixture
def wire_server(tmp_path: Path) -> Iterator[WireServer]:
    running = WireServer(tmp_path)
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
def database(tmp_path: Path) -> Iterator[Database]:
    """An embedded database (no retention thread), closed after the test; a test file's
    own ``database`` fixture takes its place there."""
    database = Database.open(str(tmp_path / "data"), retention_interval_s=None)
    yield database
    database.close()
