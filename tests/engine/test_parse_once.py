"""A statement too long for the text caches is analysed once by the planner (round 27, H6):
``_plan_sql`` reuses the analysis it made to find named topics as the query itself when no
topic is read, instead of parsing the text a second time."""

from __future__ import annotations

import tempfile

import planner.planner as planner_module
from engine.database import Database
from engine.identity import Identity
from storage import limits


def _large_insert(rows: int) -> str:
    return "INSERT INTO t VALUES " + ", ".join(f"({i}, 'v{i}')" for i in range(rows))


def test_large_insert_is_parsed_once_by_the_planner(monkeypatch):
    db = Database.open(tempfile.mkdtemp(), retention_interval_s=None)
    admin = db.connect()
    admin.execute("CREATE TABLE t (a INTEGER, b VARCHAR)")
    admin.execute("GRANT SELECT, INSERT ON t TO alice")
    alice = db.connect(Identity("alice", superuser=False))
    rows = 5000
    sql = _large_insert(rows)
    assert len(sql) > limits.CACHED_TEXT_CHARS_MAX  # not kept by the text caches
    parsed: list[str] = []
    real = planner_module.parse_duckdb

    def counted(text: str):
        parsed.append(text)
        return real(text)

    monkeypatch.setattr(planner_module, "parse_duckdb", counted)
    alice.execute(sql)
    assert parsed.count(sql) == 1
    assert admin.execute("SELECT count(*), max(a) FROM t")[-1].table.to_pylist() == [
        {"count": rows, "max": rows - 1}
    ]
