"""bench.scale_steps measures the steps the bench's spread INSERT runs (docs/scale.md round
21): every wrapped step is called by the statement on its own thread, and the statement's
figures are taken."""

from __future__ import annotations

from pathlib import Path

from bench import scale_steps


def test_every_step_is_on_the_spread_statements_path(tmp_path: Path) -> None:
    taken = scale_steps.measure(str(tmp_path), 1, polls=True, sides=(8,), messages=40)
    statements = taken[8]
    assert len(statements) == scale_steps.STATEMENTS
    for spent in statements:
        missing = [name for _, name in scale_steps.STEPS if spent.get(name, 0.0) <= 0.0]
        assert not missing, missing
        assert spent["cpu"] >= spent["append_now"] >= spent["publish_shares"] > 0
        assert spent["wall"] > 0


def test_the_wrappers_are_removed_after_the_statement(tmp_path: Path) -> None:
    originals = [getattr(owner, name) for owner, name in scale_steps.STEPS]
    scale_steps.measure(str(tmp_path), 1, polls=False, sides=(8,), messages=40)
    assert [getattr(owner, name) for owner, name in scale_steps.STEPS] == originals


def test_each_way_of_preparing_the_tails_is_measured(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(scale_steps, "FILES", 4)
    monkeypatch.setattr(scale_steps, "WRITE_ROUNDS", 4)
    for way in scale_steps.WAYS:
        assert scale_steps.writes(str(tmp_path), way) > 0
    assert list(tmp_path.iterdir()) == []  # the files go with each measurement
