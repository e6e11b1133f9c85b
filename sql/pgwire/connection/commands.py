"""Statements the wire server runs itself: COPY, DECLARE, FETCH, MOVE and CLOSE.

They are protocol matters (COPY streams, cursors are portals), so they never reach the
grammar or the planner: a Query message that holds one of them is split here into
statements, and each runs either here or as an ordinary engine statement, in order,
with PostgreSQL's rule that the first error ends the message. In the extended
protocol, Parse keeps such a statement as a stand-in ``SqlStatement`` and Execute runs
it here: cursors give a result like any portal; a COPY exchange happens within the
Execute (Describe of it is NoData), as pg8000 uses it.

Any error of a statement run here fails an open transaction (25P02 until ROLLBACK),
as in PostgreSQL. Runs on the connection's event-loop task; engine calls go to the
connection's worker thread.
"""

from __future__ import annotations

import asyncio
import re
from typing import TYPE_CHECKING, Any

from engine.api import Result, SessionState, ast, parse, split_statements
from sql.pgwire.codec import messages as m
from sql.pgwire.codec import wire_types
from sql.pgwire.codec.copy_format import error_context
from sql.pgwire.connection import copy_exchange, copy_statement, cursors, result_stream, spill
from sql.pgwire.emulation import surface
from storage.errors import (
    InFailedTransactionError,
    SqlSyntaxError,
    TopicbaseError,
)

if TYPE_CHECKING:
    from sql.pgwire.server import Connection

_WIRE_WORDS = ("COPY", "DECLARE", "FETCH", "MOVE", "CLOSE")
_MAYBE_WIRE = re.compile(r"\b(?:COPY|DECLARE|FETCH|MOVE|CLOSE)\b", re.IGNORECASE)
_FIRST_WORD = re.compile(r"[A-Za-z]+")


def is_wire_text(text: str) -> bool:
    """True if the single statement ``text`` (no leading comments) is one of ours."""
    word = _FIRST_WORD.match(text)
    return word is not None and word.group().upper() in _WIRE_WORDS


def handles(query: str) -> bool:
    """True if a Query message holds a statement that runs here (cheap test first)."""
    if _MAYBE_WIRE.search(query) is None:
        return False
    try:
        return any(is_wire_text(text) for text, _ in split_statements(query))
    except TopicbaseError:
        return False  # the normal path reports the syntax error


def prepared_statements(query: str) -> tuple[ast.Statement, ...] | None:
    """For Parse: a stand-in statement if ``query`` is one of ours, else None."""
    try:
        pieces = split_statements(query) if _MAYBE_WIRE.search(query) else []
    except TopicbaseError:
        return None
    if len(pieces) != 1 or not is_wire_text(pieces[0][0]):
        return None
    text, position = pieces[0]
    return (ast.SqlStatement(sql=text, topic_scans=(), position=position, text=text),)


def is_wire_statement(statement: ast.Statement | None) -> bool:
    return isinstance(statement, ast.SqlStatement) and is_wire_text(statement.text)


def cursor_set(connection: Connection) -> cursors.CursorSet:
    existing = getattr(connection, "sql_cursors", None)
    if existing is None:
        existing = cursors.CursorSet()
        connection.sql_cursors = existing  # type: ignore[attr-defined]
    return existing


async def execute(connection: Connection, statement: ast.Statement,
                  parameters: Any = None) -> Result:  # fmt: skip
    """Run an ordinary statement as the server runs it (through the connection's
    catalog layer: SET/SHOW, pg_catalog rewrites), on the connection's worker thread."""
    session = connection._session()
    return await connection.call(connection.catalog.execute, session, statement, parameters)


# -- simple query -------------------------------------------------------------------------------
async def simple_query(connection: Connection, query: str) -> None:
    """A Query message with at least one of our statements; ends with ReadyForQuery."""
    connection.skipping = False
    session = connection._session()
    pieces = split_statements(query)
    if not pieces:
        connection.send(m.empty_query_response())
    for text, _ in pieces:
        try:
            if is_wire_text(text):
                await _run_simple(connection, text)
            else:
                for statement in parse(surface.plain_begin(text)):
                    await connection.send_result(await execute(connection, statement))
        except (asyncio.IncompleteReadError, ConnectionError, m.ProtocolError):
            raise  # the connection is gone or out of step: the server closes it
        except Exception as error:
            session.fail_transaction()
            _send_error(connection, error, text)
            break
        finally:
            cursor_set(connection).prune(session)
    connection.send(connection.ready_for_query())


def _send_error(connection: Connection, error: BaseException, text: str) -> None:
    context = error_context(error) if isinstance(error, TopicbaseError) else None
    if context is not None and isinstance(error, TopicbaseError):
        connection.send(m.error_response_with_context(error.sqlstate, error.message, context))
    else:
        connection.send_error(error, text)


async def _run_simple(connection: Connection, text: str) -> None:
    _refuse_in_failed_transaction(connection)
    if text[:4].upper() == "COPY":
        await _run_copy(connection, text)
        return
    result = await run_cursor_command(connection, text, None)
    await connection.send_result(result)


async def _run_copy(connection: Connection, text: str) -> None:
    statement = copy_statement.parse_copy(text)
    if statement.to_client:
        await copy_exchange.copy_to_client(connection, statement)
    else:
        await copy_exchange.copy_from_client(connection, statement)


def is_copy_statement(statement: ast.Statement | None) -> bool:
    return isinstance(statement, ast.SqlStatement) and statement.text[:4].upper() == "COPY" \
        and is_wire_text(statement.text)


async def execute_copy(connection: Connection, statement: ast.Statement | None) -> None:
    """Execute of a Parse'd COPY (pg8000 sends COPY so): the whole exchange happens here;
    Flush and Sync that arrive during COPY IN are ignored, as PostgreSQL does."""
    assert isinstance(statement, ast.SqlStatement)
    try:
        _refuse_in_failed_transaction(connection)
        await _run_copy(connection, statement.text)
    except Exception:
        connection._session().fail_transaction()
        raise


def _refuse_in_failed_transaction(connection: Connection) -> None:
    if connection._session().state is SessionState.FAILED:
        raise InFailedTransactionError(
            "current transaction is aborted, commands ignored until end of transaction block"
        )


# -- cursors (both protocols) -----------------------------------------------------------------
async def run_cursor_command(connection: Connection, text: str, parameters: Any) -> Result:
    """Run DECLARE, FETCH, MOVE or CLOSE; the result to send (rows for FETCH)."""
    session = connection._session()
    command = cursors.parse_cursor_command(text)
    cursor_set_ = cursor_set(connection)
    cursor_set_.prune(session)
    if isinstance(command, cursors.Declare):
        cursor_set_.check_declare(session, command)
        query = _parse_query(command.query)
        return await connection.call(_declare, connection, cursor_set_, command, query,
                                     parameters)  # fmt: skip
    if isinstance(command, cursors.Close):
        return await connection.call(cursor_set_.close, session, command)
    return await connection.call(cursor_set_.fetch, session, command)


def _declare(connection: Connection, cursor_set_: cursors.CursorSet, command: cursors.Declare,
             query: ast.Statement, parameters: Any) -> Result:  # fmt: skip
    """Run the query of a DECLARE and keep its rows (worker thread): read in batches, each
    within the result limit, and spilled to a file once large (``spill``)."""
    stream = result_stream.open_stream(
        connection, query, parameters,
        SqlSyntaxError("DECLARE CURSOR needs a query that returns rows"))  # fmt: skip
    rows = spill.collect(stream)
    return cursor_set_.declare(connection._session(), command, rows)


def _parse_query(query: str) -> ast.Statement:
    statements = parse(query)
    if len(statements) != 1:
        raise SqlSyntaxError("DECLARE CURSOR takes exactly one query")
    return statements[0]


async def run_in_portal(connection: Connection, statement: ast.Statement,
                        parameters: Any) -> Result:  # fmt: skip
    """Execute of a Parse'd statement of ours (extended protocol)."""
    assert isinstance(statement, ast.SqlStatement)
    try:
        _refuse_in_failed_transaction(connection)
        if statement.text[:4].upper() == "COPY":
            return Result("COPY")  # Describe of a COPY portal: NoData; Execute runs it
        return await run_cursor_command(connection, statement.text, parameters)
    except Exception:
        connection._session().fail_transaction()
        raise


def describe_cursor(connection: Connection, name: str) -> bytes | None:
    """RowDescription of the SQL cursor ``name`` (Describe portal), or None if none."""
    if connection.session is None:
        return None
    cursor = cursor_set(connection).find(name, connection.session)
    if cursor is None:
        return None
    table = cursor.table
    fmt = 1 if cursor.binary else 0
    return m.row_description([
        m.Column(field.name, oid, wire_types.type_size(oid), -1, fmt)
        for field, oid in ((f, wire_types.type_oid(f.type)) for f in table.schema)
    ])

