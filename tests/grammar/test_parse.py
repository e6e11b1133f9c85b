"""Tests of grammar/parse.py: fixtures of statements and expected trees, then the
behaviours fixtures cannot show (positions, carets, limits, speed).

Fixture format (tests/fixtures/grammar):

- ``valid/*.sql``: SQL, then ``-- expect: <json>``; the JSON may continue on the
  following ``--`` lines up to a blank line. An object is the one statement the SQL
  holds; a list is every statement. Trees are written by ``plain`` below: class name
  under "type", positions and source text left out.
- ``invalid/*.sql``: ``-- error: <SQLSTATE> <part of the message>``, optionally
  ``-- at: <line>:<column>``, then the SQL, up to the next ``-- error:`` line.
"""

from __future__ import annotations

import dataclasses
import json
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from grammar import ast, tree_builder
from grammar.parse import SQL_TEXT_BYTES_MAX, parse, parse_one
from storage.errors import LimitExceededError, SqlSyntaxError, TopicbaseError

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "grammar"


def plain(node: object) -> Any:
    """A JSON-ready view of a tree without positions and source text."""
    if dataclasses.is_dataclass(node) and not isinstance(node, type):
        if isinstance(node, ast.Parameter):
            return f"${node.index}"
        fields: dict[str, Any] = {}
        for field in dataclasses.fields(node):
            value = getattr(node, field.name)
            if field.name in ("settings", "options"):
                fields[field.name] = {name: plain(item) for name, item in value}
            elif field.name not in ("position", "text"):
                fields[field.name] = plain(value)
        return {"type": type(node).__name__, **fields}
    if isinstance(node, tuple):
        return [plain(item) for item in node]
    if isinstance(node, timedelta):
        seconds = node.total_seconds()
        return f"Interval({int(seconds) if seconds.is_integer() else seconds}s)"
    if isinstance(node, datetime):
        return f"Timestamp({node.isoformat()})"
    if isinstance(node, bytes):
        return f"X'{node.hex()}'"
    return node


def read_valid_cases(path: Path) -> list[tuple[str, Any]]:
    cases: list[tuple[str, Any]] = []
    sql_lines: list[str] = []
    lines = path.read_text(encoding="utf-8").splitlines()
    index = 0
    while index < len(lines):
        line = lines[index]
        index += 1
        if not line.startswith("-- expect:"):
            sql_lines.append(line)
            continue
        json_lines = [line.removeprefix("-- expect:")]
        while index < len(lines) and lines[index].startswith("--"):
            json_lines.append(lines[index][2:])
            index += 1
        cases.append(("\n".join(sql_lines).strip(), json.loads("\n".join(json_lines))))
        sql_lines = []
    return cases


def read_invalid_cases(path: Path) -> list[tuple[str, str, str, str | None]]:
    """(sql, sqlstate, message part, "line:column" or None) for each case."""
    cases: list[tuple[str, str, str, str | None]] = []
    for block in path.read_text(encoding="utf-8").split("-- error:")[1:]:
        header, _, rest = block.partition("\n")
        sqlstate, _, message_part = header.strip().partition(" ")
        at = None
        if rest.startswith("-- at:"):
            at_line, _, rest = rest.partition("\n")
            at = at_line.removeprefix("-- at:").strip()
        cases.append((rest.strip(), sqlstate, message_part.strip(), at))
    return cases


def _case_id(path: Path, number: int, sql: str) -> str:
    first_line = next((line for line in sql.splitlines() if not line.startswith("--")), "")
    return f"{path.stem}-{number}-{first_line[:40]}"


VALID = [
    pytest.param(sql, expected, id=_case_id(path, number, sql))
    for path in sorted((FIXTURES / "valid").glob("*.sql"))
    for number, (sql, expected) in enumerate(read_valid_cases(path), start=1)
]
INVALID = [
    pytest.param(sql, sqlstate, part, at, id=_case_id(path, number, sql))
    for path in sorted((FIXTURES / "invalid").glob("*.sql"))
    for number, (sql, sqlstate, part, at) in enumerate(read_invalid_cases(path), start=1)
]


@pytest.mark.parametrize(("sql", "expected"), VALID)
def test_valid_fixture_parses_to_expected_tree(sql: str, expected: Any) -> None:
    statements = parse(sql)
    actual = plain(statements[0]) if isinstance(expected, dict) else plain(tuple(statements))
    if isinstance(expected, dict):
        assert len(statements) == 1
    assert actual == expected


@pytest.mark.parametrize(("sql", "sqlstate", "message_part", "at"), INVALID)
def test_invalid_fixture_is_refused_with_sqlstate_and_message(
    sql: str, sqlstate: str, message_part: str, at: str | None
) -> None:
    with pytest.raises(TopicbaseError) as raised:
        parse(sql)
    error = raised.value
    assert error.sqlstate == sqlstate, str(error)
    assert message_part in str(error)
    if at is not None:
        line = getattr(error, "line", None) or error.context.get("line")
        column = getattr(error, "column", None) or error.context.get("column")
        assert f"{line}:{column}" == at


def test_fixture_files_are_not_empty() -> None:
    assert len(VALID) > 90
    assert len(INVALID) > 100


# -- positions and source text -----------------------------------------------------------
def test_statement_positions_and_text_are_absolute_in_the_script() -> None:
    script = "-- header\nBEGIN;\n\n  /* c */ SHOW TOPICS ;\nDROP TOPIC\n  t"
    begin, show, drop = parse(script)
    assert begin.position == ast.SourcePosition(line=2, column=1, offset=10)
    assert begin.text == "BEGIN"
    assert show.position == ast.SourcePosition(line=4, column=11, offset=28)
    assert show.text == "SHOW TOPICS"
    assert drop.position.line == 5
    assert drop.text == "DROP TOPIC\n  t"


def test_nested_nodes_carry_their_own_positions() -> None:
    create = parse_one("CREATE TOPIC t (\n  CONSUMER a,\n  CONSUMER b WITH (important = true))")
    assert isinstance(create, ast.CreateTopic)
    assert [consumer.position.line for consumer in create.consumers] == [2, 3]
    assert create.consumers[1].position.column == 3


def test_topic_scan_position_points_at_the_topic_keyword() -> None:
    statement = parse("SELECT 1;\nSELECT *\n  FROM TOPIC events")[1]
    assert isinstance(statement, ast.SqlStatement)
    assert statement.topic_scans[0].position == ast.SourcePosition(line=3, column=8, offset=26)


def test_insert_query_keeps_its_own_text_and_rewritten_sql() -> None:
    insert = parse_one("INSERT INTO TOPIC a SELECT data FROM TOPIC b WITH (consumer = 'c')")
    assert isinstance(insert, ast.InsertTopic) and insert.query is not None
    assert insert.query.text == "SELECT data FROM TOPIC b WITH (consumer = 'c')"
    assert insert.query.sql == "SELECT data FROM __topic_scan_0"
    assert insert.query.position.column == 21


# -- syntax errors --------------------------------------------------------------------------
def test_syntax_error_shows_line_and_caret_under_the_column() -> None:
    with pytest.raises(SqlSyntaxError) as raised:
        parse("CREATE TOPICC x")
    # The caret stands under the first character of the token, as in PostgreSQL.
    assert str(raised.value) == (
        'syntax error at or near "TOPICC"\nLINE 1: CREATE TOPICC x\n' + " " * 15 + "^"
    )
    assert (raised.value.line, raised.value.column) == (1, 8)


def test_syntax_error_position_is_absolute_in_a_multi_line_script() -> None:
    with pytest.raises(SqlSyntaxError) as raised:
        parse("SELECT 1;\nSELECT 2;\nALTER TOPIC t\n  ADDD CONSUMER c")
    assert (raised.value.line, raised.value.column) == (4, 3)
    assert str(raised.value).endswith("LINE 4:   ADDD CONSUMER c\n          ^")


def test_syntax_error_at_end_of_input_points_past_the_last_token() -> None:
    with pytest.raises(SqlSyntaxError) as raised:
        parse("DROP TOPIC")
    assert str(raised.value).startswith("syntax error at end of input")
    assert (raised.value.line, raised.value.column) == (1, 11)


def test_sqlglot_error_maps_back_through_placeholders_to_the_original_column() -> None:
    with pytest.raises(SqlSyntaxError) as raised:
        parse("SELECT * FROM TOPIC a WITH (consumer = 'c') JOIN TOPIC b ON WHERE")
    assert (raised.value.line, raised.value.column) == (1, 61)
    assert 'near "WHERE"' in str(raised.value)


def test_settings_error_context_carries_the_setting_position() -> None:
    with pytest.raises(TopicbaseError) as raised:
        parse("CREATE TOPIC t WITH (\n  retention_period = 5)")
    assert raised.value.sqlstate == "22023"
    assert raised.value.context["line"] == 2
    assert raised.value.context["column"] == 3


# -- limits and whole-script behaviour -----------------------------------------------------
def test_script_over_the_length_limit_is_refused_with_54000() -> None:
    with pytest.raises(LimitExceededError) as raised:
        parse("SELECT 1" + " " * SQL_TEXT_BYTES_MAX)
    assert raised.value.sqlstate == "54000"


def test_length_limit_counts_utf8_bytes_not_characters() -> None:
    text = "SELECT '" + "é" * (SQL_TEXT_BYTES_MAX // 2) + "'"
    with pytest.raises(LimitExceededError):
        parse(text)


def test_empty_script_has_no_statements() -> None:
    assert parse("") == []
    assert parse(" ;; -- only a comment\n /* and another */ ;") == []


def test_parse_one_refuses_zero_or_several_statements() -> None:
    with pytest.raises(SqlSyntaxError, match="got 0"):
        parse_one("  ")
    with pytest.raises(SqlSyntaxError, match="got 2"):
        parse_one("BEGIN; COMMIT")


def test_statement_objects_are_frozen_and_hashable() -> None:
    text = "CREATE TOPIC t WITH (retention_period = Interval('PT1H'))"
    statement = parse_one(text)
    assert hash(statement) == hash(parse_one(text))
    with pytest.raises(dataclasses.FrozenInstanceError):
        statement.name = "u"  # type: ignore[misc]


def test_keywords_are_case_insensitive_everywhere() -> None:
    lower = parse(
        "create topic t (consumer c with (IMPORTANT = TRUE)) "
        "with (Retention_Period = interval('pt1h'))"
    )
    upper = parse(
        "CREATE TOPIC t (CONSUMER c WITH (important = true)) "
        "WITH (retention_period = INTERVAL('PT1H'))"
    )
    assert plain(tuple(lower)) == plain(tuple(upper))


def test_plain_sql_without_topic_is_kept_unchanged() -> None:
    text = "SELECT $$a; b$$, 'it''s' FROM t /* ; */ WHERE x = ?"
    statement = parse_one(text)
    assert statement == ast.SqlStatement(text, (), ast.SourcePosition(1, 1, 0), text)


# -- speed ------------------------------------------------------------------------------------
def test_five_thousand_literal_rows_go_through_lark_once_not_per_row(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rows = ",\n".join(
        f"('message {number}', 'producer-{number % 5}', {number})" for number in range(5_000)
    )
    text = f"INSERT INTO TOPIC events (data, producer_id, seq_no) VALUES {rows} RETURNING *"
    lark_calls: list[str] = []
    real_parse = tree_builder.PARSER.parse

    def counting_parse(statement_text: str, start: str) -> object:
        lark_calls.append(start)
        return real_parse(statement_text, start=start)

    monkeypatch.setattr(tree_builder.PARSER, "parse", counting_parse)
    started = time.perf_counter()
    insert = parse_one(text)
    elapsed_seconds = time.perf_counter() - started
    assert isinstance(insert, ast.InsertTopic) and insert.values is not None
    assert len(insert.values) == 5_000
    assert insert.values[4_999] == ("message 4999", "producer-4", 4999)
    assert lark_calls == ["statement"]  # the head and tail only
    # About 0.1 s on an idle machine; the bound only catches a pathological slowdown.
    assert elapsed_seconds < 2.0


def test_rows_with_comments_between_literals_still_take_the_fast_path() -> None:
    insert = parse_one(
        "INSERT INTO TOPIC t (data, seq_no) VALUES ( 'a' /* x */ , -- y\n 1 ), ('b',2)"
    )
    assert isinstance(insert, ast.InsertTopic)
    assert insert.values == (("a", 1), ("b", 2))
