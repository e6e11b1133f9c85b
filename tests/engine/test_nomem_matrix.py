"""A ``MemoryError`` at each failpoint of the commit paths, among concurrent commits.

Under the server's process memory cap (``sql.pgwire.memory_cap``) any allocation may
fail, in the storage and the engine as much as in DuckDB. ``nomem_worker.py`` (a forked
child) runs five sessions side by side (topic-only commits in the log, table commits
through DuckDB, counter deltas, group-committed produces, statements spread over a
topic's partitions; checkpoints every 3 commits) with ``name=nomem@n`` armed: the
``n``-th pass of that failpoint raises ``MemoryError``. Checked for each failpoint:

- it fired (else the plan is wrong, not the code), and no thread hung (a group-commit
  follower not woken, a lock or a commit turn held: the child reports ``hang``);
- the statement that hit it, if a session's, got an error naming it;
- the child then closes the database (``close``) or ends at once (``abandon``, as a
  crash with the page cache intact); the directory reopened (recovery) is consistent:
  ``txn_worker.check_moved``/``check_counted`` (every committed move once, offsets and
  table rows agreeing with the topics), the totals add up to the ``adder`` consumer's
  offsets, every acknowledged produce and spread statement is there exactly once and a
  failed one whole or not at all, ``topicbase check`` finds nothing, and a new commit
  works.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import pytest

from engine.check import check_database
from engine.database import Database
from tests.fork_server import ModuleForkServer

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import nomem_worker as worker  # noqa: E402
import txn_worker as tw  # noqa: E402

_SERVER = ModuleForkServer(HERE / "nomem_worker.py")
_fork_server = _SERVER.fixture()

# Every failpoint this workload passes, with the pass that fails (the first passes of a
# failpoint hit while the data set is made come before the arming: not counted).
FAILPOINTS = {
    "commit.before_validate": 3,  # a slot being made (claims, turn): nothing taken
    "commit.before_log_append": 3,  # validated, nothing appended
    "commit.log_appended": 3,  # appended under the commit lock: in doubt, commits refused
    "commit.after_log_append": 3,  # appended, not known durable: in doubt
    "staging.after_sync": 3,  # the group commit's sync done, its waiters not told
    "staging.torn_record": 3,  # half a commit record written
    "staging.prewrite": 1,  # a staging file's window about to be pre-written
    "commit.after_stage": 2,  # a table commit's staged writes durable, before COMMIT
    "commit.after_commit_point": 3,  # committed, nothing published
    "commit.log_durable": 3,  # a log commit's record durable, the committer not caught up
    "commit.before_mirror": 3,  # committed, the offsets' mirror not moved
    "commit.before_note_done": 3,  # published, not counted for the checkpoint
    "commit.mid_publish": 2,  # one share published, the others not
    "publish.mid_share": 1,  # between two frames of one partition's share
    "publish.mid_spread": 2,  # between two partitions' shares of a spread statement
    "commit.checkpoint_before_delete": 2,  # partitions synced, DuckDB not written
    "commit.checkpoint_before_release": 2,  # checkpointed, staging not released
    "deltas.before_commit": 3,  # a group of counter deltas before its DuckDB COMMIT
    "deltas.after_commit": 3,  # ... after it
    "fs.before_sync": 5,  # any counted fsync (staging, partitions, checkpoint)
    "fs.after_sync": 5,
    "index.before_flush": 2,
    "segment.torn_write": 3,  # half a frame written to a partition's log
    "partition.after_write": 2,  # a frame written, its producer state not recorded ...
}
# Passed only by a spread statement that commits through the staging log: with the ledger
# on (``pytest --ledger``) it goes to the topic's ledger, so these run with it off.
STAGING_SPREAD_FAILPOINTS = frozenset({"publish.mid_spread"})
# ... sampled at more passes: each falls on another thread's write (a group-committed
# produce, a spread statement's share, a publish), as the threads interleave.
MORE_PASSES = {"partition.after_write": (10, 40)}
CASES = [f"{name}@{nth}" for name, nth in sorted(FAILPOINTS.items())] + [
    f"{name}@{nth}" for name, passes in MORE_PASSES.items() for nth in passes]


# Failpoints passed by background threads (the checkpointer, the deltas' applier; a sync or
# an index flush may be a checkpoint's or a commit's): their error is logged and retried, or
# stops the committer, without a statement to report it to.
BACKGROUND = {"commit.checkpoint_before_delete", "commit.checkpoint_before_release",
              "deltas.before_commit", "deltas.after_commit", "fs.before_sync",
              "fs.after_sync", "index.before_flush"}  # fmt: skip

# Refusals past a commit point that the committer now finishes in-process (round 25, H4:
# ``Committer._past_point`` and ``_finish_now``): the commit is reported committed.
FINISHED = {"commit.after_commit_point", "commit.before_mirror", "commit.before_note_done",
            "commit.mid_publish", "publish.mid_spread"}  # fmt: skip
# Finished in-process, or the partition fenced (then told), by which write it hits.
EITHER = {"segment.torn_write"}


def _run(data: Path, spec: str, end: str) -> dict:
    done = _SERVER.run([str(data), spec, end], timeout=600)
    assert done.returncode == 0, (done.returncode, done.stdout[-4000:], done.stderr[-4000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def _present(session, topic: str) -> Counter:
    return Counter(row["data"] for row in tw.topic_rows(session, topic))


def _check_reopened(data: Path, outcome: dict) -> None:
    database = Database.open(str(data), retention_interval_s=None)
    try:
        session = database.connect()
        tw.check_moved(session, table=True)
        tw.check_counted(session)
        totals = session.execute("SELECT coalesce(sum(n), 0) AS n FROM totals")[-1].table
        added = sum(tw.committed_offsets(session, "adder").values())
        d = _present(session, "d")
        assert max(d.values(), default=1) == 1, "a message moved to d twice"
        assert totals.to_pylist()[0]["n"] == added == len(d), (
            f"totals {totals.to_pylist()}, adder's offsets {added}, d {len(d)}")
        a = Counter((parse[0], parse[1]) for parse in
                    (tw.parse(d) for d in _present(session, "a").elements()))  # fmt: skip
        for source, first, count in outcome["produced"]:
            found = [a[(source, seq)] for seq in range(first, first + count)]
            assert found == [1] * count, f"acknowledged produce s{source}@{first}: {found}"
        for source, first, count in outcome["produce_failed"]:
            found = [a[(source, seq)] for seq in range(first, first + count)]
            assert found in ([0] * count, [1] * count), f"failed produce half there: {found}"
        c = _present(session, "c")
        for statement in outcome["spread"] + outcome["spread_failed"]:
            found = [c[f"c:{statement}:{i}".encode()] for i in range(worker.SPREAD_ROWS)]
            whole = [1] * worker.SPREAD_ROWS
            if statement in outcome["spread"]:
                assert found == whole, f"acknowledged spread statement {statement}: {found}"
            else:
                assert found in ([0] * worker.SPREAD_ROWS, whole), f"half there: {found}"
        e = _present(session, "e")
        for number in outcome["big"] + outcome["big_failed"]:
            found = [e[f"e:{number}:{i}".encode()] for i in range(worker.BIG_ROWS)]
            whole = [1] * worker.BIG_ROWS
            if number in outcome["big"]:
                assert found == whole, f"acknowledged transaction {number} to e: {found}"
            else:
                assert found in ([0] * worker.BIG_ROWS, whole), f"half there: {found}"
        session.execute("BEGIN")
        session.execute(tw.MOVE.format(k=5))
        session.execute("COMMIT")  # the reopened engine commits again
        tw.check_moved(session, table=True)
        session.close()
    finally:
        database.close()
    report = check_database(str(data))
    assert report.ok, report.lines()


@pytest.mark.parametrize("end", ["close", "abandon"])
@pytest.mark.parametrize("case", CASES)
def test_a_memory_error_at_a_commit_failpoint_leaves_a_consistent_store(
        tmp_path: Path, case: str, end: str, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    data = tmp_path / "data"
    failpoint, nth = case.split("@")[0], int(case.split("@")[1])
    if failpoint in STAGING_SPREAD_FAILPOINTS:  # the worker's spread statement must stage
        monkeypatch.setenv("TOPICBASE_LEDGER", "0")  # (the fork server passes it on)
    outcome = _run(data, f"{failpoint}=nomem@{nth}", end)
    assert outcome["hits"].get(failpoint, 0) >= nth, f"never fired (plan): {outcome}"
    if failpoint in FINISHED:  # finished in-process: no statement is told of the failpoint
        assert not any(f"failpoint {failpoint}" in e for _, _, e in outcome["errors"]), (
            outcome["errors"][:5])
    elif failpoint not in BACKGROUND | EITHER:  # the statement that hit it was told
        assert any(f"failpoint {failpoint}" in error for _, _, error in outcome["errors"]), (
            outcome["errors"][:5])
    _check_reopened(data, outcome)
