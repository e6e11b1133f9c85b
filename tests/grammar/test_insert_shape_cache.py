"""The INSERT INTO TOPIC skeleton cache (``grammar.insert_topic``) is exactly a fresh parse.

The cached path keys the statement object of an INSERT's head and tail by the skeleton's
shape (rows cut out, padding cut to one blank) and sets the real ``position`` and
``text`` on every use. Property: over every statement the tests and the grammar fixtures
hold, and variants of each with longer and shorter literals, ``parse`` gives equal
statements (positions and text included) or equal errors (class, SQLSTATE, message and
context, so line and column) with the cache cold, warm and switched off.
"""

from __future__ import annotations

import ast as python_ast
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from grammar import insert_topic, tree_builder
from grammar.parse import parse
from storage.errors import SqlSyntaxError, TopicbaseError

TESTS = Path(__file__).resolve().parents[1]
FIXTURES = TESTS / "fixtures" / "grammar"
_STRING = re.compile(r"'((?:[^']|'')*)'")
_NUMBER = re.compile(r"(?<![\w.$])(-?\d+)(?![\w.])")


def _fixture_texts() -> Iterator[str]:
    for path in sorted(FIXTURES.glob("*/*.sql")):
        chunks = re.split(r"(?m)^-- error:.*$", path.read_text(encoding="utf-8"))
        yield from (chunk for chunk in chunks if chunk.strip())


def _test_strings() -> Iterator[str]:
    """Every string constant in the tests that looks like an INSERT INTO TOPIC."""
    for path in sorted(TESTS.rglob("*.py")):
        try:
            tree = python_ast.parse(path.read_text(encoding="utf-8"))
        except SyntaxError:  # pragma: no cover - every test file parses
            continue
        for node in python_ast.walk(tree):
            if (
                isinstance(node, python_ast.Constant)
                and isinstance(node.value, str)
                and re.search(r"insert\s+into\s+topic", node.value, re.IGNORECASE)
            ):
                yield node.value


def _variants(text: str) -> Iterator[str]:
    """``text``, and copies whose literals are longer, shorter, negative, NULL or TRUE."""
    yield text
    yield _STRING.sub(lambda m: "'" + m.group(1) + "xyz" * 7 + "'", text)
    yield _STRING.sub("''", text)
    yield _STRING.sub("NULL", text, count=1)
    yield _NUMBER.sub(lambda m: str(-int(m.group(1)) * 1000 - 7), text)
    yield _NUMBER.sub("TRUE", text, count=1)
    yield "\n  " + text.replace("VALUES", "VALUES\n   ", 1)


def corpus() -> list[str]:
    texts = dict.fromkeys(v for t in [*_fixture_texts(), *_test_strings()] for v in _variants(t))
    return [t for t in texts if re.search(r"insert\s+into\s+topic", t, re.IGNORECASE)]


def _refusing(shape: str) -> insert_topic.InsertTopic:
    """The fresh path: every skeleton is parsed with its padding, as before the cache."""
    raise SqlSyntaxError("shape cache switched off")


def outcome(text: str) -> Any:
    """``parse(text)``'s statements, or its error as comparable values."""
    try:
        return ("ok", parse(text))
    except TopicbaseError as error:
        return ("error", type(error), error.sqlstate, str(error), dict(error.context))


@pytest.fixture(scope="module")
def cold() -> tuple[list[str], list[Any]]:
    """The corpus and each text's ``outcome`` with the skeleton cache cleared first (built
    once: reading every test file for it costs more than the parses)."""
    texts = corpus()
    insert_topic._skeleton_statement.cache_clear()  # type: ignore[attr-defined]
    return texts, [outcome(t) for t in texts]


def test_the_corpus_is_large_and_varied(cold: tuple[list[str], list[Any]]) -> None:
    texts, results = cold
    assert len(texts) > 500
    assert sum(r[0] == "ok" for r in results) > 200
    assert sum(r[0] == "error" for r in results) > 50


def test_cached_and_fresh_parses_are_equal(
    cold: tuple[list[str], list[Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    texts, cold_outcomes = cold
    warm = [outcome(t) for t in texts]
    with monkeypatch.context() as patch:
        patch.setattr(insert_topic, "_skeleton_statement", _refusing)
        fresh = [outcome(t) for t in texts]
    for text, a, b, c in zip(texts, cold_outcomes, warm, fresh, strict=True):
        assert a == c, text
        assert b == c, text


def test_each_statement_of_a_script_keeps_its_own_position_and_text() -> None:
    script = (
        "INSERT INTO TOPIC t VALUES ('a');\n"
        "  INSERT INTO TOPIC t VALUES ('bbbbbbbb');\n"
        "INSERT INTO TOPIC t VALUES ('c') WITH (producer_id = 'p', partition = 3)"
    )
    first, second, third = parse(script)
    assert (first.position.line, second.position.line, third.position.line) == (1, 2, 3)
    assert second.position.column == 3
    assert second.text == "INSERT INTO TOPIC t VALUES ('bbbbbbbb')"
    assert [s.values for s in (first, second, third)] == [(("a",),), (("bbbbbbbb",),), (("c",),)]
    assert dict(third.options) == {"producer_id": "p", "partition": 3}


def test_an_error_after_the_rows_points_at_the_real_text() -> None:
    """The shape is shorter than the statement: a cached shape's error offsets would be
    wrong, so errors come from the padded skeleton."""
    for rows in ("('a')", "('" + "x" * 300 + "')"):
        with pytest.raises(TopicbaseError) as caught:
            parse(f"INSERT INTO TOPIC t VALUES {rows}\n  WITH (no_such_option = 1)")
        assert caught.value.context.get("line") == 2, caught.value.context
        assert caught.value.context.get("column") == 9, caught.value.context


def test_inserts_that_differ_only_in_rows_run_the_grammar_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[str] = []
    real = tree_builder.PARSER.parse

    def counting(text: str, *args: Any, **kwargs: Any) -> Any:
        calls.append(text)
        return real(text, *args, **kwargs)

    monkeypatch.setattr(tree_builder.PARSER, "parse", counting)
    insert_topic._skeleton_statement.cache_clear()  # type: ignore[attr-defined]
    for i in range(50):
        statement = parse(f"INSERT INTO TOPIC orders (data) VALUES ('{'m' * i}{i}')")[0]
        assert statement.values == ((f"{'m' * i}{i}",),)
    assert len(calls) == 1
    parse("INSERT INTO TOPIC orders (data) VALUES ('x') RETURNING offset")
    assert len(calls) == 2  # another tail is another shape
