"""The extended query protocol of a connection: Parse, Bind, Describe, Execute, Close.

``ExtendedProtocol`` is mixed into ``connection.Connection`` (it keeps the connection's
prepared statements and portals and uses its worker thread, its sending and its session;
the members it uses are declared below). Describe of a statement asks the engine for a
description without running it (``Session.describe``): parameter types the client left
unspecified (OID 0 or 705) are inferred, text where the context tells nothing, and fixed
for the statement's binds; its rows are described with the same OIDs Execute then uses.
Describe of a portal of an undescribed statement runs the statement and keeps the result
for Execute. A described statement is revalidated before it runs (``portals``). After an
error, the connection skips messages until Sync. A consumer read in autocommit commits its
offsets only once its rows were sent, before CommandComplete (``copy_commit.hold``); its
portal holds that transaction meanwhile (``held``), and any message but the Execute that
goes on with it rolls it back (``settle_held``). A portal whose held read was rolled back
that way is kept in ``abandoned_reads``: a later Execute of it is an ErrorResponse (55000),
not the rest of its rows and CommandComplete, since its offsets did not move and the next
read returns the same messages again.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any

import pyarrow as pa

from engine.api import (
    SCHEMA_COLUMN_BYTES,
    TEXT_COST_PER_CHAR,
    BoundedCache,
    Description,
    Result,
    Rows,
    Session,
    SessionState,
    ast,
    lookup_shaped,
    parse,
    text_cache,
)
from sql.pgwire.codec import arrays, wire_types
from sql.pgwire.codec import messages as m
from sql.pgwire.connection import commands as wire_commands
from sql.pgwire.connection import copy_commit
from sql.pgwire.connection.context import CommandContext
from sql.pgwire.connection.portals import (
    CachedPlanChangedError,
    HeldPortals,
    Portal,
    Prepared,
    ProtocolViolation,
    apply_description,
    described_oids,
    described_row,
    result_columns,
    result_formats,
    revalidation_error,
    row_description,
    rows_shape,
)
from sql.pgwire.emulation import surface
from sql.pgwire.memory_budget import MemoryBudgetExceededError
from storage import limits
from storage.errors import (
    DuplicateCursorError,
    DuplicatePreparedStatementError,
    InFailedTransactionError,
    LimitExceededError,
    ObjectNotInPrerequisiteStateError,
    SqlSyntaxError,
    TopicbaseError,
    UndefinedCursorError,
    UndefinedPreparedStatementError,
)
from storage.limits import (
    CACHED_TEXT_CHARS_MAX,
    KEPT_LITERAL_RESPONSE_BYTES_MAX,
    KEPT_LITERAL_RESPONSES_MAX,
    WIRE_PARAMETERS_MAX,
)

log = logging.getLogger(__name__)

_PARAMETER = re.compile(r"\$(\d+)")
PARSE_CACHE_ENTRIES = 512
KEPT_DESCRIPTIONS = 64  # per connection (``ExtendedProtocol._describe_again``)


class ParsedTexts:
    """Parse results by text that the event loop finds without a hop to a worker thread
    (parsing depends on the text alone; ``parse_text`` and ``_prepare_text`` are cached
    on the workers too, but asking there costs tens of microseconds of thread wake-ups).
    Bounded like ``text_cache`` (a ``BoundedCache``): at most ``entries`` texts and its
    byte budget, none over ``CACHED_TEXT_CHARS_MAX``; the least recently used goes first.
    Thread-safe (a process may run several servers, each on its own event loop thread)."""

    def __init__(self, name: str, entries: int) -> None:
        self._kept = BoundedCache(name, entries)
        # What ``put`` kept for a text, or None (the cache's own ``get``: one call).
        self.get: Callable[[str], Any] = self._kept.get

    def put(self, text: str, value: Any) -> None:
        if len(text) <= CACHED_TEXT_CHARS_MAX:
            self._kept.put(text, value, TEXT_COST_PER_CHAR * len(text))


# parse_text's results (simple query) and _prepare_text's (Parse)
PARSED = ParsedTexts("sql.pgwire.parsed", PARSE_CACHE_ENTRIES)
PREPARED = ParsedTexts("sql.pgwire.prepared", PARSE_CACHE_ENTRIES)


_IN_FAILED_TRANSACTION = (
    "current transaction is aborted, commands ignored until end of transaction block"
)


def ends_transaction(statement: ast.Statement | None) -> bool:
    """COMMIT, ROLLBACK, ROLLBACK TO, or an empty query: what Parse, Bind and Execute take
    in a failed transaction, as in PostgreSQL (which refuses everything else: 25P02). An
    empty query is parsed, and a portal of one bound before the failure executed (empty
    query response), but a Bind of it is refused (``on_bind``), as PostgreSQL's."""
    return (
        statement is None
        or isinstance(statement, ast.Commit | ast.Rollback)
        or (isinstance(statement, ast.SqlStatement) and surface.is_rollback_to(statement.sql))
    )


@text_cache(PARSE_CACHE_ENTRIES)
def parse_text(text: str) -> tuple[ast.Statement, ...]:
    """Parsed query strings by text (statements are immutable; clients repeat queries)."""
    return tuple(parse(text))


@text_cache(PARSE_CACHE_ENTRIES)
def _prepare_text(text: str) -> tuple[tuple[ast.Statement, ...], int]:
    """What Parse needs of a query text: its statements (ours, or parsed) and its highest
    ``$n``. Depends on the text alone (no catalog), so it is kept by text: psycopg sends
    a 1000-placeholder INSERT's Parse 6 times, and scanning it costs milliseconds."""
    # BEGIN ISOLATION LEVEL … comes through Parse too (psycopg's executemany).
    statements = wire_commands.prepared_statements(text) or parse_text(surface.plain_begin(text))
    return statements, max(map(int, _PARAMETER.findall(text)), default=0)


def refined_text_oids(description: Description | None, table: pa.Table | Rows,
                      oids: list[int]) -> list[int]:  # fmt: skip
    """``oids`` with UUID and JSON for the text columns ``description`` (the executed
    statement's, ``ExtendedProtocol.text_description``) knows as such."""
    columns = None if description is None else description.columns
    if columns is None or len(columns) != table.num_columns:
        return oids
    return [
        wire_types.column_oid(f.type, c.sql_type) if oid == wire_types.TEXT else oid
        for f, c, oid in zip(table.schema, columns, oids, strict=True)
    ]


def untyped_parameters(parameters: list[bytes | None], oids: list[int], formats: list[int]
                       ) -> list[tuple[int, bytes]]:  # fmt: skip
    """A Bind's untyped text parameters to decode again once the statement is described
    (``Portal.untyped``): array literals and texts an integer cast reads otherwise."""
    if 0 not in formats or (0 not in oids and wire_types.UNKNOWN not in oids):
        return []  # no text value of an untyped parameter (C scans; 1000 a Bind)
    return [
        (index, value)
        for index, (value, oid, fmt) in enumerate(zip(parameters, oids, formats, strict=True))
        if oid in (0, wire_types.UNKNOWN) and fmt == 0 and value is not None
        and (value[:1] == b"{" or wire_types.integer_cast_differs(value))
    ]  # fmt: skip


def described_portal_row(described: list[tuple[str, int]], asked: list[int]) -> bytes:
    """The RowDescription a Describe of a portal of a described statement sends before it
    runs (its columns as described, in the formats the Bind asked); raises for a binary
    format asked of a type without binary output."""
    formats = result_formats(len(described), asked)
    for fmt, (_, oid) in zip(formats, described, strict=True):
        if fmt == 1:
            wire_types.column_encoder(oid, 1)  # raises for types without binary output
    names = [name for name, _ in described]
    return described_row(names, [oid for _, oid in described], formats)


def result_rows(result: Result) -> pa.Table | Rows | None:
    """``result``'s rows as the engine gave them: ``Rows`` (Python values) for a small
    result read that way, whose Arrow table is then never built, else its table."""
    return result.rows if result.rows is not None else result.table


class ExtendedProtocol:
    """Parse, Bind, Describe, Execute and Close of one connection (mixed into it)."""

    # What the connection provides (``connection.Connection``).
    statements: dict[str, Prepared]
    portals: HeldPortals
    # id(statement) -> (statement, catalog version, description): ``_describe_again``
    # (a ``BoundedCache`` of at most KEPT_DESCRIPTIONS entries and its byte budget)
    kept_descriptions: BoundedCache
    # The portal whose consumer read ran and holds its transaction until its rows were
    # sent (``copy_commit.hold``), and that transaction; None when there is none.
    held: tuple[Portal, copy_commit.Held] | None
    # Portals whose held read ``settle_held`` rolled back (by id; the value is the portal,
    # so the id is not reused while it is here): their later Executes fail. Only portals
    # still in ``portals`` are kept (pruned whenever one is added).
    abandoned_reads: dict[int, Portal]
    # (id of a kept literal row, id of its RowDescription) -> (the row, the RowDescription,
    # the bytes of its DataRow and CommandComplete): ``_send_kept_response``
    kept_responses: dict[tuple[int, int], tuple[tuple[Any, ...], bytes, bytes]]
    # The last kept literal flight answered (``literal_flight.KeptFlight``), or None.
    kept_literal_flight: Any
    skipping: bool
    reader: asyncio.StreamReader
    ready_for_query: Callable[[], bytes]
    catalog: surface.ConnectionCatalog
    context: CommandContext
    call: Callable[..., Awaitable[Any]]
    send: Callable[[bytes], None]
    log_statement: Callable[[str], None]
    send_rows: Callable[[pa.Table | Rows, list[int], list[int]], Awaitable[None]]
    send_small_rows: Callable[[pa.Table | Rows, list[int], list[int]], bool]
    _refuse_result: Callable[[Result], Awaitable[None]]
    result_within_limit: Callable[[Result], bool]
    _session: Callable[[], Session]
    session: Session | None  # None until the login made one

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
        """One message of the extended protocol (Parse, Bind, Describe, Execute, Close).
        The message loop runs a Bind itself (no coroutine for it)."""
        if kind == b"B":
            self.on_bind(m.parse_bind(body), len(body))
        elif kind == b"E":
            await self.on_execute(m.parse_execute(body))
        elif kind == b"D":
            await self.on_describe(m.parse_describe(body))
        elif kind == b"P":
            await self.on_parse(m.parse_parse(body))
        else:
            close = m.parse_close(body)
            (self.statements if close.kind == "S" else self.portals).pop(close.name, None)
            self.send(m.close_complete())

    async def on_parse(self, message: m.Parse) -> None:
        prepared = PREPARED.get(message.query)
        if prepared is None:
            try:
                prepared = await self.call(_prepare_text, message.query)
            except TopicbaseError:
                await self.call(self._session().execute, message.query)  # raises, fails txn
                raise
            PREPARED.put(message.query, prepared)
        statements, highest = prepared
        if len(statements) > 1:
            raise SqlSyntaxError("cannot insert multiple commands into a prepared statement")
        self._refuse_when_failed(statements[0] if statements else None)
        if message.name and message.name in self.statements:
            raise DuplicatePreparedStatementError(
                f'prepared statement "{message.name}" already exists'
            )
        if message.name:
            self._check_prepared_room(message.query)
        if highest > WIRE_PARAMETERS_MAX:  # no Bind could supply it
            raise LimitExceededError(f"there is no parameter ${highest}: a statement takes at "
                                     f"most {WIRE_PARAMETERS_MAX} parameters")  # fmt: skip
        count = max(len(message.parameter_oids), highest)
        oids = [*message.parameter_oids, *[0] * (count - len(message.parameter_oids))]
        statement = statements[0] if statements else None
        wire = wire_commands.is_wire_statement(statement)
        copy = wire_commands.is_copy_statement(statement)
        insert = isinstance(statement, ast.InsertTopic) and statement.values is not None \
            and not statement.returning  # fmt: skip
        self.statements[message.name] = Prepared(message.query, statement, oids, wire=wire,
                                                 copy=copy, insert=insert)  # fmt: skip
        self.send(m.parse_complete())

    def _check_prepared_room(self, query: str) -> None:
        """Refuse (54000) a named Parse past the connection's bounds on named statements
        (their number and their texts' characters: ``limits``). The texts are summed only
        once a connection holds many (a client's few named statements cost nothing)."""
        held = len(self.statements)
        if held >= limits.PREPARED_STATEMENTS_PER_CONNECTION_MAX:
            raise LimitExceededError(
                f"too many prepared statements on this connection (limit "
                f"{limits.PREPARED_STATEMENTS_PER_CONNECTION_MAX}): DEALLOCATE some first"
            )
        if held >= 16 or len(query) >= limits.PREPARED_TEXT_CHARS_PER_CONNECTION_MAX // 16:
            chars = len(query) + sum(len(p.query) for p in self.statements.values())
            if chars > limits.PREPARED_TEXT_CHARS_PER_CONNECTION_MAX:
                raise LimitExceededError(
                    "the prepared statements of this connection would hold more than "
                    f"{limits.PREPARED_TEXT_CHARS_PER_CONNECTION_MAX} characters of text: "
                    "DEALLOCATE some first"
                )

    def on_bind(self, message: m.Bind, message_bytes: int = 0) -> None:
        """Bind a portal; ``message_bytes`` (the Bind's size) is counted in the server's
        memory budget while the portal is held (53200 past it, ``HeldPortals``)."""
        prepared = self.statements.get(message.statement)
        if prepared is None:
            raise UndefinedPreparedStatementError(
                f'prepared statement "{message.statement}" does not exist'
            )
        statement = prepared.statement
        if statement is None and self._failed():  # PostgreSQL binds no empty query then
            raise InFailedTransactionError(_IN_FAILED_TRANSACTION)
        self._refuse_when_failed(statement)
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
        values = wire_types.decode_parameters(message.parameters, prepared.parameter_oids, formats)
        if message.portal and message.portal in self.portals:
            raise DuplicateCursorError(f'cursor "{message.portal}" already exists')
        if message.portal and len(self.portals) >= limits.PORTALS_PER_CONNECTION_MAX:
            raise LimitExceededError(
                f"too many portals on this connection (limit {limits.PORTALS_PER_CONNECTION_MAX})"
            )
        portal = Portal(prepared, values, message.result_formats)
        if not prepared.described and values:  # psycopg sends lists and str untyped
            portal.untyped = untyped_parameters(message.parameters, prepared.parameter_oids,
                                                formats)  # fmt: skip
        self.portals.hold(message.portal, portal, message_bytes)
        self.send(m.bind_complete())

    async def _decode_untyped(self, portal: Portal) -> None:
        """Decode the portal's untyped ``{...}`` parameters as arrays where the statement
        (described now, as a Describe would) takes a list, and check its untyped texts
        like ``1.5`` where it takes an integer (22P02, as PostgreSQL); others stay text."""
        candidates, portal.untyped = portal.untyped, []
        try:
            await self._describe_statement(portal.prepared)
        except TopicbaseError:  # not describable: the values stay text, as before
            log.debug("describing for untyped array parameters failed", exc_info=True)
            return
        for index, value in candidates:
            oid = portal.prepared.parameter_oids[index]
            if oid in arrays.ELEMENT_OIDS or oid in wire_types.INTEGER_OIDS:
                portal.parameters[index] = wire_types.decode_parameter(value, oid, 0)

    def _refuse_when_failed(self, statement: ast.Statement | None) -> None:
        """25P02 for ``statement`` in a failed transaction unless it ends the transaction
        (``ends_transaction``): Parse, Bind and Execute of anything else, Describe of what
        gives rows, as PostgreSQL refuses them (nothing is read in a failed transaction)."""
        if self._failed() and not ends_transaction(statement):
            raise InFailedTransactionError(_IN_FAILED_TRANSACTION)

    def _failed(self) -> bool:
        session = self.session
        return session is not None and session.state is SessionState.FAILED

    def _portal(self, name: str) -> Portal:
        portal = self.portals.get(name)
        if portal is None:
            raise UndefinedCursorError(f'portal "{name}" does not exist')
        return portal

    async def _run_portal(self, portal: Portal) -> bool:
        """Run the portal's statement once; False when the statement's description went
        stale (then the error went out and messages are skipped until Sync)."""
        if portal.executed:
            return True
        portal.executed = True
        if self.held is not None:  # another portal's read: it is not going on
            await self.settle_held()
        statement = portal.prepared.statement
        if portal.untyped and statement is not None:
            await self._decode_untyped(portal)
        if statement is None:
            return True
        self.log_statement(portal.prepared.query)
        parameters = portal.parameters or None
        text_description = None
        try:
            if portal.prepared.wire:  # DECLARE/FETCH/MOVE/CLOSE
                result = await wire_commands.run_in_portal(self.context, statement, parameters)
            else:  # one hop to the worker: revalidate, run, describe text columns
                result, text_description, held = await self.call(
                    self._execute_prepared, portal.prepared, parameters)  # fmt: skip
                if held.began:
                    self.held = (portal, held)
        except CachedPlanChangedError as error:
            self.send(revalidation_error(error.message))
            self.skipping = True
            return False
        try:
            if not self.result_within_limit(result):
                await self._refuse_result(result)
        except BaseException:
            await self.settle_held()
            raise
        portal.result = result
        self._shape_portal(portal, text_description)
        return True

    @staticmethod
    def _shape_portal(portal: Portal, text_description: Description | None) -> None:
        """Set the wire shape (OIDs, formats, a kept RowDescription) of the rows of the
        portal's result (``portal.result``, just run); raises for a binary format asked of
        a type without binary output. ``_run_portal``'s last step, and the lookup flight's
        (``sql.pgwire.connection.lookup_flight``)."""
        assert portal.result is not None
        table = result_rows(portal.result)
        if table is None:
            return
        described = portal.prepared.columns
        if isinstance(table, Rows) and described is None:  # a result shape seen before
            shape = rows_shape(table.schema, portal.result_formats)
            portal.oids, portal.formats, portal.row_description = shape.oids, shape.formats, \
                shape.row_description  # fmt: skip
            return
        portal.oids, portal.formats = result_columns(table, portal.result_formats)
        if described is not None:  # the client decodes by the statement's description
            portal.oids = described_oids(described, portal.oids)
        else:
            portal.oids = refined_text_oids(text_description, table, portal.oids)
        for fmt, oid in zip(portal.formats, portal.oids, strict=True):
            if fmt == 1:
                wire_types.column_encoder(oid, 1)  # raises for types without binary output

    def _execute_prepared(self, prepared: Prepared, parameters: Any
                          ) -> tuple[Result, Description | None, copy_commit.Held]:  # fmt: skip
        """Worker thread: run ``prepared``'s statement (not one the wire server runs itself)
        with everything the engine is asked around it, so that a portal costs one hop to
        this thread: the revalidation of a described statement before it runs (raises
        ``CachedPlanChangedError``), the transaction that holds a consumer read's offsets
        until its rows were sent (``copy_commit.hold``), and for an undescribed statement
        with text columns, the description that tells UUID and JSON apart from text
        (``text_description``)."""
        statement = prepared.statement
        assert statement is not None
        self._revalidate(prepared)
        if prepared.lookup is None:
            prepared.lookup = lookup_shaped(statement)
        if prepared.lookup:  # answered from an index, if one; such a text reads no topic,
            # so ``copy_commit.hold`` holds nothing for it (and no literal row is kept)
            result = self.catalog.answer_lookup(self._session(), statement, parameters)
            if result is not None:
                return self._described(prepared, result, copy_commit.Held(self.context, False))
        held = copy_commit.hold(self.context, statement)
        try:  # anything raised before the return reaches the caller: nobody else rolls back
            session = self._session()
            result = None
            if not held.began and not parameters:  # a kept literal row, if it is one
                result = self.catalog.answer_literal(session, statement)
                prepared.literal = result is not None  # its flights: ``literal_flight``
            if result is None:
                result = self.catalog.execute(session, statement, parameters)
            return self._described(prepared, result, held)
        except BaseException:
            held.rollback()
            raise

    def _described(self, prepared: Prepared, result: Result, held: copy_commit.Held
                   ) -> tuple[Result, Description | None, copy_commit.Held]:  # fmt: skip
        """``_execute_prepared``'s answer for ``result``: with the description of its text
        columns when the statement was not described and its rows are not ``Rows``."""
        if prepared.columns is not None or result.rows is not None:
            # ``Rows``' string columns are DuckDB's VARCHAR: nothing to tell apart
            return result, None, held
        description = self.text_description(prepared.statement, result_rows(result), wire=False)
        return result, description, held

    async def settle_held(self, portal: Portal | None = None) -> copy_commit.Held | None:
        """The held transaction of ``portal`` (taken off the connection: the caller commits
        or rolls it back), or None if it holds none. A transaction held by another portal
        (or any, when ``portal`` is None) is rolled back here: its rows were not all sent,
        so its consumer's offsets stay where they were."""
        if self.held is None:
            return None
        (holder, held), self.held = self.held, None
        if holder is portal:
            return held
        await self.call(held.rollback)
        live = {id(p) for p in self.portals.values()}
        self.abandoned_reads = {k: p for k, p in self.abandoned_reads.items() if k in live}
        self.abandoned_reads[id(holder)] = holder
        return None

    def _refuse_abandoned(self, portal: Portal) -> None:
        """Raise if ``portal``'s consumer read was rolled back before all its rows were
        sent (``settle_held``): the rows it would send now were never to be committed, and
        its offsets stay where they were (the next read returns the same messages)."""
        if self.abandoned_reads.get(id(portal)) is portal:
            raise ObjectNotInPrerequisiteStateError(
                "the consumer read's offsets were rolled back: another statement ran before "
                "all its rows were fetched; the next read returns the same messages again")

    def _revalidate(self, prepared: Prepared) -> None:
        """Before a described row-returning statement runs: its rows must still be what the
        client was told (PostgreSQL's RevalidateCachedQuery). The engine keeps descriptions
        while its catalog stands still, so this is cheap when nothing changed. Worker thread."""
        if not prepared.described or prepared.columns is None or prepared.statement is None:
            return
        columns = self._describe_again(prepared.statement).columns
        fresh = None if columns is None else [
            (c.name, wire_types.column_oid(c.arrow_type, c.sql_type)) for c in columns
        ]  # fmt: skip
        if fresh != prepared.columns:
            raise CachedPlanChangedError("cached plan must not change result type")

    async def on_describe(self, message: m.Describe) -> None:
        if message.kind == "S":
            prepared = self.statements.get(message.name)
            if prepared is None:
                raise UndefinedPreparedStatementError(
                    f'prepared statement "{message.name}" does not exist'
                )
            if prepared.described and prepared.columns is not None:
                self._refuse_when_failed(prepared.statement)  # as PostgreSQL: rows, no catalog
            await self._describe_statement(prepared)
            self.send(m.parameter_description(prepared.parameter_oids))
            if prepared.columns is None:
                self.send(m.no_data())
            else:
                names = [name for name, _ in prepared.columns]
                oids = [oid for _, oid in prepared.columns]
                self.send(described_row(names, oids, [0] * len(oids)))
            return
        if message.name not in self.portals:  # a DECLAREd cursor is a portal too
            description = wire_commands.describe_cursor(self.context, message.name)
            if description is not None:
                if description != m.no_data() and self._failed():
                    raise InFailedTransactionError(_IN_FAILED_TRANSACTION)
                self.send(description)
                return
        portal = self._portal(message.name)
        if portal.prepared.columns is not None or portal.result is not None:
            self._refuse_when_failed(portal.prepared.statement)
        described = portal.prepared.columns
        if portal.prepared.described and not portal.executed:  # no need to run it first
            if described is None:
                self.send(m.no_data())
                return
            self.send(described_portal_row(described, portal.result_formats))
            return
        if not await self._run_portal(portal):
            return
        result = portal.result
        table = None if result is None else result_rows(result)
        if table is None:
            self.send(m.no_data())
        elif portal.row_description is not None:
            self.send(portal.row_description)
        else:
            self.send(row_description(table, portal.oids, portal.formats))

    def text_description(self, statement: ast.Statement | None, table: pa.Table | Rows | None,
                         *, wire: bool | None = None) -> Description | None:  # fmt: skip
        """Worker thread: the engine's description of an executed ``statement`` if ``table``
        has text columns it may refine (UUID and JSON are Arrow strings too; the engine keeps
        descriptions while DuckDB's catalog does not move, so a repeated query pays for it
        once), else None; None too if it cannot be described (its rows go out as text).
        ``wire``: whether the statement is one the wire server runs itself, if known."""
        if table is None or statement is None or isinstance(table, Rows):
            return None  # ``Rows``' string columns are DuckDB's VARCHAR, never UUID or JSON
        if wire if wire is not None else wire_commands.is_wire_statement(statement):
            return None
        if not any(wire_types.type_oid(f.type) == wire_types.TEXT for f in table.schema):
            return None
        try:
            return self._describe_again(statement)
        except Exception:  # the statement ran; its rows go out as text then
            log.debug("describing an executed statement failed", exc_info=True)
            return None

    async def _describe_statement(self, prepared: Prepared) -> None:
        """Ask the engine, once per prepared statement, for its parameter and result wire_types."""
        if prepared.described:
            return
        statement = prepared.statement
        description = None
        if statement is not None and not prepared.wire:
            description = await self.call(self._describe, statement)
        apply_description(prepared, description)

    def _describe(self, statement: ast.Statement) -> Description:
        """The engine's description of what Execute runs for ``statement``: a catalog query
        is described as rewritten, SHOW as its one-column SELECT (``pg_catalog``). Runs on
        the connection's worker thread."""
        return self._session().describe(self.catalog.engine_statement(statement))

    def _describe_again(self, statement: ast.Statement) -> Description:
        """``_describe`` for the description of a statement that runs now (its revalidation)
        or has just run (``text_description``), kept per statement while the engine's
        catalog version stays where it was: the criterion of the engine's own memo
        (``engine.describe``), whose lookup still plans and checks the statement (~30-50 us
        a lookup; the run itself is planned and checked as ever). Only statements the
        surface hands to the engine unchanged are kept (a rewritten catalog query depends
        on the connection's settings too). Describe messages ask ``_describe``."""
        session = self._session()
        kept = self.kept_descriptions.get(id(statement))
        if kept is not None and kept[0] is statement:
            version = session.catalog_version()
            if version is not None and version == kept[1]:
                return kept[2]
        engine_statement = self.catalog.engine_statement(statement)
        description = session.describe(engine_statement)
        if engine_statement is statement:
            version = session.catalog_version()  # after: describing may move it
            if version is not None:
                # pins the statement: its text, and the description's columns
                columns = len(description.columns or ()) + len(description.parameter_types)
                text = getattr(statement, "text", "")
                cost = TEXT_COST_PER_CHAR * len(text if isinstance(text, str) else "") \
                    + SCHEMA_COLUMN_BYTES * columns  # fmt: skip
                self.kept_descriptions.put(id(statement), (statement, version, description),
                                           cost)  # fmt: skip
        return description

    def _send_kept_response(self, portal: Portal, max_rows: int) -> bool:
        """Send Execute's DataRow and CommandComplete of a kept literal row from
        ``_kept_response`` (True), or False: the caller sends them as for any result."""
        response = self._kept_response(portal, max_rows)
        if response is None:
            return False
        self.send(response)
        return True

    def _kept_response(self, portal: Portal, max_rows: int) -> bytes | None:
        """Execute's DataRow and CommandComplete of a kept literal row (``Result.kept``),
        from ``kept_responses``, the portal moved past its row; or None: nothing changed,
        the caller sends them as for any result. Only for the whole of a one-row result
        sent from its first row, with no held read to settle and no notice, and a
        RowDescription of a kept shape (``rows_shape``): then the bytes depend on the
        row's values and the shape alone, both the same objects for every run (the
        encoding of a value depends on no setting: ``DateStyle`` is ISO only,
        ``bytea_output`` hex only), so they are made once per row and shape. Bounded:
        ``KEPT_LITERAL_RESPONSES_MAX`` responses a connection of at most
        ``KEPT_LITERAL_RESPONSE_BYTES_MAX`` bytes each (a bigger one is made each time)."""
        result = portal.result
        if result is None or not result.kept or max_rows > 0 or portal.position:
            return None
        rows = result.rows
        shape = portal.row_description
        if (rows is None or shape is None or len(rows.rows) != 1 or self.held is not None
                or result.notices or not result.tag.startswith("SELECT ")):  # fmt: skip
            return None
        row = rows.rows[0]
        key = (id(row), id(shape))
        kept = self.kept_responses.get(key)
        if kept is None or kept[0] is not row or kept[1] is not shape:
            fields = wire_types.encode_value_rows(rows.rows, portal.oids, portal.formats)
            response = m.data_row(fields[0]) + m.command_complete("SELECT 1")
            if len(response) > KEPT_LITERAL_RESPONSE_BYTES_MAX:
                portal.position = 1
                return response
            if len(self.kept_responses) >= KEPT_LITERAL_RESPONSES_MAX:
                self.kept_responses.clear()
            kept = self.kept_responses[key] = (row, shape, response)
        portal.position = 1
        return kept[2]

    def _hold_rows(self, name: str, portal: Portal, table: pa.Table) -> None:
        """Count the rows a named portal keeps in the connection's holdings before any of
        them is sent (``HeldPortals.hold_rows``); refused (53200), the portal is dropped
        with its rows. The unnamed portal is not counted: one a connection, replaced by
        the next Bind, as any statement's result in flight."""
        try:
            self.portals.hold_rows(portal, table.nbytes)
        except MemoryBudgetExceededError:
            self.portals.pop(name)
            raise

    async def on_execute(self, message: m.Execute) -> None:
        portal = self._portal(message.portal)
        self._refuse_when_failed(portal.prepared.statement)
        if portal.prepared.copy:  # COPY (commands)
            if self.held is not None:  # another portal's read: it is not going on
                await self.settle_held()
            self.log_statement(portal.prepared.query)
            await wire_commands.execute_copy(self.context, portal.prepared.statement)
            return
        self._refuse_abandoned(portal)
        if not portal.executed and not await self._run_portal(portal):
            return
        if self._send_kept_response(portal, message.max_rows):
            return
        result = portal.result
        if result is None:
            self.send(m.empty_query_response())
            return
        if not portal.position:
            for notice in result.notices:
                self.send(m.notice_response(notice))
        table = result_rows(result)
        if table is None:
            held = await self.settle_held(portal)
            if held is not None:  # a consumer statement without rows (INSERT ... SELECT)
                await self.call(held.commit)
            if not portal.position:
                portal.position = 1
                self.send(m.command_complete(result.tag))
            else:
                self.send(m.command_complete(result.tag.split(" ")[0]))
            return
        if message.portal and not portal.rows_held and isinstance(table, pa.Table):
            self._hold_rows(message.portal, portal, table)
        remaining = table.num_rows - portal.position
        count = remaining if message.max_rows <= 0 else min(message.max_rows, remaining)
        rows = table if count == table.num_rows else table.slice(portal.position, count)
        portal.position += count
        held = None if self.held is None else await self.settle_held(portal)
        if held is not None and portal.position < table.num_rows:
            self.held = (portal, held)  # more Executes to come: held until the last one
            held = None
        try:
            if held is not None or not self.send_small_rows(rows, portal.oids, portal.formats):
                await self.send_rows(rows, portal.oids, portal.formats)
            if held is not None:  # every row is out: commit before CommandComplete
                await self.writer.drain()  # handed to the kernel (the commit blocks the loop)
                await self.call(held.commit)
                held = None
        finally:
            if held is not None:  # not all sent (a lost client, an error): nothing commits
                await self.call(held.rollback)
        # PostgreSQL suspends a portal whose Execute reached its row limit, even on the last
        # row (its executor stops without looking further): the next Execute then completes
        # with ``SELECT 0``. A held read is committed already when its last row went out.
        if portal.position < table.num_rows or 0 < message.max_rows == count:
            self.send(m.portal_suspended())
        elif result.tag.startswith("SELECT "):
            self.send(m.command_complete(f"SELECT {count}"))
        else:
            self.send(m.command_complete(result.tag))
