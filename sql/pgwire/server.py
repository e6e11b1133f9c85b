"""The asyncio PostgreSQL-wire server: ``topicbase serve``.

One engine ``Session`` per connection. Every engine call (and the encoding of result
rows) runs on the connection's own worker thread, so the event loop only moves bytes
and one slow statement never holds up another connection; a session always runs on
the same thread. Authentication is ``trust`` only; TLS and GSS encryption are declined
(``N``), which every client accepts on a loopback connection.

Protocol: the simple query protocol (several statements per Query, results sent as each
statement finishes, the first error ends the Query) and the extended protocol (named and
unnamed statements and portals, text and binary parameters, Describe, Execute with a row
limit, Sync, Flush, Close; after an error, messages are skipped until Sync). The engine
has no statement description without running it: Describe of a portal runs its
statement and keeps the result for Execute; Describe of a statement sends the parameter
types and NoData. CancelRequest cancels the running statement of the connection it names.
A malformed startup packet or message gets an ErrorResponse and the connection closes;
the server keeps running.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import logging
import re
import secrets
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from engine.database import Database
from engine.session import Result, Session
from engine.transaction import SessionState
from grammar import ast
from grammar.parse import parse
from sql.pgwire import messages as m
from sql.pgwire import types
from storage.errors import (
    FeatureNotSupportedError,
    SqlSyntaxError,
    TopicbaseError,
)

log = logging.getLogger(__name__)

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 5433
SERVER_VERSION = "15.0 (Topicbase 0.1)"
ROWS_PER_CHUNK = 1000
_STATUS = {SessionState.IDLE: "I", SessionState.IN_TRANSACTION: "T", SessionState.FAILED: "E"}
_PARAMETER = re.compile(r"\$(\d+)")
PARSE_CACHE_ENTRIES = 512


@functools.lru_cache(maxsize=PARSE_CACHE_ENTRIES)
def _parse(text: str) -> tuple[ast.Statement, ...]:
    """Parsed query strings by text (statements are immutable; clients repeat queries)."""
    return tuple(parse(text))


class UndefinedStatementError(TopicbaseError):
    sqlstate = "26000"


class UndefinedCursorError(TopicbaseError):
    sqlstate = "34000"


class ProtocolViolation(TopicbaseError):
    """A message that parsed but does not fit (08P01); unlike ProtocolError, not fatal."""

    sqlstate = "08P01"


class DuplicateStatementError(TopicbaseError):
    sqlstate = "42P05"


class DuplicateCursorError(TopicbaseError):
    sqlstate = "42P03"


@dataclass
class Prepared:
    query: str
    statement: ast.Statement | None  # None: an empty query
    parameter_oids: list[int]


@dataclass
class Portal:
    prepared: Prepared
    parameters: list[Any]
    result_formats: list[int]
    result: Result | None = None
    executed: bool = False
    position: int = 0
    oids: list[int] = field(default_factory=list)
    formats: list[int] = field(default_factory=list)


def error_fields(error: BaseException, query: str | None = None) -> tuple[str, str, int | None]:
    """SQLSTATE, message and 1-based character position (if known) of ``error``."""
    if isinstance(error, TopicbaseError):
        position = None
        if isinstance(error, SqlSyntaxError) and query and error.line and error.column:
            lines = query.split("\n")
            position = sum(len(line) + 1 for line in lines[: error.line - 1]) + error.column
        return error.sqlstate, error.message, position
    if isinstance(error, KeyboardInterrupt):
        return "57014", "canceling statement due to user request", None
    return "XX000", f"{type(error).__name__}: {error}", None


def _columns(table: pa.Table, formats: list[int]) -> tuple[list[int], list[int]]:
    count = table.num_columns
    if not formats:
        formats = [0] * count
    elif len(formats) == 1:
        formats = formats * count
    elif len(formats) != count:
        raise ProtocolViolation(f"bind message has {len(formats)} result formats but query has "
                              f"{count} columns")  # fmt: skip
    return [types.type_oid(f.type) for f in table.schema], formats


def _row_description(table: pa.Table, oids: list[int], formats: list[int]) -> bytes:
    return m.row_description(
        [
            m.Column(name, oid, types.type_size(oid), -1, fmt)
            for name, oid, fmt in zip(table.column_names, oids, formats, strict=True)
        ]
    )


class Connection:
    def __init__(self, server: PgServer, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter) -> None:  # fmt: skip
        self.server = server
        self.reader = reader
        self.writer = writer
        self.session: Session | None = None
        self.process_id = 0
        self.secret_key = secrets.randbits(31)
        self.executor = concurrent.futures.ThreadPoolExecutor(1, "topicbase-pgwire")
        self.statements: dict[str, Prepared] = {}
        self.portals: dict[str, Portal] = {}
        self.skipping = False  # after an extended-protocol error, until Sync

    async def call(self, function: Callable[..., Any], *arguments: Any) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.executor, function, *arguments)

    def send(self, data: bytes) -> None:
        self.writer.write(data)

    def send_error(self, error: BaseException, query: str | None = None) -> None:
        if not isinstance(error, TopicbaseError):
            log.exception("unexpected error in a statement", exc_info=error)
        sqlstate, text, position = error_fields(error, query)
        self.send(m.error_response(sqlstate, text, position))

    def status(self) -> str:
        return "I" if self.session is None else _STATUS[self.session.state]

    # -- lifetime --------------------------------------------------------------------------
    async def run(self) -> None:
        try:
            if await self.startup():
                await self.serve_messages()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        except m.ProtocolError as error:
            self.send(m.error_response(error.sqlstate, error.message, severity="FATAL"))
        finally:
            await self.close()

    async def close(self) -> None:
        self.server.connections.pop(self.process_id, None)
        if self.session is not None:
            try:
                await self.call(self.session.close)
            except Exception:
                log.exception("closing a session failed")
        self.executor.shutdown(wait=False)
        with contextlib.suppress(ConnectionError):
            await self.writer.drain()
        self.writer.close()

    async def startup(self) -> bool:
        """Negotiate until a v3 StartupMessage; True when the session is ready."""
        while True:
            length = m.startup_length(await self.reader.readexactly(4))
            startup = m.parse_startup(await self.reader.readexactly(length - 4))
            if startup.code in (m.SSL_REQUEST, m.GSSENC_REQUEST):
                self.send(b"N")
                await self.writer.drain()
                continue
            if startup.code == m.CANCEL_REQUEST:
                self.server.cancel(startup.process_id, startup.secret_key)
                return False
            if startup.code != m.PROTOCOL_V3:
                major, minor = startup.code >> 16, startup.code & 0xFFFF
                self.send(m.error_response("0A000", f"unsupported frontend protocol "
                                           f"{major}.{minor}", severity="FATAL"))  # fmt: skip
                return False
            break
        try:
            self.session = await self.call(self.server.database.connect)
        except TopicbaseError as error:
            sqlstate, text, _ = error_fields(error)
            self.send(m.error_response(sqlstate, text, severity="FATAL"))
            return False
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
            "is_superuser": "on",
            "session_authorization": startup.parameters.get("user", "topicbase"),
            "application_name": startup.parameters.get("application_name", ""),
        }
        self.send(m.authentication_ok())
        for name, value in parameters.items():
            self.send(m.parameter_status(name, value))
        self.send(m.backend_key_data(self.process_id, self.secret_key))
        self.send(m.ready_for_query(self.status()))
        await self.writer.drain()
        return True

    async def serve_messages(self) -> None:
        while True:
            header = await self.reader.readexactly(5)
            body = await self.reader.readexactly(m.message_length(header))
            kind = header[:1]
            if kind == b"X":
                return
            if kind == b"Q":
                await self.simple_query(m.parse_query(body))
            elif kind == b"S":
                self.skipping = False
                if self.session is not None and self.session.state is SessionState.IDLE:
                    self.portals.clear()
                self.send(m.ready_for_query(self.status()))
            elif kind in (b"P", b"B", b"D", b"E", b"C"):
                if not self.skipping:
                    try:
                        await self.extended(kind, body)
                    except m.ProtocolError:
                        raise
                    except Exception as error:
                        self.send_error(error, self._query_of(kind, body))
                        self.skipping = True
            elif kind != b"H":  # Flush (H) only asks for the drain below
                raise m.ProtocolError(f"invalid frontend message type {kind!r}")
            if kind in (b"Q", b"S", b"H"):
                await self.writer.drain()

    # -- simple query --------------------------------------------------------------------------
    async def simple_query(self, query: str) -> None:
        self.skipping = False
        try:
            statements = _parse(query)
        except TopicbaseError:
            # Run it through Session.execute: it raises the same error and fails an
            # open transaction, as any failed statement does.
            try:
                await self.call(self._session().execute, query)
            except Exception as error:
                self.send_error(error, query)
            self.send(m.ready_for_query(self.status()))
            return
        if not statements:
            self.send(m.empty_query_response())
        for statement in statements:
            try:
                result = await self.call(self._session().execute_statement, statement)
                await self.send_result(result)
            except Exception as error:
                self.send_error(error, query)
                break
        self.send(m.ready_for_query(self.status()))

    async def send_result(self, result: Result) -> None:
        for notice in result.notices:
            self.send(m.notice_response(notice))
        table = result.table
        if table is not None:
            oids, formats = _columns(table, [])
            self.send(_row_description(table, oids, formats))
            await self.send_rows(table, oids, formats)
        self.send(m.command_complete(result.tag))

    async def send_rows(self, table: pa.Table, oids: list[int], formats: list[int]) -> None:
        for start in range(0, table.num_rows, ROWS_PER_CHUNK):
            chunk = table.slice(start, ROWS_PER_CHUNK)
            data = await self.call(_encode, chunk, oids, formats)
            self.send(data)
            await self.writer.drain()

    # -- extended protocol -----------------------------------------------------------------------
    def _session(self) -> Session:
        assert self.session is not None
        return self.session

    def _query_of(self, kind: bytes, body: bytes) -> str | None:
        try:
            if kind == b"P":
                return m.parse_parse(body).query
            if kind == b"B":
                prepared = self.statements.get(m.parse_bind(body).statement)
                return None if prepared is None else prepared.query
        except m.ProtocolError:
            return None
        return None

    async def extended(self, kind: bytes, body: bytes) -> None:
        if kind == b"P":
            await self.on_parse(m.parse_parse(body))
        elif kind == b"B":
            self.on_bind(m.parse_bind(body))
        elif kind == b"D":
            await self.on_describe(m.parse_describe(body))
        elif kind == b"E":
            await self.on_execute(m.parse_execute(body))
        else:
            close = m.parse_close(body)
            (self.statements if close.kind == "S" else self.portals).pop(close.name, None)
            self.send(m.close_complete())

    async def on_parse(self, message: m.Parse) -> None:
        try:
            statements = _parse(message.query)
        except TopicbaseError:
            await self.call(self._session().execute, message.query)  # raises, fails the txn
            raise
        if len(statements) > 1:
            raise SqlSyntaxError("cannot insert multiple commands into a prepared statement")
        if message.name and message.name in self.statements:
            raise DuplicateStatementError(f'prepared statement "{message.name}" already exists')
        used = [int(n) for n in _PARAMETER.findall(message.query)]
        count = max([len(message.parameter_oids), *used])
        oids = [*message.parameter_oids, *[0] * (count - len(message.parameter_oids))]
        self.statements[message.name] = Prepared(
            message.query, statements[0] if statements else None, oids
        )
        self.send(m.parse_complete())

    def on_bind(self, message: m.Bind) -> None:
        prepared = self.statements.get(message.statement)
        if prepared is None:
            raise UndefinedStatementError(
                f'prepared statement "{message.statement}" does not exist'
            )
        count = len(message.parameters)
        if count != len(prepared.parameter_oids):
            raise ProtocolViolation(
                f"bind message supplies {count} parameters, but prepared statement "
                f'"{message.statement}" requires {len(prepared.parameter_oids)}'
            )
        formats = message.parameter_formats
        if len(formats) <= 1:
            formats = (formats or [0]) * count
        elif len(formats) != count:
            raise ProtocolViolation("bind message has a wrong number of parameter formats")
        values = [
            types.decode_parameter(value, oid, fmt)
            for value, oid, fmt in zip(message.parameters, prepared.parameter_oids, formats,
                                       strict=True)
        ]  # fmt: skip
        if message.portal and message.portal in self.portals:
            raise DuplicateCursorError(f'cursor "{message.portal}" already exists')
        self.portals[message.portal] = Portal(prepared, values, message.result_formats)
        self.send(m.bind_complete())

    def _portal(self, name: str) -> Portal:
        portal = self.portals.get(name)
        if portal is None:
            raise UndefinedCursorError(f'portal "{name}" does not exist')
        return portal

    async def _run_portal(self, portal: Portal) -> None:
        if portal.executed:
            return
        portal.executed = True
        statement = portal.prepared.statement
        if statement is None:
            return
        parameters = portal.parameters or None
        portal.result = await self.call(self._session().execute_statement, statement, parameters)
        if portal.result.table is not None:
            portal.oids, portal.formats = _columns(portal.result.table, portal.result_formats)
            for fmt, oid in zip(portal.formats, portal.oids, strict=True):
                if fmt == 1:
                    types.column_encoder(oid, 1)  # raises for types without binary output

    async def on_describe(self, message: m.Describe) -> None:
        if message.kind == "S":
            prepared = self.statements.get(message.name)
            if prepared is None:
                raise UndefinedStatementError(f'prepared statement "{message.name}" does not exist')
            oids = [oid or types.TEXT for oid in prepared.parameter_oids]
            self.send(m.parameter_description(oids))
            self.send(m.no_data())
            return
        portal = self._portal(message.name)
        await self._run_portal(portal)
        result = portal.result
        if result is None or result.table is None:
            self.send(m.no_data())
        else:
            self.send(_row_description(result.table, portal.oids, portal.formats))

    async def on_execute(self, message: m.Execute) -> None:
        portal = self._portal(message.portal)
        await self._run_portal(portal)
        result = portal.result
        if result is None:
            self.send(m.empty_query_response())
            return
        if not portal.position:
            for notice in result.notices:
                self.send(m.notice_response(notice))
        table = result.table
        if table is None:
            if not portal.position:
                portal.position = 1
                self.send(m.command_complete(result.tag))
            else:
                self.send(m.command_complete(result.tag.split(" ")[0]))
            return
        remaining = table.num_rows - portal.position
        count = remaining if message.max_rows <= 0 else min(message.max_rows, remaining)
        rows = table.slice(portal.position, count)
        portal.position += count
        await self.send_rows(rows, portal.oids, portal.formats)
        if portal.position < table.num_rows:
            self.send(m.portal_suspended())
        elif result.tag.startswith("SELECT "):
            self.send(m.command_complete(f"SELECT {count}"))
        else:
            self.send(m.command_complete(result.tag))


def _encode(table: pa.Table, oids: list[int], formats: list[int]) -> bytes:
    return b"".join(m.data_row(row) for row in types.encode_rows(table, oids, formats))


class PgServer:
    """Serves one open ``Database`` over the PostgreSQL protocol."""

    def __init__(self, database: Database, host: str = DEFAULT_HOST,
                 port: int = DEFAULT_PORT, auth: str = "trust") -> None:  # fmt: skip
        if auth != "trust":
            raise FeatureNotSupportedError(f'authentication method "{auth}" is not supported')
        self.database = database
        self.host = host
        self.port = port
        self.connections: dict[int, Connection] = {}
        self._next_process_id = 1000
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def register(self, connection: Connection) -> int:
        self._next_process_id += 1
        self.connections[self._next_process_id] = connection
        return self._next_process_id

    def cancel(self, process_id: int, secret_key: int) -> None:
        connection = self.connections.get(process_id)
        if connection is not None and connection.secret_key == secret_key and connection.session:
            connection.session.cancel()

    async def start(self) -> int:
        """Start listening; returns the port (useful with port 0)."""
        self._server = await asyncio.start_server(self._handle, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await Connection(self, reader, writer).run()
        except asyncio.CancelledError:  # the server is stopping; the task ends here
            pass
        finally:
            self._tasks.discard(task)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for connection in list(self.connections.values()):
                connection.writer.close()
            if self._tasks:
                _, pending = await asyncio.wait(list(self._tasks), timeout=5)
                for task in pending:
                    task.cancel()
            await self._server.wait_closed()


def serve(data_dir: str, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT,
          auth: str = "trust", ready: Callable[[int], None] | None = None) -> None:  # fmt: skip
    """Open ``data_dir`` and serve it until SIGINT or SIGTERM (blocking)."""
    database = Database.open(data_dir)
    try:
        server = PgServer(database, host, port, auth)

        async def main() -> None:
            bound = await server.start()
            stopping = asyncio.Event()
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopping.set)
            if ready is not None:
                ready(bound)
            try:
                await stopping.wait()
            finally:
                await server.stop()

        asyncio.run(main())
    finally:
        database.close()


class ServerThread:
    """A server on a background thread with its own event loop (tests, embedding)."""

    def __init__(self, data_dir: str, host: str = DEFAULT_HOST, port: int = 0) -> None:
        self.database = Database.open(data_dir)
        self.server = PgServer(self.database, host, port)
        self.loop = asyncio.new_event_loop()
        self.port = self.loop.run_until_complete(self.server.start())
        self.thread = threading.Thread(target=self.loop.run_forever, name="topicbase-pgwire",
                                       daemon=True)  # fmt: skip
        self.thread.start()

    def stop(self) -> None:
        future = asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop)
        try:
            future.result(timeout=10)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=10)
            self.database.close()
