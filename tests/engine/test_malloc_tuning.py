"""``engine.malloc_tuning.configure``: a process that opens a database gets glibc's
thresholds fixed (round 35), unless ``TOPICBASE_MALLOC=glibc`` or glibc's own variables
say otherwise. Counted in page faults of a freed-and-reallocated 1 MiB block, not timed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_DIR = str(Path(__file__).resolve().parents[2])

_SCRIPT = """
import resource, sys
from engine import malloc_tuning
from engine.database import Database
database = Database.open(sys.argv[1])
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):  # warm up: the heap grows once
    bytes(bytearray(1 << 20))
before = faults()
for _ in range(50):  # a 1 MiB buffer and a copy of it, both freed
    bytes(bytearray(1 << 20))
print(malloc_tuning.configure(), faults() - before)
database.close()
"""


def _opened(tmp_path: Path, name: str, **environment: str) -> tuple[str, int]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("TOPICBASE_MALLOC", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")
    }
    env.update(environment)
    done = subprocess.run([sys.executable, "-c", _SCRIPT, str(tmp_path / name)], env=env,
                          capture_output=True, text=True, check=True, cwd=REPO_DIR,
                          timeout=120)  # fmt: skip
    mode, faults = done.stdout.split()[-2:]
    return mode, int(faults)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt is Linux's")
def test_a_database_open_fixes_the_thresholds_unless_told_not_to(tmp_path: Path) -> None:
    mode, tuned = _opened(tmp_path, "a")
    assert mode == "tuned"
    mode, left = _opened(tmp_path, "b", TOPICBASE_MALLOC="glibc")
    assert mode == "glibc"
    assert left > 50 * 200  # every fresh 1 MiB block faulted in again
    assert tuned < left / 20
    mode, _ = _opened(tmp_path, "c", MALLOC_TRIM_THRESHOLD_="131072")
    assert mode == "glibc"  # the process chose for itself
    mode, _ = _opened(tmp_path, "d", TOPICBASE_MALLOC="bogus")
    assert mode == "glibc"
    mode, _ = _opened(tmp_path, "e", GLIBC_TUNABLES="glibc.malloc.trim_threshold=131072")
    assert mode == "glibc"  # (a review of round 35: the tunables are glibc's newer way)
