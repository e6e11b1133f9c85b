"""A user's connection limit (PostgreSQL's role ``CONNECTION LIMIT``) over the real wire.

Round 25 found one ordinary user could take every unreserved slot (94 of 100) and lock
every other ordinary user out. The users file's ``connection_limit`` and the server's
``--max-connections-per-user`` bound an ordinary user's sessions; one more login gets
``FATAL 53300 too many connections for role "x"``; superusers are not bound (as in
PostgreSQL); a slot comes back when its session ends, however it ends.
"""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import psycopg
import pytest

from sql.pgwire import users
from sql.pgwire.limits import ServerLimits
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
    wait_until,
)
from tests.security.test_resources import _login_sqlstate


def _users_with_limits(tmp_path: Path, alice: int | None, admin: int | None) -> str:
    path = str(tmp_path / "limited_users.json")  # running_server writes users.json itself
    users.add_user(path, ADMIN, ADMIN_PASSWORD, superuser=True, connection_limit=admin)
    users.add_user(path, ALICE, ALICE_PASSWORD, connection_limit=alice)
    users.add_user(path, BOB, BOB_PASSWORD)
    return path


def test_a_users_connection_limit_refuses_one_more_session(tmp_path: Path) -> None:
    path = _users_with_limits(tmp_path, alice=2, admin=1)
    with running_server(tmp_path, users_file=path) as server:
        held = [login(server, ALICE, ALICE_PASSWORD) for _ in range(2)]
        with pytest.raises(psycopg.OperationalError,
                           match='too many connections for role "alice"'):  # fmt: skip
            login(server, ALICE, ALICE_PASSWORD)
        assert _login_sqlstate(server.port, ALICE, ALICE_PASSWORD) == "53300"
        # Another ordinary user is not bound by alice's limit; a superuser not by their own.
        bobs = [login(server, BOB, BOB_PASSWORD) for _ in range(3)]
        admins = [login(server, ADMIN, ADMIN_PASSWORD) for _ in range(2)]
        for connection in held + bobs + admins:
            assert connection.execute("SELECT 1").fetchone() == (1,)
        assert server.server.admission.by_user[ALICE] == 2
        held.pop().close()  # the slot comes back when a session ends
        wait_until(lambda: server.server.admission.by_user[ALICE] == 1)
        with login(server, ALICE, ALICE_PASSWORD) as again:
            assert again.execute("SELECT 2").fetchone() == (2,)
        for connection in held + bobs + admins:
            connection.close()
        wait_until(lambda: server.server.admission.sessions == 0)
        assert not server.server.admission.by_user  # nothing counted for nobody


def test_refused_and_failed_logins_take_no_slot_of_the_user(tmp_path: Path) -> None:
    path = _users_with_limits(tmp_path, alice=1, admin=None)
    with running_server(tmp_path, users_file=path) as server:
        with login(server, ALICE, ALICE_PASSWORD) as first:
            for _ in range(3):  # refused for the limit: nothing taken, nothing leaked
                assert _login_sqlstate(server.port, ALICE, ALICE_PASSWORD) == "53300"
            assert _login_sqlstate(server.port, ALICE, "wrong") == "28P01"
            assert server.server.admission.by_user[ALICE] == 1
            assert server.server.admission.sessions == 1
            assert first.execute("SELECT 3").fetchone() == (3,)
        wait_until(lambda: server.server.admission.sessions == 0)
        with login(server, ALICE, ALICE_PASSWORD) as second:  # the one slot is free again
            assert second.execute("SELECT 4").fetchone() == (4,)


def test_a_limit_of_zero_lets_the_user_not_log_in(tmp_path: Path) -> None:
    path = _users_with_limits(tmp_path, alice=0, admin=0)
    with running_server(tmp_path, users_file=path) as server:
        assert _login_sqlstate(server.port, ALICE, ALICE_PASSWORD) == "53300"
        with login(server, ADMIN, ADMIN_PASSWORD) as admin:  # superusers are not bound
            assert admin.execute("SELECT 5").fetchone() == (5,)


def test_the_servers_per_user_limit_binds_users_without_their_own(tmp_path: Path) -> None:
    path = _users_with_limits(tmp_path, alice=3, admin=None)
    limits = ServerLimits(connections_per_user_max=1)
    with running_server(tmp_path, users_file=path, limits=limits) as server:
        bob = login(server, BOB, BOB_PASSWORD)
        with pytest.raises(psycopg.OperationalError,
                           match='too many connections for role "bob"'):  # fmt: skip
            login(server, BOB, BOB_PASSWORD)
        alices = [login(server, ALICE, ALICE_PASSWORD) for _ in range(3)]  # her own: 3
        assert _login_sqlstate(server.port, ALICE, ALICE_PASSWORD) == "53300"
        admins = [login(server, ADMIN, ADMIN_PASSWORD) for _ in range(2)]
        for connection in [bob, *alices, *admins]:
            connection.close()


def test_a_limit_read_from_the_users_file_while_the_server_runs(tmp_path: Path) -> None:
    path = _users_with_limits(tmp_path, alice=None, admin=None)
    with running_server(tmp_path, users_file=path) as server:
        first = login(server, ALICE, ALICE_PASSWORD)
        users.add_user(path, ALICE, ALICE_PASSWORD, connection_limit=1)  # re-read at login
        assert _login_sqlstate(server.port, ALICE, ALICE_PASSWORD) == "53300"
        first.close()


def test_the_users_file_refuses_bad_limits(tmp_path: Path) -> None:
    path = str(tmp_path / "users.json")
    for bad in (-1, 2**31, True, "3", 1.5):
        with pytest.raises(InvalidParameterValueError):
            users.add_user(path, ALICE, ALICE_PASSWORD, connection_limit=bad)  # type: ignore[arg-type]
    users.add_user(path, ALICE, ALICE_PASSWORD, connection_limit=4)
    document = json.loads(Path(path).read_text())
    assert document["users"][ALICE]["connection_limit"] == 4
    users.add_user(path, BOB, BOB_PASSWORD)
    assert "connection_limit" not in json.loads(Path(path).read_text())["users"][BOB]
    for bad in (-1, "4", True, 1e3):  # null stays "no limit of their own"
        document["users"][ALICE]["connection_limit"] = bad
        Path(path).write_text(json.dumps(document))
        with pytest.raises(users.ConfigFileError, match='user "alice"'):
            users.read_users(path)


def test_user_add_and_list_on_the_command_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from sql.console import run_user

    data = str(tmp_path / "data")
    monkeypatch.setattr(sys, "stdin", io.StringIO("pw\n"))
    assert run_user(["add", "carol", "--data-dir", data, "--password-stdin",
                     "--connection-limit", "5"]) == 0  # fmt: skip
    monkeypatch.setattr(sys, "stdin", io.StringIO("pw\n"))
    assert run_user(["add", "dave", "--data-dir", data, "--password-stdin",
                     "--connection-limit", "-2"]) != 0  # fmt: skip
    assert "22023" in capsys.readouterr().err
    assert run_user(["list", "--data-dir", data]) == 0
    assert capsys.readouterr().out.splitlines() == ["carol\tconnection limit 5"]


def test_serve_option_reaches_the_limits() -> None:
    import argparse

    from sql.pgwire.limits import add_serve_arguments, serve_configuration

    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    limits, _ = serve_configuration(parser.parse_args(["--max-connections-per-user", "7"]))
    assert limits.connections_per_user_max == 7
    assert serve_configuration(parser.parse_args([]))[0].connections_per_user_max is None
    with pytest.raises(SystemExit):
        parser.parse_args(["--max-connections-per-user", "-1"])
    with pytest.raises(ValueError, match="connections_per_user_max"):
        ServerLimits(connections_per_user_max=-3)


def test_pg_roles_reports_each_users_own_connection_limit(tmp_path: Path) -> None:
    """``pg_roles.rolconnlimit`` and ``pg_authid.rolconnlimit`` say the users file's
    ``connection_limit`` (-1 when a user has none), as PostgreSQL's role catalog does."""
    path = _users_with_limits(tmp_path, alice=3, admin=7)
    with (running_server(tmp_path, users_file=path) as server,
          login(server, ALICE, ALICE_PASSWORD) as connection):  # fmt: skip
        for catalog in ("pg_roles", "pg_authid"):
            rows = dict(connection.execute(
                f"SELECT rolname, rolconnlimit FROM {catalog} "
                "WHERE rolname IN ('alice', 'bob', 'admin')").fetchall())  # fmt: skip
            assert rows == {ALICE: 3, BOB: -1, ADMIN: 7}, catalog
