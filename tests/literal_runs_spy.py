"""The kept-literal-row tests' shared setup: a spy on ``engine.tables.query_rows`` that
records the texts run in DuckDB on the thread's literal connection, with nothing kept or
learnt of any text beforehand."""

from __future__ import annotations

from typing import Any

import pytest

from engine import tables


def literal_runs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The texts ``tables.query_rows`` ran on a literal connection, in order (any thread's:
    a server's too). The kept rows and the rows' way's knowledge are emptied first, so a
    text's first run is DuckDB's Arrow and its second the rows' way."""
    taken: list[str] = []
    original = tables.query_rows

    def spying(cursor: Any, sql: str, parameters: Any = None, **options: Any) -> Any:
        if cursor is tables.literal_cursor():
            taken.append(sql)
        return original(cursor, sql, parameters, **options)

    monkeypatch.setattr(tables, "query_rows", spying)
    tables._literal_results.clear()
    tables._small_results.clear()
    return taken
