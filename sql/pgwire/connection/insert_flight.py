"""An autocommit ``INSERT INTO TOPIC ... VALUES`` flight answered in one function
(docs/durable_produce.md round 18).

psycopg executes a prepared statement as one flight: Bind (unnamed portal), Describe
(that portal), Execute (all rows), Sync. The message loop handles each message on its
own: a look at the reader's buffer, a parse, a coroutine, the portal's layers (its
revalidation, the held-read transaction, the text description, the result limit, the
shape of its rows), which for a statement that returns no rows do nothing but cost
~40 us a message at 16 producers. For a statement that is an ``INSERT INTO TOPIC ...
VALUES`` without RETURNING (``Prepared.insert``, worked out at Parse), ``answer`` takes
the flight at once when the reader holds all of it: it makes the Bind's portal as
``on_bind`` makes it, runs the statement with ``ConnectionCatalog.execute`` as the
portal's run does (the surface's ``statement_timeout``, the session's planning and its
door on every call, its autocommit write and the group commit: nothing is acknowledged
before its sync), and writes BindComplete, NoData, the notices,
CommandComplete and ReadyForQuery as one piece.

Invariant: the bytes sent and the connection's state after ``answer`` returned True are
those the message loop's own handling of the four messages gives, errors included (an
error of the statement is sent after BindComplete, and NoData when the statement was
described before, then ReadyForQuery, as the loop's skipping to Sync does; the error's
position is reported without the query text, as the loop reports errors of Describe
and Execute). ``answer`` returns False, having taken nothing off the reader and sent
nothing, whenever that is not certain before anything runs: another flight, a named
portal, a failed or open transaction, a held read, a Bind the general path would refuse
or decode otherwise (untyped array or integer-cast texts), a portal the memory budget
refuses. Unlike a lookup's flight nothing runs twice: the statement runs only once the
flight was taken.
"""

from __future__ import annotations

from engine.api import SessionState
from sql.pgwire.codec import messages as m
from sql.pgwire.connection.extended import ExtendedProtocol, result_rows
from sql.pgwire.connection.lookup_flight import bound_portal, flight_session, hold_and_take
from sql.pgwire.connection.portals import Prepared

_BIND_COMPLETE = m.bind_complete()
_NO_DATA = m.no_data()


def takes(prepared: Prepared) -> bool:
    """A statement whose flight ``answer`` takes: an INSERT INTO TOPIC of literal rows
    (``Prepared.insert``: no query, no RETURNING), so it returns no rows and holds no
    consumer read."""
    return prepared.insert and prepared.statement is not None


def answer(connection: ExtendedProtocol, body: bytes) -> bool:
    """Answer the flight whose Bind's body is ``body`` (already taken off the reader) if
    the reader holds the rest of it and its statement is one ``takes`` takes; False:
    nothing taken or sent, the caller handles the Bind and what follows as ever."""
    session = flight_session(connection)
    if session is None:
        return False
    try:
        portal = bound_portal(connection, body, takes)
    except Exception:  # a parameter that does not decode: ``on_bind`` reports it
        return False
    if portal is None:
        return False
    if not hold_and_take(connection, portal, len(body)):
        return False
    # The flight is taken: from here on it is answered here, whatever the statement does.
    prepared = portal.prepared
    statement = prepared.statement
    assert statement is not None and prepared.columns is None  # no rows: nothing to shape
    # Describe: a described statement's NoData goes before it runs, else after.
    early = [_BIND_COMPLETE, _NO_DATA] if prepared.described else [_BIND_COMPLETE]
    portal.executed = True
    # From the take on, whatever fails is answered here and the Sync below still runs:
    # the loop would skip to a Sync this flight already consumed (review R3-18 F1).
    try:
        connection.log_statement(prepared.query)
        parameters = portal.parameters or None
        result = connection.catalog.append_prepared(session, statement, parameters)
        if result is None:  # not by the kept way: nothing ran
            result = connection.catalog.execute(session, statement, parameters)
        assert result_rows(result) is None, "an INSERT without RETURNING returns no rows"
        portal.result = result
        portal.position = 1
        pieces = early if prepared.described else [*early, _NO_DATA]
        pieces += [m.notice_response(notice) for notice in result.notices]
        pieces.append(m.command_complete(result.tag))
        reply = b"".join(pieces)
    except ConnectionError:
        raise  # a lost client ends the connection, as in the loop
    except Exception as error:  # the loop's handling of a failing Describe or Execute
        connection.send(b"".join(early))
        connection.send_error(error)
        connection.writer.flush()  # out now, as the loop sends every error
    else:
        connection.send(reply)
    # Sync
    connection.skipping = False
    if session.state is SessionState.IDLE:
        connection.portals.clear()
    connection.send(connection.ready_for_query())
    return True
