"""Text-keyed caches keep short statements and never hold long ones."""

from __future__ import annotations

from grammar.text_cache import text_cache
from planner.planner import analyse_sql
from storage import limits


def test_short_texts_are_cached_and_long_ones_computed_each_time() -> None:
    calls: list[int] = []

    @text_cache(8)
    def measure(text: str) -> int:
        calls.append(len(text))
        return len(text)

    short = "SELECT 1"
    long = "SELECT '" + "x" * limits.CACHED_TEXT_CHARS_MAX + "'"
    assert [measure(short), measure(short)] == [len(short)] * 2
    assert [measure(long), measure(long)] == [len(long)] * 2
    assert calls == [len(short), len(long), len(long)]
    assert len(measure.cache) == 1  # type: ignore[attr-defined]


def test_the_sql_analysis_keeps_no_huge_statement() -> None:
    analyse_sql.cache_clear()  # type: ignore[attr-defined]
    values = ", ".join(["('" + "y" * 100 + "')"] * 2000)  # ~210 kB
    analyse_sql(f"INSERT INTO t VALUES {values}")
    analyse_sql("SELECT 1")
    assert len(analyse_sql.cache) == 1  # type: ignore[attr-defined]


def test_the_query_over_a_topic_read_is_worked_out_once_per_text(monkeypatch) -> None:
    """A move's ``INSERT INTO TOPIC b SELECT data FROM TOPIC a ...`` planned again (every
    transaction) takes its query from the cache (``planner._query_over``): no
    ``dataclasses.replace`` of the analysis, the same immutable query as the first time,
    equal to the query worked out afresh."""
    from grammar.parse import parse
    from planner import planner
    from planner.catalog import TopicInfo

    class Catalog:
        def topic(self, name: str) -> TopicInfo | None:
            if name not in ("a", "b"):
                return None
            return TopicInfo(name, f"id-{name}", {}, {"mover": {}}, (0, 1), (0, 1))

        def topic_names(self) -> list[str]:
            return ["a", "b"]

    (statement,) = parse("INSERT INTO TOPIC b SELECT data FROM TOPIC a "
                         "WITH (consumer = 'mover', max_messages = 100)")  # fmt: skip
    planner._query_over.cache_clear()  # type: ignore[attr-defined]
    first = planner.plan(statement, Catalog())
    replaced: list[object] = []
    original = planner.replace
    monkeypatch.setattr(planner, "replace", lambda *a, **k: replaced.append(a) or original(*a, **k))
    again = planner.plan(statement, Catalog())
    assert again == first
    (query,) = [o for o in again.operations if isinstance(o, planner.RunQuery)]
    assert any(o is query for o in first.operations)  # the very query, kept
    assert not [a for a in replaced if isinstance(a[0], planner.RunQuery)]
