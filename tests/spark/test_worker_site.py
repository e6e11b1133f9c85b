"""Spark's Python workers import the installed pyspark, not its ``pyspark.zip`` copy
(``spark_sql_ext/worker_site/sitecustomize.py``): a zip's modules are compiled at every
import, ~3x the CPU, and a stream's worker must connect back within Spark's fixed 10 s."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pyspark

import spark_sql_ext
from spark_sql_ext import WORKER_PATH_KEY, WORKER_SITE

INSTALLED = Path(pyspark.__file__).resolve().parent
ZIP = INSTALLED / "python" / "lib" / "pyspark.zip"


def _started(python_path: list[str], code: str) -> str:
    """What ``code`` prints in a fresh interpreter started with ``python_path``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(python_path)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=120, check=True)  # fmt: skip
    return done.stdout.strip()


def test_spark_workers_import_the_installed_pyspark(spark) -> None:
    """A task's Python worker (started as Spark starts every one: ``pyspark.zip`` first
    on its path) imports pyspark from the installed package, the zip off its path."""
    assert ZIP.is_file()  # Spark's pip package ships the zip this is about

    def imported(_: int) -> tuple[str, list[str]]:
        import sys

        import pyspark

        return pyspark.__file__, [p for p in sys.path if p.endswith("pyspark.zip")]

    seen = spark.sparkContext.parallelize([0], 1).map(imported).collect()
    assert seen == [(str(INSTALLED / "__init__.py"), [])]


def test_only_the_installed_packages_own_zip_leaves_the_path(tmp_path: Path) -> None:
    """The installed package's zip goes; a zip of another Spark (``SPARK_HOME`` set
    elsewhere) stays and is what pyspark is imported from; a ``sitecustomize`` the
    worker site hides still runs."""
    code = "import sys, pyspark; print(pyspark.__file__, 'pyspark.zip' in ' '.join(sys.path))"
    assert _started([WORKER_SITE, str(ZIP)], code) == f"{INSTALLED / '__init__.py'} False"
    assert _started([str(ZIP)], code) == f"{ZIP / 'pyspark' / '__init__.py'} True"
    other = tmp_path / "spark" / "python" / "lib" / "pyspark.zip"
    other.parent.mkdir(parents=True)
    with zipfile.ZipFile(other, "w") as archive:
        archive.writestr("pyspark/__init__.py", "")
    assert _started([WORKER_SITE, str(other)], code) == f"{other / 'pyspark' / '__init__.py'} True"
    mine = tmp_path / "mine" / "pyspark"  # another pyspark after the zip: the zip stays
    mine.mkdir(parents=True)
    (mine / "__init__.py").write_text("")
    assert _started([WORKER_SITE, str(ZIP), str(mine.parent)], code) == (
        f"{ZIP / 'pyspark' / '__init__.py'} True")
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    (hidden / "sitecustomize.py").write_text("import builtins\nbuiltins.HIDDEN_RAN = True\n")
    assert _started([WORKER_SITE, str(ZIP), str(hidden)],
                    "import builtins; print(builtins.HIDDEN_RAN)") == "True"  # fmt: skip


def test_configure_puts_the_worker_site_first_on_the_workers_path() -> None:
    class Builder:
        def __init__(self, **options: str) -> None:
            self._options = dict(options)

        def config(self, key: str, value: str) -> Builder:
            self._options[key] = value
            return self

    built = spark_sql_ext.configure(Builder(), url="topicbase://h:1", user="u")
    assert WORKER_PATH_KEY not in built._options  # opt-in: a launch conf's value stays
    built = spark_sql_ext.configure(Builder(), url="topicbase://h:1", user="u", worker_site=True)
    assert built._options[WORKER_PATH_KEY] == WORKER_SITE
    mine = Builder(**{WORKER_PATH_KEY: os.pathsep.join(["/a", WORKER_SITE, "/b"])})
    built = spark_sql_ext.configure(mine, url="topicbase://h:1", user="u", worker_site=True)
    assert built._options[WORKER_PATH_KEY] == os.pathsep.join([WORKER_SITE, "/a", "/b"])
