"""The whole run's hooks: the Spark tests kept on one pytest-xdist worker, the
SparkSessions a run makes counted (the owner's rule: one SparkSession per run), and the
ledger-on lane (``--ledger``).

``make test`` runs the suite on two workers (``pytest -n 2 --dist loadgroup``). With
``loadgroup``, xdist sends each work unit to one worker; here every test under
``tests/spark/`` is one unit (``spark``) and every other test is a unit of its own. The
``spark`` fixture (session-scoped, tests/spark/conftest.py) is visible only there, so one
worker makes the run's one SparkSession and runs every Spark test on it. xdist starts the
largest unit first: the Spark tests begin at once, beside the rest of the suite.

The units are chosen here (``pytest_xdist_make_scheduler``), not with ``xdist_group``
marks: xdist 3.8 puts a mark's group into the test's id through ``Node._nodeid``, which
pytest 9.2 no longer reads (ids live in ``Node._id``), so the marks group nothing there.

The ``spark`` fixture reports each session it makes through ``count_spark_session``; the
workers hand their counts to the controller, which prints the run's total and fails the
run when it is more than one. Without xdist (a plain ``pytest``) the same count is kept
in the one process. Invariant: a run that makes two SparkSessions does not pass.

The store's ledger is on by default (``storage.config.ledger_enabled``; since round 31),
so a plain run has it, but only statements spread over 16 partitions reach it.
``pytest --ledger`` runs the tests with the switch set on (``TOPICBASE_LEDGER=1``, whatever
the environment says) and a statement going to the ledger once it spreads over 4
partitions (``TOPICBASE_LEDGER_SHARES_MIN=4``, ``storage.config.ledger_shares_min``; the
default 16 is more partitions than most tests' topics have). Both are set in the
environment at configure time, in the controller and in every xdist worker, so the
processes a test starts inherit them; a test that sets the
switch itself (``monkeypatch.setenv``) still decides for itself: the ``ledger_off``
fixture pins a test to the switch being off (one that checks the staging path's own
work, which the ledger path does not do; docs/scale.md, round 31).
"""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest

from storage.config import LEDGER_ENVIRONMENT_VARIABLE, LEDGER_SHARES_MIN_ENVIRONMENT_VARIABLE

SPARK_GROUP = "spark"
SPARK_TESTS = "tests/spark/"  # node ids are relative to the repository root (pyproject.toml)
_SESSIONS = pytest.StashKey[int]()  # SparkSessions this process made
_PER_WORKER = pytest.StashKey[dict[str, int]]()  # the controller's counts, by worker
LEDGER_LANE_SHARES_MIN = "4"  # the lane's ``TOPICBASE_LEDGER_SHARES_MIN``


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--ledger", action="store_true", default=False,
        help="the ledger-on lane: the store's ledger switched on (TOPICBASE_LEDGER=1, "
             f"TOPICBASE_LEDGER_SHARES_MIN={LEDGER_LANE_SHARES_MIN})")  # fmt: skip


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("ledger"):
        os.environ[LEDGER_ENVIRONMENT_VARIABLE] = "1"
        os.environ[LEDGER_SHARES_MIN_ENVIRONMENT_VARIABLE] = LEDGER_LANE_SHARES_MIN


@pytest.fixture
def ledger_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ledger switched off for this test, whatever the lane (stores it opens)."""
    monkeypatch.setenv(LEDGER_ENVIRONMENT_VARIABLE, "0")


def pytest_report_header(config: pytest.Config) -> str | None:
    if config.getoption("ledger"):
        return (f"ledger lane: {LEDGER_ENVIRONMENT_VARIABLE}=1, "
                f"{LEDGER_SHARES_MIN_ENVIRONMENT_VARIABLE}={LEDGER_LANE_SHARES_MIN}")  # fmt: skip
    return None


def _run_total(config: pytest.Config) -> tuple[int, dict[str, int]]:
    """The run's SparkSessions: the workers' counts (under xdist) plus this process's."""
    per_worker = dict(config.stash.get(_PER_WORKER, {}))
    own = config.stash.get(_SESSIONS, 0)
    if own or not per_worker:
        per_worker["this process"] = own
    return sum(per_worker.values()), per_worker


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if SPARK_GROUP in getattr(item, "fixturenames", ()) and not item.nodeid.startswith(
                SPARK_TESTS):  # fmt: skip
            raise pytest.UsageError(
                f"{item.nodeid} uses the spark fixture outside {SPARK_TESTS}: the Spark tests "
                "would not all run on one xdist worker (tests/conftest.py)")


@pytest.hookimpl(optionalhook=True)  # an xdist hook: a plain pytest has no xdist
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """``--dist loadgroup`` with every test under ``tests/spark/`` in one unit."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class SparkOnOneWorker(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            if nodeid.startswith(SPARK_TESTS):
                return SPARK_GROUP
            return super()._split_scope(nodeid)

    return SparkOnOneWorker(config, log)


@pytest.fixture(scope="session")
def count_spark_session(request: pytest.FixtureRequest) -> Callable[[], None]:
    """Call once per SparkSession made (the ``spark`` fixture does)."""
    config = request.config

    def count() -> None:
        config.stash[_SESSIONS] = config.stash.get(_SESSIONS, 0) + 1

    return count


def pytest_sessionfinish(session: pytest.Session) -> None:
    config = session.config
    workeroutput = getattr(config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: the controller adds it up
        workeroutput["spark_sessions"] = config.stash.get(_SESSIONS, 0)
        return
    total, _ = _run_total(config)
    if total > 1 and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.hookimpl(optionalhook=True)  # an xdist hook
def pytest_testnodedown(node: object, error: object) -> None:
    output = getattr(node, "workeroutput", None) or {}  # none when the worker crashed
    worker = node.gateway.id  # type: ignore[attr-defined]
    config: pytest.Config = node.config  # type: ignore[attr-defined]
    config.stash.setdefault(_PER_WORKER, {})[worker] = output.get("spark_sessions", 0)


def pytest_terminal_summary(terminalreporter: object, config: pytest.Config) -> None:
    if getattr(config, "workeroutput", None) is not None:
        return
    total, per_worker = _run_total(config)
    detail = ", ".join(f"{name}: {count}" for name, count in sorted(per_worker.items()))
    line = f"SparkSessions made in this run: {total} ({detail})"
    if total > 1:
        line += ": more than one, the run fails (one SparkSession per run)"
    terminalreporter.write_line(line)  # type: ignore[attr-defined]
