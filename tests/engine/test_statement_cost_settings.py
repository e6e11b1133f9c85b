"""The engine's measured process settings (``engine.tables``): DuckDB's worker threads and
Python's thread switch interval, set where a database opens."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine import tables
from engine.database import Database
from storage.errors import InvalidParameterValueError


@pytest.fixture
def switch_interval() -> Iterator[None]:
    """Restores the interpreter's switch interval after the test."""
    before = sys.getswitchinterval()
    yield
    sys.setswitchinterval(before)


def _threads(connection: tables.Connection) -> int:
    row = connection.execute("SELECT current_setting('threads')").fetchone()
    assert row is not None
    return int(row[0])


def test_duckdb_runs_one_thread_per_core_unless_the_variable_says(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(tables.THREADS_VARIABLE, raising=False)
    monkeypatch.setattr(tables.os, "cpu_count", lambda: 3)
    assert _threads(tables.connect(":memory:")) == 3
    monkeypatch.setenv(tables.THREADS_VARIABLE, "1")
    assert _threads(tables.connect(":memory:")) == 1
    assert _threads(tables.connect(":memory:", threads=2)) == 2  # the caller's own choice


@pytest.mark.parametrize("text", ["0", "-2", "two"])
def test_a_bad_thread_count_is_refused_with_22023(
    monkeypatch: pytest.MonkeyPatch, text: str
) -> None:
    monkeypatch.setenv(tables.THREADS_VARIABLE, text)
    with pytest.raises(InvalidParameterValueError) as refused:
        tables.connect(":memory:")
    assert refused.value.sqlstate == "22023"
    assert tables.THREADS_VARIABLE in refused.value.message


def test_opening_a_database_sets_the_switch_interval(
    tmp_path: Path, switch_interval: None
) -> None:
    sys.setswitchinterval(tables.PYTHON_SWITCH_INTERVAL_S)
    database = Database.open(str(tmp_path / "data"))
    try:
        assert sys.getswitchinterval() == pytest.approx(tables.SWITCH_INTERVAL_S)
    finally:
        database.close()


def test_a_switch_interval_the_process_chose_is_kept(
    tmp_path: Path, switch_interval: None
) -> None:
    sys.setswitchinterval(0.003)
    database = Database.open(str(tmp_path / "data"))
    try:
        assert sys.getswitchinterval() == pytest.approx(0.003)
    finally:
        database.close()
