"""How many columns, and how large their types, DuckDB's binder makes for a statement.

A star (``*``, ``t.*``, ``* EXCLUDE (...)``, ``COLUMNS(...)``, and DuckDB's FROM-first
``FROM a, b``, which is ``SELECT *``) becomes one column for each column of the relations
it reads; a star over a join of a relation with itself doubles the columns. Nested, that is
2^n from a short text: ``SELECT *, * FROM (SELECT *, * FROM (...))``, ~19 characters a
level, or a chain of CTEs each ``FROM`` the one before twice (round 26: 16 levels, 317 and
470 characters, 4 s and more than 20 s of bind; 65,536 columns also overflowed the wire's
RowDescription, an internal error). Types double the same way without any star: a FROM
item's whole row (``SELECT t AS a, t AS b FROM (...) t``, a struct of all its columns) or a
constructor naming one column twice (``{'a': x, 'b': x}``, ``row(x, x)``, ``map([x], [x])``,
``list_zip``): 18-20 levels, ~600 characters, 1.4-5 s and 0.3-1.2 GiB.

``star_columns`` counts, from sqlglot's tree, the type nodes of the columns every SELECT of
the statement makes: a column of a relation of the catalog (a table, a view, a table
function) counts as 1 whatever its width or type (so a wide table costs what was written to
create it); a star counts what its FROM items make; an item counts its type's size:
a column reference the size of the column it names (the whole row for the name of a FROM
item), a constructor (struct, row, map, union, ``list_zip`` …) 1 plus its arguments, any
other expression 1 plus its largest argument. An upper bound otherwise: a qualified star
``t.*`` counts every FROM item, ``COLUMNS(...)`` every column whatever it matches, UNION
BY NAME both sides, a column name found in several FROM items the largest. A common table
expression read twice counts its columns at each read (DuckDB binds a star over it at
each). Functions that build a type from their arguments' under other names are counted as
any other expression (an under-count: see the review's doubts).

Pure; safe from any thread. Recursive over the nesting of queries (bounded by what sqlglot
could parse); memoised per node, so linear in the tree.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from sqlglot import expressions as exp

from planner.front_work import find_all

# Counts past this are as good as infinite (no big-number arithmetic on 2^n).
_SATURATED = 1 << 62

# Functions whose result's type holds each argument's type (DuckDB 2.0).
_CONSTRUCTORS = frozenset({
    "row", "struct_pack", "struct_insert", "struct_concat", "union_value", "map",
    "map_from_entries", "map_concat", "list_zip", "array_zip",
})  # fmt: skip
_CONSTRUCTOR_NODES = exp.Struct | exp.Tuple | exp.Map | exp.VarMap | exp.ToMap
# Every class ``star_columns`` looks at (``exp.Func`` covers the constructors by call).
_STAR_WALK_NODES = (exp.Select, exp.Star, exp.Columns, exp.Column, exp.Table, exp.Subquery,
                    exp.Func, *_CONSTRUCTOR_NODES.__args__)  # fmt: skip


class Shape(NamedTuple):
    """What a query makes: the type nodes of all its columns, and the largest by name."""

    total: int
    columns: dict[str, int]


def star_columns(tree: exp.Expression, cte_of: Callable[[exp.Table], exp.CTE | None]) -> int:
    """The type nodes of the columns all SELECTs of ``tree`` make (each SELECT counted
    once; 0 when no star, no column named like a FROM item and no constructor occurs: one
    walk of the tree, nothing else); ``cte_of`` says which common table expression a table
    name refers to."""
    selects: list[exp.Select] = []
    starred = False
    columns: set[str] = set()  # unqualified column names
    sources: set[str] = set()  # names and aliases of what FROMs read
    # the nodes the loop reads, breadth-first as ``tree.walk()`` (round 29: from the
    # front's one index of a long text's tree, not a walk of its own)
    for node in find_all(tree, *_STAR_WALK_NODES):
        if isinstance(node, exp.Select):
            selects.append(node)
        elif isinstance(node, exp.Star | exp.Columns | _CONSTRUCTOR_NODES):
            starred = True
        elif isinstance(node, exp.Column):
            if not node.table:
                columns.add(node.name.lower())
        elif isinstance(node, exp.Table | exp.Subquery):
            sources.add(node.alias_or_name.lower())
        elif isinstance(node, exp.Func) and _is_constructor(node):
            starred = True
    if not starred and not columns & sources:
        return 0
    counter = _Counter(cte_of)
    total = 0
    for select in selects:
        total = min(total + counter.query(select).total, _SATURATED)
    return total


_ONE = Shape(1, {})


class _Counter:
    def __init__(self, cte_of: Callable[[exp.Table], exp.CTE | None]) -> None:
        self.cte_of = cte_of
        self.known: dict[int, Shape] = {}
        self.busy: set[int] = set()

    def query(self, node: exp.Expression) -> Shape:
        """What a query node makes (a SELECT, a set operation, a parenthesised query)."""
        key = id(node)
        if key in self.known:
            return self.known[key]
        if key in self.busy:  # a recursive CTE read inside itself: its columns are its own
            return _ONE
        self.busy.add(key)
        try:
            if isinstance(node, exp.Select):
                shape = self._select(node)
            elif isinstance(node, exp.SetOperation):
                left = self.query(node.this)
                shape = _both(left, self.query(node.expression)) if node.args.get("by_name") \
                    else left  # fmt: skip
            elif isinstance(node, exp.Subquery):
                shape = self.query(node.this)
            else:
                shape = _ONE
        finally:
            self.busy.discard(key)
        self.known[key] = shape
        return shape

    def _select(self, select: exp.Select) -> Shape:
        sources = [(node.alias_or_name.lower(), self._source(node))
                   for node in self._from_items(select)]  # fmt: skip
        scope: dict[str, int] = {}
        rows: dict[str, int] = {}  # a FROM item's whole row (a struct), by its name
        for name, shape in sources:
            for column, size in shape.columns.items():
                scope[column] = max(scope.get(column, 0), size)
            rows[name] = max(rows.get(name, 0), shape.total)
        star = sum(shape.total for _, shape in sources) if sources else 1
        total = 0
        columns: dict[str, int] = {}
        for item in select.expressions:
            if _is_star(item):
                total += star
                for column, size in scope.items():
                    columns[column] = max(columns.get(column, 0), size)
                continue
            size = _type_size(item.unalias(), scope, rows)
            total += size
            name = item.alias_or_name.lower()
            columns[name] = max(columns.get(name, 0), size)
        return Shape(min(total, _SATURATED), columns)

    def _from_items(self, select: exp.Select) -> list[exp.Expression]:
        """The items of ``select``'s FROM and joins (those sqlglot hangs under an item too)."""
        from_ = select.args.get("from") or select.args.get("from_")
        pending = [from_.this] if isinstance(from_, exp.From) else []
        pending.extend(join.this for join in select.args.get("joins") or ())
        items = []
        while pending:
            node = pending.pop()
            items.append(node)
            pending.extend(join.this for join in node.args.get("joins") or ())
        return items

    def _source(self, node: exp.Expression) -> Shape:
        """What one item of a FROM makes (without the joins sqlglot hangs under it)."""
        if isinstance(node, exp.Table):
            cte = self.cte_of(node) if isinstance(node.this, exp.Identifier) else None
            return self.query(cte.this) if cte is not None else _ONE
        if isinstance(node, exp.Subquery):
            return self.query(node.this)
        if isinstance(node, exp.Lateral):
            return self._source(node.this)
        if isinstance(node, exp.Values):
            first = node.expressions[0] if node.expressions else None
            return Shape(len(first.expressions) if isinstance(first, exp.Tuple) else 1, {})
        return _ONE


def _both(left: Shape, right: Shape) -> Shape:
    columns = dict(left.columns)
    for name, size in right.columns.items():
        columns[name] = max(columns.get(name, 0), size)
    return Shape(min(left.total + right.total, _SATURATED), columns)


def _type_size(node: exp.Expression, scope: dict[str, int], rows: dict[str, int]) -> int:
    """The type nodes of ``node``'s value (post-order with an explicit stack; a query
    inside it counts as one, its own SELECTs are counted as such)."""
    sizes: dict[int, int] = {}
    pending: list[tuple[exp.Expression, bool]] = [(node, False)]
    while pending:
        current, children_done = pending.pop()
        if isinstance(current, exp.Column):
            name = current.name.lower()
            size = scope.get(name, 1)
            if not current.table and name in rows:
                size = max(size, rows[name])
            sizes[id(current)] = size
            continue
        if isinstance(current, exp.Query | exp.Subquery):
            sizes[id(current)] = 1
            continue
        children = list(current.iter_expressions())
        if not children_done:
            pending.append((current, True))
            pending.extend((child, False) for child in children)
            continue
        inner = [sizes.pop(id(child)) for child in children]
        if isinstance(current, _CONSTRUCTOR_NODES) or _is_constructor(current):
            size = 1 + sum(inner)
        else:
            size = 1 + max(inner, default=0)
        sizes[id(current)] = min(size, _SATURATED)
    return sizes[id(node)]


def _is_constructor(node: exp.Expression) -> bool:
    if isinstance(node, exp.Anonymous):
        return str(node.name).lower() in _CONSTRUCTORS
    return isinstance(node, exp.Func) and node.sql_name().lower() in _CONSTRUCTORS


def _is_star(item: exp.Expression) -> bool:
    """Whether a SELECT item expands to columns of the FROM: a star (``t.*`` too) or an
    expression with ``COLUMNS(...)`` in it."""
    inner = item.this if isinstance(item, exp.Alias) else item
    if isinstance(inner, exp.Star) or (isinstance(inner, exp.Column)
                                       and isinstance(inner.this, exp.Star)):  # fmt: skip
        return True
    return inner.find(exp.Columns) is not None
