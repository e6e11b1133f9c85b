"""The move benchmark's CPU figures per transaction (issue 14, docs/move_profile.md round 24):
besides the process's CPU, its kernel part and the minor page faults, so that two runs of the
same code can be told apart by where their CPU went."""

from __future__ import annotations

import math
from pathlib import Path

from bench import transactions_bench as tb
from bench.storage_bench import make_messages

TICK_S = 0.01  # the coarsest CPU accounting a kernel reports (one 100 Hz tick)


def test_a_timed_move_phase_reports_system_time_and_faults_per_transaction(tmp_path: Path):
    work = next(w for w in tb.WORKLOADS if w.name == "move_topics")
    move = tb.TopicbaseMove(str(tmp_path), work, 2, make_messages(count=64), 0.0)
    try:
        move.warm_up(0.2)
        figures = move.timed(0.4)
    finally:
        move.close()
    assert figures["rate"] > 0  # a phase that ran dry (a small fill) still counts its CPU
    transactions = figures["rate"] * 0.4
    for name in ("cpu_ms_per_txn", "sys_ms_per_txn", "minor_faults_per_txn"):
        assert math.isfinite(figures[name]) and figures[name] >= 0, (name, figures[name])
    # the kernel's part is part of the process's CPU (within one tick of accounting)
    slack_ms = 2 * TICK_S * 1000 / max(transactions, 1)
    assert figures["sys_ms_per_txn"] <= figures["cpu_ms_per_txn"] + slack_ms
