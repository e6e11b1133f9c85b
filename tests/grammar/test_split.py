"""Tests of grammar/split.py: statement splitting, tokens, literal rows and ISO-8601
literals."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grammar import split
from grammar.ast import Parameter, SourcePosition
from storage.errors import SqlSyntaxError


def texts(script: str) -> list[str]:
    return [text for text, _ in split.split_statements(script)]


# -- splitting ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("script", "expected"),
    [
        ("SELECT 1; SELECT 2", ["SELECT 1", "SELECT 2"]),
        ("SELECT 'a;b'; SELECT 'it''s;'", ["SELECT 'a;b'", "SELECT 'it''s;'"]),
        (r"SELECT E'it\'s;' ; SELECT 2", [r"SELECT E'it\'s;'", "SELECT 2"]),
        ('SELECT "a;""b"; SELECT 2', ['SELECT "a;""b"', "SELECT 2"]),
        ("CREATE TOPIC `a;b`; DROP TOPIC `c``;`", ["CREATE TOPIC `a;b`", "DROP TOPIC `c``;`"]),
        ("SELECT 1 -- a; b\n, 2; SELECT 3", ["SELECT 1 -- a; b\n, 2", "SELECT 3"]),
        ("SELECT /* a; /* b; */ c; */ 1; SELECT 2", ["SELECT /* a; /* b; */ c; */ 1", "SELECT 2"]),
        ("SELECT $$a;b$$; SELECT 2", ["SELECT $$a;b$$", "SELECT 2"]),
        ("SELECT $fn$ a; $$ ; $fn$; SELECT 2", ["SELECT $fn$ a; $$ ; $fn$", "SELECT 2"]),
        ("SELECT $1; SELECT a$b$c; SELECT 2", ["SELECT $1", "SELECT a$b$c", "SELECT 2"]),
        ("SELECT 5-3/2; SELECT 1", ["SELECT 5-3/2", "SELECT 1"]),
        (";;  ; -- nothing\n/* at all */;", []),
        ("  -- lead\n /* lead */ SELECT 1 /* trail */ -- trail\n ;", ["SELECT 1"]),
        ("SELECT 1", ["SELECT 1"]),
        ("", []),
    ],
)
def test_split_cuts_only_at_semicolons_outside_quotes_and_comments(
    script: str, expected: list[str]
) -> None:
    assert texts(script) == expected


def test_split_reports_the_position_of_each_first_token() -> None:
    script = "SELECT 1;\n  -- note\n  SELECT\n 2 ;  SHOW TOPICS"
    assert split.split_statements(script) == [
        ("SELECT 1", SourcePosition(1, 1, 0)),
        ("SELECT\n 2", SourcePosition(3, 3, 22)),
        ("SHOW TOPICS", SourcePosition(4, 7, 35)),
    ]


def test_a_script_with_escape_strings_takes_the_slow_path_and_agrees() -> None:
    plain = "SELECT 'a;b', \"c;d\"; SELECT 2"
    escaped = plain + r"; SELECT e'\';'"
    assert texts(escaped) == [*texts(plain), r"SELECT e'\';'"]


@pytest.mark.parametrize(
    ("script", "message", "position"),
    [
        ("SELECT 'abc", "unterminated quoted string", (1, 8)),
        ("SELECT 1;\nSELECT E'a\\'", "unterminated quoted string", (2, 9)),
        ('SELECT "abc', "unterminated quoted identifier", (1, 8)),
        ("DROP TOPIC `abc", "unterminated quoted identifier", (1, 12)),
        ("SELECT /* a /* b */", "unterminated /* comment", (1, 8)),
        ("SELECT $x$ abc $y$", "unterminated dollar-quoted string", (1, 8)),
    ],
)
def test_unterminated_quotes_and_comments_are_syntax_errors_at_their_start(
    script: str, message: str, position: tuple[int, int]
) -> None:
    with pytest.raises(SqlSyntaxError, match=re.escape(message)) as raised:
        split.split_statements(script)
    assert (raised.value.line, raised.value.column) == position


_FRAGMENTS = st.sampled_from(
    [
        *("SELECT", "1", "x", "'a;b'", "'it''s'", '"q;"', "`p;q`", "$$d;$$", "$t$ ; $t$"),
        *("/* ; */", "-- c;\n", "(", ")", ",", "E'\\';'", "$1", "a$b"),
    ]
)
_STATEMENTS = st.lists(_FRAGMENTS, min_size=0, max_size=8).map(
    lambda fragments: " ".join(["SELECT", *fragments, "END_MARK"])
)


@settings(max_examples=30, deadline=None)
@given(st.lists(_STATEMENTS, min_size=1, max_size=5))
def test_joined_statements_split_back_into_the_same_statements(statements: list[str]) -> None:
    assert texts(";\n".join(statements)) == statements


# -- tokens ---------------------------------------------------------------------------------
def test_tokens_skip_comments_and_keep_quoted_items_whole() -> None:
    source = split.SourceText("SELECT /* c */ 'a''b', \"q\" -- x\n FROM `t`.x WHERE y <> $1 ::INT")
    tokens = [(token.kind, token.text) for token in split.tokenize(source, 0, len(source.text))]
    assert tokens == [
        ("word", "SELECT"),
        ("string", "'a''b'"),
        ("punct", ","),
        ("quoted", '"q"'),
        ("word", "FROM"),
        ("backquoted", "`t`"),
        ("punct", "."),
        ("word", "x"),
        ("word", "WHERE"),
        ("word", "y"),
        ("punct", "<>"),
        ("param", "$1"),
        ("punct", "::"),
        ("word", "INT"),
    ]


def test_syntax_error_near_a_word_reports_the_whole_word() -> None:
    error = split.SourceText("ALTER TOPIC t ADDD").error_near(16)
    assert 'near "ADDD"' in str(error)
    assert error.column == 15


# -- literal rows ------------------------------------------------------------------------------
def _scan(text: str, width: int = 0) -> tuple[list[tuple[object, ...]], int] | None:
    return split.scan_value_rows(split.SourceText(text), 0, len(text), width)


def test_rows_of_literals_are_read_with_their_end_offset() -> None:
    text = (
        "('a', 1, -2.5e1, NULL, TRUE, false, X'0aFF', $2), ('b''c', +3, .5, $4, 1, 1, X'', $1) tail"
    )
    rows, end = _scan(text)  # type: ignore[misc]
    assert rows == [
        ("a", 1, -25.0, None, True, False, b"\n\xff", Parameter(2)),
        ("b'c", 3, 0.5, Parameter(4), 1, 1, b"", Parameter(1)),
    ]
    assert text[end:] == "tail"


def test_typed_timestamps_in_rows_become_utc_datetimes() -> None:
    rows, _ = _scan("(Timestamp('2024-01-01T02:00:00+02:00'), datetime ( '2024-01-01T00:00:00Z' ))")  # type: ignore[misc]
    moment = datetime(2024, 1, 1, tzinfo=UTC)
    assert rows == [(moment, moment)]


@pytest.mark.parametrize(
    "text",
    [
        "(upper('a'))",
        "('a' || 'b')",
        "(1 + 2)",
        "(CAST(1 AS INT))",
        "('a'),",
        "()",
        "('a'",
        "(1abc)",
    ],
)
def test_anything_but_plain_literals_hands_the_body_to_the_sql_path(text: str) -> None:
    assert _scan(text) is None
    assert _scan(text, width=1) is None


def test_question_mark_parameters_are_numbered_in_order_and_not_mixed() -> None:
    rows, _ = _scan("(?, ?), (?, ?)", width=2)  # type: ignore[misc]
    assert rows == [(Parameter(1), Parameter(2)), (Parameter(3), Parameter(4))]
    with pytest.raises(SqlSyntaxError, match="cannot mix"):
        _scan("(?, $1)")


_LITERALS = st.one_of(
    st.text(alphabet="ab';, -", max_size=6).map(lambda text: "'" + text.replace("'", "''") + "'"),
    st.integers(min_value=-(10**20), max_value=10**20).map(str),
    st.sampled_from(["NULL", "true", "FALSE", "X'00ff'", "$3", "1.5", "-0.25e2"]),
)


@settings(max_examples=40, deadline=None)
@given(
    st.integers(min_value=1, max_value=8).flatmap(
        lambda width: st.lists(
            st.lists(_LITERALS, min_size=width, max_size=width), min_size=1, max_size=6
        )
    )
)
def test_the_row_regex_and_the_literal_scanner_agree(rows: list[list[str]]) -> None:
    text = ", ".join("(" + " , ".join(row) + ")" for row in rows)
    assert _scan(text, width=len(rows[0])) == _scan(text, width=0)
    scanned = _scan(text)
    assert scanned is not None and len(scanned[0]) == len(rows)


# -- ISO-8601 literals ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("PT12H", timedelta(hours=12)),
        ("P1D", timedelta(days=1)),
        ("P2W", timedelta(weeks=2)),
        ("p1dt2h3m4s", timedelta(days=1, hours=2, minutes=3, seconds=4)),
        ("PT0.5S", timedelta(milliseconds=500)),
        ("PT1,25S", timedelta(seconds=1.25)),
        ("-PT1M", timedelta(minutes=-1)),
        ("P1W1D", timedelta(days=8)),
    ],
)
def test_iso_durations_become_timedeltas(text: str, expected: timedelta) -> None:
    assert split.parse_interval(text) == expected


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("P", "expected an ISO-8601 duration"),
        ("PT", "expected an ISO-8601 duration"),
        ("P1DT", "expected an ISO-8601 duration"),
        ("PT1H2", "expected an ISO-8601 duration"),
        ("12H", "expected an ISO-8601 duration"),
        ("PT0.0000001S", "expected an ISO-8601 duration"),
        ("P1Y", "years and months"),
        ("P1M", "years and months"),
    ],
)
def test_malformed_or_calendar_durations_are_refused(text: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        split.parse_interval(text)


@pytest.mark.parametrize(
    ("text", "kind", "expected"),
    [
        ("2024-01-01T00:00:00Z", "Timestamp", datetime(2024, 1, 1, tzinfo=UTC)),
        ("2024-01-01 05:30:00+05:30", "Datetime", datetime(2024, 1, 1, tzinfo=UTC)),
        ("2024-01-01T00:00:00.123456Z", "Timestamp", datetime(2024, 1, 1, 0, 0, 0, 123456, UTC)),
    ],
)
def test_points_in_time_become_aware_utc_datetimes(
    text: str, kind: str, expected: datetime
) -> None:
    moment = split.parse_point_in_time(text, kind)
    assert moment == expected and moment.tzinfo is UTC


@pytest.mark.parametrize(
    ("text", "kind", "reason"),
    [
        ("2024-01-01T00:00:00", "Timestamp", "expected 'YYYY-MM-DDTHH:MM:SS"),
        ("2024-01-01", "Timestamp", "expected 'YYYY-MM-DDTHH:MM:SS"),
        ("2024-02-30T00:00:00Z", "Timestamp", "day is out of range"),
        ("2024-01-01T00:00:00.5Z", "Datetime", "whole seconds"),
    ],
)
def test_points_in_time_without_zone_or_impossible_are_refused(
    text: str, kind: str, reason: str
) -> None:
    with pytest.raises(ValueError, match=reason):
        split.parse_point_in_time(text, kind)
