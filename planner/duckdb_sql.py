"""Reading DuckDB SQL with sqlglot, for the planner's analyses and rewrites.

Pure functions, no I/O; safe from any thread.
"""

from __future__ import annotations

import sqlglot
from sqlglot import expressions as exp

from grammar.split import SourceText, tokenize
from planner.front_work import checked_parse, shared_parse
from planner.literal_rows import insert_tree
from planner.operations import UpsertShape

_DUCKDB = sqlglot.Dialect.get_or_raise("duckdb")


def parse_duckdb(sql: str) -> exp.Expression | None:
    """sqlglot's tree of one DuckDB statement; raises ``sqlglot.errors.ParseError``.

    sqlglot's tokenizer reads ``$1,$2`` as the start of a ``$tag$`` dollar quote and
    fails; PostgreSQL clients send parameters like that. Such a statement is parsed
    again with a space after every ``$n`` that stands outside strings, identifiers and
    comments, which changes no meaning.

    In a statement's front (``planner.front_work.statement_front``) the text is parsed once
    and every caller gets the same tree: a caller that changes it copies it first.
    """
    return shared_parse(sql, _parse_spaced)  # type: ignore[no-any-return]


def _parse_spaced(sql: str) -> exp.Expression | None:
    # an INSERT of literal rows: the same tree, without sqlglot's parse of its rows
    built = insert_tree(sql, _parse_one)
    if built is not None:
        return built
    try:
        return _parse_one(sql)
    except sqlglot.errors.TokenError:
        spaced = _space_after_parameters(sql)
        if spaced == sql:
            raise sqlglot.errors.ParseError(f"cannot tokenize {sql!r}") from None
        try:
            return _parse_one(spaced)
        except sqlglot.errors.TokenError as error:
            raise sqlglot.errors.ParseError(str(error)) from None


def _only_statement(trees: list[exp.Expression | None]) -> exp.Expression:
    """``sqlglot.parse_one``'s answer from ``Dialect.parse``'s, as it makes it."""
    if not trees or trees[0] is None:
        raise sqlglot.errors.ParseError("No expression was parsed")
    return exp.Block(expressions=trees) if len(trees) > 1 else trees[0]


def _parse_one(sql: str) -> exp.Expression | None:
    """sqlglot's parse; its own slips on odd input (an ``IndexError`` on a bare ``SHOW``)
    become a ``ParseError``, so callers treat them as statements sqlglot does not know."""
    try:
        return _only_statement(checked_parse(sql, _DUCKDB))
    except (IndexError, KeyError, AttributeError, TypeError, ValueError) as error:
        if isinstance(error, sqlglot.errors.SqlglotError):
            raise
        raise sqlglot.errors.ParseError(f"sqlglot cannot parse {sql[:80]!r}: {error!r}") from None


def _space_after_parameters(sql: str) -> str:
    pieces: list[str] = []
    copied = 0
    for token in tokenize(SourceText(sql), 0, len(sql)):
        if token.kind == "param" and sql[token.end : token.end + 1] not in ("", " "):
            pieces.append(sql[copied : token.end])
            pieces.append(" ")
            copied = token.end
    pieces.append(sql[copied:])
    return "".join(pieces)


# -- the counter upsert's shortcut ---------------------------------------------------------
# ``INSERT INTO t VALUES (?, ?) ON CONFLICT (k) DO UPDATE SET n = n + EXCLUDED.n``: DuckDB
# plans every ``ON CONFLICT`` as a MERGE with hash tables (~1.1 ms), where the UPDATE of
# the one row it hits costs ~0.4 ms. ``upsert_shape`` recognises the statements for which
# ``UPDATE t SET n = n + CAST(v AS type) WHERE k = CAST(key AS type)`` followed, when it
# changed no row, by the statement itself (in the same DuckDB transaction) has the same
# effect and the same errors; ``counter_update`` writes that UPDATE once the table's
# columns are known (the engine checks the table: ``engine.tables.upsert_columns``).
# Arithmetic only in SET: every EXCLUDED value is evaluated (and so cast, with the
# statement's own conversion errors) whenever the UPDATE changes a row.
_SET_NODES = (exp.Column, exp.Identifier, exp.Literal, exp.Add, exp.Sub, exp.Mul, exp.Paren,
              exp.Neg)  # fmt: skip
EXCLUDED = "excluded"


def upsert_shape(tree: exp.Expression) -> UpsertShape | None:
    """The shape of ``tree`` if it is a counter-style upsert the shortcut may run, else
    None (any other statement, or an upsert with RETURNING, DO UPDATE … WHERE, several
    rows, a qualified or aliased table, subqueries or functions in SET …)."""
    if not isinstance(tree, exp.Insert) or tree.args.get("returning") or tree.args.get("with"):
        return None
    conflict = tree.args.get("conflict")
    if not isinstance(conflict, exp.OnConflict) or conflict.args.get("where"):
        return None
    action = conflict.args.get("action")
    keys = conflict.args.get("conflict_keys") or []
    if action is None or action.name.upper() != "DO UPDATE" or not keys:
        return None
    target, columns = tree.this, None
    if isinstance(target, exp.Schema):
        columns = tuple(_plain_name(c) for c in target.expressions)
        target = target.this
    if not isinstance(target, exp.Table) or any(
        target.args.get(k) for k in ("db", "catalog", "alias")
    ):
        return None
    values = _one_row(tree.expression)
    conflict_columns = tuple(_plain_name(k.this if isinstance(k, exp.Ordered) else k)
                             for k in keys)  # fmt: skip
    assignments = tuple(_assignment(e) for e in conflict.expressions)
    names = [*conflict_columns, *(a[0] for a in assignments if a is not None)]
    if (values is None or None in names or None in assignments
            or (columns is not None and (None in columns or len(columns) != len(values)))
            or set(conflict_columns) & {a[0] for a in assignments if a is not None}):  # fmt: skip
        return None
    return UpsertShape(
        target.name.lower(), columns, values, conflict_columns, assignments  # type: ignore[arg-type]
    )


def _plain_name(node: exp.Expression) -> str | None:
    if isinstance(node, exp.Identifier):
        return node.name.lower()
    if isinstance(node, exp.Column) and not node.table:
        return node.name.lower()
    return None


def _one_row(values: exp.Expression | None) -> tuple[str, ...] | None:
    """The row of a one-row VALUES as ``$n`` and literal texts (``?`` numbered in order)."""
    if not isinstance(values, exp.Values) or len(values.expressions) != 1:
        return None
    row = values.expressions[0]
    items = row.expressions if isinstance(row, exp.Tuple) else [row]
    texts: list[str] = []
    qmarks = 0
    for item in items:
        if isinstance(item, exp.Placeholder):
            if item.this is None:
                qmarks += 1
                texts.append(f"${qmarks}")
            elif str(item.this).isdigit():
                texts.append(f"${item.this}")
            else:
                return None  # a named parameter
        elif isinstance(item, exp.Literal | exp.Boolean) or (
            isinstance(item, exp.Neg) and isinstance(item.this, exp.Literal)
        ):
            texts.append(item.sql(dialect="duckdb"))
        else:
            return None  # NULL, an expression, a subquery, DEFAULT …
    if qmarks and len(texts) != qmarks:
        return None  # ``?`` beside ``$n`` (DuckDB refuses the mix itself)
    return tuple(texts)


def _assignment(node: exp.Expression) -> tuple[str, str] | None:
    if not isinstance(node, exp.EQ):
        return None
    column = _plain_name(node.this)
    value = node.expression
    if column is None or any(not isinstance(n, _SET_NODES) for n in value.walk()):
        return None
    return column, value.sql(dialect="duckdb")


def counter_update(
    shape: UpsertShape, columns: tuple[tuple[str, str], ...]
) -> tuple[str, tuple[int, ...]] | None:
    """The UPDATE that stands for ``shape`` on a table of ``columns`` ((name, DuckDB type)
    in order, lower case), and the statement's parameter (0-based) for each of its ``$n``;
    None when the shortcut does not fit: the INSERT must give every column, and every
    value that is not a key must be read by SET (so its cast runs whenever a row changes).
    """
    names = tuple(name for name, _ in columns)
    given = shape.columns if shape.columns is not None else names
    if len(given) != len(shape.values) or sorted(given) != sorted(names):
        return None
    types = dict(columns)
    values = dict(zip(given, shape.values, strict=True))
    numbers: list[int] = []

    def cast(column: str) -> exp.Expression:
        value = values[column]
        if value.startswith("$"):
            numbers.append(int(value[1:]) - 1)
            value = f"${len(numbers)}"
        return exp.cast(sqlglot.parse_one(value, read="duckdb"), types[column], dialect="duckdb")

    excluded_read: set[str] = set()

    def replace(node: exp.Expression) -> exp.Expression:
        if isinstance(node, exp.Column) and node.table.lower() == EXCLUDED:
            name = node.name.lower()
            if name not in types:
                raise KeyError(name)
            excluded_read.add(name)
            return cast(name)
        if isinstance(node, exp.Column) and node.table and node.table.lower() != shape.table:
            raise KeyError(node.table)
        return node

    try:
        sets = [
            exp.EQ(this=exp.column(column),
                   expression=sqlglot.parse_one(text, read="duckdb").transform(replace))
            for column, text in shape.assignments
        ]  # fmt: skip
        where = [exp.EQ(this=exp.column(k), expression=cast(k)) for k in shape.conflict]
    except KeyError:
        return None  # EXCLUDED of a column the table lacks, or another table's column
    if set(shape.conflict) | excluded_read != set(names) or any(
        a not in types for a, _ in shape.assignments
    ):
        return None
    update = exp.Update(
        this=exp.to_table(shape.table), expressions=sets, where=exp.Where(this=exp.and_(*where))
    )
    return update.sql(dialect="duckdb"), tuple(numbers)
