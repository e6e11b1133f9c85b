"""A session's plans of primary-key lookups, kept by statement (``Session.answer_lookup``).

A prepared lookup (``SELECT v FROM kv WHERE k = $1``, run again and again with new values)
is planned the same way every time: a statement over tables only is planned from its text
alone (``planner.planner._plan_sql``: its cached analysis, one ``RunQuery`` per text), and
the one thing outside the text the plan depends on is whether a name it reads is a topic's
(``planner.relations.names_a_topic``: then the plan reads the topic, or asks DuckDB whether
a table of that name wins). So a plan is kept here only when no name it reads is a topic's,
and only while the topics stay as they were (the catalog's ``changes``, which counts topics
created and dropped). Only planning is kept: the door judges every execution
(``Session.answer_lookup`` -> ``_guard``: its checks, or its decision on this plan kept
while nothing it was made of changed), as do the index's own rules of coherence.

Bounds (``storage.limits``): at most ``KEPT_LOOKUP_PLANS_MAX`` plans (then all are
forgotten), of texts of at most ``KEPT_LOOKUP_TEXT_CHARS_MAX`` characters; only plans of
the lookup shape (``key_lookup.lookup_plan``) are kept. A plan is kept by the statement's
id and holds the statement, so the id is not reused while it is kept.

Thread-safety: one per session, used under the session's lock.
"""

from __future__ import annotations

from typing import Any

from engine import key_lookup
from engine.key_lookup import KeptWay
from grammar import ast
from planner import planner
from planner.catalog import SessionCatalog
from planner.operations import Plan
from planner.relations import names_a_topic
from storage.limits import KEPT_LOOKUP_PLANS_MAX, KEPT_LOOKUP_TEXT_CHARS_MAX


def lookup_shaped(statement: ast.Statement) -> bool:
    """Whether ``statement``'s text is of the lookup shape (``planner.key_lookup``), read
    from the planner's analysis of the text (cached by text): a property of the text
    alone, so that no other statement is planned an extra time here."""
    if not isinstance(statement, ast.SqlStatement) or statement.topic_scans:
        return False
    return planner.analyse_sql(statement.sql).lookup is not None


class KeptLookupPlans:
    """Plans of lookup statements by statement (see the module), each with its
    ``key_lookup.KeptWay`` (what its answers share on the index they come from)."""

    def __init__(self) -> None:
        # id(statement) -> (the statement, the catalog's changes when planned, its plan
        # and way; None: not a lookup's plan, e.g. one reading a topic of the name)
        self._plans: dict[int, tuple[ast.Statement, int, tuple[Plan, KeptWay] | None]] = {}

    def __len__(self) -> int:
        return len(self._plans)

    def plan(self, statement: ast.SqlStatement, database: Any, session: Any
             ) -> tuple[Plan, KeptWay | None] | None:  # fmt: skip
        """``statement``'s plan if it is one of the lookup shape (kept, or planned now and
        kept) with its kept way (None for a plan not kept: planned every time), else None
        (the caller runs the statement the ordinary way, which plans it and reports any
        error). Planned with ``session``'s ``planning_catalog``, as the ordinary way plans."""
        changes = database.catalog.changes
        kept = self._plans.get(id(statement))
        if kept is not None and kept[0] is statement and kept[1] == changes:
            return kept[2]
        if not lookup_shaped(statement):
            return None  # never planned here
        catalog: SessionCatalog = session.planning_catalog
        try:
            plan = planner.plan(statement, catalog)
        except Exception:  # the ordinary way plans it again and reports it
            return None
        found = key_lookup.lookup_plan(plan)
        kept_plan: tuple[Plan, KeptWay] | None = None
        if found is not None:
            if names_a_topic(found[0].tables_read, catalog):
                return plan, None  # may read a topic once a table is dropped: planned every time
            kept_plan = plan, KeptWay(*found)
        # else not planned again here while the topics stay as they are
        if len(statement.sql) <= KEPT_LOOKUP_TEXT_CHARS_MAX:
            if len(self._plans) >= KEPT_LOOKUP_PLANS_MAX:
                self._plans.clear()
            self._plans[id(statement)] = (statement, changes, kept_plan)
        return kept_plan
