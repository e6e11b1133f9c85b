"""Publish turns wake only the slot whose turn comes (``engine.commit_order``).

A slot waiting for its turn sleeps on its own condition, woken by the ``done``
that makes it current; before, every ``release`` and ``done`` notified one
condition all committing threads slept on (16 sessions: each commit woke all
of them twice, each needing the GIL only to sleep again).
"""

from __future__ import annotations

import threading
import types

import pytest

import engine.commit_order as commit_order_module
from engine.commit_order import CommitOrder
from tests.storage.test_staging_wakeups import CountingCondition

WAIT_S = 30  # a bound on waits for other threads, never a timing assertion


def test_a_slot_waiting_for_its_turn_wakes_once(monkeypatch: pytest.MonkeyPatch) -> None:
    shim = types.SimpleNamespace(Lock=threading.Lock, Condition=CountingCondition)
    monkeypatch.setattr(commit_order_module, "threading", shim)
    monkeypatch.setattr(CountingCondition, "woken", {})
    monkeypatch.setattr(CountingCondition, "waiting", {})
    order = CommitOrder(threading.Lock())
    slots = [order.enter({("t", "c", p)}, lambda: None, recorded=True) for p in range(4)]
    assert [s.turn for s in slots] == [0, 1, 2, 3]
    published: list[int] = []

    def last() -> None:
        order.release(slots[3])
        assert order.wait_turn(slots[3]) is None
        published.append(3)
        order.done(slots[3])

    waiter = threading.Thread(target=last, name="last")
    waiter.start()
    assert CountingCondition.waiting.setdefault("last", threading.Event()).wait(WAIT_S)
    pause = threading.Event()  # never set: gives the waiter a chance to run
    for slot in slots[:3]:
        order.release(slot)
        assert order.wait_turn(slot) is None
        published.append(slot.turn)
        order.done(slot)
        pause.wait(0.02)
    waiter.join(WAIT_S)
    assert not waiter.is_alive()
    assert published == [0, 1, 2, 3]  # turn order kept
    assert CountingCondition.woken["last"] == 1  # by the done that made it current
    order.quiesce()
