"""A session's plans kept by statement, while the topics they name stay as they were.

A worker runs the same few statements again and again (``BEGIN``; a move ``INSERT INTO
TOPIC b SELECT data FROM TOPIC a WITH (...)``; ``COMMIT``), and ``planner.plan`` works each
one out anew: ~20 us of the three alone, 40-60 us inside the workload (docs/move_profile.md,
rounds 9, 10 and 17). A plan is a function of the statement and of what the planner's
catalog told it (``planner.catalog.SessionCatalog``):

- the topics it looked up by name: their entries (id, settings, consumers), which change
  only by DDL (``CatalogStore.entries_changed`` counts every entry added, altered or
  removed), and their partitions, all and active, which also change without DDL: an
  autopartitioning split or a removed partition (``topic_log.layout_generation``, which
  every change of any topic's partitions bumps);
- whether the session's DuckDB connection sees a table of a name that also names a topic
  (``has_duckdb_relation``): a plan that asked is never kept (tables come and go without
  the catalog knowing), so one is kept only when its text names no topic by a plain name.

So a kept plan is used only while both generations are what they were when it was
planned, read *before* planning: a change during planning leaves the plan kept under the
old generation, which no longer matches. Only the statement kinds a worker repeats are
kept (``KEPT_KINDS``), of texts the parse cache keeps (at most
``CACHED_TEXT_CHARS_MAX`` characters); DDL, EXPLAIN and the rest are planned every
time. Only planning is kept: the door judges every execution (``Session._guard``: its
checks, or its decision on this very plan, kept while nothing it was made of changed).

Bounds (``storage.limits``): at most ``KEPT_PLANS_MAX`` plans a session, each costed by
its text (``TEXT_COST_PER_CHAR``) in a ``BoundedCache``, part of the process-wide budget.
A plan is kept by the statement's id and holds the statement (parsed statements are shared
per text, ``engine.session._parse_cached``), so the id is not reused while it is kept.

Thread-safety: one per session, used under the session's lock.
"""

from __future__ import annotations

from typing import Any

from grammar import ast
from grammar.bounded_cache import TEXT_COST_PER_CHAR, BoundedCache
from planner import planner
from planner.catalog import SessionCatalog
from planner.operations import Plan
from storage import limits, topic_log

# The statement kinds a worker repeats; the others (DDL, EXPLAIN, SHOW, grants) are not
# worth keeping, and DDL changes what it would be kept by.
KEPT_KINDS = (ast.SqlStatement, ast.InsertTopic, ast.CommitOffsets, ast.Begin, ast.Commit,
              ast.Rollback)  # fmt: skip


def generation(database: Any) -> tuple[int, int]:
    """What a kept plan depends on besides its statement: the catalog's entries and every
    topic's partitions, as counters that change whenever they do."""
    return database.catalog.entries_changed, topic_log.layout_generation()


class KeptPlans:
    """A session's plans by statement (see the module)."""

    def __init__(self) -> None:
        self._plans = BoundedCache("engine.kept_plans", limits.KEPT_PLANS_MAX)

    def __len__(self) -> int:
        return len(self._plans)

    def holds(self, statement: ast.Statement, plan: Plan) -> bool:
        """Whether ``plan`` is the plan kept for ``statement`` (the same object on the next
        run while it stays kept: the door may keep its decision on it, ``door_memo``)."""
        kept = self._plans.get(id(statement))
        return kept is not None and kept[0] is statement and kept[2] is plan

    def kept(self, statement: ast.Statement, database: Any) -> Plan | None:
        """The plan kept for ``statement`` while it is current (no topic created or dropped
        since it was planned: the same test as ``plan``'s), else None; never plans."""
        kept = self._plans.get(id(statement))
        if kept is None or kept[0] is not statement or kept[1] != generation(database):
            return None
        plan: Plan = kept[2]
        return plan

    def plan(self, statement: ast.Statement, database: Any,
             has_duckdb_relation: Any) -> Plan:  # fmt: skip
        """``planner.plan(statement, SessionCatalog(database, has_duckdb_relation))``, kept
        or planned now (and kept when it may be). A statement that does not plan raises
        as ``planner.plan`` does, and nothing is kept."""
        if not isinstance(statement, KEPT_KINDS) or len(
                getattr(statement, "text", "")) > limits.CACHED_TEXT_CHARS_MAX:  # fmt: skip
            # A longer text is parsed anew each time (the parse cache does not keep it):
            # a plan kept by its statement would never be found again (review R2-17-4).
            return planner.plan(statement, SessionCatalog(database, has_duckdb_relation))
        now = generation(database)
        key = id(statement)
        kept = self._plans.get(key)
        if kept is not None and kept[0] is statement and kept[1] == now:
            return kept[2]
        asked: list[str] = []

        def recorded(name: str) -> bool:
            asked.append(name)
            return bool(has_duckdb_relation(name))

        plan = planner.plan(statement, SessionCatalog(database, recorded))
        if not asked:  # a plan that depends on DuckDB's tables is planned every time
            self._plans.put(key, (statement, now, plan), _cost(statement))
        return plan


def _cost(statement: ast.Statement) -> int:
    """The estimated bytes a kept plan holds, by its statement's text (as the parse cache
    costs it): the plan derives from the text alone (an SQL text and its analysis,
    literal rows, options), a few hundred bytes of operations besides."""
    return (len(getattr(statement, "text", "")) + 64) * TEXT_COST_PER_CHAR
