"""Counter deltas across crashes: moves that add their count to a table, killed again and again.

``txn_worker.py --mode delta`` runs ``BEGIN; move k messages a -> b; INSERT INTO totals
VALUES (?, k) ON CONFLICT (k) DO UPDATE SET n = n + EXCLUDED.n; COMMIT`` (the upsert kept
as a delta, committed in the log record and applied to DuckDB by the background applier;
one transaction in five reads ``totals`` too and so commits the DuckDB way). The worker is
SIGKILLed at random and crashed at the failpoints between the log commit and the apply
(``commit.after_log_append``, ``staging.after_sync``, ``commit.after_commit_point``),
inside an applier's group before its DuckDB COMMIT (``deltas.before_commit``), right after
that COMMIT (``deltas.after_commit``: the group and the applied-through position are
durable, nothing after), and inside checkpoints. After every crash a copy is recovered and
checked (``txn_worker.check_totals``): ``b`` holds exactly the consumed messages once, and
the totals add up to ``b``'s messages: each committed delta applied exactly once, none of
an uncommitted transaction. At the end the worker drains ``a``.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from tests.engine import test_txn_crash as crash

tw = crash.tw
FAILPOINTS = (
    "commit.after_log_append",  # appended, maybe not synced: either outcome, consistent
    "staging.after_sync",  # the record durable, nothing applied
    "commit.after_commit_point",
    "deltas.before_commit",  # an applier's group written, not committed
    "deltas.after_commit",  # the group and its position committed, nothing after
    "commit.checkpoint_before_delete",
)
KILLS = max(2, crash.KILLS // 3)


@pytest.fixture
def server(tmp_path: Path):
    server = crash.WorkerServer(tmp_path)
    yield server
    server.close()


def _unconsumed(data: Path) -> int:
    with crash._opened(data, copy=True) as session:
        found = tw.check_totals(session)
        return found.a_messages - found.consumed


def test_counter_deltas_apply_exactly_once_across_kills_and_failpoints(
    tmp_path: Path, server
) -> None:
    seed = crash._seed()
    print(f"TXN_SEED={seed}")
    rng = random.Random(seed)
    data = tmp_path / "data"
    source = crash.Source(data, crash.INITIAL_PER_SOURCE)
    rounds: list[tuple[str, str]] = [("kill", "")] * KILLS
    rounds += [("failpoint", f"{n}=crash@{k}") for n in FAILPOINTS for k in (1, 3)]
    rng.shuffle(rounds)
    check: crash.CopyCheck | None = None
    for number, (kind, failpoint) in enumerate(rounds):
        what = f"round {number} ({kind} {failpoint})".strip()
        with crash._reported(seed, what):
            if kind == "kill":
                crash._kill_round(server, data, "delta", rng, checkpoint_every=rng.choice((3, 256)),
                                  max_messages=20)  # fmt: skip
            else:
                unconsumed = source.top_up(_unconsumed(data))
                crash._failpoint_round(server, data, "delta", failpoint, rng, unconsumed,
                                       checkpoint_every=crash.CHECKPOINT_EVERY,
                                       max_messages=20)  # fmt: skip
        if check is not None:
            found = check.join(seed)
            source.top_up(found.a_messages - found.consumed)
        check = crash.CopyCheck(data, number, tw.check_totals, what)
    if check is not None:
        check.join(seed)
    with crash._reported(seed, "final run"):
        worker = server.start(data, "delta", seed=rng.randrange(2**31), max_messages=50)
        worker.finish(0)
        with crash._opened(data, copy=False) as session:
            found = tw.check_totals(session)
            assert found.consumed == found.a_messages == found.b_messages
