"""Tests of sql/formatting.py: how values, result tables and errors read as text."""

from __future__ import annotations

import datetime
import decimal
import io
import json

import pyarrow as pa
import pytest

from sql import formatting
from storage.errors import InvalidParameterValueError, SqlSyntaxError


@pytest.mark.parametrize(
    ("data", "text"),
    [
        (b"hello", "hello"),
        ("żółw;\n\t".encode(), "żółw;\n\t"),
        (b"\xff\x00", "\\xff00"),  # not UTF-8
        (b"a\x00b", "\\x610062"),  # UTF-8, but a control character
        (b"", ""),
    ],
)
def test_bytes_read_as_text_when_printable_utf8_else_as_bytea_hex(data: bytes, text: str) -> None:
    assert formatting.bytes_text(data) == text


def test_json_values_keep_types_and_turn_the_rest_into_text() -> None:
    moment = datetime.datetime(2024, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)
    value = {
        "n": 1,
        "flag": True,
        "nan": float("nan"),
        "inf": float("-inf"),
        "exact": decimal.Decimal("1.10"),
        "at": moment,
        "map": [("k", b"v")],
        "list": [1, None],
    }
    assert json.loads(json.dumps(formatting.json_value(value))) == {
        "n": 1,
        "flag": True,
        "nan": "NaN",
        "inf": "-Infinity",
        "exact": "1.10",
        "at": "2024-01-02T03:04:05+00:00",
        "map": {"k": "v"},
        "list": [1, None],
    }


def test_text_values_of_null_bool_and_nested() -> None:
    assert formatting.text_value(None) == ""
    assert formatting.text_value(False) == "false"
    assert formatting.text_value({"a": [1, 2]}) == '{"a": [1, 2]}'


def test_table_format_aligns_like_psql_and_counts_rows() -> None:
    table = pa.table({"n": [1, 22], "name": ["a", None], "note": ["x\ny", "z"]})
    out = io.StringIO()
    formatting.write_table(table, out)
    assert out.getvalue().splitlines() == [
        " n  | name | note",
        "----+------+------",
        "  1 | a    | x\\ny",
        " 22 |      | z",
        "(2 rows)",
    ]


def test_csv_and_json_formats_stream_rows() -> None:
    table = pa.table({"a": [1, None], "b": ["x,y", 'q"']})
    out = io.StringIO()
    formatting.write_csv(table, out)
    assert out.getvalue() == 'a,b\n1,"x,y"\n,"q"""\n'
    out = io.StringIO()
    formatting.write_json(table, out)
    assert out.getvalue() == '{"a": 1, "b": "x,y"}\n{"a": null, "b": "q\\""}\n'


def test_error_text_keeps_sqlstate_and_message_and_adds_a_caret_from_the_position() -> None:
    script = "SELECT 1;\nSELECT * FROM TOPIC t WITH (partiton = 1)"
    error = InvalidParameterValueError('unknown read option "partiton"', line=2, column=29)
    assert formatting.error_text(error, script).splitlines() == [
        'ERROR: 22023: unknown read option "partiton"',
        "LINE 2: SELECT * FROM TOPIC t WITH (partiton = 1)",
        " " * 36 + "^",
    ]
    with_caret = SqlSyntaxError("bad\nLINE 1: x\n        ^", line=1, column=1)
    assert formatting.error_text(with_caret, "x") == "ERROR: 42601: bad\nLINE 1: x\n        ^"


def test_errors_that_are_not_topicbase_errors_are_xx000_and_ctrl_c_is_57014() -> None:
    assert formatting.error_text(RuntimeError("boom")) == "ERROR: XX000: RuntimeError: boom"
    assert formatting.error_text(KeyboardInterrupt()) == (
        "ERROR: 57014: canceling statement due to user request"
    )
