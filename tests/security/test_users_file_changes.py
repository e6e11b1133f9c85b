"""A change of the users file reaches the sessions already open (round 18).

PostgreSQL's ALTER ROLE … NOSUPERUSER and DROP ROLE act on open sessions at once; the
users file is Topicbase's role catalog, re-read by the servers every
``USERS_FILE_POLL_S``. Over the wire: a demoted superuser's next statement is an ordinary
user's (``is_superuser`` reported off, superuser-only statements refused), a SET ROLE it
made as a superuser is undone (also one a ROLLBACK would restore), and a removed user's
session ends with FATAL 28000. Over Flight: a token stands for the user's entry at login,
so a removal or a new password refuses it, and a demotion acts at the next call.
Engine-level cases call ``Session.refresh_identity`` directly (no waiting on the watch).
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

from engine.database import Database
from engine.identity import Identity, RoleRemovedError
from spark_sql_ext.client import TopicbaseFlightError
from sql.flight.server import start_flight
from sql.pgwire import users
from sql.pgwire.users import add_user, default_users_path, remove_user
from storage.errors import InsufficientPrivilegeError
from tests.security.conftest import ADMIN, ADMIN_PASSWORD, WireServer

WAIT_S = 10.0


def _until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, "the change did not reach the session"
        time.sleep(0.05)


def _scalar(connection: psycopg.Connection, sql: str) -> object:
    row = connection.execute(sql).fetchone()
    assert row is not None
    return row[0]


def _refused(connection: psycopg.Connection, sql: str) -> None:
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        connection.execute(sql)


# -- over the wire ---------------------------------------------------------------------------
def test_a_demoted_superuser_is_demoted_in_its_open_session(wire_server: WireServer) -> None:
    admin = wire_server.login(ADMIN)
    assert admin.info.parameter_status("is_superuser") == "on"
    admin.execute("CREATE SCHEMA before_demotion")  # superusers only
    admin.execute("SET ROLE alice")
    assert _scalar(admin, "SELECT current_user") == "alice"
    assert admin.info.parameter_status("is_superuser") == "off"  # alice's, as in PostgreSQL
    users.add_user(wire_server.users_file, ADMIN, ADMIN_PASSWORD)  # without --superuser
    # the SET ROLE made as a superuser is undone: the session acts as admin again
    _until(lambda: _scalar(admin, "SELECT current_user") == "admin")
    assert _scalar(admin, "SHOW is_superuser") == "off"
    assert admin.info.parameter_status("is_superuser") == "off"
    _refused(admin, "CREATE SCHEMA after_demotion")
    _refused(admin, "SET ROLE alice")
    # a new session of the demoted user is an ordinary one as well
    again = wire_server.login(ADMIN)
    assert again.info.parameter_status("is_superuser") == "off"


def test_a_promotion_reaches_the_open_session(wire_server: WireServer) -> None:
    alice = wire_server.login()
    _refused(alice, "CREATE SCHEMA nope")
    users.add_user(wire_server.users_file, "alice", "alice's long password", superuser=True)
    _until(lambda: _scalar(alice, "SHOW is_superuser") == "on")
    alice.execute("CREATE SCHEMA now_allowed")


def test_a_removed_users_session_ends_with_28000(wire_server: WireServer) -> None:
    alice = wire_server.login()
    admin = wire_server.login(ADMIN)
    assert _scalar(alice, "SELECT 1") == 1
    assert remove_user(wire_server.users_file, "alice")

    def ended() -> bool:
        try:
            alice.execute("SELECT 1")
        except psycopg.OperationalError as error:
            assert error.sqlstate == "28000", error
            assert "removed from the users file" in str(error)
            return True
        return False

    _until(ended)
    assert alice.closed or alice.broken
    assert _scalar(admin, "SELECT 2") == 2  # others go on


def test_a_rollback_does_not_restore_a_superuser_role_taken_back(
    wire_server: WireServer,
) -> None:
    admin = wire_server.login(ADMIN)
    admin.execute("BEGIN")
    admin.execute("SET ROLE alice")
    users.add_user(wire_server.users_file, ADMIN, ADMIN_PASSWORD)
    _until(lambda: _scalar(admin, "SELECT current_user") == "admin")
    admin.execute("ROLLBACK")  # its undo would put back the superuser admin of BEGIN's time
    assert _scalar(admin, "SELECT current_user") == "admin"
    _refused(admin, "CREATE SCHEMA after_rollback")


# -- the engine's part, without the watch ------------------------------------------------------
@pytest.fixture
def database(tmp_path: Path):
    opened = Database.open(str(tmp_path / "data"))
    yield opened
    opened.close()


def test_refresh_keeps_an_unchanged_identity_the_same_object(database: Database) -> None:
    session = database.connect(Identity("admin", superuser=True))
    before = session.identity
    session.refresh_identity(lambda name: name == "admin")
    assert session.identity is before  # the door's memo, keyed by it, stays valid
    session.refresh_identity(lambda name: False)
    assert session.identity == Identity("admin", superuser=False)
    with pytest.raises(RoleRemovedError):
        session.refresh_identity(lambda name: None)
    session.close()


def test_refresh_takes_back_session_authorization_and_its_rollback(database: Database) -> None:
    flags = {"admin": True, "alice": False}
    session = database.connect(Identity("admin", superuser=True))
    session.execute("SET SESSION AUTHORIZATION alice")
    session.execute("BEGIN; SET SESSION AUTHORIZATION admin; SET ROLE alice")
    flags["admin"] = False
    session.refresh_identity(flags.get)
    assert session.identity == Identity("admin", superuser=False)
    session.execute("ROLLBACK")
    session.execute("SELECT 1")  # the undo runs at the next statement
    assert session.identity == Identity("admin", superuser=False)
    with pytest.raises(InsufficientPrivilegeError):
        session.execute("SET SESSION AUTHORIZATION alice")
    session.close()


# -- over Flight ----------------------------------------------------------------------------------
def test_flight_tokens_follow_the_users_file(tmp_path: Path) -> None:
    from spark_sql_ext.client import TopicbaseClient

    database = Database.open(str(tmp_path / "data"), retention_interval_s=None)
    path = default_users_path(database.path)
    add_user(path, "alice", "alice-secret", superuser=True)
    add_user(path, "bob", "bob-secret")
    owner = database.connect()
    owner.execute("CREATE TABLE secret (k INTEGER); INSERT INTO secret VALUES (1)")
    owner.close()
    door = start_flight(database, "127.0.0.1", 0, "scram")
    url = f"topicbase://127.0.0.1:{door.port}"
    alice = TopicbaseClient(url, "alice", "alice-secret")
    bob = TopicbaseClient(url, "bob", "bob-secret")
    try:
        assert alice.read_all({"table": "secret"}).num_rows == 1
        # demoted by an edit of the file that keeps her verifier: her token stands, demoted
        entries = users.read_users(path)
        entries["alice"] = dataclasses.replace(entries["alice"], superuser=False)
        users.write_atomic(path, users.render_users(entries))
        with pytest.raises(TopicbaseFlightError) as caught:
            alice.read_all({"table": "secret"})
        assert caught.value.sqlstate == "42501"
        add_user(path, "alice", "alice-secret")  # rewritten (a new salt): tokens revoked
        with pytest.raises(TopicbaseFlightError) as caught:
            alice.staged()
        assert caught.value.sqlstate == "28000"
        alice.close()
        alice = TopicbaseClient(url, "alice", "alice-secret")
        assert bob.staged() == []  # bob's token works until his entry changes
        add_user(path, "bob", "bob's new secret")  # a new password revokes bob's tokens
        with pytest.raises(TopicbaseFlightError) as caught:
            bob.staged()
        assert caught.value.sqlstate == "28000"
        assert alice.staged() == []
        remove_user(path, "alice")
        with pytest.raises(TopicbaseFlightError) as caught:
            alice.staged()
        assert caught.value.sqlstate == "28000"
    finally:
        alice.close()
        bob.close()
        door.stop()
        database.close()


def test_is_superuser_follows_the_current_role(wire_server: WireServer) -> None:
    """As PostgreSQL reports it: SET ROLE to an ordinary user shows off, RESET ROLE on; a
    ROLLBACK that puts other settings back leaves it as the role now is (review R1-18 F6)."""
    admin = wire_server.login(ADMIN)
    admin.execute("SET ROLE alice")
    assert _scalar(admin, "SHOW is_superuser") == "off"
    assert admin.info.parameter_status("is_superuser") == "off"
    admin.execute("RESET ROLE")
    assert _scalar(admin, "SHOW is_superuser") == "on"
    assert admin.info.parameter_status("is_superuser") == "on"
    admin.execute("BEGIN")
    admin.execute("SET application_name = 'x'")
    users.add_user(wire_server.users_file, ADMIN, ADMIN_PASSWORD)
    _until(lambda: _scalar(admin, "SHOW is_superuser") == "off")
    admin.execute("ROLLBACK")
    assert _scalar(admin, "SHOW is_superuser") == "off"
    assert admin.info.parameter_status("is_superuser") == "off"


def test_is_superuser_is_reported_at_the_rollback_that_undoes_a_set_role(
    wire_server: WireServer,
) -> None:
    """A ROLLBACK that undoes a SET ROLE made in its transaction reports the role's flag
    as it now is in its own ParameterStatus, as PostgreSQL does, not at the statement after."""
    admin = wire_server.login(ADMIN)
    admin.execute("BEGIN")
    admin.execute("SET ROLE alice")
    assert admin.info.parameter_status("is_superuser") == "off"
    admin.execute("ROLLBACK")
    assert admin.info.parameter_status("is_superuser") == "on"
    assert _scalar(admin, "SHOW is_superuser") == "on"
    assert _scalar(admin, "SELECT current_user") == ADMIN


# -- the users file's unusable states (review R1-18 F1-F5) ------------------------------------
def _file_with(path: Path, superuser: bool) -> users.UsersFile:
    users.add_user(str(path), "admin", "admin's long password", superuser=superuser)
    watched = users.UsersFile(str(path))
    assert watched.reload() is None
    return watched


# How the path becomes unusable ("missing": it stays as the test left it, removed).
_UNUSABLE: dict[str, Callable[[Path], object]] = {
    "a directory": lambda path: path.mkdir(),
    "a FIFO": lambda path: os.mkfifo(path),
    "deeply nested JSON": lambda path: path.write_text("[" * 200_000),
    "a symlink loop": lambda path: path.symlink_to(path),
    "missing": lambda path: None,
}


@pytest.mark.parametrize("name", sorted(_UNUSABLE))
def test_an_unusable_file_keeps_the_last_good_contents(tmp_path: Path, name: str) -> None:
    path = tmp_path / "users.json"
    watched = _file_with(path, superuser=True)
    generation = watched.generation
    good = path.read_bytes()
    path.unlink()
    _UNUSABLE[name](path)
    outcome: list[object] = []
    reader = threading.Thread(target=lambda: outcome.append(watched.reload()), daemon=True)
    reader.start()
    reader.join(5.0)
    assert not reader.is_alive(), f"reload blocked on {name}"
    assert isinstance(outcome[0], users.ConfigFileError), name
    assert watched.generation == generation and watched.is_superuser("admin")
    # back to a good file: taken at once
    if path.is_dir() and not path.is_symlink():
        path.rmdir()
    elif path.exists() or path.is_symlink():
        path.unlink()
    path.write_bytes(good.replace(b'"superuser": true', b'"superuser": false'))
    assert watched.reload() is None
    assert watched.generation == generation + 1 and not watched.is_superuser("admin")


def test_a_missing_file_before_any_good_read_means_no_users(tmp_path: Path) -> None:
    watched = users.UsersFile(str(tmp_path / "absent.json"))
    assert watched.reload() is None and watched.count() == 0


def test_the_same_unusable_file_is_not_read_again(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "users.json"
    watched = _file_with(path, superuser=False)
    path.write_text('{"format": "topicbase-users-1", "users": {"x": 1}}')
    reads: list[str] = []
    real = users.read_users
    monkeypatch.setattr(users, "read_users", lambda p: reads.append(p) or real(p))
    first, second = watched.reload(), watched.reload()
    assert isinstance(first, users.ConfigFileError) and second is first
    assert len(reads) == 1


def test_reloads_store_the_newest_contents(tmp_path: Path, monkeypatch) -> None:
    """A reload that read older contents slowly never stores them after a newer one
    (review R1-18 F3): reloads run one at a time."""
    path = tmp_path / "users.json"
    watched = _file_with(path, superuser=True)
    real = users.read_users
    reading, release = threading.Event(), threading.Event()

    def slow_first(p: str) -> dict:
        contents = real(p)
        if not reading.is_set():
            reading.set()
            release.wait(5.0)
        return contents

    path.unlink()
    users.add_user(str(path), "admin", "admin's long password", superuser=True)  # contents 1
    monkeypatch.setattr(users, "read_users", slow_first)  # add_user reads the file too
    first = threading.Thread(target=watched.reload)
    first.start()
    assert reading.wait(5.0)
    path.unlink()
    users.add_user(str(path), "admin", "admin's long password")  # contents 2: demoted
    second = threading.Thread(target=watched.reload)
    second.start()
    time.sleep(0.1)
    release.set()
    first.join(5.0)
    second.join(5.0)
    assert not watched.is_superuser("admin")


def test_the_watch_outlives_an_unexpected_error(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "users.json"
    watched = _file_with(path, superuser=True)
    real = watched.reload
    failures = [RuntimeError("boom")]

    def reload_once_failing() -> object:
        if failures:
            raise failures.pop()
        return real()

    monkeypatch.setattr(watched, "reload", reload_once_failing)
    watch = users.UsersWatch(watched, 0.02).start()
    try:
        _until(lambda: not failures)
        users.add_user(str(path), "admin", "admin's long password")
        _until(lambda: not watched.is_superuser("admin"))
    finally:
        watch.stop()
