"""bench.move_ceiling measures what the engine runs (issue 14, round 6 of
docs/move_profile.md): its UPDATE is the counter-upsert shortcut's statement, its grouped
UPDATE adds what the members' UPDATEs add one by one, and both modes run and report."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from bench import move_ceiling
from bench.transactions_bench import TB_UPSERT
from engine import tables
from engine.database import Database


def test_the_update_is_the_shortcut_the_engine_runs(tmp_path: Path, monkeypatch) -> None:
    seen: list[str] = []
    original = tables.execute_count

    def recording(cursor, sql, parameters=None, **kwargs):
        seen.append(sql)
        return original(cursor, sql, parameters, **kwargs)

    monkeypatch.setattr(tables, "execute_count", recording)
    monkeypatch.setenv("TOPICBASE_COUNTER_DELTAS", "0")  # the DuckDB way's shortcut (engine.deltas)
    database = Database.open(str(tmp_path / "data"))
    try:
        session = database.connect()
        session.execute("CREATE TABLE counters (k VARCHAR PRIMARY KEY, n BIGINT NOT NULL)")
        session.execute("INSERT INTO counters VALUES ('w1', 0)")
        session.execute("BEGIN")
        session.execute(TB_UPSERT, ["w1", 5])
        session.execute("COMMIT")
        session.close()
    finally:
        database.close()
    assert move_ceiling.COUNTER_UPDATE in seen


def test_the_grouped_update_adds_each_delta() -> None:
    connection = duckdb.connect(":memory:")
    connection.execute("CREATE TABLE counters (k VARCHAR PRIMARY KEY, n BIGINT NOT NULL)")
    connection.execute("INSERT INTO counters VALUES ('a', 1), ('b', 10), ('c', 100)")
    deltas = [("a", 5), ("b", 7), ("a", 2), ("a", -1)]  # one key several times, one not at all
    connection.execute(move_ceiling.GROUP_UPDATE, [[k for k, _ in deltas], [v for _, v in deltas]])
    got = dict(connection.execute("SELECT k, n FROM counters").fetchall())
    assert got == {"a": 7, "b": 17, "c": 100}


@pytest.mark.parametrize(
    ("threads", "record", "group"), [(2, True, 1), (1, False, 1), (1, True, 4)]
)
def test_duckdb_alone_runs(threads: int, record: bool, group: int) -> None:
    report = move_ceiling.duckdb_alone(threads, 0.2, record, group)
    assert "transactions/s" in report
    assert ("record INSERT" in report) == record


def test_sessions_run_reports() -> None:
    # What the split holds depends on how many moves fit in the time: only the head line.
    report = move_ceiling.sessions_run(2, 0.3, False, 100, fill_rate=40.0)
    assert report.startswith("move + counter upsert of 100 messages, 2 sessions: ")
    assert "ms process CPU per transaction" in report


def test_sessions_run_says_when_the_source_ran_dry() -> None:
    """A fill smaller than the run needs bounds the rate: the report says so (round 20:
    the fixed fill of 800 moves a second had been read as the engine's ceiling)."""
    report = move_ceiling.sessions_run(2, 0.5, True, 100, fill_rate=1.0)
    assert report.splitlines()[0].endswith("RAN DRY (raise --fill-rate)")
