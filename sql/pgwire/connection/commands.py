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
from typing import Any

import pyarrow as pa

from engine.api import Result, SessionState, ast, parse, split_statements, text_cache
from sql.pgwire.codec import messages as m
from sql.pgwire.codec import wire_types
from sql.pgwire.connection import copy_exchange, copy_statement, cursors, result_stream, spill
from sql.pgwire.connection.context import CommandContext
from sql.pgwire.emulation import surface
from sql.pgwire.spill_budget import SpillCharge
from storage.errors import (
    InFailedTransactionError,
    SqlSyntaxError,
    TopicbaseError,
)

_WIRE_WORDS = ("COPY", "DECLARE", "FETCH", "MOVE", "CLOSE")
_MAYBE_WIRE = re.compile(r"\b(?:COPY|DECLARE|FETCH|MOVE|CLOSE)\b", re.IGNORECASE)
_FIRST_WORD = re.compile(r"[A-Za-z]+")


# A Query message's statements kept by text: ``handles`` and ``simple_query`` split the
# same message, and a reader's loop sends the same COPY again and again. (Parse needs no
# such cache here: ``extended._prepare_text`` keeps its whole answer by text.)
SPLIT_CACHE_ENTRIES = 64


@text_cache(SPLIT_CACHE_ENTRIES)
def _pieces(query: str) -> tuple[tuple[str, ast.SourcePosition], ...]:
    """``split_statements(query)`` as a tuple (shared by the cache: never changed)."""
    return tuple(split_statements(query))


def is_wire_text(text: str) -> bool:
    """True if the single statement ``text`` (no leading comments) is one of ours."""
    word = _FIRST_WORD.match(text)
    return word is not None and word.group().upper() in _WIRE_WORDS


def handles(query: str) -> bool:
    """True if a Query message holds a statement that runs here (cheap test first)."""
    if _MAYBE_WIRE.search(query) is None:
        return False
    try:
        return any(is_wire_text(text) for text, _ in _pieces(query))
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



async def execute(context: CommandContext, statement: ast.Statement,
                  parameters: Any = None) -> Result:  # fmt: skip
    """Run an ordinary statement as the server runs it (through the connection's
    catalog layer: SET/SHOW, pg_catalog rewrites), on the connection's worker thread."""
    session = context.session
    return await context.call(context.catalog.execute, session, statement, parameters)


# -- simple query -------------------------------------------------------------------------------
async def simple_query(context: CommandContext, query: str) -> None:
    """A Query message with at least one of our statements; ends with ReadyForQuery."""
    session = context.session
    pieces = _pieces(query)
    if not pieces:
        context.send(m.empty_query_response())
    for text, _ in pieces:
        try:
            if is_wire_text(text):
                await _run_simple(context, text)
            else:
                for statement in parse(surface.plain_begin(text)):
                    await context.send_result(await execute(context, statement))
        except (asyncio.IncompleteReadError, ConnectionError, m.ProtocolError):
            raise  # the connection is gone or out of step: the server closes it
        except Exception as error:
            session.fail_transaction()
            context.send_error(error, text)
            break
        finally:
            context.cursors.prune(session)
    context.send(context.ready_for_query())


async def _run_simple(context: CommandContext, text: str) -> None:
    _refuse_in_failed_transaction(context)
    if text[:4].upper() == "COPY":
        await _run_copy(context, text)
        return
    result = await run_cursor_command(context, text, None)
    await context.send_result(result)


async def _run_copy(context: CommandContext, text: str) -> None:
    statement = copy_statement.parse_copy(text)
    if statement.to_client:
        await copy_exchange.copy_to_client(context, statement)
    else:
        await copy_exchange.copy_from_client(context, statement)


def is_copy_statement(statement: ast.Statement | None) -> bool:
    return isinstance(statement, ast.SqlStatement) and statement.text[:4].upper() == "COPY" \
        and is_wire_text(statement.text)


async def execute_copy(context: CommandContext, statement: ast.Statement | None) -> None:
    """Execute of a Parse'd COPY (pg8000 sends COPY so): the whole exchange happens here;
    Flush and Sync that arrive during COPY IN are ignored, as PostgreSQL does."""
    assert isinstance(statement, ast.SqlStatement)
    try:
        _refuse_in_failed_transaction(context)
        await _run_copy(context, statement.text)
    except Exception:
        context.session.fail_transaction()
        raise


def _refuse_in_failed_transaction(context: CommandContext) -> None:
    if context.session.state is SessionState.FAILED:
        raise InFailedTransactionError(
            "current transaction is aborted, commands ignored until end of transaction block"
        )


# -- cursors (both protocols) -----------------------------------------------------------------
async def run_cursor_command(context: CommandContext, text: str, parameters: Any) -> Result:
    """Run DECLARE, FETCH, MOVE or CLOSE; the result to send (rows for FETCH).

    The rows a cursor keeps in memory are held in the connection's share of the server's
    memory budget (``CursorSet.holdings``) from its DECLARE until it is dropped (53200
    past the share, nothing kept); the bytes of its spill file, in the server's budget of
    spilled bytes (``spill_budget``: 53400 past it, nothing kept), until the same moment,
    and given back on every way a DECLARE fails. The set is changed on the connection's
    loop only."""
    session = context.session
    command = cursors.parse_cursor_command(text)
    cursor_set_ = context.cursors
    cursor_set_.prune(session)
    if isinstance(command, cursors.Declare):
        cursor_set_.check_declare(session, command)
        query = _parse_query(command.query)
        charge = context.spill_charge()
        try:
            rows, heap_bytes = await context.call(_declare, context, query, parameters, charge)
            return cursor_set_.declare(session, command, rows, heap_bytes, charge)
        except BaseException:
            charge.release()  # not kept (a cancelled wait: its mapping's end gives back the rest)
            raise
    if isinstance(command, cursors.Close):
        return cursor_set_.close(session, command)
    return await context.call(cursor_set_.fetch, session, command)


def _declare(context: CommandContext, query: ast.Statement, parameters: Any,
             charge: SpillCharge) -> tuple[pa.Table, int]:  # fmt: skip
    """Run the query of a DECLARE and collect its rows (worker thread): read in batches, each
    within the result limit, and spilled to a file once large (``spill``, its bytes charged
    to ``charge``); the rows and their bytes in the heap."""
    stream = result_stream.open_stream(
        context, query, parameters,
        SqlSyntaxError("DECLARE CURSOR needs a query that returns rows"))  # fmt: skip
    return spill.collect_counted(stream, charge=charge)


def _parse_query(query: str) -> ast.Statement:
    statements = parse(query)
    if len(statements) != 1:
        raise SqlSyntaxError("DECLARE CURSOR takes exactly one query")
    return statements[0]


async def run_in_portal(context: CommandContext, statement: ast.Statement,
                        parameters: Any) -> Result:  # fmt: skip
    """Execute of a Parse'd statement of ours (extended protocol)."""
    assert isinstance(statement, ast.SqlStatement)
    try:
        _refuse_in_failed_transaction(context)
        if statement.text[:4].upper() == "COPY":
            return Result("COPY")  # Describe of a COPY portal: NoData; Execute runs it
        return await run_cursor_command(context, statement.text, parameters)
    except Exception:
        context.session.fail_transaction()
        raise


def describe_cursor(context: CommandContext, name: str) -> bytes | None:
    """RowDescription of the SQL cursor ``name`` (Describe portal), or None if none."""
    session = context.current_session()
    if session is None:
        return None
    cursor = context.cursors.find(name, session)
    if cursor is None:
        return None
    table = cursor.table
    fmt = 1 if cursor.binary else 0
    return m.row_description([
        m.Column(field.name, oid, wire_types.type_size(oid), -1, fmt)
        for field, oid in ((f, wire_types.type_oid(f.type)) for f in table.schema)
    ])

