"""sqlglot's tree of ``INSERT ... VALUES (literal, ...), ...`` (or of a bare ``VALUES ...``,
as the planner writes for a topic named plainly) built without sqlglot's parse of the rows
(round 29, H4).

sqlglot's tokenizer and parser cost ~4-6 us a byte of such a statement (a 1 MiB INSERT:
~2.7 s of a core, holding the interpreter lock); every check of the statement (the
sandbox, the privileges, the planner) reads the tree ``planner.duckdb_sql.parse_duckdb``
gives. ``insert_tree`` gives **the same tree** for the rows it recognises — equal node for
node: classes, arguments, each node's parent, key and index, and the positions (``meta``)
sqlglot's parser notes — so every check applies to it exactly as to the parsed tree.
Anything it does not recognise answers None and the text is parsed by sqlglot as ever.

How: the text is cut into a *head* (``INSERT ... VALUES``), the rows, and a *tail* (what
follows the last row: ``RETURNING``, ``ON CONFLICT``, ``;``, comments...). sqlglot parses
the *skeleton* — head, the first row, tail — which must give an ``Insert`` whose
``expression`` is a ``Values`` of that one row, equal to this module's own build of the
first row (a check of the scanner on every use); then the ``Values`` node gets every row.
(A bare ``VALUES`` statement: the skeleton must parse to that ``Values`` itself.)
The head and tail are thus sqlglot's to read (quoted names, a column list, ``OR REPLACE``,
``BY NAME``, a ``RETURNING`` list); only the rows are scanned here.

A row is ``( v, v, ... )`` and rows are separated by ``,``; between tokens only spaces,
tabs and newlines. A value is one of (anything else — an expression, a cast, a
comment, a string with a backslash or of another kind (``E''``, ``X''``, ``$$``, ``U&''``),
a number of another form (``.5``, ``1_000``, ``0x10``, ``+1``) — and the whole statement
goes to sqlglot):

- a string ``'...'`` whose quotes inside are doubled (``''``) and with no backslash;
- a number ``123``, ``1.5``, ``1e10``, ``1.5E-3``, optionally preceded by ``-`` (no space
  between: ``--`` starts a comment);
- ``NULL``, ``TRUE``, ``FALSE`` in any case.

A carriage return anywhere in the text, or a text with fewer than two rows, goes to
sqlglot (positions are counted by newlines only).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from sqlglot import expressions as exp

from planner.front_work import tick

# Texts shorter than this are parsed by sqlglot: under ~5 ms, the skeleton parse would
# cost about what it saves.
LITERAL_ROWS_CHARS_MIN = 1024

# The head: INSERT ... VALUES with no quote, comment, parameter or escape of any kind
# (a quoted identifier could hide a "VALUES"). Matched case-insensitively.
_HEAD = re.compile(r"\s*(?:INSERT\s[^'\"$`\-/;\\]*?\b)?VALUES\b", re.IGNORECASE)

# One value and the gap after it; group 1 the string's inner text, group 2 a number
# (with its sign), group 3 a keyword. The look-ahead keeps "1e" or "NULLX" from being
# read as a value followed by something.
_VALUE = re.compile(
    r"'((?:[^'\\]|'')*)'(?!')"
    r"|(-?[0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?)(?![\w.'\"$])"
    r"|(NULL|TRUE|FALSE)(?![\w.'\"$])",
    # ASCII: a Unicode digit (U+0663) or a letter that folds to an ASCII one (U+017F,
    # "FAL\u017fE") is a name to sqlglot, never a number or a keyword (a value here)
    re.IGNORECASE | re.ASCII,
)
_GAP = re.compile(r"[ \t\n]*")
# Rows between two checks of ``front_work.tick`` (one unit a row).
_TICK_ROWS = 256


def insert_tree(sql: str, parse: Callable[[str], Any]) -> exp.Expression | None:
    """``parse(sql)``'s tree (sqlglot's ``parse_one`` in DuckDB's dialect) for an INSERT of
    literal rows (module doc), built from the rows and ``parse`` of a one-row skeleton;
    None when ``sql`` is not such a statement (then nothing was parsed, or only the
    skeleton). ``parse``'s errors on the skeleton are caught: None."""
    if len(sql) < LITERAL_ROWS_CHARS_MIN or "\r" in sql:
        return None
    head = _HEAD.match(sql)
    if head is None:
        return None
    scanned = _scan_rows(sql, head.end())
    if scanned is None:
        return None
    rows, first_row_end, rows_end = scanned
    if len(rows) < 2:
        return None
    skeleton = sql[:first_row_end] + sql[rows_end:]
    try:
        tree = parse(skeleton)
    except Exception:  # sqlglot's to report: the whole text goes to it
        return None
    values = tree.args.get("expression") if isinstance(tree, exp.Insert) else tree
    if type(values) is not exp.Values or values.args.get("alias") is not None:
        return None
    parsed_rows = values.expressions
    if len(parsed_rows) != 1 or not same_tree(parsed_rows[0], rows[0]):
        return None
    # The tail's nodes carry positions in the skeleton: shifted to the text's.
    shift = rows_end - first_row_end
    if shift:
        _shift_tail(tree, values, first_row_end, shift, sql)
    values.set("expressions", rows)
    return tree


def _scan_rows(sql: str, position: int) -> tuple[list[exp.Tuple], int, int] | None:
    """The rows from ``position`` (just after VALUES): their tuples, the end of the first
    row and of the last; None at anything that is not a row of literals."""
    rows: list[exp.Tuple] = []
    first_row_end = -1
    gap = _GAP.match
    value = _VALUE.match
    line = 1 + sql.count("\n", 0, position)
    line_start = sql.rfind("\n", 0, position) + 1  # index of the current line's start
    counted = position  # newlines before ``counted`` are in ``line``
    length = len(sql)
    position = gap(sql, position).end()  # type: ignore[union-attr]
    while True:
        if position >= length or sql[position] != "(":
            return None
        position = gap(sql, position + 1).end()  # type: ignore[union-attr]
        items: list[exp.Expression] = []
        while True:
            match = value(sql, position)
            if match is None:
                return None
            end = match.end()
            newlines = sql.count("\n", counted, end)
            if newlines:
                line += newlines
                line_start = sql.rfind("\n", counted, end) + 1
            counted = end
            # sqlglot's positions: start and end (inclusive) of the token, its line and
            # the column of its last character (1-based) on that line
            text = match.group(1)
            if text is not None:
                node: exp.Expression = exp.Literal(this=text.replace("''", "'"), is_string=True)
                node._meta = {"line": line, "col": end - line_start, "start": match.start(),
                              "end": end - 1}  # fmt: skip
            else:
                number = match.group(2)
                if number is not None:
                    if number[0] == "-":
                        literal = exp.Literal(this=number[1:], is_string=False)
                        literal._meta = {"line": line, "col": end - line_start,
                                         "start": match.start() + 1, "end": end - 1}  # fmt: skip
                        node = exp.Neg(this=literal)
                    else:
                        node = exp.Literal(this=number, is_string=False)
                        node._meta = {"line": line, "col": end - line_start,
                                      "start": match.start(), "end": end - 1}  # fmt: skip
                else:
                    word = match.group(3).upper()
                    node = exp.Null() if word == "NULL" else exp.Boolean(this=word == "TRUE")
            items.append(node)
            position = gap(sql, end).end()  # type: ignore[union-attr]
            if position >= length:
                return None
            char = sql[position]
            if char == ",":
                position = gap(sql, position + 1).end()  # type: ignore[union-attr]
                continue
            if char == ")":
                break
            return None
        position += 1
        rows.append(exp.Tuple(expressions=items))
        if first_row_end < 0:
            first_row_end = position
        if not len(rows) % _TICK_ROWS:
            tick(_TICK_ROWS)
        row_end = position
        position = gap(sql, position).end()  # type: ignore[union-attr]
        if position < length and sql[position] == ",":
            position = gap(sql, position + 1).end()  # type: ignore[union-attr]
            continue
        return rows, first_row_end, row_end


def _shift_tail(tree: exp.Expression, values: exp.Values, cut: int, shift: int, sql: str) -> None:
    """Move the positions of the nodes after ``cut`` in the skeleton (the tail's) by
    ``shift`` characters, their lines and columns with them: each line by the newlines of
    the rows taken out, the column of a node on the cut's own line from the start of its
    line in ``sql`` (a constant amount of work a node: the tail may be long too)."""
    rows_end = cut + shift
    newlines = sql.count("\n", cut, rows_end)
    cut_line = 1 + sql.count("\n", 0, cut)
    line_start = sql.rfind("\n", 0, rows_end) + 1  # of the line the tail begins on, in sql
    for node in tree.walk():
        meta = node._meta
        if not meta or "start" not in meta or meta["start"] < cut:
            continue
        meta["start"] += shift
        meta["end"] += shift
        if meta["line"] == cut_line:
            meta["col"] = meta["end"] - line_start + 1
        meta["line"] += newlines


def same_tree(one: exp.Expression, other: exp.Expression) -> bool:
    """Whether two trees are equal node for node: ``dump`` alike."""
    return dump(one) == dump(other)


def dump(tree: exp.Expression) -> list[tuple[Any, ...]]:
    """Every node of ``tree`` in walk order: its class, its place under its parent (key,
    index), its arguments that are not nodes, its comments and positions; the parent's
    identity is checked: each node's ``parent`` is the node it hangs under."""
    out: list[tuple[Any, ...]] = []
    for node in tree.walk():
        for key, value in node.args.items():
            children = value if isinstance(value, list) else [value]
            for child in children:
                if isinstance(child, exp.Expression) and child.parent is not node:
                    out.append(("orphan", key))
        plain = tuple(sorted((key, repr(value)) for key, value in node.args.items()
                             if not isinstance(value, exp.Expression | list)))  # fmt: skip
        lists = tuple(sorted((key, len(value)) for key, value in node.args.items()
                             if isinstance(value, list)))  # fmt: skip
        out.append((type(node).__name__, node.arg_key if node is not tree else None,
                    node.index if node is not tree else None, plain, lists,
                    tuple(node.comments or ()), tuple(sorted((node._meta or {}).items())),
                    repr(node.type) if node.type is not None else None))  # fmt: skip
    return out
