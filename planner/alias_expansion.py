"""How many expression nodes DuckDB's binder would copy for a statement's alias references.

DuckDB lets a SELECT item name the alias of an earlier item of the same SELECT (``'x' AS
a, a || a AS b``), and so may its WHERE, GROUP BY, HAVING, QUALIFY, ORDER BY, WINDOW and
a subquery inside any of them; the binder replaces each such reference by a copy of the
aliased expression, already expanded. A chain of n items each naming the one before twice
is 2^n nodes from ~25 characters a level (review R2 F8, round 24). ``alias_copies``
counts, from sqlglot's tree alone, the nodes those copies add:

- an unqualified column whose name (case-folded) is the alias of an earlier item of a
  SELECT, anywhere inside that SELECT's later items or clauses (a scalar subquery's too:
  the walk of the enclosing SELECT reaches into it), costs the expanded size of that
  item; it is counted as a reference even where DuckDB would take a column of the FROM
  relation of that name instead (conservative: the count is never below DuckDB's);
- in the clauses after the SELECT list every alias of that SELECT counts;
- FROM, JOIN and WITH are not alias scopes of the SELECT (their own SELECTs are counted
  each as one).

Linear in the tree's size (each item's expanded size is computed once); iterative, so no
nesting depth recurses. Pure; safe from any thread.
"""

from __future__ import annotations

from sqlglot import expressions as exp

# Arguments of a SELECT that are not scopes of its aliases.
_NOT_ALIAS_SCOPES = frozenset({"expressions", "from", "joins", "with", "laterals", "into"})


def alias_copies(tree: exp.Expression) -> int:
    """The expression nodes that alias references in ``tree`` add to what is written."""
    copies = 0
    for select in tree.find_all(exp.Select):
        aliases: dict[str, int] = {}
        for item in select.expressions:
            inner = item.this if isinstance(item, exp.Alias) else item
            expanded, written = _sizes(inner, aliases)
            copies += expanded - written
            if isinstance(item, exp.Alias) and item.alias:
                aliases[item.alias.lower()] = expanded
        for key, value in select.args.items():
            if key in _NOT_ALIAS_SCOPES or value is None:
                continue
            for node in value if isinstance(value, list) else [value]:
                if isinstance(node, exp.Expression):
                    expanded, written = _sizes(node, aliases)
                    copies += expanded - written
    return copies


def _sizes(node: exp.Expression, aliases: dict[str, int]) -> tuple[int, int]:
    """``node``'s size in nodes with alias references expanded, and as written."""
    expanded = written = 0
    pending = [node]
    while pending:
        current = pending.pop()
        if (isinstance(current, exp.Column) and not current.table
                and current.name.lower() in aliases):  # fmt: skip
            expanded += max(aliases[current.name.lower()], 1)
            written += 1
            continue
        expanded += 1
        written += 1
        pending.extend(current.iter_expressions())
    return expanded, written
