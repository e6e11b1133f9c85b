"""Group commit: concurrent appenders share one write and one fsync.

Leader/follower: an appender queues its request; if no leader is running it
becomes the leader, takes the whole queue, optionally waits ``window_us`` for
more company, and runs ``flush(requests)`` (which writes every request and
syncs once). Requests that arrive while a leader syncs wait for the next
round, which then carries all of them: the batch size grows with the load.

Invariant: a request is acknowledged (``submit`` returns) only after the
flush that carried it has returned, that is after its sync. No busy waiting:
followers block on a condition variable.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any


class Request:
    __slots__ = ("done", "error", "payload", "result")

    def __init__(self, payload: Any) -> None:
        self.payload = payload
        self.result: Any = None
        self.error: BaseException | None = None
        self.done = False


class GroupCommitter:
    def __init__(self, flush: Callable[[list[Request]], None], window_us: int = 0) -> None:
        self._flush = flush
        self._window_s = window_us / 1_000_000
        self._condition = threading.Condition()
        self._queue: list[Request] = []
        self._leader_active = False
        self.rounds = 0

    def submit(self, payload: Any) -> Any:
        request = Request(payload)
        with self._condition:
            self._queue.append(request)
            while not request.done and self._leader_active:
                self._condition.wait()
            if request.done:
                return _outcome(request)
            self._leader_active = True
        try:
            self._lead()
        finally:
            with self._condition:
                self._leader_active = False
                self._condition.notify_all()
        assert request.done
        return _outcome(request)

    def _lead(self) -> None:
        if self._window_s:
            time.sleep(self._window_s)
        with self._condition:
            requests, self._queue = self._queue, []
        assert requests
        try:
            self._flush(requests)
        except BaseException as error:  # every waiter must learn of the failure
            for request in requests:
                if not request.done:
                    request.error = error
        finally:
            self.rounds += 1
            with self._condition:
                for request in requests:
                    request.done = True


def _outcome(request: Request) -> Any:
    if request.error is not None:
        raise request.error
    return request.result
