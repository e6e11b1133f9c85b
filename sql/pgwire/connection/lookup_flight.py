"""A kept lookup's whole flight answered in one function (docs/statement_cost.md round 12).

psycopg executes a named prepared statement as one flight: Bind (unnamed portal),
Describe (that portal), Execute (all rows), Sync. The message loop handles each message
on its own (a look at the reader's buffer, a parse, a coroutine, the portal's checks and
layers). For a statement whose text is of the lookup shape and that ran before
(``Prepared.lookup``), ``answer`` takes the flight at once when the reader holds all of
it: it parses the Bind, runs what the Bind, Describe and Execute would run for it, in
their order and with the same functions (the Bind's checks and decoding, the portal's
revalidation, ``ConnectionCatalog.answer_lookup`` with every check of the door on every
call, the portal's shape), and writes BindComplete, RowDescription, the DataRows,
CommandComplete and ReadyForQuery as one piece.

Invariant: the bytes sent and the connection's state after ``answer`` returned True are
those the message loop's own handling of the four messages gives. ``answer`` returns
False, having taken nothing off the reader and sent nothing, whenever that is not
certain before anything is sent: another flight, a named portal, a failed or open
transaction, a held read, statement logging, a Bind the general path would refuse or
decode otherwise (untyped array or integer-cast texts), an error of any step, an answer
the engine would not give from its kept lookup (``answer_lookup`` None: e.g. under a
``statement_timeout``), a result that is not a few ``Rows`` within the result limit, a
kept literal answer or one with notices. The message loop then handles the flight as
ever; what ran here is a read, run again there (its checks too).
"""

from __future__ import annotations

import struct
from collections.abc import Callable

from engine.api import Session, SessionState
from sql.pgwire.codec import messages as m
from sql.pgwire.codec import wire_types
from sql.pgwire.connection.extended import (
    ExtendedProtocol,
    described_portal_row,
    untyped_parameters,
)
from sql.pgwire.connection.output import INLINE_VALUES
from sql.pgwire.connection.portals import Portal, Prepared, row_description

# Describe(portal ""), Execute("", all rows), Sync: what follows a lookup flight's Bind.
FLIGHT_TAIL = m.message(b"D", b"P\x00") + m.message(b"E", b"\x00" + bytes(4)) \
    + m.message(b"S", b"")  # fmt: skip
_UINT16 = struct.Struct("!H")
_INT32 = struct.Struct("!i")


def answer(connection: ExtendedProtocol, body: bytes) -> bool:
    """Answer the flight whose Bind's body is ``body`` (already taken off the reader) if
    the reader holds the rest of it and it is a kept lookup's; False: nothing taken or
    sent, the caller handles the Bind and what follows as ever."""
    found = flight_response(connection, body, _kept_lookup,
                            lambda _session, portal: _run(connection, portal))  # fmt: skip
    if found is None:
        return False
    session, portal, response = found
    return end_flight(connection, session, portal, len(body), response)


def flight_response(connection: ExtendedProtocol, body: bytes, takes: Callable[[Prepared], bool],
                    run: Callable[[Session, Portal], bytes | None]
                    ) -> tuple[Session, Portal, bytes] | None:  # fmt: skip
    """What every flight does before its end: an unlogged flight session, the Bind's
    portal of a statement ``takes`` accepts (``bound_portal``) and ``run``'s reply for it.
    None where any is missing or raises: nothing is taken or sent, and the general path
    meets the same Bind again and reports what it finds."""
    session = unlogged_flight_session(connection)
    if session is None:
        return None
    try:
        portal = bound_portal(connection, body, takes)
        if portal is None:
            return None
        response = run(session, portal)
    except Exception:  # the general path meets it again and reports it
        return None
    if response is None:
        return None
    return session, portal, response


def unlogged_flight_session(connection: ExtendedProtocol) -> Session | None:
    """``flight_session`` where statements are not logged (``log_statement`` none): a
    logged statement is logged as its portal runs, which the general path does."""
    session = flight_session(connection)
    if session is None or connection.catalog.settings.values["log_statement"] != "none":
        return None
    return session


def end_flight(connection: ExtendedProtocol, session: Session, portal: Portal,
               bind_bytes: int, reply: bytes) -> bool:  # fmt: skip
    """The end of a flight answered from ``reply`` (BindComplete to CommandComplete), as
    the Bind's hold, the Describe and Execute's replies and the Sync end it: the portal
    held, the flight taken, the unnamed portal cleared when idle, ``reply`` and
    ReadyForQuery sent as one piece. False, nothing taken or sent, if the memory budget
    refuses the portal's hold (53200: the Bind's own hold refuses it the same way)."""
    if not hold_and_take(connection, portal, bind_bytes):
        return False
    if session.state is SessionState.IDLE:  # Sync's step
        connection.portals.clear()
    connection.send(reply + connection.ready_for_query())
    return True


def hold_and_take(connection: ExtendedProtocol, portal: Portal, bind_bytes: int) -> bool:
    """The Bind's hold of ``portal`` (its ``bind_bytes``), then the flight taken off the
    reader (``take_flight``): from then on the flight is answered by its function. False,
    nothing taken, if the memory budget refuses the hold (53200: the Bind's own hold
    refuses it the same way, on the general path)."""
    try:
        connection.portals.hold("", portal, bind_bytes)
    except Exception:
        return False
    take_flight(connection)
    return True


def flight_session(connection: ExtendedProtocol) -> Session | None:
    """The idle session whose flight the reader holds whole (Describe/Execute/Sync after
    the Bind), or None: not a flight one function may answer (another shape, the loop
    skipping to a Sync, a held read, no session, a transaction block)."""
    buffer = connection.reader._buffer  # no public way to look at what is buffered
    if not buffer.startswith(FLIGHT_TAIL) or connection.skipping or connection.held is not None:
        return None
    session = connection.session
    if session is None or session.state is not SessionState.IDLE:
        return None
    return session


def take_flight(connection: ExtendedProtocol) -> None:
    """Take the flight's Describe/Execute/Sync off the reader (``flight_session`` saw
    them there), resuming a paused transport as ``readexactly`` does."""
    reader = connection.reader
    del reader._buffer[: len(FLIGHT_TAIL)]
    if reader._paused:
        reader._maybe_resume_transport()


def _kept_lookup(prepared: Prepared) -> bool:
    """A statement whose flight ``answer`` takes: a kept lookup's that runs in the engine."""
    return prepared.lookup is True and not prepared.wire and not prepared.copy \
        and prepared.statement is not None and not prepared.too_wide_for_flight  # fmt: skip


def bound_portal(connection: ExtendedProtocol, body: bytes,
                 wanted: Callable[[Prepared], bool]) -> Portal | None:  # fmt: skip
    """The portal the Bind of ``body`` makes, or None where ``on_bind`` would do anything
    else (refuse it, or keep texts to decode again at Execute) or the Bind is not of the
    unnamed portal and of a statement ``wanted`` takes. Its fields are read here as
    ``messages.parse_bind`` reads them; anything it would read otherwise or refuse (a
    length past the end, a bad name) gives None: ``parse_bind`` meets it then. Raises
    what decoding a parameter raises (the caller leaves the Bind to ``on_bind``)."""
    if body[:1] != b"\0":  # a named portal
        return None
    at = body.find(b"\0", 1)
    if at < 0:
        return None
    try:
        prepared = connection.statements.get(body[1:at].decode("utf-8"))
    except UnicodeDecodeError:
        return None
    if prepared is None or not wanted(prepared):
        return None
    fields = _bind_fields(body, at + 1)
    if fields is None:
        return None
    formats, parameters, results = fields
    count = len(parameters)
    if count != len(prepared.parameter_oids):
        return None
    if len(formats) <= 1:
        formats = (formats or [0]) * count
    elif len(formats) != count:
        return None
    values = wire_types.decode_parameters(parameters, prepared.parameter_oids, formats)
    if not prepared.described and values and untyped_parameters(
            parameters, prepared.parameter_oids, formats):  # fmt: skip
        return None
    return Portal(prepared, values, results)


def _bind_fields(body: bytes, at: int
                 ) -> tuple[list[int], list[bytes | None], list[int]] | None:  # fmt: skip
    """A Bind's parameter formats, values and result formats from ``at`` (after its
    names), as ``parse_bind`` reads them (trailing bytes ignored, as there), or None where
    a field would run past the end."""
    end = len(body)
    formats: list[int] = []
    results: list[int] = []
    for into in (formats, None, results):
        if at + 2 > end:
            return None
        (count,) = _UINT16.unpack_from(body, at)
        at += 2
        if into is not None:  # Int16 formats
            if at + 2 * count > end:
                return None
            into.extend(struct.unpack_from(f"!{count}h", body, at))
            at += 2 * count
            continue
        values: list[bytes | None] = []
        append, unpack = values.append, _INT32.unpack_from  # 1000 parameters a Bind: locals
        for _ in range(count):
            if at + 4 > end:
                return None
            (length,) = unpack(body, at)
            at += 4
            if length >= 0:
                if at + length > end:
                    return None
                append(body[at : at + length])
                at += length
            elif length == -1:
                append(None)
            else:
                return None
    return formats, values, results


def _run(connection: ExtendedProtocol, portal: Portal) -> bytes | None:
    """BindComplete to CommandComplete of the flight of ``portal``, or None (nothing sent)."""
    prepared = portal.prepared
    described = prepared.columns
    early = None  # a described statement's Describe answers before it runs
    if prepared.described:
        if described is None:
            return None
        early = described_portal_row(described, portal.result_formats)
    connection._revalidate(prepared)
    result = connection.catalog.answer_lookup(connection._session(), prepared.statement,
                                              portal.parameters or None)  # fmt: skip
    if result is None or result.kept or result.notices:
        return None
    rows = result.rows
    if rows is None or not connection.result_within_limit(result):
        return None
    count = len(rows.rows)
    if count * max(rows.num_columns, 1) > INLINE_VALUES:
        if rows.num_columns > INLINE_VALUES:  # even one row is: never again for this one
            prepared.too_wide_for_flight = True
        return None
    portal.executed = True
    portal.result = result
    connection._shape_portal(portal, None)
    if early is None:
        early = portal.row_description or row_description(rows, portal.oids, portal.formats)
    fields = wire_types.encode_value_rows(rows.rows, portal.oids, portal.formats)
    portal.position = count
    tag = f"SELECT {count}" if result.tag.startswith("SELECT ") else result.tag
    return b"".join([m.bind_complete(), early, *map(m.data_row, fields),
                     m.command_complete(tag)])  # fmt: skip
