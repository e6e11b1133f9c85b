"""``own_thread.QuietSelector``: a zero-timeout poll right after a poll that found events
is skipped once; blocking polls and polls after a quiet one are never skipped."""

from __future__ import annotations

import selectors
import socket

from sql.pgwire.connection.own_thread import QuietSelector


def test_skips_one_zero_timeout_poll_after_events_only() -> None:
    left, right = socket.socketpair()
    selector = QuietSelector()
    try:
        selector.register(left, selectors.EVENT_READ)
        assert selector.select(0) == []  # nothing ready: a real poll, found nothing
        right.send(b"x")
        assert len(selector.select(0)) == 1  # the last poll found nothing: not skipped
        assert selector.select(0) == []  # right after events: skipped once
        assert len(selector.select(0)) == 1  # the next one polls (level-triggered: ready)
        assert len(selector.select(1.0)) == 1  # a poll that may block is never skipped
        assert len(selector.select(None)) == 1
        assert selector.select(0) == []  # after events again: skipped once
        left.recv(1)
        assert selector.select(0) == []  # a real poll: nothing left
        assert selector.select(0) == []
    finally:
        selector.close()
        left.close()
        right.close()
