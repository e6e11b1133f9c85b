"""``key_lookup.KeptWay``: a kept lookup plan answers by what its last answer was read from
(the index, the shape's work, the renamed schema) while that index is the table's, gives
what ``execute_statement`` gives (aliases, missing keys, NULLs), follows a new index after a
change, never keeps a dropped index alive, and reads ``$TOPICBASE_KEY_INDEX_BYTES`` on
every answer."""

from __future__ import annotations

import gc
import weakref
from typing import Any

import pytest

from engine import key_lookup
from engine.session import Session
from grammar import ast
from grammar.parse import parse
from tests.key_lookup_spy import served_lookups


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    return served_lookups(monkeypatch)


@pytest.fixture
def kv(session: Session) -> Session:
    session.execute("CREATE TABLE kv (k BIGINT PRIMARY KEY, v VARCHAR, n INTEGER)")
    session.execute("INSERT INTO kv SELECT i, 'v' || i, CASE WHEN i % 2 = 0 THEN i END "
                    "FROM range(100) t(i)")  # fmt: skip
    return session


@pytest.fixture
def ways(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """One entry per answer given by a kept way (not by ``key_lookup.answer``)."""
    given: list[int] = []
    original = key_lookup.KeptWay.answer

    def spying(self: key_lookup.KeptWay, database: Any, parameters: Any) -> Any:
        answered = original(self, database, parameters)
        if answered is not None:
            given.append(1)
        return answered

    monkeypatch.setattr(key_lookup.KeptWay, "answer", spying)
    return given


def _statement(sql: str) -> ast.Statement:
    (statement,) = parse(sql)
    return statement


def _rows(result: Any) -> list[tuple[Any, ...]]:
    return [tuple(row.values()) for row in result.table.to_pylist()]


def test_a_kept_way_answers_as_execute_statement(kv: Session, served: list[int],
                                                 ways: list[int]) -> None:  # fmt: skip
    statement = _statement("SELECT v AS value, n, k AS key, v FROM kv WHERE k = $1")
    kv.execute_statement(statement, [1])  # builds the index
    for key in [0, 1, 2, 99, 100, -1, 2**63 - 1]:
        answered = kv.answer_lookup(statement, [key])
        assert answered is not None
        expected = kv.execute_statement(statement, [key])
        assert (answered.tag, _rows(answered), answered.table.schema, answered.columns) == (
            expected.tag, _rows(expected), expected.table.schema, expected.columns)  # fmt: skip
    assert len(ways) == 7  # every answer by the kept way


def test_a_kept_way_follows_a_new_index_and_never_holds_a_dropped_one(
    kv: Session, served: list[int], ways: list[int]
) -> None:
    statement = _statement("SELECT v FROM kv WHERE k = $1")
    kv.execute_statement(statement, [3])
    answered = kv.answer_lookup(statement, [3])
    assert answered is not None and _rows(answered) == [("v3",)]
    old = weakref.ref(key_lookup.indexes_of(kv.database).indexes["kv"])
    kv.execute("UPDATE kv SET v = 'new' WHERE k = 3")
    assert kv.answer_lookup(statement, [3]) is None  # no index of the new rows yet
    assert _rows(kv.execute_statement(statement, [3])) == [("new",)]  # built again
    gc.collect()
    assert old() is None  # the kept way held the dropped index weakly
    answered = kv.answer_lookup(statement, [3])
    assert answered is not None and _rows(answered) == [("new",)]
    assert len(ways) == 2


def test_the_cap_variable_is_read_on_every_answer(kv: Session, served: list[int],
                                                  ways: list[int],
                                                  monkeypatch: pytest.MonkeyPatch
                                                  ) -> None:  # fmt: skip
    statement = _statement("SELECT v FROM kv WHERE k = $1")
    kv.execute_statement(statement, [4])
    assert kv.answer_lookup(statement, [4]) is not None
    monkeypatch.setenv(key_lookup.BYTES_VARIABLE, "0")  # the path off, at once
    assert kv.answer_lookup(statement, [4]) is None
    monkeypatch.setenv(key_lookup.BYTES_VARIABLE, "not a number")  # malformed: off
    assert kv.answer_lookup(statement, [4]) is None
    monkeypatch.delenv(key_lookup.BYTES_VARIABLE)
    answered = kv.answer_lookup(statement, [4])
    assert answered is not None and _rows(answered) == [("v4",)]
    assert len(ways) == 2


def test_a_kept_way_holds_nothing_of_a_shape_too_wide_to_keep(
    session: Session, served: list[int], ways: list[int]
) -> None:
    """Review R1-4: a short text (``SELECT *``) of a wide table projects more columns than a
    kept shape may hold; its kept plan answers the ordinary way and holds no work or
    schema of them (each would be per plan, per session, outside any byte bound)."""
    columns = ", ".join(f"c{i} INTEGER" for i in range(key_lookup._SHAPE_COLUMNS_MAX + 1))
    session.execute(f"CREATE TABLE wide (k BIGINT PRIMARY KEY, {columns})")
    session.execute("INSERT INTO wide (k) SELECT i FROM range(50) t(i)")
    statement = _statement("SELECT * FROM wide WHERE k = $1")
    session.execute_statement(statement, [1])  # builds the index
    for key in (1, 2, 3):
        answered = session.answer_lookup(statement, [key])
        assert answered is not None and _rows(answered)[0][0] == key
    assert ways == []  # the ordinary way answered
    kept = [way for way in gc.get_objects() if isinstance(way, key_lookup.KeptWay)]
    assert kept and all(way._work is None and way._schema is None for way in kept)
