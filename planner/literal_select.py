"""A SELECT of literals and parameters alone: ``SELECT 1``, ``SELECT $1, 'ok' AS status``.

Such a statement reads nothing of the database and nothing of the session: no table, no
view, no function, no operator, no type of the user's, no setting. Operators count as
functions: DuckDB looks ``+`` and a unary ``-`` up in the catalog like any function, and
a user's ``CREATE MACRO "+"(a, b)`` shadows the built-in one (checked: ``SELECT 1 + 1``
then gives the macro's value; ``-$1`` the unary macro's). A minus sign directly before a
number is not an operator: DuckDB's parser folds it into the constant (``SELECT -1`` is
-1 under such a macro too).

``is_literal_select`` judges sqlglot's tree; the engine also checks DuckDB's own tokens of
the text (``engine.tables.literal_tokens``) before it relies on it, so a text the two
parsers read differently is not taken for one.
"""

from __future__ import annotations

from sqlglot import expressions as exp


def is_literal_select(tree: exp.Expression) -> bool:
    """True iff ``tree`` is a SELECT whose only clause is its list of expressions, each a
    literal (number, string, TRUE/FALSE, NULL), a parameter or a negated number, with or
    without an alias."""
    if type(tree) is not exp.Select or not tree.expressions:
        return False
    if any(value for key, value in tree.args.items() if key != "expressions"):
        return False
    return all(_literal_item(item) for item in tree.expressions)


def _literal_item(item: exp.Expression) -> bool:
    if type(item) is exp.Alias:
        alias = item.args.get("alias")
        if type(alias) is not exp.Identifier or set(item.args) - {"this", "alias"}:
            return False
        item = item.this
    return _literal(item)


def _literal(node: exp.Expression) -> bool:
    kind = type(node)
    if kind is exp.Neg:
        inner = node.this
        return type(inner) is exp.Literal and not inner.is_string
    return kind in (exp.Literal, exp.Boolean, exp.Null, exp.Placeholder)
