"""A wire server whose users log in with SCRAM passwords, for privilege tests.

``alice`` is a superuser; ``bob`` and any other name given are ordinary users; each
user's password is ``<name>-pw``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import psycopg

from sql.pgwire.server import ServerThread
from sql.pgwire.users import add_user


@contextlib.contextmanager
def scram_server(tmp_path: Path, *ordinary_users: str) -> Iterator[ServerThread]:
    """A running server over ``tmp_path / "data"`` (stopped on exit)."""
    users_file = str(tmp_path / "users.json")
    add_user(users_file, "alice", "alice-pw", superuser=True)
    for name in ("bob", *ordinary_users):
        add_user(users_file, name, f"{name}-pw")
    running = ServerThread(str(tmp_path / "data"), "127.0.0.1", 0, auth="scram",
                           users_file=users_file)  # fmt: skip
    try:
        yield running
    finally:
        running.stop()


def login(server: ServerThread, user: str) -> psycopg.Connection:
    """An autocommit connection as ``user`` with its password."""
    return psycopg.connect(host="127.0.0.1", port=server.port, user=user,
                           password=f"{user}-pw", dbname="topicbase", autocommit=True,
                           connect_timeout=10)  # fmt: skip
