"""bench.transactions_diag: the arithmetic of its readings (no PostgreSQL, no timing)."""

from __future__ import annotations

import threading

import pytest

from bench import transactions_diag as diag


def test_delta_leaves_out_processes_that_started_or_exited_between_readings() -> None:
    before = {1: (10.0, 4.0), 2: (50.0, 9.0)}  # pid 2 exits before the second reading
    after = {1: (12.5, 5.0), 3: (0.5, 0.1)}  # pid 3 started in between
    assert diag.delta(before, after, 0) == pytest.approx(2.5)
    assert diag.delta(before, after, 1) == pytest.approx(1.0)
    assert diag.delta({1: 100, 2: 900}, {1: 160}) == 60  # write bytes: no drop of 900


def test_split_adds_up_to_the_wall_time() -> None:
    rows = [(0.010, 0.002, 0.005), (0.020, 0.004, 0.006)]  # (wall, run, run queue) s
    s = diag.split(rows)
    assert s is not None and s["n"] == 2
    assert s["mean"] == pytest.approx(15.0)
    assert s["run"] + s["queue"] + s["asleep"] == pytest.approx(s["mean"])
    assert s["asleep"] == pytest.approx(6.5)
    assert diag.split([]) is None


def test_file_kinds() -> None:
    assert diag.file_kind("/d/staging/000001.staging") == "staging"
    assert diag.file_kind("/d/topics/t1/p0/00000000000000000000.log") == "partition"
    assert diag.file_kind("/d/store/tmp") == "other"


def test_thread_sched_counts_this_threads_cpu() -> None:
    found: list[tuple[float, float]] = []

    def spin() -> None:
        first = diag.thread_sched()
        total = 0
        for i in range(300_000):
            total += i
        last = diag.thread_sched()
        found.append((last[0] - first[0], last[1] - first[1]))

    thread = threading.Thread(target=spin)
    thread.start()
    thread.join()
    run, queue = found[0]
    assert run > 0 and queue >= 0
