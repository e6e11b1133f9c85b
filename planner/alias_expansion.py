"""How many expression nodes DuckDB's binder copies for alias references and macro calls.

DuckDB's binder writes copies into a statement in two places, and both can double (or
more) at each level of a short text:

- **Aliases.** A SELECT item may name the alias of an earlier item of the same SELECT
  (``'x' AS a, a || a AS b``), and so may its WHERE, GROUP BY, HAVING, QUALIFY, ORDER BY,
  WINDOW and a subquery inside any of them; each reference becomes a copy of the aliased
  expression, already expanded. A chain of n items each naming the one before twice is
  2^n nodes from ~25 characters a level (review R2 F8, round 24).
- **Macros.** A call of a scalar macro becomes a copy of the macro's body with each use of
  a parameter replaced by a copy of the argument. DuckDB's own ``nullif(a, b)`` is
  ``CASE WHEN a = b THEN NULL ELSE a END`` (``a`` twice), ``map_to_pg_oid`` uses its
  parameter 19 times: ``nullif(nullif(nullif(..., 2), 2), 2)`` is 2^n nodes, ~11
  characters a level (round 25: 18 levels, 206 characters, 11 s of bind).

``alias_copies`` counts, from sqlglot's tree, the nodes alias references add, a macro's
argument counted as many times as the macro uses a parameter (``MacroCosts``);
``call_copies`` counts from DuckDB's own tokens the nodes macro calls add, so a text
sqlglot cannot read is counted too. Both are upper bounds of what DuckDB copies:

- an unqualified column whose name (case-folded) is the alias of an earlier item of a
  SELECT, anywhere inside that SELECT's later items or clauses (a scalar subquery's too:
  the walk of the enclosing SELECT reaches into it), costs the expanded size of that
  item; it is counted as a reference even where DuckDB would take a column of the FROM
  relation of that name instead (the count is never below DuckDB's);
- in the clauses after the SELECT list every alias of that SELECT counts;
- FROM, JOIN and WITH are not alias scopes of the SELECT (their own SELECTs are counted
  each as one);
- a macro call costs its body's size plus, for each argument, the argument's size times
  the largest number of uses of any one parameter (whichever parameter it binds);
- a use of a named window (``OVER w``, ``OVER (w ORDER BY ...)``) costs its definition's
  size (``WINDOW w AS (...)``), as DuckDB copies the definition into each use.

Linear in the tree's or the tokens' size; iterative, so no nesting depth recurses. Pure;
safe from any thread.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import NamedTuple, Protocol

from sqlglot import expressions as exp

from planner.front_work import find_all

# Arguments of a SELECT that are not scopes of its aliases.
# (sqlglot 30 names FROM and WITH ``from_`` and ``with_``; the older names kept.)
_NOT_ALIAS_SCOPES = frozenset(
    {"expressions", "from", "from_", "joins", "with", "with_", "laterals", "into"}
)


class MacroCost(NamedTuple):
    """What one call of a macro adds: ``body`` nodes of its own (its body's tokens, its
    own macro calls expanded) and each argument copied ``uses`` times (the most uses of
    any one parameter in the body, at least 1)."""

    body: int
    uses: int


MacroCosts = Mapping[str, MacroCost]  # by the macro's name in lower case


class Token(Protocol):
    """One of DuckDB's tokens (``engine.tables.SqlToken``): its kind and source text."""

    @property
    def kind(self) -> str: ...

    @property
    def text(self) -> str: ...


def alias_copies(tree: exp.Expression, macros: MacroCosts) -> int:
    """The expression nodes that alias references in ``tree`` add to what is written,
    an argument of a macro in ``macros`` counted as often as the macro copies it."""
    copies = 0
    for select in find_all(tree, exp.Select):
        aliases: dict[str, int] = {}
        for item in select.expressions:
            inner = item.this if isinstance(item, exp.Alias) else item
            expanded, written = _sizes(inner, aliases, macros)
            copies += expanded - written
            if isinstance(item, exp.Alias) and item.alias:
                aliases[item.alias.lower()] = expanded
        for key, value in select.args.items():
            if key in _NOT_ALIAS_SCOPES or value is None:
                continue
            for node in value if isinstance(value, list) else [value]:
                if isinstance(node, exp.Expression):
                    expanded, written = _sizes(node, aliases, macros)
                    copies += expanded - written
        copies += _window_copies(select)
    return copies


def _window_copies(select: exp.Select) -> int:
    """The nodes DuckDB copies for ``select``'s named windows: each ``OVER w`` or ``OVER
    (w ...)`` gets a copy of the definition of ``w`` (``WINDOW w AS (...)``, with the
    window it names in turn), so n uses of a definition of m nodes are n x m (round 26:
    300 uses of a 300-term PARTITION BY, 5.7 KB, took 7.5 s of bind). An upper bound:
    a use inside a nested SELECT is counted against this SELECT's definitions too."""
    definitions = select.args.get("windows") or ()
    if not definitions:
        return 0
    sizes: dict[str, int] = {}
    for window in definitions:
        size = sum(1 for _ in window.walk())
        named = window.args.get("alias")
        if isinstance(named, exp.Identifier):
            size += sizes.get(named.name.lower(), 0)
        sizes[window.name.lower()] = size
    copies = 0
    for window in select.find_all(exp.Window):
        named = window.args.get("alias")
        if isinstance(named, exp.Identifier) and window.args.get("over"):
            copies += sizes.get(named.name.lower(), 0)
    return copies


def _sizes(node: exp.Expression, aliases: dict[str, int], macros: MacroCosts
           ) -> tuple[int, int]:  # fmt: skip
    """``node``'s size in nodes with alias references and macro arguments expanded, and
    as written (post-order, with an explicit stack)."""
    sizes: dict[int, tuple[int, int]] = {}
    pending: list[tuple[exp.Expression, bool]] = [(node, False)]
    while pending:
        current, children_done = pending.pop()
        if (isinstance(current, exp.Column) and not current.table
                and current.name.lower() in aliases):  # fmt: skip
            sizes[id(current)] = (max(aliases[current.name.lower()], 1), 1)
            continue
        children = list(current.iter_expressions())
        if not children_done:
            pending.append((current, True))
            pending.extend((child, False) for child in children)
            continue
        cost = _macro_cost(current, macros)
        expanded = sum(sizes[id(child)][0] for child in children)
        written = sum(sizes.pop(id(child))[1] for child in children)
        sizes[id(current)] = (1 + cost.body + cost.uses * expanded, 1 + written)
    return sizes[id(node)]


_NOT_A_MACRO = MacroCost(0, 1)


def _macro_cost(node: exp.Expression, macros: MacroCosts) -> MacroCost:
    """What DuckDB's expansion of ``node`` costs if it calls a macro of ``macros`` (by
    every name sqlglot knows the function by), else nothing more than the node."""
    if not macros or not isinstance(node, exp.Func):
        return _NOT_A_MACRO
    if isinstance(node, exp.Anonymous):
        names: Iterable[str] = (str(node.name),)
    else:
        names = (node.sql_name(), *type(node)._sql_names)
    found = [macros[name.lower()] for name in names if name.lower() in macros]
    if not found:
        return _NOT_A_MACRO
    return MacroCost(max(cost.body for cost in found), max(cost.uses for cost in found))


def call_copies(tokens: list[Token], macros: MacroCosts) -> int:
    """The nodes DuckDB's expansion of the macro calls in ``tokens`` adds to the tokens as
    written: a call (a name right before ``(``) of a macro in ``macros`` costs its body
    plus its arguments times its uses; parentheses that are no such call add nothing.
    An upper bound by tokens (a token is at most a node)."""
    return _expanded(tokens, macros, _one, bodies=True) - len(tokens)


def _one(token: Token) -> int:
    return 1


def _expanded(tokens: list[Token], macros: MacroCosts, weight: Callable[[Token], int],
              bodies: bool) -> int:  # fmt: skip
    """The sum of ``weight`` over ``tokens`` once the macro calls among them are expanded:
    inside a call of a macro in ``macros`` the arguments' sum counts ``uses`` times, and
    with ``bodies`` the macro's body adds its own size."""
    # Each open parenthesis: the macro it calls (None: none) and the sum before it.
    frames: list[tuple[MacroCost | None, int]] = []
    total = 0
    for at, token in enumerate(tokens):
        if token.text == "(":
            name = tokens[at - 1] if at else None
            cost = None
            if name is not None and name.kind in ("identifier", "keyword"):
                cost = macros.get(token_name(name.text))
            frames.append((cost, total))
            total = weight(token)
        elif token.text == ")" and frames:
            cost, outer = frames.pop()
            inner = total + weight(token)
            if cost is not None:
                inner = (cost.body if bodies else 0) + cost.uses * inner
            total = outer + inner
        else:
            total += weight(token)
    while frames:  # unbalanced: DuckDB refuses the text; counted all the same
        _, outer = frames.pop()
        total += outer
    return total


def token_name(text: str) -> str:
    """What an identifier token names, as DuckDB compares names and looks functions up:
    ASCII case-insensitive, a quoted identifier's quotes off (``""`` inside is one ``"``)."""
    if text[:1] == '"' and text[-1:] == '"':
        text = text[1:-1].replace('""', '"')
    return text.lower()


def macro_cost(body_tokens: list[Token], parameters: Iterable[str], macros: MacroCosts
               ) -> MacroCost:  # fmt: skip
    """A macro's ``MacroCost`` from its body's tokens and its parameters' names: the body's
    tokens with the macros it calls (in ``macros``) expanded, and the most copies of one
    parameter once those calls are expanded (``m(x) AS nullif(x, 1)`` copies ``x`` twice)."""
    body = _expanded(body_tokens, macros, _one, bodies=True)
    uses = 1
    for parameter in parameters:
        wanted = token_name(parameter)

        def weight(token: Token, wanted: str = wanted) -> int:
            return int(token.kind in ("identifier", "keyword") and token_name(token.text) == wanted)

        uses = max(uses, _expanded(body_tokens, macros, weight, bodies=False))
    return MacroCost(body, uses)
