"""The ``topicbase`` command, run for real as a subprocess: scripts, formats, errors.

Each run costs an interpreter start, so tests share runs where one run shows several
behaviours, and independent runs go in parallel.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

BIN_DIR = Path(sys.executable).parent
TOPICBASE = shutil.which("topicbase", path=str(BIN_DIR))
RUN_TIMEOUT_S = 60

def command(data_dir: Path | None, *arguments: str) -> list[str]:
    assert TOPICBASE is not None
    prefix = [TOPICBASE] if data_dir is None else [TOPICBASE, "--data-dir", str(data_dir)]
    return [*prefix, *arguments]


def run(
    data_dir: Path | None,
    *arguments: str,
    stdin: str = "",
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command(data_dir, *arguments),
        input=stdin,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        cwd=cwd,
        env={**os.environ, **(env or {})},
    )


def default_ctrl_c() -> None:
    """In the child before exec: Ctrl-C (SIGINT) as a terminal's program gets it. A shell
    starts background commands with SIGINT ignored, and an ignored signal stays ignored
    across exec, so a suite launched with ``&`` would run its consoles deaf to Ctrl-C."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start(data_dir: Path, *arguments: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        command(data_dir, *arguments),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=default_ctrl_c,
    )


def finish(process: subprocess.Popen[str]) -> subprocess.CompletedProcess[str]:
    stdout, stderr = process.communicate(timeout=RUN_TIMEOUT_S)
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def wait_for_owner(data_dir: Path, process: subprocess.Popen[str]) -> None:
    """Until ``process`` holds the data directory (its pid is in the store's LOCK file)."""
    lock_file = data_dir / "store" / "LOCK"
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while time.monotonic() < deadline:
        assert process.poll() is None, process.communicate()
        if lock_file.exists() and lock_file.read_text().strip() == str(process.pid):
            return
        time.sleep(0.05)
    raise AssertionError("the first topicbase never took the data directory")


# -- a data directory written by one run and read by the next ones -----------------------------
@pytest.fixture(scope="module")
def populated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    data_dir = tmp_path_factory.mktemp("populated") / "data"
    result = run(
        data_dir,
        "-c", "CREATE TOPIC `web/clicks` WITH (min_active_partitions = 1)",
        "-c", "CREATE TABLE users (name VARCHAR PRIMARY KEY, country VARCHAR)",
        "-c", "INSERT INTO users VALUES ('ann', 'NZ'), ('bob', 'FR')",
        "-c", "INSERT INTO TOPIC `web/clicks` (data, message_group_id) "
              "VALUES ('ann', 'g1'), ('bob', 'g2'), ('ann', 'g1'), (X'ff00', 'g3')",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "CREATE TOPIC",
        "CREATE TABLE",
        "INSERT 0 2",
        "INSERT 0 4",
    ]
    assert result.stderr == ""
    return data_dir


JOIN_QUERY = (
    "SELECT u.country, count(*) AS clicks FROM TOPIC `web/clicks` c "
    "JOIN users u ON c.data = CAST(u.name AS BLOB) GROUP BY 1 ORDER BY 1"
)
READ_QUERY = 'SELECT "offset", data, message_group_id AS "group, id" FROM TOPIC `web/clicks`'


@pytest.fixture(scope="module")
def outputs_after_restart(
    populated: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, subprocess.CompletedProcess[str]]:
    """One restarted run per output format, in parallel on copies of ``populated``."""
    runs = {
        "table": ("-c", JOIN_QUERY),
        "csv": ("--format", "csv", "-c", READ_QUERY),
        "json": ("--format", "json", "-c", READ_QUERY + ' WHERE "offset" IN (0, 3)'),
    }
    processes = {}
    for name, arguments in runs.items():
        copy = tmp_path_factory.mktemp(name) / "data"
        shutil.copytree(populated, copy)
        processes[name] = start(copy, *arguments)
    return {name: finish(process) for name, process in processes.items()}


def test_restarted_console_joins_topic_messages_with_tables_in_table_format(
    outputs_after_restart: dict[str, subprocess.CompletedProcess[str]],
) -> None:
    result = outputs_after_restart["table"]
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        " country | clicks",
        "---------+--------",
        " FR      |      1",
        " NZ      |      2",
        "(2 rows)",
        "",
    ]


def test_csv_format_prints_a_header_then_rows_with_bytes_as_text_or_hex(
    outputs_after_restart: dict[str, subprocess.CompletedProcess[str]],
) -> None:
    result = outputs_after_restart["csv"]
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        'offset,data,"group, id"',
        "0,ann,g1",
        "1,bob,g2",
        "2,ann,g1",
        "3,\\xff00,g3",
    ]


def test_json_format_prints_one_object_per_row(
    outputs_after_restart: dict[str, subprocess.CompletedProcess[str]],
) -> None:
    result = outputs_after_restart["json"]
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert rows == [
        {"offset": 0, "data": "ann", "group, id": "g1"},
        {"offset": 3, "data": "\\xff00", "group, id": "g3"},
    ]


# -- statements, tags, notices -------------------------------------------------------------------
def test_topic_writes_peeks_and_consumer_reads_print_rows_tags_and_notices(
    tmp_path: Path,
) -> None:
    read = (
        'SELECT "offset", CAST(data AS VARCHAR) AS text FROM TOPIC events '
        "WITH (consumer = 'reader', max_messages = 10)"
    )
    result = run(
        tmp_path / "data",
        "-c", "CREATE TOPIC events (CONSUMER reader) WITH (min_active_partitions = 1)",
        "-c", "INSERT INTO TOPIC events (data, producer_id, seq_no) VALUES ('a', 'p', 1), "
              "('b', 'p', 2); INSERT INTO TOPIC events (data, producer_id, seq_no) "
              "VALUES ('b', 'p', 2), ('c', 'p', 3) RETURNING \"offset\", status",
        "-c", "SELECT count(*) AS n FROM TOPIC events WITH (partition = 0, from_offset = 1)",
        "-c", read,
        "-c", read,
        "-c", "CREATE TOPIC IF NOT EXISTS events",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    blocks = result.stdout.split("\n\n")
    assert blocks[0].splitlines() == [
        "CREATE TOPIC",
        "INSERT 0 2",
        " offset |  status",
        "--------+-----------",
        "      1 | duplicate",
        "      2 | written",
        "(2 rows)",
    ]
    assert blocks[1].splitlines() == ["INSERT 0 1", " n", "---", " 2", "(1 row)"]
    consumed = blocks[2].splitlines()
    assert consumed[2:] == ["      0 | a", "      1 | b", "      2 | c", "(3 rows)"]
    assert blocks[3].splitlines()[-1] == "(0 rows)"  # the first read committed its offsets
    assert blocks[4] == "CREATE TOPIC\n"
    assert result.stderr == 'NOTICE: topic "events" already exists, skipping\n'


def test_file_script_splits_at_semicolons_outside_strings_and_comments(tmp_path: Path) -> None:
    script = tmp_path / "script.sql"
    script.write_text(
        "-- setup; with a semicolon in a comment\n"
        "CREATE TABLE notes (body VARCHAR);\n"
        "INSERT INTO notes VALUES ('a;b'), ('it''s; fine'); /* block; comment */\n"
        'INSERT INTO notes VALUES ($$dollar; quoted$$) ; SELECT body AS "x;y" FROM notes\n'
        "ORDER BY 1;\n",
        encoding="utf-8",
    )
    result = run(tmp_path / "data", "--format", "csv", "-q", "-f", str(script))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["x;y", "a;b", "dollar; quoted", "it's; fine"]


def test_stdin_scripts_run_without_a_terminal_and_with_dash_file(tmp_path: Path) -> None:
    """A non-terminal stdin is the script; ``-f -`` reads it in its turn among ``-c``s.

    The first run finds its data directory in $TOPICBASE_DATA_DIR, the second creates
    the default ./topicbase-data in its working directory.
    """
    environment = {key: value for key, value in os.environ.items() if key != "TOPICBASE_DATA_DIR"}
    plain = subprocess.Popen(
        command(None),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**environment, "TOPICBASE_DATA_DIR": str(tmp_path / "from-env")},
    )
    dash = subprocess.Popen(
        command(None, "-c", "SELECT 1 AS one", "-f", "-", "--format", "json"),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        env=environment,
    )
    plain_stdout, plain_stderr = plain.communicate("CREATE TOPIC t;\nSHOW TOPICS;\n", 60)
    dash_stdout, dash_stderr = dash.communicate("SELECT 2 AS two;", RUN_TIMEOUT_S)
    assert plain.returncode == 0, plain_stderr
    assert plain_stdout.startswith("CREATE TOPIC\n name | partitions")
    assert (tmp_path / "from-env" / "store").is_dir()
    assert dash.returncode == 0, dash_stderr
    assert dash_stdout.splitlines() == ['{"one": 1}', '{"two": 2}']
    assert (tmp_path / "topicbase-data" / "store").is_dir()


# -- errors -----------------------------------------------------------------------------------
ERROR_CASES = {
    "syntax": (
        "-f",
        "SELECT 'before' AS ran;\nSELECT 2;\nCREATE TOPIC broken WITH (min_active_partitions 2);",
        "ERROR: 42601: ",
    ),
    "unknown topic": ("-c", "SELECT * FROM TOPIC nowhere", "ERROR: 42P01: "),
    "table sql syntax": ("-c", "SELECT 1;\n\nSELEKT 2", "ERROR: 42601: "),
    "bad setting": (
        "-c",
        "CREATE TOPIC t WITH (retention_period = 'soon')",
        'ERROR: 22023: invalid value for topic setting "retention_period"',
    ),
    "shared consumer": (
        "-c",
        "CREATE TOPIC t (CONSUMER c WITH (type = 'shared'))",
        "ERROR: 0A000: ",
    ),
    "missing file": ("-f", None, 'ERROR: 58P01: could not read file "'),
}


def test_errors_print_sqlstate_and_message_to_stderr_and_exit_1(tmp_path: Path) -> None:
    processes = {}
    for name, (option, text, _expected) in ERROR_CASES.items():
        data_dir = tmp_path / name.replace(" ", "-")
        if option == "-f":
            script = tmp_path / f"{name}.sql"
            if text is not None:
                script.write_text(text, encoding="utf-8")
            text = str(script)
        processes[name] = start(data_dir, option, text)
    results = {name: finish(process) for name, process in processes.items()}
    for name, (_option, _text, expected) in ERROR_CASES.items():
        assert results[name].returncode == 1, (name, results[name])
        assert results[name].stderr.startswith(expected), (name, results[name])
    # The script is parsed before it runs: nothing ran; the caret points into line 3.
    assert results["syntax"].stdout == ""
    lines = results["syntax"].stderr.splitlines()
    assert lines[1] == "LINE 3: CREATE TOPIC broken WITH (min_active_partitions 2);"
    caret_column = lines[2].index("^") - len("LINE 3: ")
    assert lines[1][len("LINE 3: ") :][caret_column:].startswith("2")
    assert "shared consumers are not built yet" in results["shared consumer"].stderr
    # DuckDB's own syntax errors point into the script too.
    assert "\nLINE 3: SELEKT 2\n" in results["table sql syntax"].stderr


def test_second_process_is_refused_with_the_owner_pid_and_ctrl_c_cancels_the_first(
    tmp_path: Path,
) -> None:
    data_dir = tmp_path / "data"
    created = run(data_dir, "-c", "CREATE TOPIC jobs (CONSUMER worker)")
    assert created.returncode == 0, created.stderr
    owner = start(
        data_dir,
        "-c",
        "SELECT * FROM TOPIC jobs WITH (consumer = 'worker', wait = Interval('PT30S'))",
    )
    try:
        wait_for_owner(data_dir, owner)
        second = run(data_dir, "-c", "SELECT 1")
        assert second.returncode == 1
        assert second.stderr.startswith("ERROR: 55006: ")
        assert f"pid {owner.pid}" in second.stderr
        assert second.stdout == ""
        started = time.monotonic()
        owner.send_signal(signal.SIGINT)
        stdout, stderr = owner.communicate(timeout=RUN_TIMEOUT_S)
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.communicate()
    assert time.monotonic() - started < 20, "the wait was cancelled, not served to its end"
    assert owner.returncode == 1
    assert stderr == "ERROR: 57014: canceling statement due to user request\n"
    assert stdout == ""


def test_a_data_directory_that_cannot_be_made_is_one_line_and_exit_1(tmp_path: Path) -> None:
    """As ``serve`` reports it: a line with its SQLSTATE, not a Python traceback (review R1
    round 17)."""
    (tmp_path / "a-file").write_text("not a directory")
    done = run(tmp_path / "a-file" / "data", "-c", "SELECT 1")
    assert done.returncode == 1, done
    assert done.stderr.startswith("ERROR: 58030: could not open data directory "), done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.splitlines()) == 1
