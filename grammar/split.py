"""The lexical layer: positions, statement splitting, tokens and literal decoding.

This module owns everything that reads SQL text character by character:

- ``SourceText`` maps offsets to 1-based line/column and builds syntax errors with
  the offending line and a caret under the column (PostgreSQL's layout).
- ``split_statements`` cuts a script at semicolons that stand outside '' strings
  (and E'' strings with backslash escapes), "quoted" and `backquoted` identifiers,
  -- line comments, /* nested block comments */ and $tag$ dollar quotes.
- ``tokenize`` yields coarse tokens of one statement: enough to find keywords, names
  and parentheses while skipping strings, quoted identifiers and comments.
- ``scan_value_rows`` reads ``(...), (...)`` rows of plain literals without Lark,
  because a topic write may carry thousands of rows.
- ``parse_interval`` and ``parse_point_in_time`` decode ISO-8601 literals.
- ``check_complexity`` refuses (54001) a statement nested deeper than
  ``limits.NESTING_DEPTH_MAX`` or with more than ``limits.SET_OPERATIONS_MAX`` set
  operations, before any recursive parser (Lark, sqlglot, DuckDB) sees it;
  ``statement_spans`` runs it on every statement. Importing this module raises Python's
  recursion limit to ``limits.PYTHON_RECURSION_LIMIT``, the frames that depth needs.

Invariants: every offset is a 0-based character offset into the whole script; an
unterminated string, identifier or comment is a ``SqlSyntaxError`` at its start.
Pure functions, no I/O; the only shared state is a cache of compiled regexes,
which is safe from any thread.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import re
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import NamedTuple

from grammar.ast import Parameter, SourcePosition, Value
from storage import limits
from storage.errors import InvalidParameterValueError, SqlSyntaxError, StatementTooComplexError

# Parsing a statement of the depth ``check_complexity`` lets through takes several
# thousand Python frames (sqlglot recurses per level); only ever raised.
if sys.getrecursionlimit() < limits.PYTHON_RECURSION_LIMIT:
    sys.setrecursionlimit(limits.PYTHON_RECURSION_LIMIT)


class SourceText:
    """A script with a line index, so positions cost a binary search."""

    def __init__(self, text: str) -> None:
        self.text = text
        self._line_starts = [0] + [match.end() for match in re.finditer("\n", text)]

    def position(self, offset: int) -> SourcePosition:
        assert 0 <= offset <= len(self.text), offset
        line_index = bisect.bisect_right(self._line_starts, offset) - 1
        column = offset - self._line_starts[line_index] + 1
        return SourcePosition(line=line_index + 1, column=column, offset=offset)

    def syntax_error(self, offset: int, message: str) -> SqlSyntaxError:
        """A 42601 error whose message ends with the line and a caret under ``offset``."""
        offset = min(max(offset, 0), len(self.text))
        position = self.position(offset)
        line_start = self._line_starts[position.line - 1]
        line_end = self.text.find("\n", line_start)
        line_text = self.text[line_start : len(self.text) if line_end < 0 else line_end]
        prefix = f"LINE {position.line}: "
        caret = " " * (len(prefix) + position.column - 1) + "^"
        return SqlSyntaxError(
            f"{message}\n{prefix}{line_text.rstrip(chr(13))}\n{caret}",
            line=position.line,
            column=position.column,
            offset=offset,
        )

    def error_near(self, offset: int, end: int | None = None) -> SqlSyntaxError:
        """``syntax error at or near "<token>"`` (or ``at end of input``).

        An offset inside a word reports the whole word.
        """
        while (
            offset > 0 and _is_name_char(self.text, offset - 1) and _is_name_char(self.text, offset)
        ):
            offset -= 1
        token = self.token_at(offset, end)
        if token is None:
            return self.syntax_error(offset, "syntax error at end of input")
        return self.syntax_error(token.start, f'syntax error at or near "{token.text}"')

    def token_at(self, offset: int, end: int | None = None) -> Token | None:
        """The first token at or after ``offset`` (before ``end``), if any."""
        try:
            return next(tokenize(self, offset, len(self.text) if end is None else end), None)
        except SqlSyntaxError:
            return None


# -- statement splitting ----------------------------------------------------------------
_SAFE_RUN = re.compile(r"(?:[^;'\"`$/-]+|/(?!\*)|-(?!-))+")
_PLAIN_RUN = re.compile(r"(?:[^;'\"`$/-]+|'[^']*'|\"[^\"]*\"|`[^`]*`|/(?!\*)|-(?!-))+")
_E_QUOTE = re.compile(r"[eE]'")
_DOLLAR_QUOTE = re.compile(r"\$(?:[A-Za-z_][A-Za-z0-9_]*)?\$")
_STRING_BODY = re.compile(r"(?:[^']|'')*'")
_ESCAPE_STRING_BODY = re.compile(r"(?:[^'\\]|\\.|'')*'", re.DOTALL)
_QUOTED_BODY = re.compile(r'(?:[^"]|"")*"')
_BACKQUOTED_BODY = re.compile(r"(?:[^`]|``)*`")
_COMMENT_MARK = re.compile(r"/\*|\*/")


def split_statements(text: str) -> list[tuple[str, SourcePosition]]:
    """Each non-empty statement of a script with the position of its first token.

    A statement's text runs from its first token to its last, so leading comments,
    surrounding whitespace and the closing semicolon are left out.
    """
    source = SourceText(text)
    return [(text[start:end], source.position(start)) for start, end in statement_spans(source)]


def statement_spans(source: SourceText) -> list[tuple[int, int]]:
    """``(start, end)`` offsets of each non-empty statement of the script."""
    text = source.text
    # Without E'' strings, plain text and whole '' strings and quoted identifiers are
    # skipped by one regex run; E'' strings need the slower path that sees backslashes.
    run = _SAFE_RUN if _may_have_escape_string(text) else _PLAIN_RUN
    spans: list[tuple[int, int]] = []
    first, last_end, position = -1, -1, 0
    while position < len(text):
        match = run.match(text, position)
        if match is not None:
            first, last_end = _note_plain_text(text, position, match.end(), first, last_end)
            position = match.end()
        elif text[position] == ";":
            if first >= 0:
                spans.append((first, last_end))
            first, last_end, position = -1, -1, position + 1
        elif text.startswith(("--", "/*"), position):
            position = skip_comment(source, position)
        else:
            end = quoted_end(source, position)
            first = position if first < 0 else first
            last_end = position = end
    if first >= 0:
        spans.append((first, last_end))
    for start, end in spans:
        check_complexity(source, start, end)
    return spans


# -- statement complexity -------------------------------------------------------------------
_OPENERS = "([{"
_CLOSERS = {")": "(", "]": "[", "}": "{"}
_COMPLEX_WORDS = ("case", "union", "except", "intersect")
_COMPLEXITY_ITEM = re.compile(
    r"""
    (?P<skip>(?<![\w$])[eE]'(?:[^'\\]|\\.|'')*'|'(?:[^']|'')*'|"(?:[^"]|"")*"|`[^`]*`
      |--[^\n]*)
   |(?P<comment>/\*)
   |(?P<dollar>\$)
   |(?P<bracket>[()\[\]{}])
   |(?<![\w$])(?P<word>(?i:case|end|union|except|intersect))(?![\w$])
    """,
    re.VERBOSE,
)
# Strings, quoted identifiers and line comments, as _COMPLEXITY_ITEM's "skip" reads them.
_NOT_CODE = re.compile(
    r"""(?<![\w$])[eE]'(?:[^'\\]|\\.|'')*'|'(?:[^']|'')*'|"(?:[^"]|"")*"|`[^`]*`|--[^\n]*"""
)
# Over lower-cased text without strings.
_CASE_OR_END = re.compile(r"(?<![\w$])(?:case|end)(?![\w$])")
_SET_OPERATION = re.compile(r"(?<![\w$])(?:union|except|intersect)(?![\w$])")
_NOT_BRACKET = re.compile(r"[^()]+")
_AS_PARENTHESES = str.maketrans("[{]}", "(())")
_DEPTH_CHANGE = {"(": 1, ")": -1}


def check_complexity(source: SourceText, start: int, end: int) -> None:
    """Refuse (54001) the statement ``source.text[start:end]`` if its (), [], {} and
    CASE … END nest deeper than ``NESTING_DEPTH_MAX``, or it has more than
    ``SET_OPERATIONS_MAX`` UNION/EXCEPT/INTERSECT. Strings, quoted identifiers and
    comments do not count.

    Most statements are cleared by two C-speed scans (bracket count, no CASE or set
    operation word at all); most others (a long ``VALUES`` list) by a few more, over the
    text without its strings; only a statement with block comments, dollar quotes or one
    about to be refused takes the exact pass, item by item, that names the place.
    """
    text = source.text
    segment = text[start:end]
    opened = sum(segment.count(mark) for mark in _OPENERS)
    if opened <= limits.NESTING_DEPTH_MAX:
        lowered = segment.lower()
        if not any(word in lowered for word in _COMPLEX_WORDS):
            return
    if "/*" not in segment and "$" not in segment and _within_limits(segment):
        return
    _check_exactly(source, start, end)


def _within_limits(segment: str) -> bool:
    """True if ``segment`` (without block comments or dollar quotes) is surely within
    both limits; False means "look exactly"."""
    code = _code_of(segment).lower()
    if any(word in code for word in _COMPLEX_WORDS[1:]) and (
        len(_SET_OPERATION.findall(code)) > limits.SET_OPERATIONS_MAX
    ):
        return False
    if "case" in code:  # without CASE, an END closes nothing
        code = _CASE_OR_END.sub(lambda word: "(" if word.group() == "case" else ")", code)
    brackets = _NOT_BRACKET.sub("", code.translate(_AS_PARENTHESES))
    if not brackets:
        return True
    depths = itertools.accumulate(map(_DEPTH_CHANGE.__getitem__, brackets))
    # A stray closer would hide that many levels from the running sum: look exactly.
    lowest = min(itertools.accumulate(map(_DEPTH_CHANGE.__getitem__, brackets)))
    return lowest >= 0 and max(depths) <= limits.NESTING_DEPTH_MAX


def _code_of(segment: str) -> str:
    """``segment`` without its strings, quoted identifiers and line comments. Plain ''
    strings alone (a long VALUES list) are cut out by one split: the pieces between
    quotes alternate code, string (an escaped '' gives an empty code piece)."""
    if '"' in segment or "`" in segment or "--" in segment or _may_have_escape_string(segment):
        return _NOT_CODE.sub(" ", segment)
    return " ".join(segment.split("'")[0::2])


def _check_exactly(source: SourceText, start: int, end: int) -> None:
    """The item-by-item pass of ``check_complexity``; raises at the item over a limit."""
    text = source.text
    stack: list[str] = []
    set_operations = 0
    position = start
    while (match := _COMPLEXITY_ITEM.search(text, position, end)) is not None:
        position = match.end()
        kind = match.lastgroup
        if kind == "skip":
            continue
        item = match.group().upper()
        if kind == "comment":
            position = skip_comment(source, match.start())
        elif kind == "dollar":
            position = max(position, quoted_end(source, match.start()))
        elif item in _OPENERS or item == "CASE":
            stack.append(item)
            if len(stack) > limits.NESTING_DEPTH_MAX:
                what = "nested levels of parentheses, brackets or CASE"
                raise _too_complex(source, match.start(), limits.NESTING_DEPTH_MAX, what)
        elif item in _CLOSERS or item == "END":
            if stack and stack[-1] == _CLOSERS.get(item, "CASE"):
                stack.pop()
        elif kind == "word":
            set_operations += 1
            if set_operations > limits.SET_OPERATIONS_MAX:
                what = "UNION, EXCEPT or INTERSECT"
                raise _too_complex(source, match.start(), limits.SET_OPERATIONS_MAX, what)


def _too_complex(
    source: SourceText, offset: int, limit: int, what: str
) -> StatementTooComplexError:
    position = source.position(offset)
    return StatementTooComplexError(
        f"statement too complex: more than {limit} {what} (at line {position.line}, "
        f"column {position.column})",
        line=position.line,
        column=position.column,
    )


def _may_have_escape_string(text: str) -> bool:
    """True if some ``e'`` stands at the start of a word (a lookbehind regex over the
    whole script costs more than checking the few ``e'`` hits by hand)."""
    return any(not _is_name_char(text, hit.start() - 1) for hit in _E_QUOTE.finditer(text))


def _note_plain_text(
    text: str, start: int, stop: int, first: int, last_end: int
) -> tuple[int, int]:
    """Track the first and last non-blank offsets of a statement across a plain chunk."""
    chunk = text[start:stop]
    stripped_left = chunk.lstrip()
    if not stripped_left:
        return first, last_end
    if first < 0:
        first = start + len(chunk) - len(stripped_left)
    return first, start + len(chunk.rstrip())


def skip_comment(source: SourceText, start: int) -> int:
    """The offset just past the comment starting at ``start``; block comments nest."""
    text = source.text
    if text.startswith("--", start):
        newline = text.find("\n", start)
        return len(text) if newline < 0 else newline + 1
    depth = 0
    for match in _COMMENT_MARK.finditer(text, start):
        depth += 1 if match.group() == "/*" else -1
        if depth == 0:
            return match.end()
    raise source.syntax_error(start, "unterminated /* comment")


def quoted_end(source: SourceText, start: int) -> int:
    """The offset just past the quoted item at ``start`` (a quote or ``$`` character).

    A ``$`` that does not open a dollar quote (``$1``, or inside a name like ``a$b``)
    is a one-character item.
    """
    text = source.text
    mark = text[start]
    if mark == "$":
        return _dollar_quote_end(source, start)
    if mark == "'":
        escaped = start > 0 and text[start - 1] in "eE" and not _is_name_char(text, start - 2)
        body, what = (_ESCAPE_STRING_BODY if escaped else _STRING_BODY), "quoted string"
    elif mark == '"':
        body, what = _QUOTED_BODY, "quoted identifier"
    else:
        body, what = _BACKQUOTED_BODY, "quoted identifier"
    match = body.match(text, start + 1)
    if match is None:
        near = text[start : start + 20]
        raise source.syntax_error(start, f'unterminated {what} at or near "{near}"')
    return match.end()


def _dollar_quote_end(source: SourceText, start: int) -> int:
    text = source.text
    match = _DOLLAR_QUOTE.match(text, start)
    if match is None or _is_name_char(text, start - 1):
        return start + 1
    close = text.find(match.group(), match.end())
    if close < 0:
        raise source.syntax_error(start, "unterminated dollar-quoted string")
    return close + len(match.group())


def _is_name_char(text: str, index: int) -> bool:
    return index >= 0 and (text[index].isalnum() or text[index] in "_$")


# -- tokens -------------------------------------------------------------------------------
class Token(NamedTuple):
    """A coarse token: kind is word, quoted, backquoted, string, number, param or punct."""

    kind: str
    text: str
    start: int
    end: int

    def is_word(self, *words: str) -> bool:
        return self.kind == "word" and self.text.upper() in words


_TOKEN = re.compile(
    r"""
    (?P<space>\s+)
   |(?P<comment>--|/\*)
   |(?P<string>[eExX]?')
   |(?P<quoted>")
   |(?P<backquoted>`)
   |(?P<dollar>\$(?!\d))
   |(?P<param>\$\d+|\?)
   |(?P<number>(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)
   |(?P<word>[^\W\d][\w$]*)
   |(?P<punct>::|<=|>=|<>|!=|\|\||->>|->|=>|.)
    """,
    re.VERBOSE | re.DOTALL,
)


def tokenize(source: SourceText, start: int, end: int) -> Iterator[Token]:
    """Tokens of ``source.text[start:end]`` without whitespace and comments."""
    text = source.text
    position = start
    while position < end:
        match = _TOKEN.match(text, position, end)
        assert match is not None, position
        kind = match.lastgroup
        assert kind is not None
        if kind == "space":
            position = match.end()
            continue
        if kind == "comment":
            position = skip_comment(source, position)
            continue
        if kind in ("string", "quoted", "backquoted", "dollar"):
            token_end = quoted_end(source, match.end() - 1)
            if kind == "dollar" and token_end == match.end():
                kind = "punct"
            kind = "string" if kind == "dollar" else kind
        else:
            token_end = match.end()
        yield Token(kind, text[position:token_end], position, token_end)
        position = token_end


def matching_parenthesis(tokens: list[Token], open_index: int) -> int | None:
    """Index of the ``)`` closing the ``(`` at ``open_index``, or None."""
    assert tokens[open_index].text == "("
    depth = 0
    for index in range(open_index, len(tokens)):
        text = tokens[index].text
        if tokens[index].kind != "punct":
            continue
        depth += 1 if text == "(" else -1 if text == ")" else 0
        if depth == 0:
            return index
    return None


def unquote_identifier(text: str) -> str:
    """The name a plain, "quoted" or `backquoted` identifier token stands for."""
    if text[:1] == '"':
        return text[1:-1].replace('""', '"')
    if text[:1] == "`":
        return text[1:-1].replace("``", "`")
    return text


def unquote_string(text: str) -> str:
    assert text[0] == "'" and text[-1] == "'", text
    return text[1:-1].replace("''", "'")


# -- literal rows -------------------------------------------------------------------------
_GAP = re.compile(r"(?:\s+|--[^\n]*|/\*(?:[^*]|\*(?!/))*\*/)*")
_LITERAL = re.compile(
    r"""
    '(?P<string>(?:[^']|'')*)'
   |[xX]'(?P<hex>[^']*)'
   |(?P<number>[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)(?![\w.$])
   |(?P<keyword>(?i:null|true|false))(?![\w$])
   |\$(?P<dollar_param>\d+)(?![\w$])
   |(?P<question_param>\?)
   |(?P<typed_kind>(?i:timestamp|datetime))\s*\(\s*'(?P<typed_text>(?:[^']|'')*)'\s*\)
    """,
    re.VERBOSE,
)
_KEYWORD_VALUES: dict[str, Value] = {"null": None, "true": True, "false": False}


# A whole row of ``width`` literals in one match, for widths up to the number of
# columns a topic write has; rows of other shapes take the literal-by-literal path.
_LITERAL_TEXT = (
    r"'(?:[^']|'')*'|[xX]'[^']*'|[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?(?![\w.$])"
    r"|(?i:null|true|false)(?![\w$])|\$\d+(?![\w$])|\?"
    r"|(?i:timestamp|datetime)\s*\(\s*'(?:[^']|'')*'\s*\)"
)
_GAP_TEXT = r"(?:\s+|--[^\n]*|/\*(?:[^*]|\*(?!/))*\*/)*"
_ROW_WIDTH_MAX = 8


@functools.cache
def _row_pattern(width: int) -> re.Pattern[str]:
    """Compiled on first use: building all widths at import costs more than a parse."""
    assert 0 < width <= _ROW_WIDTH_MAX, width
    literal = f"{_GAP_TEXT}({_LITERAL_TEXT}){_GAP_TEXT}"
    return re.compile(r"\(" + ",".join([literal] * width) + r"\)")


def scan_value_rows(
    source: SourceText, start: int, end: int, width: int = 0
) -> tuple[list[tuple[Value, ...]], int] | None:
    """Rows ``(v, ...), (v, ...)`` of plain literals starting at ``start``.

    Returns the rows and the offset after the last row, or None at the first thing
    that is not a plain literal (an expression, a cast...), so the caller can hand
    the whole body to the general SQL path instead. ``width``, when known, lets each
    row be matched by one regex.
    """
    if 0 < width <= _ROW_WIDTH_MAX:
        scanned = _scan_rows_of_width(source, start, end, width)
        if scanned is not None:
            return scanned
    return _scan_rows_by_literal(source, start, end)


def _scan_rows_of_width(
    source: SourceText, start: int, end: int, width: int
) -> tuple[list[tuple[Value, ...]], int] | None:
    text = source.text
    pattern = _row_pattern(width)
    rows: list[tuple[Value, ...]] = []
    parameters = _ParameterStyle()
    position = _GAP.match(text, start, end).end()  # type: ignore[union-attr]
    while True:
        match = pattern.match(text, position, end)
        if match is None:
            return None
        rows.append(
            tuple(
                _quick_value(source, group, match.start(index + 1), parameters)
                for index, group in enumerate(match.groups())
            )
        )
        position = _GAP.match(text, match.end(), end).end()  # type: ignore[union-attr]
        if position >= end or text[position] != ",":
            return rows, position
        position = _GAP.match(text, position + 1, end).end()  # type: ignore[union-attr]


def _quick_value(source: SourceText, literal: str, offset: int, style: _ParameterStyle) -> Value:
    """The common literals directly; the rest through the full literal regex."""
    first = literal[0]
    if first == "'":
        body = literal[1:-1]
        return body.replace("''", "'") if "''" in body else body
    if first.isdigit() and literal.isdigit():
        return int(literal)
    match = _LITERAL.match(source.text, offset)
    assert match is not None and match.end() == offset + len(literal), literal
    return _literal_value(source, match, style)


def _scan_rows_by_literal(
    source: SourceText, start: int, end: int
) -> tuple[list[tuple[Value, ...]], int] | None:
    text = source.text
    rows: list[tuple[Value, ...]] = []
    parameters = _ParameterStyle()
    position = _GAP.match(text, start, end).end()  # type: ignore[union-attr]
    while position < end and text[position] == "(":
        row: list[Value] = []
        while True:
            position = _GAP.match(text, position + 1, end).end()  # type: ignore[union-attr]
            literal = _LITERAL.match(text, position, end)
            if literal is None:
                return None
            row.append(_literal_value(source, literal, parameters))
            position = _GAP.match(text, literal.end(), end).end()  # type: ignore[union-attr]
            if position >= end or text[position] not in ",)":
                return None
            if text[position] == ")":
                break
        rows.append(tuple(row))
        position = _GAP.match(text, position + 1, end).end()  # type: ignore[union-attr]
        if position >= end or text[position] != ",":
            return (rows, position) if rows else None
        position = _GAP.match(text, position + 1, end).end()  # type: ignore[union-attr]
    return None


class _ParameterStyle:
    """Numbers ``?`` placeholders in order and refuses mixing them with ``$n``."""

    def __init__(self) -> None:
        self.question_count = 0
        self.dollar_seen = False

    def question(self, source: SourceText, offset: int) -> Parameter:
        if self.dollar_seen:
            raise source.syntax_error(offset, "cannot mix ? and $n parameters")
        self.question_count += 1
        return Parameter(self.question_count)

    def dollar(self, source: SourceText, offset: int, index: int) -> Parameter:
        if self.question_count:
            raise source.syntax_error(offset, "cannot mix ? and $n parameters")
        if index < 1:
            raise source.syntax_error(offset, f"there is no parameter ${index}")
        self.dollar_seen = True
        return Parameter(index)


def _literal_value(source: SourceText, literal: re.Match[str], style: _ParameterStyle) -> Value:
    kind = literal.lastgroup
    if kind == "string":
        return literal.group("string").replace("''", "'")
    if kind == "number":
        number_text = literal.group("number")
        is_integer = not any(mark in number_text for mark in ".eE")
        return int(number_text) if is_integer else float(number_text)
    if kind == "keyword":
        return _KEYWORD_VALUES[literal.group("keyword").lower()]
    if kind == "dollar_param":
        return style.dollar(source, literal.start(), int(literal.group("dollar_param")))
    if kind == "question_param":
        return style.question(source, literal.start())
    if kind == "hex":
        return _hex_bytes(literal.group("hex"))
    typed_kind, typed_text = literal.group("typed_kind"), literal.group("typed_text")
    try:
        return parse_point_in_time(typed_text.replace("''", "'"), typed_kind)
    except ValueError as error:
        raise InvalidParameterValueError(
            f"invalid {typed_kind} literal '{typed_text}': {error}"
        ) from None


def _hex_bytes(digits: str) -> bytes:
    if len(digits) % 2:
        raise InvalidParameterValueError(
            f"invalid hexadecimal data X'{digits}': odd number of digits"
        )
    try:
        return bytes.fromhex(digits)
    except ValueError:
        raise InvalidParameterValueError(
            f"invalid hexadecimal data X'{digits}': only 0-9 and a-f are allowed"
        ) from None


# -- ISO-8601 literals -----------------------------------------------------------------------
_DURATION = re.compile(
    r"(?P<sign>[-+])?P(?!$)(?:(?P<weeks>\d+)W)?(?:(?P<days>\d+)D)?"
    r"(?:T(?=\d)(?:(?P<hours>\d+)H)?(?:(?P<minutes>\d+)M)?(?:(?P<seconds>\d+(?:[.,]\d{1,6})?)S)?)?$"
)
_CALENDAR_UNITS = re.compile(r"^[-+]?P(?:\d+[YWD])*\d+[YM]")
_POINT_IN_TIME = re.compile(
    r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?P<fraction>\.\d{1,6})?(?P<zone>Z|[+-]\d{2}:\d{2})$"
)


def parse_interval(text: str) -> timedelta:
    """An ISO-8601 duration (``PnW``, ``PnDTnHnMnS``, optional sign) as a timedelta.

    Raises ValueError with the reason. Years and months are refused: they have no
    fixed length.
    """
    upper = text.strip().upper()
    if _CALENDAR_UNITS.match(upper):
        raise ValueError("years and months have no fixed length; use days or weeks")
    match = _DURATION.match(upper)
    if match is None:
        raise ValueError("expected an ISO-8601 duration such as 'PT12H', 'P1D' or 'P2W'")
    parts = {name: match.group(name) or "0" for name in ("weeks", "days", "hours", "minutes")}
    seconds_text = (match.group("seconds") or "0").replace(",", ".")
    duration = timedelta(
        weeks=int(parts["weeks"]),
        days=int(parts["days"]),
        hours=int(parts["hours"]),
        minutes=int(parts["minutes"]),
        seconds=float(seconds_text) if "." in seconds_text else int(seconds_text),
    )
    return -duration if match.group("sign") == "-" else duration


def parse_point_in_time(text: str, kind: str = "Timestamp") -> datetime:
    """``2024-01-01T00:00:00Z`` (or with ``+hh:mm``) as an aware UTC datetime.

    ``Datetime`` has whole seconds, like YQL's type of that name. Raises ValueError.
    """
    match = _POINT_IN_TIME.match(text.strip())
    if match is None:
        raise ValueError("expected 'YYYY-MM-DDTHH:MM:SS[.ffffff]Z' or a +hh:mm offset")
    if kind.lower() == "datetime" and match.group("fraction"):
        raise ValueError("Datetime has whole seconds; use Timestamp for fractions")
    try:
        moment = datetime.fromisoformat(match.group().replace("Z", "+00:00"))
    except ValueError as error:
        raise ValueError(str(error)) from None
    return moment.astimezone(UTC)
