"""Group commit: concurrent appenders share one write and one fsync.

Leader/follower: an appender queues its request; if no leader is running it
becomes the leader, takes the whole queue, optionally waits ``window_us`` for
more company, and runs ``flush(requests)`` (which writes every request and
syncs once). Requests that arrive while a leader syncs wait for the next
round, which then carries all of them: the batch size grows with the load.

Hand-off: a leader leads one round. When it ends, the leader wakes, if more
requests queued meanwhile, the oldest of them first, which leads the next round
(its own request is in it), and then the requests it carried. The next leader
goes first because its write and sync are the critical path: the woken
requests' threads only return to their callers, and under the GIL each of them
would otherwise delay the next round's start (16 appenders: ~1.3x msgs/s). Each
waiting request sleeps on its own lock, so a round wakes exactly its requests
and the next leader, never every waiter (with the GIL, waking threads that only
go back to sleep is what limits small appends).

Round sizes: with N appenders that append again as soon as they are
acknowledged, rounds settle at about N/2 requests each: a round's requests
queue again while the next round syncs, and go in the one after. (A leader
that waited for all N got ~N per sync here but no more messages per second:
the waiting puts the appenders' CPU work, serialised by the GIL, in series
with the sync instead of beside it.)

Invariant: a request is acknowledged (``submit`` returns) only after the
flush that carried it has returned, that is after its sync. No busy waiting:
followers block on a lock. While ``_leader_active`` is set, exactly one thread
leads or is about to (it was handed the lead); requests queued meanwhile all
have a wake-up lock.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any


class Request:
    __slots__ = ("done", "error", "lead", "payload", "result", "wakeup")

    def __init__(self, payload: Any) -> None:
        self.payload = payload
        self.result: Any = None
        self.error: BaseException | None = None
        self.done = False
        self.lead = False  # handed the lead of the next round (set under the mutex)
        # Held while the request waits; released when it is done or must lead.
        self.wakeup: threading.Lock | None = None


class GroupCommitter:
    def __init__(self, flush: Callable[[list[Request]], None], window_us: int = 0) -> None:
        self._flush = flush
        self._window_s = window_us / 1_000_000
        self._mutex = threading.Lock()
        self._queue: list[Request] = []
        self._leader_active = False
        self.rounds = 0

    @property
    def waiting(self) -> int:
        """Requests queued for the next round while a round runs: a request submitted now
        would share the next sync with them. A hint for routing (read without the mutex;
        it may change at once)."""
        return len(self._queue) if self._leader_active else 0

    @property
    def running(self) -> bool:
        """Whether a round runs (or is about to): a request submitted now waits for it to
        end and goes in the next. A hint for routing (read without the mutex)."""
        return self._leader_active

    def submit(self, payload: Any) -> Any:
        request = Request(payload)
        with self._mutex:
            self._queue.append(request)
            follow = self._leader_active
            if follow:
                wakeup = request.wakeup = threading.Lock()
                wakeup.acquire()
            else:
                self._leader_active = True
        if follow:
            try:
                wakeup.acquire()  # until the round that carried us ended, or we must lead
            except BaseException:  # interrupted while waiting: leave without a trace
                self._withdraw(request)
                raise
            if request.done:
                return _outcome(request)
            assert request.lead
        self._lead()
        assert request.done
        return _outcome(request)

    def _lead(self) -> None:
        """Run one round with everything queued (our own request included)."""
        interrupted: BaseException | None = None
        try:
            if self._window_s:
                time.sleep(self._window_s)
        except BaseException as error:  # still take the queue: its waiters need an answer
            interrupted = error
        with self._mutex:
            requests, self._queue = self._queue, []
        assert requests
        try:
            if interrupted is not None:
                raise interrupted
            self._flush(requests)
        except BaseException as error:  # every waiter must learn of the failure
            for request in requests:
                if not request.done:
                    request.error = error
        finally:
            self.rounds += 1
            for request in requests:
                request.done = True
            with self._mutex:
                successor = self._hand_lead_locked()
            if successor is not None:  # first: the next round's write and sync start sooner
                assert successor.wakeup is not None and not successor.done
                successor.wakeup.release()
            for request in requests:
                if request.wakeup is not None:
                    request.wakeup.release()

    def _hand_lead_locked(self) -> Request | None:
        """Pick the oldest queued request to lead the next round (caller holds the mutex).

        Returns it (the caller wakes it), or None after marking that no leader runs.
        """
        successor = self._queue[0] if self._queue else None
        if successor is None:
            self._leader_active = False
        else:
            successor.lead = True
        return successor

    def _withdraw(self, request: Request) -> None:
        """Take back a request whose thread stopped waiting (an exception in ``acquire``).

        Still queued: it is removed and never written. Already taken by a round:
        that round writes it and nobody waits for the answer. Handed the lead:
        the lead passes on, so the requests queued behind it are not stranded.
        """
        successor = None
        with self._mutex:
            if request in self._queue:
                self._queue.remove(request)
                if request.lead:
                    successor = self._hand_lead_locked()
        if successor is not None:
            assert successor.wakeup is not None
            successor.wakeup.release()


def _outcome(request: Request) -> Any:
    if request.error is not None:
        raise request.error
    return request.result
