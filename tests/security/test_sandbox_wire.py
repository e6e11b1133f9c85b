"""The hostile-user suite over the wire: an ordinary SCRAM user with psycopg against a real
server tries every way out of the DuckDB sandbox the issue lists, and more.

Each attempt is refused (42501, or 54001 for nesting) through every door a statement
can take: the simple protocol, the extended protocol (parameters), a named cursor
(DECLARE/FETCH) and COPY. Throughout, a second client (a superuser) keeps being served,
the attacker's own connection stays usable, the users file and the internal catalog are
untouched, and ``topicbase check`` is clean afterwards.
"""

from __future__ import annotations

import os
from pathlib import Path

import psycopg
import pytest

from tests.security.conftest import ADMIN, WireServer


def refused(connection: psycopg.Connection, sql: str, parameters: tuple = ()) -> psycopg.Error:
    with pytest.raises(psycopg.Error) as caught:
        connection.execute(sql, parameters or None)
    return caught.value


def attacks(users_file: str, tmp_path: Path) -> list[str]:
    """The issue's attacks and the extra hatches, as an ordinary user would send them."""
    written = tmp_path / "written"
    return [
        # read any host file, the users file with every verifier included
        "SELECT * FROM read_text('/etc/passwd')",
        f"SELECT * FROM read_text('{users_file}')",
        f"SELECT * FROM read_blob('{users_file}')",
        "SELECT * FROM glob('/*')",
        "SELECT * FROM read_csv('/etc/passwd')",
        f"SELECT content FROM read_text('{users_file}') UNION ALL SELECT 'x'",
        # write any file: PREPARE + EXECUTE around COPY, EXPORT, ATTACH + CREATE TABLE
        f"PREPARE w AS COPY (SELECT 'x') TO '{users_file}' (FORMAT csv, HEADER false)",
        "EXECUTE w",
        f"EXPORT DATABASE '{written}'",
        f"ATTACH '{written}.duckdb' AS other",
        # network and extensions
        "INSTALL httpfs",
        "LOAD httpfs",
        "SET custom_extension_repository = 'http://127.0.0.1:9/'",
        "UPDATE EXTENSIONS",
        # global settings
        "SET memory_limit = '1MB'",
        "SET threads = 1",
        "SET enable_external_access = true",
        "SET max_expression_depth = 1000000",
        "PRAGMA threads = 1",
        # the internal catalog
        "DROP TABLE __topicbase.offsets",
        "DELETE FROM __topicbase.topics",
        'SELECT * FROM "__TOPICBASE"."topics"',
        "SELECT * FROM tables.__topicbase.transactions",
        "CREATE VIEW v AS SELECT * FROM __topicbase.topics",
        "SET search_path = '__topicbase'",
        "SELECT * FROM query_table('__topicbase.topics')",
        "SUMMARIZE __topicbase.topics",
        # more hatches from DuckDB's documentation and source
        "SELECT * FROM query('SELECT 1')",
        "SELECT * FROM json_execute_serialized_sql(json_serialize_sql('SELECT 1'))",
        "CREATE SECRET s (TYPE s3, KEY_ID 'k', SECRET 'v')",
        "SELECT * FROM duckdb_secrets()",
        "SELECT * FROM duckdb_databases()",
        "SELECT path FROM duckdb_databases",
        "SELECT * FROM pragma_database_list",
        "SELECT * FROM arrow_scan(0, 0, 0)",
        "SELECT * FROM enable_logging()",
        "CHECKPOINT",
        "FORCE CHECKPOINT",
        "CALL force_checkpoint()",
        "USE system",
        "DETACH tables",
        "SET VARIABLE v = 1",
    ]


def test_hostile_user_is_refused_everything_and_others_keep_being_served(
    wire_server: WireServer, tmp_path: Path
) -> None:
    admin = wire_server.login(ADMIN)
    admin.execute("CREATE TOPIC events (CONSUMER c)")
    admin.execute("INSERT INTO TOPIC events (data) VALUES ('kept')")
    users_before = Path(wire_server.users_file).read_bytes()
    attacker = wire_server.login()
    for sql in attacks(wire_server.users_file, tmp_path):
        error = refused(attacker, sql)
        if sql == "EXECUTE w":  # its PREPARE was refused: there is nothing to execute
            assert error.sqlstate != "00000"
        else:
            assert error.sqlstate == "42501", (sql, error.sqlstate, str(error))
            assert "permission denied" in str(error) or "not allowed" in str(error), sql
        assert attacker.execute("SELECT 1").fetchone() == (1,)
        assert admin.execute("SELECT count(*) FROM TOPIC events").fetchone() == (1,)
    assert Path(wire_server.users_file).read_bytes() == users_before
    assert not any(name.startswith("written") for name in os.listdir(tmp_path))
    assert admin.execute("SELECT name FROM sys.topics").fetchall() == [("events",)]
    assert admin.execute("SHOW memory_limit").fetchone() != ("1.0 MiB",)
    wire_server.stop()
    report = wire_server.check()
    assert report.ok, report.lines()


def test_every_door_of_the_wire_is_checked(wire_server: WireServer) -> None:
    attacker = wire_server.login()
    # extended protocol: a parameter cannot sneak a path past the check
    error = refused(attacker, "SELECT * FROM read_text(%s)", ("/etc/passwd",))
    assert error.sqlstate == "42501"
    error = refused(attacker, "SELECT * FROM __topicbase.topics WHERE name = %s", ("x",))
    assert error.sqlstate == "42501"
    # a named cursor (DECLARE ... CURSOR, FETCH)
    with attacker.transaction(), pytest.raises(psycopg.Error) as caught, \
            attacker.cursor(name="c") as cursor:  # fmt: skip
        cursor.execute("SELECT * FROM __topicbase.offsets")
        cursor.fetchall()
    assert caught.value.sqlstate == "42501"
    # COPY TO STDOUT of a query: the query is checked like any other
    copy_out = "COPY (SELECT * FROM read_text('/etc/passwd')) TO STDOUT"
    with pytest.raises(psycopg.Error) as caught, attacker.cursor().copy(copy_out):
        pass
    assert caught.value.sqlstate == "42501"
    # COPY to a server file is the wire server's own statement: never passed to DuckDB.
    error = refused(attacker, "COPY (SELECT 1) TO '/tmp/topicbase-wire-copy.csv'")
    assert error.sqlstate == "42501"
    assert not os.path.exists("/tmp/topicbase-wire-copy.csv")
    assert attacker.execute("SELECT 2").fetchone() == (2,)


def test_a_superuser_is_sandboxed_too(wire_server: WireServer) -> None:
    admin = wire_server.login(ADMIN)
    for sql in ("SELECT * FROM read_text('/etc/passwd')", "DROP TABLE __topicbase.offsets",
                "SET memory_limit = '1MB'", "INSTALL httpfs",
                "ATTACH ':memory:' AS m"):  # fmt: skip
        assert refused(admin, sql).sqlstate == "42501", sql
    admin.execute("CHECKPOINT")  # what a superuser may do that others may not
    assert admin.execute("SELECT 1").fetchone() == (1,)


def test_session_settings_still_work_over_the_wire(wire_server: WireServer) -> None:
    admin = wire_server.login(ADMIN)
    admin.execute("CREATE SCHEMA s2")
    admin.execute("CREATE TABLE s2.x (a INT)")
    admin.execute("SET search_path = s2, main")
    assert admin.execute("SHOW search_path").fetchone() == ("s2, main",)
    assert admin.execute("SELECT count(*) FROM x").fetchone() == (0,)
    admin.execute("RESET search_path")
    assert admin.execute("SET statement_timeout = 5000") is not None
