"""Round 25 (H4), R1 F7 of round 24: one session's refused allocation past its commit point
must not stop every commit.

The process memory cap is process-wide: another session's statement can take the room an
allocation past a commit point needs. Before round 25 a ``MemoryError`` at
``commit.before_mirror`` or ``commit.before_note_done`` stopped the committer (58030 for
every later commit until reopen). Now the committer frees its reserve, collects garbage and
runs the same idempotent step again (``Committer._past_point``). Here, with ``nomem`` armed
once at each point, the commit that hit it must be reported committed, later commits by
another session must succeed without a reopen, and the reopened store must hold each move
once. In-process and deterministic (one failpoint hit, no threads).
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import pytest

from engine.commit import PastCommitPoint
from engine.database import Database
from storage import failpoints

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import txn_worker as tw  # noqa: E402

POINTS = (
    "commit.after_commit_point",
    "commit.before_mirror",
    "commit.mid_publish",
    "commit.before_note_done",
)


@pytest.mark.parametrize("point", POINTS)
def test_refused_allocation_past_the_point_does_not_stop_commits(tmp_path, point) -> None:
    data = str(tmp_path / "data")
    database = Database.open(data, retention_interval_s=None)
    try:
        a, b = database.connect(), database.connect()
        tw.create(a)
        tw.produce(a, 1, 20)
        failpoints.activate(f"{point}=nomem")
        try:
            a.execute("BEGIN")
            a.execute(tw.MOVE.format(k=5))  # two partitions or more: ``mid_publish`` is hit
            a.execute("COMMIT")  # committed, and told so
            assert failpoints._hits.get(point, 0) >= 1  # reached (a retry passes again)
        finally:
            failpoints.deactivate()
        assert database.committer._stopped is None
        for k in (4, 3):  # another session's commits, without a reopen
            b.execute("BEGIN")
            b.execute(tw.MOVE.format(k=k))
            b.execute("COMMIT")
        a.close()
        b.close()
    finally:
        failpoints.deactivate()
        with contextlib.suppress(Exception):
            database.close()
    reopened = Database.open(data, retention_interval_s=None)
    try:
        session = reopened.connect()
        found = tw.check_moved(session)
        assert found.consumed == 12 and found.b_messages == 12  # each move once
        session.close()
    finally:
        reopened.close()


SPREAD_PARTITIONS = 6
SPREAD_ROWS = 12


def _spread(session, statement: int) -> None:
    """An autocommit statement spread over topic ``c``'s partitions (``engine.spread_append``:
    one commit record, a share per partition; ``producer_id`` routes the rows apart)."""
    session.execute(
        "INSERT INTO TOPIC c (data, producer_id) "
        f"SELECT 'c:{statement}:' || i, 'p' || i FROM range({SPREAD_ROWS}) t(i)"
    )


def _spread_rows(session) -> dict[bytes, int]:
    found: dict[bytes, int] = {}
    for row in tw.topic_rows(session, "c"):
        found[row["data"]] = found.get(row["data"], 0) + 1
    return found


@pytest.mark.parametrize("point", ["commit.mid_publish", "publish.mid_spread"])
def test_a_spread_statement_finished_after_a_refusal_says_it_committed(
    tmp_path, point, ledger_off
) -> None:
    """Round 26 (H1): the one caller that reads the publish's results (``finish``: None for a
    share finished by ``_finish_now``, its offsets unknown) is an autocommit statement spread
    over partitions. It reports the statement committed and published (``PastCommitPoint``,
    not the ``MemoryError`` nor an assertion), the rows are there once, and later statements
    commit. (The staging path's publish: the ledger off whatever the lane.)"""
    data = str(tmp_path / "data")
    database = Database.open(data, retention_interval_s=None)
    try:
        session = database.connect()
        session.execute(f"CREATE TOPIC c WITH (min_active_partitions = {SPREAD_PARTITIONS})")
        commits = database.committer.log_commits
        failpoints.activate(f"{point}=nomem")
        try:
            with pytest.raises(PastCommitPoint, match="committed and published"):
                _spread(session, 0)
            assert failpoints._hits.get(point, 0) == 1
        finally:
            failpoints.deactivate()
        assert database.committer.log_commits == commits + 1  # the spread way, one record
        assert database.committer._stopped is None
        _spread(session, 1)
        expected = {f"c:{s}:{i}".encode(): 1 for s in (0, 1) for i in range(SPREAD_ROWS)}
        assert _spread_rows(session) == expected
        session.close()
    finally:
        failpoints.deactivate()
        with contextlib.suppress(Exception):
            database.close()
    reopened = Database.open(data, retention_interval_s=None)
    try:
        session = reopened.connect()
        assert _spread_rows(session) == expected  # recovery published nothing twice
        session.close()
    finally:
        reopened.close()


class _RefusedMidway(dict):
    """Offset moves whose walk number ``refused_walk`` is refused after one move (a
    ``MemoryError`` in the middle of ``CatalogStore.apply_offsets``); other walks are
    whole."""

    def __init__(self, moves: dict, refused_walk: int) -> None:
        super().__init__(moves)
        self.refused_walk = refused_walk
        self.walks = 0
        self.refused = False

    def items(self):  # type: ignore[override]
        walk, self.walks = self.walks, self.walks + 1
        for number, item in enumerate(super().items()):
            if number == 1 and walk == self.refused_walk and not self.refused:
                self.refused = True
                raise MemoryError("refused midway (test)")
            yield item


@pytest.mark.parametrize("refused_walk", [0, 1])
def test_the_mirror_moved_again_after_a_refusal_midway_is_moved_once(
    tmp_path, refused_walk: int
) -> None:
    """Round 26 (H1): ``_past_point`` runs ``apply_offsets`` again after a refusal, which
    must then leave the mirror as one whole run would. Before, the offsets were replaced
    first and the remembered ranges fixed key by key after: a refusal between two keys
    left a move back (SET OFFSETS) looking like no move, so the retry kept ranges ahead of
    the rewound offset that must go. Refused in the walk that makes the consumers' new
    offset maps (0) and in the one that fixes the remembered ranges (1)."""
    forward, back = ("t", "c", 0), ("t", "c", 1)
    states = []
    for refused in (False, True):
        database = Database.open(str(tmp_path / f"data{refused}"), retention_interval_s=None)
        try:
            catalog = database.catalog
            catalog._offsets = {("t", "c"): {0: 5, 1: 50}}
            catalog._pending = {forward: [(8, 9), (20, 30)], back: [(60, 70)]}
            moves = {forward: 10, back: 40}
            if refused:
                moves = _RefusedMidway(moves, refused_walk)
                with pytest.raises(MemoryError):
                    catalog.apply_offsets(moves)
                assert moves.refused
                assert catalog.committed("t", "c", 0) == 5  # nothing moved
            catalog.apply_offsets(moves)
            states.append(({k: dict(v) for k, v in catalog._offsets.items()},
                           dict(catalog._pending)))  # fmt: skip
        finally:
            database.close()
    assert states[0] == ({("t", "c"): {0: 10, 1: 40}}, {forward: [(20, 30)]})
    assert states[1] == states[0]
