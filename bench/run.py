"""Run the benchmark suites and record their metrics.

    python -m bench.run --suite full|quick [--only storage[,other]] [--list]

Each benchmark module registers here under a short name in ``SUITES`` (name ->
module path). A module exposes ``run(recorder: bench.results.Recorder) -> None``:
it reads ``recorder.suite`` ("full" or "quick"; quick runs shortened variants),
reports progress with ``recorder.progress`` and records every metric with
``recorder.add``. After each module its records are merged into
``bench/results.json`` and ``bench/RESULTS.md`` is regenerated, so a failure in
a later module keeps the earlier results; at the end the PNG charts
(``bench.charts``) are redrawn into ``bench/charts`` and embedded in RESULTS.md.

Modules compare Topicbase with a baseline through ``bench.harness``: the sides
alternate repetition by repetition (A B A B …) and each record carries the
median and min-max of both sides, the ratio (higher is better) with its
per-repetition range, and its target. Baselines are started and stopped by the
modules on loopback: PostgreSQL 15 (``bench.postgres``) and Redis
(``bench.redis``).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
import traceback

from bench.results import (
    CHARTS_DIR,
    RESULTS_JSON,
    RESULTS_MD,
    Recorder,
    format_ratio,
    format_value,
)

# name -> module exposing run(recorder), in the order a full run takes them.
SUITES: dict[str, str] = {
    "storage": "bench.storage_bench",
    "transactions": "bench.transactions_bench",
    "pgwire": "bench.pgwire_bench",
    "security": "bench.security_bench",
    "spark": "bench.spark_bench",
    "streams": "bench.streams_bench",
    "scale": "bench.scale_bench",
    "profile": "bench.profile_move",
    "autopartitioning": "bench.autopartitioning_bench",
    "copy_arrow": "bench.copy_arrow_bench",
}


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.split("\n")[0])
    parser.add_argument("--suite", choices=("full", "quick"), default="full")
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        help="run only these benchmarks (comma-separated or repeated): " + ", ".join(SUITES),
    )
    parser.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    parser.add_argument("--results", default=RESULTS_JSON, help="results JSON (merged into)")
    parser.add_argument("--markdown", default=RESULTS_MD, help="Markdown report (regenerated)")
    parser.add_argument(
        "--charts",
        help=f"directory of the PNG charts (default: charts/ beside the Markdown, {CHARTS_DIR})",
    )
    parser.add_argument(
        "--strict", action="store_true", help="exit with status 2 when a target is missed"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if args.list:
        for name, module in SUITES.items():
            print(f"{name}\t{module}")
        return 0
    selected = [n.strip() for item in args.only for n in item.split(",") if n.strip()]
    unknown = [name for name in selected if name not in SUITES]
    if unknown:
        print(f"unknown benchmark(s): {', '.join(unknown)}; known: {', '.join(SUITES)}")
        return 1
    names = selected or list(SUITES)
    recorder = Recorder(args.suite, json_path=args.results, md_path=args.markdown)
    recorder.progress(
        f"suite {args.suite}: {', '.join(names)} on {recorder.machine['hostname']} "
        f"({recorder.machine['cores']} cores), commit {recorder.commit}"
    )
    load = os.getloadavg()[0]
    if load > 0.5 * (os.cpu_count() or 1):
        recorder.progress(
            f"WARNING: load average {load:.1f} on {os.cpu_count()} cores before starting: "
            "other work is running, figures will be low and noisy"
        )
    failed = []
    for name in names:
        started = time.perf_counter()
        recorder.progress(f"== {name} ==")
        try:
            module = importlib.import_module(SUITES[name])
            module.run(recorder)
        except Exception:
            traceback.print_exc()
            failed.append(name)
        finally:
            recorder.save()  # keep whatever this module recorded, even after a failure
        recorder.progress(f"== {name} done in {time.perf_counter() - started:.1f}s ==")
    try:
        charts = args.charts or os.path.join(os.path.dirname(os.path.abspath(args.markdown)),
                                             "charts")  # fmt: skip
        recorder.save(charts_dir=charts)
    except Exception:  # the JSON and the Markdown are written; the charts are extra
        traceback.print_exc()
    _summary(recorder)
    print(f"results: {args.results}\nreport:  {args.markdown}")
    if failed:
        print(f"FAILED: {', '.join(failed)}")
        return 1
    missed = [r for r in recorder.records if r["met"] is False]
    return 2 if args.strict and missed else 0


def _summary(recorder: Recorder) -> None:
    targeted = [r for r in recorder.records if r["target"] is not None]
    if not targeted:
        return
    print("\nTargets:")
    for r in targeted:
        status = "met   " if r["met"] else "MISSED"
        print(
            f"  {status} {r['name']}: {format_value(r['value'])} {r['unit']} "
            f"(ratio {format_ratio(r['ratio'])}; target {r['target']})"
        )


if __name__ == "__main__":
    sys.exit(main())
