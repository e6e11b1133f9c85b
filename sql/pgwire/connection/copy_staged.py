"""``COPY ... FROM STDIN (FORMAT arrow, WRITE_ID 'id')``: rows staged, published later.

The first half of the staged-write protocol over SQL (the second is ``COMMIT WRITES`` /
``ABORT WRITES``, ``engine.write_statements``): the COPY's one Arrow IPC stream is staged
on the server's disk under the client-chosen write id, exactly as the Arrow Flight door's
``stage`` action stages a part (``engine.bulk_write.BulkWrites.start`` and ``append``, reached
through ``Session.bulk_writes``), and NOTHING is published: no message, no row, no
transaction. Several COPYs may add to one write id (each stream is a file of its own), and
the staged rows count against the staging disk cap (54000 past it).

Checks, before CopyInResponse (an ordinary error, no COPY started): INSERT on the target
(42501), the topic or table exists (42P01), the id's shape (22023: 1-128 letters, digits,
``_ . -``), a write id started by another user (42501) or for another target (22023).
During the stream: a payload that is not Arrow, or another number of columns than the
COPY's, is 22P04, a CopyFail 57014; the staged file of this COPY is then deleted (earlier
COPYs of the same id stay staged until committed or aborted), and a write id that has
nothing staged after it is removed (``BulkWrites.drop_if_empty``).

Columns: the stream's columns are the COPY's columns by position (renamed to them, as the
unstaged COPY FROM (FORMAT arrow) reads them); without a column list a topic takes ``data``
alone and a table all its columns in order. The rows keep their Arrow types: the commit
casts them (``engine.bulk_write``), so a value that does not fit fails the COMMIT WRITES.

Streaming: the CopyData payloads go from the event loop to a staging thread of this COPY
through ``_Pipe``, which holds at most about ``PIPE_BYTES`` (the loop waits for room
before reading the next message), so a stream of any size is staged with bounded memory.
The staging thread uses the session only through ``BulkWrites.append``, while the
connection runs nothing else (it is in COPY IN until this returns). A ``FORMAT frames``
COPY on a plain socket skips the pipe and the transport: its staging thread reads the
CopyData from the socket itself (``_SocketCopy``: each frame's body received into one
reused buffer, checked and written from there).

Abandoned writes (a client that staged and never committed nor aborted) are collected by
the staged COPYs themselves, at most once a minute, as the Flight door's collector does.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import os
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa

from engine.api import SourceText, tokenize, unquote_identifier
from sql.pgwire import limits as wire_limits
from sql.pgwire.codec import ipc_bounds
from sql.pgwire.codec import messages as m
from sql.pgwire.codec.copy_arrow import plain_schema
from sql.pgwire.codec.copy_format import BadCopyFormatError
from sql.pgwire.connection.context import CommandContext
from sql.pgwire.connection.copy_wait import CancelledInsideMessage, CopyWatch
from sql.pgwire.connection.portals import ProtocolViolation
from storage.errors import QueryCanceledError
from storage.limits import BATCH_BYTES_MAX

PIPE_BYTES = 8 << 20  # CopyData held between the event loop and the staging thread
COLLECT_INTERVAL_S = 60.0  # the staged COPYs collect abandoned writes at most this often
_last_collect = [float("-inf")]  # monotonic time of the last collection in this process
_collect_lock = threading.Lock()


class _Pipe:
    """Bytes from the event loop (``feed``) to a blocking reader on another thread (``read``,
    what pyarrow's stream reader calls). Invariants: ``read(n)`` returns exactly ``n``
    bytes, or fewer only at the end (``close``); after ``fail`` it raises; the loop's
    ``room`` event is set whenever fewer than ``PIPE_BYTES`` are held or the reader waits
    for more than is held (so a message larger than the pipe still flows)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._chunks: collections.deque[memoryview] = collections.deque()
        self._held = 0
        self._condition = threading.Condition()
        self._closed = False
        self._error: BaseException | None = None
        self._finished = False  # the reader is gone: bytes fed now are dropped
        self.room = asyncio.Event()
        self.room.set()

    # -- the event loop's side ---------------------------------------------------------
    def feed(self, data: bytes) -> None:
        with self._condition:
            if self._finished or not data:
                return
            self._chunks.append(memoryview(data))
            self._held += len(data)
            if self._held >= PIPE_BYTES:
                self.room.clear()
            self._condition.notify()

    def close(self) -> None:
        """The end of the data (CopyDone)."""
        with self._condition:
            self._closed = True
            self._condition.notify()

    def fail(self, error: BaseException) -> None:
        """The COPY ended badly: the reader raises ``error`` at its next read."""
        with self._condition:
            self._error = error
            self._condition.notify()

    # -- the staging thread's side -----------------------------------------------------
    def read(self, size: int = -1) -> bytearray:
        with self._condition:
            while self._error is None and not self._closed and (
                    size < 0 or self._held < size):  # fmt: skip
                self._make_room()  # the loop must feed more than the pipe holds
                self._condition.wait()
            if self._error is not None:
                raise self._error
            take = self._held if size < 0 else min(size, self._held)
            out = bytearray()
            while len(out) < take:
                chunk = self._chunks[0]
                piece = chunk[: take - len(out)]
                out += piece
                if len(piece) == len(chunk):
                    self._chunks.popleft()
                else:
                    self._chunks[0] = chunk[len(piece):]
            self._held -= take
            if self._held < PIPE_BYTES:
                self._make_room()
            return out  # pyarrow takes any buffer: no second copy of a batch's body

    def read_view(self, size: int) -> memoryview | bytearray:
        """``read(size)`` without a copy when the next CopyData holds all ``size`` bytes
        (a view of it: a client that sends each staged frame as one message has its
        bodies checked and written where they arrived); else a copy as ``read``."""
        with self._condition:
            if self._error is None and self._chunks and len(self._chunks[0]) >= size > 0:
                chunk = self._chunks[0]
                if len(chunk) == size:
                    self._chunks.popleft()
                else:
                    self._chunks[0] = chunk[size:]
                self._held -= size
                if self._held < PIPE_BYTES:
                    self._make_room()
                return chunk[:size]
        return self.read(size)

    def finish(self) -> None:
        """The reader stops reading (done or failed): drop what is held and let the loop on."""
        with self._condition:
            self._finished = True
            self._chunks.clear()
            self._held = 0
            self._make_room()

    def _make_room(self) -> None:
        if not self.room.is_set():
            self._loop.call_soon_threadsafe(self.room.set)

    @property
    def closed(self) -> bool:  # pyarrow's file wrapper asks
        return False


async def copy_staged_from_client(context: CommandContext, write_id: str, kind: str,
                                  name: str, columns: list[str], watch: CopyWatch, *,
                                  frames: bool = False) -> None:  # fmt: skip
    """Stage the COPY's Arrow stream (with ``frames``: its staged partition frames) as
    (part of) write ``write_id`` of ``kind`` (``topic`` or ``table``) ``name``; then
    ``COPY <rows>``. Nothing is published. A CancelRequest or ``statement_timeout``
    (``watch``) ends it with 57014 as it ends an unstaged COPY (``copy_wait``): this COPY's
    staged file is deleted; ``CancelledInsideMessage`` when it ended inside a message."""
    session = context.session
    writes = await context.call(session.bulk_writes)
    await context.call(_collect_now_and_then, writes)
    await context.call(writes.start, session, write_id, kind, name)
    context.send(m.copy_in_response(len(columns), True))
    await context.drain()
    loop = asyncio.get_running_loop()
    if frames:
        direct = _SocketCopy.open(context)
        if direct is not None:
            await _stage_frames_directly(context, direct, writes, session, write_id, watch)
            return
    pipe = _Pipe(loop)
    done: concurrent.futures.Future[int] = concurrent.futures.Future()
    thread = threading.Thread(
        target=_stage_frames if frames else _stage,
        args=(done, pipe, writes, session, write_id, columns, name),
        name=f"copy-staged-{write_id}", daemon=True)  # fmt: skip
    thread.start()
    staged = asyncio.wrap_future(done)
    try:
        await _receive(context, pipe, staged, watch)
    except BaseException as error:
        pipe.fail(error if isinstance(error, Exception) else QueryCanceledError("COPY ended"))
        with contextlib.suppress(BaseException):
            await asyncio.wait([staged])  # the staging thread has deleted its file
            staged.exception()  # retrieved: the COPY's error is ``error``
        raise
    pipe.close()
    rows = await staged
    context.send(m.command_complete(f"COPY {rows}"))


async def _stage_frames_directly(context: CommandContext, direct: _SocketCopy, writes: Any,
                                 session: Any, write_id: str,
                                 watch: CopyWatch) -> None:  # fmt: skip
    """``FORMAT frames`` read from the socket by the staging thread (``_SocketCopy``); the
    connection's transport reads nothing meanwhile, and gets back what the thread read past
    the COPY's end. A cancel or the deadline (``watch``) stops the thread at its next
    message or wait (``_SocketCopy.stop``); the rest of a message it stopped inside is
    skipped by the caller once the transport reads again (``CancelledInsideMessage``)."""
    done: concurrent.futures.Future[int] = concurrent.futures.Future()

    def stage() -> None:
        try:
            rows = writes.append_frames(session, write_id, direct.read)
            direct.finish()  # the rest of the COPY: nothing (read_incoming read to its end)
        except BaseException as error:
            with contextlib.suppress(BaseException):
                direct.skip_to_message_end()  # the stream stays at a message boundary
            done.set_exception(error)
            return
        done.set_result(rows)

    thread = threading.Thread(target=stage, name=f"copy-staged-{write_id}", daemon=True)
    thread.start()
    staged = asyncio.wrap_future(done)
    stopped: QueryCanceledError | None = None
    try:
        while not staged.done() and stopped is None:
            await asyncio.wait([staged, watch.rung], timeout=watch.seconds_left(),
                               return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
            stopped = None if staged.done() else watch.reason()
        if stopped is not None:
            direct.stop(stopped)  # at its next message, or its wait for the client
            await asyncio.wait([staged])
    except asyncio.CancelledError:
        direct.cancel()  # the thread stops at once (the connection is ending)
        with contextlib.suppress(BaseException):
            await asyncio.wait([staged])
            staged.exception()
        raise
    finally:
        left = direct.message_left()  # the thread is done: what it stopped inside
        direct.close()
    error = staged.exception()
    if left and isinstance(error, Exception) and not isinstance(
            error, (ConnectionError, asyncio.IncompleteReadError)):  # the client is still on
        # Whatever ended it (the stop, or a refused frame whose skip the stop cut short),
        # the caller skips the rest of the message before the error goes out: the
        # connection never reads a message's payload as messages (review R1 round 17, F6).
        raise CancelledInsideMessage(error, left)
    rows = staged.result()
    context.send(m.command_complete(f"COPY {rows}"))


class _SocketCopy:
    """The CopyData payloads of a ``FORMAT frames`` COPY read straight from the
    connection's socket on the staging thread: a frame's body is received into one reused
    buffer (``read``), checked and written from there. Through the transport, each byte was
    copied three more times (the transport's 256 KiB reads, the ``StreamReader``'s buffer,
    ``readexactly``'s slice and bytes) into fresh memory, with the event loop turning
    between the thread and the socket: ~15 % of the server's CPU of a Spark write.

    Only for a plain socket (TLS state lives in the transport): ``open`` returns None
    otherwise. While it is open the transport does not read (paused); what the
    ``StreamReader`` held unread is read first, and what this read past the COPY's end
    (``CopyDone`` and anything after it in the last read) goes back to the reader at
    ``close``. Messages are checked as the connection checks them (``message_body_length``:
    the server's limits); ``CopyFail`` is 57014, a message that has no place in COPY IN a
    protocol violation, ``Flush``/``Sync`` are ignored, a closed socket ends the
    connection. Invariants: ``read(n)`` returns exactly ``n`` bytes, fewer only at
    ``CopyDone``; the bytes taken from the socket are the COPY's messages and, only in
    ``_space``, what followed them; the thread is the only reader of the socket while open.
    """

    SPACE_BYTES = 256 * 1024  # headers and small payloads are read through this buffer

    def __init__(self, context: CommandContext, transport: Any, sock: socket.socket) -> None:
        self._reader = context.reader
        self._limits = context.limits
        self._transport = transport
        self._sock = sock
        self._space = bytearray(self.SPACE_BYTES)
        self._view = memoryview(self._space)
        self._start = self._end = 0  # unread bytes of ``_space``
        self._left = 0  # payload bytes of the current CopyData not yet read
        self._ended = False  # CopyDone read
        self._body = bytearray(0)
        self._stopped: QueryCanceledError | None = None  # set by ``stop`` (the loop)
        self._wake = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._poll = select.poll()
        self._poll.register(sock.fileno(), select.POLLIN)
        self._poll.register(self._wake, select.POLLIN)
        held = context.reader._buffer  # no public way to take what is buffered
        if len(held) > len(self._space):
            self._space = bytearray(held)
            self._view = memoryview(self._space)
        self._view[: len(held)] = held
        self._end = len(held)
        held.clear()

    @classmethod
    def open(cls, context: CommandContext) -> _SocketCopy | None:
        """Take over reading the connection's socket, or None (TLS, no plain socket)."""
        reader = context.reader
        transport = getattr(reader, "_transport", None)
        # Over TLS the reader keeps the socket's transport from before the handshake,
        # whose protocol is then the TLS layer's, not the reader's.
        if (transport is None or transport.is_closing()
                or not isinstance(transport.get_protocol(), asyncio.StreamReaderProtocol)
                or transport.get_extra_info("ssl_object") is not None
                or reader._exception is not None or reader.at_eof()):  # fmt: skip
            return None
        wrapped = transport.get_extra_info("socket")
        if not isinstance(wrapped, asyncio.trsock.TransportSocket):
            return None
        try:  # a duplicate and an eventfd: none to be had (EMFILE), the transport reads
            sock = wrapped.dup()
        except OSError:
            return None
        transport.pause_reading()
        try:
            return cls(context, transport, sock)
        except OSError:
            sock.close()
            transport.resume_reading()
            return None

    # -- the staging thread's side -------------------------------------------------------
    def read(self, size: int) -> memoryview:
        """The next ``size`` payload bytes (fewer only at CopyDone), in a buffer reused by
        the next call."""
        if len(self._body) < size:
            self._body = bytearray(max(size, len(self._body) * 2))
        view = memoryview(self._body)[:size]
        filled = 0
        while filled < size and self._payload():
            take = min(size - filled, self._left)
            buffered = self._end - self._start
            if buffered:
                take = min(take, buffered)
                view[filled : filled + take] = self._view[self._start : self._start + take]
                self._start += take
            else:  # straight into the target, never past this message's payload
                take = self._recv_into(view[filled : filled + take])
            filled += take
            self._left -= take
        return view[:filled]

    def finish(self) -> None:
        """After the frames' end: the COPY must be at its CopyDone."""
        assert self._ended or self._left == 0
        if not self._ended and self._payload():
            raise BadCopyFormatError("COPY data continues after the frames' end")

    def skip_to_message_end(self) -> None:
        """Drop the rest of the current CopyData (an error stopped the staging mid-message):
        the connection reads on from a message boundary."""
        while self._left:
            buffered = self._end - self._start
            if buffered:
                take = min(buffered, self._left)
                self._start += take
            else:
                take = self._recv_into(self._view[: min(self._left, len(self._space))])
            self._left -= take

    def _payload(self) -> bool:
        """Whether payload bytes follow (the current CopyData's, or a next one's); False
        at CopyDone. Messages other than CopyData are handled here."""
        while not self._left:
            if self._ended:
                return False
            if self._stopped is not None:  # cancelled: stop between two messages
                raise self._stopped
            header = bytes(self._take(5))
            length = wire_limits.message_body_length(header, self._limits)
            kind = header[:1]
            self._left = length  # until the body is taken: what a stop inside it leaves
            if kind == b"d":
                continue
            body = bytes(self._take(length)) if length <= len(self._space) else None
            if body is None:
                self.skip_to_message_end()
            self._left = 0
            if kind == b"c":
                self._ended = True
                return False
            if kind == b"f":
                reason = m.parse_copy_fail(body or b"")
                raise QueryCanceledError(f"COPY from stdin failed: {reason}")
            if kind == b"X":
                raise asyncio.IncompleteReadError(b"", None)
            if kind not in (b"H", b"S"):
                raise ProtocolViolation(
                    f"unexpected message type 0x{kind[0]:02X} during COPY from stdin")
        return True

    def _take(self, size: int) -> memoryview:
        """``size`` bytes through ``_space`` (``size`` at most its length)."""
        assert size <= len(self._space)
        if self._end - self._start < size:
            self._view[: self._end - self._start] = self._view[self._start : self._end]
            self._end -= self._start
            self._start = 0
            while self._end < size:
                self._end += self._recv_into(self._view[self._end :])
        taken = self._view[self._start : self._start + size]
        self._start += size
        return taken

    def _recv_into(self, target: memoryview) -> int:
        """Some bytes (at least one) from the socket into ``target``."""
        while True:
            try:
                count = self._sock.recv_into(target)
            except (BlockingIOError, InterruptedError):
                for fd, _ in self._poll.poll():
                    if fd == self._wake:
                        raise self._stopped or QueryCanceledError("COPY ended") from None
                continue
            except OSError as error:
                raise ConnectionResetError(str(error)) from error
            if count == 0:
                raise asyncio.IncompleteReadError(b"", None)
            return count

    # -- the event loop's side -----------------------------------------------------------
    def cancel(self) -> None:
        """Stop the thread at its next wait for the client."""
        with contextlib.suppress(OSError):
            os.eventfd_write(self._wake, 1)

    def stop(self, reason: QueryCanceledError) -> None:
        """End the COPY with ``reason``: the thread raises it before its next message, or
        at once if it waits for the client (inside a message: ``message_left`` says how
        much of it is still to come)."""
        self._stopped = reason
        self.cancel()

    def message_left(self) -> int:
        """Once the thread is done: bytes of the message it stopped inside that it did not
        take (they start with what ``close`` gives back to the reader); 0 at a boundary."""
        return self._left

    def close(self) -> None:
        """Give the transport back its socket, with what was read past the COPY."""
        rest = bytes(self._view[self._start : self._end])
        self._start = self._end = 0
        self._sock.close()
        os.close(self._wake)
        if rest:
            self._reader.feed_data(rest)
        self._reader._paused = False
        self._transport.resume_reading()


def _collect_now_and_then(writes: Any) -> None:
    """Delete abandoned staged writes (``BulkWrites.collect``: untouched for its
    ``abandon_after_s``, e.g. a Spark task killed with its executor), at most once every
    ``COLLECT_INTERVAL_S`` per process: a server without the Flight door (whose thread
    collects every minute) has no other collector."""
    now = time.monotonic()
    with _collect_lock:
        if now - _last_collect[0] < COLLECT_INTERVAL_S:
            return
        _last_collect[0] = now
    writes.collect()


async def _receive(context: CommandContext, pipe: _Pipe, staged: asyncio.Future[int],
                   watch: CopyWatch) -> None:  # fmt: skip
    """CopyData into the pipe until CopyDone; a staging error ends the COPY at once (the
    rest of the client's CopyData is ignored by the connection, as PostgreSQL does), and so
    does a cancel or the deadline (57014), also while the client sends nothing or the
    pipe is full."""
    while True:
        while not pipe.room.is_set() and not staged.done():
            waiter = asyncio.ensure_future(pipe.room.wait())
            await asyncio.wait([waiter, staged, watch.rung], timeout=watch.seconds_left(),
                               return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
            waiter.cancel()
            watch.check()
        if staged.done():
            staged.result()  # raises the staging error; a finished stream reads on to CopyDone
        watch.check()
        header = await watch.read(context.reader, 5)
        body = await watch.read_body(context.reader, context.holdings,  # held while arriving
                                     wire_limits.message_body_length(header, context.limits))
        kind = header[:1]
        if kind == b"d":
            pipe.feed(body)
        elif kind == b"c":
            return
        elif kind == b"f":
            raise QueryCanceledError(f"COPY from stdin failed: {m.parse_copy_fail(body)}")
        elif kind == b"X":
            raise asyncio.IncompleteReadError(b"", None)
        elif kind not in (b"H", b"S"):  # Flush and Sync are ignored during COPY IN
            raise ProtocolViolation(
                f"unexpected message type 0x{kind[0]:02X} during COPY from stdin")


def _stage(done: concurrent.futures.Future[int], pipe: _Pipe, writes: Any, session: Any,
           write_id: str, columns: list[str], relation: str) -> None:  # fmt: skip
    """The staging thread: the stream's batches appended to the write (its own file)."""

    def append() -> int:
        try:
            reader = pa.ipc.open_stream(ipc_bounds.CheckedStream(
                pipe, ipc_bounds.Bounds(where=f"COPY {relation}")))  # fmt: skip
        except (pa.ArrowInvalid, OSError) as error:
            raise _not_arrow(error, relation) from None
        if len(reader.schema) != len(columns):
            raise BadCopyFormatError(
                f"the Arrow stream has {len(reader.schema)} columns, the COPY {len(columns)} "
                f"({', '.join(columns)})", where=f"COPY {relation}")  # fmt: skip
        plain = plain_schema(reader.schema)
        schema = pa.schema([f.with_name(n) for f, n in zip(plain, columns, strict=True)])
        return writes.append(session, write_id, _batches(reader, plain, schema, relation),
                             schema)  # fmt: skip

    def append_or_drop() -> int:
        try:
            return append()
        except BaseException:
            writes.drop_if_empty(write_id)  # a write whose only stream failed is not kept
            raise

    _settle(done, pipe, append_or_drop)


def _stage_frames(done: concurrent.futures.Future[int], pipe: _Pipe, writes: Any,
                  session: Any, write_id: str, columns: list[str],
                  relation: str) -> None:  # fmt: skip
    """The staging thread of ``FORMAT frames``: the stream's frames, each checked, appended
    to the write as they came (``BulkWrites.append_frames``)."""
    del columns, relation  # a frame's columns are the wire schema's
    _settle(done, pipe, lambda: writes.append_frames(session, write_id, pipe.read_view))


def _settle(done: concurrent.futures.Future[int], pipe: _Pipe,
            stage: Callable[[], int]) -> None:  # fmt: skip
    """Run a staging thread's ``stage``; whatever it does, the pipe is finished first (so
    its feeder is never left blocked), then ``done`` gets the rows staged or the error."""
    try:
        rows = stage()
    except BaseException as error:
        pipe.finish()
        done.set_exception(error)
        return
    pipe.finish()
    done.set_result(rows)


def _batches(reader: Any, plain: pa.Schema, schema: pa.Schema, relation: str
             ) -> Iterator[pa.RecordBatch]:  # fmt: skip
    while True:
        try:
            batch = reader.read_next_batch()
        except StopIteration:
            return
        except (pa.ArrowInvalid, OSError) as error:
            raise _not_arrow(error, relation) from None
        if not batch.schema.equals(plain):  # dictionaries cast: bounded first
            ipc_bounds.check_plain(batch.columns, BATCH_BYTES_MAX, f"COPY {relation}")
            batch = batch.cast(plain)
        yield pa.RecordBatch.from_arrays(batch.columns, schema=schema)


def _not_arrow(error: Exception, relation: str) -> BadCopyFormatError:
    return BadCopyFormatError(f"COPY data is not one Arrow IPC stream: {error}",
                              where=f"COPY {relation}")  # fmt: skip


def table_name(relation: str) -> str:
    """A table as COPY wrote it (``"My T"``, ``main.t``) as the staged write names it: the
    parts unquoted, joined by dots (``engine.bulk_write`` quotes them again)."""
    tokens = [t for t in tokenize(SourceText(relation), 0, len(relation)) if t.text != "."]
    return ".".join(unquote_identifier(t.text) for t in tokens)
