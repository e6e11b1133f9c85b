"""A short chaos run in the test suite: kills and failpoint crashes, then the checkers
(at cycle 3 and at the end; every worker records an incremental observation)."""

from __future__ import annotations

import re

from tests.sim import chaos
from tests.sim import history as h
from tests.sim.chaos_worker import Observed
from tests.sim.checker import check_file


def test_short_chaos_run_finds_no_violation(tmp_path, capsys):
    status = chaos.main(
        ["--cycles", "6", "--check-every", "3", "--seed", "20261121", "--data-dir", str(tmp_path)]
    )
    last = capsys.readouterr().out.strip().splitlines()[-1]
    match = re.fullmatch(
        r"chaos: (\d+) cycles, (\d+) kills, (\d+) failpoints, (\d+) messages, "
        r"(\d+) transactions, (\d+) violations",
        last,
    )
    assert match, last
    cycles, kills, failpoints, messages, transactions, violations = map(int, match.groups())
    assert status == 0 and violations == 0, last
    assert cycles == 6 and kills + failpoints >= 3
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
