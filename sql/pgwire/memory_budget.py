"""The server-wide budget of bytes clients make the wire server hold between messages.

Each connection's holdings are bounded on their own (a COPY FROM STDIN buffers at most
``storage.limits.COPY_IN_BYTES_MAX``; a Bind's parameters are one message, at most
``message_bytes_max``, kept by its portal, of which a connection holds at most
``PORTALS_PER_CONNECTION_MAX``), but with N connections their sum was unbounded. The
``MemoryBudget`` of one server counts, across all its connections, the bytes of COPY data
received and not yet written, and the Bind messages whose portals are still held.

Each connection's holdings (``ConnectionHoldings``, its COPY data and portals together) are
counted in two parts:

- its floor: the first ``ServerLimits.held_bytes_floor`` bytes (``WIRE_HELD_BYTES_FLOOR``,
  1 MiB) are not charged to the shared budget and are never refused: however full the
  budget is, every connection can still bind its statements and COPY small batches (one
  client filling the budget and sitting idle in a transaction does not stop the others,
  review R1-6);
- beyond the floor, bytes are charged to the shared budget, and one connection may be
  charged at most its share, ``held_bytes_max // WIRE_HELD_SHARE_DIVISOR`` (a quarter):
  one connection alone cannot take the whole budget.

Who is refused: the connection whose COPY chunk or Bind would take its own charge past its
share, or the budget's total past ``held_bytes_max``, gets 53200 (out of memory) for that
statement and stays usable (what it held is given back as for any failed COPY or Bind);
nothing held by others is taken away.

A message is read whole before it is parsed (up to ``message_bytes_max``): one longer than
the floor holds its announced length while its body arrives (``take_arriving``; review
R1-7: clients announcing big messages and never finishing them held them uncounted); when
that is refused its body is read and dropped in small pieces (``skip_body``, as
PostgreSQL's ``pq_getmessage`` discards a message it cannot hold) and the message gets
53200, the connection goes on. A message within the floor is not counted (so it is never
refused). So the bytes held for clients stay within ``held_bytes_max + connections_max *
2 * held_bytes_floor`` (its floor's holdings and one uncounted message a connection; 1 GiB
+ 200 MiB by default).

Invariants: ``MemoryBudget.held_bytes`` is the sum of every connection's ``charged``; it
never goes below 0 nor, after a ``charge`` returned, above ``bytes_max``; a connection's
``charged == max(0, held - floor)`` and ``charged <= share_max`` after each call returns.
Thread-safety: connections on threads of their own share one budget, whose ``charge`` and
``give`` are one add under a lock, nothing allocated; a ``ConnectionHoldings`` is used on
its connection's one loop only and takes no lock while the connection holds no more than
its floor (a statement of small Binds never touches the budget).
"""

from __future__ import annotations

import asyncio
import threading

from storage.errors import OutOfMemoryError
from storage.limits import WIRE_HELD_SHARE_DIVISOR


class MemoryBudgetExceededError(OutOfMemoryError):
    """A COPY chunk or a Bind past the server's budget of held client bytes, or past the
    connection's share of it (53200)."""


class MemoryBudget:
    """Bytes held for clients beyond their floors by all of one server's connections, at
    most ``bytes_max``; each connection's at most ``share_max``."""

    def __init__(self, bytes_max: int, floor_bytes: int) -> None:
        assert bytes_max > 0 and floor_bytes >= 0, (bytes_max, floor_bytes)
        self.bytes_max = bytes_max
        self.floor_bytes = floor_bytes
        self.share_max = max(1, bytes_max // WIRE_HELD_SHARE_DIVISOR)
        self.held_bytes = 0
        self._lock = threading.Lock()

    def connection(self) -> ConnectionHoldings:
        """The holdings of a new connection, counted in this budget."""
        return ConnectionHoldings(self)

    def charge(self, nbytes: int, what: str) -> None:
        """Count ``nbytes`` more, or raise 53200 (nothing counted) if that would pass the
        budget; ``what`` names the holding in the error."""
        assert nbytes >= 0, nbytes
        with self._lock:
            held = self.held_bytes + nbytes
            if held <= self.bytes_max:
                self.held_bytes = held
                return
        raise MemoryBudgetExceededError(
            f"out of memory: {what} would take the bytes all connections hold in COPY data "
            f"and bound parameters past the server's limit of {self.bytes_max} bytes; "
            f"retry later or in smaller pieces"
        )

    def give(self, nbytes: int) -> None:
        """Give back ``nbytes`` a ``charge`` counted."""
        with self._lock:
            self.held_bytes -= nbytes
            assert self.held_bytes >= 0, (self.held_bytes, nbytes)


class ConnectionHoldings:
    """What one connection holds for its client (COPY data, portals' Bind messages):
    ``held`` bytes, of which ``charged`` (those beyond the budget's floor) are counted in
    the shared budget. Used on the connection's loop only."""

    __slots__ = ("budget", "charged", "floor", "held")

    def __init__(self, budget: MemoryBudget) -> None:
        self.budget = budget
        self.floor = budget.floor_bytes
        self.held = 0
        self.charged = 0

    def take(self, nbytes: int, what: str) -> None:
        """Hold ``nbytes`` more, or raise 53200 (nothing held) past the connection's share
        or the budget; within the floor no lock is taken."""
        held = self.held + nbytes
        over = held - self.floor
        if over > self.charged:
            if over > self.budget.share_max:
                raise MemoryBudgetExceededError(
                    f"out of memory: {what} of {nbytes} bytes would take what this "
                    f"connection holds in COPY data and bound parameters to {held} bytes, "
                    f"past its share of {self.floor + self.budget.share_max} bytes (a "
                    f"1/{WIRE_HELD_SHARE_DIVISOR} share of the server's limit of "
                    f"{self.budget.bytes_max} bytes beyond {self.floor} of its own); "
                    f"close portals or send smaller pieces"
                )
            self.budget.charge(over - self.charged, f"{what} of {nbytes} bytes")
            self.charged = over
        self.held = held

    def give(self, nbytes: int) -> None:
        """Let go of ``nbytes`` a ``take`` held; what falls back within the floor is given
        back to the budget."""
        held = self.held - nbytes
        assert held >= 0, (self.held, nbytes)
        self.held = held
        if self.charged:
            over = max(0, held - self.floor)
            if over < self.charged:
                self.budget.give(self.charged - over)
                self.charged = over

    def take_arriving(self, length: int) -> int:
        """Hold a message's announced body ``length`` while it arrives when it is longer
        than the floor; the bytes held, to ``give`` once the body is parsed (0: none).
        53200 (nothing held) past the share or the budget: skip the body then."""
        if length <= self.floor:
            return 0
        self.take(length, "a message still arriving")
        return length


_SKIP_PIECE_BYTES = 64 * 1024


async def skip_body(reader: asyncio.StreamReader, length: int) -> None:
    """Read and drop the ``length`` bytes of a refused message's body, a piece at a time
    (nothing held); ``IncompleteReadError`` if the client goes first."""
    while length > 0:
        piece = await reader.read(min(length, _SKIP_PIECE_BYTES))
        if not piece:
            raise asyncio.IncompleteReadError(b"", length)
        length -= len(piece)


async def read_body(reader: asyncio.StreamReader, holdings: ConnectionHoldings,
                    length: int) -> bytes:  # fmt: skip
    """A message's body of ``length`` bytes, held in ``holdings`` while it arrives when it
    is longer than the floor; 53200 (the body skipped, nothing held) when that is refused."""
    try:
        arriving = holdings.take_arriving(length)
    except MemoryBudgetExceededError:
        await skip_body(reader, length)
        raise
    try:
        return await reader.readexactly(length)
    finally:
        if arriving:
            holdings.give(arriving)
