"""What the flight tests (``test_insert_flight``, ``test_lookup_flight``,
``test_literal_flight``) share besides the raw client's messages (``rawclient``): the
users file of a superuser ``alice`` and an ordinary ``bob`` (passwords ``<user>-pw``,
as ``rawclient.FlightClient`` logs in) and a password-checking server over it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sql.pgwire.limits import ServerLimits
from sql.pgwire.server import ServerThread
from sql.pgwire.users import add_user


def without_key_data(replies: list[list[tuple[bytes, bytes]]]) -> list[list[tuple[bytes, bytes]]]:
    """Each reply's messages but BackendKeyData (``K``: it differs per connection)."""
    return [[r for r in reply if r[0] != b"K"] for reply in replies]


def logged(caplog: Any, *needles: str) -> int:
    """How many log records hold every one of ``needles``."""
    return sum(all(n in record.getMessage() for n in needles) for record in caplog.records)


def users_file(tmp_path: Path) -> str:
    """A users file of ``alice`` (superuser) and ``bob``."""
    path = str(tmp_path / "users.json")
    add_user(path, "alice", "alice-pw", superuser=True)
    add_user(path, "bob", "bob-pw")
    return path


def served(tmp_path: Path, users: str, name: str, limits: ServerLimits | None = None
           ) -> Iterator[ServerThread]:  # fmt: skip
    """One server over data directory ``name`` that checks passwords against ``users``,
    stopped when the loop over it ends."""
    server = ServerThread(str(tmp_path / name), "127.0.0.1", 0, limits, auth="password",
                          users_file=users)  # fmt: skip
    try:
        yield server
    finally:
        server.stop()
