"""Reading DuckDB SQL with sqlglot, for the planner's analyses and rewrites.

Pure functions, no I/O; safe from any thread.
"""

from __future__ import annotations

import sqlglot
from sqlglot import expressions as exp

from grammar.split import SourceText, tokenize


def parse_duckdb(sql: str) -> exp.Expression | None:
    """sqlglot's tree of one DuckDB statement; raises ``sqlglot.errors.ParseError``.

    sqlglot's tokenizer reads ``$1,$2`` as the start of a ``$tag$`` dollar quote and
    fails; PostgreSQL clients send parameters like that. Such a statement is parsed
    again with a space after every ``$n`` that stands outside strings, identifiers and
    comments, which changes no meaning.
    """
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


def _parse_one(sql: str) -> exp.Expression | None:
    """sqlglot's parse; its own slips on odd input (an ``IndexError`` on a bare ``SHOW``)
    become a ``ParseError``, so callers treat them as statements sqlglot does not know."""
    try:
        return sqlglot.parse_one(sql, read="duckdb")
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
