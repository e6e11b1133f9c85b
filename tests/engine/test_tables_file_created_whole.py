"""A new data directory's DuckDB file is made whole or not at all (``engine.tables.
create_whole``): a process killed while DuckDB wrote a new file's headers left a file DuckDB
refused ("not a valid DuckDB database file"), so the directory never opened again (a crash
test of the bulk commit caught it when its SIGKILL came during the child's first open)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from engine import tables
from engine.database import Database

REPO = Path(__file__).resolve().parents[2]
CRASHED = 137  # storage.failpoints' crash: os._exit(137), as a SIGKILL


def _open_in_child(data: Path, failpoint: str) -> int:
    code = ("import sys; from engine.database import Database; "
            "Database.open(sys.argv[1], retention_interval_s=None).close()")  # fmt: skip
    env = {**os.environ, "TOPICBASE_FAILPOINTS": failpoint, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-c", code, str(data)], env=env, cwd=REPO,
                          timeout=120, check=False).returncode  # fmt: skip


def test_a_first_open_killed_after_duckdb_made_its_file_opens_next_time(tmp_path: Path) -> None:
    data = tmp_path / "data"
    assert _open_in_child(data, "tables.new_file_made=crash") == CRASHED
    made = data / (tables.TABLES_FILE + tables.NEW_FILE_SUFFIX)
    assert made.exists() and not (data / tables.TABLES_FILE).exists()
    database = Database.open(str(data), retention_interval_s=None)
    try:
        session = database.connect()
        session.execute("CREATE TABLE t (a INTEGER)")
        session.execute("INSERT INTO t VALUES (1)")
        session.close()
    finally:
        database.close()
    assert not made.exists()
    database = Database.open(str(data), retention_interval_s=None)
    try:
        session = database.connect()
        table = session.execute("SELECT a FROM t")[-1].table
        assert table is not None and table.column(0).to_pylist() == [1]
        session.close()
    finally:
        database.close()


def test_a_torn_new_file_is_made_again(tmp_path: Path) -> None:
    """What a kill inside DuckDB's own write of the new file leaves (a few bytes of a
    header under the temporary name) is removed and the file made again."""
    data = tmp_path / "data"
    data.mkdir()
    (data / (tables.TABLES_FILE + tables.NEW_FILE_SUFFIX)).write_bytes(b"\0" * 100)
    database = Database.open(str(data), retention_interval_s=None)
    try:
        session = database.connect()
        session.execute("CREATE TABLE t (a INTEGER)")
        session.close()
    finally:
        database.close()
    assert (data / tables.TABLES_FILE).exists()
    assert not (data / (tables.TABLES_FILE + tables.NEW_FILE_SUFFIX)).exists()


def test_an_existing_file_is_left_alone(tmp_path: Path) -> None:
    data = tmp_path / "data"
    Database.open(str(data), retention_interval_s=None).close()
    before = (data / tables.TABLES_FILE).stat()
    Database.open(str(data), retention_interval_s=None).close()
    after = (data / tables.TABLES_FILE).stat()
    assert before.st_ino == after.st_ino
