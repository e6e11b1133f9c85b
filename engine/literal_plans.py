"""A session's plans of parameterless SELECTs of literals, kept by statement
(``Session.answer_literal``).

A SELECT whose every item is a literal (``SELECT 1``, a pool's health check, prepared and
run again and again) is planned from its text alone: it names no relation, so no topic,
table, view or setting of the catalog enters its plan (``planner.planner._plan_sql``: no
relation name, no read; ``relative_statement`` changes only topic paths, of which it has
none), and the planner's judgement that it is literal (``RunQuery.literal_only``) and
DuckDB's tokens' (``tables.literal_tokens``) are functions of the text. So its plan needs
no invalidation: it is the same plan the ordinary way makes every time. Only planning is
kept: the door judges every execution (``Session.answer_literal`` -> ``_guard``: its
sandbox and privilege checks, or its decision on this plan, kept while nothing it was
made of changed), as does the session's state's check.

Bounds (``storage.limits``): at most ``KEPT_LITERAL_PLANS_MAX`` statements a session (then
all are forgotten), each of a text of at most ``LITERAL_RESULT_TEXT_CHARS_MAX``
characters (the longest whose row is kept at all); the plans share the statements and
analyses the parse caches hold already, so a session holds at most ~16 x 4096 x 4 bytes
of text through them. Only literal SELECTs' plans are kept. A plan is kept by the
statement's id and holds the statement, so the id is not reused while kept.

Thread-safety: one per session, used under the session's lock.
"""

from __future__ import annotations

from collections.abc import Callable

from engine import tables
from grammar import ast
from planner import planner
from planner.catalog import SessionCatalog
from planner.operations import Plan, RunQuery
from storage.limits import KEPT_LITERAL_PLANS_MAX, LITERAL_RESULT_TEXT_CHARS_MAX


def literal_operation(plan: Plan) -> RunQuery | None:
    """The one operation of ``plan`` if it is a parameterless plain SELECT of literals that
    runs on the literal database (``Session._run``'s literal way, ``tables.literal_result``
    keeping its row), else None."""
    if plan.explain_only or len(plan.operations) != 1:
        return None
    operation = plan.operations[0]
    return operation if type(operation) is RunQuery and literal_query(operation) else None


def literal_query(query: RunQuery) -> bool:
    """Whether ``query`` (a plan's operation, or the planner's analysis of a text) is a
    parameterless plain SELECT of literals, as both parsers read it (``RunQuery.
    literal_only`` and ``tables.literal_tokens``), of a text whose row may be kept."""
    return (
        query.tag == "SELECT"
        and query.returns_rows
        and query.projection is None
        and not query.system_views
        and query.literal_only
        and not query.uses_parameters
        and len(query.sql) <= LITERAL_RESULT_TEXT_CHARS_MAX
        and tables.literal_tokens(query.sql)
    )


class KeptLiteralPlans:
    """Plans of literal SELECTs by statement (see the module)."""

    def __init__(self) -> None:
        # id(statement) -> (the statement, its plan)
        self._plans: dict[int, tuple[ast.Statement, Plan]] = {}

    def __len__(self) -> int:
        return len(self._plans)

    def plan(self, statement: ast.SqlStatement, catalog: Callable[[], SessionCatalog]
             ) -> Plan | None:  # fmt: skip
        """``statement``'s plan if it is a parameterless SELECT of literals (kept, or
        planned now and kept), else None (the caller runs the statement the ordinary way,
        which plans it and reports any error). ``catalog``: the session's (made only when
        planning). Any other statement is told apart by the planner's analysis of its text
        (cached by text, and asked by the ordinary way anyway): it is not planned here."""
        kept = self._plans.get(id(statement))
        if kept is not None and kept[0] is statement:
            return kept[1]
        sql = statement.sql
        if statement.topic_scans or len(sql) > LITERAL_RESULT_TEXT_CHARS_MAX:
            return None
        try:
            if not literal_query(planner.analyse_sql(sql)):
                return None
            plan = planner.plan(statement, catalog())
        except Exception:  # the ordinary way plans it again and reports it
            return None
        if literal_operation(plan) is None:
            return None
        if len(self._plans) >= KEPT_LITERAL_PLANS_MAX:
            self._plans.clear()
        self._plans[id(statement)] = (statement, plan)
        return plan
