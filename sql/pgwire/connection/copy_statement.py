"""The COPY statement: ``parse_copy`` reads it and checks its options as PostgreSQL 15 does.

Accepted: ``COPY (query) TO STDOUT``, ``COPY name [(columns)] {TO STDOUT | FROM STDIN}``
and ``COPY TOPIC name [(columns)] ...``, followed by options either as the
``[WITH] (option [value], ...)`` list or in the old spelling (``[WITH] [BINARY]
[DELIMITER [AS] 'c'] [NULL [AS] 's'] [CSV [HEADER] [QUOTE [AS] 'q'] [ESCAPE [AS] 'e']
[FORCE QUOTE cols | * | FORCE NOT NULL cols]]``). Files and programs
are refused with 0A000, unknown options with 42601, bad values with 22023.
``FORMAT arrow`` (Topicbase's own: one Arrow IPC stream, ``connection.copy_arrow``) takes no
other option (22023) but, FROM STDIN only, ``WRITE_ID 'id'``: the rows are staged under that
write id and published later by ``COMMIT WRITES`` (``connection.copy_staged``); and, TO
STDOUT only, ``COMPRESSION zstd``: the client decodes record batches declaring Arrow IPC
body compression ZSTD, so a frame stored column-compressed may go out as it is stored
(``connection.copy_arrow``; no other value, 22023). Without it every batch is plain.

Pure functions over the coarse tokens of ``grammar.split``; no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.api import (
    SourceText,
    Token,
    matching_parenthesis,
    text_cache,
    tokenize,
    unquote_identifier,
    unquote_string,
)
from sql.pgwire.codec.copy_format import CopyFormat
from storage.errors import (
    FeatureNotSupportedError,
    InsufficientPrivilegeError,
    InvalidParameterValueError,
    SqlSyntaxError,
)

# The ParameterStatus a server sends at startup when it takes ``COMPRESSION zstd``
# (its value: the codecs it takes); a client asks only when it was announced.
COPY_COMPRESSION_PARAMETER = "topicbase_copy_compression"


@dataclass(frozen=True)
class CopyStatement:
    """One parsed COPY. Exactly one of ``query``, ``relation``, ``topic`` is set."""

    to_client: bool  # TO STDOUT (else FROM STDIN)
    query: str | None
    relation: str | None  # the table name as written (quotes and schema kept)
    topic: str | None
    columns: tuple[str, ...]  # unquoted column names; empty: all
    fmt: CopyFormat
    write_id: str | None = None  # FROM STDIN (FORMAT arrow, WRITE_ID 'id'): staged, unpublished
    frames: bool = False  # COPY TOPIC t FROM STDIN (FORMAT frames, WRITE_ID 'id'): staged frames


def is_copy(tokens: list[Token]) -> bool:
    return bool(tokens) and tokens[0].is_word("COPY")


# -- the statement ------------------------------------------------------------------------------
# Parsed COPY statements kept by text: a reader's loop sends the same COPY again and again
# (its parse costs ~35 us hot). A ``CopyStatement`` is immutable and depends on the text
# alone; errors are not kept.
COPY_PARSE_CACHE_ENTRIES = 64


@text_cache(COPY_PARSE_CACHE_ENTRIES)
def parse_copy(text: str) -> CopyStatement:
    """The COPY statement ``text``; 42601 for bad syntax, 0A000 for what is not supported.
    Cached by text (``text_cache``): the result is shared, never to be changed."""
    source = SourceText(text)
    tokens = list(tokenize(source, 0, len(text)))
    assert is_copy(tokens)
    at = 1
    query = relation = topic = None
    if _text(tokens, at) == "(":
        close = matching_parenthesis(tokens, at)
        if close is None:
            raise source.syntax_error(tokens[at].start, "unterminated query in COPY")
        query = text[tokens[at].end : tokens[close].start].strip()
        at = close + 1
    else:
        if tokens[at:at + 1] and tokens[at].is_word("TOPIC") and _is_name(tokens, at + 1) \
                and not tokens[at + 1].is_word("TO", "FROM"):  # fmt: skip
            at += 1
            topic = unquote_identifier(tokens[at].text)
            at += 1
        else:
            start = at
            while _is_name(tokens, at) and (at == start or _text(tokens, at - 1) == "."):
                at += 1
                if _text(tokens, at) == "." and _is_name(tokens, at + 1):
                    at += 1
            if at == start:
                raise _syntax(source, tokens, at)
            relation = text[tokens[start].start : tokens[at - 1].end]
    columns: tuple[str, ...] = ()
    if query is None and _text(tokens, at) == "(":
        close = matching_parenthesis(tokens, at)
        if close is None:
            raise _syntax(source, tokens, len(tokens))
        names = tokens[at + 1 : close]
        columns = tuple(unquote_identifier(t.text) for t in names[::2])
        if any(t.text != "," for t in names[1::2]) or not all(_is_name(names, i)
                                                              for i in range(0, len(names), 2)):
            raise _syntax(source, tokens, at + 1)
        at = close + 1
    if not tokens[at:at + 1] or not tokens[at].is_word("TO", "FROM"):
        raise _syntax(source, tokens, at)
    to_client = tokens[at].is_word("TO")
    at += 1
    where = tokens[at:at + 1]
    if not where or not where[0].is_word("STDOUT" if to_client else "STDIN"):
        raise InsufficientPrivilegeError(
            "COPY to or from a file or program is not allowed: the server's files are out of "
            "reach of every user; use STDIN or STDOUT (psql's \\copy reads and writes local "
            "files)")  # fmt: skip
    if query is not None and not to_client:
        raise _syntax(source, tokens, at - 1)
    options = _options(source, tokens, at + 1)
    write_id = _write_id(options, to_client)
    frames = str(options.get("format", "")).lower() == "frames"
    if frames and (write_id is None or topic is None or columns):
        raise InvalidParameterValueError(
            "FORMAT frames is only for COPY TOPIC t FROM STDIN (FORMAT frames, WRITE_ID 'id'), "
            "without a column list")
    fmt = _format(options, to_client)
    return CopyStatement(to_client, query, relation, topic, columns, fmt, write_id, frames)


def _write_id(options: dict[str, Any], to_client: bool) -> str | None:
    """``WRITE_ID 'id'`` (taken out of ``options``): a COPY FROM STDIN (FORMAT arrow) that
    stages its rows under that id instead of writing them (``copy_staged``); 22023 with
    another format, with COPY TO, or without a string value."""
    if "write_id" not in options:
        return None
    value = options.pop("write_id")
    if str(options.get("format", "")).lower() not in ("arrow", "frames") or to_client:
        raise InvalidParameterValueError("COPY option WRITE_ID is only for COPY FROM STDIN "
                                         "(FORMAT arrow or frames)")  # fmt: skip
    if not isinstance(value, str) or not value:
        raise InvalidParameterValueError("COPY option WRITE_ID takes the write id as a string")
    return value


def _text(tokens: list[Token], index: int) -> str:
    return tokens[index].text if index < len(tokens) else ""


def _is_name(tokens: list[Token], index: int) -> bool:
    return index < len(tokens) and tokens[index].kind in ("word", "quoted", "backquoted")


def _syntax(source: SourceText, tokens: list[Token], index: int) -> SqlSyntaxError:
    if index >= len(tokens):
        return source.syntax_error(len(source.text), "syntax error at end of input")
    return source.syntax_error(tokens[index].start,
                               f'syntax error at or near "{tokens[index].text}"')  # fmt: skip


_OLD_STYLE_FLAGS = {"BINARY": ("format", "binary"), "CSV": ("format", "csv"),
                    "HEADER": ("header", "true")}  # fmt: skip


def _options(source: SourceText, tokens: list[Token], at: int) -> dict[str, Any]:
    """COPY options as {name: value}; value is a str, True, or a tuple of column names."""
    if tokens[at:at + 1] and tokens[at].is_word("WITH"):
        at += 1
    if _text(tokens, at) == "(":
        return _option_list(source, tokens, at)
    options: dict[str, Any] = {}
    while at < len(tokens):
        word = tokens[at].text.upper() if tokens[at].kind == "word" else ""
        if word in _OLD_STYLE_FLAGS:
            name, value = _OLD_STYLE_FLAGS[word]
            options[name] = value
            at += 1
        elif word in ("DELIMITER", "NULL", "QUOTE", "ESCAPE", "ENCODING"):
            at += 2 if tokens[at + 1:at + 2] and tokens[at + 1].is_word("AS") else 1
            if _text(tokens, at)[:1] != "'":
                raise _syntax(source, tokens, at)
            options[word.lower()] = unquote_string(tokens[at].text)
            at += 1
        elif word == "FORCE":
            at, name, value = _old_force(source, tokens, at + 1)
            options[name] = value
        else:
            raise _syntax(source, tokens, at)
    return options


def _old_force(source: SourceText, tokens: list[Token], at: int) -> tuple[int, str, Any]:
    if tokens[at:at + 1] and tokens[at].is_word("QUOTE"):
        name, at = "force_quote", at + 1
    elif tokens[at:at + 2] and tokens[at].is_word("NOT") and tokens[at + 1].is_word("NULL"):
        name, at = "force_not_null", at + 2
    else:
        raise _syntax(source, tokens, at)
    if _text(tokens, at) == "*":
        return at + 1, name, True
    names = []
    while _is_name(tokens, at):
        names.append(unquote_identifier(tokens[at].text))
        at += 1
        if _text(tokens, at) != ",":
            break
        at += 1
    if not names:
        raise _syntax(source, tokens, at)
    return at, name, tuple(names)


def _option_list(source: SourceText, tokens: list[Token], at: int) -> dict[str, Any]:
    close = matching_parenthesis(tokens, at)
    if close is None or close != len(tokens) - 1:
        raise _syntax(source, tokens, len(tokens) if close is None else close + 1)
    options: dict[str, Any] = {}
    at += 1
    while at < close:
        if not _is_name(tokens, at):
            raise _syntax(source, tokens, at)
        name = unquote_identifier(tokens[at].text).lower()
        at += 1
        value: Any = True
        if _text(tokens, at) == "(":
            inner_close = matching_parenthesis(tokens, at)
            assert inner_close is not None
            value = tuple(unquote_identifier(t.text) for t in tokens[at + 1:inner_close:2])
            at = inner_close + 1
        elif at < close and _text(tokens, at) != ",":
            token = tokens[at]
            value = unquote_string(token.text) if token.kind == "string" else token.text
            at += 1
        if name in options:
            raise SqlSyntaxError("conflicting or redundant options")
        options[name] = value
        if at < close and _text(tokens, at) != ",":
            raise _syntax(source, tokens, at)
        at += 1
    return options


def _flag(name: str, value: Any) -> bool:
    if value is True:
        return True
    text = str(value).lower()
    if text in ("true", "on", "1"):
        return True
    if text in ("false", "off", "0"):
        return False
    raise InvalidParameterValueError(f"{name} requires a Boolean value")


def _single_char(name: str, value: Any) -> str:
    if not isinstance(value, str) or len(value.encode()) != 1:
        raise InvalidParameterValueError(f"COPY {name} must be a single one-byte character")
    return value


def _format(options: dict[str, Any], to_client: bool) -> CopyFormat:
    """Check the options as PostgreSQL does and build the data format."""
    if str(options.get("format", "")).lower() in ("arrow", "frames"):
        return _arrow_format(options, to_client)
    known = {"format", "delimiter", "null", "header", "quote", "escape", "force_quote",
             "force_not_null", "force_null", "encoding", "freeze"}  # fmt: skip
    for name in options:
        if name not in known:
            raise SqlSyntaxError(f'option "{name}" not recognized')
    kind = str(options.get("format", "text")).lower()
    if kind not in ("text", "csv", "binary"):
        raise InvalidParameterValueError(f'COPY format "{kind}" not recognized')
    if kind == "binary":
        return _binary_format(options, to_client)
    csv = kind == "csv"
    encoding = str(options.get("encoding", "UTF8")).upper().replace("-", "")
    if encoding != "UTF8":
        raise FeatureNotSupportedError("COPY supports only the UTF8 encoding")
    header_value = options.get("header", False)
    header_match = str(header_value).lower() == "match"
    if header_match and to_client:
        raise FeatureNotSupportedError("cannot use \"match\" with HEADER in COPY TO")
    header = header_match or _flag("header", header_value)
    delimiter = _single_char("delimiter", options.get("delimiter", "," if csv else "\t"))
    if delimiter in "\r\n" or (not csv and delimiter == "\\"):
        raise InvalidParameterValueError("COPY delimiter cannot be newline, carriage return "
                                         "or backslash")  # fmt: skip
    null = options.get("null", "" if csv else "\\N")
    if not isinstance(null, str) or "\n" in null or "\r" in null:
        raise InvalidParameterValueError("COPY null representation cannot use newline or "
                                         "carriage return")  # fmt: skip
    if delimiter in null:
        raise InvalidParameterValueError("COPY delimiter must not appear in the NULL "
                                         "specification")  # fmt: skip
    for name in ("quote", "escape", "force_quote", "force_not_null", "force_null"):
        if name in options and not csv:
            raise FeatureNotSupportedError(f"COPY {name} available only in CSV mode")
    if "force_quote" in options and not to_client:
        raise FeatureNotSupportedError("COPY force quote only available using COPY TO")
    for name in ("force_not_null", "force_null"):
        if name in options and to_client:
            raise FeatureNotSupportedError(f"COPY {name} only available using COPY FROM")
    quote = _single_char("quote", options.get("quote", '"'))
    escape = _single_char("escape", options.get("escape", quote))
    if csv and delimiter == quote:
        raise InvalidParameterValueError("COPY delimiter and quote must be different")
    force_quote = options.get("force_quote", ())
    return CopyFormat(
        csv=csv, delimiter=delimiter, null=null, header=header, header_match=header_match,
        quote=quote, escape=escape, force_quote=None if force_quote is True else force_quote,
        force_not_null=_names(options.get("force_not_null", ())),
        force_null=_names(options.get("force_null", ())),
    )  # fmt: skip


def _binary_format(options: dict[str, Any], to_client: bool) -> CopyFormat:
    for name in options:
        if name not in ("format", "freeze", "encoding"):
            raise SqlSyntaxError(f"cannot specify {name.upper()} in BINARY mode")
    return CopyFormat(binary=True)


def _arrow_format(options: dict[str, Any], to_client: bool) -> CopyFormat:
    """FORMAT arrow: no other option (22023) but ``COMPRESSION zstd`` with TO STDOUT."""
    for name in options:
        if name not in ("format", "compression"):
            raise InvalidParameterValueError(f"COPY option {name.upper()} cannot be used "
                                             "with FORMAT arrow")  # fmt: skip
    if "compression" not in options:
        return CopyFormat(binary=True, arrow=True)
    value = options["compression"]
    if not to_client or str(options.get("format", "")).lower() != "arrow":
        raise InvalidParameterValueError("COPY option COMPRESSION is only for COPY ... TO "
                                         "STDOUT (FORMAT arrow)")  # fmt: skip
    if not isinstance(value, str) or value.lower() != "zstd":
        raise InvalidParameterValueError(f"COPY option COMPRESSION takes zstd, not {value!r}")
    return CopyFormat(binary=True, arrow=True, arrow_zstd=True)


def _names(value: Any) -> tuple[str, ...]:
    return () if value is True else tuple(value)
