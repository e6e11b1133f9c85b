"""A kept literal SELECT's whole flight answered in one function (docs/statement_cost.md
round 19).

psycopg executes ``SELECT 1`` prepared from its 6th run on, as one flight: Bind (unnamed
portal, no parameters), Describe (that portal), Execute (all rows), Sync. The message
loop handles each message on its own (a look at the reader's buffer, a parse, a
coroutine, the portal's layers), ~20 us of interpreted Python a flight around an answer
the engine gives from its kept row (``Session.answer_literal``) and bytes the connection
keeps (``ExtendedProtocol._kept_response``). For a prepared statement the message loop
answered that way before (``Prepared.literal``), ``answer`` takes the flight at once when
the reader holds all of it: it makes the Bind's portal as ``on_bind`` makes it, runs what
the Describe and Execute would run for it, in their order and with the same functions
(``ConnectionCatalog.answer_literal`` with the door's checks on every call, the result
limit, the portal's shape, the kept response),
and writes BindComplete, RowDescription, DataRow, CommandComplete and ReadyForQuery as one
piece.

Invariant: the bytes sent and the connection's state after ``answer`` returned True are
those the message loop's own handling of the four messages gives. ``answer`` returns
False, having taken nothing off the reader and sent nothing, whenever that is not
certain before anything is sent: another flight, a named portal, parameters, a described
statement, a failed or open transaction, a held read, statement logging, any exception of
any step, an answer the engine would not give from its kept row (``answer_literal`` None:
a refusal by the door, a ``statement_timeout``, a row not kept), a result over the result
limit, a response not kept (``_kept_response`` None: notices, more than one row), a
portal hold the memory budget refuses. The message loop then handles the flight as ever;
what ran here is a read (the door's checks, the kept row's copy), run again there with
all its checks: a fallback costs a second answer, never a skipped check.
"""

from __future__ import annotations

from engine.api import SessionState
from sql.pgwire.codec import messages as m
from sql.pgwire.connection.extended import ExtendedProtocol
from sql.pgwire.connection.lookup_flight import bound_portal, flight_session, take_flight
from sql.pgwire.connection.portals import Portal, Prepared, row_description

_BIND_COMPLETE = m.bind_complete()


def takes(prepared: Prepared) -> bool:
    """A statement whose flight ``answer`` takes: one the message loop answered from a
    kept literal row (``Prepared.literal``), without parameters, run by the engine, and
    not described (a described statement's DataRow is encoded by its description, not
    kept: ``_kept_response``)."""
    return prepared.literal and not prepared.parameter_oids and not prepared.described \
        and not prepared.wire and not prepared.copy and prepared.lookup is False  # fmt: skip


def answer(connection: ExtendedProtocol, body: bytes) -> bool:
    """Answer the flight whose Bind's body is ``body`` (already taken off the reader) if
    the reader holds the rest of it and it is a kept literal's; False: nothing taken or
    sent, the caller handles the Bind and what follows as ever."""
    session = flight_session(connection)
    if session is None:
        return False
    if connection.catalog.settings.values["log_statement"] != "none":
        return False  # logged as a portal runs: left to the general path
    try:
        portal = bound_portal(connection, body, takes)
        if portal is None:
            return False
        response = _run(connection, portal)
    except Exception:  # the general path meets it again and reports it
        return False
    if response is None:
        return False
    try:
        connection.portals.hold("", portal, len(body))
    except Exception:  # 53200: the Bind's own hold refuses it the same way
        return False
    take_flight(connection)
    if session.state is SessionState.IDLE:  # Sync's step
        connection.portals.clear()
    connection.send(response + connection.ready_for_query())
    return True


def _run(connection: ExtendedProtocol, portal: Portal) -> bytes | None:
    """BindComplete to CommandComplete of the flight of ``portal``, or None (nothing sent)."""
    prepared = portal.prepared
    statement = prepared.statement
    assert statement is not None and not prepared.described  # ``takes``
    result = connection.catalog.answer_literal(connection._session(), statement)
    if result is None:
        prepared.literal = False  # the message loop's answer sets it again, if kept again
        return None
    rows = result.rows
    if rows is None or not connection.result_within_limit(result):
        return None
    portal.executed = True
    portal.result = result
    connection._shape_portal(portal, None)
    early = portal.row_description or row_description(rows, portal.oids, portal.formats)
    kept = connection._kept_response(portal, 0)
    if kept is None:
        return None
    return b"".join((_BIND_COMPLETE, early, kept))
