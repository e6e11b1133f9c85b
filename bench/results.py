"""Benchmark results: one JSON record per metric, merged across runs, rendered as Markdown.

``bench/results.json`` is a list of records, one per metric name::

    {"name", "group", "value", "unit", "baseline", "baseline_value", "ratio",
     "target", "met", "note", "machine", "date", "commit", "suite", "load_avg"}

``ratio`` is ``value / baseline_value`` (null without a baseline); ``target``
is text such as ``">= 0.5x raw"`` (or null) and ``met`` whether this run met
it (null without a target); ``date`` is when the run started; ``load_avg`` is
the machine's 1/5/15-minute load when the metric was recorded (other work on
these 2-core machines skews every figure). Saving merges: a record replaces
the stored record of the same name, every other stored record stays.
``bench/RESULTS.md`` is regenerated from the merged JSON each time, one table per group.
"""

from __future__ import annotations

import datetime as _dt
import json
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

FIELDS = (
    "name",
    "group",
    "value",
    "unit",
    "baseline",
    "baseline_value",
    "ratio",
    "target",
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
    ) -> dict[str, Any]:
        ratio = None
        if baseline_value:
            ratio = value / baseline_value
        record = {
            "name": name,
            "group": group,
            "value": _plain(value),
            "unit": unit,
            "baseline": baseline,
            "baseline_value": _plain(baseline_value),
            "ratio": None if ratio is None else round(ratio, 4),
            "target": target,
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
        if baseline_value is not None:
            line += f"  (baseline {format_value(baseline_value)}, ratio {format_ratio(ratio)})"
        if target is not None:
            line += f"  target {target}: {'met' if met else 'MISSED'}"
        self.progress(line.strip())
        return record

    def save(self) -> list[dict[str, Any]]:
        """Merge this run's records into the JSON file and regenerate the Markdown."""
        merged = merge_records(load_records(self.json_path), self.records)
        _write_atomic(self.json_path, json.dumps(merged, indent=2) + "\n")
        _write_atomic(self.md_path, render_markdown(merged))
        return merged


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
    return round(float(value), 6)


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


def render_markdown(records: list[dict[str, Any]]) -> str:
    lines = [
        "# Topicbase benchmark results",
        "",
        "Generated by `python -m bench.run` from `bench/results.json`; do not edit by hand.",
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
        lines.append("| metric | value | unit | baseline | baseline value | ratio | target | met |")
        lines.append("|---|---:|---|---|---:|---:|---|---|")
        for r in members:
            cells = [
                r["name"] + (f" ({r['note']})" if r.get("note") else ""),
                format_value(r["value"]),
                r["unit"],
                r["baseline"] or "-",
                format_value(r["baseline_value"]),
                format_ratio(r["ratio"]),
                r["target"] or "-",
                _met(r["met"]),
            ]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)
