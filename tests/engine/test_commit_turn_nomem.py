"""Round 24 (H8), R1 F5: waiting for the publish turn cannot fail past the commit point.

Two commits interleaved at the turn: A (turn 0) is held in its publish; B (turn 1)
validated after A released its claims, so past its commit point it must wait for A's
turn. From the moment B's slot is entered, an allocation in ``engine.commit_order``
raises ``MemoryError`` (refused under the process memory cap) in B's thread: making a
``threading.Condition`` (mode ``condition``), registering B as the turn's waiter (a dict
insert, ``register``) or ``Condition.wait``'s own lock (``wait``). Before round 24
``wait_turn`` made B's condition there: the error escaped ``Committer.finish`` before its
``done``, turn 1 was never completed and every later commit (here C) waited for it for
ever. H1 made the condition in ``enter`` (``CommitSlot.woken``); H8 makes the other two
fall back to polling for the turn. B must commit without an error, C must commit, and the
reopened store hold each move once. Before H8 ``register`` and ``wait`` gave B the
``MemoryError`` for a committed transaction (and ``register`` left turn 1 undone).
Deterministic: A is held by an event until B is seen waiting, refused or ended; bounds
are hang bounds only.
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
    """``threading`` for ``engine.commit_order``: in the threads named in ``refused``, making
    a ``Condition`` raises ``MemoryError`` (mode ``condition``), or a condition's first
    ``wait`` does (``wait``: ``Condition.wait`` makes a lock each call)."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.refused: set[str] = set()
        self.seen = threading.Event()  # a refusal happened

    def Condition(self, *args: Any) -> threading.Condition:
        if threading.current_thread().name in self.refused and self.mode == "condition":
            self.seen.set()
            raise MemoryError("a condition refused past the commit point (test)")
        return _Condition(self, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(threading, name)


class _Condition(threading.Condition):
    def __init__(self, owner: _RefusingThreading, *args: Any) -> None:
        super().__init__(*args)
        self._owner = owner

    def wait(self, timeout: float | None = None) -> bool:
        owner = self._owner
        if (owner.mode == "wait" and threading.current_thread().name in owner.refused
                and not owner.seen.is_set()):  # fmt: skip
            owner.seen.set()
            raise MemoryError("a waiter lock refused (test)")
        return super().wait(timeout)


class _RefusingWaiters(dict):
    """``CommitOrder._turn_waiters`` whose insert raises ``MemoryError`` in the threads
    named in ``refused`` (mode ``register``: a dict resize refused)."""

    def __init__(self, refusing: _RefusingThreading) -> None:
        super().__init__()
        self._refusing = refusing

    def __setitem__(self, key: int, value: Any) -> None:
        refusing = self._refusing
        if refusing.mode == "register" and threading.current_thread().name in refusing.refused:
            refusing.seen.set()
            raise MemoryError("a dict resize refused (test)")
        super().__setitem__(key, value)


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


@pytest.mark.parametrize("mode", ["condition", "register", "wait"])
def test_a_turn_waited_for_past_the_commit_point_cannot_fail(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str) -> None:  # fmt: skip
    refusing = _RefusingThreading(mode)
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
    order._turn_waiters = _RefusingWaiters(refusing)
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
        while 1 not in order._turn_waiters and not refusing.seen.is_set() and second.is_alive():
            assert time.monotonic() < deadline, "B neither waits for its turn nor ends"
            time.sleep(0.01)
        gate.set()
        first.join(HANG_S)
        second.join(HANG_S)
        assert not first.is_alive() and not second.is_alive()
        assert outcome == {"A": None, "B": None}, outcome  # B waited for its turn
        assert refusing.seen.is_set() or mode == "condition"  # the refusal was reached
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
