"""Round 24 (H1): an unexpected exception past a commit point stops the committer.

A ``MemoryError`` (``name=nomem``) at a point between a commit point and the end of the
committer's bookkeeping (``commit.log_durable``: a log commit's record durable;
``commit.before_mirror``: the offsets' mirror not moved; ``commit.before_note_done``:
published, not yet counted for the checkpoint) leaves the committer's state behind what
is committed. Checked: the statement that hit it gets an error and is not undone (its
record is durable: ``PastCommitPoint`` keeps the session from abandoning its staging),
the next commit is refused (58030, "stopped") rather than built on that state, nothing
hangs (the slot's turn is passed on), no checkpoint runs (one could pass the record of a
transaction whose partitions it did not sync), and the reopened store holds the committed
transaction exactly once. Without the committer's ``_stop`` the first two points left a
commit slot's turn held (every later commit hung: ``test_nomem_matrix``'s worker reports
``hang``) and the third went on committing."""

from __future__ import annotations

import contextlib
import sys
import threading
import types
from pathlib import Path

import pytest

from engine import commit as commit_module
from engine.database import Database
from storage import failpoints
from storage.errors import StorageIOError

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import txn_worker as tw  # noqa: E402

HANG_S = 60  # a hang bound only (loaded machines)


def _refused_collect(*args: object) -> int:
    raise MemoryError("the retry refused too (test)")


@pytest.mark.parametrize("point", ["commit.log_durable", "commit.before_mirror",
                                   "commit.before_note_done"])
def test_a_memory_error_past_the_commit_point_stops_the_committer(
        tmp_path: Path, point: str, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    # Round 25 (H4): a refusal past the point is retried once after the reserve is freed
    # (``Committer._past_point``); the committer stops only if that fails too: here the
    # retry's garbage collection is refused as well.
    monkeypatch.setattr(commit_module, "gc", types.SimpleNamespace(collect=_refused_collect))
    data = str(tmp_path / "data")
    database = Database.open(data, retention_interval_s=None)
    try:
        session, other = database.connect(), database.connect()
        tw.create(session)
        tw.produce(session, 1, 20)
        failpoints.activate(f"{point}=nomem")
        session.execute("BEGIN")
        session.execute(tw.MOVE.format(k=7))
        with pytest.raises(Exception) as caught:
            session.execute("COMMIT")
        assert f"failpoint {point}" in str(caught.value) or isinstance(
            caught.value.__cause__, MemoryError)
        failpoints.deactivate()
        other.execute("BEGIN")
        other.execute(tw.MOVE.format(k=5))
        outcome: list[BaseException | None] = []

        def commit() -> None:
            try:
                other.execute("COMMIT")
                outcome.append(None)
            except BaseException as error:
                outcome.append(error)

        committing = threading.Thread(target=commit, daemon=True)
        committing.start()
        committing.join(HANG_S)
        assert not committing.is_alive(), "the next commit hangs (a turn left held)"
        (refused,) = outcome
        assert isinstance(refused, StorageIOError) and "stopped" in str(refused), refused
        assert refused.sqlstate == "58030"
        with pytest.raises(StorageIOError, match="stopped"):
            database.committer.checkpoint()
        session.close()
        other.close()
    finally:
        failpoints.deactivate()
        with contextlib.suppress(StorageIOError):  # its last checkpoint is refused:
            database.close()  # recovery does it
    reopened = Database.open(data, retention_interval_s=None)
    try:
        session = reopened.connect()
        found = tw.check_moved(session)
        assert found.consumed == 7 and found.b_messages == 7  # the first, once; not the second
        session.execute("BEGIN")
        session.execute(tw.MOVE.format(k=5))
        session.execute("COMMIT")  # commits again after the reopen
        assert tw.check_moved(session).b_messages == 12
        session.close()
    finally:
        reopened.close()


def test_a_checkpoint_thread_that_cannot_start_is_tried_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """R1 F4: a thread that cannot start (RuntimeError; RLIMIT_DATA counts each stack) when
    a checkpoint falls due is no reason to stop: the commit stands, later ones go on, the
    next due checkpoint starts the thread, and close works."""
    monkeypatch.setattr(commit_module, "CHECKPOINT_TRANSACTIONS", 1)
    start = threading.Thread.start
    refused: list[str] = []

    def start_once_refused(self: threading.Thread) -> None:
        if self.name == "topicbase-checkpoint" and not refused:
            refused.append(self.name)
            raise RuntimeError("can't start new thread")
        start(self)

    monkeypatch.setattr(threading.Thread, "start", start_once_refused)
    database = Database.open(str(tmp_path / "data"), retention_interval_s=None)
    try:
        session = database.connect()
        tw.create(session)
        tw.produce(session, 1, 20)
        for _ in range(3):
            session.execute("BEGIN")
            session.execute(tw.MOVE.format(k=4))
            session.execute("COMMIT")
        assert refused, "the refusal was not reached"
        assert tw.check_moved(session).b_messages == 12
        session.close()
    finally:
        database.close()
