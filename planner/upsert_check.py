"""Which ``INSERT … ON CONFLICT … DO UPDATE`` statements the engine checks for a key
proposed twice, and how (``planner.operations.UpsertCheck``).

PostgreSQL refuses a DO UPDATE that would affect one row twice (SQLSTATE 21000, "ON
CONFLICT DO UPDATE command cannot affect row a second time"); DuckDB applies one proposed
row of each key and drops the rest without a word. Without a ``WHERE`` on the update every
proposed row DuckDB keeps is counted (inserted, or the row it updates), so the statement
proposed a key twice exactly when DuckDB's count is below the number of rows proposed. NULL
keys conflict with nothing, so they are inserted and counted: never an error, as in
PostgreSQL. Conversions, collations and the table's own key (a target left out) are
DuckDB's, as its conflict detection uses them: no key is compared here.

Pure functions of sqlglot's tree, no I/O.
"""

from __future__ import annotations

from sqlglot import expressions as exp

from planner.operations import UpsertCheck

_PARAMETERS = (exp.Placeholder, exp.Parameter)


def upsert_check(tree: exp.Expression) -> UpsertCheck | None:
    """The check of ``tree`` if it is an ``INSERT … ON CONFLICT … DO UPDATE`` without a
    ``WHERE`` that may propose more than one row, else None. A VALUES gives its number of
    rows; a query gives a ``SELECT count(*)`` of its rows (with the statement's WITH), kept
    only when every parameter of the statement is in it, so it runs with the statement's
    parameters as they are. Not checked (None): DO NOTHING (PostgreSQL keeps the first row
    of a key and skips the rest, as DuckDB does), a DO UPDATE … WHERE (a row the WHERE
    skips is not counted either), DuckDB's INSERT OR REPLACE (not PostgreSQL's), one row."""
    if not isinstance(tree, exp.Insert):
        return None
    conflict = tree.args.get("conflict")
    if not isinstance(conflict, exp.OnConflict) or conflict.args.get("where"):
        return None
    action = conflict.args.get("action")
    if action is None or action.name.upper() != "DO UPDATE":
        return None
    source = tree.expression
    if isinstance(source, exp.Values):
        rows = len(source.expressions)
        return UpsertCheck(rows, None) if rows > 1 else None
    if not isinstance(source, exp.Query | exp.Subquery):
        return None  # DEFAULT VALUES: one row
    prefix = tree.args.get("with_") or tree.args.get("with")
    used = sum(1 for _ in tree.find_all(*_PARAMETERS))
    counted = sum(1 for _ in source.find_all(*_PARAMETERS))
    if prefix is not None:
        counted += sum(1 for _ in prefix.find_all(*_PARAMETERS))
    if counted != used:
        return None  # a parameter outside the query (in SET): its numbering differs
    count = exp.select(exp.Count(this=exp.Star())).from_(
        exp.Subquery(this=source.copy(), alias=exp.TableAlias(this=exp.to_identifier("proposed")))
    )
    if prefix is not None:
        count.set("with_" if "with_" in tree.args else "with", prefix.copy())
    return UpsertCheck(None, count.sql(dialect="duckdb"))
