"""`make test`'s Java step: the JDK is installed through apt exactly when ``java`` or
``javac`` is missing from PATH. Run as a dry run (``APT_GET=echo``) with a PATH made for
the test, so the branch that installs is exercised on a machine that has Java."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
INSTALL = "install -y -q --no-install-recommends openjdk-17-jdk-headless"
MAKE = shutil.which("make")


def _java_step(path: str) -> str:
    assert MAKE is not None
    done = subprocess.run([MAKE, "-s", "-C", str(ROOT), "java", "APT_GET=echo APT-GET"],
                          env={"PATH": path}, capture_output=True, text=True, timeout=60,
                          check=True)  # fmt: skip
    return done.stdout


def _tools(directory: Path, *names: str) -> str:
    directory.mkdir()
    for name in names:
        tool = directory / name
        tool.write_text("#!/bin/sh\nexit 0\n")
        tool.chmod(0o755)
    return str(directory)


@pytest.mark.skipif(MAKE is None, reason="make is not installed")
def test_the_jdk_is_installed_when_java_or_javac_is_missing(tmp_path) -> None:
    nothing = _tools(tmp_path / "none")
    assert _java_step(nothing).splitlines() == ["APT-GET update -q", f"APT-GET {INSTALL}"]
    only_java = _tools(tmp_path / "jre", "java")
    assert f"APT-GET {INSTALL}" in _java_step(only_java)
    both = _tools(tmp_path / "jdk", "java", "javac")
    assert _java_step(both) == ""
