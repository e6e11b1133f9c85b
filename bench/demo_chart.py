"""The demo's chart: throughput and lag of the resharding pipeline over time (matplotlib).

``write_chart(path, samples, events)`` draws two panels over time: messages per second
written by the simulated servers and resharded by the Spark query (top), and the
resharding lag in messages (bottom), with the demo's events (the kill, the restart)
marked as vertical lines. Written with matplotlib's Agg backend (no display needed).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # after the backend is chosen


def write_chart(path: str, samples: Sequence[tuple[float, int, int, int]],
                events: Sequence[tuple[float, str]] = ()) -> None:  # fmt: skip
    """``samples``: (seconds, messages written, messages resharded, lag) over time;
    ``events``: (seconds, label) to mark."""
    figure, (top, bottom) = plt.subplots(2, 1, figsize=(9, 5.5), sharex=True)
    times = [s[0] for s in samples]
    for index, label, colour in ((1, "written by the servers", "tab:blue"),
                                 (2, "resharded by Spark", "tab:green")):  # fmt: skip
        rate = [0.0] + [max(0.0, (b[index] - a[index]) / max(b[0] - a[0], 1e-9))
                        for a, b in itertools.pairwise(samples)]  # fmt: skip
        top.plot(times, rate, label=label, color=colour)
    top.set_ylabel("messages / s")
    top.set_title("Resharding logs_by_server -> logs_by_user on Spark")
    top.legend(loc="upper left")
    bottom.plot(times, [s[3] for s in samples], color="tab:red", label="lag")
    bottom.set_ylabel("lag (messages)")
    bottom.set_xlabel("seconds since the demo started")
    for axes in (top, bottom):
        axes.grid(alpha=0.3)
        for at, _label in events:
            axes.axvline(at, color="grey", linestyle="--", linewidth=1)
    for at, label in events:
        top.annotate(label, (at, 1.0), xycoords=("data", "axes fraction"), rotation=90,
                     va="top", ha="right", fontsize=8, color="grey")  # fmt: skip
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
