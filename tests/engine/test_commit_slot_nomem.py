"""Round 26 (H1): a refused allocation where a commit's slot starts must tell the truth.

``CommitOrder.enter`` made the slot (the ``CommitSlot``, the claimed set's union, the turn
counter) after ``validate``; for a topic-only commit ``validate`` appends the commit record,
so a ``MemoryError`` there (the process memory cap) told the session its COMMIT failed
while the record was in the log, to become durable with the next group commit: the
transaction then came back at reopen (a move the client saw fail, and moved again by the
next transaction: twice), and a counter delta registered with the applier was never marked
durable nor in doubt, so every later read of a table waited for it for ever.

Now the slot is made, its keys claimed and its turn taken before ``validate``
(``CommitOrder._take``, failpoint ``commit.before_validate``), and given back if
``validate`` refuses; a failure after the record is appended
(``commit.log_appended``) reports the commit in doubt and refuses later commits until
reopen, as a failed sync does. In-process and deterministic (no threads of the test's
own but the hang bound's).
"""

from __future__ import annotations

import contextlib
import sys
import threading
from pathlib import Path

import pytest

from engine import commit_order
from engine.commit import PastCommitPoint
from engine.database import Database
from storage import failpoints
from storage.errors import StorageIOError

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import txn_worker as tw  # noqa: E402

HANG_S = 60  # a hang bound only (loaded machines)


class _RefusedOnce:
    """``CommitSlot`` whose first making is refused (``MemoryError``), as the process
    memory cap refuses an allocation; later ones are made as usual."""

    def __init__(self, made: type) -> None:
        self.made = made
        self.refused = 0

    def __call__(self, *args, **kwargs):
        if not self.refused:
            self.refused += 1
            raise MemoryError("a commit slot's allocation refused (test)")
        return self.made(*args, **kwargs)


def _bounded(body) -> None:
    """Run ``body`` on a thread; fail (not hang) if it has not ended after ``HANG_S``."""
    raised: list[BaseException] = []

    def run() -> None:
        try:
            body()
        except BaseException as error:
            raised.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(HANG_S)
    assert not thread.is_alive(), "hung (a slot, a claim, a turn or a delta left behind)"
    if raised:
        raise raised[0]


def _move(session, k: int, *, delta: bool = False) -> None:
    session.execute("BEGIN")
    result = session.execute(tw.MOVE.format(k=k))[-1]
    if delta:
        session.execute(tw.ADD_TOTAL, ["w0", int(result.tag.rsplit(" ", 1)[1])])
    session.execute("COMMIT")


def _reopened_moves(data: str, *, delta: bool = False) -> int:
    """Messages in ``b`` after a reopen (recovery), each move once (``delta``: and the
    totals agreeing with them)."""
    database = Database.open(data, retention_interval_s=None)
    try:
        session = database.connect()
        found = tw.check_totals(session) if delta else tw.check_moved(session)
        session.close()
        return found.b_messages
    finally:
        database.close()


@pytest.fixture
def store(tmp_path: Path):
    data = str(tmp_path / "data")
    database = Database.open(data, retention_interval_s=None)
    try:
        setup = database.connect()
        tw.create(setup)
        tw.produce(setup, 1, 20)
        setup.close()
        yield data, database
    finally:
        failpoints.deactivate()
        with contextlib.suppress(Exception):
            database.close()


@pytest.mark.parametrize("delta", [False, True], ids=["move", "move+delta"])
def test_a_refused_slot_is_a_commit_that_never_lands(store, monkeypatch, delta) -> None:
    data, database = store
    refusing = _RefusedOnce(commit_order.CommitSlot)
    monkeypatch.setattr(commit_order, "CommitSlot", refusing)
    a, b = database.connect(), database.connect()
    with pytest.raises(MemoryError):
        _move(a, 5, delta=delta)  # refused: the client is told it failed
    assert refusing.refused == 1
    a.execute("ROLLBACK")
    # the same consumer partitions again (no claim or turn left), and a read of the
    # table the deltas go to (no delta left registered and never durable)
    _bounded(lambda: _move(b, 4, delta=delta))
    _bounded(lambda: b.execute("SELECT sum(n) FROM totals"))
    assert database.committer._failure is None
    a.close()
    b.close()
    database.close()
    assert _reopened_moves(data, delta=delta) == 4  # only the commit reported committed


@pytest.mark.parametrize("statement", [tw.MOVE, tw.MOVE_TO_TABLE], ids=["log", "table"])
def test_memory_refused_before_validation_commits_nothing(store, statement) -> None:
    data, database = store
    a, b = database.connect(), database.connect()
    failpoints.activate("commit.before_validate=nomem")
    try:
        a.execute("BEGIN")
        a.execute(statement.format(k=5))
        with pytest.raises(MemoryError, match=r"commit\.before_validate"):
            a.execute("COMMIT")
        assert failpoints._hits.get("commit.before_validate", 0) == 1
    finally:
        failpoints.deactivate()
    a.execute("ROLLBACK")
    _bounded(lambda: _move(b, 4))
    order = database.committer._order
    assert order._in_flight == 0 and order._turn == order._next_turn and not order._claimed
    a.close()
    b.close()
    database.close()
    assert _reopened_moves(data) == 4


def test_memory_refused_after_the_append_reports_the_commit_in_doubt(store) -> None:
    data, database = store
    a, b = database.connect(), database.connect()
    failpoints.activate("commit.log_appended=nomem")
    try:
        with pytest.raises(StorageIOError, match="in doubt") as raised:
            _move(a, 5, delta=True)
        assert not isinstance(raised.value, PastCommitPoint)
        assert failpoints._hits.get("commit.log_appended", 0) == 1
    finally:
        failpoints.deactivate()
    with contextlib.suppress(Exception):
        a.execute("ROLLBACK")
    with pytest.raises(StorageIOError, match="reopened"):  # no commit until recovery decides
        _bounded(lambda: _move(b, 4))
    with contextlib.suppress(Exception):
        b.execute("ROLLBACK")
    _bounded(lambda: b.execute("SELECT sum(n) FROM totals"))  # reads do not wait for ever
    a.close()
    b.close()
    with contextlib.suppress(StorageIOError):  # a checkpoint refused: recovery decides
        database.close()
    assert _reopened_moves(data, delta=True) in (0, 5)  # either outcome, whole; totals agree
