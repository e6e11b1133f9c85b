"""COPY TO of a statement with effects: they commit once the whole COPY was sent, or never.

``COPY (SELECT data FROM TOPIC t WITH (consumer = 'c', max_messages = 1000)) TO STDOUT``
is a consumer's read: run as a plain statement it commits the consumer's offsets past
the messages it read. As a COPY in autocommit, the statement runs in a transaction of
its own that this module opens before the statement (``begin``) and commits only after
the COPY's last data was handed to the socket (``Held.commit``): if the COPY fails, is
cancelled (CancelRequest, 57014), or the client goes away before that, the transaction
is rolled back (``Held.rollback``) and the offsets stay where they were, so the next
read returns the same messages. A write with ``RETURNING`` under COPY gets the same rule,
as in PostgreSQL, where COPY (query) is one statement. The commit is the plain
statement's own commit (``COMMIT`` through the session: the read range is validated
against the committed offsets, 40001 if another read moved them meanwhile, and the moves
are durable when it returns).

Inside a transaction block nothing is opened: the offsets commit with the block, and a
COPY that fails makes the block fail (25P02 until ROLLBACK, ``commands``), so they are
not committed either. A plain query (no consumer read, no write) has no effects and is
streamed by the engine as before (``result_stream.try_stream``), with no transaction.

What "sent" means: every CopyData but the stream's own end (Arrow's end-of-stream marker,
binary COPY's trailer) was written and drained into the kernel's socket buffer, so the
client has all but what the two socket buffers hold; the end marker, CopyDone and
``COPY n`` follow the commit, so a client that sees them knows the offsets moved, and a
failed commit ends the COPY with ErrorResponse before the end marker (a truncated stream).

The same rule holds for a consumer read whose rows go out as DataRows (``hold``, used by
``extended`` and ``connection``'s simple query): in autocommit the read runs in a
transaction of its own, its rows are sent and drained, and the commit runs before
``CommandComplete``, which a failed commit replaces with its ErrorResponse (PostgreSQL also
commits an implicit transaction after its rows went out: at the end of a simple query,
at Sync in the extended protocol). A read whose rows are not all sent (the client went
away, an error, a portal not executed to its end) is rolled back. Besides the guarantee,
the commit's fsync then overlaps the client's receiving and decoding of the rows.

Runs on the connection's worker thread, like every engine call.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.api import SessionState, ast, from_table, parse_statements
from sql.pgwire import limits as wire_limits
from sql.pgwire.codec import wire_types
from sql.pgwire.connection import result_stream
from sql.pgwire.connection.context import CommandContext
from storage.errors import InFailedTransactionError, QueryCanceledError, TopicbaseError

_BEGIN, _COMMIT, _ROLLBACK = (parse_statements(text)[0] for text in ("BEGIN", "COMMIT", "ROLLBACK"))


@dataclass
class Held:
    """The transaction a COPY opened for its statement (``began``), or none."""

    context: CommandContext
    began: bool

    def commit(self) -> None:
        """Commit the statement's effects (once the COPY's data was sent); a CancelRequest
        that came while it was sent rolls them back instead (57014)."""
        if not self.began:
            return
        session = self.context.session
        if session.cancel_requested:
            self.rollback()
            raise QueryCanceledError("canceling statement due to user request")
        self.began = False  # a failed COMMIT has rolled back already
        result = self.context.catalog.execute(session, _COMMIT, None)
        if result.tag != "COMMIT":  # the transaction had failed: COMMIT rolled it back
            raise InFailedTransactionError("the COPY's transaction failed; nothing was committed")

    def rollback(self) -> None:
        """Undo the statement's effects (the COPY failed); nothing if already ended."""
        if not self.began:
            return
        self.began = False
        self.context.catalog.execute(self.context.session, _ROLLBACK, None)


def reads_with_consumer(statement: ast.Statement) -> bool:
    """Whether ``statement`` reads a topic as a consumer (it moves the consumer's offsets).
    Only a shortcut: such a statement is never a plain query (``Session.open_stream``
    plans it and says so), so asking costs a planning for nothing."""
    return (
        isinstance(statement, ast.SqlStatement)
        and bool(statement.topic_scans)
        and any(name == "consumer" for scan in statement.topic_scans for name, _ in scan.options)
    )


def hold(context: CommandContext, statement: ast.Statement) -> Held:
    """Before ``statement`` runs: the transaction that holds its effects until its rows were
    sent. Opened (``BEGIN``) only for a consumer read in autocommit; otherwise an empty
    ``Held`` (the statement commits as it runs, or with its block)."""
    if not reads_with_consumer(statement):  # most statements: no session asked
        return Held(context, False)
    session = context.session
    opens = session.state is SessionState.IDLE
    if opens:
        context.catalog.execute(session, _BEGIN, None)
    return Held(context, opens)


def open_held(context: CommandContext, statement: ast.Statement,
              no_rows: TopicbaseError) -> tuple[result_stream.ResultStream, Held]:  # fmt: skip
    """``statement``'s rows for a COPY TO, and the transaction holding its effects.

    A plain query streams from the engine (no transaction). Anything else runs whole: in
    autocommit inside a transaction opened here (committed by ``Held.commit`` once the
    COPY was sent), inside a block as any statement of the block. ``no_rows`` is raised
    (and the transaction rolled back) if it returns no rows."""
    if not reads_with_consumer(statement):
        streamed = result_stream.try_stream(context, statement, None, no_rows)
        if streamed is not None:
            return streamed, Held(context, False)
    session = context.session
    opens = (
        session.state is SessionState.IDLE
        and isinstance(statement, ast.SqlStatement | ast.InsertTopic)
        and not context.catalog.is_session_command(statement)
    )
    held = Held(context, opens)
    if opens:
        context.catalog.execute(session, _BEGIN, None)
    try:
        result = context.catalog.execute(session, statement, None)
        if result.table is None:
            raise no_rows
        error = wire_limits.result_error(result.table, context.limits)
        if error is not None:
            raise error
    except BaseException:
        held.rollback()
        raise
    table = result.table
    oids = [wire_types.type_oid(f.type) for f in table.schema]
    rows = from_table(table, result.notices)
    return result_stream.ResultStream(rows, oids, context.limits.result_bytes_max), held
