"""How many columns DuckDB's binder makes for the stars of a statement.

A star (``*``, ``t.*``, ``* EXCLUDE (...)``, ``COLUMNS(...)``, and DuckDB's FROM-first
``FROM a, b``, which is ``SELECT *``) becomes one column for each column of the relations
it reads; a star over a join of a relation with itself doubles the columns. Nested, that is
2^n from a short text: ``SELECT *, * FROM (SELECT *, * FROM (...))``, ~19 characters a
level, or a chain of CTEs each ``FROM`` the one before twice (round 26: 16 levels, 317 and
470 characters, 4 s and more than 20 s of bind; 65,536 columns also overflowed the wire's
RowDescription, an internal error).

``star_columns`` counts, from sqlglot's tree, the columns every SELECT of the statement
makes, a relation of the catalog (a table, a view, a table function) counted as one column
whatever its width: the count grows with what the stars multiply, not with how wide the
tables are (a wide table read by one star is linear in what was created). An upper bound
otherwise: a qualified star ``t.*`` counts every relation of its FROM, ``COLUMNS(...)``
every column whatever it matches, UNION BY NAME both sides. A common table expression
read twice counts its columns at each read (DuckDB binds a star over it at each).

Pure; safe from any thread. Recursive over the nesting of queries (bounded by what sqlglot
could parse); memoised per node, so linear in the tree.
"""

from __future__ import annotations

from collections.abc import Callable

from sqlglot import expressions as exp

# Columns counted past this are as good as infinite (no big-number arithmetic on 2^n).
_SATURATED = 1 << 62


def star_columns(tree: exp.Expression, cte_of: Callable[[exp.Table], exp.CTE | None]) -> int:
    """The columns all SELECTs of ``tree`` make with their stars expanded (each SELECT
    counted once; 0 when there is no star: one walk of the tree, nothing else);
    ``cte_of`` says which common table expression a table name refers to."""
    selects: list[exp.Select] = []
    starred = False
    columns: set[str] = set()  # unqualified column names
    sources: set[str] = set()  # names and aliases of what FROMs read
    for node in tree.walk():
        if isinstance(node, exp.Select):
            selects.append(node)
        elif isinstance(node, exp.Star | exp.Columns):
            starred = True
        elif isinstance(node, exp.Column):
            if not node.table:
                columns.add(node.name.lower())
        elif isinstance(node, exp.Table | exp.Subquery):
            sources.add(node.alias_or_name.lower())
    if not starred and not columns & sources:
        return 0
    counter = _Counter(cte_of)
    total = 0
    for select in selects:
        total = min(total + counter.query(select), _SATURATED)
    return total


class _Counter:
    def __init__(self, cte_of: Callable[[exp.Table], exp.CTE | None]) -> None:
        self.cte_of = cte_of
        self.known: dict[int, int] = {}
        self.busy: set[int] = set()

    def query(self, node: exp.Expression) -> int:
        """Columns of a query node (a SELECT, a set operation, a parenthesised query)."""
        key = id(node)
        if key in self.known:
            return self.known[key]
        if key in self.busy:  # a recursive CTE read inside itself: its columns are its own
            return 1
        self.busy.add(key)
        try:
            if isinstance(node, exp.Select):
                count = self._select(node)
            elif isinstance(node, exp.SetOperation):
                left = self.query(node.this)
                count = left + self.query(node.expression) if node.args.get("by_name") else left
            elif isinstance(node, exp.Subquery):
                count = self.query(node.this)
            else:
                count = 1
        finally:
            self.busy.discard(key)
        count = min(count, _SATURATED)
        self.known[key] = count
        return count

    def _select(self, select: exp.Select) -> int:
        star = None
        named: dict[str, int] | None = None
        count = 0
        for item in select.expressions:
            if _is_star(item):
                if star is None:
                    star = self._from_columns(select)
                count += star
                continue
            count += 1
            for column in item.find_all(exp.Column):
                if column.table or isinstance(column.this, exp.Star):
                    continue
                if named is None:
                    named = self._named_sources(select)
                count += named.get(column.name.lower(), 0)  # a whole row: a struct of all
        return count

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

    def _from_columns(self, select: exp.Select) -> int:
        items = self._from_items(select)
        return sum(self._source(node) for node in items) if items else 1

    def _named_sources(self, select: exp.Select) -> dict[str, int]:
        """The columns of each FROM item by its name or alias: an unqualified column of
        that name may be the item's whole row (``SELECT t AS a, t AS b FROM (...) t``,
        a struct of every column; round 26: 20 levels, 633 characters, 5 s and 1.2 GiB)."""
        return {node.alias_or_name.lower(): self._source(node)
                for node in self._from_items(select)}  # fmt: skip

    def _source(self, node: exp.Expression) -> int:
        """Columns of one item of a FROM (without the joins sqlglot hangs under it)."""
        count = 1
        if isinstance(node, exp.Table):
            cte = self.cte_of(node) if isinstance(node.this, exp.Identifier) else None
            if cte is not None:
                count = self.query(cte.this)
        elif isinstance(node, exp.Subquery):
            count = self.query(node.this)
        elif isinstance(node, exp.Lateral):
            count = self._source(node.this)
        elif isinstance(node, exp.Values):
            first = node.expressions[0] if node.expressions else None
            count = len(first.expressions) if isinstance(first, exp.Tuple) else 1
        return count


def _is_star(item: exp.Expression) -> bool:
    """Whether a SELECT item expands to columns of the FROM: a star (``t.*`` too) or an
    expression with ``COLUMNS(...)`` in it."""
    inner = item.this if isinstance(item, exp.Alias) else item
    if isinstance(inner, exp.Star) or (isinstance(inner, exp.Column)
                                       and isinstance(inner.this, exp.Star)):  # fmt: skip
        return True
    return inner.find(exp.Columns) is not None
