"""Helpers of the bounded-resources tests: servers with users, psycopg logins, timing."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg

from sql.pgwire import users
from sql.pgwire.server import ServerThread

ADMIN, ADMIN_PASSWORD = "admin", "admin's secret"  # a superuser
ALICE, ALICE_PASSWORD = "alice", "correct horse"  # ordinary users
BOB, BOB_PASSWORD = "bob", "battery staple"


def write_users(tmp_path: Path) -> str:
    path = str(tmp_path / "users.json")
    users.add_user(path, ADMIN, ADMIN_PASSWORD, superuser=True)
    users.add_user(path, ALICE, ALICE_PASSWORD)
    users.add_user(path, BOB, BOB_PASSWORD)
    return path


@contextmanager
def running_server(tmp_path: Path, **options: Any) -> Iterator[ServerThread]:
    """A SCRAM server on a free loopback port with the users above (trust if asked)."""
    options.setdefault("auth", "scram")
    if options["auth"] != "trust":
        options.setdefault("users_file", write_users(tmp_path))
    server = ServerThread(str(tmp_path / "data"), "127.0.0.1", 0, **options)
    try:
        yield server
    finally:
        server.stop()


def login(server: ServerThread, user: str, password: str, **options: Any) -> psycopg.Connection:
    options.setdefault("autocommit", True)
    return psycopg.connect(host="127.0.0.1", port=server.port, user=user, password=password,
                           dbname="topicbase", connect_timeout=10, **options)  # fmt: skip


def timed(function: Callable[[], Any]) -> tuple[Any, float]:
    started_s = time.monotonic()
    outcome = function()
    return outcome, time.monotonic() - started_s


def wait_until(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline_s = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline_s:
            raise AssertionError("condition not reached in time")
        time.sleep(0.02)
