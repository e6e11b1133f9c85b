"""``sql.pgwire.emulation.pg_rewrite`` and ``pg_settings`` as pure functions (no server)."""

from __future__ import annotations

import pytest

from sql.pgwire.emulation.pg_rewrite import RewriteContext, might_need_rewrite, rewrite
from sql.pgwire.emulation.pg_settings import CantChangeRuntimeParameterError, PgSettings
from sql.pgwire.emulation.surface import plain_begin
from storage.errors import FeatureNotSupportedError, InvalidParameterValueError

CONTEXT = RewriteContext("ann", "shop", "15.0 (Topicbase 0.1)", (("datestyle", "ISO, MDY"),),
                         ("main",))  # fmt: skip


def test_plain_queries_are_left_alone() -> None:
    assert not might_need_rewrite("INSERT INTO t VALUES ('pg_class')")
    assert rewrite("SELECT label FROM items WHERE label LIKE 'pg_%'", CONTEXT) is None
    assert rewrite("SELECT * FROM not valid sql (((", CONTEXT) is None


def test_psql_operator_and_collation_become_duckdb_sql() -> None:
    sql = rewrite(
        "SELECT c.oid FROM pg_catalog.pg_class c WHERE c.relname OPERATOR(pg_catalog.~) "
        "'^(t)$' COLLATE pg_catalog.default AND pg_catalog.pg_table_is_visible(c.oid)",
        CONTEXT,
    )
    assert sql is not None
    assert "OPERATOR" not in sql and "COLLATE" not in sql
    assert sql.startswith("WITH __pg_constraint_source AS MATERIALIZED (")  # pg_class uses it
    assert "__pg_columns_source" not in sql  # not needed for pg_class
    assert "REGEXP_MATCHES(c.relname, '^(t)$')" in sql
    assert "FROM __pg_class AS c" in sql


def test_only_the_relations_used_are_added() -> None:
    sql = rewrite("SELECT datname FROM pg_database", CONTEXT)
    assert sql is not None and "__pg_database AS MATERIALIZED (" in sql
    assert "__pg_class" not in sql and "'shop' AS datname" in sql


def test_functions_are_answered_from_the_context() -> None:
    sql = rewrite("SELECT current_database(), current_user, pg_get_userbyid(10)", CONTEXT)
    assert sql is not None
    assert "'shop' AS current_database" in sql and "'ann'" in sql


def test_a_dropped_argument_keeps_its_parameter() -> None:
    sql = rewrite("SELECT pg_catalog.pg_get_constraintdef(oid, $1) FROM pg_constraint", CONTEXT)
    assert sql is not None and "$1" in sql


def test_own_ctes_come_after_the_catalog_ones() -> None:
    sql = rewrite("WITH x AS (SELECT oid FROM pg_namespace) SELECT * FROM x", CONTEXT)
    assert sql is not None
    assert sql.index("__pg_namespace AS MATERIALIZED (") < sql.index(
        "x AS (SELECT oid FROM __pg_namespace"
    )


def test_begin_with_modes_every_transaction_has() -> None:
    assert plain_begin("BEGIN ISOLATION LEVEL REPEATABLE READ") == "BEGIN"
    assert plain_begin("start transaction isolation level read committed, read write") == "BEGIN"
    assert plain_begin("BEGIN ISOLATION LEVEL SERIALIZABLE") == "BEGIN ISOLATION LEVEL SERIALIZABLE"
    assert plain_begin("BEGIN READ ONLY") == "BEGIN READ ONLY"


def test_settings_check_values() -> None:
    settings = PgSettings("15.0 (Topicbase 0.1)", "ann", "app")
    settings.set("DateStyle", "iso, dmy")
    assert settings.show("datestyle") == "ISO, DMY"
    settings.set("statement_timeout", "2s")
    assert settings.show("statement_timeout") == "2000ms"
    settings.set("transaction isolation level", "read committed")
    assert settings.show("transaction_isolation") == "repeatable read"  # what it really is
    with pytest.raises(InvalidParameterValueError):
        settings.set("statement_timeout", "soon")
    with pytest.raises(FeatureNotSupportedError):
        settings.set("default_transaction_isolation", "serializable")
    with pytest.raises(CantChangeRuntimeParameterError):
        settings.set("server_encoding", "LATIN1")
    settings.set("application_name", None)
    assert settings.show("application_name") == "app"  # back to the startup value
    settings.reset_all()
    assert settings.show("statement_timeout") == "0"
