"""``Connection``: one client of the PostgreSQL-wire server, from startup to close.

The server (``sql.pgwire.server``) accepts a socket and hands it to a ``Connection``, which
negotiates TLS and authenticates (``sql.pgwire.tls``, ``sql.pgwire.auth``), opens the
engine ``Session`` and runs the message loop: the simple query protocol and the extended
one (Parse/Bind/Describe/Execute/Sync, with ``portals``). Statements the wire server runs
itself (COPY, SQL cursors) go to ``commands`` with the connection's ``CommandContext``;
everything else goes through the connection's PostgreSQL surface
(``emulation.surface.ConnectionCatalog``) to the engine, on the connection's worker
thread. The connection knows its server only as ``ServerSide``: what it asks of it.

One engine ``Session`` per connection. Once logged in, a plaintext connection moves to a
thread of its own with an event loop of its own (``own_thread``): its message loop reads
the socket there and runs every engine call (and the encoding of result rows) inline, as
a PostgreSQL backend does, so a statement costs no thread hand-off and one slow statement
never holds up another connection. Before that (startup), and for the whole of a TLS
connection, the server's event loop moves the bytes and engine calls run on the
connection's worker thread. Either way a session runs on one thread at a time.

Authentication is SCRAM-SHA-256 (default), md5, cleartext or trust against the users file
(``sql.pgwire.auth``, ``sql.pgwire.users``); TLS is offered after an SSLRequest when a
certificate is configured, else declined (``N``), and GSS encryption is always declined
(``sql.pgwire.tls``).

Protocol: the simple query protocol (several statements per Query, results sent as each
statement finishes, the first error ends the Query) and the extended protocol (named and
unnamed statements and portals, text and binary parameters, Describe, Execute with a row
limit, Sync, Flush, Close; after an error, messages are skipped until Sync). Describe of
a statement asks the engine for a description without running it (``Session.describe``):
parameter types the client left unspecified (OID 0 or 705) are inferred, text where the
context tells nothing, and fixed for the statement's binds; its rows are described with
the same OIDs Execute then uses. Describe of a portal of an undescribed statement runs
the statement and keeps the result for Execute. CancelRequest cancels the running
statement of the connection it names.
A malformed startup packet or message gets an ErrorResponse and the connection closes;
the server keeps running.

Connection lifecycle (``sql.pgwire.limits.Admission``): a socket must log in within the
authentication deadline (10 s) and, until it has, counts among the sockets still logging
in (their own cap; a flood's oldest are pushed out), never among the sessions of
``max_connections``, whose last ``superuser_reserved_connections`` are for superusers
(53300). Failed logins are throttled per address and user name (``sql.pgwire.
login_throttle``). A session idle past ``idle_session_timeout`` or, in a transaction,
``idle_in_transaction_session_timeout`` gets FATAL 57P05 / 25P03 and is closed (its
transaction rolled back, its staged writes freed). An exception that is not a
``TopicbaseError`` reaches the client as XX000 with an id, its traceback only in the log
(``sql.internal_error``). Statement text reaches the log only under ``log_statement``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import logging
import re
import secrets
import socket
import ssl
import struct
import time
from collections.abc import Callable, Coroutine, Iterator, Sequence
from typing import Any, NamedTuple, Protocol

import pyarrow as pa

from engine.api import (
    LOCAL_SUPERUSER_NAME,
    BoundedCache,
    Database,
    Description,
    Identity,
    Result,
    RoleRemovedError,
    Rows,
    Session,
    SessionState,
    ast,
    use_role_lookup,
)
from sql.pgwire import auth as wire_auth
from sql.pgwire import limits as wire_limits
from sql.pgwire import tls as wire_tls
from sql.pgwire.codec import messages as m
from sql.pgwire.codec import wire_types
from sql.pgwire.codec.copy_format import error_context
from sql.pgwire.codec.row_encoding import DataRows
from sql.pgwire.connection import commands as wire_commands
from sql.pgwire.connection import (
    copy_commit,
    insert_flight,
    literal_flight,
    lookup_flight,
    own_thread,
    result_stream,
)
from sql.pgwire.connection.context import CommandContext
from sql.pgwire.connection.copy_statement import COPY_COMPRESSION_PARAMETER
from sql.pgwire.connection.extended import (
    KEPT_DESCRIPTIONS,
    PARSED,
    ExtendedProtocol,
    parse_text,
    refined_text_oids,
    result_rows,
)
from sql.pgwire.connection.output import INLINE_VALUES, GatheringWriter
from sql.pgwire.connection.portals import (
    HeldPortals,
    Prepared,
    described_row,
    error_fields,
    result_columns,
    row_description,
)
from sql.pgwire.emulation import surface
from sql.pgwire.emulation.pg_settings import milliseconds
from sql.pgwire.limits import ServerLimits
from sql.pgwire.memory_budget import MemoryBudget, MemoryBudgetExceededError, read_body
from sql.pgwire.spill_budget import SpillBudget, SpillCharge
from sql.pgwire.users import UsersFile
from storage.errors import (
    FeatureNotSupportedError,
    IdleInTransactionSessionTimeoutError,
    IdleSessionTimeoutError,
    TooManyConnectionsError,
    TopicbaseError,
)
from storage.limits import OUTPUT_HELD_MAX, WIRE_MESSAGE_LENGTH_MAX

log = logging.getLogger(__name__)

SERVER_VERSION = "15.0 (Topicbase 0.1)"


class ServerSide(Protocol):
    """What a connection uses of its server (``server.PgServer`` is one)."""

    database: Database
    settings: dict[str, str]
    limits: ServerLimits
    authenticator: wire_auth.Authenticator
    tls_context: ssl.SSLContext | None
    tls_channel_binding: bytes | None
    connections: dict[int, Connection]
    memory_budget: MemoryBudget
    spill_budget: SpillBudget

    def claim_slot(
        self, connection: Connection, user: str, superuser: bool, user_limit: int | None
    ) -> None: ...

    def release_slot(self, user: str) -> None: ...

    def leave_unauthenticated(self, task: asyncio.Task[Any] | None) -> None: ...

    def register(self, connection: Connection) -> int: ...

    def cancel(self, process_id: int, secret_key: int) -> None: ...

    def call_soon(self, function: Callable[[], Any]) -> None: ...


# A buffered message's body past this size is copied out of the reader's buffer once
# (through a view) instead of twice (a slice, then bytes); below it the slice is cheaper.
_ONE_COPY_BYTES_MIN = 4096
_LENGTH = struct.Struct("!i")
_KINDS = [bytes([code]) for code in range(256)]  # a message's type byte as ``bytes``
ROWS_PER_CHUNK = 1000
OWN_THREAD_STOP_S = 5  # a cancelled connection's thread is waited for this long
CLOSE_DRAIN_S = 10  # a closing connection's last output waits this long for the client
_STATUS = {SessionState.IDLE: "I", SessionState.IN_TRANSACTION: "T", SessionState.FAILED: "E"}
# Messages the loop answers with nothing of their own: Flush (H) only asks for the drain,
# and CopyData/CopyDone/CopyFail (d, c, f) arriving after a COPY failed are ignored, as
# PostgreSQL does (sql.pgwire.connection.copy_exchange handles them during a COPY).
_NOTHING_TO_DO = frozenset({b"H", b"d", b"c", b"f"})
# Messages whose handling may run a statement (``Session.message_arrived``).
_STATEMENT_KINDS = frozenset({b"Q", b"P", b"B", b"D", b"E"})


@contextlib.contextmanager
def _waiting_on_client(session: Session | None) -> Iterator[None]:
    """While the connection waits for its client's next bytes, a cancel of ``session`` is
    dropped (``Session.client_wait``): PostgreSQL ignores a cancel while it reads a command,
    inside an extended-protocol flight too (Execute and Flush sent, no Sync yet)."""
    if session is None:
        yield
        return
    session.client_wait(True)
    try:
        yield
    finally:
        session.client_wait(False)


class _RefusedMessage(Exception):
    """A message whose body the connection could not hold (skipped): its type, the 53200."""

    def __init__(self, kind: bytes, error: MemoryBudgetExceededError) -> None:
        super().__init__(kind, error)
        self.kind = kind
        self.error = error


# Statements log_statement = ddl logs (by first keyword; mod adds _MOD_WORDS).
_DDL_WORDS = frozenset({"CREATE", "ALTER", "DROP", "TRUNCATE", "COMMENT", "GRANT", "REVOKE"})
_MOD_WORDS = frozenset({"INSERT", "UPDATE", "DELETE", "MERGE", "COPY", "UPSERT"})
_FIRST_WORD = re.compile(r"\s*(?:--[^\n]*\n\s*|/\*.*?\*/\s*)*(\w+)", re.DOTALL)


def statement_logged(mode: str, text: str) -> bool:
    """Whether ``log_statement = mode`` logs a statement of ``text`` (PostgreSQL's
    classes: ``mod`` includes ``ddl``; COPY counts as a write, as COPY FROM does)."""
    if mode == "all":
        return True
    if mode == "none":
        return False
    match = _FIRST_WORD.match(text)
    word = match.group(1).upper() if match else ""
    return word in _DDL_WORDS or (mode == "mod" and word in _MOD_WORDS)


class _Started(NamedTuple):
    """A statement's stream and its first batch; ``ended``: the result fitted in that batch
    and the stream is closed already (no further hop to the worker for it)."""

    stream: result_stream.ResultStream
    first: pa.Table | Rows | None
    ended: bool


def _start_stream(context: CommandContext, statement: ast.Statement) -> _Started | None:
    """Worker thread: open ``statement``'s stream and read its first batch; a result that
    fits in one batch is read to its end and closed here. None if not streamed. A small
    result the engine read whole (``ResultStream.whole_rows``) comes as ``Rows``: its
    values are encoded as they are, no Arrow table built."""
    stream = result_stream.try_stream(context, statement, None, None)
    if stream is None:
        return None
    try:
        whole = stream.whole_rows()
        if whole is not None:
            stream.close()
            return _Started(stream, whole if whole.num_rows else None, ended=True)
        first = stream.next_batch()
        if first is None or first.num_rows < result_stream.BATCH_ROWS:
            more = stream.next_batch()
            if more is not None:  # a short batch was not the last: keep streaming
                both = pa.concat_tables([first, more]) if first is not None else more
                return _Started(stream, both, ended=False)
            stream.close()
            return _Started(stream, first, ended=True)
    except BaseException:
        stream.close()
        raise
    return _Started(stream, first, ended=False)


_FIXED_BOUNDS_KEPT = 1024
# (id of a ``Rows`` schema, row count) -> (the schema, the part of its ``nbytes_bound``
# that depends on the count alone, the columns of variable width): the engine keeps one
# schema object per result shape, so a repeated statement's is worked out once, and only
# the sizes of its strings and bytes are added up per result (a key lookup's value).
_fixed_bounds: dict[tuple[int, int], tuple[pa.Schema, int, tuple[int, ...]]] = {}


def _bytes_bound(rows: Rows) -> int:
    """``rows.nbytes_bound()``, the same number: what depends on the schema and the row
    count is kept per shape (``_fixed_bounds``), the values of variable-width columns are
    measured here as ``nbytes_bound`` measures them."""
    schema = rows.schema
    values = rows.rows
    key = (id(schema), len(values))
    kept = _fixed_bounds.get(key)
    if kept is None or kept[0] is not schema:
        variable = tuple(i for i, f in enumerate(schema) if not _fixed_width(f.type))
        # Rows of NULLs: every variable-width column measures 0 bytes, padded once.
        empty = Rows([(None,) * len(schema)] * len(values), schema).nbytes_bound()
        kept = (schema, empty - len(variable) * _padded(0), variable)
        if len(_fixed_bounds) >= _FIXED_BOUNDS_KEPT:
            _fixed_bounds.clear()
        _fixed_bounds[key] = kept
    bound = kept[1]
    for index in kept[2]:
        size = 0
        for row in values:
            value = row[index]
            if value is not None:
                size += 4 * len(value) if isinstance(value, str) else len(value)
        bound += _padded(size)
    return bound


def _padded(size: int) -> int:
    """A buffer's size as ``Rows.nbytes_bound`` counts it."""
    return (size + 63) // 64 * 64 + 64


def _fixed_width(kind: pa.DataType) -> bool:
    try:
        return kind.bit_width > 0
    except ValueError:  # Arrow: "Non-fixed width type"
        return False


def _idle_error(in_transaction: bool) -> TopicbaseError:
    """What an idle session past its timeout gets (FATAL): 25P03 in a transaction, else
    57P05 (``Connection._idle_limit``)."""
    if in_transaction:
        return IdleInTransactionSessionTimeoutError(
            "terminating connection due to idle-in-transaction timeout")  # fmt: skip
    return IdleSessionTimeoutError("terminating connection due to idle-session timeout")


class _Ran(NamedTuple):
    """A statement the engine did not stream, run whole, with the description that refines
    its text columns (``ExtendedProtocol.text_description``) and the transaction that holds
    a consumer read's offsets until its rows were sent (``copy_commit.hold``)."""

    result: Result
    text_description: Description | None
    held: copy_commit.Held | None = None


class Connection(ExtendedProtocol):
    """One client connection: its startup, its message loop and its session."""

    def __init__(self, server: ServerSide, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter) -> None:  # fmt: skip
        self.server = server
        self.reader = reader
        self.writer = writer
        self.session: Session | None = None
        self.process_id = 0
        self.secret_key = secrets.randbits(31)
        self.executor = concurrent.futures.ThreadPoolExecutor(1, "topicbase-pgwire")
        # Set once the logged-in connection's socket moved to a thread of its own.
        self.own_thread: own_thread.OwnThread | None = None
        # Reads from the socket without the loop, once on the own thread (``own_thread``).
        self.direct: own_thread.DirectReads | None = None
        self.socket_closed = False  # PgServer.stop closed (or is closing) the socket
        self.statements: dict[str, Prepared] = {}
        # COPY data and portals' Bind messages held for the client (its floor, its share).
        self.holdings = server.memory_budget.connection()
        self.portals = HeldPortals(self.holdings)
        self.kept_descriptions = BoundedCache(  # ExtendedProtocol._describe_again
            "sql.pgwire.kept_descriptions", KEPT_DESCRIPTIONS)
        self.kept_responses = {}  # ExtendedProtocol._send_kept_response
        self.kept_literal_flight = None  # literal_flight.answer_kept
        self.held = None  # ExtendedProtocol: a consumer read's portal until its rows are out
        self.abandoned_reads = {}  # ExtendedProtocol: portals whose held read was rolled back
        self.skipping = False  # after an extended-protocol error, until Sync
        # A Parse/Bind/Describe/Execute came since the last Sync: the session was told of
        # its arrival (``Session.message_arrived``) and is told of its end at the Sync.
        self.in_flight = False
        self.catalog = surface.ConnectionCatalog(SERVER_VERSION, self.statements,
                                                      server.settings)  # fmt: skip
        # The user whose session slot this connection holds (one of connections_max and of
        # the user's connection limit), None before login and once given back.
        self.slot_user: str | None = None
        self.waiting_for_query = False  # ReadyForQuery sent, no message since: idle
        # While idle: when its idle timeout ends (monotonic) and whether it is the one of a
        # transaction; set as the wait begins, kept until a whole message came (_idle_deadline).
        self._idle_until: tuple[float, bool] | None = None
        # The largest length word ``message_body_length`` accepts (the type byte aside).
        self._length_max = 4 + min(WIRE_MESSAGE_LENGTH_MAX - 4, server.limits.message_bytes_max)
        # The users file's generation the session's identities were derived from
        # (``check_users_file``); None under ``--auth trust`` (no users file).
        self.users_generation: int | None = None
        self.users_file: UsersFile | None = None
        # What the command handlers (connection.commands and below) see of this connection.
        self.context = CommandContext(
            database=server.database, limits=server.limits, catalog=self.catalog,
            reader=reader, current_session=lambda: self.session, call=self.call,
            send=self.send, send_error=self.send_error, send_result=self.send_result,
            ready_for_query=self.ready_for_query, drain=lambda: self.writer.drain(),
            send_views=self.send_views, holdings=self.holdings,
            spill_charge=self._spill_charge,
        )  # fmt: skip
        self.context.cursors.holdings = self.holdings

    def _spill_charge(self) -> SpillCharge:
        """A charge for one spill file of this connection's cursors, under its login (the
        name its held bytes count under, ``memory_budget.join``)."""
        account = self.holdings.account
        assert account is not None, "a cursor before the login"
        return self.server.spill_budget.charge_for(account.login)

    async def call(self, function: Callable[..., Any], *arguments: Any) -> Any:
        """Run ``function`` where the connection's engine calls run: inline once the
        connection has its own thread (``own_thread``), else on its worker thread."""
        if self.own_thread is not None:
            return function(*arguments)
        loop = asyncio.get_running_loop()
        with own_thread.connection_stacks():  # the worker thread starts with the first call
            future = loop.run_in_executor(self.executor, function, *arguments)
        return await future

    def send(self, data: bytes) -> None:
        self.writer.write(data)

    async def send_views(self, views: Sequence[bytes | memoryview]) -> None:
        """Send ``views`` (bytes of messages, in order) and drain (``output.send_views``)."""
        if isinstance(self.writer, GatheringWriter):
            await self.writer.send_views(views)
            return
        for view in views:
            self.writer.write(view)
        await self.writer.drain()

    def send_error(self, error: BaseException, query: str | None = None) -> None:
        """Send ``error`` to the client; a lost client is not the statement's error: its
        ConnectionError goes on up to ``run``, which closes the connection quietly."""
        if isinstance(error, ConnectionError):
            raise error
        sqlstate, text, position = error_fields(error, query)
        where = error_context(error) if isinstance(error, TopicbaseError) else None
        if where is None:
            hint = error.context.get("hint") if isinstance(error, TopicbaseError) else None
            self.send(m.error_response(sqlstate, text, position,
                                       hint=hint if isinstance(hint, str) else None))  # fmt: skip
        else:  # COPY's errors: the line (and column) in CONTEXT, in both protocols
            self.send(m.error_response_with_context(sqlstate, text, where))

    def status(self) -> str:
        return "I" if self.session is None else _STATUS[self.session.state]

    def ready_for_query(self) -> bytes:
        """ParameterStatus for each reported setting changed since the last ReadyForQuery
        (SET, RESET, or a rollback that put one back), then ReadyForQuery."""
        reports = self.catalog.changes.take_reports()
        statuses = b"".join(m.parameter_status(name, value) for name, value in reports)
        self.waiting_for_query = True  # idle from now until the next message
        self._idle_until = None  # its idle timeout starts when the wait does
        return statuses + m.ready_for_query(self.status())

    # -- lifetime --------------------------------------------------------------------------
    async def run(self) -> None:
        """Startup on the server's loop; then the message loop, on a thread of its own
        for a plaintext connection (``own_thread``), else here."""
        moved = False
        try:
            if not await self._until_the_end(self.startup()):
                return
            if own_thread.movable(self.writer):
                moved = await self._serve_on_own_thread()
            else:
                await self._until_the_end(self.serve_messages())
        finally:
            if not moved:  # else the connection's own thread closed it
                await self.close()

    async def _until_the_end(self, step: Coroutine[Any, Any, Any]) -> Any:
        """Run ``step`` of the connection; a lost client, a protocol error or an idle
        timeout ends it (the last two with a FATAL error). None then."""
        try:
            return await step
        except (asyncio.IncompleteReadError, ConnectionError):
            log.debug("connection %d: the client went away", self.process_id)
        except m.ProtocolError as error:
            self.send(m.error_response(error.sqlstate, error.message, severity="FATAL"))
        except (IdleSessionTimeoutError, IdleInTransactionSessionTimeoutError,
                wire_auth.InvalidAuthorizationError) as error:  # fmt: skip
            log.info("connection %d: %s", self.process_id, error.message)
            self.send(m.error_response(error.sqlstate, error.message, severity="FATAL"))
        return None

    async def _serve_on_own_thread(self) -> bool:
        """Move the socket to a thread of its own and serve the messages there; returns
        True when the connection ended there (closed there too). Cancelled (the server
        stops, ``PgServer.stop``), it cancels the connection's thread and waits for its end.

        False: the thread never started, and the caller closes the connection (its slot,
        its session). If the thread's wake-up fd or the socket's duplicate cannot be had
        (EMFILE), nothing moved yet and the connection is served here instead; if the
        thread cannot start, the moved socket is closed and the connection ends."""
        name = f"topicbase-pgwire-{self.process_id}"
        try:
            thread = own_thread.OwnThread(name, lambda: serve_there(moved, pending))
        except OSError as error:  # its wake-up fd
            log.warning("connection %d stays on the server's loop: %s", self.process_id, error)
            await self._until_the_end(self.serve_messages())
            return False
        try:
            moved, pending = own_thread.detach(self.reader, self.writer)
        except OSError as error:  # the socket's duplicate: nothing was taken from the loop
            thread.close()
            log.warning("connection %d stays on the server's loop: %s", self.process_id, error)
            await self._until_the_end(self.serve_messages())
            return False

        async def serve_there(moved: socket.socket, pending: bytes) -> None:
            try:
                self.reader, self.writer = await own_thread.attach(moved, pending)
                self.context.reader = self.reader
                assert self.own_thread is not None
                self.direct = own_thread.DirectReads(self.reader, self.writer, moved,
                                                     self.own_thread.wake_fd)  # fmt: skip
                if self.socket_closed:  # the server stopped while the socket moved: the
                    self.writer.close()  # close it asked for found the old writer
                await self._until_the_end(self.serve_messages())
            finally:
                await self.close()

        # Set before the thread starts: its first ``call``/``close`` already reads it.
        self.own_thread = thread
        try:
            thread.start()
        except RuntimeError:  # "can't start new thread": the socket has left the loop already
            self.own_thread = None
            thread.close()
            moved.close()
            log.warning("connection %d: its thread did not start", self.process_id)
            return False
        self.executor.shutdown(wait=False)  # engine calls run inline from now on
        done = asyncio.wrap_future(self.own_thread.done)
        try:
            await asyncio.shield(done)
        except asyncio.CancelledError:
            self.own_thread.cancel()
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(done, timeout=OWN_THREAD_STOP_S)
            raise
        return True

    def close_socket(self) -> None:
        """Close the connection's socket from the server's loop (``PgServer.stop``)."""
        self.socket_closed = True  # read on the own thread once its socket is attached
        if self.own_thread is None:
            self._stop_writer()
        else:
            self.own_thread.call_soon(self._stop_writer)

    def _stop_writer(self) -> None:
        """The server stops: close the socket, dropping output the transport still holds
        (a client that does not read would hold the transport, and with it the
        connection's thread and session, open for ever; what the kernel took still goes
        out). Runs on the thread whose loop has the writer."""
        writer = self.writer
        if isinstance(writer, GatheringWriter):
            writer.flush()
        if writer.transport.get_write_buffer_size():
            writer.transport.abort()
        else:
            writer.close()

    async def close(self) -> None:
        """End the connection: its transaction is rolled back (staged writes freed) and its
        session slot given back, its portals' bytes to the server's memory budget."""
        self.server.connections.pop(self.process_id, None)
        self.portals.release()
        self.context.cursors.release()  # its SQL cursors' rows, given back too
        self.server.memory_budget.leave(self.holdings)
        if self.slot_user is not None:
            holder, self.slot_user = self.slot_user, None
            if self.own_thread is None:
                self.server.release_slot(holder)
            else:  # the server's bookkeeping belongs to its loop's thread
                self.server.call_soon(functools.partial(self.server.release_slot, holder))
        if self.session is not None:
            try:
                await self.call(self.session.close)
            except Exception:
                log.exception("closing a session failed")
        self.executor.shutdown(wait=False)
        if self.socket_closed:  # the server stops (``_stop_writer``): nothing more goes out
            self.writer.transport.abort()
            return
        try:  # the last messages (a FATAL error) go out unless the client does not read
            async with asyncio.timeout(CLOSE_DRAIN_S):
                await self.writer.drain()
        except (ConnectionError, TimeoutError):
            self.writer.transport.abort()
            return
        self.writer.close()

    async def startup(self) -> bool:
        """Negotiate (TLS when the server has a certificate, ``sql.pgwire.tls``) until a v3
        StartupMessage, authenticate its user (``sql.pgwire.auth``); True when the session
        is ready. All of it must end within ``AUTHENTICATION_TIMEOUT_S``."""
        authenticator = self.server.authenticator
        try:
            timeout_s = (self.server.limits.authentication_timeout_s
                         or wire_auth.AUTHENTICATION_TIMEOUT_S)  # fmt: skip
            async with asyncio.timeout(timeout_s):
                startup = await wire_tls.negotiate(self.reader, self.writer,
                                                   self.server.tls_context)  # fmt: skip
                if startup.code == m.CANCEL_REQUEST:
                    self.server.cancel(startup.process_id, startup.secret_key)
                    return False
                if startup.code != m.PROTOCOL_V3:
                    major, minor = startup.code >> 16, startup.code & 0xFFFF
                    raise FeatureNotSupportedError(
                        f"unsupported frontend protocol {major}.{minor}"
                    )
                user = startup.parameters.get("user", "")
                if not user and authenticator.method is not wire_auth.AuthMethod.TRUST:
                    raise wire_auth.InvalidAuthorizationError(
                        "no PostgreSQL user name specified in startup packet"
                    )
                channel = wire_auth.AuthChannel(self.reader, self.writer,
                                                self.server.tls_channel_binding)  # fmt: skip
                task = asyncio.current_task()
                channel.on_penalty = lambda: self.server.leave_unauthenticated(task)
                await authenticator.authenticate(channel, user)
                self.server.claim_slot(self, user, authenticator.is_superuser(user),
                                       authenticator.connection_limit(user))  # fmt: skip
        except TimeoutError:
            log.warning("startup of %s timed out", self.writer.get_extra_info("peername"))
            return False
        except (FeatureNotSupportedError, wire_auth.InvalidAuthorizationError,
                wire_auth.InvalidPasswordError, TooManyConnectionsError) as error:  # fmt: skip
            self.send(m.error_response(error.sqlstate, error.message, severity="FATAL"))
            return False
        identity = self._identity(user)
        try:
            self.session = await self.call(self.server.database.connect, identity)
        except TopicbaseError as error:
            sqlstate, text, _ = error_fields(error)
            self.send(m.error_response(sqlstate, text, severity="FATAL"))
            return False
        # From now on what it holds counts in its login's share too (memory_budget).
        self.server.memory_budget.join(self.holdings, identity.name)
        self.process_id = self.server.register(self)
        parameters = {
            "server_version": SERVER_VERSION,
            "server_encoding": "UTF8",
            "client_encoding": "UTF8",
            "standard_conforming_strings": "on",
            "DateStyle": "ISO, MDY",
            "integer_datetimes": "on",
            "TimeZone": "UTC",
            "IntervalStyle": "postgres",
            "is_superuser": "on" if identity.superuser else "off",
            "session_authorization": identity.name,
            "application_name": startup.parameters.get("application_name", ""),
            # COPY ... TO STDOUT (FORMAT arrow, COMPRESSION zstd) is understood: a client
            # that decodes Arrow IPC body compression asks for it only when announced
            # (the Spark JVM's reader), so a server without it is never asked
            COPY_COMPRESSION_PARAMETER: "zstd",
        }
        self.catalog.start(startup.parameters, superuser=identity.superuser)
        self.send(m.authentication_ok())
        for name, value in parameters.items():
            self.send(m.parameter_status(name, value))
        self.send(m.backend_key_data(self.process_id, self.secret_key))
        self.send(self.ready_for_query())
        await self.writer.drain()
        return True

    def _identity(self, user: str) -> Identity:
        """Who the session acts as: the authenticated user, a superuser if the users file
        says so. Under ``--auth trust`` nothing is proved and no users file is read, so
        every session is a superuser, as the local console is: trust is for a machine
        with no other users."""
        users = self.server.authenticator.users
        if users is None:
            return Identity(user or LOCAL_SUPERUSER_NAME, superuser=True)
        # The engine asks too, for the owner of a view being read (engine.privileges).
        use_role_lookup(self.server.database, users.is_superuser,
                        lambda: [entry.name for entry in users.entries()],
                        users.connection_limit)
        self.users_generation = users.generation  # read first: a change after it is seen
        self.users_file = users
        return Identity(user, superuser=users.is_superuser(user))

    async def check_users_file(self) -> None:
        """Before a message that may run a statement: if the users file changed since the
        session's identities were derived (``UsersFile.generation``, which the server's
        ``UsersWatch`` keeps current), derive them again (``Session.refresh_identity``: a
        superuser demoted in the file is demoted here, and a SET ROLE or SET SESSION
        AUTHORIZATION it made as one is undone); a user removed from the file ends the
        session with FATAL 28000. PostgreSQL's ALTER ROLE and DROP ROLE act on open
        sessions at once; here within ``USERS_FILE_POLL_S``."""
        users = self.users_file
        if users is None or users.generation == self.users_generation or self.session is None:
            return
        generation = users.generation

        def superuser_of(name: str) -> bool | None:
            entry = users.lookup(name)
            return None if entry is None else entry.superuser

        try:
            await self.call(self.session.refresh_identity, superuser_of)
        except RoleRemovedError as removed:
            raise wire_auth.InvalidAuthorizationError(
                f'terminating connection: user "{removed}" was removed from the users file'
            ) from None
        self.users_generation = generation
        flag = "on" if self.session.identity.superuser else "off"
        if self.catalog.superuser_changed(flag):  # reported with the next ReadyForQuery
            self.catalog.changes.reports.append(("is_superuser", flag))

    async def serve_messages(self) -> None:
        # Responses are kept until a drain (Sync, Flush, end of Query, before COPY data is
        # awaited): one socket write per flight instead of one per message (connection.output).
        transport = self.writer.transport
        self.writer = GatheringWriter(self.writer)
        while True:
            taken = self._buffered_message()
            if taken is None and self.direct is not None and not self._long_message_coming() \
                    and self._read_directly():  # fmt: skip
                continue  # more bytes in the buffer: look again
            if taken is not None:
                kind, body = taken
            else:
                try:
                    kind, body = await self._next_message()
                except _RefusedMessage as refused:
                    await self._refuse_message(refused)
                    continue
            if kind in (b"Q", b"P") and await self._statement_too_large(kind, body):
                continue
            if kind == b"X":
                return
            users_file = self.users_file
            if users_file is not None and users_file.generation != self.users_generation:
                await self.check_users_file()
            if self.held is not None and kind not in (b"E", b"D", b"H"):
                await self.settle_held()  # its rows will not all go out: offsets stay
            session = self.session
            if session is not None and kind in _STATEMENT_KINDS and (
                    kind == b"Q" or not self.in_flight):  # fmt: skip
                # Before the wire's own work on the text: a CancelRequest from now on is
                # this message's, and statement_timeout counts from here (round 28, H5).
                session.message_arrived()
                self.in_flight = kind != b"Q"
            if kind == b"Q":
                try:
                    await self.simple_query(m.parse_query(body))
                finally:
                    if session is not None:
                        session.message_done()
                if self.portals and self.session is not None \
                        and self.session.state is SessionState.IDLE:  # fmt: skip
                    self.portals.clear()  # a transaction's end drops its portals, as at Sync
            elif kind == b"S":
                self.skipping = False
                if self.in_flight:
                    self.in_flight = False
                    if session is not None:
                        session.message_done()
                if self.session is not None and self.session.state is SessionState.IDLE:
                    self.portals.clear()
                self.send(self.ready_for_query())
            elif kind in (b"P", b"B", b"D", b"E", b"C"):
                if not self.skipping:
                    try:
                        if kind == b"B":  # a flight's first message: no coroutine for it
                            kept = self.kept_literal_flight  # a repeat of it: one comparison
                            if taken is not None and self.own_thread is not None and (
                                    (kept is not None and kept.body == body
                                     and literal_flight.answer_kept(self, body))
                                    or insert_flight.answer(self, body)
                                    or lookup_flight.answer(self, body)
                                    or literal_flight.answer(self, body)):  # fmt: skip
                                # the flight's Sync was answered with it: its message ends
                                self.in_flight = False
                                if session is not None:
                                    session.message_done()
                                self.writer.flush()  # as after Sync; a drain waits only
                                if transport.get_write_buffer_size() or transport.is_closing():
                                    await self.writer.drain()  # for output still held
                                continue
                            self.on_bind(m.parse_bind(body), len(body))
                        else:
                            await self.extended(kind, body)
                    except m.ProtocolError:
                        raise
                    except Exception as error:
                        self.send_error(error, self._query_of(kind, body))
                        self.skipping = True
                        # Out now, as PostgreSQL sends every error (a client still
                        # streaming a COPY, or waiting without a Sync, learns of it).
                        self.writer.flush()
            elif kind not in _NOTHING_TO_DO:
                raise m.ProtocolError(f"invalid frontend message type {kind!r}")
            if kind in (b"Q", b"S", b"H") or transport.get_write_buffer_size() > OUTPUT_HELD_MAX:
                # A client that sends and does not read (Bind/Execute without Sync) waits
                # with its messages unread until it reads: the output held stays bounded.
                await self.writer.drain()

    def _buffered_message(self) -> tuple[bytes, bytes] | None:
        """The next message's type and body when the reader already holds all of it, taken
        without awaiting (a client's flight, e.g. Bind/Describe/Execute/Sync, arrives in one
        segment: two ``readexactly`` coroutines a message cost more than the message's own
        handling), else None and nothing is taken: the caller awaits it the usual way, which
        runs the idle timeout and reports the reader's error or end. The length is checked
        exactly as there (``message_body_length``: a bad one raises before anything is
        taken). Relies on ``StreamReader._buffer``, as ``own_thread.detach`` does."""
        reader = self.reader
        buffer = reader._buffer  # no public way to look at what is buffered
        if len(buffer) < 5 or reader._exception is not None:
            return None
        (length,) = _LENGTH.unpack_from(buffer, 1)  # counts itself, not the type byte
        if not 4 <= length <= self._length_max:  # raises the error the length deserves
            wire_limits.message_body_length(bytes(buffer[:5]), self.server.limits)
            raise AssertionError("message_body_length accepted a length outside its bounds")
        end = 1 + length
        if len(buffer) < end:
            return None
        kind = _KINDS[buffer[0]]
        if end > _ONE_COPY_BYTES_MIN:  # one copy of the body, not two (a Bind of 1 MiB)
            with memoryview(buffer) as view:
                body = bytes(view[5:end])
        else:  # a small one: the view's set-up costs more than the second copy
            body = bytes(buffer[5:end])
        del buffer[:end]
        if reader._paused:  # as ``readexactly`` resumes it
            reader._maybe_resume_transport()
        self.waiting_for_query = False
        return kind, body

    def _read_directly(self) -> bool:
        """Wait for the client's next bytes on the connection's own thread without a turn
        of its event loop (``own_thread.DirectReads``); True when some came. While the
        session is idle its idle timeout runs, as in ``_next_message`` (one deadline: a part
        of a message that comes does not restart it). False: the loop's read takes over."""
        assert self.direct is not None
        deadline = self._idle_deadline() if self.waiting_for_query else None
        with _waiting_on_client(self.session):
            if deadline is None:
                came = self.direct.wait(None)
            else:
                came = self.direct.wait(max(0.0, deadline[0] - time.monotonic()))
        if came is None:
            assert deadline is not None
            raise _idle_error(deadline[1])
        return came

    # -- idle timeouts and the statement log --------------------------------------------------
    async def _next_message(self) -> tuple[bytes, bytes]:
        """The next message's type and body. While the session is idle (ReadyForQuery went
        out and nothing came since) its idle timeout runs until the whole message came, as
        in PostgreSQL (one deadline from the start of the wait: a client trickling a message
        byte by byte does not dodge it): past it, ``IdleInTransactionSessionTimeoutError``
        (25P03) inside a transaction, else ``IdleSessionTimeoutError`` (57P05); ``run``
        sends it as FATAL and ``close`` rolls the transaction back."""
        reader = self.reader
        deadline = self._idle_deadline() if self.waiting_for_query else None
        with _waiting_on_client(self.session):
            if deadline is None:
                header = await reader.readexactly(5)
                body = await self._read_body(header)
            else:
                try:
                    async with asyncio.timeout(max(0.0, deadline[0] - time.monotonic())):
                        header = await reader.readexactly(5)
                        body = await self._read_body(header)
                except TimeoutError:
                    raise _idle_error(deadline[1]) from None
        self.waiting_for_query = False
        return header[:1], body

    async def _read_body(self, header: bytes) -> bytes:
        """The body of the message of ``header`` (length checked: ``message_body_length``).
        One longer than the floor holds its length in ``holdings`` while it arrives (review
        R1-7, ``memory_budget.read_body``); refused, its body is skipped and
        ``_RefusedMessage`` raised."""
        length = wire_limits.message_body_length(header, self.server.limits)
        if length <= self.holdings.floor:
            return await self.reader.readexactly(length)
        try:
            return await read_body(self.reader, self.holdings, length)
        except MemoryBudgetExceededError as error:
            self.waiting_for_query = False
            raise _RefusedMessage(header[:1], error) from None

    def _long_message_coming(self) -> bool:
        """Whether the reader holds the start of a message longer than the floor: it is
        read by ``_next_message`` (held while it arrives), not by direct reads."""
        buffer = self.reader._buffer
        return len(buffer) >= 5 and _LENGTH.unpack_from(buffer, 1)[0] - 4 > self.holdings.floor

    async def _refuse_message(self, refused: _RefusedMessage) -> None:
        """Answer a message whose body could not be held (skipped): 53200 for a Query (then
        ReadyForQuery) or an extended-protocol message (then skip until Sync), failing an
        open transaction as any error of theirs (``_statement_too_large``'s way); nothing
        for what is ignored here anyway (CopyData after a failed COPY)."""
        if refused.kind == b"Q":
            await self._fail_transaction()
            self.send_error(refused.error)
            self.send(self.ready_for_query())
            await self.writer.drain()
        elif refused.kind in (b"P", b"B", b"D", b"E", b"C"):
            if not self.skipping:
                await self._fail_transaction()
                self.send_error(refused.error)
                self.skipping = True
        elif refused.kind not in _NOTHING_TO_DO:
            raise m.ProtocolError(f"invalid frontend message type {refused.kind!r}")

    def _idle_deadline(self) -> tuple[float, bool] | None:
        """While the session is idle: when its idle timeout ends (``time.monotonic``) and
        whether it is the one of a transaction, set by the first wait after ReadyForQuery
        and kept by every later wait until a whole message came; None without a timeout."""
        deadline = self._idle_until
        if deadline is None:
            limit = self._idle_limit()
            if limit is None:
                return None
            deadline = self._idle_until = (time.monotonic() + limit[0], limit[1])
        return deadline

    def _idle_limit(self) -> tuple[float, bool] | None:
        """The idle timeout in force (seconds) and whether it is the one of a transaction
        (``_idle_error``), or None. Read on the event loop while no statement runs, so the
        session's state is still."""
        session = self.session
        if session is None:
            return None
        values = self.catalog.settings.values  # the shown values, by canonical name
        in_transaction = session.state is not SessionState.IDLE
        name = "idle_in_transaction_session_timeout" if in_transaction else "idle_session_timeout"
        timeout_ms = milliseconds(values[name])
        return None if timeout_ms == 0 else (timeout_ms / 1000, in_transaction)

    def log_statement(self, text: str) -> None:
        """Log ``text`` if the session's ``log_statement`` asks for it (none by default:
        statement text may hold secrets and personal data, so it is opt-in)."""
        if statement_logged(self.catalog.settings.values["log_statement"], text):
            log.info("statement (user %s, pid %d): %s", self.catalog.user, self.process_id, text)

    # -- limits (sql.pgwire.limits) -----------------------------------------------------------
    async def _statement_too_large(self, kind: bytes, body: bytes) -> bool:
        """Refuse a Query/Parse over ``statement_bytes_max`` (54000) without parsing it.

        True when refused: the error is sent (a Query also gets ReadyForQuery, a Parse
        starts skipping to Sync) and an open transaction is failed, as by any error.
        """
        error = wire_limits.statement_error(body, self.server.limits)
        if error is None:
            return False
        if kind == b"P" and self.skipping:
            return True
        await self._fail_transaction()
        self.send_error(error)
        if kind == b"Q":
            self.send(self.ready_for_query())
            await self.writer.drain()
        else:
            self.skipping = True
        return True

    def result_within_limit(self, result: Result) -> bool:
        """True if ``result``'s ``Rows`` are within ``result_bytes_max`` whatever their
        Arrow table's size (left unbuilt): ``_refuse_result`` has nothing to refuse, and
        need not be awaited (a lookup's portal asks this first)."""
        rows = result.rows
        return rows is not None and _bytes_bound(rows) <= self.server.limits.result_bytes_max

    async def _refuse_result(self, result: Result) -> None:
        """Raise 54000 for a result over ``result_bytes_max``, failing an open transaction
        so that a refused consumer read never commits its offsets."""
        if self.result_within_limit(result):
            return  # within the limit whatever its Arrow table's size: left unbuilt
        error = wire_limits.result_error(result.table, self.server.limits)
        if error is not None:
            await self._fail_transaction()
            raise error

    async def _fail_transaction(self) -> None:
        session = self.session
        if session is not None:
            await self.call(session.fail_transaction)

    # -- simple query --------------------------------------------------------------------------
    async def simple_query(self, query: str) -> None:
        self.log_statement(query)
        self.skipping = False
        if wire_commands.handles(query):  # COPY and SQL cursors (connection.commands)
            await wire_commands.simple_query(self.context, query)
            return
        query = surface.plain_begin(query)  # BEGIN ISOLATION LEVEL … (psycopg) -> BEGIN
        statements = PARSED.get(query)
        try:
            if statements is None:
                statements = await self.call(parse_text, query)  # off the loop: may be long
                PARSED.put(query, statements)
        except TopicbaseError:
            # Run it through Session.execute: it raises the same error and fails an
            # open transaction, as any failed statement does.
            try:
                await self.call(self._session().execute, query)
            except Exception as error:
                self.send_error(error, query)
            self.send(self.ready_for_query())
            return
        if not statements:
            self.send(m.empty_query_response())
        for statement in statements:
            try:
                # One hop to the worker: the statement is streamed or, if the engine does
                # not stream it, run whole there.
                outcome = await self.call(self._start_or_run, statement)
                if isinstance(outcome, _Ran):
                    await self.send_result(outcome.result, text_description=outcome.
                                           text_description, held=outcome.held)  # fmt: skip
                else:
                    await self._send_streamed(outcome)
                if statement is not statements[-1]:  # each statement's results as it ends
                    await self.writer.drain()
            except Exception as error:
                self.send_error(error, query)
                break
        self.send(self.ready_for_query())

    async def send_result(self, result: Result, statement: ast.Statement | None = None, *,
                          text_description: Description | None = None,
                          held: copy_commit.Held | None = None) -> None:  # fmt: skip
        """RowDescription, DataRows and CommandComplete of a simple-protocol result. Text
        columns DuckDB knows as UUID or JSON are described so, by ``text_description``
        (asked of the engine here if only ``statement`` is given). ``held``: the statement's
        transaction (a consumer read's), committed once the rows were sent, before
        CommandComplete, or rolled back if they were not all sent."""
        try:
            await self._send_result(result, statement, text_description)
            if held is not None and held.began:
                await self.writer.drain()  # handed to the kernel (the commit blocks the loop)
                await self.call(held.commit)
        except BaseException:
            if held is not None and held.began:
                await self.call(held.rollback)
            raise
        self.send(m.command_complete(result.tag))

    async def _send_result(self, result: Result, statement: ast.Statement | None,
                           text_description: Description | None) -> None:  # fmt: skip
        """``send_result`` but for CommandComplete."""
        await self._refuse_result(result)
        for notice in result.notices:
            self.send(m.notice_response(notice))
        table = result_rows(result)  # ``Rows`` (a small result) are sent as they are
        if table is not None:
            oids, formats = result_columns(table, [])
            if wire_types.TEXT in oids:
                if text_description is None and statement is not None:
                    text_description = await self.call(self.text_description, statement, table)
                oids = refined_text_oids(text_description, table, oids)
            self.send(row_description(table, oids, formats))
            await self.send_rows(table, oids, formats)

    def _start_or_run(self, statement: ast.Statement) -> _Started | _Ran:
        """Worker thread: ``statement``'s stream and first batch (``_start_stream``), or, if
        the engine does not stream it, its whole result (``_Ran``). A consumer read is never
        streamed (not asked: that costs a planning) and in autocommit runs in a transaction
        held until its rows were sent (``copy_commit.hold``)."""
        if not copy_commit.reads_with_consumer(statement):
            started = _start_stream(self.context, statement)
            if started is not None:
                return started
        held = copy_commit.hold(self.context, statement)
        try:  # anything raised before ``_Ran`` reaches the caller: nobody else rolls back
            result = self.catalog.execute(self._session(), statement, None)
            return _Ran(result, self.text_description(statement, result_rows(result)), held)
        except BaseException:
            held.rollback()
            raise

    async def _send_streamed(self, started: _Started) -> None:
        """Send a plain query's rows batch by batch as the engine reads them from DuckDB
        (``_start_or_run`` opened the stream and read its first batch), so a result of any
        size is never held whole (PostgreSQL streams too). A result that fitted in the
        first batch was read and closed on the worker already: it costs no further hop."""
        stream = started.stream
        try:
            formats = [0] * len(stream.oids)
            self.send(described_row(stream.schema.names, stream.oids, formats))
            batch = started.first
            while batch is not None:
                await self.send_rows(batch, stream.oids, formats)
                batch = None if started.ended else await self.call(stream.next_batch)
        finally:
            if not started.ended:
                await self.call(stream.close)
        self.send(m.command_complete(f"SELECT {stream.row_count}"))

    def send_small_rows(self, table: pa.Table | Rows, oids: list[int], formats: list[int]
                        ) -> bool:  # fmt: skip
        """``send_rows`` of a result of a few values (SELECT 1, a lookup by key), done here
        (True), or False: the result is bigger. Encoding them value by value here costs
        microseconds, a hop to the worker thread and back several hundred; called without
        a coroutine, as a lookup's Execute calls it."""
        if table.num_rows * max(table.num_columns, 1) > INLINE_VALUES:
            return False
        if isinstance(table, Rows):
            fields = wire_types.encode_value_rows(table.rows, oids, formats)
        else:
            fields = wire_types.encode_rows(table, oids, formats)
        if len(fields) == 1:  # a lookup's one row
            self.send(m.data_row(fields[0]))
        else:
            self.send(b"".join([m.data_row(row) for row in fields]))
        return True

    async def send_rows(self, table: pa.Table | Rows, oids: list[int], formats: list[int]
                        ) -> None:  # fmt: skip
        """DataRow messages of ``table``: each chunk's per-value encoding runs on the worker
        thread, then its messages are joined and written a block (<= 120 KiB) at a time,
        draining between blocks, so neither we nor the transport hold a chunk-sized buffer
        (``codec.row_encoding``: with default malloc settings those fault in fresh pages)."""
        if self.send_small_rows(table, oids, formats):
            return
        if isinstance(table, Rows):
            table = table.to_arrow()
        for start in range(0, table.num_rows, ROWS_PER_CHUNK):
            chunk = table.slice(start, ROWS_PER_CHUNK)
            rows = await self.call(DataRows, chunk, oids, formats)
            for block in rows.blocks():
                self.send(block)
                await self.writer.drain()

    def _session(self) -> Session:
        assert self.session is not None
        return self.session
