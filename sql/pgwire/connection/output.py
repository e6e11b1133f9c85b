"""Gathering a connection's backend messages into few socket writes.

A psycopg INSERT is one flight of Parse/Bind/Describe/Execute/Sync, answered with four or
five small messages. Written one by one, each is a ``send`` system call that also wakes the
client, which then reads and parses a fragment and waits again. PostgreSQL buffers its
output and flushes it at Sync, Flush, the end of a simple Query, before it waits for COPY
data, or when the buffer fills; ``GatheringWriter`` does the same for an asyncio
``StreamWriter``: ``write`` keeps messages until ``drain`` (every place the server waits for
the client or for the socket already drains) or until ``FLUSH_BYTES`` are kept.

``send_views`` sends many buffers in order (a COPY OUT's CopyData headers and the slices of
the Arrow batches they frame) with one ``writev`` per ``WRITEV_BYTES`` straight from the
buffers, instead of a joined copy and a ``send`` per message: only what the socket does
not take at once is copied (into the transport's buffer, which then sends it as usual).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from typing import Any

FLUSH_BYTES = 64 * 1024  # kept output above this goes out without waiting for drain()
# Results of at most this many values are encoded where they are sent (the event loop's
# ``Connection.send_small_rows``, a kept lookup's flight); larger ones go to a thread.
INLINE_VALUES = 64
# At most this many bytes (and ``WRITEV_PIECES`` buffers, below the kernel's IOV_MAX of
# 1024) go to one ``writev`` of ``send_views``: what the socket does not take is copied, so
# a group is kept near what a loopback socket's send buffer takes at once.
WRITEV_BYTES = 512 * 1024
WRITEV_PIECES = 256

Buffer = bytes | bytearray | memoryview


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

    async def send_views(self, views: Sequence[Buffer]) -> None:
        """Send ``views`` in order and drain, as ``write`` of each then ``drain`` would;
        messages kept by ``write`` go first, in the same ``writev`` as the first views (a
        COPY's CopyOutResponse with its first data: one system call and one wake-up of the
        client fewer).

        On a plain socket whose transport holds nothing unsent, each group of views goes
        out with one ``writev`` from the views themselves; the part the socket did not
        take is handed to the transport (sent in order before anything later) and
        drained before the next group. A TLS transport (whose bytes must pass its TLS
        state) and a failed ``writev`` take the transport's own path, which reports a lost
        client as ``drain`` does.

        Invariant: the views' memory is not reused until this returns. Python 3.11's
        transport copies what it is handed, but 3.12's keeps the view itself: it is the
        drain to nothing unsent before returning that makes the caller free to reuse or
        release the buffers (mapped segments included). Until then the batch and its maps
        stay alive: a slow COPY client holds one batch's maps (counted in
        ``READ_MAPS_MAX``; other reads then use ``pread``)."""
        transport = self.writer.transport
        fd = _plain_fd(self.writer)
        if fd is None:  # TLS: the transport's own path and flow control, as write + drain
            self.flush()
            for view in views:
                self.writer.write(view)
            await self.writer.drain()
            return
        if self._kept:  # kept messages lead the first group: one writev, one wake-up
            views = [*self._kept, *views]
            self._kept.clear()
            self._kept_bytes = 0
        limits = transport.get_write_buffer_limits()
        # drain() then waits until the transport sent everything (not down to its low
        # mark), so that the next group finds it empty and can go out with writev again
        transport.set_write_buffer_limits(high=0, low=0)
        try:
            start = 0
            while start < len(views):
                end, size = start, 0
                while end < len(views) and end - start < WRITEV_PIECES and size < WRITEV_BYTES:
                    size += len(views[end])
                    end += 1
                self._send_group(fd, views[start:end])
                await self.writer.drain()
                start = end
        finally:
            if not transport.is_closing():
                transport.set_write_buffer_limits(high=limits[1], low=limits[0])

    def _send_group(self, fd: int | None, group: Sequence[Buffer]) -> None:
        """``group`` with one ``writev`` if the transport holds nothing unsent, the rest
        (all of it without ``fd``) handed to the transport in order."""
        transport = self.writer.transport
        sent = 0
        if fd is not None and not transport.is_closing() \
                and transport.get_write_buffer_size() == 0:  # fmt: skip
            try:
                sent = os.writev(fd, group)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError:  # the transport's write meets it too and reports it
                sent = 0
        for view in group:  # what writev did not send, in order
            if sent >= len(view):
                sent -= len(view)
                continue
            self.writer.write(memoryview(view)[sent:] if sent else view)
            sent = 0

    def close(self) -> None:
        self.flush()
        self.writer.close()

    def __getattr__(self, name: str) -> Any:  # get_extra_info, is_closing, wait_closed, ...
        return getattr(self.writer, name)


def _plain_fd(writer: asyncio.StreamWriter) -> int | None:
    """The socket descriptor of ``writer`` if bytes may be written to it directly (a
    socket transport without TLS), else None."""
    if writer.get_extra_info("ssl_object") is not None:
        return None
    sock = writer.get_extra_info("socket")
    return None if sock is None else sock.fileno()
