"""Alternating repetitions of Topicbase and its baselines, and the records they make.

Every workload runs its sides in turn, repetition by repetition: with sides A
(Topicbase) and B (a baseline), the order is A B A B … (``alternate``), so that
a change of machine load during the run (these 2-core machines are shared)
hits both sides alike. A side's run returns one figure or several (a mapping
of metric name to value: txn/s, a p50, fsyncs per commit, …). Each metric's
repetitions become a ``Spread`` (median, min, max); ``record`` turns a
Topicbase spread and its baseline's spread into one record of
``bench.results`` with the median as the value, both ranges, the ratio of the
medians and the range of the per-repetition ratios, always "higher is better"
(Topicbase / baseline, or baseline / Topicbase for latencies), and the target.

Invariants: every side runs exactly ``reps`` times; repetition ``i`` of every
side runs before repetition ``i + 1`` of any side; the sides keep the order
given within a repetition.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bench.results import Recorder, format_value, ratio_of

RunResult = float | Mapping[str, float]
VALUE = "value"  # the metric name of a side whose run returns one float


@dataclass(frozen=True)
class Spread:
    """The repetitions of one metric on one side, in the order they ran."""

    samples: tuple[float, ...]

    def __post_init__(self) -> None:
        assert self.samples, "a spread needs at least one sample"

    @classmethod
    def of(cls, samples: Sequence[float]) -> Spread:
        return cls(tuple(float(x) for x in samples))

    @property
    def median(self) -> float:
        return float(statistics.median(self.samples))

    @property
    def low(self) -> float:
        return min(self.samples)

    @property
    def high(self) -> float:
        return max(self.samples)

    @property
    def reps(self) -> int:
        return len(self.samples)

    def describe(self) -> str:
        return f"{format_value(self.median)} [{format_value(self.low)}..{format_value(self.high)}]"


@dataclass(frozen=True)
class Side:
    """One system running the workload: ``run(rep)`` does one repetition."""

    name: str
    run: Callable[[int], RunResult]


def alternate(
    sides: Sequence[Side],
    reps: int,
    progress: Callable[[str], None] | None = None,
) -> dict[str, dict[str, Spread]]:
    """Run the sides in turn, ``reps`` times (A B A B …); side -> metric -> spread."""
    assert reps >= 1, "at least one repetition"
    names = [side.name for side in sides]
    assert len(set(names)) == len(names), f"side names must be distinct: {names}"
    samples: dict[str, dict[str, list[float]]] = {name: {} for name in names}
    for rep in range(reps):
        for side in sides:
            result = side.run(rep)
            figures = {VALUE: float(result)} if isinstance(result, int | float) else result
            metrics = samples[side.name]
            if rep > 0:
                assert set(figures) == set(metrics), (
                    f"{side.name}: repetition {rep + 1} gave metrics {sorted(figures)}, "
                    f"the first gave {sorted(metrics)}"
                )
            for metric, value in figures.items():
                metrics.setdefault(metric, []).append(float(value))
            if progress is not None:
                shown = ", ".join(f"{k} {format_value(float(v))}" for k, v in figures.items())
                progress(f"  rep {rep + 1}/{reps} {side.name}: {shown}")
    return {
        name: {metric: Spread.of(values) for metric, values in metrics.items()}
        for name, metrics in samples.items()
    }


def paired_ratios(ours: Spread, base: Spread, higher_is_better: bool = True) -> list[float]:
    """Repetition i of Topicbase against repetition i of the baseline, higher is better."""
    ratios = []
    for value, baseline in zip(ours.samples, base.samples, strict=False):
        ratio = ratio_of(value, baseline, higher_is_better)
        if ratio is not None:
            ratios.append(ratio)
    return ratios


def ratio_target_text(target_ratio: float, baseline_label: str, higher_is_better: bool) -> str:
    """``>= 1.5x PostgreSQL`` for throughput; ``<= 8x PostgreSQL`` (ratio >= 0.125) for latency."""
    if higher_is_better:
        return f">= {target_ratio:g}x {baseline_label}"
    return f"<= {1 / target_ratio:g}x {baseline_label} (ratio >= {target_ratio:.3g})"


def record(
    rec: Recorder,
    name: str,
    ours: Spread,
    base: Spread | None,
    *,
    unit: str,
    group: str,
    baseline: str | None = None,
    target_ratio: float | None = None,
    target_label: str | None = None,
    target: str | None = None,
    higher_is_better: bool = True,
    note: str | None = None,
) -> dict[str, Any]:
    """One record from Topicbase's spread and its baseline's (``None``: no baseline).

    ``target_ratio`` is the ratio asked for, higher is better; its text is
    ``target`` if given, else built from ``target_label`` (the baseline's short name).
    """
    assert base is None or baseline is not None, "a baseline spread needs the baseline's name"
    ratios = paired_ratios(ours, base, higher_is_better) if base is not None else []
    if target is None and target_ratio is not None:
        target = ratio_target_text(target_ratio, target_label or baseline or "baseline",
                                   higher_is_better)  # fmt: skip
    return rec.add(
        name,
        ours.median,
        unit,
        group=group,
        baseline=baseline,
        baseline_value=None if base is None else base.median,
        spread=(ours.low, ours.high),
        baseline_spread=None if base is None else (base.low, base.high),
        reps=ours.reps,
        ratio_range=(min(ratios), max(ratios)) if ratios else None,
        higher_is_better=higher_is_better,
        target=target,
        target_ratio=target_ratio,
        note=note,
    )
