"""Ctrl-C held off while a commit runs on the main thread; a statement's front interrupted
by a cancel.

Python raises ``KeyboardInterrupt`` in the main thread at any bytecode. A COMMIT is not
safe to leave at any bytecode: between its commit point and the end of its publish turn
an interrupt left the turn taken (every later commit asleep, a DDL's ``quiesce`` waiting
for ever) or a publish half done. The console and embedded users run statements on the
main thread, so ``sigint_deferred`` swaps the SIGINT handler for one that only notes the
signal, and runs the previous handler (which raises) when the block ends: the COMMIT
completes, then the interrupt is raised, as PostgreSQL ignores a cancel during its commit.

Invariant: on exit the previous handler is back in place; a signal noted in the block is
delivered once, after it. Other threads (the server's sessions) are untouched: Python
runs signal handlers on the main thread only.

``front_checked`` (round 28, H2): the Python work before DuckDB sees a statement (sqlglot's
parse, the sandbox, the privilege checks, the planner) grows with the statement's text
(megabytes: tens of seconds of a core under the interpreter lock). Run inside it, that
work looks at the session's cancel flag (set by a CancelRequest and by the wire's
``statement_timeout`` timer, ``Session.cancel``) every ``planner.front_work.CHECK_EVERY``
units of work, and ends with 57014 once it is set, before anything of the statement ran;
its sqlglot trees are parsed once (``planner.front_work``). A cancel already set when the
front starts ends it before any work (round 28, H5: a cancel that came while the wire still
worked on the message, kept by ``Session._statement_starts``).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

from planner.front_work import statement_front
from storage.errors import QueryCanceledError


@contextmanager
def sigint_deferred() -> Iterator[None]:
    """Run the block with SIGINT noted, not raised; raise it (its previous handler) after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    if not callable(previous):  # SIG_IGN, SIG_DFL or not set from Python: nothing raises
        yield
        return
    noted: list[tuple[int, FrameType | None]] = []

    def note(signum: int, frame: FrameType | None) -> None:
        noted.append((signum, frame))

    signal.signal(signal.SIGINT, note)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if noted:
            previous(*noted[0])


def front_checked(cancelled: Callable[[], bool]) -> statement_front:
    """One statement's front (``planner.front_work.statement_front``): its trees shared,
    its long work ended with 57014 once ``cancelled()`` is true — at once if it is true
    already (a cancel of the message that the session kept: ``Session.cancel``), whatever
    the text's length."""
    stop = _Stop(cancelled)
    stop()
    return statement_front(stop)


class _Stop:
    """Raise 57014 once ``cancelled()`` is true (the front's ``stop``)."""

    __slots__ = ("cancelled",)

    def __init__(self, cancelled: Callable[[], bool]) -> None:
        self.cancelled = cancelled

    def __call__(self) -> None:
        if self.cancelled():
            raise QueryCanceledError("canceling statement due to user request")
