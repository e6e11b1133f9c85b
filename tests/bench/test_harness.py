"""The benchmark harness's logic: alternation, spreads, ratio direction, record schema."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from bench import harness
from bench.harness import Side, Spread, alternate
from bench.results import FIELDS, Recorder, load_records, merge_records, render_markdown


def _recorder(tmp_path: Path) -> Recorder:
    return Recorder(
        "quick",
        json_path=str(tmp_path / "results.json"),
        md_path=str(tmp_path / "RESULTS.md"),
        stream=io.StringIO(),
    )


def test_sides_alternate_repetition_by_repetition() -> None:
    order: list[tuple[str, int]] = []

    def side(name: str) -> Side:
        return Side(name, lambda rep: order.append((name, rep)) or float(rep))

    alternate([side("topicbase"), side("postgres"), side("redis")], 3)
    assert order == [
        ("topicbase", 0), ("postgres", 0), ("redis", 0),
        ("topicbase", 1), ("postgres", 1), ("redis", 1),
        ("topicbase", 2), ("postgres", 2), ("redis", 2),
    ]  # fmt: skip


def test_alternate_collects_every_metric_of_every_repetition() -> None:
    values = iter([10.0, 1.0, 30.0, 3.0, 20.0, 2.0])
    result = alternate(
        [
            Side("a", lambda rep: {"rate": next(values), "rep": rep}),
            Side("b", lambda rep: next(values)),
        ],
        3,
    )
    assert result["a"]["rate"].samples == (10.0, 30.0, 20.0)
    assert result["a"]["rep"].samples == (0.0, 1.0, 2.0)
    assert result["b"][harness.VALUE].samples == (1.0, 3.0, 2.0)


def test_alternate_refuses_a_side_whose_metrics_change() -> None:
    with pytest.raises(AssertionError, match="metrics"):
        alternate([Side("a", lambda rep: {"x": 1.0} if rep == 0 else {"y": 1.0})], 2)


def test_alternate_refuses_duplicate_names_and_zero_reps() -> None:
    with pytest.raises(AssertionError):
        alternate([Side("a", lambda rep: 1.0), Side("a", lambda rep: 2.0)], 1)
    with pytest.raises(AssertionError):
        alternate([Side("a", lambda rep: 1.0)], 0)


def test_spread_is_median_min_max() -> None:
    spread = Spread.of([5.0, 1.0, 3.0, 100.0])
    assert (spread.median, spread.low, spread.high, spread.reps) == (4.0, 1.0, 100.0, 4)
    assert Spread.of([2.0, 9.0, 4.0]).median == 4.0


def test_ratio_is_higher_is_better_in_both_directions(tmp_path: Path) -> None:
    rec = _recorder(tmp_path)
    fast = harness.record(
        rec, "tput", Spread.of([200, 300, 250]), Spread.of([100, 100, 125]),
        unit="msgs/s", group="g", baseline="PostgreSQL", target_ratio=1.5,
    )  # fmt: skip
    assert fast["ratio"] == 2.5  # 250 / 100
    assert (fast["ratio_min"], fast["ratio_max"]) == (2.0, 3.0)  # per repetition
    assert fast["met"] is True and fast["target"] == ">= 1.5x PostgreSQL"
    slow = harness.record(
        rec, "latency", Spread.of([400, 800, 1000]), Spread.of([40, 50, 100]),
        unit="us", group="g", baseline="PostgreSQL", target_ratio=1 / 8,
        higher_is_better=False,
    )  # fmt: skip
    assert slow["ratio"] == pytest.approx(50 / 800)  # baseline / Topicbase
    assert (slow["ratio_min"], slow["ratio_max"]) == (0.0625, 0.1)
    assert slow["met"] is False
    assert "ratio = baseline / Topicbase" in slow["unit"]
    assert slow["target"].startswith("<= 8x PostgreSQL")


def test_records_carry_every_field_and_merge_by_name(tmp_path: Path) -> None:
    rec = _recorder(tmp_path)
    harness.record(
        rec, "x", Spread.of([1, 2, 3]), Spread.of([2, 2, 2]),
        unit="txn/s", group="g", baseline="b", target_ratio=1.0,
    )  # fmt: skip
    rec.add("lonely", 7.0, "x", group="g")
    rec.save()
    stored = load_records(str(tmp_path / "results.json"))
    assert [r["name"] for r in stored] == ["x", "lonely"]
    for r in stored:
        assert set(r) == set(FIELDS)
    x = stored[0]
    assert (x["value"], x["min"], x["max"], x["reps"]) == (2.0, 1.0, 3.0, 3)
    assert (x["baseline_value"], x["baseline_min"], x["baseline_max"]) == (2.0, 2.0, 2.0)
    assert x["target_ratio"] == 1.0 and x["met"] is True
    assert json.loads(json.dumps(stored)) == stored
    merged = merge_records(stored, [{**x, "value": 9.0}])
    assert [r["name"] for r in merged] == ["x", "lonely"] and merged[0]["value"] == 9.0


def test_retired_names_are_dropped_on_merge() -> None:
    old = {"name": "transactions.move.c1.topicbase.txn_s", "value": 1}
    assert merge_records([old, {"name": "keep"}], []) == [{"name": "keep"}]


def test_markdown_shows_ranges_shortfall_and_charts(tmp_path: Path) -> None:
    rec = _recorder(tmp_path)
    harness.record(
        rec, "transactions.move.c4", Spread.of([100, 120, 110]), Spread.of([200, 220, 240]),
        unit="txn/s", group="transactions", baseline="PostgreSQL", target_ratio=0.6,
    )  # fmt: skip
    charts = tmp_path / "charts"
    charts.mkdir()
    (charts / "targets.png").write_bytes(b"png")
    findings = tmp_path / "findings.md"
    findings.write_text("## Findings\n\nthe dirty pages.\n")
    text = render_markdown(
        rec.records,
        charts_dir=str(charts),
        findings_path=str(findings),
        profile_path=None,
        md_dir=str(tmp_path),
    )
    assert "## Targets" in text
    assert "110 (100–120) txn/s" in text
    assert "220 (200–240)" in text
    assert "0.50x (0.46–0.55)" in text  # 100/200, 120/220, 110/240
    assert "**NO** (0.83 of it)" in text  # 0.5 of the 0.6 asked
    assert "![targets](charts/targets.png)" in text
    assert "the dirty pages." in text


def test_charts_are_drawn_for_targeted_records_and_removed_without(tmp_path: Path) -> None:
    from bench import charts

    rec = _recorder(tmp_path)
    harness.record(
        rec, "consume.embedded", Spread.of([9, 12, 10]), Spread.of([1, 1, 1]),
        unit="msgs/s", group="g", baseline="Redis", target_ratio=10.0,
    )  # fmt: skip
    directory = tmp_path / "charts"
    written = charts.draw_all(rec.records, str(directory))
    assert sorted(Path(p).name for p in written) == ["absolute.png", "targets.png"]
    for path in written:
        assert Path(path).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert charts.draw_all([], str(directory)) == []
    assert list(directory.iterdir()) == []  # no stale chart left behind


def test_a_run_writes_results_markdown_and_charts_beside_each_other(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bench import run
    from tests.bench import fake_suite

    monkeypatch.setitem(run.SUITES, "fake", "tests.bench.fake_suite")
    fake_suite.ORDER.clear()
    code = run.main(
        ["--suite", "quick", "--only", "fake", "--results", str(tmp_path / "r.json"),
         "--markdown", str(tmp_path / "R.md")]
    )  # fmt: skip
    assert code == 0
    assert fake_suite.ORDER == ["topicbase", "baseline"] * 3
    (stored,) = load_records(str(tmp_path / "r.json"))
    assert (stored["value"], stored["min"], stored["max"]) == (11.0, 10.0, 12.0)
    assert stored["ratio"] == round(11.0 / 6.0, 4) and stored["met"] is True
    assert (tmp_path / "charts" / "targets.png").exists()  # beside R.md, not in bench/
    assert "![targets](charts/targets.png)" in (tmp_path / "R.md").read_text()
