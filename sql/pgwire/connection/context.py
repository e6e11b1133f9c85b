"""``CommandContext``: what a command handler may use of its connection, and no more.

The handlers of the statements the wire server runs itself (``commands``, ``copy_exchange``,
``result_stream``) get this instead of the ``Connection``: the session and the connection's
PostgreSQL surface (``emulation.surface.ConnectionCatalog``), the server's limits and
database, the connection's SQL cursors, and the few ways to talk to the client (send
messages, send a whole result, read COPY data, drain). They never see the message loop,
the prepared statements and portals, the login or the server's bookkeeping, and nothing
here imports ``connection.py`` or ``server.py``: the import graph stays a tree.

Invariants: one context per connection, built with it; ``session`` is only asked for once
the login made one (an assertion otherwise); ``call`` runs a function on the
connection's one worker thread, where every engine call goes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.api import Database, Result, Session
from sql.pgwire.connection.copy_wait import CancelBell
from sql.pgwire.connection.cursors import CursorSet
from sql.pgwire.emulation.surface import ConnectionCatalog
from sql.pgwire.limits import ServerLimits
from sql.pgwire.memory_budget import ConnectionHoldings
from sql.pgwire.spill_budget import SpillCharge


@dataclass(slots=True)
class CommandContext:
    """A connection as its command handlers see it (built by ``Connection``)."""

    database: Database
    limits: ServerLimits
    catalog: ConnectionCatalog
    reader: asyncio.StreamReader
    # The connection's session, None until the login made one.
    current_session: Callable[[], Session | None]
    # Run a function on the connection's worker thread.
    call: Callable[..., Awaitable[Any]]
    send: Callable[[bytes], None]
    # An error to the client (a lost client's ConnectionError is raised instead).
    send_error: Callable[[BaseException, str | None], None]
    # RowDescription, DataRows and CommandComplete of a whole result.
    send_result: Callable[[Result], Awaitable[None]]
    # ParameterStatus of changed settings, then ReadyForQuery (bytes to send).
    ready_for_query: Callable[[], bytes]
    # Write out what was sent so far (before awaiting the client, between COPY blocks).
    drain: Callable[[], Awaitable[None]]
    # Send many buffers (messages or slices of them, in order) and drain: one writev per
    # group, no joined copy (``output.GatheringWriter.send_views``). COPY OUT's data.
    send_views: Callable[[Sequence[bytes | memoryview]], Awaitable[None]]
    # What this connection holds for its client (COPY data, portals), in the server's
    # budget beyond the connection's floor (``sql.pgwire.memory_budget``).
    holdings: ConnectionHoldings
    # A new charge, in the server's budget of spilled bytes under the connection's login,
    # for one cursor's spill file (``sql.pgwire.spill_budget``).
    spill_charge: Callable[[], SpillCharge]
    cursors: CursorSet = field(default_factory=CursorSet)
    # Rung by a CancelRequest for this connection's session: wakes a COPY IN waiting for
    # its client (``copy_wait``).
    cancel_bell: CancelBell = field(default_factory=CancelBell)

    @property
    def session(self) -> Session:
        """The logged-in session; handlers run only after the login."""
        session = self.current_session()
        assert session is not None, "a command handler ran before the login"
        return session
