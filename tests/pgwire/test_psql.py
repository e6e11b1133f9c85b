"""psql 15 as a subprocess against the real server: -c, -f, ON_ERROR_STOP, \\dt, \\d, \\l, \\dn.

The assertions read psql's printed output, so they check the whole path: the catalog
queries psql sends (``pg_catalog`` rewrite), the rows Topicbase answers, psql's layout.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from sql.pgwire.server import ServerThread

PSQL = shutil.which("psql") or "/usr/bin/psql"
Psql = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def psql(server: ServerThread) -> Psql:
    def run(*arguments: str, check: bool = False) -> subprocess.CompletedProcess[str]:
        command = [PSQL, "-X", "-h", "127.0.0.1", "-p", str(server.port), "-U", "tester",
                   "-d", "topicbase", *arguments]  # fmt: skip
        environment = {**os.environ, "PGCONNECT_TIMEOUT": "10", "PAGER": "", "PGSSLMODE": "disable"}
        completed = subprocess.run(command, capture_output=True, text=True, timeout=60,
                                   env=environment, check=False)  # fmt: skip
        if check:
            assert completed.returncode == 0, completed.stderr
        return completed

    return run


@pytest.fixture
def catalog_objects(psql: Psql) -> None:
    psql("-c", "CREATE TABLE accounts (id INTEGER PRIMARY KEY, owner VARCHAR DEFAULT 'nobody' "
               "UNIQUE, balance DECIMAL(12, 2), CHECK (balance >= 0))", check=True)  # fmt: skip
    psql("-c", "CREATE TABLE transfers (account INTEGER REFERENCES accounts(id), note VARCHAR)",
         check=True)  # fmt: skip
    psql("-c", "CREATE INDEX transfers_note ON transfers(note)", check=True)
    psql("-c", "CREATE TOPIC events (CONSUMER audit) WITH (min_active_partitions = 2)",
         check=True)  # fmt: skip


def test_c_runs_a_statement_and_prints_its_rows(psql: Psql) -> None:
    psql("-c", "CREATE TABLE t (id INTEGER, name VARCHAR)", check=True)
    inserted = psql("-c", "INSERT INTO t VALUES (1, 'ann'), (2, 'bob')", check=True)
    assert inserted.stdout.strip() == "INSERT 0 2"
    shown = psql("-c", "SELECT id, name FROM t ORDER BY id", check=True)
    lines = [line.strip() for line in shown.stdout.splitlines()]
    assert lines[0].split("|") == ["id ", " name"]
    assert "1 | ann" in lines and "2 | bob" in lines and "(2 rows)" in lines


def test_c_reports_an_error_with_exit_code_1(psql: Psql) -> None:
    failed = psql("-c", "SELECT * FROM no_such_table")
    assert failed.returncode == 1
    assert "ERROR:" in failed.stderr and "no_such_table" in failed.stderr


def test_f_runs_a_script_with_tables_and_topics(psql: Psql, tmp_path: Path) -> None:
    script = tmp_path / "script.sql"
    script.write_text(
        "CREATE TOPIC clicks (CONSUMER reader);\n"
        "INSERT INTO TOPIC clicks (data) VALUES ('a'), ('b');\n"
        "CREATE TABLE counts (n BIGINT);\n"
        "INSERT INTO counts SELECT count(*) FROM TOPIC clicks WITH (consumer = 'reader');\n"
        "SELECT n FROM counts;\n"
    )
    completed = psql("-f", str(script), check=True)
    assert completed.stdout.split() == [
        "CREATE", "TOPIC", "INSERT", "0", "2", "CREATE", "TABLE", "INSERT", "0", "1",
        "n", "---", "2", "(1", "row)",
    ]  # fmt: skip


def test_on_error_stop_exits_3_and_skips_the_rest(psql: Psql, tmp_path: Path) -> None:
    script = tmp_path / "script.sql"
    script.write_text(
        "CREATE TABLE before_error (x INTEGER);\n"
        "SELECT * FROM missing_table;\n"
        "CREATE TABLE after_error (x INTEGER);\n"
    )
    completed = psql("-v", "ON_ERROR_STOP=1", "-f", str(script))
    assert completed.returncode == 3
    assert f"{script}:2: ERROR:" in completed.stderr
    tables = psql("-c", r"\dt", check=True).stdout
    assert "before_error" in tables and "after_error" not in tables


def test_without_on_error_stop_the_script_goes_on(psql: Psql, tmp_path: Path) -> None:
    script = tmp_path / "script.sql"
    script.write_text("SELECT * FROM missing_table;\nCREATE TABLE after_error (x INTEGER);\n")
    completed = psql("-f", str(script))
    assert completed.returncode == 0
    assert "ERROR:" in completed.stderr
    assert "after_error" in psql("-c", r"\dt", check=True).stdout


def test_dt_lists_tables_only(psql: Psql, catalog_objects: None) -> None:
    listed = psql("-c", r"\dt", check=True).stdout
    assert _rows(listed) == [
        ["main", "accounts", "table", "tester"], ["main", "transfers", "table", "tester"],
    ]  # fmt: skip
    assert "__topicbase" not in listed and "offsets" not in listed  # the engine's own tables


def test_d_lists_topics_as_foreign_tables(psql: Psql, catalog_objects: None) -> None:
    rows = _rows(psql("-c", r"\d", check=True).stdout)
    assert ["main", "events", "foreign table", "tester"] in rows
    assert ["main", "accounts", "table", "tester"] in rows
    assert len(rows) == 3


def test_d_table_shows_columns_indexes_and_constraints(psql: Psql, catalog_objects: None) -> None:
    shown = psql("-c", r"\d accounts", check=True).stdout
    assert 'Table "main.accounts"' in shown
    assert _rows(shown)[:3] == [
        ["id", "integer", "", "not null", ""],
        ["owner", "text", "", "", "'nobody'"],
        ["balance", "numeric(12,2)", "", "", ""],
    ]
    assert '"accounts_id_pkey" PRIMARY KEY, btree (id)' in shown
    assert '"accounts_owner_key" UNIQUE CONSTRAINT, btree (owner)' in shown
    assert "CHECK ((balance >= 0))" in shown
    assert 'TABLE "transfers" CONSTRAINT' in shown  # Referenced by:
    referencing = psql("-c", r"\d transfers", check=True).stdout
    assert "Foreign-key constraints:" in referencing
    assert "FOREIGN KEY (account) REFERENCES accounts(id)" in referencing
    assert '"transfers_note" btree (note)' in referencing


def test_d_topic_shows_its_columns(psql: Psql, catalog_objects: None) -> None:
    shown = psql("-c", r"\d events", check=True).stdout
    assert 'Foreign table "main.events"' in shown
    columns = [row[:2] for row in _rows(shown)]
    assert columns == [
        ["partition", "integer"], ["offset", "bigint"], ["seq_no", "bigint"],
        ["producer_id", "text"], ["message_group_id", "text"],
        ["created_at", "timestamp with time zone"], ["written_at", "timestamp with time zone"],
        ["codec", "text"], ["data", "bytea"], ["metadata", "json"],
    ]  # fmt: skip
    assert "Server: topics" in shown
    assert "partitions '2'" in shown and "consumers '1'" in shown


def test_d_of_an_unknown_name_fails(psql: Psql, catalog_objects: None) -> None:
    completed = psql("-c", r"\d nothing_here")
    assert completed.returncode == 1
    assert 'Did not find any relation named "nothing_here"' in completed.stderr


def test_l_lists_the_database(psql: Psql) -> None:
    rows = _rows(psql("-c", r"\l", check=True).stdout)
    assert rows == [["topicbase", "tester", "UTF8", "C", "C", "", "libc", ""]]


def test_dn_lists_schemas_without_internal_ones(psql: Psql) -> None:
    rows = _rows(psql("-c", r"\dn", check=True).stdout)
    assert rows == [["main", "tester"]]


def test_show_and_set_through_psql(psql: Psql) -> None:
    shown = psql("-c", "SET statement_timeout = '5s'", "-c", "SHOW statement_timeout", check=True)
    assert "5000ms" in shown.stdout
    refused = psql("-c", "SET client_encoding = 'LATIN1'")
    assert refused.returncode == 1 and "LATIN1" in refused.stderr


def _rows(output: str) -> list[list[str]]:
    """The data rows of psql's aligned table output, cells stripped."""
    lines = output.splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if set(line.strip()) <= {"-", "+"}
                     and line.strip()) + 1  # fmt: skip
    except StopIteration:
        return []
    rows = []
    for line in lines[start:]:
        if not line.strip() or line.startswith("(") or not line.startswith(" "):
            break
        rows.append([cell.strip() for cell in line.split("|")])
    return rows


def test_d_index_shows_its_columns(psql: Psql, catalog_objects: None) -> None:
    shown = psql("-c", r"\d transfers_note", "-c", r"\d accounts_id_pkey", check=True).stdout
    assert 'Index "main.transfers_note"' in shown and 'btree, for table "main.transfers"' in shown
    assert 'primary key, btree, for table "main.accounts"' in shown
    assert [row[:3] for row in _rows(shown)] == [["note", "text", "yes"]]
    listed = _rows(psql("-c", r"\di", check=True).stdout)
    assert [row[1] for row in listed] == ["accounts_id_pkey", "accounts_owner_key",
                                          "transfers_note"]  # fmt: skip
