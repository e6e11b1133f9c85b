"""A logged-in connection's socket moved onto the connection's own thread and event loop.

The server's event loop admits and authenticates sockets; engine calls run on a worker
thread per connection. A statement then costs two thread hand-offs (the event loop wakes
the worker, the worker wakes the event loop), tens of microseconds each on a loaded
machine: as much as the wire's own work on a ``SELECT 1``. PostgreSQL has one process per
connection that reads the socket and runs the statement. Once a plaintext connection is
logged in, its socket moves to a thread of its own running an event loop of its own, the
connection's message loop runs there, and its engine calls run inline on that thread:
no hand-off, and a slow statement still holds up only its own connection.

``detach`` takes the socket off the server's loop (with what was read of it and not
consumed yet) and ``attach`` puts it on the running loop as a stream pair; ``OwnThread``
runs a coroutine on a new thread with a new loop, and can be asked from any thread to
cancel it. TLS connections stay on the server's loop (their TLS state lives in the
loop's transport).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import socket
import threading
from collections.abc import Callable, Coroutine
from typing import Any


def movable(writer: asyncio.StreamWriter) -> bool:
    """Whether ``writer``'s socket can move: a plain socket transport (not TLS) that holds
    nothing unsent (closing it would drop that)."""
    return (
        writer.get_extra_info("ssl_object") is None
        and isinstance(writer.get_extra_info("socket"), asyncio.trsock.TransportSocket)
        and writer.transport.get_write_buffer_size() == 0
    )


def detach(reader: asyncio.StreamReader, writer: asyncio.StreamWriter
           ) -> tuple[socket.socket, bytes]:  # fmt: skip
    """Event loop thread: a duplicate of ``writer``'s socket and the bytes ``reader`` holds
    unread; the transport stops reading and is closed (the duplicate keeps the connection
    open). Nothing may be written to ``writer`` after this: the caller drained it."""
    transport = writer.transport
    transport.pause_reading()
    held = reader._buffer  # no public way to take what is buffered
    pending = bytes(held)
    held.clear()
    moved = writer.get_extra_info("socket").dup()
    transport.abort()  # closes its descriptor only: the duplicate holds the socket
    return moved, pending


async def attach(moved: socket.socket, pending: bytes
                 ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:  # fmt: skip
    """On the running loop: ``moved`` as a stream pair; ``pending`` is read first."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(loop=loop)
    if pending:
        reader.feed_data(pending)
    protocol = asyncio.StreamReaderProtocol(reader, loop=loop)
    transport, _ = await loop.connect_accepted_socket(lambda: protocol, sock=moved)
    return reader, asyncio.StreamWriter(transport, protocol, reader, loop)


class OwnThread:
    """A coroutine run on a thread of its own with an event loop of its own, from
    ``start`` on (so the owner can keep a reference before the coroutine runs).

    ``done`` (a ``concurrent.futures.Future``) ends with the coroutine; ``call_soon`` runs
    a function on that loop from any thread (ignored once the loop is closed); ``cancel``
    cancels the coroutine from any thread."""

    def __init__(self, name: str, make: Callable[[], Coroutine[Any, Any, None]]) -> None:
        self.done: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._make = make
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)

    def start(self) -> None:
        """Start the thread; returns once its loop holds the coroutine's task."""
        self._thread.start()
        self._started.wait()

    def _main(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._task = loop.create_task(self._make())
        self._started.set()
        try:
            loop.run_until_complete(self._task)
            self.done.set_result(None)
        except BaseException as error:  # the coroutine's error, or its cancellation
            self.done.set_exception(error)
        finally:
            loop.close()

    def call_soon(self, function: Callable[[], Any]) -> None:
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # closed: the coroutine ended
                loop.call_soon_threadsafe(function)

    def cancel(self) -> None:
        task = self._task
        if task is not None:
            self.call_soon(task.cancel)
