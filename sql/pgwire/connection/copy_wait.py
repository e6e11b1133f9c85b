"""A COPY IN's waits for its client, ended by a CancelRequest or ``statement_timeout`` (57014).

During ``COPY ... FROM STDIN`` the server waits for the client's next CopyData. A client
that stops sending (a stalled or hung program) would keep the COPY, its transaction and
the bytes it holds in the server's memory budget (``memory_budget``) for as long as its
socket stays open. A CancelRequest for the session or the session's
``statement_timeout`` (from the COPY's start) ends the COPY with 57014 instead:

- while data flows, at the next message (``CopyWatch.check``), as PostgreSQL does (its
  COPY loop checks for interrupts at each row);
- while the client sends nothing, at once: the wait for the next message is given up
  (``CopyWatch.read``). PostgreSQL keeps waiting in ``ClientRead`` there and fails the
  COPY once data comes; the client sees the same either way (the ErrorResponse when it
  ends its COPY, its further CopyData, CopyDone or CopyFail ignored by the connection),
  and the server lets go of the COPY at once.

A wait given up between two messages consumes nothing (``StreamReader.readexactly``
takes bytes only once all of them came), so the connection stays in step with the
client. One given up inside a message (its header read, its body still coming) raises
``CancelledInsideMessage``: the COPY lets go of its data (and gives back its held bytes)
first, then ``skip_rest`` reads the rest of that body and drops it in small pieces
(``memory_budget.skip_body``: nothing held) and the COPY fails with 57014, in step again:
as PostgreSQL, which reads a message whole before it checks for the interrupt (review R1
round 16, 2.1: a slow link's CopyData is often partly in). A client that stalls inside a
message for good then keeps only its socket.

Thread-safety: ``CancelBell.ring`` may be called from any thread (the server's event
loop, where CancelRequests arrive); everything else runs on the connection's loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Protocol, TypeVar

from sql.pgwire.memory_budget import ConnectionHoldings, read_body, skip_body
from storage.errors import QueryCanceledError

T = TypeVar("T")


class CancelledInsideMessage(Exception):
    """The COPY ended while a message's ``length``-byte body was only partly in: ``reason``
    (57014 for a cancel or the deadline; a staging thread's own error, e.g. a refused frame
    whose skip a cancel cut short) is the COPY's error once the rest is skipped
    (``skip_rest``): the connection must never read on from inside a message."""

    def __init__(self, reason: Exception, length: int) -> None:
        super().__init__(str(reason))
        self.reason = reason
        self.length = length


async def skip_rest(reader: asyncio.StreamReader, cut: CancelledInsideMessage) -> None:
    """Read and drop the body ``cut`` stopped inside (all ``cut.length`` bytes are still in
    the buffer or to come: a partial ``readexactly`` consumes nothing), then raise its
    57014."""
    reason, length = cut.reason, cut.length
    await skip_body(reader, length)
    raise reason


class CancelBell:
    """Rings the COPY IN a connection is waiting in, if any, when a CancelRequest for the
    connection's session came (``PgServer.cancel``, after ``Session.cancel``).

    Invariant: at most one listener (a connection runs one COPY at a time); a ring with no
    listener does nothing (the session's cancel flag, which the listener reads when it
    starts, remembers it)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._listener: tuple[asyncio.AbstractEventLoop, asyncio.Future[None]] | None = None
        self._rang = False  # rung while listened to (read from any thread: ``rang``)

    @contextlib.contextmanager
    def listening(self) -> Iterator[asyncio.Future[None]]:
        """A future of the running loop, done once the bell rang, while in the block."""
        loop = asyncio.get_running_loop()
        rung: asyncio.Future[None] = loop.create_future()
        with self._lock:
            assert self._listener is None, "one COPY IN at a time per connection"
            self._listener = (loop, rung)
            self._rang = False
        try:
            yield rung
        finally:
            with self._lock:
                self._listener = None

    def ring(self) -> None:
        """Any thread: wake the listening COPY IN (nothing if none listens)."""
        with self._lock:
            listener = self._listener
            if listener is not None:
                self._rang = True
        if listener is None:
            return
        loop, rung = listener
        with contextlib.suppress(RuntimeError):  # the loop closed: the connection ended
            loop.call_soon_threadsafe(_settle, rung)


    def rang(self) -> bool:
        """Any thread: whether the bell rang since the COPY IN began listening (at once,
        where the future is settled only once the loop turns: a COPY's insert may run on
        the loop's own thread)."""
        with self._lock:
            return self._rang


def _settle(rung: asyncio.Future[None]) -> None:
    if not rung.done():
        rung.set_result(None)


class _Cancellable(Protocol):
    @property
    def cancel_requested(self) -> bool: ...


@dataclass
class CopyWatch:
    """What ends one COPY IN early: the session's cancel flag (set by a CancelRequest since
    the COPY began), the bell that a CancelRequest rings, and the statement's deadline
    (``time.monotonic``; None without ``statement_timeout``). ``where`` gives the 57014's
    CONTEXT once the COPY's data has begun ("COPY t, line 11", as PostgreSQL reports the
    line it was reading), or None."""

    session: _Cancellable
    rung: asyncio.Future[None]
    deadline: float | None
    where: Callable[[], str | None] = lambda: None

    def check(self) -> None:
        """Raise 57014 if the COPY was cancelled or is past its deadline."""
        error = self.reason()
        if error is not None:
            raise error

    def reason(self) -> QueryCanceledError | None:
        """The 57014 that ends the COPY now, or None while it goes on."""
        if self.deadline is not None and time.monotonic() >= self.deadline:
            return self._canceled("canceling statement due to statement timeout")
        if self.session.cancel_requested or self.rung.done():
            return self._canceled("canceling statement due to user request")
        return None

    def seconds_left(self) -> float | None:
        """Until the deadline (0 once past it), or None without one."""
        return None if self.deadline is None else max(0.0, self.deadline - time.monotonic())

    def _canceled(self, message: str) -> QueryCanceledError:
        where = self.where()
        return QueryCanceledError(message) if where is None else QueryCanceledError(
            message, where=where)  # fmt: skip

    async def read(self, reader: asyncio.StreamReader, size: int) -> bytes:
        """The next ``size`` bytes (a message's header): 57014 (nothing consumed) if the
        COPY is cancelled or times out while they have not all come."""
        if len(reader._buffer) >= size:  # there already (no public way to look): no wait
            return await reader.readexactly(size)
        data = await self._until_ended(reader.readexactly(size))
        if data is None:
            self.check()
            raise AssertionError("a COPY wait ended with neither data nor a reason")
        return data

    async def read_body(self, reader: asyncio.StreamReader, holdings: ConnectionHoldings,
                        length: int) -> bytes:  # fmt: skip
        """The body of a message whose header was read (``memory_budget.read_body``: held
        in ``holdings`` while it arrives): ``CancelledInsideMessage`` if the COPY ends
        before all of it came (what it held while arriving is given back by then)."""
        if len(reader._buffer) >= length:  # there already: no wait
            return await read_body(reader, holdings, length)
        data = await self._until_ended(read_body(reader, holdings, length))
        if data is None:
            reason = self.reason()
            assert reason is not None, "a COPY wait ended with neither data nor a reason"
            raise CancelledInsideMessage(reason, length)
        return data

    async def _until_ended(self, awaitable: Awaitable[T]) -> T | None:
        """``awaitable``'s result, or None once the COPY was cancelled or its deadline
        passed first (``awaitable`` is then cancelled, and ``reason`` says why)."""
        waiting = asyncio.ensure_future(awaitable)
        try:
            while not waiting.done() and self.reason() is None:
                await asyncio.wait((waiting, self.rung), timeout=self.seconds_left(),
                                   return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
        finally:
            if not waiting.done():
                waiting.cancel()
        try:
            return await waiting  # done: its result even if the COPY ended at the same time
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # the connection itself is being cancelled (the server stops)
            return None
