"""Round 23 (H3): what one wire session's settings may hold.

Custom ``prefix.name`` settings had no bound in number or size, in a process every
session shares (PostgreSQL holds them in a backend of the session's own): past
``limits.SESSION_SETTINGS_CHARS_MAX`` characters a SET is 54000 and the session goes on.
``application_name`` is cut to 63 bytes (PostgreSQL cuts only pg_stat_activity's copy so):
a longer one went out in a ParameterStatus libpq refuses, losing the client its connection.
"""

from __future__ import annotations

import logging
from pathlib import Path

import psycopg
import pytest

from sql.pgwire.emulation.pg_settings import PgSettings
from storage import limits
from storage.errors import LimitExceededError
from tests.security.conftest import WireServer


def settings() -> PgSettings:
    return PgSettings("15.0", "alice", "app", superuser=False)


def test_custom_settings_are_bounded_together() -> None:
    held = settings()
    value = "v" * 100_000
    names = [f"my.s{index}" for index in range(limits.SESSION_SETTINGS_CHARS_MAX // 100_000 + 1)]
    for name in names[:-1]:
        held.set(name, value)
    with pytest.raises(LimitExceededError, match="RESET some first") as caught:
        held.set(names[-1], value)
    assert caught.value.sqlstate == "54000"
    held.set(names[0], "short")  # replacing one counts without the old value
    held.set(names[-1], value)
    held.set(names[1], None)  # RESET makes room
    assert held.show(names[-1]) == value


def test_custom_settings_are_bounded_in_number() -> None:
    """Review R2 F5: a SET summed every setting; 1 MiB of tiny ones made each SET slow."""
    held = settings()
    room = limits.SESSION_SETTINGS_MAX - len(held.values)
    for index in range(room):
        held.set(f"a.s{index}", "v")
    with pytest.raises(LimitExceededError, match="the most it may hold") as caught:
        held.set("a.one_more", "v")
    assert caught.value.sqlstate == "54000"
    held.set("a.s0", "replaced")  # an existing one may change
    held.set("a.s1", None)
    held.set("a.one_more", "v")


def test_one_huge_value_is_refused_and_the_old_one_stays() -> None:
    held = settings()
    held.set("my.tenant", "t1")
    with pytest.raises(LimitExceededError):
        held.set("my.tenant", "x" * (limits.SESSION_SETTINGS_CHARS_MAX + 1))
    assert held.show("my.tenant") == "t1"
    with pytest.raises(LimitExceededError):
        held.set("search_path", "x" * (limits.SESSION_SETTINGS_CHARS_MAX + 1))
    assert held.show("search_path") == "main"


def test_application_name_is_cut_to_63_bytes_of_whole_characters() -> None:
    held = PgSettings("15.0", "alice", "é" * 40, superuser=False)  # 80 bytes
    assert held.show("application_name") == "é" * 31  # 62 bytes: no half character
    held.set("application_name", "a" * 100)
    assert held.show("application_name") == "a" * 63
    held.set("application_name", "psql")
    assert held.show("application_name") == "psql"


def test_a_huge_application_name_leaves_the_client_connected(tmp_path: Path) -> None:
    logging.getLogger("sqlglot").setLevel(logging.CRITICAL)
    server = WireServer(tmp_path)
    try:
        connection = server.login()
        connection.execute(f"SET application_name = '{'n' * 100_000}'")
        assert connection.execute("SHOW application_name").fetchone() == ("n" * 63,)
        with pytest.raises(psycopg.errors.ProgramLimitExceeded):
            connection.execute(f"SET my.blob = '{'b' * (2 << 20)}'")
        assert connection.execute("SELECT 1").fetchone() == (1,)
    finally:
        server.stop()


def test_duckdbs_pg_settings_view_is_refused_and_the_wires_is_served(tmp_path: Path) -> None:
    """Review R2 F2: DuckDB's ``pg_catalog.pg_settings`` reads ``duckdb_settings()`` (the
    data directory's path); the wire answers PostgreSQL's ``pg_settings`` itself, and a
    spelling its rewrite leaves alone reached DuckDB's view."""
    logging.getLogger("sqlglot").setLevel(logging.CRITICAL)
    server = WireServer(tmp_path)
    try:
        connection = server.login()
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="for superusers"):
            connection.execute("SELECT setting FROM system.pg_catalog.pg_settings "
                               "WHERE name = 'temp_directory'")  # fmt: skip
        shown = connection.execute("SELECT pg_settings.setting FROM pg_catalog.pg_settings "
                                   "WHERE name = 'application_name'").fetchall()  # fmt: skip
        assert shown == [("",)]
        rows = connection.execute("SELECT name, setting FROM pg_settings").fetchall()
        assert ("search_path", "main") in rows
        assert str(tmp_path) not in str(rows)
    finally:
        server.stop()
