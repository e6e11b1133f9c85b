"""Gathering a connection's backend messages into few socket writes.

A psycopg INSERT is one flight of Parse/Bind/Describe/Execute/Sync, answered with four or
five small messages. Written one by one, each is a ``send`` system call that also wakes the
client, which then reads and parses a fragment and waits again. PostgreSQL buffers its
output and flushes it at Sync, Flush, the end of a simple Query, before it waits for COPY
data, or when the buffer fills; ``GatheringWriter`` does the same for an asyncio
``StreamWriter``: ``write`` keeps messages until ``drain`` (every place the server waits for
the client or for the socket already drains) or until ``FLUSH_BYTES`` are kept.
"""

from __future__ import annotations

import asyncio
from typing import Any

FLUSH_BYTES = 64 * 1024  # kept output above this goes out without waiting for drain()
# Results of at most this many values are encoded where they are sent (the event loop's
# ``Connection.send_small_rows``, a kept lookup's flight); larger ones go to a thread.
INLINE_VALUES = 64


class GatheringWriter:
    """A ``StreamWriter`` whose ``write`` defers small messages to the next ``drain`` (or
    ``flush``/``close``). Invariant: bytes reach the transport in the order written; nothing
    written stays kept across an ``await drain()``. Anything else is the wrapped writer's."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        self._kept: list[bytes] = []
        self._kept_bytes = 0

    def write(self, data: bytes) -> None:
        if len(data) >= FLUSH_BYTES:  # a large chunk (rows, COPY data) goes out as it is
            self.flush()
            self.writer.write(data)
            return
        self._kept.append(data)
        self._kept_bytes += len(data)
        if self._kept_bytes >= FLUSH_BYTES:
            self.flush()

    def flush(self) -> None:
        """Hand what is kept to the transport (which sends what the socket takes now)."""
        if not self._kept:
            return
        data = self._kept[0] if len(self._kept) == 1 else b"".join(self._kept)
        self._kept.clear()
        self._kept_bytes = 0
        self.writer.write(data)

    async def drain(self) -> None:
        self.flush()
        await self.writer.drain()

    def close(self) -> None:
        self.flush()
        self.writer.close()

    def __getattr__(self, name: str) -> Any:  # get_extra_info, is_closing, wait_closed, ...
        return getattr(self.writer, name)
