"""Spark finds the ``topicbase`` source by name in the venv ``make`` builds.

Spark's Python lookup (``pyspark.sql.worker.lookup_data_sources``) imports every module
``pkgutil.iter_modules()`` lists whose name starts with ``pyspark_``. setuptools' editable
finder does not show the checkout's top-level modules there, so the Makefile puts the
checkout on the venv's path as a plain entry (``topicbase_checkout.pth``). The check runs the
venv's interpreter as Spark's workers do: from another directory, without PYTHONPATH.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

LISTS_SOURCE = (
    "import pkgutil; "
    "print(sorted(m.name for m in pkgutil.iter_modules() if m.name.startswith('pyspark_')))"
)


def test_the_venvs_interpreter_lists_pyspark_topicbase_for_sparks_lookup(tmp_path) -> None:
    if not os.path.exists(os.path.join(sys.prefix, "pyvenv.cfg")):
        pytest.fail("the tests run from the venv `make` builds (.venv)")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    found = subprocess.run([sys.executable, "-c", LISTS_SOURCE], cwd=tmp_path, env=env,
                           capture_output=True, text=True, check=True, timeout=60)  # fmt: skip
    assert "pyspark_topicbase" in found.stdout, found.stdout
