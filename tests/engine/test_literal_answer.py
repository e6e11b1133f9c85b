"""``Session.answer_literal``: an autocommit parameterless SELECT of literals whose row is
kept is answered with its plan kept per statement (``engine.literal_plans``) and no
transaction begun or committed, and with the door's checks run on every call; anything
else is left to ``execute_statement`` (None, nothing ran). docs/statement_cost.md round 9."""

from __future__ import annotations

from typing import Any

import pytest

from engine import literal_plans, privileges, sandbox, tables
from engine import session as session_module
from engine.session import Session, SessionState
from grammar import ast
from planner import planner
from storage import limits
from storage.errors import InsufficientPrivilegeError, TopicbaseError
from tests.literal_statements import literal_runs
from tests.planner_spy import planned_statements

TEXTS = [
    "SELECT 1",
    "select 1 AS ok",
    "SELECT '' AS empty, 'it''s', 'ü €', 'a\nb', '\x00'",
    "SELECT -1 AS x, 'a' b, NULL, TRUE, false",  # kept as DuckDB's Arrow table
    'SELECT 0.1, 1e3, -2.5e-3 AS "Mixed Case", 9223372036854775808',
]


@pytest.fixture
def duckdb_runs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    return literal_runs(monkeypatch)


@pytest.fixture
def plans(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The texts ``planner.plan`` planned, from anywhere."""
    return planned_statements(monkeypatch)


def _statement(sql: str) -> ast.Statement:
    return session_module.parse_statements(sql)[0]


def _kept(session: Session, statement: ast.Statement) -> None:
    """Run ``statement`` the ordinary way until its row is kept (the first run gives
    DuckDB's Arrow, the second the steady form)."""
    session.execute_statement(statement)
    session.execute_statement(statement)


def _outcome(result: Any) -> Any:
    table = result.table
    rows = [tuple(column[i].as_py() for column in table.columns) for i in range(table.num_rows)]
    return (result.tag, table.schema, table.schema.metadata, rows, result.notices)


@pytest.mark.parametrize("sql", TEXTS)
def test_a_kept_literal_is_answered_as_execute_statement_answers_it(
    session: Session, duckdb_runs: list[str], plans: list[str], sql: str
) -> None:
    statement = _statement(sql)
    assert session.answer_literal(statement) is None  # not kept yet: nothing ran
    assert duckdb_runs == []
    assert plans == [sql]  # its plan, kept for the statement: it depends on the text alone
    _kept(session, statement)
    expected = _outcome(session.execute_statement(statement))
    duckdb_runs.clear()
    plans.clear()
    for _ in range(3):
        result = session.answer_literal(statement)
        assert result is not None and result.kept
        assert _outcome(result) == expected
        assert session.state is SessionState.IDLE and session.transaction is None
    assert duckdb_runs == []
    assert plans == []  # not planned again


def test_each_answer_gets_its_own_rows(session: Session) -> None:
    statement = _statement("SELECT 1 AS a")
    _kept(session, statement)
    first = session.answer_literal(statement)
    assert first is not None and first.rows is not None
    first.rows.rows.append((2,))
    second = session.answer_literal(statement)
    assert second is not None and second.rows is not None
    assert second.rows.rows == [(1,)]


def test_the_door_s_checks_run_on_every_answer(
    session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    statement = _statement("SELECT 1")
    _kept(session, statement)
    checked: list[str] = []
    sandbox_check, privilege_check = sandbox.check_plan, privileges.check_plan

    def sandbox_spy(plan: Any, identity: Any) -> None:
        checked.append("sandbox")
        sandbox_check(plan, identity)

    def privilege_spy(plan: Any, identity: Any, session: Any, memo: Any = None) -> None:
        checked.append("privileges")
        privilege_check(plan, identity, session, memo=memo)

    monkeypatch.setattr(sandbox, "check_plan", sandbox_spy)
    monkeypatch.setattr(privileges, "check_plan", privilege_spy)
    for _ in range(3):
        assert session.answer_literal(statement) is not None
    assert checked == ["sandbox", "privileges"] * 3

    def refusing(plan: Any, identity: Any, session: Any, memo: Any = None) -> None:
        raise InsufficientPrivilegeError("permission denied: refused for the test")

    monkeypatch.setattr(privileges, "check_plan", refusing)
    assert session.answer_literal(statement) is None  # refused: left to execute_statement
    with pytest.raises(InsufficientPrivilegeError):
        session.execute_statement(statement)
    monkeypatch.setattr(privileges, "check_plan", privilege_check)
    assert session.answer_literal(statement) is not None


def test_only_outside_a_transaction(session: Session, duckdb_runs: list[str]) -> None:
    statement = _statement("SELECT 1")
    _kept(session, statement)
    session.execute("BEGIN")
    assert session.answer_literal(statement) is None
    session.execute_statement(statement)  # the transaction's own way
    with pytest.raises(TopicbaseError):
        session.execute("SELECT * FROM no_such_table")
    assert session.state is SessionState.FAILED
    assert session.answer_literal(statement) is None  # execute_statement refuses it (25P02)
    session.execute("ROLLBACK")
    assert session.answer_literal(statement) is not None


def test_other_statements_are_not_answered_nor_planned_here(
    session: Session, plans: list[str]
) -> None:
    session.execute("CREATE TABLE t (a INTEGER)")
    texts = ["SELECT $1", "SELECT 1 + 1", "SELECT a FROM t", "SELECT abs(-1)",
             "SELECT 1 FROM t", "INSERT INTO t VALUES (1)", "EXPLAIN SELECT 1"]  # fmt: skip
    for sql in texts:
        statement = _statement(sql)
        for _ in range(2):
            plans.clear()
            assert session.answer_literal(statement) is None
            assert plans == []  # the planner's cached analysis told them apart
    assert len(session._literal_plans) == 0


def test_a_closed_session_or_an_open_stream_is_left_to_execute_statement(
    database: Any,
) -> None:
    session = database.connect()
    statement = _statement("SELECT 1")
    _kept(session, statement)
    stream = session.open_stream(_statement("SELECT * FROM range(3)"), None, no_rows=None)
    assert stream is not None
    assert session.answer_literal(statement) is None
    stream.close()
    assert session.answer_literal(statement) is not None
    session.close()
    assert session.answer_literal(statement) is None


def test_kept_plans_stay_bounded(session: Session) -> None:
    for n in range(3 * limits.KEPT_LITERAL_PLANS_MAX):
        statement = _statement(f"SELECT {n}")
        _kept(session, statement)
        assert session.answer_literal(statement) is not None
        assert len(session._literal_plans) <= limits.KEPT_LITERAL_PLANS_MAX
    long_text = "SELECT " + ", ".join(["1"] * 1500) + " AS a"
    assert len(long_text) > limits.LITERAL_RESULT_TEXT_CHARS_MAX
    statement = _statement(long_text)
    before = len(session._literal_plans)
    assert session.answer_literal(statement) is None
    assert len(session._literal_plans) == before


def test_literal_operation_judges_a_plan_as_the_literal_way_does(session: Session) -> None:
    catalog = session.planning_catalog
    for sql, literal in [("SELECT 1", True), ("SELECT $1", False), ("SELECT 1 + 1", False),
                         ("EXPLAIN SELECT 1", False), ("SELECT 'x' AS \"y\"", True)]:  # fmt: skip
        plan = planner.plan(_statement(sql), catalog)
        assert (literal_plans.literal_operation(plan) is not None) is literal, sql
        assert (literal_plans.literal_operation(plan) is not None) == bool(
            literal and tables.literal_tokens(sql)
        )
