"""``engine.malloc_tuning``: ``reuse_large_blocks`` makes freed large blocks come back from
the heap (``topicbase serve``'s setting since round 15), and a process that opens a database
gets it through ``configure`` (round 35), unless ``TOPICBASE_MALLOC=glibc`` or glibc's own
settings say otherwise. Counted in page faults of freed-and-reallocated 1 MiB blocks (as
per Bind message: a buffer and a copy of it), not timed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_DIR = str(Path(__file__).resolve().parents[2])

# argv[1]: "tuned" (reuse_large_blocks), "default" (nothing), or a directory to open a
# database in; prints the mode (or whether glibc took the settings) and the page faults
_SCRIPT = """
import resource, sys
from engine import malloc_tuning
if sys.argv[1] == "tuned":
    mode, database = malloc_tuning.reuse_large_blocks(), None
elif sys.argv[1] == "default":
    mode, database = None, None
else:
    from engine.database import Database
    database = Database.open(sys.argv[1])
    mode = malloc_tuning.configure()
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):  # warm up: the heap grows once
    bytes(bytearray(1 << 20))
before = faults()
for _ in range(50):
    bytes(bytearray(1 << 20))
print(mode, faults() - before)
if database is not None:
    database.close()
"""
_SETTINGS = ("TOPICBASE_MALLOC", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_",
             "GLIBC_TUNABLES")  # fmt: skip
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="glibc's mallopt is Linux's")  # fmt: skip


def _page_faults(argument: str, **environment: str) -> tuple[str, int]:
    env = {k: v for k, v in os.environ.items() if k not in _SETTINGS}
    env.update(environment)
    done = subprocess.run([sys.executable, "-c", _SCRIPT, argument], env=env,
                          capture_output=True, text=True, check=True, cwd=REPO_DIR,
                          timeout=120)  # fmt: skip
    mode, faults = done.stdout.split()[-2:]
    return mode, int(faults)


@linux_only
def test_reuse_large_blocks_reuses_the_heaps_blocks() -> None:
    """Untuned, every 1 MiB buffer is mapped afresh (~256 page faults each); tuned, the
    heap's blocks are reused."""
    applied, tuned = _page_faults("tuned")
    assert applied == "True"
    _, default = _page_faults("default")
    assert default > 50 * 200  # 50 rounds of two fresh 1 MiB blocks
    assert tuned < default / 20


@linux_only
def test_a_database_open_fixes_the_thresholds_unless_told_not_to(tmp_path: Path) -> None:
    mode, tuned = _page_faults(str(tmp_path / "a"))
    assert mode == "tuned"
    mode, left = _page_faults(str(tmp_path / "b"), TOPICBASE_MALLOC="glibc")
    assert mode == "glibc"
    assert left > 50 * 200  # every fresh 1 MiB block faulted in again
    assert tuned < left / 20
    mode, _ = _page_faults(str(tmp_path / "c"), MALLOC_TRIM_THRESHOLD_="131072")
    assert mode == "glibc"  # the process chose for itself
    mode, _ = _page_faults(str(tmp_path / "d"), TOPICBASE_MALLOC="bogus")
    assert mode == "glibc"
    mode, _ = _page_faults(str(tmp_path / "e"),
                           GLIBC_TUNABLES="glibc.malloc.trim_threshold=131072")  # fmt: skip
    assert mode == "glibc"  # (a review of round 35: the tunables are glibc's newer way)
