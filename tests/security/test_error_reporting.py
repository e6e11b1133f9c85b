"""What clients and the server log learn: a bug reaches a client as XX000 with an id (its
traceback only in the log), and statement text reaches the log only when ``log_statement``
asks for it (``sql.internal_error``, ``sql.pgwire.server``)."""

from __future__ import annotations

import logging
import re
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from engine import session as engine_session
from engine import spread_append
from sql import console, dbapi
from tests.security.resource_servers import (
    ADMIN,
    ADMIN_PASSWORD,
    ALICE,
    ALICE_PASSWORD,
    login,
    running_server,
)

REPO = Path(__file__).resolve().parents[2]
SECRET = "secret-detail-/etc/shadow"
MARKER = "needle-7f3a"  # in statements whose text must not reach the log


def _break_topic_writes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make every topic write fail as a bug would: a plain Python exception."""

    def broken(*_arguments: object, **_options: object) -> None:
        raise RuntimeError(f"{SECRET} (a bug)")

    monkeypatch.setattr(engine_session, "build_batches", broken)
    monkeypatch.setattr(engine_session, "plain_batches", broken)  # rows of data alone
    monkeypatch.setattr(spread_append, "append_plain", broken)  # ... many sessions' combined


def _logged_id(caplog: pytest.LogCaptureFixture, error_id: str) -> logging.LogRecord:
    records = [r for r in caplog.records if error_id in r.getMessage()]
    assert len(records) == 1
    assert records[0].exc_info is not None and SECRET in str(records[0].exc_info[1])
    return records[0]


def test_wire_client_gets_an_id_and_the_log_gets_the_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="topicbase.internal")
    with running_server(tmp_path, auth="trust") as server:
        victim, bystander = login(server, ALICE, ""), login(server, "bob", "")
        victim.execute("CREATE TOPIC events")
        _break_topic_writes(monkeypatch)
        for statement in ("INSERT INTO TOPIC events (data) VALUES ('x')",  # simple protocol
                          "INSERT INTO TOPIC events (data) VALUES (%s)"):  # extended
            with pytest.raises(psycopg.errors.InternalError_) as caught:
                victim.execute(statement, ["x"] if "%s" in statement else None)
            assert caught.value.sqlstate == "XX000"
            text = str(caught.value)
            assert SECRET not in text and "RuntimeError" not in text
            match = re.fullmatch(r"internal error \(id ([0-9a-f]{12})\)", text.strip())
            assert match is not None, text
            _logged_id(caplog, match.group(1))
        assert victim.execute("SELECT 1").fetchone() == (1,)  # the session carries on
        assert bystander.execute("SELECT 2").fetchone() == (2,)
        victim.close()
        bystander.close()


def test_dbapi_and_console_report_an_id_not_the_exception(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    caplog.set_level(logging.ERROR, logger="topicbase.internal")
    data = str(tmp_path / "data")
    connection = dbapi.connect(data, autocommit=True)
    try:
        cursor = connection.cursor()
        cursor.execute("CREATE TOPIC events")
        _break_topic_writes(monkeypatch)
        with pytest.raises(dbapi.InternalError) as caught:
            cursor.execute("INSERT INTO TOPIC events (data) VALUES ('x')")
        assert caught.value.sqlstate == "XX000" and SECRET not in str(caught.value)
        assert caught.value.__cause__ is None  # not chained to the bug's exception either
        _logged_id(caplog, str(caught.value).split("id ")[1].rstrip(")"))
        cursor.execute("SELECT 3")
        assert cursor.fetchone() == (3,)
    finally:
        connection.close()
    caplog.clear()
    code = console.main(["--data-dir", data, "-c", "INSERT INTO TOPIC events (data) VALUES ('y')"])
    printed = capsys.readouterr().err
    assert code == console.EXIT_ERROR
    match = re.search(r"ERROR: XX000: internal error \(id ([0-9a-f]{12})\)", printed)
    assert match is not None and SECRET not in printed, printed
    _logged_id(caplog, match.group(1))


# -- statement text and the log -------------------------------------------------------------------
def _statements_with_the_marker(connection: psycopg.Connection) -> None:
    connection.execute(f"CREATE TABLE t_{MARKER.replace('-', '_')} (v VARCHAR)")
    connection.execute(f"INSERT INTO t_{MARKER.replace('-', '_')} VALUES ('{MARKER}')")
    connection.execute("SELECT %s::VARCHAR AS v", [MARKER])  # extended protocol
    connection.execute(f"SELECT relname FROM pg_catalog.pg_class WHERE relname = '{MARKER}'")
    for bad in (f"SELEC '{MARKER}'", f"SELECT * FROM missing_{MARKER.replace('-', '_')}"):
        with pytest.raises(psycopg.Error):
            connection.execute(bad)


def test_no_statement_text_in_the_log_by_default(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    with running_server(tmp_path) as server:
        assert logging.getLogger("sqlglot").getEffectiveLevel() > logging.CRITICAL
        with login(server, ADMIN, ADMIN_PASSWORD) as connection:
            assert connection.execute("SHOW log_statement").fetchone() == ("none",)
            _statements_with_the_marker(connection)
            assert connection.execute("SELECT 4").fetchone() == (4,)
    logged = [r.getMessage() + str(r.exc_info or "") for r in caplog.records]
    assert logged  # the server did log (logins, ...), only never a statement
    assert not [text for text in logged if MARKER in text]


def test_log_statement_is_for_superusers_to_turn_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="sql.pgwire")  # the statement log is the connection's
    with running_server(tmp_path, settings={"log_statement": "ddl"}) as server:
        with login(server, ALICE, ALICE_PASSWORD) as ordinary:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                ordinary.execute("SET log_statement = 'none'")
            assert ordinary.execute("SHOW log_statement").fetchone() == ("ddl",)
            ordinary.execute(f"SELECT '{MARKER}-select'")
        with login(server, ADMIN, ADMIN_PASSWORD) as admin:
            admin.execute(f"CREATE TABLE ddl_logged (v VARCHAR DEFAULT '{MARKER}-ddl')")
            admin.execute(f"INSERT INTO ddl_logged VALUES ('{MARKER}-mod')")
            admin.execute("SET log_statement = 'all'")
            admin.execute(f"SELECT '{MARKER}-all' WHERE %s", [True])  # extended protocol
            admin.execute("RESET log_statement")
            admin.execute(f"SELECT '{MARKER}-after-reset'")
    logged = " ".join(r.getMessage() for r in caplog.records)
    assert f"{MARKER}-ddl" in logged and f"{MARKER}-all" in logged
    assert f"{MARKER}-select" not in logged and f"{MARKER}-mod" not in logged
    assert f"{MARKER}-after-reset" not in logged


def _serve(tmp_path: Path, *options: str) -> tuple[subprocess.Popen[str], int]:
    command = [sys.executable, "-c", "import sys; from sql.console import main; "
               "sys.exit(main(sys.argv[1:]))", "--data-dir", str(tmp_path / "data"), "serve",
               "--auth", "trust", "--port", "0", "--flight-port", "0", *options]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, cwd=REPO)  # fmt: skip
    assert process.stdout is not None
    line = process.stdout.readline()
    assert "serving" in line, line
    return process, int(line.rsplit(":", 1)[1])


def _stop(process: subprocess.Popen[str]) -> str:
    """Stop the server; its log (stderr)."""
    process.terminate()
    _, log_text = process.communicate(timeout=30)
    return log_text


@pytest.mark.parametrize("options", [(), ("--log-statement", "all")])
def test_topicbase_serve_logs_statements_only_when_asked(tmp_path: Path, options) -> None:
    process, port = _serve(tmp_path, *options, "--idle-session-timeout", "5min")
    try:
        for _ in range(2):  # a second client is served as well
            with psycopg.connect(host="127.0.0.1", port=port, user="u", autocommit=True,
                                 connect_timeout=10) as connection:  # fmt: skip
                assert connection.execute("SHOW idle_session_timeout").fetchone() == ("300000ms",)
                connection.execute(f"SELECT '{MARKER}'")
                with pytest.raises(psycopg.Error):
                    connection.execute(f"SELEC '{MARKER}-typo'")
    finally:
        log_text = _stop(process)
    assert (MARKER in log_text) == bool(options), log_text
