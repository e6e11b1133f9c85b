"""Autopartitioning: a topic that starts with one partition under a rising write rate,
against one created with the final partition count.

Both topics cap each partition at ``SPEED`` bytes/s (``partition_write_speed_bytes_per
_second``, a token bucket: writes over it wait) and route ``KEYS`` producer ids by key
hash. The *auto* topic starts with 1 partition, strategy ``scale_up``, a 1 s
stabilization window, up threshold 80 %, at most ``PARTITIONS`` active partitions; the
*fixed* topic has ``PARTITIONS`` partitions from the start (autopartitioning paused, so
it routes by the same even key ranges the auto topic's splits produce). ``WRITERS``
threads write batches of ``BATCH`` messages of ``MESSAGE_BYTES`` bytes, each thread for
its own producer ids with seq_nos, paced by a shared offered rate that rises linearly
from one partition's speed to ``OVERLOAD`` times the fixed topic's capacity over
``RAMP_S`` and then holds for ``HOLD_S``. Throughput is what the topic acknowledged;
*settled* is its rate over the last ``SETTLED_S`` of the hold, when the auto topic's
splits are done. Target: auto >= 0.8 of fixed, settled.

The chart ``bench/autopartitioning.png`` plots, for both topics, throughput per
``BIN_S`` and the number of active partitions over time. Data goes to a temp dir
(``$TOPICBASE_BENCH_DIR`` or ``$TMPDIR``), deleted afterwards.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field

from bench.results import Recorder, ratio_target
from storage.autopartition import AutoPartitioning
from storage.clock import SYSTEM_CLOCK
from storage.config import FsyncPolicy, TopicConfig
from storage.fs import FileSystem
from storage.record_batch import build_wire_batch
from storage.topic_log import TopicLog

SPEED = 1024 * 1024  # YDB's default partition write speed, bytes/s
PARTITIONS = 4
KEYS = 64
WRITERS = 8
BATCH = 32
MESSAGE_BYTES = 1024
OVERLOAD = 1.25
BIN_S = 0.5
TARGET = 0.8
CHART = os.path.join(os.path.dirname(os.path.abspath(__file__)), "autopartitioning.png")


@dataclass(frozen=True)
class Params:
    ramp_s: float
    hold_s: float
    settled_s: float


QUICK = Params(ramp_s=4.0, hold_s=9.0, settled_s=4.0)
FULL = Params(ramp_s=8.0, hold_s=16.0, settled_s=8.0)


@dataclass
class Trace:
    """What one run saw: acknowledged bytes per bin and active partitions per bin."""

    label: str
    acked: list[int] = field(default_factory=list)
    partitions: list[int] = field(default_factory=list)
    splits: int = 0
    final_at_s: float | None = None  # when the topic first had PARTITIONS active

    def rate(self, first_s: float, last_s: float) -> float:
        """Bytes/s acknowledged between the two times (bin resolution)."""
        first, last = int(first_s / BIN_S), int(last_s / BIN_S)
        return sum(self.acked[first:last]) / max(BIN_S, (last - first) * BIN_S)


class Pacer:
    """Hands out bytes at the offered rate: ``rate_at(t)`` integrated since the start."""

    def __init__(self, params: Params, started: float) -> None:
        self.params = params
        self.started = started
        self.lock = threading.Lock()
        self.granted = 0.0
        self.start_rate = SPEED
        self.end_rate = OVERLOAD * PARTITIONS * SPEED

    def allowed(self, elapsed: float) -> float:
        ramp = self.params.ramp_s
        if elapsed <= ramp:
            return self.start_rate * elapsed + (self.end_rate - self.start_rate) * elapsed**2 / (
                2 * ramp
            )
        return self.allowed(ramp) + self.end_rate * (elapsed - ramp)

    def take(self, size: int, deadline: float) -> bool:
        """Wait until ``size`` more bytes are offered; False once ``deadline`` passed."""
        while True:
            now = time.monotonic()
            if now >= deadline:
                return False
            with self.lock:
                if self.granted + size <= self.allowed(now - self.started):
                    self.granted += size
                    return True
            time.sleep(0.002)


def _topic(directory: str, auto: bool) -> TopicLog:
    topic = TopicLog(FileSystem(), directory, "bench", SYSTEM_CLOCK, create=True)
    count = 1 if auto else PARTITIONS
    topic.create(
        TopicConfig(partition_count=count, fsync_policy=FsyncPolicy.GROUP),
        AutoPartitioning(
            strategy="scale_up" if auto else "paused",
            up_percent=80,
            window_us=1_000_000,
            max_active=PARTITIONS,
            write_speed=SPEED,
        ),
    )
    return topic


def run_topic(directory: str, auto: bool, params: Params) -> Trace:
    """Write to a fresh topic for ramp + hold seconds; the trace of what it acknowledged."""
    topic = _topic(directory, auto)
    trace = Trace("auto (1 partition at start)" if auto else f"fixed ({PARTITIONS} partitions)")
    total_s = params.ramp_s + params.hold_s
    bins = int(total_s / BIN_S) + 1
    trace.acked = [0] * bins
    trace.partitions = [0] * bins
    payload = b"m" * MESSAGE_BYTES
    started = time.monotonic()
    deadline = started + total_s
    pacer = Pacer(params, started)
    lock = threading.Lock()
    errors: list[BaseException] = []

    def writer(number: int) -> None:
        keys = [f"producer-{k}" for k in range(number, KEYS, WRITERS)]
        seq_nos = dict.fromkeys(keys, 0)
        turn = 0
        try:
            while pacer.take(BATCH * MESSAGE_BYTES, deadline):
                key = keys[turn % len(keys)]
                turn += 1
                first = seq_nos[key] + 1
                seq_nos[key] += BATCH
                batch = build_wire_batch([payload] * BATCH, producer_id=key,
                                         seq_no=list(range(first, first + BATCH)))  # fmt: skip
                result = topic.append(batch, max_delay_s=30)
                at = int((time.monotonic() - started) / BIN_S)
                with lock:
                    if at < bins:
                        trace.acked[at] += result.written_count * MESSAGE_BYTES
        except BaseException as error:
            errors.append(error)

    def sampler() -> None:
        while time.monotonic() < deadline:
            elapsed = time.monotonic() - started
            active = len(topic.active_partition_ids())
            trace.partitions[min(bins - 1, int(elapsed / BIN_S))] = active
            if active >= PARTITIONS and trace.final_at_s is None:
                trace.final_at_s = elapsed
            time.sleep(BIN_S / 5)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(WRITERS)]
    threads.append(threading.Thread(target=sampler))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    trace.splits = topic.splits
    for index in range(1, bins):  # bins the sampler skipped keep the count before them
        trace.partitions[index] = trace.partitions[index] or trace.partitions[index - 1]
    topic.close()
    if errors:
        raise errors[0]
    return trace


def draw_chart(traces: list[Trace], params: Params, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (top, bottom) = plt.subplots(2, 1, figsize=(8, 5.5), dpi=80, sharex=True)
    total = params.ramp_s + params.hold_s
    whole_bins = int(total / BIN_S)  # the last, partial bin is left out
    for trace, colour in zip(traces, ("#2b6cb0", "#a0aec0"), strict=True):
        times = [index * BIN_S for index in range(whole_bins)]
        rates = [b / BIN_S / 2**20 for b in trace.acked[:whole_bins]]
        top.plot(times, rates, label=trace.label, color=colour)
        bottom.step(times, trace.partitions[:whole_bins], where="post", label=trace.label,
                    color=colour)  # fmt: skip
    offered = [
        min(OVERLOAD * PARTITIONS * SPEED, SPEED + (OVERLOAD * PARTITIONS - 1) * SPEED * t
            / params.ramp_s) / 2**20
        for t in [index * BIN_S for index in range(int(total / BIN_S) + 1)]
    ]  # fmt: skip
    top.plot([i * BIN_S for i in range(len(offered))], offered, "--", color="#718096",
             label="offered")  # fmt: skip
    top.axvspan(total - params.settled_s, total, color="#edf2f7", label="settled window")
    top.set_ylabel("written MiB/s")
    top.set_title(f"Autopartitioning: {SPEED // 1024} KiB/s per partition, 1 s window")
    top.legend(fontsize=8, loc="upper left")
    bottom.set_ylabel("active partitions")
    bottom.set_xlabel("seconds")
    bottom.set_ylim(0, PARTITIONS + 1)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)


def run(rec: Recorder) -> None:
    params = QUICK if rec.quick else FULL
    parent = tempfile.mkdtemp(
        prefix="topicbase-bench-ap-", dir=os.environ.get("TOPICBASE_BENCH_DIR") or None
    )
    try:
        rec.progress(f"-- autopartitioning: auto topic, {params.ramp_s + params.hold_s:.0f} s")
        auto = run_topic(os.path.join(parent, "auto"), True, params)
        rec.progress(f"-- autopartitioning: fixed topic, {params.ramp_s + params.hold_s:.0f} s")
        fixed = run_topic(os.path.join(parent, "fixed"), False, params)
    finally:
        shutil.rmtree(parent, ignore_errors=True)
    total = params.ramp_s + params.hold_s
    window = (total - params.settled_s, total)
    auto_rate, fixed_rate = auto.rate(*window), fixed.rate(*window)
    rec.add(
        "autopartitioning.settled.mb_s",
        auto_rate / 1e6,
        "MB/s",
        group="autopartitioning",
        baseline=f"created with {PARTITIONS} partitions",
        baseline_value=fixed_rate / 1e6,
        target=ratio_target(TARGET, f"a topic created with {PARTITIONS} partitions"),
        target_ratio=TARGET,
        note=(
            f"last {params.settled_s:g} s of {total:g}; {SPEED // 1024} KiB/s per partition; "
            f"offered rising to {OVERLOAD:g}x the {PARTITIONS}-partition capacity"
        ),
    )
    rec.add(
        "autopartitioning.whole_run.mb_s",
        auto.rate(0, total) / 1e6,
        "MB/s",
        group="autopartitioning",
        baseline=f"created with {PARTITIONS} partitions",
        baseline_value=fixed.rate(0, total) / 1e6,
        note="the whole run, ramp included (the auto topic starts with 1 partition)",
    )
    rec.add(
        "autopartitioning.seconds_to_final_partitions",
        auto.final_at_s if auto.final_at_s is not None else float("nan"),
        "s",
        group="autopartitioning",
        note=f"{auto.splits} splits from 1 to {PARTITIONS} active partitions",
    )
    draw_chart([auto, fixed], params, CHART)
    rec.progress(f"chart: {CHART}")
