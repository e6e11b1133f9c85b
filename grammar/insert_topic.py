"""``INSERT INTO TOPIC``: the fast path for literal rows, and the query path.

The head (``INSERT INTO TOPIC name [(columns)]``) and the tail (``[WITH (...)]
[RETURNING ...]``) go through the grammar as a skeleton of the same length whose body is
``BODY_MARK`` and blanks (``topic.lark``), so positions stay right. ``VALUES`` rows of
plain literals are read by a scanner (``split.scan_value_rows``, no Lark tree per value:
a 5,000-row INSERT is one Lark parse); rows with expressions, and queries, go to the
SQL path (``topic_scans.sql_statement``, which must find a query).

The skeleton's statement object is cached by the skeleton's *shape*
(``skeleton_shape``): the head, ``BODY_MARK`` with at most one blank, and the tail.
Statements that differ only in their rows (a client sending one literal message per
statement) then pay a scan of their rows and a dictionary look-up, not a Lark parse.
Exactness: the shape and the padded skeleton differ only in the length of one run of
whitespace after ``BODY_MARK``, which the grammar ignores (``topic.lark``); so Lark
accepts both alike and builds equal trees whose tokens after the body sit at shifted
offsets. A successful build reads offsets only for the statement's ``position`` and
``text``, which are set from the real source on every use; a failing one is never
cached: the statement is parsed again from its padded skeleton, whose errors carry
the exact positions (``tests/grammar/test_insert_shape_cache.py``).
"""

from __future__ import annotations

from dataclasses import replace
from itertools import islice

from grammar import settings
from grammar.ast import (
    InsertTopic,
    SqlStatement,
    Value,
)
from grammar.split import (
    SourceText,
    Token,
    matching_parenthesis,
    scan_value_rows,
    tokenize,
)
from grammar.text_cache import text_cache
from grammar.topic_scans import ScanMatch, find_topic_scans, sql_statement
from grammar.tree_builder import parse_with_grammar
from storage.errors import TopicbaseError

# INSERT INTO TOPIC name ( c1 , c2 ... ) and the body's first token, for column lists
# up to 64 names; a longer list cannot be valid and is left to the grammar to refuse.
_INSERT_HEAD_TOKENS_MAX = 4 + 2 * 64 + 1
# What may follow INSERT INTO TOPIC name [(columns)], besides "(".
_QUERY_STARTS = ("VALUES", "SELECT", "WITH", "FROM", "TABLE")
# Stands for the rows or query of INSERT INTO TOPIC when its head and tail go
# through the grammar (see topic.lark).
BODY_MARK = "\ue000"
# Skeleton shapes kept (``_skeleton_statement``); a shape is an INSERT without its rows.
SHAPE_CACHE_ENTRIES = 512


def parse_insert(source: SourceText, start: int, end: int) -> InsertTopic:
    head = list(islice(tokenize(source, start, end), _INSERT_HEAD_TOKENS_MAX))
    located = _insert_body_index(head)
    if located is None:
        return parse_with_grammar(source, start, end, source.text[start:end])  # type: ignore[return-value]
    body_index, width = located
    body_start = head[body_index].start
    if not (head[body_index].is_word(*_QUERY_STARTS) or head[body_index].text == "("):
        raise source.error_near(body_start, end)
    if head[body_index].is_word("VALUES"):
        scanned = _scan_literal_rows(source, head[body_index].end, end, width)
        if scanned is not None:
            value_rows, rows_end = scanned
            insert = _insert_skeleton(source, start, end, body_start, rows_end)
            checked = settings.check_value_rows(insert.columns, value_rows, source, body_start)
            return _replace_body(insert, values=checked)
    body_tokens = list(tokenize(source, body_start, end))
    scans = find_topic_scans(source, body_tokens)
    tail_index = _insert_tail_index(body_tokens, scans)
    body_end = body_tokens[tail_index - 1].end if tail_index else body_start
    insert = _insert_skeleton(source, start, end, body_start, body_end)
    query = sql_statement(source, body_start, body_end, scans, query_only=True)
    return _replace_body(insert, query=query)


def _insert_body_index(head: list[Token]) -> tuple[int, int] | None:
    """Index of the first token after ``INSERT INTO TOPIC name [(columns)]``, and the
    number of columns named (1 for the default column list)."""
    index, width = 4, 1
    if len(head) > index and head[index].text == "(" and head[index].kind == "punct":
        expect_name = True
        for probe in range(index + 1, len(head)):
            token = head[probe]
            if expect_name and token.kind not in ("word", "quoted"):
                break
            if not expect_name and token.text == ")":
                index, width = probe + 1, (probe - index) // 2
                break
            if not expect_name and token.text != ",":
                break
            expect_name = not expect_name
    return (index, width) if len(head) > index else None


def _scan_literal_rows(
    source: SourceText, start: int, end: int, width: int
) -> tuple[list[tuple[Value, ...]], int] | None:
    scanned = scan_value_rows(source, start, end, width)
    if scanned is None:
        return None
    tail = next(tokenize(source, scanned[1], end), None)
    if tail is not None and not tail.is_word("WITH", "RETURNING"):
        return None
    return scanned


def _insert_skeleton(
    source: SourceText, start: int, end: int, body_start: int, body_end: int
) -> InsertTopic:
    text = source.text
    try:
        cached = _skeleton_statement(skeleton_shape(text, start, end, body_start, body_end))
    except TopicbaseError:
        cached = None  # parsed again below, for the error's exact position
    if cached is not None:
        return replace(cached, position=source.position(start), text=text[start:end])
    body = text[body_start:body_end]
    # Only the length must hold: positions are computed from offsets, not Lark's lines.
    mark = BODY_MARK + " " * (len(body) - 1) if body else ""
    skeleton = text[start:body_start] + mark + text[body_end:end]
    assert len(skeleton) == end - start
    insert = parse_with_grammar(source, start, end, skeleton)
    assert isinstance(insert, InsertTopic)
    return insert


def skeleton_shape(text: str, start: int, end: int, body_start: int, body_end: int) -> str:
    """The skeleton of ``text[start:end]`` with its body's padding cut to one blank: equal
    for INSERTs that differ only in their rows or query (not in their length)."""
    if body_end == body_start:
        return text[start:end]
    mark = BODY_MARK + " " if body_end - body_start > 1 else BODY_MARK
    return text[start:body_start] + mark + text[body_end:end]


@text_cache(SHAPE_CACHE_ENTRIES)
def _skeleton_statement(shape: str) -> InsertTopic:
    """The statement object of a skeleton shape, its ``position`` and ``text`` the
    shape's own (the caller sets the real ones). Raises as the grammar does; errors are
    not cached (``functools.lru_cache``)."""
    insert = parse_with_grammar(SourceText(shape), 0, len(shape), shape)
    assert isinstance(insert, InsertTopic)
    return insert


def _replace_body(
    insert: InsertTopic,
    *,
    values: tuple[tuple[Value, ...], ...] | None = None,
    query: SqlStatement | None = None,
) -> InsertTopic:
    return InsertTopic(
        insert.topic,
        insert.columns,
        values,
        query,
        insert.options,
        insert.returning,
        insert.position,
        insert.text,
    )


def _insert_tail_index(tokens: list[Token], scans: list[ScanMatch]) -> int:
    """Index where ``[WITH (...)] [RETURNING ...]`` begins after an INSERT's query."""
    inside_scan = {index for scan in scans for index in range(scan.first, scan.last + 1)}
    depth, tail = 0, len(tokens)
    for index, token in enumerate(tokens):
        if index in inside_scan or token.kind not in ("punct", "word"):
            continue
        depth += 1 if token.text == "(" else -1 if token.text == ")" else 0
        if depth == 0 and token.is_word("RETURNING"):
            tail = index
            break
    for index in range(tail - 2, -1, -1):
        token = tokens[index]
        if index in inside_scan or not token.is_word("WITH") or tokens[index + 1].text != "(":
            continue
        if matching_parenthesis(tokens, index + 1) == tail - 1 and _depth(tokens, index) == 0:
            return index
    return tail


def _depth(tokens: list[Token], stop: int) -> int:
    depth = 0
    for token in tokens[:stop]:
        if token.kind == "punct":
            depth += 1 if token.text == "(" else -1 if token.text == ")" else 0
    return depth
