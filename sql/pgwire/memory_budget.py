"""The server-wide budget of bytes clients make the wire server hold between messages.

Each connection's holdings are bounded on their own (a COPY FROM STDIN buffers at most
``storage.limits.COPY_IN_BYTES_MAX``; a Bind's parameters are one message, at most
``message_bytes_max``, kept by its portal, of which a connection holds at most
``PORTALS_PER_CONNECTION_MAX``), but with N connections their sum was unbounded. The
``MemoryBudget`` of one server counts, across all its connections, the bytes of COPY data
received and not yet written, and the Bind messages whose portals are still held; a
connection whose next COPY chunk or Bind would take the total past
``ServerLimits.held_bytes_max`` gets 53200 (out of memory) for that statement, and stays
usable (what it held is given back as for any failed COPY or Bind).

Invariants: ``held_bytes`` is the sum of every live holder's ``take`` minus its
``give``; it never goes below 0 nor, after a ``take`` returned, above ``bytes_max``.
Thread-safety: connections on threads of their own share one budget: ``take`` and
``give`` are one add under a lock, nothing allocated; a connection's portals take it in
steps (``HELD_PORTALS_STEP_BYTES``), so a statement of small Binds takes no lock at all.
"""

from __future__ import annotations

import threading

from storage.errors import OutOfMemoryError

# A connection takes its portals' share of the budget in steps of this many bytes and keeps
# one step between statements (``connection.portals.HeldPortals``): small Binds then never
# take the budget's lock; 100 connections keep at most 6.4 MiB of it so.
HELD_PORTALS_STEP_BYTES = 64 * 1024


class MemoryBudgetExceededError(OutOfMemoryError):
    """A COPY chunk or a Bind past the server's budget of held client bytes (53200)."""


class MemoryBudget:
    """Bytes held for clients by all of one server's connections, at most ``bytes_max``."""

    def __init__(self, bytes_max: int) -> None:
        assert bytes_max > 0, bytes_max
        self.bytes_max = bytes_max
        self.held_bytes = 0
        self._lock = threading.Lock()

    def take(self, nbytes: int, what: str) -> None:
        """Count ``nbytes`` more, or raise 53200 (nothing counted) if that would pass the
        budget; ``what`` names the holding in the error."""
        assert nbytes >= 0, nbytes
        with self._lock:
            held = self.held_bytes + nbytes
            if held <= self.bytes_max:
                self.held_bytes = held
                return
        raise MemoryBudgetExceededError(
            f"out of memory: {what} of {nbytes} bytes would take the bytes all connections "
            f"hold in COPY data and bound parameters past the server's limit of "
            f"{self.bytes_max} bytes; retry later or in smaller pieces"
        )

    def give(self, nbytes: int) -> None:
        """Give back ``nbytes`` a ``take`` counted."""
        with self._lock:
            self.held_bytes -= nbytes
            assert self.held_bytes >= 0, (self.held_bytes, nbytes)
