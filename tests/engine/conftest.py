from __future__ import annotations

from collections.abc import Iterator

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


def rows(session: Session, sql: str, parameters=None) -> list[dict]:
    result = session.execute(sql, parameters)[-1]
    assert result.table is not None, result.tag
    return result.table.to_pylist()
