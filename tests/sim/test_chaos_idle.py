"""Idle chaos cycles: retention empties the idle topic, crashes around the roll recover clean.

A child writes to the idle topic (1 s retention, important consumer ``keeper``) as an
ordinary cycle would; once that data has expired, an idle cycle's worker (no writes;
``keeper`` commits its backlog, then retention passes) crashes at a failpoint of the
roll or the delete. Recovery must leave a store ``topicbase check`` finds clean and a
history the checker finds clean (log starts never move back, never past ``keeper``'s
committed offset, nothing acknowledged above the log start lost); a second idle cycle,
without a failpoint, then empties the topic: every partition's log start reaches its end.
"""

from __future__ import annotations

import time

import pytest

from engine.database import Database
from tests.sim import chaos
from tests.sim import history as h
from tests.sim.chaos_worker import (
    IDLE,
    IDLE_CYCLE_EVERY,
    Worker,
    idle_cycle,
    observe_database,
    run_worker,
    setup,
)
from tests.sim.checker import check_file

# Worker seeds whose idle cycle has keeper take its whole backlog (``run_idle``'s first
# draw), so that the passes have something to roll and delete.
WHOLE_BACKLOG_SEEDS = (0, 5)


def _write_idle(data_dir: str, history: str) -> None:
    """As an ordinary cycle does: a few recorded writes to the idle topic."""
    db = Database.open(data_dir, retention_interval_s=None)
    session = db.connect()
    try:
        with h.HistoryWriter(history, "writer") as writer:
            worker = Worker(db, session, writer, 1, 1, {}, {})
            for _ in range(4):
                worker._write_values(IDLE, "i")
    finally:
        session.close()
        db.close()


@pytest.mark.parametrize(
    "failpoint", ["retention.before_roll", "segment.roll_before_snapshot", "retention.after_roll"]
)
def test_an_idle_cycle_crashing_around_the_roll_recovers_and_then_empties_the_topic(
    tmp_path, failpoint
):
    assert idle_cycle(IDLE_CYCLE_EVERY) and not idle_cycle(IDLE_CYCLE_EVERY + 1)
    data_dir, history = str(tmp_path / "data"), str(tmp_path / "history.jsonl")
    chaos.run_in_child(lambda: setup(data_dir), tmp_path / "setup.log", "setup")
    chaos.run_in_child(lambda: _write_idle(data_dir, history), tmp_path / "write.log", "writes")
    time.sleep(1.2)  # the writes expire (retention_period PT1S)
    follower = chaos.Follower(history)
    follower.update()
    for cycle, seed, arm in (
        (IDLE_CYCLE_EVERY, WHOLE_BACKLOG_SEEDS[0], f"{failpoint}=crash@1"),
        (2 * IDLE_CYCLE_EVERY, WHOLE_BACKLOG_SEEDS[1], ""),
    ):

        def body(ready, cycle=cycle, seed=seed):
            run_worker(data_dir, history, cycle, seed, 0.6, follower.known, ready)

        child = chaos.Child(body, tmp_path / "worker.log", arm)
        assert child.wait() == (137 if arm else 0), child.log.read_text()[-2000:]
        follower.settle_unknown_transactions()
        assert chaos.check_recovered(data_dir, tmp_path) == []
    chaos.run_in_child(
        lambda: observe_database(data_dir, history, follower.known.observed),
        tmp_path / "observer.log",
        "observation",
    )
    report = check_file(history)
    assert report.ok, report.summary()
    events = h.load(history)
    finals = {e["key"]: e for e in events if e["type"] == "final" and e["key"].startswith("t:idle")}
    written = [e for e in events if e["type"] == "ack" and e["topic"] == IDLE]
    assert written, "nothing was written to the idle topic"
    for key, final in finals.items():
        partition = int(key.rsplit("/", 1)[1])
        acked = [e["offset"] for e in written if e["partition"] == partition]
        assert final["start"] == (max(acked) + 1 if acked else 0), final  # emptied
        assert final.get("values") in (None, []), final
