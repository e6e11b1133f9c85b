"""Round 24 (H8), R1 F5: waiting for the publish turn allocates nothing past the commit point.

Two commits interleaved at the turn: A (turn 0) is held in its publish; B (turn 1)
validated after A released its claims, so past its commit point it must wait for A's
turn. From the moment B's slot is entered, making a ``threading.Condition`` in
``engine.commit_order`` raises ``MemoryError`` (an allocation refused under the process
memory cap). Before round 24 ``wait_turn`` made B's condition there: the error escaped
``Committer.finish`` before its ``done``, turn 1 was never completed and every later
commit (here C) waited for it for ever. Now the condition is made in ``enter``, before
the commit point (``CommitSlot.woken``): B waits, publishes after A, C commits, the
reopened store holds each move once. Deterministic: A is held by an event until B is
seen waiting (or ended); bounds are hang bounds only.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from engine import commit as commit_module
from engine import commit_order
from engine.database import Database

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import txn_worker as tw  # noqa: E402

HANG_S = 60  # a hang bound only (loaded machines)


class _RefusingThreading:
    """``threading`` for ``engine.commit_order``, whose ``Condition`` raises ``MemoryError``
    in the threads named in ``refused``."""

    def __init__(self) -> None:
        self.refused: set[str] = set()

    def Condition(self, *args: Any) -> threading.Condition:
        if threading.current_thread().name in self.refused:
            raise MemoryError("a condition refused past the commit point (test)")
        return threading.Condition(*args)

    def __getattr__(self, name: str) -> Any:
        return getattr(threading, name)


def _commit_in_thread(session, name: str, outcome: dict[str, BaseException | None]):
    def run() -> None:
        try:
            session.execute("COMMIT")
            outcome[name] = None
        except BaseException as error:
            outcome[name] = error

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread


def test_a_turn_waited_for_past_the_commit_point_allocates_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    refusing = _RefusingThreading()
    monkeypatch.setattr(commit_order, "threading", refusing)
    enter = commit_order.CommitOrder.enter

    def entered(self: commit_order.CommitOrder, *args: Any, **kwargs: Any):
        slot = enter(self, *args, **kwargs)
        if threading.current_thread().name == "B":  # past B's validation: refuse from here
            refusing.refused.add("B")
        return slot

    monkeypatch.setattr(commit_order.CommitOrder, "enter", entered)
    gate, holding = threading.Event(), threading.Event()
    publish = commit_module.Committer._publish_in_turn

    def held(self: Any, *args: Any) -> Any:
        if threading.current_thread().name == "A":
            holding.set()
            gate.wait(HANG_S)
        return publish(self, *args)

    monkeypatch.setattr(commit_module.Committer, "_publish_in_turn", held)
    data = str(tmp_path / "data")
    database = Database.open(data, retention_interval_s=None)
    order = database.committer._order
    outcome: dict[str, BaseException | None] = {}
    try:
        a, b, c = database.connect(), database.connect(), database.connect()
        tw.create(a)
        tw.produce(a, 1, 20)
        for session, k in ((a, 5), (b, 4), (c, 3)):
            session.execute("BEGIN")
            session.execute(tw.MOVE.format(k=k))
        first = _commit_in_thread(a, "A", outcome)
        assert holding.wait(HANG_S), "A did not reach its publish"  # in its turn, held
        deadline = time.monotonic() + HANG_S
        second = _commit_in_thread(b, "B", outcome)
        while 1 not in order._turn_waiters and second.is_alive():
            assert time.monotonic() < deadline, "B neither waits for its turn nor ends"
            time.sleep(0.01)
        gate.set()
        first.join(HANG_S)
        second.join(HANG_S)
        assert not first.is_alive() and not second.is_alive()
        assert outcome == {"A": None, "B": None}, outcome  # B waited without allocating
        third = _commit_in_thread(c, "C", outcome)
        third.join(HANG_S)
        assert not third.is_alive(), "C hangs: a turn was left undone"
        assert outcome["C"] is None, outcome
        for session in (a, b, c):
            session.close()
    finally:
        gate.set()
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
