"""Ctrl-C during a COMMIT on the main thread (the console, an embedded user): the
commit is held together (``engine.interrupts.sigint_deferred``) and the
KeyboardInterrupt comes when it has ended, so a commit is published once, its turn
completes and nothing stays in flight (round 20, review R2: an interrupt inside the
publish left duplicates after a reopen, one between the commit point and the publish
left the turn taken and later commits asleep)."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import pytest

from engine.commit import Committer
from engine.database import Database

MESSAGES = 40


def _count(database: Database, topic: str) -> int:
    session = database.connect()
    try:
        return session.execute(f"SELECT count(*) AS n FROM TOPIC {topic}")[-1].table.column(
            "n")[0].as_py()
    finally:
        session.close()


@pytest.mark.parametrize("where", ["_publish_in_turn", "finish"])
def test_ctrl_c_during_a_commit_comes_after_it_and_nothing_is_published_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    assert threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    data = str(tmp_path / "data")
    database = Database.open(data)
    session = database.connect()
    session.execute("CREATE TOPIC a (CONSUMER mover); CREATE TOPIC b")
    session.execute(
        f"INSERT INTO TOPIC a (data) SELECT 'm' || range::VARCHAR FROM range({MESSAGES})"
    )
    real = getattr(Committer, where)
    sent: list[bool] = []

    def interrupted(self: Committer, *args: object, **kwargs: object) -> object:
        if not sent:
            sent.append(True)
            os.kill(os.getpid(), signal.SIGINT)  # its handler runs at the next bytecodes
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Committer, where, interrupted)
    try:
        session.execute("BEGIN")
        session.execute(
            "INSERT INTO TOPIC b (data) SELECT data FROM TOPIC a WITH (consumer = 'mover')"
        )
        with pytest.raises(KeyboardInterrupt):
            session.execute("COMMIT")
        assert sent
        monkeypatch.setattr(Committer, where, real)
        order = database.committer._order
        assert order._in_flight == 0 and order._turn == order._next_turn
        seen_now = _count(database, "b")
        done = threading.Event()

        def commit_more() -> None:  # a later commit is not left asleep behind a taken turn
            other = database.connect()
            other.execute("INSERT INTO TOPIC b (data) VALUES ('after')")
            other.close()
            done.set()

        threading.Thread(target=commit_more, daemon=True).start()
        assert done.wait(60), "a later commit hangs"
        session.close()
        database.close()
        reopened = Database.open(data)
        try:
            assert (seen_now, _count(reopened, "b")) == (MESSAGES, MESSAGES + 1)  # once each
        finally:
            reopened.close()
    finally:
        signal.signal(signal.SIGINT, previous)
