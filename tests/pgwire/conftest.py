"""Fixtures of the PostgreSQL-wire tests: a server on a free loopback port, psycopg clients."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from engine.session import Session
from sql.pgwire.server import ServerThread


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerThread]:
    running = ServerThread(str(tmp_path / "data"), "127.0.0.1", 0)
    yield running
    running.stop()


@pytest.fixture
def connect(server: ServerThread) -> Iterator[Callable[..., psycopg.Connection]]:
    opened: list[psycopg.Connection] = []

    def open_connection(**options: object) -> psycopg.Connection:
        connection = psycopg.connect(
            host="127.0.0.1", port=server.port, user="tester", dbname="topicbase",
            connect_timeout=10, **options,
        )  # fmt: skip
        opened.append(connection)
        return connection

    yield open_connection
    for connection in opened:
        connection.close()


@pytest.fixture
def described(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The texts of the statements the engine is asked to describe (``Session.describe``,
    in the server's threads of this process), in order."""
    described: list[str] = []
    describe = Session.describe

    def counting(self: Session, statement: Any) -> Any:
        described.append(statement.text)
        return describe(self, statement)

    monkeypatch.setattr(Session, "describe", counting)
    return described
