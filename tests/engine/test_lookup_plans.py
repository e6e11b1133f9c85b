"""``Session.answer_lookup`` and the plans it keeps (``engine.lookup_plans``): a prepared
lookup answered from its index is planned once, not once per run, and gives what
``execute_statement`` gives; the door's checks still run on every call; a transaction, a
topic of the table's name, a statement of another shape and a lookup before its index is
built all go the ordinary way, and a lookup is counted once towards a build."""

from __future__ import annotations

from typing import Any

import pytest

from engine import key_lookup, lookup_plans
from engine.database import Database
from engine.identity import Identity
from engine.session import Session
from grammar import ast
from grammar.parse import parse
from storage.errors import TopicbaseError
from storage.limits import KEPT_LOOKUP_PLANS_MAX
from tests.key_lookup_spy import served_lookups
from tests.planner_spy import planned_statements

ALICE = Identity("alice", superuser=False)
LOOKUP = "SELECT v FROM kv WHERE k = $1"


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    return served_lookups(monkeypatch)


@pytest.fixture
def kv(session: Session) -> Session:
    session.execute("CREATE TABLE kv (k BIGINT PRIMARY KEY, v VARCHAR, n INTEGER)")
    session.execute("INSERT INTO kv SELECT i, 'v' || i, CASE WHEN i % 2 = 0 THEN i END "
                    "FROM range(1000) t(i)")  # fmt: skip
    return session


@pytest.fixture
def plans(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The SQL of every statement the planner plans from now on."""
    return planned_statements(monkeypatch)


def _statement(sql: str) -> ast.Statement:
    (statement,) = parse(sql)
    return statement


def _rows(result: Any) -> list[tuple[Any, ...]]:
    return [tuple(row.values()) for row in result.table.to_pylist()]


def _run(session: Session, statement: ast.Statement, parameters: Any) -> Any:
    """As the wire runs a prepared statement: ``answer_lookup``, else the ordinary way."""
    result = session.answer_lookup(statement, parameters)
    return result if result is not None else session.execute_statement(statement, parameters)


def test_a_prepared_lookup_is_planned_once_and_answers_as_execute_statement(
    kv: Session, served: list[int], plans: list[str]
) -> None:
    statement = _statement("SELECT v, n, k FROM kv WHERE k = $1")
    assert kv.answer_lookup(statement, [1]) is None  # no index yet: the ordinary way builds
    kv.execute_statement(statement, [1])
    plans.clear()
    served.clear()
    for key in [0, 1, 2, 999, 1000, -1, 2**62]:
        answered = kv.answer_lookup(statement, [key])
        assert answered is not None
        expected = kv.execute_statement(statement, [key])
        assert (answered.tag, _rows(answered), answered.table.schema) == (
            expected.tag, _rows(expected), expected.table.schema)  # fmt: skip
    # never here; nor by execute_statement, which keeps its plan too (engine.kept_plans)
    assert plans.count(statement.sql) == 0
    assert len(served) == 14


def test_the_door_runs_on_every_call_and_a_revoke_takes_effect_at_once(
    kv: Session, served: list[int], database: Database
) -> None:
    statement = _statement(LOOKUP)
    kv.execute("GRANT SELECT ON kv TO alice")
    kv.execute_statement(statement, [5])  # builds the index
    alice = database.connect(ALICE)
    try:
        for _ in range(3):
            answered = alice.answer_lookup(statement, [5])
            assert answered is not None and _rows(answered) == [("v5",)]
        kv.execute("REVOKE SELECT ON kv FROM alice")
        kv.execute_statement(statement, [5])  # the index built again after the REVOKE
        assert kv.answer_lookup(statement, [5]) is not None
        assert alice.answer_lookup(statement, [5]) is None  # refused: reported the usual way
        with pytest.raises(TopicbaseError) as refused:
            alice.execute_statement(statement, [5])
        assert refused.value.sqlstate == "42501"
        kv.execute("GRANT SELECT ON kv TO alice")
        assert _rows(_run(alice, statement, [5])) == [("v5",)]
        answered = alice.answer_lookup(statement, [5])
        assert answered is not None and _rows(answered) == [("v5",)]
    finally:
        alice.close()


def test_a_write_is_seen_and_a_transaction_goes_the_ordinary_way(
    kv: Session, served: list[int], database: Database
) -> None:
    statement = _statement(LOOKUP)
    kv.execute_statement(statement, [7])
    other = database.connect()
    try:
        other.execute("UPDATE kv SET v = 'new' WHERE k = 7")
        assert kv.answer_lookup(statement, [7]) is None  # the table changed: no index yet
        assert _rows(_run(kv, statement, [7])) == [("new",)]  # ... built again here
        answered = kv.answer_lookup(statement, [7])
        assert answered is not None and _rows(answered) == [("new",)]
        other.execute("DELETE FROM kv WHERE k = 7")
        assert _rows(_run(kv, statement, [7])) == []
        answered = kv.answer_lookup(statement, [7])
        assert answered is not None and _rows(answered) == []
        kv.execute("BEGIN")
        kv.execute("INSERT INTO kv VALUES (7, 'mine', 1)")
        assert kv.answer_lookup(statement, [7]) is None  # its own write: DuckDB reads it
        assert _rows(_run(kv, statement, [7])) == [("mine",)]
        assert _rows(_run(other, statement, [7])) == []
        kv.execute("COMMIT")
        assert _rows(_run(other, statement, [7])) == [("mine",)]
    finally:
        other.close()


def test_a_topic_created_or_dropped_plans_the_lookup_again(
    kv: Session, served: list[int], plans: list[str]
) -> None:
    statement = _statement(LOOKUP)
    kv.execute_statement(statement, [3])
    assert kv.answer_lookup(statement, [3]) is not None
    plans.clear()
    kv.execute("CREATE TOPIC other_topic")
    assert kv.answer_lookup(statement, [3]) is None  # DDL: the index is built again
    assert kv.execute_statement(statement, [3]) is not None
    assert kv.answer_lookup(statement, [3]) is not None
    assert kv.answer_lookup(statement, [3]) is not None
    kv.execute("DROP TOPIC other_topic")
    assert kv.answer_lookup(statement, [3]) is None
    assert kv.execute_statement(statement, [3]) is not None
    assert kv.answer_lookup(statement, [3]) is not None
    # planned again once after each change of the topics, and by each execute_statement
    assert plans.count(LOOKUP) == 2 + 2


def test_a_topic_of_the_tables_name_is_planned_every_time(
    kv: Session, served: list[int], plans: list[str]
) -> None:
    """With a topic named as the table, the table wins while it exists, and the plan
    depends on that: never kept."""
    statement = _statement(LOOKUP)
    kv.execute_statement(statement, [3])
    kv.execute("CREATE TOPIC kv")
    kv.execute_statement(statement, [3])
    plans.clear()
    for _ in range(3):
        answered = kv.answer_lookup(statement, [3])
        assert answered is not None and _rows(answered) == [("v3",)]
    assert plans.count(LOOKUP) == 3


def test_other_statements_are_not_planned_and_a_topic_read_once(
    session: Session, plans: list[str]
) -> None:
    session.execute("CREATE TABLE t (k BIGINT PRIMARY KEY, v VARCHAR)")
    session.execute("CREATE TOPIC events")
    plans.clear()
    for sql, parameters in [("SELECT 1", None), ("SELECT v FROM t WHERE k > $1", [1]),
                            ("INSERT INTO t VALUES ($1, 'x')", [1])]:  # fmt: skip
        assert session.answer_lookup(_statement(sql), parameters) is None
    assert plans == []  # not of the lookup shape: nothing planned
    read = _statement("SELECT data FROM events WHERE key = $1")
    assert lookup_plans.lookup_shaped(read)  # by its text; its plan reads the topic
    for _ in range(3):
        assert session.answer_lookup(read, [b"k"]) is None
    assert plans.count(read.sql) == 1  # kept as not a lookup while the topics stay


def test_a_lookup_is_counted_once_towards_a_build(
    kv: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(key_lookup.BYTES_VARIABLE, raising=False)
    statement = _statement(LOOKUP)
    for key in range(key_lookup.FIRST_BUILD_LOOKUPS - 1):
        assert _rows(_run(kv, statement, [key])) == [(f"v{key}",)]
    assert key_lookup.indexes_of(kv.database).indexes.get("kv") is None
    _run(kv, statement, [1])
    assert key_lookup.indexes_of(kv.database).indexes.get("kv") is not None


def test_the_kept_plans_are_bounded(kv: Session, served: list[int]) -> None:
    statements = [_statement(f"SELECT v AS c{i} FROM kv WHERE k = $1")
                  for i in range(KEPT_LOOKUP_PLANS_MAX + 5)]  # fmt: skip
    kv.execute_statement(statements[0], [1])
    for statement in statements:
        answered = kv.answer_lookup(statement, [1])
        assert answered is not None and _rows(answered) == [("v1",)]
        assert len(kv._lookup_plans) <= KEPT_LOOKUP_PLANS_MAX
    long_text = _statement(f"SELECT v AS {'x' * 5000} FROM kv WHERE k = $1")
    before = len(kv._lookup_plans)
    assert kv.answer_lookup(long_text, [1]) is not None
    assert len(kv._lookup_plans) == before  # over the text bound: planned every time
