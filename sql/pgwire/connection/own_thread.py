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
loop's transport). ``DirectReads`` waits for the client's next bytes on such a thread
without a turn of its loop (a poll of the socket and of the thread's wake-up fd, which
``OwnThread.call_soon`` writes), so a statement costs no asyncio read machinery.

``connection_stacks``: the threads a connection's statements run on (its own thread, and
its worker thread before it has one) are started with stacks of
``limits.CONNECTION_THREAD_STACK_BYTES``, not the 8 MiB default: the process memory cap
(``sql.pgwire.memory_cap``) counts every thread's stack whole. Python's thread stack size
is process-wide, so it is set only around those starts and put back after; DuckDB's and
Arrow's own threads are not Python's and keep theirs.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import select
import selectors
import socket
import threading
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

from storage.limits import CONNECTION_THREAD_STACK_BYTES


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
    moved = writer.get_extra_info("socket").dup()  # first: it may fail (EMFILE), nothing taken
    transport = writer.transport
    transport.pause_reading()
    held = reader._buffer  # no public way to take what is buffered
    pending = bytes(held)
    held.clear()
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


class QuietSelector(selectors.DefaultSelector):  # type: ignore[misc,valid-type]
    """The selector of a connection's own loop: a zero-timeout poll right after a poll
    that returned events is skipped (answered "nothing ready") once.

    asyncio polls on every turn of its loop; after a read woke the message loop's task,
    the next turn (which runs that task) polls again with timeout 0. On a server of many
    connection threads every poll lets go of the GIL, and getting it back is a futex
    hand-off between threads: a kernel cost per message of its own. Skipping that one
    poll delays nothing that matters: the events of the poll just made are being handled,
    anything newer is seen by the next poll, which is at most one turn later (a skip only
    follows a poll that found events, so a busy loop still polls every other turn and I/O
    is never starved); a poll that may block (timeout None or > 0) is never skipped."""

    def __init__(self) -> None:
        super().__init__()
        self._fresh = False  # the last poll found events, and no poll was skipped since

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if self._fresh and timeout is not None and timeout <= 0:
            self._fresh = False
            return []
        ready = super().select(timeout)
        self._fresh = bool(ready)
        return ready


_STACK_SIZE_LOCK = threading.Lock()  # one connection_stacks at a time: each puts back its own


@contextlib.contextmanager
def connection_stacks() -> Iterator[None]:
    """Python threads started inside get ``CONNECTION_THREAD_STACK_BYTES`` stacks; the size
    in force before is put back on leaving. Where the platform refuses that size, threads
    keep the default. Another thread starting one of its own meanwhile gets the smaller
    stack too (the setting is process-wide): the window is one thread start."""
    with _STACK_SIZE_LOCK:
        try:
            previous = threading.stack_size(CONNECTION_THREAD_STACK_BYTES)
        except (ValueError, RuntimeError):  # not settable here: the default stays
            previous = None
        try:
            yield
        finally:
            if previous is not None:
                threading.stack_size(previous)


class OwnThread:
    """A coroutine run on a thread of its own with an event loop of its own, from
    ``start`` on (so the owner can keep a reference before the coroutine runs).

    ``done`` (a ``concurrent.futures.Future``) ends with the coroutine; ``call_soon`` runs
    a function on that loop from any thread (ignored once the loop is closed); ``cancel``
    cancels the coroutine from any thread."""

    def __init__(self, name: str, make: Callable[[], Coroutine[Any, Any, None]]) -> None:
        self.done: concurrent.futures.Future[None] = concurrent.futures.Future()
        # Written by ``call_soon`` after it queued its function: ``DirectReads`` waits on
        # it beside the socket, so a call for the loop never waits for the client.
        self.wake_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._wake_lock = threading.Lock()  # a write never meets the fd closed (and reused)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._make = make
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)

    def start(self) -> None:
        """Start the thread (a connection's stack, ``connection_stacks``); returns once its
        loop holds the coroutine's task."""
        with connection_stacks():
            self._thread.start()
        self._started.wait()

    def _main(self) -> None:
        loop = asyncio.SelectorEventLoop(QuietSelector())
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
            with self._wake_lock:
                fd, self.wake_fd = self.wake_fd, -1
                if fd >= 0:
                    os.close(fd)

    def close(self) -> None:
        """Give back the wake-up fd of a thread that never started (a started one closes
        it as its loop ends)."""
        assert not self._thread.is_alive() and self._loop is None
        with self._wake_lock:
            fd, self.wake_fd = self.wake_fd, -1
            if fd >= 0:
                os.close(fd)

    def call_soon(self, function: Callable[[], Any]) -> None:
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # closed: the coroutine ended
                loop.call_soon_threadsafe(function)
                with self._wake_lock:
                    if self.wake_fd >= 0:  # else the loop is closed too
                        os.eventfd_write(self.wake_fd, 1)

    def cancel(self) -> None:
        task = self._task
        if task is not None:
            self.call_soon(task.cancel)


READ_BYTES = 64 * 1024  # one direct read takes at most this much


class DirectReads:
    """The next bytes of a connection on its own thread, read from its socket without a
    turn of the event loop.

    Waiting for a client's next message through asyncio costs a poll, the transport's
    read callback, the reader's waiter future and a task step: tens of microseconds per
    statement, as much as the wire's own handling of a ``SELECT 1``. The connection's loop
    serves this one connection, so while its message loop waits for the client nothing
    else needs the loop, except a function another thread queued for it (``OwnThread.
    call_soon``: the server stopping), which writes ``wake_fd`` too. ``wait`` polls the
    socket and ``wake_fd`` and reads what came into the reader's buffer, where
    ``StreamReader`` and the transport find it (bytes keep their order: one thread reads).

    Invariant: ``wait`` is called only when the transport holds no unsent output and no
    other coroutine of the loop waits for anything (the message loop between messages);
    anything it cannot settle (a wake-up, the end of the stream, an error) it leaves to
    the loop's own read (``False``), which reports it as before."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 sock: socket.socket, wake_fd: int) -> None:  # fmt: skip
        self.reader = reader
        self.transport = writer.transport
        self.sock = sock
        self.wake_fd = wake_fd
        self._poll = select.poll()
        self._poll.register(sock.fileno(), select.POLLIN)
        self._poll.register(wake_fd, select.POLLIN)
        self._space = bytearray(READ_BYTES)
        self._view = memoryview(self._space)

    def wait(self, timeout_s: float | None) -> bool | None:
        """Wait up to ``timeout_s`` (None: no limit) for the client's bytes: True when some
        were added to the reader's buffer, None when the time ran out, False when the
        loop must read instead (woken for a queued call, output pending, end or error)."""
        if self.transport.get_write_buffer_size() or self.transport.is_closing():
            return False
        timeout_ms = None if timeout_s is None else max(0, int(timeout_s * 1000))
        events = self._poll.poll(timeout_ms)
        if not events:
            return None
        if len(events) > 1 or events[0][0] == self.wake_fd:
            with contextlib.suppress(BlockingIOError):
                os.eventfd_read(self.wake_fd)
            return False
        try:
            count = self.sock.recv_into(self._space)
        except (BlockingIOError, InterruptedError):
            return True  # nothing after all: the caller looks and waits again
        except OSError:
            return False  # the loop's own read meets it again and reports it
        if count == 0:
            return False  # the end: the loop's read sees it too
        # What ``feed_data`` does, less waking a waiter (none: nothing awaits the reader)
        # and pausing the transport (not reading: the message loop reads what it needs).
        self.reader._buffer += self._view[:count]
        return True
