"""A data-modifying CTE (``WITH u AS (UPDATE ...) SELECT ...``) is a write of its targets.

Reviewer R5 found it tagged SELECT and counted as changing no table: the key lookups'
indexes kept the rows from before it, and a transaction holding it could commit as
topic-only while counter deltas (``engine.deltas``) were applied beside it. Whatever the
door does with such a statement (refuses it, or checks and runs it), no lookup after it
returned may see the rows from before it, and an explicit transaction that ran it counts
as writing tables.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engine.database import Database
from engine.session import Session
from storage.errors import TopicbaseError
from tests.key_lookup_spy import served_lookups

WRITES = [
    "WITH u AS (UPDATE kv SET v = 'new' WHERE k = 1 RETURNING *) SELECT * FROM u",
    "WITH d AS (DELETE FROM kv WHERE k = 1 RETURNING k) SELECT count(*) FROM d",
    "WITH i AS (INSERT INTO kv VALUES (2, 'new') RETURNING k) SELECT k FROM i",
]


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Lookups the key path answered (a spy), with an index built after one lookup."""
    return served_lookups(monkeypatch)


@pytest.fixture
def db(tmp_path: Path, served: list[int]) -> Iterator[Database]:
    database = Database.open(str(tmp_path / "data"))
    session = database.connect()
    session.execute("CREATE TABLE kv (k BIGINT PRIMARY KEY, v VARCHAR)")
    session.execute("INSERT INTO kv VALUES (1, 'old')")
    session.close()
    yield database
    database.close()


def _lookups(session: Session) -> list[Any]:
    return [session.execute("SELECT v FROM kv WHERE k = $1", [k])[0].table.to_pylist()
            for k in (1, 2)]  # fmt: skip


def _truth(database: Database) -> list[Any]:
    """What DuckDB holds (the lookup's shape broken by ``AND true``: DuckDB's way)."""
    session = database.connect()
    try:
        return [session.execute(f"SELECT v FROM kv WHERE k = {k} AND true")[0].table.to_pylist()
                for k in (1, 2)]  # fmt: skip
    finally:
        session.close()


def _ran(session: Session, sql: str) -> bool:
    try:
        session.execute(sql)
    except TopicbaseError:
        return False
    return True


@pytest.mark.parametrize("write", WRITES)
def test_a_lookup_after_a_data_modifying_cte_sees_what_it_did(
    db: Database, served: list[int], write: str
) -> None:
    reader, writer = db.connect(), db.connect()
    assert _lookups(reader) == [[{"v": "old"}], []]
    served.clear()
    assert _lookups(reader) == [[{"v": "old"}], []] and served  # from the index
    _ran(writer, write)  # refused or run: the lookups must tell what DuckDB holds
    assert _lookups(reader) == _truth(db)


@pytest.mark.parametrize("write", WRITES)
def test_an_explicit_transaction_with_a_data_modifying_cte_writes_tables(
    db: Database, served: list[int], write: str
) -> None:
    reader, writer = db.connect(), db.connect()
    assert _lookups(reader) == [[{"v": "old"}], []]
    writer.execute("BEGIN")
    if _ran(writer, write):
        assert writer.transaction is not None and writer.transaction.touches_tables
        assert writer.transaction.tables_changed != frozenset()
    writer.execute("COMMIT")
    assert _lookups(reader) == _truth(db)
