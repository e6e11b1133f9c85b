"""Result column names as PostgreSQL gives them (its ``FigureColname``), for DuckDB queries.

DuckDB names an unaliased expression by its text (``count_star()``, ``"version"()``,
``decode("data")`` after the engine's own rewrites); PostgreSQL names it by what was
written: a column by its name, a function call by the function's name, a cast by what it
casts (or the type's name), anything else ``?column?``. The engine renames DuckDB's result
columns to these names, which changes nothing in the query DuckDB runs.

Pure: a function of the sqlglot tree of the statement as the user wrote it.
"""

from __future__ import annotations

import re

from sqlglot import expressions as exp

UNNAMED = "?column?"
_CALL = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*\(")

# PostgreSQL's names of the types a cast of a constant is named by.
_TYPE_NAMES = {
    exp.DataType.Type.INT: "int4",
    exp.DataType.Type.BIGINT: "int8",
    exp.DataType.Type.SMALLINT: "int2",
    exp.DataType.Type.TEXT: "text",
    exp.DataType.Type.VARCHAR: "varchar",
    exp.DataType.Type.BOOLEAN: "bool",
    exp.DataType.Type.DOUBLE: "float8",
    exp.DataType.Type.FLOAT: "float4",
    exp.DataType.Type.DECIMAL: "numeric",
    exp.DataType.Type.DATE: "date",
    exp.DataType.Type.TIMESTAMP: "timestamp",
    exp.DataType.Type.TIMESTAMPTZ: "timestamptz",
    exp.DataType.Type.JSON: "json",
    exp.DataType.Type.JSONB: "jsonb",
    exp.DataType.Type.UUID: "uuid",
    exp.DataType.Type.VARBINARY: "bytea",
}
# Expressions PostgreSQL names by a keyword of their own.
_KEYWORD_NAMES: dict[type[exp.Expression], str] = {
    exp.CurrentUser: "current_user",
    exp.CurrentDate: "current_date",
    exp.CurrentTimestamp: "current_timestamp",
    exp.CurrentTime: "current_time",
    exp.Case: "case",
    exp.Array: "array",
    exp.Coalesce: "coalesce",
    exp.Exists: "exists",
}


def pg_column_names(tree: exp.Expression) -> tuple[str, ...] | None:
    """The names of a SELECT's result columns, or None when they cannot be known from the
    text alone (``*``, set operations, statements that are not a SELECT)."""
    if not isinstance(tree, exp.Select):
        return None
    names = []
    for item in tree.expressions:
        if isinstance(item, exp.Star) or (isinstance(item, exp.Column) and item.is_star):
            return None
        names.append(_name_of(item))
    return tuple(names)


def _name_of(node: exp.Expression) -> str:
    if isinstance(node, exp.Alias):
        return node.alias
    if isinstance(node, exp.Column):
        return node.name
    if isinstance(node, exp.Cast | exp.TryCast):
        inner = _name_of(node.this)
        if inner != UNNAMED:
            return inner
        return _TYPE_NAMES.get(node.to.this, UNNAMED)
    if isinstance(node, exp.Paren):
        return _name_of(node.this)
    if isinstance(node, exp.Subquery) and isinstance(node.this, exp.Select):
        inner_names = pg_column_names(node.this)
        return inner_names[0] if inner_names else UNNAMED
    for kind, name in _KEYWORD_NAMES.items():
        if isinstance(node, kind):
            return name
    if isinstance(node, exp.Anonymous):
        return str(node.this).lower()
    if isinstance(node, exp.Func):
        # sqlglot normalises functions (``version()`` is its CurrentVersion): PostgreSQL's
        # spelling of the call gives the name PostgreSQL would show.
        called = _CALL.match(node.sql(dialect="postgres"))
        return called.group(1).lower() if called else node.sql_name().lower()
    return UNNAMED
