"""SET in transactions and ParameterStatus (``sql.pgwire.emulation.setting_changes``), with psycopg.

psycopg keeps the last ParameterStatus of each name (``conn.info.parameter_status``), so
what the server reported is read back from the client itself.
"""

from __future__ import annotations

from collections.abc import Callable

import psycopg
import pytest

Connect = Callable[..., psycopg.Connection]


def _show(conn: psycopg.Connection, name: str) -> str:
    row = conn.execute(f"SHOW {name}").fetchone()
    assert row is not None
    return str(row[0])


def test_set_is_reported_with_parameter_status(connect: Connect) -> None:
    conn = connect(autocommit=True)
    assert conn.info.parameter_status("application_name") == ""
    conn.execute("SET application_name = 'loader'")
    assert conn.info.parameter_status("application_name") == "loader"
    conn.execute("SET DateStyle = 'ISO, DMY'")
    assert conn.info.parameter_status("DateStyle") == "ISO, DMY"
    conn.execute("RESET ALL")
    assert conn.info.parameter_status("application_name") == ""
    assert conn.info.parameter_status("DateStyle") == "ISO, MDY"
    # statement_timeout is not a reported setting: no ParameterStatus for it.
    conn.execute("SET statement_timeout = 5000")
    assert conn.info.parameter_status("statement_timeout") is None


def test_rollback_undoes_set_and_reports_the_old_value(connect: Connect) -> None:
    conn = connect()
    conn.execute("SET application_name = 'kept'")
    conn.commit()
    conn.execute("SET application_name = 'undone'")
    conn.execute("SET statement_timeout = 1234")
    assert _show(conn, "application_name") == "undone"
    conn.rollback()
    assert conn.info.parameter_status("application_name") == "kept"
    assert _show(conn, "application_name") == "kept"
    assert _show(conn, "statement_timeout") == "0"
    conn.rollback()


def test_a_failed_transaction_takes_its_set_back(connect: Connect) -> None:
    conn = connect()
    conn.execute("CREATE SCHEMA elsewhere")
    conn.execute("CREATE TABLE elsewhere.only_there (x INTEGER)")
    conn.commit()
    before = _show(conn, "search_path")
    conn.execute("SET search_path = elsewhere")
    conn.execute("SELECT * FROM only_there").fetchall()  # found through the new path
    with pytest.raises(psycopg.errors.UndefinedTable):
        conn.execute("SELECT * FROM missing_table")
    conn.commit()  # of a failed transaction: a rollback
    assert _show(conn, "search_path") == before
    with pytest.raises(psycopg.errors.UndefinedTable):  # DuckDB's path was put back too
        conn.execute("SELECT * FROM only_there")
    conn.rollback()


def test_commit_keeps_set_but_not_set_local(connect: Connect) -> None:
    conn = connect()
    conn.execute("SET statement_timeout = 7000")
    conn.execute("SET LOCAL application_name = 'for a moment'")
    assert _show(conn, "application_name") == "for a moment"
    conn.commit()
    assert _show(conn, "statement_timeout") == "7000ms"
    assert _show(conn, "application_name") == ""
    assert conn.info.parameter_status("application_name") == ""
    conn.rollback()


def test_set_local_outside_a_block_changes_nothing_and_warns(connect: Connect) -> None:
    conn = connect(autocommit=True)
    notices: list[str] = []
    conn.add_notice_handler(lambda diagnostic: notices.append(diagnostic.message_primary or ""))
    conn.execute("SET LOCAL application_name = 'ignored'")
    assert _show(conn, "application_name") == ""
    assert notices == ["SET LOCAL can only be used in transaction blocks"]
