"""Commit slots: which transactions may validate now, and the order they publish in.

A committing transaction enters a slot after its commit record is written and
its staging is durable, and leaves it once it is published (or failed):

- *claims*: the consumer offsets (topic id, consumer, partition) a transaction
  moves are claimed from just before its validation (given back if that refuses)
  until the catalog's mirror holds the new offsets. Another transaction moving
  one of them waits until the claim is released, then validates against the
  moved offset (40001 if it read the old range). So validation stays exact
  although the DuckDB COMMIT runs outside the commit lock, and sessions COMMIT
  concurrently.
- *turns*: every recorded transaction (it has a commit record) takes a turn
  number when it validates (just before; given back if it refuses); publishes
  and the checkpoint's bookkeeping happen in turn order. Validation order is a
  valid serial order: a transaction that saw another's offsets or table rows
  validated after it. So each partition receives transactions in commit order,
  and a checkpoint never deletes a record whose predecessors are still
  unpublished.
- *in flight*: slots entered and not yet done; DDL holds the commit lock (so
  none can enter) and waits for none to be in flight (``quiesce``).

Invariants: claims of different slots are disjoint; turns are handed out and
completed in increasing order with no gap (a failed or interrupted slot still
completes its turn). Thread-safety: all state is under one lock (``_mutex``);
``enter`` takes the database's commit lock before it, never the reverse, and
nothing here waits while holding the commit lock except ``quiesce``, whose
waiters' slots need only this lock, and the caller's ``validate`` (a topic-only
commit appends its record there, so that log order is validation order), which
runs under the commit lock but not under ``_mutex``.

Wake-ups are targeted: a slot waiting for its turn sleeps on its own condition
(``_turn_waiters[turn]``), woken only by the ``done`` that makes it current;
claim waiters and ``quiesce`` have their own conditions, notified only when
someone waits on them. (One condition notified on every release and done woke
every committing thread twice per commit, each needing the GIL only to sleep
again: with 16 sessions committing, most of a commit's time went to that.)
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from storage import failpoints

OffsetKey = tuple[str, str, int]  # (topic id, consumer, partition)
TURN_POLL_S = 0.001  # how often a turn waiter that could not sleep on its condition looks


@dataclass(frozen=True, slots=True)
class CommitSlot:
    """A transaction between validation and the end of its commit."""

    keys: frozenset[OffsetKey]  # consumer offsets it moves, claimed
    turn: int | None  # its place in the publish order; None: nothing to publish or count
    # What ``wait_turn`` sleeps on, made in ``enter`` (before the commit point): waiting
    # for the turn past a commit point allocates nothing that could fail (a MemoryError
    # there left the turn undone and every later commit hung: round 24, R1 F5).
    woken: threading.Condition | None = None


class CommitOrder:
    def __init__(self, commit_lock: AbstractContextManager[Any]) -> None:
        self._commit_lock = commit_lock
        self._mutex = threading.Lock()
        self._claims_released = threading.Condition(self._mutex)
        self._claim_waiters = 0  # threads in ``enter`` waiting for claims to go
        self._idle = threading.Condition(self._mutex)  # ``quiesce`` waits on it
        self._turn_waiters: dict[int, threading.Condition] = {}
        # claimed keys: a set changed in place (``difference_update`` with a set
        # argument allocates nothing, past a commit point)
        self._claimed: set[OffsetKey] = set()
        self._in_flight = 0
        self._next_turn = 0
        self._turn = 0  # the turn allowed to publish now

    def enter(
        self, keys: set[OffsetKey], validate: Callable[[], None], *, recorded: bool
    ) -> CommitSlot:
        """Wait until no slot claims one of ``keys``; then, under the commit lock, claim the
        keys, take the next turn if ``recorded`` and run ``validate`` (it raises 40001 to
        refuse: the claims and the turn are given back). End the slot with ``release`` +
        ``wait_turn`` + ``done``.

        Everything the slot needs is made, claimed and counted before ``validate``: a
        topic-only commit appends its commit record there, and once it is appended a
        ``MemoryError`` (the process memory cap) would report a failure for a commit that
        later becomes durable (round 26). After ``validate`` returns nothing here
        allocates: the slot made before is returned as it is."""
        wanted = frozenset(keys)
        while True:
            with self._commit_lock:
                with self._mutex:
                    free = self._claimed.isdisjoint(wanted)
                if free:
                    slot = self._take(wanted, recorded)
                    # ``validate`` may do I/O (a topic-only commit appends its record in
                    # it): not under ``_mutex``, which every publish turn needs. Claims
                    # and turns are only added here, under the commit lock, so nothing
                    # else took a turn or these keys since ``_take``.
                    try:
                        validate()
                    except BaseException:
                        self._give_back(slot)
                        raise
                    return slot
            with self._mutex:
                self._claim_waiters += 1
                try:
                    while not self._claimed.isdisjoint(wanted):
                        self._claims_released.wait()
                finally:
                    self._claim_waiters -= 1

    def _take(self, wanted: frozenset[OffsetKey], recorded: bool) -> CommitSlot:
        """Make the slot, claim ``wanted`` and take a turn (caller holds the commit lock,
        ``wanted`` is free): every allocation of a slot's start, before ``validate``. A
        ``MemoryError`` here leaves nothing taken (the claims go in last, by one update)."""
        failpoints.hit("commit.before_validate")
        # what ``wait_turn`` sleeps on (round 24, R1 F5), made here too
        woken = threading.Condition(self._mutex) if recorded else None
        turn = self._next_turn if recorded else None
        following = self._next_turn + 1  # the int made now, not after ``validate``
        slot = CommitSlot(wanted, turn, woken)
        with self._mutex:
            in_flight = self._in_flight + 1
            # one resize up front, then no allocation (``set_merge``): all keys or none
            self._claimed.update(wanted)
            self._in_flight = in_flight
            if recorded:
                self._next_turn = following
        return slot

    def _give_back(self, slot: CommitSlot) -> None:
        """``validate`` refused (caller holds the commit lock): return the claims and the
        turn ``_take`` took. No turn was taken since (the commit lock), so the turn counter
        goes back to the slot's own turn; a done turn can have reached it, never passed it."""
        with self._mutex:
            self._claimed.difference_update(slot.keys)  # no allocation (set arguments)
            self._in_flight -= 1
            if slot.turn is not None:
                assert self._turn <= slot.turn < self._next_turn
                self._next_turn = slot.turn  # the int object taken: nothing made
            if slot.keys and self._claim_waiters:
                self._claims_released.notify_all()
            if not self._in_flight:
                self._idle.notify_all()

    def release(self, slot: CommitSlot) -> None:
        """Give up the slot's claims: its offsets are moved in the mirror, or never will be."""
        with self._mutex:
            assert slot.keys <= self._claimed
            self._claimed.difference_update(slot.keys)  # past a commit point: no allocation
            if slot.keys and self._claim_waiters:
                self._claims_released.notify_all()

    def wait_turn(self, slot: CommitSlot) -> BaseException | None:
        """Wait for the slot's turn. An interrupt does not end the wait (skipping a turn
        would let later publishes overtake this one): it is returned to re-raise.

        Past a commit point nothing here may fail: an allocation refused (``MemoryError``
        under the process memory cap) in registering the waiter or in ``Condition.wait``
        (it makes a lock each call) ends in polling for the turn instead (no allocation;
        ``done`` then finds no waiter to wake), not in an escape that would leave the turn
        undone and every later commit waiting for it (R1 F5, round 24)."""
        interrupted: BaseException | None = None
        if slot.turn is None:
            return None
        with self._mutex:
            if self._turn == slot.turn:
                return None
            assert slot.turn > self._turn and slot.turn not in self._turn_waiters
            assert slot.woken is not None
            woken = slot.woken
            try:
                self._turn_waiters[slot.turn] = woken
            except Exception:  # not registered: poll (below)
                woken = None
            while self._turn != slot.turn:
                if woken is None:
                    self._mutex.release()  # the mutex is held again at each check
                    try:
                        time.sleep(TURN_POLL_S)
                    except BaseException as error:
                        interrupted = error
                    finally:
                        self._mutex.acquire()
                    continue
                try:
                    woken.wait()
                except Exception:  # the wait could not start (the mutex is held): poll
                    woken = None
                except BaseException as error:
                    interrupted = error
            self._turn_waiters.pop(slot.turn, None)  # ``done`` took it out, if it was in
        return interrupted

    def done(self, slot: CommitSlot) -> None:
        """End the slot (after its turn, if it has one): the next turn may go."""
        with self._mutex:
            if slot.turn is not None:
                assert self._turn == slot.turn, (self._turn, slot.turn)
                self._turn += 1
                successor = self._turn_waiters.pop(self._turn, None)
                if successor is not None:
                    successor.notify()
            self._in_flight -= 1
            assert self._in_flight >= 0
            if not self._in_flight:
                self._idle.notify_all()

    def quiesce(self) -> None:
        """Wait until no slot is in flight (the caller holds the commit lock)."""
        with self._mutex:
            while self._in_flight:
                self._idle.wait()
