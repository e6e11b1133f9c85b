"""``COPY ... FROM STDIN (FORMAT arrow, WRITE_ID 'id')``: rows staged, published later.

The first half of the staged-write protocol over SQL (the second is ``COMMIT WRITES`` /
``ABORT WRITES``, ``engine.write_statements``): the COPY's one Arrow IPC stream is staged
on the server's disk under the client-chosen write id, exactly as the Arrow Flight door's
``DoPut`` stages a stream (``engine.bulk_write.BulkWrites.start`` and ``append``, reached
through ``Session.bulk_writes``), and NOTHING is published: no message, no row, no
transaction. Several COPYs may add to one write id (each stream is a file of its own), and
the staged rows count against the staging disk cap (54000 past it).

Checks, before CopyInResponse (an ordinary error, no COPY started): INSERT on the target
(42501), the topic or table exists (42P01), the id's shape (22023: 1-128 letters, digits,
``_ . -``), a write id started by another user (42501) or for another target (22023).
During the stream: a payload that is not Arrow, or another number of columns than the
COPY's, is 22P04, a CopyFail 57014; the staged file of this COPY is then deleted (earlier
COPYs of the same id stay staged until committed or aborted).

Columns: the stream's columns are the COPY's columns by position (renamed to them, as the
unstaged COPY FROM (FORMAT arrow) reads them); without a column list a topic takes ``data``
alone and a table all its columns in order. The rows keep their Arrow types: the commit
casts them (``engine.bulk_write``), so a value that does not fit fails the COMMIT WRITES.

Streaming: the CopyData payloads go from the event loop to a staging thread of this COPY
through ``_Pipe``, which holds at most about ``PIPE_BYTES`` (the loop waits for room
before reading the next message), so a stream of any size is staged with bounded memory.
The staging thread uses the session only through ``BulkWrites.append``, while the
connection runs nothing else (it is in COPY IN until this returns).

Abandoned writes (a client that staged and never committed nor aborted) are collected by
the staged COPYs themselves, at most once a minute, as the Flight door's collector does.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa

from engine.api import SourceText, tokenize, unquote_identifier
from sql.pgwire import limits as wire_limits
from sql.pgwire.codec import messages as m
from sql.pgwire.codec.copy_arrow import plain_schema
from sql.pgwire.codec.copy_format import BadCopyFormatError
from sql.pgwire.connection.context import CommandContext
from sql.pgwire.connection.portals import ProtocolViolation
from storage.errors import QueryCanceledError

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
                                  name: str, columns: list[str], *,
                                  frames: bool = False) -> None:  # fmt: skip
    """Stage the COPY's Arrow stream (with ``frames``: its staged partition frames) as
    (part of) write ``write_id`` of ``kind`` (``topic`` or ``table``) ``name``; then
    ``COPY <rows>``. Nothing is published."""
    session = context.session
    writes = await context.call(session.bulk_writes)
    await context.call(_collect_now_and_then, writes)
    await context.call(writes.start, session, write_id, kind, name)
    context.send(m.copy_in_response(len(columns), True))
    await context.drain()
    loop = asyncio.get_running_loop()
    pipe = _Pipe(loop)
    done: concurrent.futures.Future[int] = concurrent.futures.Future()
    thread = threading.Thread(
        target=_stage_frames if frames else _stage,
        args=(done, pipe, writes, session, write_id, columns, name),
        name=f"copy-staged-{write_id}", daemon=True)  # fmt: skip
    thread.start()
    staged = asyncio.wrap_future(done)
    try:
        await _receive(context, pipe, staged)
    except BaseException as error:
        pipe.fail(error if isinstance(error, Exception) else QueryCanceledError("COPY ended"))
        with contextlib.suppress(BaseException):
            await asyncio.wait([staged])  # the staging thread has deleted its file
            staged.exception()  # retrieved: the COPY's error is ``error``
        raise
    pipe.close()
    rows = await staged
    context.send(m.command_complete(f"COPY {rows}"))


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


async def _receive(context: CommandContext, pipe: _Pipe, staged: asyncio.Future[int]) -> None:
    """CopyData into the pipe until CopyDone; a staging error ends the COPY at once (the
    rest of the client's CopyData is ignored by the connection, as PostgreSQL does)."""
    while True:
        if not pipe.room.is_set():
            waiter = asyncio.ensure_future(pipe.room.wait())
            await asyncio.wait([waiter, staged], return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
        if staged.done():
            staged.result()  # raises the staging error; a finished stream reads on to CopyDone
        header = await context.reader.readexactly(5)
        body = await context.reader.readexactly(
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
            reader = pa.ipc.open_stream(pipe)
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

    _settle(done, pipe, append)


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
        if not batch.schema.equals(plain):
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
