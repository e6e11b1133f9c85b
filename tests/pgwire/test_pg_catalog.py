"""The emulated PostgreSQL catalog (``sql.pgwire.emulation.surface``) through psycopg: functions,
``pg_catalog``/``information_schema`` relations, session commands and their errors."""

from __future__ import annotations

from collections.abc import Callable

import psycopg
import pytest
from psycopg import errors

Connect = Callable[..., psycopg.Connection]


@pytest.fixture
def conn(connect: Connect) -> psycopg.Connection:
    connection = connect(autocommit=True)
    connection.execute("CREATE TABLE items (id INTEGER PRIMARY KEY, label VARCHAR NOT NULL, "
                       "price DECIMAL(8, 2) DEFAULT 0)")  # fmt: skip
    connection.execute("CREATE TOPIC orders (CONSUMER billing)")
    return connection


def test_server_functions(conn: psycopg.Connection) -> None:
    cursor = conn.execute("SELECT version(), current_schema(), current_database(), current_user")
    version, schema, database, user = cursor.fetchone()
    assert [column.name for column in cursor.description][:3] == [
        "version",
        "current_schema",
        "current_database",
    ]  # PostgreSQL names a function's column after the function
    assert version.startswith("PostgreSQL 15.0 ") and "Topicbase" in version
    assert (schema, database, user) == ("main", "topicbase", "tester")
    assert conn.execute("SELECT pg_catalog.pg_encoding_to_char(6)").fetchone() == ("UTF8",)
    assert conn.execute("SELECT pg_catalog.pg_get_userbyid(10)").fetchone() == ("tester",)


def test_pg_type_uses_postgresql_oids(conn: psycopg.Connection) -> None:
    rows = conn.execute(
        "SELECT oid, typname, typarray FROM pg_catalog.pg_type "
        "WHERE typname IN ('int4', 'text', 'bytea', 'timestamptz') ORDER BY oid"
    ).fetchall()
    assert rows == [(17, "bytea", 1001), (23, "int4", 1007), (25, "text", 1009),
                    (1184, "timestamptz", 1185)]  # fmt: skip
    assert conn.execute("SELECT to_regtype('integer'), to_regtype(%s)", ["hstore"]).fetchone() \
        == (23, None)  # fmt: skip
    assert conn.execute("SELECT format_type(1700, 524294), format_type(1043, 24)").fetchone() \
        == ("numeric(8,2)", "character varying(20)")  # fmt: skip


def test_columns_of_a_table_join_to_pg_type(conn: psycopg.Connection) -> None:
    rows = conn.execute(
        "SELECT a.attname, t.typname, a.attnotnull, pg_get_expr(d.adbin, d.adrelid) "
        "FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid "
        "LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum "
        "WHERE a.attrelid = 'items'::regclass AND a.attnum > 0 ORDER BY a.attnum"
    ).fetchall()
    assert rows == [("id", "int4", True, None), ("label", "text", True, None),
                    ("price", "numeric", False, "0")]  # fmt: skip


def test_pg_class_shows_tables_and_topics_and_hides_the_engine(conn: psycopg.Connection) -> None:
    rows = conn.execute(
        "SELECT c.relname, c.relkind, n.nspname FROM pg_class c "
        "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.relkind IN ('r', 'f') "
        "ORDER BY 1"
    ).fetchall()
    assert rows == [("items", "r", "main"), ("orders", "f", "main")]
    names = {row[0] for row in conn.execute("SELECT nspname FROM pg_namespace").fetchall()}
    assert "__topicbase" not in names and {"main", "pg_catalog"} <= names
    assert conn.execute(
        "SELECT count(*) FROM pg_class WHERE relname IN ('topics', 'offsets')"
    ).fetchone() == (0,)  # the engine's catalog tables in __topicbase


def test_information_schema_tables_and_columns(conn: psycopg.Connection) -> None:
    tables = conn.execute(
        "SELECT table_schema, table_name, table_type FROM information_schema.tables "
        "WHERE table_schema = 'main' ORDER BY table_name"
    ).fetchall()
    assert tables == [("main", "items", "BASE TABLE"), ("main", "orders", "FOREIGN")]
    columns = conn.execute(
        "SELECT column_name, data_type, is_nullable, numeric_precision, numeric_scale "
        "FROM information_schema.columns WHERE table_name = %s ORDER BY ordinal_position",
        ["items"],
    ).fetchall()
    assert columns == [("id", "integer", "NO", None, None), ("label", "text", "NO", None, None),
                       ("price", "numeric", "YES", 8, 2)]  # fmt: skip


def test_the_has_table_query_of_pandas_returns_no_rows(conn: psycopg.Connection) -> None:
    query = (
        "SELECT c.relname FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n "
        "ON n.oid = c.relnamespace WHERE c.relname = %s AND n.nspname = %s "
        "AND c.relkind = ANY (ARRAY['r', 'p', 'f', 'v', 'm'])"
    )
    assert conn.execute(query, ["missing", "main"]).fetchall() == []
    assert conn.execute(query, ["items", "main"]).fetchall() == [("items",)]


def test_pg_settings_and_show_all_follow_set(conn: psycopg.Connection) -> None:
    conn.execute("SET statement_timeout TO 2000")
    assert conn.execute(
        "SELECT setting FROM pg_settings WHERE name = 'statement_timeout'"
    ).fetchone() == ("2000ms",)
    shown = dict((row[0], row[1]) for row in conn.execute("SHOW ALL").fetchall())
    assert shown["statement_timeout"] == "2000ms" and shown["DateStyle"] == "ISO, MDY"
    conn.execute("RESET ALL")
    assert conn.execute("SHOW statement_timeout").fetchone() == ("0",)


def test_bad_settings_are_refused_with_sqlstates(conn: psycopg.Connection) -> None:
    with pytest.raises(errors.InvalidParameterValue):
        conn.execute("SET DateStyle = 'German'")
    with pytest.raises(errors.InvalidParameterValue):
        conn.execute("SET standard_conforming_strings = off")
    with pytest.raises(errors.UndefinedObject):
        conn.execute("SHOW my.unknown_setting")
    conn.execute("SET my.custom_setting = 'x'")
    assert conn.execute("SHOW my.custom_setting").fetchone() == ("x",)


def test_search_path_reaches_duckdb(conn: psycopg.Connection) -> None:
    conn.execute("CREATE SCHEMA extra")
    conn.execute("CREATE TABLE extra.notes (body VARCHAR)")
    conn.execute("SET search_path TO extra, main")
    assert conn.execute("SHOW search_path").fetchone() == ("extra, main",)
    conn.execute("INSERT INTO notes VALUES ('hi')")  # resolved in schema extra
    assert conn.execute("SELECT count(*) FROM extra.notes").fetchone() == (1,)
    assert conn.execute("SELECT count(*) FROM items").fetchone() == (0,)
    conn.execute("RESET search_path")
    with pytest.raises(errors.UndefinedTable):
        conn.execute("SELECT count(*) FROM notes")  # back to main only


def test_a_refused_set_fails_the_transaction(connect: Connect) -> None:
    connection = connect()
    connection.execute("SELECT 1")
    with pytest.raises(errors.InvalidParameterValue):
        connection.execute("SET client_encoding = 'LATIN1'")
    with pytest.raises(errors.InFailedSqlTransaction):
        connection.execute("SHOW client_encoding")
    connection.rollback()
    assert connection.execute("SHOW client_encoding").fetchone() == ("UTF8",)


def test_serial_columns_get_a_sequence(conn: psycopg.Connection) -> None:
    conn.execute("CREATE TABLE tickets (id SERIAL PRIMARY KEY, title VARCHAR)")
    ids = [conn.execute("INSERT INTO tickets (title) VALUES (%s) RETURNING id", [t]).fetchone()
           for t in ("a", "b")]  # fmt: skip
    assert ids == [(1,), (2,)]
    default = conn.execute(
        "SELECT column_default FROM information_schema.columns WHERE table_name = 'tickets' "
        "AND column_name = 'id'"
    ).fetchone()
    assert default == ("nextval('tickets_id_seq')",)


def test_deallocate_and_discard(conn: psycopg.Connection) -> None:
    conn.execute("DEALLOCATE ALL")
    with pytest.raises(errors.InvalidSqlStatementName):
        conn.execute("DEALLOCATE nothing_prepared")
    conn.execute("SET application_name = 'x'")
    conn.execute("DISCARD ALL")
    assert conn.execute("SHOW application_name").fetchone() == ("",)


def test_begin_with_an_isolation_level(connect: Connect) -> None:
    connection = connect()
    connection.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
    connection.execute("SELECT 1")  # psycopg sends BEGIN ISOLATION LEVEL REPEATABLE READ
    assert connection.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
    connection.rollback()
    serializable = connect()
    serializable.isolation_level = psycopg.IsolationLevel.SERIALIZABLE
    with pytest.raises(errors.SyntaxError):
        serializable.execute("SELECT 1")


def test_ordinary_queries_are_not_rewritten(conn: psycopg.Connection) -> None:
    conn.execute("INSERT INTO items VALUES (1, 'pg_class', 2.5)")  # catalog words in data
    assert conn.execute("SELECT label FROM items WHERE label LIKE 'pg_%'").fetchone() \
        == ("pg_class",)  # fmt: skip


def test_statement_timeout_cancels_a_waiting_read(conn: psycopg.Connection) -> None:
    conn.execute("SET statement_timeout = '300ms'")
    with pytest.raises(errors.QueryCanceled, match="statement timeout"):
        conn.execute(
            "SELECT data FROM TOPIC orders WITH (consumer = 'billing', wait = Interval('PT60S'))"
        )
    conn.execute("SET statement_timeout = 0")
    assert conn.execute("SELECT 1").fetchone() == (1,)  # the session carries on
