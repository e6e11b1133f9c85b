"""The DuckDB sandbox through the engine's sessions and the DB-API.

Every escape hatch is tried by a superuser (the console's and DB-API's identity) and by
an ordinary user: the sandbox binds both, and each refusal is 42501 with its reason.
Where a refusal could hide a success (a file written, a setting changed, the catalog
dropped), the test also looks at the effect itself.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engine import tables
from engine.check import check_database
from engine.database import Database
from engine.identity import LOCAL_SUPERUSER, Identity
from engine.session import Session
from sql import dbapi
from storage.errors import InsufficientPrivilegeError, TopicbaseError

ALICE = Identity("alice", superuser=False)


@pytest.fixture
def database(tmp_path: Path) -> Iterator[Database]:
    opened = Database.open(str(tmp_path / "data"), retention_interval_s=None)
    admin = opened.connect()
    admin.execute("CREATE TOPIC events (CONSUMER c); CREATE TABLE t (a INT); "
                  "INSERT INTO t VALUES (1), (2); "
                  "INSERT INTO TOPIC events (data) VALUES ('m')")  # fmt: skip
    admin.close()
    yield opened
    opened.close()


@pytest.fixture(params=["superuser", "alice"])
def session(request: pytest.FixtureRequest, database: Database) -> Iterator[Session]:
    identity = LOCAL_SUPERUSER if request.param == "superuser" else ALICE
    opened = database.connect(identity)
    yield opened
    opened.close()


def _user_relations(session: Session) -> list[tuple[Any, ...]]:
    """Every table, view and macro outside DuckDB's own (the internal catalog's too)."""
    return rows(session, "SELECT database_name, schema_name, table_name FROM duckdb_tables() "
                "UNION ALL SELECT database_name, schema_name, view_name FROM duckdb_views() "
                "WHERE NOT internal UNION ALL SELECT database_name, schema_name, function_name "
                "FROM duckdb_functions() WHERE NOT internal ORDER BY ALL")  # fmt: skip


@pytest.fixture(scope="module")
def refusing_database(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Database]:
    """One ``database`` for the tests that only see statements refused (a refused
    statement changes nothing): at the end its catalog, relations, rows and messages
    must be what they were at the start, and ``check`` clean."""
    path = str(tmp_path_factory.mktemp("refusing") / "data")
    opened = Database.open(path, retention_interval_s=None)
    admin = opened.connect()
    admin.execute("CREATE TOPIC events (CONSUMER c); CREATE TABLE t (a INT); "
                  "INSERT INTO t VALUES (1), (2); "
                  "INSERT INTO TOPIC events (data) VALUES ('m')")  # fmt: skip
    relations = _user_relations(admin)
    admin.close()
    yield opened
    admin = opened.connect()
    assert _user_relations(admin) == relations
    assert rows(admin, "SELECT name FROM sys.topics") == [("events",)]
    assert rows(admin, "SELECT data FROM TOPIC events") == [(b"m",)]
    assert rows(admin, "SELECT a FROM t ORDER BY a") == [(1,), (2,)]
    admin.close()
    opened.close()
    report = check_database(path)
    assert report.ok, report.lines()


@pytest.fixture(params=["superuser", "alice"])
def refusing_session(
    request: pytest.FixtureRequest, refusing_database: Database
) -> Iterator[Session]:
    """A new session of ``refusing_database`` as the local superuser or as alice."""
    identity = LOCAL_SUPERUSER if request.param == "superuser" else ALICE
    opened = refusing_database.connect(identity)
    yield opened
    opened.close()


def refusal(session: Session, sql: str) -> TopicbaseError:
    with pytest.raises(TopicbaseError) as caught:
        session.execute(sql)
    return caught.value


def rows(session: Session, sql: str) -> list[tuple[Any, ...]]:
    result = session.execute(sql)[-1]
    assert result.table is not None
    return [tuple(row.values()) for row in result.table.to_pylist()]


# (statement, a fragment of the reason): each must be refused with 42501, whoever asks.
ESCAPES = [
    # host files
    ("SELECT * FROM read_text('/etc/passwd')", "reads files"),
    ("SELECT * FROM READ_BLOB('/etc/passwd')", "reads files"),
    ('SELECT * FROM "read_csv"(\'/etc/passwd\')', "reads files"),
    ("SELECT * FROM main.read_text('/etc/passwd')", "reads files"),
    ("SELECT * FROM system.main.read_text('/etc/passwd')", "reads files"),
    ("SELECT * FROM glob('/*')", "reads files"),
    ("SELECT * FROM sniff_csv('/etc/passwd')", "reads files"),
    ("SELECT * FROM parquet_metadata('/x.parquet')", "reads files"),
    ("SELECT * FROM read_duckdb('/x.duckdb')", "reads files"),
    ("SELECT (SELECT content FROM read_text('/etc/passwd'))", "reads files"),
    ("CREATE TABLE stolen AS SELECT * FROM read_csv('/etc/passwd')", "reads files"),
    ("CREATE VIEW stolen AS SELECT * FROM read_text('/etc/passwd')", "reads files"),
    ("CREATE MACRO f(p) AS TABLE SELECT * FROM read_text(p)", "reads files"),
    ("COPY t TO '/tmp/topicbase-sandbox-copy.csv'", "COPY to or from a file"),
    ("COPY (SELECT 1) TO '/tmp/topicbase-sandbox-copy.csv' (FORMAT csv)", "COPY to or from"),
    ("COPY t FROM '/etc/passwd'", "COPY to or from a file"),
    ("PREPARE w AS COPY (SELECT 1) TO '/tmp/topicbase-sandbox-copy.csv'", "COPY to or from"),
    ("EXPORT DATABASE '/tmp/topicbase-sandbox-export'", "EXPORT DATABASE"),
    ("IMPORT DATABASE '/tmp/topicbase-sandbox-export'", "IMPORT DATABASE"),
    # other databases and catalogs
    ("ATTACH ':memory:' AS other", "ATTACH"),
    ("ATTACH '/tmp/topicbase-sandbox.duckdb' AS other", "ATTACH"),
    ("DETACH tables", "DETACH"),
    ("USE system", "USE"),
    ("COPY FROM DATABASE tables TO other", "COPY FROM DATABASE"),
    # extensions and the network
    ("INSTALL httpfs", "extensions"),
    ("FORCE INSTALL httpfs FROM 'http://127.0.0.1:1/'", "extensions"),
    ("LOAD httpfs", "extensions"),
    ("UPDATE EXTENSIONS", "UPDATE EXTENSIONS"),
    # secrets
    ("CREATE SECRET s (TYPE s3, KEY_ID 'k', SECRET 'v')", "secrets"),
    ("CREATE PERSISTENT SECRET s (TYPE s3, KEY_ID 'k', SECRET 'v')", "secrets"),
    ("DROP SECRET s", "secrets"),
    ("CREATE OR REPLACE TEMPORARY SECRET s (TYPE s3, KEY_ID 'k', SECRET 'v')", "secrets"),
    ("DROP PERSISTENT SECRET IF EXISTS s", "secrets"),
    ("SELECT * FROM duckdb_secrets()", "duckdb_secrets()"),
    ("SELECT * FROM which_secret('s3://b/k', 's3')", "which_secret()"),
    # global settings
    ("SET memory_limit = '1MB'", "memory_limit"),
    ("SET threads = 1", "threads"),
    ("SET max_expression_depth = 100000", "max_expression_depth"),
    ("SET enable_external_access = true", "enable_external_access"),
    ("SET lock_configuration = false", "lock_configuration"),
    ("SET custom_extension_repository = 'http://127.0.0.1:1/'", "custom_extension_repository"),
    ("SET temp_directory = '/tmp'", "temp_directory"),
    ("SET profiling_output = '/tmp/topicbase-profile'", "profiling_output"),
    ("SET GLOBAL search_path = 'main'", "search_path"),
    ("SET SESSION TimeZone = 'UTC'", "timezone"),
    ("RESET memory_limit", "RESET"),
    ("SET VARIABLE v = 1", "variables"),
    ("PRAGMA memory_limit = '1MB'", "memory_limit"),
    ("PRAGMA threads = 1", "threads"),
    ("PRAGMA enable_profiling", "PRAGMA enable_profiling"),
    ("PRAGMA database_list", "PRAGMA database_list"),
    ("PRAGMA disable_checkpoint_on_shutdown", "PRAGMA disable_checkpoint_on_shutdown"),
    ("PRAGMA force_checkpoint", "PRAGMA force_checkpoint"),
    ("PRAGMA storage_info('t')", "PRAGMA storage_info"),
    # functions that run SQL from strings, reach memory or change state
    ("SELECT * FROM query('SELECT 1')", "runs SQL given as a string"),
    ("SELECT * FROM query_table('t')", "runs SQL given as a string"),
    ("SELECT * FROM histogram('t', a)", "runs SQL given as a string"),
    ("SELECT * FROM t JOIN LATERAL histogram(t, a) ON true", "runs SQL given as a string"),
    ("SELECT * FROM json_execute_serialized_sql(json_serialize_sql('SELECT 1'))",
     "runs SQL given as a string"),
    ("SELECT * FROM arrow_scan(0, 0, 0)", "arrow_scan()"),
    ("SELECT * FROM enable_logging()", "enable_logging()"),
    ("SELECT * FROM truncate_duckdb_logs()", "truncate_duckdb_logs()"),
    ("SELECT * FROM checkpoint()", "checkpoint()"),
    ("SELECT * FROM force_checkpoint()", "force_checkpoint()"),
    ("SELECT * FROM duckdb_databases()", "duckdb_databases()"),
    # DuckDB's built-in views over refused functions (round 23): the paths, the log
    ("SELECT path FROM duckdb_databases", "view duckdb_databases"),
    ("SELECT file FROM main.pragma_database_list", "view pragma_database_list"),
    ('SELECT * FROM "DuckDB_Logs"', "view duckdb_logs"),
    ("SELECT * FROM system.main.duckdb_databases", "view duckdb_databases"),
    # DuckDB's built-in scalar macro over pragma_database_size() (review R2 F7)
    ("SELECT get_block_size('tables')", "get_block_size()"),
    ("CREATE VIEW paths AS SELECT * FROM duckdb_databases", "view duckdb_databases"),
    ("SELECT * FROM duckdb_temporary_files()", "duckdb_temporary_files()"),
    ("SELECT * FROM add_grammar_extension('x')", "add_grammar_extension()"),
    ("SELECT * FROM test_all_types()", "test_all_types()"),
    ("SELECT * FROM duckdb_extensions()", "duckdb_extensions()"),
    ("SELECT * FROM python_map_function('t', 'f')", "python_map_function()"),
    ("CALL pragma_version()", "pragma_version()"),
    ("CALL dbgen(sf = 1)", "CALL"),
    # transaction control is Topicbase's
    ("SAVEPOINT s", None),
]
# The internal catalog, by every spelling.
INTERNAL = [
    "SELECT * FROM __topicbase.topics",
    'SELECT * FROM "__topicbase"."offsets"',
    'SELECT * FROM "__TopicBase".topics',
    "SELECT * FROM __TOPICBASE.TOPICS",
    "SELECT * FROM tables.__topicbase.topics",
    'SELECT * FROM "tables"."__topicbase"."transactions"',
    "DELETE FROM __topicbase.topics",
    "DROP TABLE __topicbase.offsets",
    "DROP SCHEMA __topicbase CASCADE",
    "UPDATE __topicbase.offsets SET committed = 0",
    "INSERT INTO __topicbase.topics SELECT * FROM __topicbase.topics",
    "ALTER TABLE __topicbase.topics RENAME TO gone",
    "CREATE TABLE __topicbase.extra (a INT)",
    "WITH x AS (SELECT * FROM __topicbase.topics) SELECT * FROM x",
    "SELECT * FROM t WHERE a IN (SELECT 1 FROM __topicbase.offsets)",
    "CREATE VIEW peek AS SELECT * FROM __topicbase.topics",
    "CREATE MACRO peek() AS TABLE SELECT * FROM __topicbase.topics",
    "CREATE MACRO peek() AS (SELECT count(*) FROM __topicbase.topics)",
    "SUMMARIZE __topicbase.topics",
    "DESCRIBE __topicbase.topics",
    "SHOW __topicbase.topics",
    "SHOW TABLES FROM __topicbase",
    "PRAGMA table_info('__topicbase.topics')",
    "SET search_path = '__topicbase'",
    "SET search_path = 'main,\"__TOPICBASE\"'",
    "SET search_path = __topicbase",
    "SET search_path TO ' __TOPICBASE '",
    "SET SESSION search_path = 'tables.__topicbase'",
    "SET schema = '__topicbase'",
    "USE __topicbase",
    "PREPARE p AS SELECT * FROM __topicbase.topics",
    "SELECT * FROM query_table('__topicbase.topics')",
    "COMMENT ON TABLE __topicbase.topics IS 'mine'",
]


@pytest.mark.parametrize(("sql", "reason"), ESCAPES, ids=[sql[:50] for sql, _ in ESCAPES])
def test_escape_hatch_is_refused_with_42501_and_its_reason(
    refusing_session: Session, sql: str, reason: str | None
) -> None:
    error = refusal(refusing_session, sql)
    if sql.startswith("SAVEPOINT"):  # the grammar has no SAVEPOINT: it never reaches DuckDB
        assert error.sqlstate in ("42601", "42501"), error
        return
    assert error.sqlstate == "42501", error
    assert reason is not None and reason.lower() in error.message.lower(), error.message


@pytest.mark.parametrize("sql", INTERNAL, ids=[sql[:60] for sql in INTERNAL])
def test_internal_catalog_is_out_of_reach_by_any_spelling(
    refusing_session: Session, sql: str
) -> None:
    error = refusal(refusing_session, sql)
    assert isinstance(error, InsufficientPrivilegeError), error
    assert "__topicbase" in error.message or "SQL given as a string" in error.message


def test_catalog_survives_the_attempts_and_check_stays_clean(
    database: Database, session: Session
) -> None:
    for sql in INTERNAL:
        with pytest.raises(InsufficientPrivilegeError):
            session.execute(sql)
    admin = database.connect()
    assert rows(admin, "SELECT name FROM sys.topics") == [("events",)]
    assert rows(admin, "SELECT count(*) FROM TOPIC events") == [(1,)]
    admin.close()
    path = database.path
    database.close()
    report = check_database(path)
    Database.open(path, retention_interval_s=None)  # the fixture closes it again
    assert report.ok, report.lines()


def test_no_file_is_written_or_read(tmp_path: Path, session: Session) -> None:
    target = tmp_path / "out.csv"
    exported = tmp_path / "export"
    attached = tmp_path / "a.duckdb"
    for sql in (f"COPY t TO '{target}'", f"PREPARE w AS COPY t TO '{target}'",
                f"EXPORT DATABASE '{exported}'", f"ATTACH '{attached}' AS a"):  # fmt: skip
        assert refusal(session, sql).sqlstate == "42501"
    with pytest.raises(TopicbaseError):
        session.execute("EXECUTE w")  # its PREPARE was refused: nothing to run
    assert not target.exists() and not exported.exists()
    assert not attached.exists()


def test_a_string_in_from_does_not_read_a_file(session: Session) -> None:
    # DuckDB reads a quoted path in FROM as a file; with external access off it is just
    # an unknown relation.
    error = refusal(session, "SELECT * FROM '/etc/passwd'")
    assert "root:" not in error.message


def test_global_settings_stay_as_topicbase_set_them(database: Database, session: Session) -> None:
    for sql in ("SET memory_limit = '1MB'", "SET threads = 1", "SET max_expression_depth = 5"):
        refusal(session, sql)
    settings = dict(rows(database.connect(), "SELECT name, value FROM duckdb_settings() WHERE "
                         "name IN ('enable_external_access', 'lock_configuration', "
                         "'autoinstall_known_extensions', 'autoload_known_extensions', "
                         "'max_expression_depth', 'temp_directory', "
                         "'python_enable_replacements')"))  # fmt: skip
    assert settings["enable_external_access"] == "false"
    assert settings["lock_configuration"] == "true"
    assert settings["autoinstall_known_extensions"] == "false"
    assert settings["autoload_known_extensions"] == "false"
    assert settings["max_expression_depth"] == "1000"
    # A name in FROM never reads a Python variable of the engine's calling frame.
    assert settings["python_enable_replacements"] == "false"
    assert settings["temp_directory"] == os.path.join(database.path, "tmp")
    assert os.path.isdir(settings["temp_directory"])


def test_checkpoint_is_for_superusers(database: Database) -> None:
    alice = database.connect(ALICE)
    assert "superuser" in refusal(alice, "CHECKPOINT").message
    assert "superuser" in refusal(alice, "FORCE CHECKPOINT").message
    alice.close()
    admin = database.connect()
    admin.execute("CHECKPOINT")
    admin.close()


def test_prepare_is_judged_by_the_statement_it_wraps(database: Database) -> None:
    admin = database.connect()
    admin.execute("PREPARE two AS SELECT a * 2 FROM t ORDER BY a")
    assert rows(admin, "EXECUTE two") == [(2,), (4,)]
    for wrapped in ("SELECT * FROM read_text('/etc/passwd')", "SELECT * FROM __topicbase.topics",
                    "INSERT INTO t SELECT count(*) FROM query_table('t')",
                    "COPY t TO '/tmp/topicbase-sandbox-copy.csv'"):  # fmt: skip
        assert refusal(admin, f"PREPARE bad AS {wrapped}").sqlstate == "42501"
    # DuckDB cannot prepare these at all (42601), so nothing is left to EXECUTE.
    for wrapped in ("ATTACH ':memory:' AS m", "SET threads = 1", "PREPARE q AS SELECT 1"):
        refusal(admin, f"PREPARE bad AS {wrapped}")
    assert refusal(admin, "EXECUTE bad").sqlstate != "42501"  # no such prepared statement
    admin.close()


def test_the_engines_plan_names_are_reserved(database: Database) -> None:
    """The engine keeps plans of a session's repeated SELECTs as prepared statements
    named ``__topicbase_plan_<n>`` and runs them when their text runs: a statement planted
    under such a name (or a kept plan dropped under the engine) would run in the text's
    place, judged as the text. PREPARE and DEALLOCATE of those names are refused."""
    admin = database.connect()
    for _ in range(3):  # the second success keeps a plan, the third runs it
        assert rows(admin, "SELECT 41 + 1") == [(42,)]
    kept = [name for (name,) in rows(admin, "SELECT name FROM duckdb_prepared_statements()")
            if name.startswith("__topicbase_plan_")]  # fmt: skip
    assert kept, "no kept plan: the test proves nothing"
    for sql in (f"PREPARE {kept[0]} AS SELECT 0", f'PREPARE "{kept[0].upper()}" AS SELECT 0',
                "PREPARE __topicbase_plan_999999 AS SELECT 0", f"DEALLOCATE {kept[0]}",
                f"DEALLOCATE PREPARE {kept[0]}"):  # fmt: skip
        assert "reserved" in str(refusal(admin, sql))
    assert rows(admin, "SELECT 41 + 1") == [(42,)]
    admin.close()


def test_session_settings_on_the_allow_list_work(database: Database) -> None:
    admin = database.connect()
    admin.execute("CREATE SCHEMA s2; CREATE TABLE s2.only_here (x INT); "
                  "INSERT INTO s2.only_here VALUES (7)")  # fmt: skip
    admin.execute("SET search_path = 's2,main'")
    assert rows(admin, "SELECT x FROM only_here") == [(7,)]
    admin.execute("SET schema = 'main'")
    admin.execute("SET search_path = s2")  # a bare name too
    assert rows(admin, "SELECT x FROM only_here") == [(7,)]
    admin.execute("SET search_path TO 'main'")
    other = database.connect()  # per connection: another session keeps its own path
    assert refusal(other, "SELECT x FROM only_here").sqlstate == "42P01"
    admin.close()
    other.close()


def test_topicbase_features_work_inside_the_sandbox(database: Database) -> None:
    admin = database.connect()
    admin.execute("CREATE TABLE summary (a INT); INSERT INTO summary (a) VALUES (3)")
    admin.execute("CREATE TABLE secret (a INT); DROP TABLE secret")  # a table, not a secret
    assert rows(admin, "SELECT a FROM summary") == [(3,)]  # a table named like a function
    assert rows(admin, "SELECT count(*) FROM range(5)") == [(5,)]
    # histogram() is also DuckDB's table macro over a named table; as an aggregate it stays
    assert rows(admin, "SELECT histogram(a) FROM t") == [([(1, 1), (2, 1)],)]  # a MAP
    assert rows(admin, "SELECT * FROM unnest([1, 2]) ORDER BY 1") == [(1,), (2,)]
    assert rows(admin, "SELECT count(*) > 0 FROM duckdb_tables()") == [(True,)]
    # DuckDB's view over duckdb_databases() that shows names only stays (round 23)
    assert ("tables",) in rows(admin, "SELECT datname FROM pg_catalog.pg_database")
    assert rows(admin, "SELECT count(*) FROM TOPIC events") == [(1,)]
    assert rows(admin, "SELECT name FROM sys.topics") == [("events",)]
    assert rows(admin, "PRAGMA version")[0][0].startswith("v")
    assert rows(admin, "SELECT column_name FROM (DESCRIBE t)") == [("a",)]
    admin.execute("CREATE TYPE mood AS ENUM ('happy', 'sad'); CREATE TABLE m (x mood)")
    admin.execute("BEGIN; INSERT INTO TOPIC events (data) SELECT CAST(a AS VARCHAR) FROM t; "
                  "COMMIT")  # fmt: skip
    assert rows(admin, "SELECT count(*) FROM TOPIC events") == [(3,)]
    admin.close()


def test_one_text_holding_two_duckdb_statements_is_refused() -> None:
    # Topicbase splits scripts itself; a text in which DuckDB sees two statements would
    # run the second unchecked.
    from engine.sandbox import check_sql

    with pytest.raises(InsufficientPrivilegeError, match="2 statements"):
        check_sql("SELECT 1; DROP TABLE __topicbase.offsets", superuser=True)


def test_memory_limit_is_configurable_and_spills_to_the_data_directory(tmp_path: Path) -> None:
    limit_bytes = 64 * 1024 * 1024
    database = Database.open(str(tmp_path / "small"), retention_interval_s=None,
                             memory_limit_bytes=limit_bytes)  # fmt: skip
    try:
        session = database.connect()
        shown = rows(session, "SELECT current_setting('memory_limit')")[0][0]
        assert shown == "64.0 MiB", shown
        # Sorting ~200 MB of strings needs more than 64 MB: it spills and still finishes.
        spilled = rows(session, "SELECT count(*) FROM (SELECT md5(i::VARCHAR) || md5((i + 1)"
                       "::VARCHAR) AS m FROM range(1500000) r(i) ORDER BY m)")  # fmt: skip
        assert spilled == [(1_500_000,)]
        session.close()
    finally:
        database.close()


def test_default_memory_limit_is_a_share_of_physical_memory() -> None:
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert tables.default_memory_limit_bytes() == int(physical * 0.4)


def test_memory_databases_are_sandboxed_too() -> None:
    connection = tables.connect(":memory:")
    try:
        with pytest.raises(InsufficientPrivilegeError):
            tables.run(connection, "SELECT * FROM read_text('/etc/passwd')")
        with pytest.raises(InsufficientPrivilegeError, match="fixed by Topicbase"):
            tables.run(connection, "SET threads = 1")
    finally:
        connection.close()


def test_dbapi_refuses_escapes_as_the_console_does(tmp_path: Path) -> None:
    connection = dbapi.connect(str(tmp_path / "dbapi"), autocommit=True)
    cursor = connection.cursor()
    for sql in ("SELECT * FROM read_text('/etc/passwd')", "DROP TABLE __topicbase.offsets",
                "SET memory_limit = '1MB'", "ATTACH ':memory:' AS m"):  # fmt: skip
        with pytest.raises(dbapi.Error) as caught:
            cursor.execute(sql)
        assert getattr(caught.value, "sqlstate", None) == "42501", caught.value
    cursor.execute("SELECT 1")
    assert cursor.fetchall() == [(1,)]
    connection.close()


def test_error_hints_do_not_name_the_internal_catalog(session: Session) -> None:
    # DuckDB suggests the closest table it knows, the internal ones included.
    for sql in ("SELECT * FROM offsets", "SELECT * FROM topcs", "SELECT * FROM transaction"):
        error = refusal(session, sql)
        assert "__topicbase" not in error.message, error.message


def test_translated_hint_keeps_other_suggestions() -> None:
    connection = tables.connect(":memory:")
    try:
        tables.run(connection, "CREATE TABLE orders (a INT)")
        with pytest.raises(TopicbaseError) as caught:
            tables.run(connection, "SELECT * FROM order_s")
        assert 'Did you mean "orders"' in caught.value.message
    finally:
        connection.close()


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT current_setting('temp_directory')",
        'SELECT "Current_Setting"(\'temp_directory\')',
        "SELECT main.current_setting /* c */ ('temp_directory')",
        "SELECT value FROM duckdb_settings() WHERE name = 'allowed_paths'",
        "SELECT value FROM main.duckdb_settings() WHERE name = 'temp_directory'",
        # DuckDB's own view over duckdb_settings() (review R2 F2)
        "SELECT setting FROM pg_catalog.pg_settings WHERE name = 'temp_directory'",
        "SELECT setting FROM system.pg_catalog.pg_settings WHERE name = 'temp_directory'",
        "WITH s AS (SELECT * FROM PG_SETTINGS) SELECT setting FROM s WHERE name = 'temp_directory'",
    ],
)
def test_duckdbs_settings_name_the_servers_files_and_are_for_superusers(
    database: Database, tmp_path: Path, sql: str
) -> None:
    """Round 23: the data directory's path was readable by anyone (PostgreSQL shows
    ``data_directory`` to superusers only)."""
    alice = database.connect(ALICE)
    error = refusal(alice, sql)
    assert error.sqlstate == "42501"
    assert "for superusers" in error.message
    assert str(tmp_path) not in error.message
    alice.close()
    admin = database.connect()
    assert str(tmp_path) in str(rows(admin, sql))
    admin.close()
