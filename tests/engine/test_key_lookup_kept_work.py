"""What a lookup's shape comes to on an index (its key's equalities, projected columns,
row schema) and whether a plan is of the lookup shape are worked out once
(``key_lookup._shape_work``, ``key_lookup.lookup_plan``), not per lookup: later lookups
of the same text give the same answers as DuckDB, and a new index (after a change)
works its shapes out again."""

from __future__ import annotations

from typing import Any

import pytest

from engine import key_lookup
from engine.session import Session
from tests.key_lookup_spy import served_lookups

TEXTS = [
    ("SELECT v FROM kv WHERE k = $1", [5]),
    ("SELECT v AS x, k, v FROM kv WHERE k = $1", [6]),
    ("SELECT * FROM kv t WHERE t.k = $1", [7]),
    ("SELECT t.v FROM kv AS t WHERE k = 8", None),
    ("SELECT v FROM kv WHERE k = $1", ["9"]),  # canonical integer text
    ("SELECT v FROM kv WHERE k = $1", [10**30]),  # out of range: DuckDB's to judge
    ("SELECT v FROM kv WHERE v = $1", ["v3"]),  # not the key: DuckDB
]


@pytest.fixture
def work_done(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Each time a shape's work or a plan's judgement is worked out anew."""
    done: list[str] = []
    projected, query = key_lookup._projected, key_lookup._lookup_query

    def projected_spy(*arguments: Any) -> Any:
        done.append("shape")
        return projected(*arguments)

    def query_spy(*arguments: Any) -> Any:
        done.append("plan")
        return query(*arguments)

    monkeypatch.setattr(key_lookup, "_projected", projected_spy)
    monkeypatch.setattr(key_lookup, "_lookup_query", query_spy)
    key_lookup._lookup_queries.clear()
    return done


def _answers(session: Session) -> list[Any]:
    return [session.execute(sql, parameters)[0].table.to_pylist() for sql, parameters in TEXTS]


def test_shapes_are_worked_out_once_per_index(
    session: Session, monkeypatch: pytest.MonkeyPatch, work_done: list[str]
) -> None:
    served = served_lookups(monkeypatch)
    session.execute("CREATE TABLE kv (k BIGINT PRIMARY KEY, v VARCHAR)")
    session.execute("INSERT INTO kv SELECT i, 'v' || i FROM range(100) t(i)")
    first = _answers(session)  # builds the index
    work_done.clear()
    served.clear()
    for _ in range(5):
        assert _answers(session) == first
    assert work_done == []
    assert len(served) == 5 * 5  # the five lookups by the key, from the index
    with monkeypatch.context() as patch:  # DuckDB's own answers
        patch.setenv(key_lookup.BYTES_VARIABLE, "0")
        assert _answers(session) == first
    session.execute("ALTER TABLE kv ADD COLUMN w INTEGER DEFAULT 4")
    work_done.clear()
    changed = _answers(session)
    assert changed[2] == [{"k": 7, "v": "v7", "w": 4}]  # the new index's own columns
    assert "shape" in work_done
    with monkeypatch.context() as patch:
        patch.setenv(key_lookup.BYTES_VARIABLE, "0")
        assert _answers(session) == changed


def test_only_short_lookup_queries_are_kept(session: Session, work_done: list[str]) -> None:
    """Other statements (a client-bound INSERT may be megabytes) are never held."""
    session.execute("CREATE TABLE kv (k BIGINT PRIMARY KEY, v VARCHAR)")
    big = "INSERT INTO kv VALUES " + ", ".join(f"({i}, '{'x' * 50}')" for i in range(200))
    session.execute(big)
    session.execute("SELECT count(*) FROM kv")
    long_lookup = "SELECT v FROM kv WHERE k = $1 " + "-" * 5000
    for _ in range(3):
        session.execute(long_lookup, [1])
        session.execute("SELECT v FROM kv WHERE k = $1", [1])
    texts = {query.sql for query, _ in key_lookup._lookup_queries.values()}
    assert texts == {"SELECT v FROM kv WHERE k = $1"}
    assert work_done.count("plan") >= 3 + 1  # the long one judged every time


def test_a_shape_with_a_big_literal_is_not_held(
    session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    served = served_lookups(monkeypatch)
    session.execute("CREATE TABLE kv (k VARCHAR PRIMARY KEY, v VARCHAR)")
    big = "x" * 10_000
    session.execute("INSERT INTO kv VALUES ('a', '1'), ($1, '2')", [big])
    for key in ("a", big):
        literal = f"SELECT v FROM kv WHERE k = '{key}'"
        assert [session.execute(literal)[0].table.to_pylist() for _ in range(3)] == [
            [{"v": "1" if key == "a" else "2"}]] * 3  # fmt: skip
    index = key_lookup.indexes_of(session.database).indexes["kv"]
    assert [work.shape.equalities[0][1].literal for work in index.shapes.values()] == ["a"]
    assert len(served) >= 4  # both texts answered by the index


def test_a_shape_of_very_many_columns_is_not_held(
    session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lookup projecting more than ``_SHAPE_COLUMNS_MAX`` columns is answered but its
    work is not held on the index (each entry holds its columns and their schema: review
    R2-F2 of round 13)."""
    served = served_lookups(monkeypatch)
    session.execute("CREATE TABLE kv (k INTEGER PRIMARY KEY, v VARCHAR)")
    session.execute("INSERT INTO kv VALUES (1, 'one')")
    many = key_lookup._SHAPE_COLUMNS_MAX + 1
    wide = "SELECT " + ", ".join(f"v AS c{i}" for i in range(many)) + " FROM kv WHERE k = $1"
    narrow = "SELECT v, k FROM kv WHERE k = $1"
    for _ in range(2):
        assert session.execute(wide, [1])[0].table.num_columns == many
        assert session.execute(narrow, [1])[0].table.to_pylist() == [{"v": "one", "k": 1}]
    index = key_lookup.indexes_of(session.database).indexes["kv"]
    assert [len(work.columns or []) for work in index.shapes.values()] == [2]
    assert len(served) >= 4  # both texts answered by the index
