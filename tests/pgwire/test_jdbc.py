"""The PostgreSQL JDBC driver (Spark's JDBC writer) against Topicbase: statements without
rows answer with a tag alone, SET SESSION CHARACTERISTICS works, TRUNCATE ONLY works.

Needs Java and Debian's libpostgresql-jdbc-java; ``make test`` installs both (``pgjdbc``)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from sql.pgwire.server import ServerThread

DRIVER = Path("/usr/share/java/postgresql.jar")
PROGRAM = Path(__file__).parent / "jdbc" / "JdbcStatements.java"


def test_jdbc_driver_runs_ddl_batches_and_truncate(server: ServerThread) -> None:
    if not DRIVER.exists():
        pytest.fail(f"{DRIVER} is missing: run `make pgjdbc` (make test does)")
    done = subprocess.run(
        ["java", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-cp", str(DRIVER),
         str(PROGRAM), str(server.port)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "ok"
