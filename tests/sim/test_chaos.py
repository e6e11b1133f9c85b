"""A short chaos run in the test suite: kills and failpoint crashes, then the checkers
(at cycle 3 and at the end; every worker records an incremental observation)."""

from __future__ import annotations

import re

import pytest

from engine import moved_refs
from engine.database import Database
from tests.sim import chaos
from tests.sim import history as h
from tests.sim.chaos_worker import (
    Observed,
    Worker,
    dst_value,
    moved_origin,
    observe_database,
    run_worker,
    setup,
)
from tests.sim.checker import Report, check_file


def test_short_chaos_run_finds_no_violation(tmp_path, capsys):
    status = chaos.main(
        ["--cycles", "6", "--check-every", "3", "--seed", "20261121", "--data-dir", str(tmp_path)]
    )
    last = capsys.readouterr().out.strip().splitlines()[-1]
    match = re.fullmatch(
        r"chaos: (\d+) cycles, (\d+) kills, (\d+) failpoints, (\d+) power cuts, "
        r"(\d+) messages, (\d+) transactions, "
        r"(\d+) automatic splits \(of (\d+) driven\), (\d+) violations",
        last,
    )
    assert match, last
    cycles, kills, failpoints, cuts, messages, transactions, split, driven, violations = map(
        int, match.groups()
    )
    assert status == 0 and violations == 0, last
    assert split <= driven
    assert cycles == 6 and kills + failpoints + cuts >= 3
    assert messages > 0 and transactions > 0


def test_follower_keeps_what_the_next_cycle_needs(tmp_path):
    """The runner's view of the history (seq_nos, observations rebuilt from increments,
    transactions without an outcome) agrees with what the checker rebuilds."""
    path = tmp_path / "history.jsonl"
    follower = chaos.Follower(str(path))
    with h.HistoryWriter(path, "worker-1") as w:
        w.invoke("src", "p0", 3)
        w.invoke("src", "p0", 5)
        w.invoke("src", "p1", 1)
        w.final("t:src/0", ["a", "b"], [0, 1], count=2, digest=h.list_digest(["a", "b"]))
        w.final("r:x", ["x1"], count=1, digest=h.list_digest(["x1"]))
        w.record("invoke", id="T1", ops=[h.append_op("r:x", "x2")])
    follower.update()
    assert follower.known.seq_nos == {"p0": 5, "p1": 1}
    assert follower.known.observed["t:src/0"] == Observed(2, h.list_digest(["a", "b"]), 2)
    follower.settle_unknown_transactions()  # T1 logged its COMMIT, then its process died
    assert follower.pending == {}
    with h.HistoryWriter(path, "worker-2") as w:
        w.final("t:src/0", ["c"], [2], base=2, count=3)  # a tail
        w.final("r:x", ["x2"], base=1, base_digest=h.list_digest(["x1"]), count=2)
    follower.update()
    report = check_file(path, allowed={"unknown-value"})  # values written by nobody here
    assert report.ok, report.summary()
    assert report.stats["txns_info"] == 1
    for key in ("t:src/0", "r:x"):
        seen = follower.known.observed[key]
        assert (seen.count, seen.digest) == (
            len(report.final[key]),
            h.list_digest(report.final[key]),
        )
    assert follower.known.observed["t:src/0"].end == 3
    with h.HistoryWriter(path, "worker-3") as w:  # an increment that does not follow on
        w.final("r:x", ["x3"], base=1, base_digest=h.list_digest(["x1"]))
    follower.update()
    assert "r:x" not in follower.known.observed  # the next observation of it is whole


@pytest.mark.parametrize("failpoint", ["retention.before_delete", "split.before_save"])
def test_crash_in_retention_or_a_split_recovers_clean(tmp_path, failpoint):
    """Workers crash at the failpoint; each time recovery leaves a store that
    ``topicbase check`` finds clean, and the history (log starts, split lineage)
    checks clean."""
    data_dir, history = str(tmp_path / "data"), str(tmp_path / "history.jsonl")
    chaos.run_in_child(lambda: setup(data_dir), tmp_path / "setup.log", "setup")
    follower = chaos.Follower(history)
    for cycle in (1, 2, 3):

        def body(ready, cycle=cycle):
            run_worker(data_dir, history, cycle, cycle, 5.0, follower.known, ready)

        child = chaos.Child(body, tmp_path / "worker.log", f"{failpoint}=crash@1")
        assert child.wait() == 137, child.log.read_text()[-2000:]  # crashed there
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
    if failpoint == "split.before_save":
        splits = [e for e in events if e["type"] == "split"]
        assert [e["status"] for e in splits] == ["invoke"] * 3  # none got through
        parent = splits[-1]["partition"]
        last = [e for e in events if e["type"] == "lineage"][-1]["partitions"]
        assert [parent, True, [], None] in last  # entirely before the split
    else:
        # Every pass that had something to delete crashed before removing the files, but
        # after making the new log start durable: recovery keeps it (it used to fall back
        # to 0, the segments coming back), and the checker saw it never move backwards.
        aged = [e for e in events if e["type"] == "final" and e["key"].startswith("t:aged/")]
        assert aged and max(e["start"] for e in aged) > 0


def test_make_chaos_starts_in_a_fresh_process(tmp_path):
    """`make chaos` forks workers only after its warm-up left no native threads running
    (the sandbox's DuckDB parser connections hold some): a fresh process must get past it.
    (Inside pytest the thread count before the warm-up hides such a leak.)"""
    import subprocess
    import sys
    from pathlib import Path

    done = subprocess.run(
        [sys.executable, "-m", "tests.sim.chaos", "--cycles", "1", "--seed", "7",
         "--data-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=300, cwd=Path(__file__).parents[2],
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1].endswith("0 violations"), done.stdout[-500:]


def _report(final: dict[str, list], committed: dict[tuple[str, str, int], int]) -> Report:
    report = Report()
    report.final = {key: list(values) for key, values in final.items()}
    report.final_offsets = {key: list(range(len(values))) for key, values in final.items()}
    report.committed = dict(committed)
    return report


def test_moves_by_reference_are_told_apart_by_their_created_at():
    assert dst_value("m:p0:1@T1.2", 5) == "m:p0:1@T1.2"  # a copying move's own value
    assert dst_value("p0:1", 5) == "p0:1@R5"
    assert dst_value("m:p0:1@T1.2", 5, "chain") == "m:p0:1@T1.2@R5"  # moved again
    assert moved_origin("p0:1@R5") == moved_origin("m:p0:1@T1.2") == "p0:1"


def test_exactly_once_over_moves_by_reference():
    """Copies and moves by reference count alike; a source message moved by reference
    twice (two created_at) is reported, as are the retention topic's, a dropped source's
    and the chained moves' duplicates, losses and arrivals nobody consumed."""
    clean = {
        "t:src/0": ["p0:1", "p0:2", "p0:3"],
        "t:dst/0": ["p0:1@R100", "m:p0:2@T1.1", "g1.1@R101", "d1.1@R102"],
        "t:aged/0": ["g1.2"],  # g1.1 expired (below the start), after reaper read it
        "t:chain/0": ["p0:1@R200", "m:p0:2@T1.1@R201"],
    }
    offsets = {("src", "mover", 0): 2, ("aged", "reaper", 0): 0, ("dst", "chainer", 0): 2}
    assert chaos.check_exactly_once_moves(_report(clean, offsets)) == []
    broken = {
        **clean,
        "t:dst/0": [
            *("p0:1@R100", "m:p0:2@T1.1", "p0:1@R103"),
            *("g1.2@R104", "d1.1@R102", "d1.1@R105"),
        ],
        "t:chain/0": ["m:p0:2@T1.1@R201", "x@R202"],
    }
    problems = chaos.check_exactly_once_moves(_report(broken, offsets))
    expected = [
        "'p0:1' moved 2 times",
        "'g1.2' arrived without being consumed",  # above reaper's committed offset
        "'d1.1' moved 2 times",
        "'p0:1' chained 0 times",
        "'x' chained without being consumed",
    ]
    assert sorted(problems) == sorted(expected), problems


def test_a_move_by_reference_that_commits_a_copy_fails_the_worker(tmp_path, monkeypatch):
    """The worker checks that each committed move by reference went by reference: one the
    commit stages as a copy (here: its source deemed unusable) stops the worker."""
    data_dir = str(tmp_path / "data")
    setup(data_dir)
    database = Database.open(data_dir)
    session = database.connect()
    try:
        session.execute("INSERT INTO TOPIC src (data, partition) VALUES ('a', 0), ('b', 0)")
        with h.HistoryWriter(tmp_path / "history.jsonl", "worker-1") as history:
            worker = Worker(database, session, history, 1, 0, {}, {})
            worker.rng.random = lambda: 0.0  # src, partition order aside
            worker.rng.sample = lambda ids, k: [0]
            monkeypatch.setattr(moved_refs, "usable", lambda db, source: False)
            with pytest.raises(AssertionError, match="by copy, not by reference"):
                worker.move_ref()
            monkeypatch.undo()
            session.execute("INSERT INTO TOPIC src (data, partition) VALUES ('c', 0)")
            before = database.committer.moved_shares
            worker.move_ref()  # the next one goes by reference
            assert database.committer.moved_shares == before + 1
    finally:
        session.close()
        database.close()
