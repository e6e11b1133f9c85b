"""Round 23 (H3): ``topicbase serve`` caps its process's memory (``sql.pgwire.memory_cap``).

A value a scalar function builds (``repeat('x', 1.5e9)``) is allocated outside DuckDB's
``memory_limit``; under the process cap the allocation fails, the statement gets 53200
and the session goes on. Each check runs in a process of its own: RLIMIT_DATA is
process-wide and would bound the test runner too.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from sql.pgwire import memory_cap
from storage import limits

ROOT = str(Path(__file__).resolve().parents[2])
ENVIRONMENT = {**os.environ, "PYTHONPATH": ROOT}

_UNDER_A_CAP = """
import json, logging, sys
logging.disable(logging.CRITICAL)
from sql.pgwire import memory_cap
from engine.database import Database
from engine.identity import Identity
cap = memory_cap.cap_process_data(1536 << 20)
database = Database.open(sys.argv[1], retention_interval_s=None, memory_limit_bytes=64 << 20)
session = database.connect(Identity("alice", superuser=False))
answers = [cap]
for sql in ("SELECT length(repeat('x', 1500000000)) AS n", "SELECT 42 AS n"):
    try:
        answers.append(session.execute(sql)[-1].table.to_pylist())
    except Exception as error:
        answers.append([getattr(error, "sqlstate", type(error).__name__)])
session.close()
database.close()
print(json.dumps(answers))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_DATA is Linux's")
def test_a_huge_value_under_the_cap_is_53200_and_the_session_goes_on(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _UNDER_A_CAP, str(tmp_path / "data")],
        capture_output=True, text=True, timeout=120, env=ENVIRONMENT, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    cap, huge, after = json.loads(done.stdout.strip().splitlines()[-1])
    assert cap == 1536 << 20
    assert huge == ["53200"]
    assert after == [{"n": 42}]


_SERVE = """
import sys
from sql.pgwire.server import serve
serve(sys.argv[1], port=0, auth="trust", ready=lambda port: print(port, flush=True))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_DATA is Linux's")
def test_topicbase_serve_runs_under_the_cap(tmp_path: Path) -> None:
    server = subprocess.Popen(
        [sys.executable, "-c", _SERVE, str(tmp_path / "data")],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=ENVIRONMENT,
        cwd=ROOT,
    )  # fmt: skip
    try:
        assert server.stdout is not None
        assert server.stdout.readline().strip().isdigit()  # listening
        limits_text = Path(f"/proc/{server.pid}/limits").read_text()
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)
    (line,) = [row for row in limits_text.splitlines() if row.startswith("Max data size")]
    expected = int(memory_cap.physical_memory_bytes() * limits.PROCESS_DATA_FRACTION)
    assert line.split()[3] == str(expected)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_DATA is Linux's")
def test_an_existing_lower_limit_is_kept(tmp_path: Path) -> None:
    code = (
        "import resource; from sql.pgwire import memory_cap; "
        "resource.setrlimit(resource.RLIMIT_DATA, (3 << 30, resource.RLIM_INFINITY)); "
        "print(memory_cap.cap_process_data(8 << 30), memory_cap.cap_process_data(2 << 30))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, env=ENVIRONMENT, cwd=ROOT)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == [str(3 << 30), str(2 << 30)]
