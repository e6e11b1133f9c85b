"""Ordinary SQL and the topic relations in it (``TOPIC name [WITH (...)]``).

Statements that are not topic statements are DuckDB SQL, kept as text. A ``TOPIC name``
where a relation may stand (after FROM, JOIN, or a comma of a FROM list) is replaced by a
placeholder relation ``__topic_scan_<n>`` and recorded as a ``TopicScan``; the rewritten
text must then parse with sqlglot's DuckDB dialect (42601 with line and column if not).
SQL without topic relations is not re-parsed: DuckDB reports its own errors. UPDATE,
DELETE and TRUNCATE of a topic, and INSERT INTO TOPIC nested in SQL, are refused (0A000).
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlglot
from sqlglot import exp

from grammar.ast import (
    SqlStatement,
    TopicScan,
    Value,
)
from grammar.names import check_topic_name
from grammar.split import (
    SourceText,
    Token,
    matching_parenthesis,
    tokenize,
    unquote_identifier,
)
from grammar.tree_builder import read_options
from storage.errors import (
    FeatureNotSupportedError,
)

PLACEHOLDER_PREFIX = "__topic_scan_"
# Words that end a FROM list at the same parenthesis depth, and words that may follow
# a relation, so `FROM topic WHERE ...` reads a table called "topic".
_FROM_LIST_ENDERS = frozenset(
    {"WHERE", "GROUP", "HAVING", "ORDER", "LIMIT", "OFFSET", "FETCH", "WINDOW", "QUALIFY"}
    | {"UNION", "EXCEPT", "INTERSECT", "SELECT", "RETURNING", "SET", "VALUES"}
)
_RELATION_FOLLOWERS = _FROM_LIST_ENDERS | frozenset(
    {"AS", "FOR", "JOIN", "INNER", "LEFT", "RIGHT", "FULL", "CROSS", "NATURAL", "POSITIONAL"}
    | {"ASOF", "ANTI", "SEMI", "ON", "USING", "TABLESAMPLE", "PIVOT", "UNPIVOT", "WITH"}
    | {"LATERAL"}
)




@dataclass(frozen=True)
class ScanMatch:
    """Token indexes ``first..last`` of ``TOPIC name [WITH (...)]`` in a statement."""

    first: int
    last: int
    topic: str
    options: tuple[tuple[str, Value], ...]
    start: int
    end: int


def parse_sql(source: SourceText, start: int, end: int) -> SqlStatement:
    text = source.text[start:end]
    if "topic" not in text.lower():
        return SqlStatement(text, (), source.position(start), text)
    tokens = list(tokenize(source, start, end))
    _refuse_topic_writes(source, tokens)
    scans = find_topic_scans(source, tokens)
    return sql_statement(source, start, end, scans, query_only=False)


def _refuse_topic_writes(source: SourceText, tokens: list[Token]) -> None:
    """UPDATE/DELETE/TRUNCATE of a topic, and INSERT INTO TOPIC nested in SQL."""
    for index, token in enumerate(tokens[:-2]):
        if not tokens[index + 1].is_word("TOPIC") or not _is_topic_name(tokens[index + 2]):
            continue
        verb = (
            "DELETE"
            if token.is_word("FROM") and index and tokens[index - 1].is_word("DELETE")
            else token.text.upper()
            if token.is_word("UPDATE", "TRUNCATE")
            else None
        )
        if verb is not None:
            raise FeatureNotSupportedError(
                f"topics are append-only: {verb} is not supported on a TOPIC",
                **vars(source.position(token.start)),
            )
        if token.is_word("INTO"):
            raise FeatureNotSupportedError(
                "INSERT INTO TOPIC must be a statement of its own, not part of another",
                **vars(source.position(token.start)),
            )


def _is_topic_name(token: Token) -> bool:
    if token.kind in ("quoted", "backquoted"):
        return True
    return token.kind == "word" and token.text.upper() not in _RELATION_FOLLOWERS


def find_topic_scans(source: SourceText, tokens: list[Token]) -> list[ScanMatch]:
    """Every ``TOPIC name [WITH (...)]`` standing where a relation may stand."""
    scans: list[ScanMatch] = []
    in_from_list = [False]
    index = 0
    while index < len(tokens):
        token = tokens[index]
        if token.kind == "punct" and token.text in "()":
            if token.text == "(":
                in_from_list.append(False)
            elif len(in_from_list) > 1:
                in_from_list.pop()
        elif token.is_word("FROM"):
            in_from_list[-1] = True
        elif token.kind == "word" and token.text.upper() in _FROM_LIST_ENDERS:
            in_from_list[-1] = False
        elif token.is_word("TOPIC") and _stands_as_relation(tokens, index, in_from_list[-1]):
            scan = _match_scan(source, tokens, index)
            scans.append(scan)
            index = scan.last + 1
            continue
        index += 1
    return scans


def _stands_as_relation(tokens: list[Token], index: int, in_from_list: bool) -> bool:
    if index == 0 or index + 1 >= len(tokens) or not _is_topic_name(tokens[index + 1]):
        return False
    previous = tokens[index - 1]
    return previous.is_word("FROM", "JOIN") or (in_from_list and previous.text == ",")


def _match_scan(source: SourceText, tokens: list[Token], index: int) -> ScanMatch:
    name_token = tokens[index + 1]
    if index + 2 < len(tokens) and tokens[index + 2].text == ".":
        raise source.syntax_error(
            tokens[index + 2].start,
            "a topic name is one identifier; write a path in backquotes: TOPIC `dir/name`",
        )
    topic = unquote_identifier(name_token.text)
    check_topic_name(topic, source.position(name_token.start))
    last, options = index + 1, {}
    has_options = index + 3 < len(tokens) and tokens[index + 2].is_word("WITH")
    if has_options and tokens[index + 3].text == "(":
        close = matching_parenthesis(tokens, index + 3)
        if close is None:
            raise source.syntax_error(tokens[index + 3].start, "missing ) after TOPIC options")
        options = read_options(source, tokens[index + 3].start, tokens[close].end)
        last = close
    return ScanMatch(
        index, last, topic, tuple(options.items()), tokens[index].start, tokens[last].end
    )


def sql_statement(
    source: SourceText, start: int, end: int, scans: list[ScanMatch], *, query_only: bool
) -> SqlStatement:
    """The SQL of ``start..end`` with scans replaced; checked with sqlglot when it has
    scans or must be a query."""
    text = source.text[start:end]
    if not scans and not query_only:
        return SqlStatement(text, (), source.position(start), text)
    pieces: list[str] = []
    offset_map: list[tuple[int, int]] = []  # (offset in rewritten SQL, offset in script)
    cursor, rewritten_length = start, 0
    topic_scans = []
    for number, scan in enumerate(scans):
        placeholder = f"{PLACEHOLDER_PREFIX}{number}"
        before = source.text[cursor : scan.start]
        for piece, origin in ((before, cursor), (placeholder, scan.start)):
            offset_map.append((rewritten_length, origin))
            pieces.append(piece)
            rewritten_length += len(piece)
        cursor = scan.end
        topic_scans.append(
            TopicScan(scan.topic, scan.options, placeholder, source.position(scan.start))
        )
    offset_map.append((rewritten_length, cursor))
    pieces.append(source.text[cursor:end])
    sql = "".join(pieces)
    expression = _check_with_sqlglot(source, sql, offset_map, end)
    if query_only and not isinstance(expression, exp.Query | exp.Values):
        raise source.syntax_error(start, "INSERT INTO TOPIC expects VALUES or a query here")
    if scans and isinstance(expression, exp.Command):
        raise FeatureNotSupportedError(
            "TOPIC relations are not supported in this kind of statement",
            **vars(source.position(scans[0].start)),
        )
    return SqlStatement(sql, tuple(topic_scans), source.position(start), text)


def _check_with_sqlglot(
    source: SourceText, sql: str, offset_map: list[tuple[int, int]], end: int
) -> exp.Expression:
    try:
        expression = sqlglot.parse_one(sql, read="duckdb")
    except sqlglot.errors.ParseError as error:
        detail = error.errors[0] if error.errors else {}
        offset = _sqlglot_offset(sql, detail)
        raise source.error_near(_script_offset(offset_map, offset), end) from None
    except sqlglot.errors.SqlglotError as error:
        raise source.syntax_error(offset_map[0][1], f"syntax error: {error}") from None
    return expression


def _sqlglot_offset(sql: str, detail: dict[str, object]) -> int:
    """sqlglot reports the 1-based line and the column where the bad token ends."""
    line, column = detail.get("line"), detail.get("col")
    if not isinstance(line, int) or not isinstance(column, int):
        return 0
    line_start = 0
    for _ in range(line - 1):
        line_start = sql.find("\n", line_start) + 1
    highlight = str(detail.get("highlight") or "")
    return max(line_start, min(len(sql), line_start + column - len(highlight)))


def _script_offset(offset_map: list[tuple[int, int]], offset: int) -> int:
    """Where a rewritten-SQL offset comes from; a placeholder maps to its TOPIC word."""
    origin = offset_map[0][1]
    for index, (rewritten_start, script_start) in enumerate(offset_map):
        if rewritten_start > offset:
            break
        is_placeholder = index % 2 == 1 and index != len(offset_map) - 1
        origin = script_start if is_placeholder else script_start + offset - rewritten_start
    return origin
