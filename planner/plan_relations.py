"""How many relations DuckDB's join-order optimizer may be handed for one statement.

DuckDB plans a query block's FROM items and joins, the derived tables among them (their
own FROM items flattened in) and the subqueries of its expressions (decorrelated into
joins) as one join graph, and the optimizer's time grows about as n^3 to n^4 in that
graph's relations; its planning does not stop for an interrupt, so ``statement_timeout``
cannot end it. Measured (round 26, DuckDB 2.0.1, embedded ``PREPARE``, thread CPU): a
chain of equi-joins of one table, 64 relations 0.17 s, 96 0.94 s, 200 ~26 s, 300 288 s
(9 KB of text); 300 correlated scalar subqueries 4.8 s; 300 ``EXISTS`` 18.6 s; 400 calls of
the built-in macro ``pg_get_viewdef`` (a subquery each) 82 s. Set operations are not
joined: a ``UNION ALL`` of 900 SELECTs plans in 0.02 s.

Two counts, both upper bounds of the largest join graph:

- ``relation_bound`` reads DuckDB's tokens: every ``SELECT`` and ``JOIN`` keyword, every
  FROM item (the ``FROM`` keyword and each comma directly in its list), and for each call
  of a macro in ``macro_relations`` its body's relations. Linear, no parse: most
  statements end here. It is a bound unless a CTE is ``NOT MATERIALIZED``
  (``inlines_ctes``): those are counted on the tree.
- ``largest_join`` reads sqlglot's tree when the bound is over the limit: per query block
  its FROM items and joins (a derived table, a lateral or a CTE DuckDB inlines counted by
  its own query's graph, a table, a table function, VALUES or UNNEST as one), plus the
  graphs of the subqueries in its expressions and the relations of its macro calls; a set
  operation counts as its larger side. A CTE is inlined at each reference when it is
  ``NOT MATERIALIZED`` or referenced once; otherwise DuckDB materializes it (one scan a
  reference; its own query is a graph of its own). So a chain of ``NOT MATERIALIZED``
  CTEs each reading the one before twice counts 2^n.

Views count as one relation in both; ``largest_join_with_views`` counts a view's read as
the relations its query joins (``engine.privileges`` knows which names are views). Pure;
safe from any thread.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple, Protocol

from sqlglot import expressions as exp

from planner.front_work import find_all


class MacroRelations(NamedTuple):
    """Relations a call of a macro adds to the graph it stands in, by name in lower case:
    scalar macros (called in expressions) and table macros (FROM items), apart because a
    name may be both (DuckDB's table macro ``histogram`` calls the aggregate
    ``histogram``)."""

    scalar: Mapping[str, int]
    table: Mapping[str, int]



NO_MACROS = MacroRelations({}, {})

# Keywords that end a FROM list at its own depth.
_FROM_ENDS = frozenset({
    "where", "group", "having", "qualify", "window", "order", "limit", "offset", "union",
    "except", "intersect", "returning", "select", "using", "set", "values", "on",
})  # fmt: skip
# A block's arguments that hold its FROM items (and its CTEs, graphs of their own).
_BLOCK_SOURCES = frozenset({"from_", "from", "using", "joins", "laterals", "with_", "with"})
# FROM-list items that are one relation each.
_LEAVES = (exp.Values, exp.Unnest)


class Token(Protocol):
    """A DuckDB token (``engine.tables.SqlToken``): its kind and its source text."""

    @property
    def kind(self) -> str: ...

    @property
    def text(self) -> str: ...


def inlines_ctes(tokens: Sequence[Token]) -> bool:
    """Whether ``tokens`` say ``NOT MATERIALIZED``: a CTE DuckDB puts in place of each of
    its references, which only ``largest_join`` counts at each."""
    return any(
        token.text.lower() == "materialized" and at and tokens[at - 1].text.lower() == "not"
        for at, token in enumerate(tokens)
    )


def relation_bound(tokens: Sequence[Token], macro_relations: MacroRelations) -> int:
    """An upper bound of the relations of ``tokens``' largest join graph (see the module),
    unless ``inlines_ctes(tokens)``: a CTE put in place of each of its references counts
    once here. A call right after ``FROM``, ``JOIN``, ``LATERAL`` or a comma of a FROM
    list is a table macro's, any other a scalar macro's."""
    count = 0
    depth = 0
    from_depths: list[int] = []  # depths at which a FROM list is open
    table_position = False  # the previous token begins a FROM item
    for at, token in enumerate(tokens):
        text = token.text
        item_starts = table_position
        table_position = False
        if text == "." or (at + 1 < len(tokens) and tokens[at + 1].text == "."):
            table_position = item_starts  # a qualified name: its last part is the call
            continue
        if text == "(":
            depth += 1
            continue
        if text == ")":
            depth -= 1
            while from_depths and from_depths[-1] > depth:
                from_depths.pop()
            continue
        if text == "," and from_depths and from_depths[-1] == depth:
            count += 1  # a comma join
            table_position = True
            continue
        if token.kind not in ("keyword", "identifier"):
            continue
        word = text.lower()
        if token.kind == "keyword" and word in ("select", "join"):
            count += 1
        if token.kind == "keyword" and word == "from":
            count += 1
            from_depths.append(depth)
        elif token.kind == "keyword" and word in _FROM_ENDS and word not in ("on", "using"):
            # (``ON`` and ``USING`` end a list's item, not the list: comma joins may follow.)
            while from_depths and from_depths[-1] >= depth:
                from_depths.pop()
        if token.kind == "keyword" and word in ("from", "join", "lateral"):
            table_position = True
        elif at + 1 < len(tokens) and tokens[at + 1].text == "(":
            relations = macro_relations.table if item_starts else macro_relations.scalar
            count += relations.get(_unquoted(word), 0)
    return count


def largest_join(tree: exp.Expression, macro_relations: MacroRelations) -> int:
    """The relations of the largest join graph DuckDB may plan for ``tree`` (see the
    module). Recursion follows the statement's nesting (RecursionError past Python's
    limit: the caller refuses the statement as too deeply nested)."""
    return _Graphs(tree, macro_relations).statement(tree)


def _unquoted(word: str) -> str:
    if word[:1] == '"' and word[-1:] == '"':
        return word[1:-1].replace('""', '"')
    return word


class _Graphs:
    """Join-graph sizes of one tree's query blocks, memoised by node."""

    def __init__(self, tree: exp.Expression, macro_relations: MacroRelations) -> None:
        self.macros = macro_relations
        self.sizes: dict[int, int] = {}
        self.ctes: dict[str, exp.CTE] = {}
        references: dict[str, int] = {}
        for cte in find_all(tree, exp.CTE):
            if cte.alias:
                self.ctes.setdefault(cte.alias.lower(), cte)
        for table in find_all(tree, exp.Table):
            if not table.args.get("db") and table.name.lower() in self.ctes:
                references[table.name.lower()] = references.get(table.name.lower(), 0) + 1
        # A CTE DuckDB puts in place of each reference (its relations join there).
        self.inlined = {
            name for name, cte in self.ctes.items()
            if cte.args.get("materialized") is False or references.get(name, 0) <= 1
        }  # fmt: skip
        self.expanding: set[str] = set()  # CTEs being sized (a recursive CTE reads itself)

    def statement(self, tree: exp.Expression) -> int:
        """The largest graph anywhere in ``tree``: its blocks' and its CTEs' own."""
        # A statement that is no query (UPDATE … FROM, DELETE … USING, MERGE … USING,
        # INSERT … SELECT) joins its own FROM or USING items as a block does.
        largest = self.query(tree) if isinstance(tree, exp.Query) else self.block(tree)
        for node in find_all(tree, exp.Select, exp.SetOperation):
            largest = max(largest, self.query(node))
        return largest

    def query(self, node: exp.Expression) -> int:
        """The graph of a query: a block's, or the larger side of a set operation."""
        key = id(node)
        if key not in self.sizes:
            if isinstance(node, exp.SetOperation):
                size = max(self.query(node.left), self.query(node.expression))
            elif isinstance(node, exp.Select):
                size = self.block(node)
            elif isinstance(node, exp.Subquery):
                size = self.query(node.this)
            else:
                size = self.loose(node)
            self.sizes[key] = size
        return self.sizes[key]

    def block(self, select: exp.Expression) -> int:
        """One SELECT's graph (or an UPDATE's, DELETE's, MERGE's): its FROM or USING items
        and joins, its expressions' subqueries and macro calls (not its own CTEs' queries:
        those are graphs of their own)."""
        size = 0
        items: list[exp.Expression] = []
        for key in ("from_", "from", "using"):
            source = select.args.get(key)
            if isinstance(source, exp.From):
                items.extend(source.expressions or [source.this])
            elif isinstance(source, list):
                items.extend(source)
            elif isinstance(source, exp.Expression):
                items.append(source)
        items.extend(join.this for join in select.args.get("joins") or ())
        items.extend(select.args.get("laterals") or ())
        for item in items:
            size += self.item(item)
        for key, value in select.args.items():
            if key in _BLOCK_SOURCES or value is None:
                continue
            for node in value if isinstance(value, list) else [value]:
                if isinstance(node, exp.Expression):
                    size += self.loose(node)
        return size

    def item(self, item: exp.Expression) -> int:
        """A FROM item's relations, with the joins sqlglot hangs on it (``FROM u, w`` of an
        UPDATE, a parenthesised join)."""
        joined = sum(self.item(join.this) for join in item.args.get("joins") or ())
        return self.single(item) + joined

    def single(self, item: exp.Expression) -> int:
        if isinstance(item, exp.Table):
            name = item.name.lower()
            if not item.args.get("db") and name in self.inlined and name not in self.expanding:
                self.expanding.add(name)
                try:
                    return max(1, self.query(self.ctes[name].this))
                finally:
                    self.expanding.discard(name)
            function = item.this
            if isinstance(function, exp.Func):  # a table function or table macro, its arguments
                own = self.macros.table.get(_function_name(function), 0)
                return max(1, own) + sum(self.loose(argument)
                                         for argument in function.iter_expressions())
            return 1
        if isinstance(item, (exp.Subquery, exp.Lateral)):
            inner = item.this
            if isinstance(inner, exp.Subquery):
                # Parentheses around parentheses (``((t JOIN u) JOIN w)``, DuckDB's own
                # text of every view of joins): the inner ones hold joins of their own,
                # which a sqlglot Subquery (a Query) read as a query would not count.
                return self.item(inner)
            if isinstance(inner, exp.Query):
                return max(1, self.query(inner))
            return self.item(inner)  # a parenthesised join: its tables and their joins
        if isinstance(item, _LEAVES):
            return 1
        return 1 + self.loose(item)

    def loose(self, node: exp.Expression) -> int:
        """Relations an expression adds to the block it stands in: its subqueries' graphs
        and its macro calls' bodies (not descending into a subquery twice)."""
        size = 0
        stack = [node]
        while stack:
            current = stack.pop()
            if isinstance(current, exp.Query) and current is not node:
                size += self.query(current)
                continue
            if isinstance(current, exp.Func):
                size += self.macros.scalar.get(_function_name(current), 0)
            stack.extend(current.iter_expressions())
        return size


def _function_name(node: exp.Func) -> str:
    if isinstance(node, exp.Anonymous):
        return str(node.this).lower()
    return node.sql_name().lower()


# -- views: the relations their queries join (round 27) ------------------------------------
def largest_join_with_views(tree: exp.Expression, macro_relations: MacroRelations,
                            view_relations: Callable[[exp.Table], int]) -> int:  # fmt: skip
    """``largest_join`` with each read of a view counted as the relations its query joins
    (``view_relations(table)``: that count for a view, 1 for any other relation): DuckDB's
    binder puts a view's query in place of each read and flattens it into the join graph
    it stands in, so views of 60 relations each, 4 of them joined, are 240 relations to
    the optimizer (round 27: 3.9 s; 8 of them 32 s of CPU), though the statement names 4.
    Common table expressions and table functions are counted as ``largest_join`` counts
    them. Linear in the tree; the caller caches each view's count."""
    return _ViewGraphs(tree, macro_relations, view_relations).statement(tree)


class _ViewGraphs(_Graphs):
    """``_Graphs`` reading each named relation's count from ``view_relations``."""

    def __init__(self, tree: exp.Expression, macro_relations: MacroRelations,
                 view_relations: Callable[[exp.Table], int]) -> None:  # fmt: skip
        super().__init__(tree, macro_relations)
        self.view_relations = view_relations

    def single(self, item: exp.Expression) -> int:
        size = super().single(item)
        if (isinstance(item, exp.Table) and isinstance(item.this, exp.Identifier)
                and (item.args.get("db") or item.name.lower() not in self.ctes)):  # fmt: skip
            return max(size, self.view_relations(item))
        return size
