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
    assert measure.cache_info().currsize == 1  # type: ignore[attr-defined]


def test_the_sql_analysis_keeps_no_huge_statement() -> None:
    analyse_sql.cache_clear()  # type: ignore[attr-defined]
    values = ", ".join(["('" + "y" * 100 + "')"] * 2000)  # ~210 kB
    analyse_sql(f"INSERT INTO t VALUES {values}")
    analyse_sql("SELECT 1")
    assert analyse_sql.cache_info().currsize == 1  # type: ignore[attr-defined]
