"""Ctrl-C in the console cancels the running statement even when it comes before the
statement has begun (``sql.console.run_cancellable``)."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from sql.console import run_cancellable


class _StartingSlowly:
    """A session whose statement clears earlier cancel requests when it begins (as
    ``Session.execute_statement`` does), after a start-up that a Ctrl-C can come during,
    then waits up to ``wait_s`` for a cancel, as a long-polling read does."""

    def __init__(self, started: threading.Event, wait_s: float) -> None:
        self.started = started
        self.wait_s = wait_s
        self.requested = threading.Event()
        self.cancels = 0

    def cancel(self) -> None:
        self.cancels += 1
        self.requested.set()

    def execute_statement(self, _statement: Any) -> str:
        self.started.wait(5)  # the Ctrl-C has come by now: the worker was still starting
        self.requested.clear()  # the statement begins: an earlier request is cleared
        if self.requested.wait(self.wait_s):
            raise RuntimeError("cancelled")
        return "served to its end"


@pytest.fixture(autouse=True)
def _ctrl_c_raises() -> Iterator[None]:
    """Ctrl-C raises KeyboardInterrupt here however the suite was started: a suite started
    in the background by a script (``make test &``) inherits SIGINT ignored, and Python then
    leaves it ignored, so the SIGINT below would be lost."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_a_ctrl_c_before_the_statement_began_still_cancels_it() -> None:
    assert threading.current_thread() is threading.main_thread()  # where signals land
    started = threading.Event()
    session = _StartingSlowly(started, wait_s=10)

    def ctrl_c() -> None:
        time.sleep(0.2)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.2)  # the main thread has handled it
        started.set()

    threading.Thread(target=ctrl_c, daemon=True).start()
    with pytest.raises(RuntimeError, match="cancelled"):
        run_cancellable(session, None)  # type: ignore[arg-type]
    assert session.cancels >= 2  # asked again once the statement had begun


def test_without_ctrl_c_the_statement_is_not_cancelled() -> None:
    started = threading.Event()
    started.set()
    session = _StartingSlowly(started, wait_s=0.3)
    assert run_cancellable(session, None) == "served to its end"  # type: ignore[arg-type]
    assert session.cancels == 0
