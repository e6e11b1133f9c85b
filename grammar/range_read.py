"""The shape of a topic range read, recognised in a parsed statement.

``SELECT <columns> FROM TOPIC name WHERE partition = p AND offset >= a AND offset < b``
(``*`` for every column; the three conditions in any order) asks for exactly the messages
``[a, b)`` of partition ``p``, projected to plain columns of the topic relation. A front that
can stream such a read straight from storage (``COPY (...) TO STDOUT (FORMAT arrow)``)
recognises it here, on the statement's sqlglot tree (DuckDB dialect), never on its text.

Invariant: ``match_range_read`` returns a ``RangeRead`` only for that exact shape: one
``SELECT`` of unaliased, unqualified, distinct column names (or ``*`` alone) from one topic
scan without options, alias, join or any other clause (no DISTINCT, GROUP BY, ORDER BY,
LIMIT, CTE...), and a WHERE of exactly those three comparisons with non-negative integer
literals. Anything else gives None and is run as the ordinary query it is, which gives the
same rows. Whether the names are columns of a topic is the caller's to check (the grammar
does not know the relation's columns). Pure function, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlglot
from sqlglot import exp

from grammar.ast import SqlStatement, Statement

_SELECT_PARTS = frozenset({"expressions", "from", "from_", "where"})


@dataclass(frozen=True)
class RangeRead:
    """Messages ``[start, end)`` of ``partition`` of ``topic``; ``columns`` empty: all."""

    topic: str
    columns: tuple[str, ...]
    partition: int
    start: int
    end: int


def match_range_read(statement: Statement) -> RangeRead | None:
    """``statement`` as a topic range read, or None if it is anything else."""
    if not isinstance(statement, SqlStatement) or len(statement.topic_scans) != 1:
        return None
    scan = statement.topic_scans[0]
    if scan.options:
        return None
    try:
        tree = sqlglot.parse(statement.sql, read="duckdb")
    except sqlglot.errors.SqlglotError:
        return None
    if len(tree) != 1 or not isinstance(tree[0], exp.Select):
        return None
    select = tree[0]
    if any(value for key, value in select.args.items() if key not in _SELECT_PARTS):
        return None
    source = select.args.get("from_") or select.args.get("from")
    if not isinstance(source, exp.From) or not _is_plain_table(source.this, scan.placeholder):
        return None
    columns = _columns(select.expressions)
    where = select.args.get("where")
    bounds = _bounds(where.this) if isinstance(where, exp.Where) else None
    if columns is None or bounds is None:
        return None
    partition, start, end = bounds
    return RangeRead(scan.topic, columns, partition, start, end)


def _is_plain_table(node: exp.Expression, name: str) -> bool:
    if not isinstance(node, exp.Table) or node.name != name:
        return False
    return not any(value for key, value in node.args.items() if key != "this")


def _columns(expressions: list[exp.Expression]) -> tuple[str, ...] | None:
    """Plain column names (empty for ``*`` alone), or None for anything else."""
    if len(expressions) == 1 and isinstance(expressions[0], exp.Star):
        return ()
    names = []
    for node in expressions:
        if not isinstance(node, exp.Column) or not isinstance(node.this, exp.Identifier):
            return None
        if any(value for key, value in node.args.items() if key != "this"):
            return None  # qualified (t.data) or anything more
        names.append(node.this.this)
    if not names or len(set(names)) != len(names):
        return None
    return tuple(names)


def _conjuncts(node: exp.Expression) -> list[exp.Expression]:
    if isinstance(node, exp.And):
        return _conjuncts(node.this) + _conjuncts(node.expression)
    return [node]


def _bounds(condition: exp.Expression) -> tuple[int, int, int] | None:
    """(partition, start, end) from ``partition = p AND offset >= a AND offset < b``."""
    found: dict[type, int] = {}
    for node in _conjuncts(condition):
        kind = type(node)
        if kind not in (exp.EQ, exp.GTE, exp.LT) or kind in found:
            return None
        column, literal = node.this, node.expression
        wanted = "partition" if kind is exp.EQ else "offset"
        if not isinstance(column, exp.Column) or column.name != wanted or column.table:
            return None
        if not isinstance(literal, exp.Literal) or literal.is_string:
            return None
        text = str(literal.this)
        if not text.isdigit():
            return None
        found[kind] = int(text)
    if len(found) != 3:
        return None
    return found[exp.EQ], found[exp.GTE], found[exp.LT]
