"""Each demo wipes its data directory before it runs, so no demo's directory may hold
another's: ``make demo-sql`` used to wipe ``./demo-data``, and with it ``make demo``'s
chart and checkpoints in ``./demo-data/spark``."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path, PurePosixPath

ROOT = Path(__file__).resolve().parents[2]


def test_no_demo_wipes_another_demos_directory() -> None:
    command = ["make", "-n", "-B", "demo", "demo-sql", "demo-storage"]  # print, run nothing
    listed = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=True,
                            timeout=60).stdout  # fmt: skip
    dirs = {}
    for line in listed.splitlines():
        words = shlex.split(line) if "--data-dir" in line else []
        if "--data-dir" in words and "-m" in words:
            dirs[words[words.index("-m") + 1]] = PurePosixPath(
                words[words.index("--data-dir") + 1]).as_posix().removeprefix("./")  # fmt: skip
    assert set(dirs) == {"bench.demo_spark", "bench.demo_pipeline", "bench.demo_storage"}
    for module, path in dirs.items():
        for other, other_path in dirs.items():
            if other != module:
                inside = PurePosixPath(other_path).is_relative_to(path)
                assert not inside, f"{module} wipes {path}, which holds {other}'s {other_path}"
