"""The shape of a primary-key lookup: ``SELECT a, b AS c FROM t WHERE k1 = $1 AND k2 = 'x'``.

Pure: reads only the statement's text. ``lookup_shape`` recognises a SELECT of plain
columns (or ``*``) of one unqualified relation, whose WHERE is a conjunction of
equalities, each between one column and one value (a parameter, an integer literal or a
string literal), and nothing else: no join, GROUP BY, HAVING, ORDER BY, LIMIT, OFFSET,
DISTINCT, window, CTE, sample, function, cast or expression. Whether the equalities cover
exactly the relation's primary key, whether the columns exist and the values compare as
DuckDB compares them is the engine's business (``engine.key_lookup``), which knows the
table; anything it cannot prove identical runs in DuckDB.

The relation's name and qualifiers are ASCII (compared with ``lower()``, as DuckDB
folds them); a column's name is the engine's to fold (``engine.key_lookup.fold``).

Invariant: a shape is returned only for a text whose meaning is fully described by it
(the relation named, the columns projected in order with their output names, and the
conjunction of equalities), so that answering it from the table's rows is answering the
text.
"""

from __future__ import annotations

import sqlglot
from sqlglot import expressions as exp

from grammar.text_cache import text_cache
from planner.duckdb_sql import parse_duckdb
from planner.operations import LookupShape, LookupValue

SHAPE_CACHE_ENTRIES = 1024
# sqlglot arguments of a SELECT that the shape allows to be set (``from`` in older
# sqlglot, ``from_`` in newer).
_ALLOWED_SELECT_ARGS = frozenset({"expressions", "from", "from_", "where"})
_ALLOWED_TABLE_ARGS = frozenset({"this", "alias"})


@text_cache(SHAPE_CACHE_ENTRIES)
def lookup_shape(sql: str) -> LookupShape | None:
    """The lookup shape of ``sql``, or None when it is anything else (see the module)."""
    try:
        tree = parse_duckdb(sql)
    except sqlglot.errors.ParseError:
        return None
    return lookup_shape_of(tree)


def lookup_shape_of(tree: exp.Expression | None) -> LookupShape | None:
    """``lookup_shape`` of a statement's sqlglot tree (the planner's own parse)."""
    if type(tree) is not exp.Select:
        return None
    if any(value for key, value in tree.args.items() if key not in _ALLOWED_SELECT_ARGS):
        return None
    source = tree.args.get("from_") or tree.args.get("from")
    table = source.this if isinstance(source, exp.From) else None
    if type(table) is not exp.Table or table.db or table.catalog:
        return None
    if any(value for key, value in table.args.items() if key not in _ALLOWED_TABLE_ARGS):
        return None
    name = _identifier(table.args.get("this"))
    if name is None or not name.isascii():
        return None  # DuckDB folds names in ASCII only: not Python's lower()
    alias = table.args.get("alias")
    qualifiers = {name.lower()}
    if alias is not None:
        if type(alias) is not exp.TableAlias or alias.args.get("columns"):
            return None
        alias_name = _identifier(alias.args.get("this"))
        if alias_name is None or not alias_name.isascii():
            return None
        qualifiers = {alias_name.lower()}  # DuckDB: an aliased table is named by its alias
    columns = _projection(tree.expressions, qualifiers)
    if columns is False:
        return None
    where = tree.args.get("where")
    if type(where) is not exp.Where:
        return None
    equalities = _equalities(where.this, qualifiers)
    if equalities is None:
        return None
    parameters = _number_parameters(equalities)
    if parameters is None:
        return None
    numbered, count = parameters
    return LookupShape(name, columns, numbered, count)


def _identifier(node: object) -> str | None:
    return node.this if type(node) is exp.Identifier and isinstance(node.this, str) else None


def _column(node: object, qualifiers: set[str]) -> str | None:
    """A plain column reference (optionally qualified by the table or its alias)."""
    if type(node) is not exp.Column:
        return None
    if any(node.args.get(part) for part in ("db", "catalog")):
        return None
    qualifier = node.args.get("table")
    if qualifier is not None:
        text = _identifier(qualifier)
        if text is None or not text.isascii() or text.lower() not in qualifiers:
            return None
    return _identifier(node.args.get("this"))


def _projection(
    items: list[exp.Expression], qualifiers: set[str]
) -> tuple[tuple[str, str | None], ...] | bool | None:
    """The projected columns; None for a lone ``*``; False for anything else."""
    if len(items) == 1 and type(items[0]) is exp.Star and not any(items[0].args.values()):
        return None
    columns: list[tuple[str, str | None]] = []
    for item in items:
        alias = None
        if type(item) is exp.Alias:
            alias = _identifier(item.args.get("alias"))
            if alias is None:
                return False
            item = item.this
        column = _column(item, qualifiers)
        if column is None:
            return False
        columns.append((column, alias))
    return tuple(columns) if columns else False


def _equalities(
    node: exp.Expression, qualifiers: set[str]
) -> list[tuple[str, exp.Expression]] | None:
    """``a = v AND b = w ...`` as (column, value node) pairs, in text order."""
    if type(node) is exp.And:
        left = _equalities(node.this, qualifiers)
        right = _equalities(node.expression, qualifiers)
        return None if left is None or right is None else left + right
    if type(node) is not exp.EQ:
        return None
    for column_side, value_side in ((node.this, node.expression), (node.expression, node.this)):
        column = _column(column_side, qualifiers)
        if column is not None and _is_value(value_side):
            return [(column, value_side)]
    return None


def _is_value(node: exp.Expression) -> bool:
    if type(node) is exp.Placeholder:
        return True
    if type(node) is exp.Neg:
        node = node.this
        return type(node) is exp.Literal and not node.is_string
    return type(node) is exp.Literal


def _number_parameters(
    pairs: list[tuple[str, exp.Expression]],
) -> tuple[tuple[tuple[str, LookupValue], ...], int] | None:
    """Values with parameters numbered as DuckDB numbers them: ``$n`` as written, ``?``
    left to right; a text mixing both, or numbering parameters with gaps, has no shape
    (DuckDB's own answer or error is its business)."""
    numbered: list[tuple[str, LookupValue]] = []
    next_question = 1
    kinds = set()
    for column, node in pairs:
        if type(node) is exp.Placeholder:
            if node.this is None:
                kinds.add("?")
                numbered.append((column, LookupValue(parameter=next_question)))
                next_question += 1
                continue
            text = str(node.this)
            if not text.isdigit() or int(text) < 1:
                return None
            kinds.add("$")
            numbered.append((column, LookupValue(parameter=int(text))))
            continue
        literal = _literal(node)
        if literal is None:
            return None
        numbered.append((column, LookupValue(literal=literal)))
    if len(kinds) > 1:
        return None
    used = {value.parameter for _, value in numbered if value.parameter is not None}
    if used != set(range(1, len(used) + 1)):
        return None
    return tuple(numbered), len(used)


def _literal(node: exp.Expression) -> int | str | None:
    """An integer literal's int (digits only, optionally negated) or a string literal."""
    negative = type(node) is exp.Neg
    if negative:
        node = node.this
    assert type(node) is exp.Literal
    text = node.this
    if node.is_string:
        # No backslash: whether sqlglot reads it as DuckDB does is not worth proving.
        return None if negative or "\\" in str(text) else str(text)
    if not isinstance(text, str) or not text.isdigit() or text != str(int(text)):
        return None  # 1.5, 1e3, 0x10, 1_000, 007: not a plain integer
    return -int(text) if negative else int(text)
