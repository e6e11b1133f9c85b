"""PNG charts of ``bench/results.json`` for ``bench/RESULTS.md`` (matplotlib, Agg backend).

- ``targets.png``: every record with a numeric target: its ratio (higher is
  better) as a bar with the per-repetition min-max as a whisker, the target as
  a mark; log scale, 1x drawn.
- ``absolute.png``: the same records' medians, Topicbase beside its baseline,
  each with its min-max, one small panel per record (units differ).

Charts are drawn small (80 dpi, few colours) so that committing them costs
little; a chart without data is removed rather than left stale.
"""

from __future__ import annotations

import math
import os
from typing import Any

DPI = 80
OURS = "#2b6cb0"
BASE = "#a0aec0"
MISSED = "#c53030"


def _label(name: str, width: int = 42) -> str:
    return name if len(name) <= width else name[: width - 1] + "…"


def _targeted(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if r.get("target_ratio") is not None and r.get("ratio")]


def draw_targets(records: list[dict[str, Any]], path: str) -> bool:
    """Ratios against targets; False (and no file) when no record has both."""
    rows = _targeted(records)
    if not rows:
        if os.path.exists(path):
            os.remove(path)
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = list(reversed(rows))  # first record at the top
    height = 0.32 * len(rows) + 1.2
    fig, ax = plt.subplots(figsize=(9.0, height), dpi=DPI)
    ys = range(len(rows))
    ratios = [r["ratio"] for r in rows]
    lows = [r.get("ratio_min") or r["ratio"] for r in rows]
    highs = [r.get("ratio_max") or r["ratio"] for r in rows]
    colours = [OURS if r["ratio"] >= r["target_ratio"] else MISSED for r in rows]
    ax.barh(list(ys), ratios, color=colours, height=0.6)
    ax.errorbar(
        ratios, list(ys),
        xerr=[[max(r - lo, 0) for r, lo in zip(ratios, lows, strict=True)],
              [max(hi - r, 0) for r, hi in zip(ratios, highs, strict=True)]],
        fmt="none", ecolor="black", capsize=2, linewidth=0.8,
    )  # fmt: skip
    ax.scatter([r["target_ratio"] for r in rows], list(ys), marker="|", s=160, color="black",
               zorder=3, label="target")  # fmt: skip
    ax.axvline(1.0, color="grey", linewidth=0.6, linestyle="--")
    ax.set_xscale("log")
    values = [*ratios, *lows, *highs, *(r["target_ratio"] for r in rows)]
    ax.set_xlim(min(values) / 1.5, max(values) * 1.5)
    ax.set_yticks(list(ys))
    ax.set_yticklabels([_label(r["name"]) for r in rows], fontsize=8)
    ax.set_xlabel("ratio to baseline (higher is better; blue met, red missed)", fontsize=8)
    ax.tick_params(axis="x", labelsize=8)
    ax.legend(fontsize=7, loc="best")
    ax.set_title("Targets: median ratio, min-max of the repetitions", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return True


def draw_absolute(records: list[dict[str, Any]], path: str) -> bool:
    """Topicbase beside its baseline, medians with min-max, a panel per targeted record."""
    rows = [r for r in _targeted(records) if r.get("baseline_value") is not None]
    if not rows:
        if os.path.exists(path):
            os.remove(path)
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = 4
    lines = math.ceil(len(rows) / columns)
    fig, axes = plt.subplots(lines, columns, figsize=(8.5, 1.9 * lines), dpi=DPI, squeeze=False)
    for index, ax in enumerate(axes.flat):
        if index >= len(rows):
            ax.axis("off")
            continue
        r = rows[index]
        values = [r["value"], r["baseline_value"]]
        lows = [r.get("min") or r["value"], r.get("baseline_min") or r["baseline_value"]]
        highs = [r.get("max") or r["value"], r.get("baseline_max") or r["baseline_value"]]
        ax.bar([0, 1], values, color=[OURS, BASE], width=0.6)
        ax.errorbar(
            [0, 1], values,
            yerr=[[max(v - lo, 0) for v, lo in zip(values, lows, strict=True)],
                  [max(hi - v, 0) for v, hi in zip(values, highs, strict=True)]],
            fmt="none", ecolor="black", capsize=2, linewidth=0.8,
        )  # fmt: skip
        ax.set_xticks([0, 1])
        baseline = (r.get("baseline") or "baseline").split(",")[0][:18]
        ax.set_xticklabels(["Topicbase", baseline], fontsize=6)
        ax.tick_params(axis="y", labelsize=6)
        unit = r["unit"].split(" (")[0]
        ax.set_title(f"{r['name']}\n{unit}", fontsize=6.5)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return True


def draw_all(records: list[dict[str, Any]], charts_dir: str) -> list[str]:
    """Draw every chart into ``charts_dir``; the paths written."""
    os.makedirs(charts_dir, exist_ok=True)
    written = []
    for name, draw in (("targets.png", draw_targets), ("absolute.png", draw_absolute)):
        path = os.path.join(charts_dir, name)
        if draw(records, path):
            written.append(path)
    return written
