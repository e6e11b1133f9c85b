from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from engine import tables
from engine.database import Database
from engine.session import Session


@pytest.fixture
def database(tmp_path) -> Iterator[Database]:
    db = Database.open(str(tmp_path / "data"))
    yield db
    db.close()


@pytest.fixture
def session(database: Database) -> Iterator[Session]:
    s = database.connect()
    yield s
    s.close()


@pytest.fixture
def cursor() -> Iterator[tables.Connection]:
    """A DuckDB cursor of a fresh in-memory connection, the small-results cache cleared
    (the statement-cost tests)."""
    connection = tables.connect(":memory:")
    tables._small_results.clear()
    yield connection.cursor()
    connection.close()


@pytest.fixture
def rows_way(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The texts that went through the rows' way (``tables._small_rows``), in order (the
    statement-cost tests)."""
    return spy_rows_way(monkeypatch)


def spy_rows_way(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """A list that each text run on the rows' way (``tables._small_rows``) is appended to,
    for as long as ``monkeypatch`` lasts."""
    taken: list[str] = []
    original = tables._small_rows

    def spying(cursor: Any, sql: str, parameters: Any) -> Any:
        taken.append(sql)
        return original(cursor, sql, parameters)

    monkeypatch.setattr(tables, "_small_rows", spying)
    return taken


def rows(session: Session, sql: str, parameters=None) -> list[dict]:
    result = session.execute(sql, parameters)[-1]
    assert result.table is not None, result.tag
    return result.table.to_pylist()
