"""A console process exits cleanly after its statements, also many at once.

The sandbox's per-thread DuckDB parser connections used to be left for the interpreter's
teardown, which aborted about one exit in fifteen when several consoles ran at once
(SIGABRT, "terminate called after throwing an instance of ''"). They are closed at exit
now; this runs 32 consoles, 4 at a time, and wants every one to exit with 0.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

CODE = "import sys; from sql.console import main; sys.exit(main())"
QUERY = 'SELECT "offset", CAST(data AS VARCHAR) AS data FROM TOPIC events'


def _console(data: Path, *sql: str) -> subprocess.Popen[str]:
    arguments = [a for statement in sql for a in ("-c", statement)]
    return subprocess.Popen(
        [sys.executable, "-c", CODE, "--data-dir", str(data), "--format", "json", *arguments],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def test_thirty_two_consoles_exit_cleanly(tmp_path: Path) -> None:
    seed = tmp_path / "seed"
    setup = _console(seed, "CREATE TOPIC events", "INSERT INTO TOPIC events (data) VALUES ('a')")
    assert setup.wait(timeout=60) == 0, setup.communicate()[1]
    for round_number in range(8):
        running = []
        for copy in range(4):
            data = tmp_path / f"d{round_number}-{copy}"
            shutil.copytree(seed, data)
            running.append(_console(data, QUERY))
        for process in running:
            out, err = process.communicate(timeout=60)
            assert process.returncode == 0, (process.returncode, err)
            assert '"data": "a"' in out
