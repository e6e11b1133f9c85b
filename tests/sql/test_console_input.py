"""Tests of the console's input handling (sql/console.py) that need no terminal."""

from __future__ import annotations

import pytest

from sql.console import parse_arguments, statement_complete, unquote_name


@pytest.mark.parametrize(
    ("text", "complete"),
    [
        ("", True),
        ("SELECT 1;", True),
        ("SELECT 1", False),
        ("CREATE TOPIC t\n  WITH (min_active_partitions = 2);", True),
        ("SELECT 'a;b'", False),
        ("SELECT 'a;", False),  # an unterminated string: keep reading
        ("SELECT 1 -- done;", False),
        ("SELECT 1; -- trailing comment", True),
        ("SELECT 1 /* ; */", False),
        ("SELECT $$;$$", False),
        ("SELECT 1; SELECT 2", False),
        ("\\d events", True),
    ],
)
def test_input_is_complete_once_a_semicolon_outside_strings_and_comments_ends_it(
    text: str, complete: bool
) -> None:
    assert statement_complete(text) is complete


def test_command_and_file_options_keep_their_order() -> None:
    arguments = parse_arguments(["-c", "SELECT 1", "-f", "a.sql", "-c", "SELECT 2"])
    assert arguments.actions == [
        ("command", "SELECT 1"),
        ("file", "a.sql"),
        ("command", "SELECT 2"),
    ]
    assert arguments.format == "table"


def test_describe_argument_may_be_quoted() -> None:
    assert unquote_name("`dir/events`;") == "dir/events"
    assert unquote_name('"my table"') == "my table"
    assert unquote_name("plain") == "plain"
