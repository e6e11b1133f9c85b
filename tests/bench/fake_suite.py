"""A benchmark module for the harness's tests: two sides, alternating, one targeted record."""

from __future__ import annotations

from bench import harness
from bench.results import Recorder

ORDER: list[str] = []


def run(rec: Recorder) -> None:
    def side(name: str, value: float) -> harness.Side:
        return harness.Side(name, lambda rep: ORDER.append(name) or value + rep)

    spreads = harness.alternate([side("topicbase", 10.0), side("baseline", 5.0)], 3)
    harness.record(
        rec, "fake.workload", spreads["topicbase"][harness.VALUE],
        spreads["baseline"][harness.VALUE], unit="msgs/s", group="fake",
        baseline="a baseline", target_ratio=1.5,
    )  # fmt: skip
