"""Bulk statements over an Arrow table: the engine side of COPY ... FROM STDIN.

A front hands in an Arrow table and SQL texts that name it as ``{relation}``; the table
is registered on the session's DuckDB cursor under a unique name, and each text runs as
an ordinary statement of the session (``Session.execute_statement``; this module
knows the session as ``engine.protocols.StatementRunner``), so it joins the
session's transaction exactly as a typed ``INSERT ... SELECT`` would: inside BEGIN it is
part of that transaction (ROLLBACK undoes it, an error fails it); in autocommit the
statements run as one transaction of their own when there are several of them.

Invariants: the relation is unregistered when the call returns; if DuckDB refuses that
(an aborted transaction), the name is left to the session's rollback, which retries it.
The session must be used from one thread at a time, as every session is.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Sequence

import pyarrow as pa

from engine import tables
from engine.protocols import StatementRunner
from engine.result import Result
from engine.transaction import SessionState
from grammar.parse import parse_one
from storage.errors import InFailedTransactionError, TopicbaseError

_relation_numbers = itertools.count(1)


def run_over_relation(session: StatementRunner, relation: pa.Table, sql_texts: Sequence[str],
                      before_each: Callable[[], None] | None = None) -> list[Result]:  # fmt: skip
    """Run each text with ``{relation}`` naming ``relation``; one result per text.

    With more than one text and no open transaction, the texts run inside one
    transaction (all or nothing). ``before_each`` runs before each text and before that
    COMMIT: what it raises ends the run as a failed statement would (a caller's deadline,
    which a cancel flag reset by every statement could not keep).
    """
    assert sql_texts, "at least one statement"
    if session.state is SessionState.FAILED:
        raise InFailedTransactionError(
            "current transaction is aborted, commands ignored until end of transaction block"
        )
    name = f"__bulk_relation_{session.session_id}_{next(_relation_numbers)}"
    statements = [parse_one(text.replace("{relation}", name)) for text in sql_texts]
    wrap = len(statements) > 1 and session.state is SessionState.IDLE
    tables.register(session.cursor, name, relation)
    try:
        if wrap:
            session.execute_statement(parse_one("BEGIN"))
        try:
            results = []
            for statement in statements:
                if before_each is not None:
                    before_each()
                results.append(session.execute_statement(statement))
            if wrap and before_each is not None:
                before_each()
        except BaseException:
            if wrap:
                with contextlib.suppress(TopicbaseError):
                    session.execute_statement(parse_one("ROLLBACK"))
            raise
        if wrap:
            session.execute_statement(parse_one("COMMIT"))
        return results
    finally:
        try:
            tables.unregister(session.cursor, name)
        except TopicbaseError:
            session.drop_at_rollback(name)
