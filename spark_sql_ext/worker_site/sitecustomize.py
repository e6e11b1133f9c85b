"""Spark's Python workers import the installed pyspark, not its ``pyspark.zip`` copy.

Spark starts every Python worker with ``$SPARK_HOME/python/lib/pyspark.zip`` first on
its ``PYTHONPATH``. With pip's pyspark, ``SPARK_HOME`` is the installed package, and the
zip inside it holds that package's own files; but Python keeps no compiled bytecode for
modules imported from a zip, so each worker compiles pyspark's modules again: about 3x
the CPU of an import from the package's ``__pycache__`` (0.74 s against 0.25 s of CPU
for ``pyspark.sql.streaming.python_streaming_source_runner``, quiet). Spark's streaming
runners (a Python data source's stream) wait a fixed 10 s for their worker to connect
back, which no setting changes (``PythonWorkerFactory.createSimpleWorker``); at load ~16
on two cores the zip import alone took 15-16 s and streams failed to start.

Python imports the module named ``sitecustomize`` at start-up, after ``PYTHONPATH`` is on
``sys.path``; this directory (``spark_sql_ext.WORKER_SITE``) put on the workers'
``PYTHONPATH`` makes this module that one. It takes off ``sys.path`` every
``.../pyspark/python/lib/pyspark.zip`` that lies inside the pyspark package which the
rest of ``sys.path`` would import first (the same install, hence the same files), so that
package is imported instead, with its cached bytecode. A zip of another Spark (``SPARK_HOME`` set
elsewhere) stays. Then it runs the ``sitecustomize`` this one shadows, if there is one.

Invariant: only stdlib imports here (it runs before anything else in the worker).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def _installed_copy(entry: str) -> bool:
    """True if ``entry`` is ``<pkg>/python/lib/pyspark.zip`` of a pyspark package ``<pkg>``
    and an import of pyspark without ``entry`` finds that very package: the zip is then a
    copy of what is imported anyway. Another pyspark earlier on the path (a user's, a
    checkout) keeps the zip, so the worker never speaks another pyspark's protocol."""
    if os.path.basename(entry) != "pyspark.zip":
        return False
    package = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(entry))))
    if os.path.basename(package) != "pyspark":
        return False
    if not os.path.isfile(os.path.join(package, "__init__.py")):
        return False
    rest = [p for p in sys.path if p != entry]
    found = importlib.machinery.PathFinder.find_spec("pyspark", rest)
    return found is not None and found.origin is not None and (
        os.path.abspath(found.origin) == os.path.join(package, "__init__.py"))


def _run_shadowed() -> None:
    """Run the ``sitecustomize`` module this one hides (later on ``sys.path``), if any."""
    rest = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        sys.modules[__name__] = module
        spec.loader.exec_module(module)


sys.path[:] = [p for p in sys.path if not _installed_copy(p)]
_run_shadowed()
