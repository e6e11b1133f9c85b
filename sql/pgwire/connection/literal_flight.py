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

from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from engine.api import Result, Session
from sql.pgwire.codec import messages as m
from sql.pgwire.connection.extended import ExtendedProtocol
from sql.pgwire.connection.lookup_flight import end_flight, flight_response, unlogged_flight_session
from sql.pgwire.connection.portals import Portal, Prepared, row_description
from storage.limits import KEPT_LITERAL_FLIGHT_BYTES_MAX

_BIND_COMPLETE = m.bind_complete()


@dataclass(frozen=True, slots=True)
class KeptFlight:
    """The last kept literal flight a connection answered (``_run``): its Bind's body, the
    statement's name and object, the Bind's result formats, the kept row and the schema of
    the rows it answered with, and the reply made of them (BindComplete to
    CommandComplete). The reply is a function of the row's values, the schema and the
    formats alone (``_kept_response``, ``rows_shape``): a later flight of the same Bind
    whose answer has the same row and schema objects gets the same bytes."""

    body: bytes
    name: str
    prepared: Prepared
    result_formats: list[int]
    row: tuple[Any, ...]
    schema: pa.Schema
    reply: bytes


def takes(prepared: Prepared) -> bool:
    """A statement whose flight ``answer`` takes: one the message loop answered from a
    kept literal row (``Prepared.literal``), without parameters, run by the engine, and
    not described (a described statement's DataRow is encoded by its description, not
    kept: ``_kept_response``)."""
    return prepared.literal and not prepared.parameter_oids and not prepared.described \
        and not prepared.wire and not prepared.copy and prepared.lookup is False  # fmt: skip


def answer_kept(connection: ExtendedProtocol, body: bytes) -> bool:
    """``answer`` for a flight whose Bind is the connection's kept flight's
    (``KeptFlight``), without working out again what its reply is made of: the same
    steps where they may give something else (the flight's and the session's state, the
    statement still the one of that name and one ``takes`` takes, ``answer_literal``
    with the door's checks, the result limit, the portal's hold), then the kept reply if
    the answer's row and schema are the kept ones. False, nothing taken or sent, for
    anything else (then the message loop's order of flights goes on: ``answer`` works it
    out again). Asked first for every Bind a flight may answer: a Bind of another is one
    comparison of bytes."""
    kept = connection.kept_literal_flight
    if kept is None or kept.body != body:
        return False
    session = unlogged_flight_session(connection)
    if session is None:
        return False
    prepared = kept.prepared
    if connection.statements.get(kept.name) is not prepared or not takes(prepared):
        return False  # closed, or its name prepared again; refused or described since
    portal = Portal(prepared, [], kept.result_formats)
    try:
        result = _answered(connection, session, prepared)
    except Exception:  # the general path meets it again and reports it
        return False
    rows = None if result is None else result.rows
    if rows is None or rows.schema is not kept.schema or len(rows.rows) != 1 \
            or rows.rows[0] is not kept.row:  # fmt: skip
        return False
    portal.executed = True
    portal.result = result
    portal.position = 1  # as ``_kept_response`` leaves it
    return end_flight(connection, session, portal, len(body), kept.reply)


def answer(connection: ExtendedProtocol, body: bytes) -> bool:
    """Answer the flight whose Bind's body is ``body`` (already taken off the reader) if
    the reader holds the rest of it and it is a kept literal's; False: nothing taken or
    sent, the caller handles the Bind and what follows as ever. The flight answered is
    kept (``KeptFlight``) for ``answer_kept``."""
    found = flight_response(connection, body, takes,
                            lambda session, portal: _run(connection, session, portal))  # fmt: skip
    if found is None:
        return False
    session, portal, response = found
    if not end_flight(connection, session, portal, len(body), response):
        return False
    result = portal.result
    assert result is not None and result.rows is not None  # ``_run`` answered it
    if len(body) + len(response) <= KEPT_LITERAL_FLIGHT_BYTES_MAX:
        name = body[1 : body.index(b"\0", 1)].decode("utf-8")  # as ``bound_portal`` read it
        connection.kept_literal_flight = KeptFlight(
            body, name, portal.prepared, portal.result_formats, result.rows.rows[0],
            result.rows.schema, response)  # fmt: skip
    return True


def _answered(connection: ExtendedProtocol, session: Session, prepared: Prepared
              ) -> Result | None:  # fmt: skip
    """What the portal's run asks of the engine for a kept literal (``_execute_prepared``:
    ``answer_literal``, the door's checks on every call), within the result limit; None if
    the engine does not answer it so (then ``prepared.literal`` is cleared: the message
    loop's next answer sets it again if kept again) or the result is over the limit."""
    statement = prepared.statement
    assert statement is not None and not prepared.described  # ``takes``
    result = connection.catalog.answer_literal(session, statement)
    if result is None:
        prepared.literal = False
        return None
    if result.rows is None or result.notices or not connection.result_within_limit(result):
        return None
    return result


def _run(connection: ExtendedProtocol, session: Session, portal: Portal) -> bytes | None:
    """BindComplete to CommandComplete of the flight of ``portal``, or None (nothing sent)."""
    result = _answered(connection, session, portal.prepared)
    if result is None:
        return None
    rows = result.rows
    assert rows is not None
    portal.executed = True
    portal.result = result
    connection._shape_portal(portal, None)
    early = portal.row_description or row_description(rows, portal.oids, portal.formats)
    kept = connection._kept_response(portal, 0)
    if kept is None:
        return None
    return b"".join((_BIND_COMPLETE, early, kept))
