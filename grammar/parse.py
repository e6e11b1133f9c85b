"""SQL text to statement objects: the parser front door.

This module owns ``parse`` and ``parse_one`` and the decisions around them:

- the script length limit (``SQL_TEXT_BYTES_MAX``, 54000 when exceeded);
- dispatch by a statement's first words: topic DDL, transaction control,
  ``SHOW TOPICS``, ``DESCRIBE TOPIC``, ``COMMIT OFFSETS`` and the head and tail of
  ``INSERT INTO TOPIC`` go through the Lark grammar in ``topic.lark``; ``EXPLAIN`` is
  unwrapped; everything else is DuckDB SQL, kept as text;
- topic relations inside SQL: ``TOPIC name [WITH (...)]`` after FROM, JOIN or a
  comma of a FROM list is replaced by a placeholder relation ``__topic_scan_<n>``
  and recorded as a ``TopicScan``; the rewritten text must then parse with sqlglot's
  DuckDB dialect (42601 with line and column if not). SQL without topic relations
  is not re-parsed here: DuckDB reports its own errors.
- ``INSERT INTO TOPIC ... VALUES`` rows of plain literals are read by a regex
  scanner (``split.scan_value_rows``); rows with expressions go to the SQL path.

The pieces: ``tree_builder`` (the Lark path and statement objects), ``insert_topic``
(INSERT INTO TOPIC), ``topic_scans`` (ordinary SQL and topic relations in it), ``names``.

Invariants: every statement keeps its exact source ``text`` and ``position``; error
positions are absolute in the whole script. Settings and options are checked by
``grammar.settings``. No I/O except reading ``topic.lark`` once at import; the
parser object is immutable after construction, so parsing is thread-safe.
"""

from __future__ import annotations

from itertools import islice

from grammar.ast import (
    AbortWrites,
    Begin,
    Commit,
    CommitWrites,
    Explain,
    Rollback,
    Statement,
)
from grammar.insert_topic import parse_insert
from grammar.split import (
    SourceText,
    Token,
    statement_spans,
    tokenize,
)
from grammar.topic_scans import PLACEHOLDER_PREFIX, parse_sql
from grammar.tree_builder import parse_with_grammar
from storage.errors import (
    LimitExceededError,
    SqlSyntaxError,
    TopicbaseError,
)
from storage.limits import SQL_TEXT_BYTES_MAX

__all__ = ["PLACEHOLDER_PREFIX", "SQL_TEXT_BYTES_MAX", "parse", "parse_one"]

_LARK_HEADS = frozenset(
    {"BEGIN", "START", "COMMIT", "END", "ROLLBACK", "ABORT"}
    | {"CREATE TOPIC", "ALTER TOPIC", "DROP TOPIC", "SHOW TOPICS", "DESCRIBE TOPIC"}
)


def parse(text: str) -> list[Statement]:
    """Every statement of a script, in order. Empty statements are skipped."""
    assert isinstance(text, str), type(text)
    _check_length(text)
    source = SourceText(text)
    statements: list[Statement] = []
    for start, end in statement_spans(source):
        try:
            statements.append(_parse_statement(source, start, end))
        except TopicbaseError as error:
            # Fronts may show where a statement failed even when the message does not.
            if "line" not in error.context:
                position = source.position(start)
                error.context.update(line=position.line, column=position.column)
            raise
    return statements


def parse_one(text: str) -> Statement:
    """The single statement of ``text``; 42601 if there is none or more than one."""
    statements = parse(text)
    if len(statements) != 1:
        raise SqlSyntaxError(f"expected exactly one statement, got {len(statements)}")
    return statements[0]


def _check_length(text: str) -> None:
    size_bytes = len(text) if len(text) * 4 <= SQL_TEXT_BYTES_MAX else len(text.encode())
    if size_bytes > SQL_TEXT_BYTES_MAX:
        raise LimitExceededError(
            f"SQL text is {size_bytes} bytes; the limit is {SQL_TEXT_BYTES_MAX} bytes",
            size_bytes=size_bytes,
        )


def _parse_statement(source: SourceText, start: int, end: int) -> Statement:
    head = list(islice(tokenize(source, start, end), 3))
    words = [token.text.upper() if token.kind == "word" else "" for token in head]
    words += [""] * (3 - len(words))
    if words[0] == "EXPLAIN":
        return _parse_explain(source, start, end, head)
    if words == ["INSERT", "INTO", "TOPIC"]:
        return parse_insert(source, start, end)
    if words[:2] == ["DESCRIBE", "TOPIC"] and len(head) < 3:
        return parse_sql(source, start, end)  # DuckDB's DESCRIBE of a table "topic"
    if words[0] == "ROLLBACK" and "TO" in words[1:]:
        # ROLLBACK [WORK | TRANSACTION] TO [SAVEPOINT] name: not a transaction's end;
        # the fronts answer it (the wire: 25P01 / 3B001 / 0A000), DuckDB refuses it.
        return parse_sql(source, start, end)
    if words[0] in _LARK_HEADS or " ".join(words[:2]) in _LARK_HEADS:
        return parse_with_grammar(source, start, end, source.text[start:end])
    if words[0] in ("GRANT", "REVOKE") or _is_role_statement(words):
        return parse_with_grammar(source, start, end, source.text[start:end])
    if words[0] in ("CREATE", "ALTER", "DROP") and words[1].startswith("TOPIC"):
        # DuckDB has no object type spelled like this: `CREATE TOPICC x` is a typo of
        # ours, and the grammar points at it.
        return parse_with_grammar(source, start, end, source.text[start:end])
    return parse_sql(source, start, end)


def _is_role_statement(words: list[str]) -> bool:
    """SET/RESET [SESSION | LOCAL] ROLE and [SESSION] SESSION AUTHORIZATION (DuckDB has
    neither; ``SET SESSION name = value`` stays a setting)."""
    if words[0] not in ("SET", "RESET"):
        return False
    return words[1] == "ROLE" or (
        words[1] in ("SESSION", "LOCAL") and words[2] in ("ROLE", "AUTHORIZATION", "SESSION")
    )


def _parse_explain(source: SourceText, start: int, end: int, head: list[Token]) -> Explain:
    analyze = len(head) > 1 and head[1].is_word("ANALYZE")
    inner_index = 2 if analyze else 1
    if len(head) <= inner_index:
        raise source.syntax_error(end, "syntax error at end of input")
    inner_start = head[inner_index].start
    inner = _parse_statement(source, inner_start, end)
    if isinstance(inner, Explain | Begin | Commit | Rollback | CommitWrites | AbortWrites):
        raise source.syntax_error(
            inner_start, f"EXPLAIN cannot explain {type(inner).__name__.upper()}"
        )
    return Explain(inner, analyze, source.position(start), source.text[start:end])
