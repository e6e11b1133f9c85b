"""Benchmark results: one JSON record per metric, merged across runs, rendered as Markdown.

``bench/results.json`` is a list of records, one per metric name::

    {"name", "group", "value", "min", "max", "reps", "unit", "baseline",
     "baseline_value", "baseline_min", "baseline_max", "ratio", "ratio_min",
     "ratio_max", "higher_is_better", "target", "target_ratio", "met", "note",
     "machine", "date", "commit", "suite", "load_avg"}

``value`` is the median over ``reps`` repetitions and ``min``/``max`` their
range (``bench.harness`` runs Topicbase and its baseline alternately, A B A B,
and fills both sides' fields); a single measurement has ``reps`` 1 or null.
``ratio`` reads "higher is better" always: ``value / baseline_value`` for
throughput, ``baseline_value / value`` for latencies (``higher_is_better``
false; the unit then says ``ratio = baseline / Topicbase``); null without a
baseline. ``ratio_min``/``ratio_max`` are the range of the per-repetition
ratios (repetition i of Topicbase against repetition i of the baseline).
``target`` is text such as ``">= 0.5x raw"`` (or null), ``target_ratio`` the
ratio it asks for in the same direction (``<= 8x PostgreSQL`` for a latency is
``target_ratio`` 0.125), and ``met`` whether this run met it (null without a
target); ``date`` is when the run started; ``load_avg`` is
the machine's 1/5/15-minute load when the metric was recorded (other work on
these 2-core machines skews every figure). Saving merges: a record replaces
the stored record of the same name, every other stored record stays.
``bench/RESULTS.md`` is regenerated from the merged JSON each time, one table per group.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import platform
import socket
import subprocess
import sys
import time
from collections.abc import Iterable
from typing import Any

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_DIR = os.path.dirname(BENCH_DIR)
RESULTS_JSON = os.path.join(BENCH_DIR, "results.json")
RESULTS_MD = os.path.join(BENCH_DIR, "RESULTS.md")
CHARTS_DIR = os.path.join(BENCH_DIR, "charts")  # PNGs embedded in RESULTS.md (bench.charts)
FINDINGS_MD = os.path.join(BENCH_DIR, "findings.md")  # hand-written, appended to RESULTS.md
PROFILE_MD = os.path.join(BENCH_DIR, "profile.md")  # written by bench.profile_move, appended
SUITE_CHARTS = ("autopartitioning.png",)  # drawn by a suite itself into bench/, embedded too
LOWER_IS_BETTER_UNIT = "ratio = baseline / Topicbase"
# Names earlier versions recorded that no suite writes any more: dropped on save.
RETIRED_PREFIXES = (
    "transactions.move.c1.topicbase.",
    "transactions.move.c4.topicbase.",
    "transactions.move.c1.postgres.",
    "transactions.move.c4.postgres.",
    "pgwire SELECT 1 p50: topicbase serve",  # now pgwire.select1
    "pgwire SELECT 1 p99: topicbase serve",  # now pgwire.select1.p99
)

FIELDS = (
    "name",
    "group",
    "value",
    "min",
    "max",
    "reps",
    "unit",
    "baseline",
    "baseline_value",
    "baseline_min",
    "baseline_max",
    "ratio",
    "ratio_min",
    "ratio_max",
    "higher_is_better",
    "target",
    "target_ratio",
    "met",
    "note",
    "machine",
    "date",
    "commit",
    "suite",
    "load_avg",
)


# -- environment ------------------------------------------------------------------------
def machine_info() -> dict[str, Any]:
    """Hostname, CPU model, cores, memory, Python and kernel of this machine."""
    cpu_model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as file:
            for line in file:
                if line.startswith("model name"):
                    cpu_model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    memory_gib = None
    try:
        with open("/proc/meminfo", encoding="utf-8") as file:
            for line in file:
                if line.startswith("MemTotal:"):
                    memory_gib = round(int(line.split()[1]) / 1024 / 1024, 1)
                    break
    except OSError:
        pass
    return {
        "hostname": socket.gethostname(),
        "cpu": cpu_model,
        "cores": os.cpu_count(),
        "memory_gib": memory_gib,
        "python": platform.python_version(),
        "kernel": platform.release(),
    }


def load_average() -> list[float] | None:
    """1, 5 and 15 minute load averages: a busy machine makes every figure unreliable."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def git_commit(repo: str = REPO_DIR) -> str | None:
    """``git rev-parse HEAD``, with ``+dirty`` when the working tree has changes."""
    try:
        head = subprocess.run(
            ["git", "-C", repo, "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout.strip()
        status = subprocess.run(
            ["git", "-C", repo, "status", "--porcelain"],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("+dirty" if status.strip() else "")


def utc_now() -> str:
    return _dt.datetime.now(_dt.UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


# -- targets ----------------------------------------------------------------------------
def ratio_target(minimum: float, baseline_label: str) -> str:
    return f">= {minimum:g}x {baseline_label}"


def value_target(minimum: float, unit: str) -> str:
    return f">= {minimum:,.0f} {unit}"


# -- recording --------------------------------------------------------------------------
class Recorder:
    """Collects the records of one run; ``save`` merges them into the results file."""

    def __init__(
        self,
        suite: str,
        *,
        json_path: str = RESULTS_JSON,
        md_path: str = RESULTS_MD,
        stream: Any = None,
    ) -> None:
        self.suite = suite
        self.json_path = json_path
        self.md_path = md_path
        self.stream = stream or sys.stdout
        self.machine = machine_info()
        self.commit = git_commit()
        self.records: list[dict[str, Any]] = []
        self.date = utc_now()  # every record of a run carries the run's start
        self._started = time.perf_counter()

    @property
    def quick(self) -> bool:
        return self.suite == "quick"

    def progress(self, message: str) -> None:
        elapsed = time.perf_counter() - self._started
        print(f"[{elapsed:6.1f}s] {message}", file=self.stream, flush=True)

    def add(
        self,
        name: str,
        value: float,
        unit: str,
        *,
        group: str,
        baseline: str | None = None,
        baseline_value: float | None = None,
        target: str | None = None,
        met: bool | None = None,
        note: str | None = None,
        spread: tuple[float, float] | None = None,
        baseline_spread: tuple[float, float] | None = None,
        reps: int | None = None,
        ratio_range: tuple[float, float] | None = None,
        higher_is_better: bool = True,
        target_ratio: float | None = None,
    ) -> dict[str, Any]:
        """Record one metric (see the module docstring for the fields).

        ``met`` defaults to ``ratio >= target_ratio`` when both are known.
        """
        ratio = ratio_of(value, baseline_value, higher_is_better)
        if not higher_is_better and baseline is not None and LOWER_IS_BETTER_UNIT not in unit:
            unit = f"{unit} ({LOWER_IS_BETTER_UNIT})"
        if met is None and target_ratio is not None and ratio is not None:
            met = ratio >= target_ratio
        low, high = spread if spread is not None else (None, None)
        base_low, base_high = baseline_spread if baseline_spread is not None else (None, None)
        ratio_low, ratio_high = ratio_range if ratio_range is not None else (None, None)
        record = {
            "name": name,
            "group": group,
            "value": _plain(value),
            "min": _plain(low),
            "max": _plain(high),
            "reps": reps,
            "unit": unit,
            "baseline": baseline,
            "baseline_value": _plain(baseline_value),
            "baseline_min": _plain(base_low),
            "baseline_max": _plain(base_high),
            "ratio": None if ratio is None else round(ratio, 4),
            "ratio_min": None if ratio_low is None else round(ratio_low, 4),
            "ratio_max": None if ratio_high is None else round(ratio_high, 4),
            "higher_is_better": higher_is_better,
            "target": target,
            "target_ratio": None if target_ratio is None else round(target_ratio, 6),
            "met": None if met is None else bool(met),
            "note": note,
            "machine": self.machine,
            "date": self.date,
            "commit": self.commit,
            "suite": self.suite,
            "load_avg": load_average(),
        }
        self.records = [r for r in self.records if r["name"] != name]
        self.records.append(record)
        line = f"  {name} = {format_value(value)} {unit}"
        if spread is not None:
            line += f" [{format_value(low)}..{format_value(high)}]"
        if baseline_value is not None:
            line += f"  (baseline {format_value(baseline_value)}, ratio {format_ratio(ratio)})"
        if target is not None:
            line += f"  target {target}: {'met' if met else 'MISSED'}"
        self.progress(line.strip())
        return record

    def save(self, *, charts_dir: str | None = None) -> list[dict[str, Any]]:
        """Merge this run's records into the JSON file and regenerate the Markdown; with
        ``charts_dir``, first redraw the PNG charts there (``bench.charts``, matplotlib)."""
        merged = merge_records(load_records(self.json_path), self.records)
        _write_atomic(self.json_path, json.dumps(merged, indent=2) + "\n")
        if charts_dir is not None:
            from bench import charts  # matplotlib: imported only when drawing

            charts.draw_all(merged, charts_dir)
        md_dir = os.path.dirname(os.path.abspath(self.md_path))
        charts_dir = charts_dir or os.path.join(md_dir, "charts")  # the report's own charts
        _write_atomic(self.md_path, render_markdown(merged, charts_dir=charts_dir, md_dir=md_dir))
        return merged


def ratio_of(
    value: float | None, baseline_value: float | None, higher_is_better: bool = True
) -> float | None:
    """Topicbase / baseline for throughput, baseline / Topicbase for latencies: > 1 is better."""
    if value is None or not baseline_value:
        return None
    if higher_is_better:
        return value / baseline_value
    return baseline_value / value if value else None


def load_records(path: str = RESULTS_JSON) -> list[dict[str, Any]]:
    try:
        with open(path, encoding="utf-8") as file:
            data = json.load(file)
    except FileNotFoundError:
        return []
    if not isinstance(data, list):
        raise ValueError(f"{path} must hold a JSON list of records")
    return data


def merge_records(
    stored: Iterable[dict[str, Any]], new: Iterable[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Stored records in their order, each replaced by a new one of the same name; then the rest."""
    fresh = {record["name"]: record for record in new}
    merged = []
    for record in stored:
        if record["name"].startswith(RETIRED_PREFIXES) and record["name"] not in fresh:
            continue
        merged.append(fresh.pop(record["name"], record))
    merged.extend(fresh.values())
    return merged


def _write_atomic(path: str, text: str) -> None:
    temp = path + ".tmp"
    with open(temp, "w", encoding="utf-8") as file:
        file.write(text)
    os.replace(temp, path)


def _plain(value: float | None) -> float | int | None:
    if value is None:
        return None
    if isinstance(value, int):
        return value
    value = float(value)
    return round(value, 6) if math.isfinite(value) else None  # JSON has no NaN


# -- Markdown ---------------------------------------------------------------------------
def format_value(value: float | None) -> str:
    if value is None:
        return "-"
    magnitude = abs(value)
    if magnitude >= 1000:
        return f"{value:,.0f}"
    if magnitude >= 100:
        return f"{value:.0f}"
    if magnitude >= 10:
        return f"{value:.1f}"
    if magnitude >= 1:
        return f"{value:.2f}"
    return f"{value:.3g}"


def format_ratio(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.2f}x"


def _met(met: bool | None) -> str:
    return {True: "yes", False: "**NO**", None: "-"}[met]


def _describe_machine(machine: dict[str, Any]) -> str:
    return (
        f"{machine.get('hostname')}: {machine.get('cpu')}, {machine.get('cores')} cores, "
        f"{machine.get('memory_gib')} GiB, Python {machine.get('python')}, "
        f"kernel {machine.get('kernel')}"
    )


def _with_range(value: float | None, low: float | None, high: float | None) -> str:
    text = format_value(value)
    if low is not None and high is not None and value is not None:
        text += f" ({format_value(low)}–{format_value(high)})"
    return text


def _ratio_cell(record: dict[str, Any]) -> str:
    text = format_ratio(record.get("ratio"))
    low, high = record.get("ratio_min"), record.get("ratio_max")
    if record.get("ratio") is not None and low is not None and high is not None:
        text += f" ({low:.2f}–{high:.2f})"
    return text


def _shortfall(record: dict[str, Any]) -> str:
    """How far a ratio is from its target: "met", or "missed: 0.43x of the 1.5x asked"."""
    ratio, wanted = record.get("ratio"), record.get("target_ratio")
    if ratio is None or wanted is None:
        return _met(record.get("met"))
    if ratio >= wanted:
        return "yes"
    return f"**NO** ({ratio / wanted:.2f} of it)"


def _headline(records: list[dict[str, Any]]) -> list[str]:
    """The records that carry a numeric target: one table, before the groups."""
    targeted = [r for r in records if r.get("target_ratio") is not None]
    if not targeted:
        return []
    lines = [
        "## Targets",
        "",
        "Medians of alternating repetitions (A B A B …), with min–max; `ratio` is "
        "Topicbase / baseline, or baseline / Topicbase for latencies (higher is better in "
        "both), its range the per-repetition ratios.",
        "",
        "| record | Topicbase | baseline | baseline value | ratio | target | met |",
        "|---|---:|---|---:|---:|---|---|",
    ]
    for r in targeted:
        lines.append(
            "| "
            + " | ".join(
                [
                    f"`{r['name']}`",
                    _with_range(r["value"], r.get("min"), r.get("max")) + f" {r['unit']}",
                    r["baseline"] or "-",
                    _with_range(r["baseline_value"], r.get("baseline_min"), r.get("baseline_max")),
                    _ratio_cell(r),
                    r["target"] or "-",
                    _shortfall(r),
                ]
            )
            + " |"
        )
    lines.append("")
    return lines


def _charts(charts_dir: str | None, md_dir: str) -> list[str]:
    paths = [os.path.join(BENCH_DIR, name) for name in SUITE_CHARTS]
    if charts_dir and os.path.isdir(charts_dir):
        paths = [os.path.join(charts_dir, n) for n in sorted(os.listdir(charts_dir))] + paths
    lines = []
    for path in paths:
        if not path.endswith(".png") or not os.path.exists(path):
            continue
        name = os.path.basename(path)
        relative = os.path.relpath(path, md_dir)
        title = name[: -len(".png")].replace("_", " ")
        lines += [f"![{title}]({relative})", ""]
    return (["## Charts", "", *lines]) if lines else []


def render_markdown(
    records: list[dict[str, Any]],
    *,
    charts_dir: str | None = CHARTS_DIR,
    findings_path: str | None = FINDINGS_MD,
    profile_path: str | None = PROFILE_MD,
    md_dir: str = BENCH_DIR,
) -> str:
    lines = [
        "# Topicbase benchmark results",
        "",
        "Generated by `python -m bench.run` from `bench/results.json` (and "
        "`bench/findings.md`); do not edit by hand.",
        "",
    ]
    if not records:
        return "\n".join([*lines, "No results yet.", ""])
    machines = []
    for record in records:
        described = _describe_machine(record["machine"])
        if described not in machines:
            machines.append(described)
    latest = max(record["date"] for record in records)  # ISO UTC strings sort by time
    lines.append(f"- Machine{'s' if len(machines) > 1 else ''}: " + "; ".join(machines))
    lines.append(f"- Latest run: {latest}")
    lines.append("")
    lines += _headline(records)
    lines += _charts(charts_dir, md_dir)
    for path in (findings_path, profile_path):
        if path and os.path.exists(path):
            with open(path, encoding="utf-8") as file:
                lines += [file.read().rstrip(), ""]
    groups: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        groups.setdefault(record.get("group") or "other", []).append(record)
    for group, members in groups.items():
        runs: dict[tuple[str, str, str], float] = {}
        for r in members:
            key = (r["date"], r["suite"], r["commit"] or "?")
            runs[key] = max(runs.get(key, 0.0), (r.get("load_avg") or [0.0])[0])
        lines.append(f"## {group}")
        lines.append("")
        for (date, suite, commit), load in sorted(runs.items())[-3:]:
            lines.append(
                f"- Run {date}, suite `{suite}`, commit `{commit}`, "
                f"1-minute load average up to {load:g}."
            )
        lines.append("")
        lines.append(
            "| metric | value (min–max) | unit | baseline | baseline value | ratio | target | met |"
        )
        lines.append("|---|---:|---|---|---:|---:|---|---|")
        for r in members:
            cells = [
                r["name"] + (f" ({r['note']})" if r.get("note") else ""),
                _with_range(r["value"], r.get("min"), r.get("max")),
                r["unit"],
                r["baseline"] or "-",
                _with_range(r["baseline_value"], r.get("baseline_min"), r.get("baseline_max")),
                _ratio_cell(r),
                r["target"] or "-",
                _shortfall(r),
            ]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)
