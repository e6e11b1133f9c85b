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

A query source is run twice (counted, then inserted), so the count is sound only when both
runs give the same rows. A source with a volatile function (``_VOLATILE``: random(),
uuid(), nextval(), setseed(), …, DuckDB's functions of stability VOLATILE) or a sample
(USING SAMPLE, TABLESAMPLE) is not checked: such a statement keeps DuckDB's behaviour (one
row of a key applied, the others dropped). A user's macro that calls one is not seen here
(a known gap). A source that cannot propose a key twice is not counted either: a plain
``SELECT DISTINCT ON (…)`` or ``GROUP BY …`` over exactly the named conflict columns,
projected as themselves into the statement's column list (``engine.bulk_publish``'s
statements), optionally beside one item ``CASE WHEN k1 IS NULL OR … THEN x END`` naming
each conflict column once and no ELSE: NULL for every row whose key is whole (those are
folded by the key alone), so it only keeps apart rows with a NULL in the key, which
conflict with nothing. That skip trusts the source's own equality: a key the table's type or
collation merges (1.2 and 1.4 into an INTEGER key, 'a' and 'A' under NOCASE) is applied
once, as DuckDB does, not refused.

Pure functions of sqlglot's tree, no I/O.
"""

from __future__ import annotations

from sqlglot import expressions as exp

from planner.front_work import find_all
from planner.operations import UpsertCheck

_PARAMETERS = (exp.Placeholder, exp.Parameter)

# DuckDB's functions whose result may differ between two runs of one query in one
# transaction (duckdb_functions() with stability VOLATILE, DuckDB 2.0), by name; sqlglot
# parses random()/rand() as exp.Rand and uuid()/gen_random_uuid() as exp.Uuid.
_VOLATILE = frozenset({
    "random", "rand", "setseed", "uuid", "gen_random_uuid", "uuidv4", "uuidv7",
    "nextval", "currval", "setval", "current_query", "current_query_id",
    "current_transaction_id", "current_connection_id", "txid_current", "sleep_ms",
    "error", "write_log", "stats", "vector_type",
})  # fmt: skip
_VOLATILE_NODES = (exp.Rand, exp.Uuid, exp.TableSample)


def upsert_check(tree: exp.Expression) -> UpsertCheck | None:
    """The check of ``tree`` if it is an ``INSERT … ON CONFLICT … DO UPDATE`` without a
    ``WHERE`` that may propose more than one row, else None. A VALUES gives its number of
    rows; a query gives a ``SELECT count(*)`` of its rows (with the statement's WITH), kept
    only when every parameter of the statement is in it, so it runs with the statement's
    parameters as they are. Not checked (None): DO NOTHING (PostgreSQL keeps the first row
    of a key and skips the rest, as DuckDB does), a DO UPDATE … WHERE (a row the WHERE
    skips is not counted either), DuckDB's INSERT OR REPLACE (not PostgreSQL's), one row,
    a volatile query source, a source that gives one row per conflict key (module doc)."""
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
    if _volatile(source) or (prefix is not None and _volatile(prefix)):
        return None  # two runs may give two row sets: a count would not be this insert's
    if _one_row_per_key(tree, conflict, source):
        return None
    used = sum(1 for _ in find_all(tree, *_PARAMETERS))
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


def _volatile(node: exp.Expression) -> bool:
    """Whether ``node`` holds a volatile function or a sample (module doc)."""
    for sub in node.walk():
        if isinstance(sub, _VOLATILE_NODES):
            return True
        if isinstance(sub, exp.Anonymous) and sub.name.lower() in _VOLATILE:
            return True
        if isinstance(sub, exp.Func) and sub.sql_name().lower() in _VOLATILE:
            return True
    return False


def _column_key(node: exp.Expression) -> tuple[str, str] | None:
    """A bare column as (qualifier, name), lower case (DuckDB's identifiers are
    case-insensitive), else None."""
    if not isinstance(node, exp.Column):
        return None
    return (node.table.lower(), node.name.lower())


def _one_row_per_key(tree: exp.Insert, conflict: exp.OnConflict, source: exp.Expression) -> bool:
    """Whether ``source`` is a single SELECT that yields at most one row per value of the
    named conflict columns: ``DISTINCT ON`` or ``GROUP BY`` exactly those columns (bare,
    no ROLLUP/CUBE/GROUPING SETS/ALL), each projected as itself at the position the
    statement's column list gives it, and no UNNEST in the projection (which would
    multiply a group's row). A target left out (the table's key, unknown here) or a
    statement without a column list: False (keep the check)."""
    if not isinstance(source, exp.Select):
        return False
    keys = [
        k.this if isinstance(k, exp.Ordered) else k
        for k in conflict.args.get("conflict_keys") or []
    ]
    schema = tree.this
    if not keys or not isinstance(schema, exp.Schema) or not schema.expressions:
        return False
    columns = [c.name.lower() for c in schema.expressions]
    projections = source.expressions
    if len(projections) != len(columns) or any(
        p.find(exp.Unnest, exp.Explode) for p in projections
    ):
        return False
    distinct = source.args.get("distinct")
    group = source.args.get("group")
    if isinstance(distinct, exp.Distinct) and distinct.args.get("on") is not None and not group:
        on = distinct.args["on"]
        by = list(on.expressions) if isinstance(on, exp.Tuple) else [on]
    elif group is not None and not distinct and not group.args.get("all"):
        if any(group.args.get(kind) for kind in ("grouping_sets", "cube", "rollup", "totals")):
            return False
        by = list(group.expressions)
    else:
        return False
    apart = [b for b in by if _null_key_apart(b) is not None]
    if len(apart) > 1:
        return False
    if apart:
        by = [b for b in by if b is not apart[0]]
    grouped = {_column_key(b) for b in by}
    if None in grouped or len(grouped) != len(by):
        return False
    if apart and _null_key_apart(apart[0]) != grouped:
        return False
    projected = set()
    for key in keys:
        name = key.name.lower() if isinstance(key, exp.Column | exp.Identifier) else None
        if name is None or name not in columns:
            return False
        projected.add(_column_key(projections[columns.index(name)]))
    return None not in projected and projected == grouped and len(projected) == len(keys)


def _null_key_apart(node: exp.Expression) -> set[tuple[str, str] | None] | None:
    """The columns of ``CASE WHEN c1 IS NULL OR c2 IS NULL … THEN x END`` (one WHEN, no
    ELSE, each column once), else None: an item of a fold that is NULL exactly when none
    of those columns is (``_one_row_per_key``)."""
    if not isinstance(node, exp.Case) or node.args.get("default") is not None:
        return None
    ifs = node.args.get("ifs") or []
    if node.this is not None or len(ifs) != 1:
        return None
    tests = []
    condition = ifs[0].this
    while isinstance(condition, exp.Or):
        tests.append(condition.expression)
        condition = condition.this
    tests.append(condition)
    columns = []
    for test in tests:
        while isinstance(test, exp.Paren):
            test = test.this
        if not (isinstance(test, exp.Is) and isinstance(test.expression, exp.Null)):
            return None
        columns.append(_column_key(test.this))
    found = set(columns)
    return found if None not in found and len(found) == len(columns) else None
