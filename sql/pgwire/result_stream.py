"""Results read in bounded batches, for COPY TO and DECLARE (never one whole Arrow table).

A plain query (one DuckDB ``SELECT``/``WITH``/``VALUES``/``TABLE`` over tables: no topic
scan, no write, no session command, no view the engine registers first) runs straight on
the session's DuckDB cursor and is read through DuckDB's Arrow record-batch reader,
``BATCH_ROWS`` rows at a time; its column OIDs come from DuckDB's own type names, so
UUID and JSON stay apart from text. Any other statement runs through the connection's
catalog layer as the server runs every statement; the engine then returns its whole result
(a topic read is bounded by the storage read limits) and it is cut into batches here. A
DML statement without RETURNING is refused before it runs (it has no rows to give).
``statement_timeout`` covers the batched read from its start to its close (57014).

Invariants:

- DuckDB allows no other statement on a cursor while one of its results is open ("connection
  has an open result; drain or destroy it"), so a ``ResultStream`` must be closed before the
  session runs anything else. COPY TO drains it within its own exchange (no other message of
  the connection is read meanwhile); DECLARE drains it into ``spill.collect`` at once.
- Every batch held is checked against ``result_bytes_max`` (54000), so the limit bounds what
  is held at a time, not the whole result; a result from the engine is held whole and is
  checked whole.
- Runs on the connection's worker thread (one thread at a time), like every engine call.
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from engine import tables
from engine.session import DML_TAGS, statement_line_offset
from engine.transaction import SessionState
from grammar import ast
from planner import planner
from planner.operations import RunQuery
from sql.pgwire import limits as wire_limits
from sql.pgwire import types
from storage.errors import LimitExceededError, QueryCanceledError, TopicbaseError

if TYPE_CHECKING:
    from sql.pgwire.server import Connection

BATCH_ROWS = 8192  # rows of one batch read from DuckDB
_QUERY_HEAD = re.compile(
    r"\s*(?:\(\s*)*(?:SELECT|WITH|VALUES|TABLE|FROM|INSERT|UPDATE|DELETE|MERGE)\b", re.IGNORECASE)


@dataclass
class ResultStream:
    """The batches of one result, read one at a time; ``close`` frees the DuckDB result."""

    schema: pa.Schema
    oids: list[int]
    notices: tuple[str, ...]
    result_bytes_max: int
    _batches: Iterator[pa.RecordBatch]
    _close: Callable[[], None] = field(default=lambda: None)
    row_count: int = 0

    def next_batch(self) -> pa.Table | None:
        """The next batch as a table (None at the end); 54000 if one batch is over the limit."""
        for batch in self._batches:
            if batch.num_rows == 0:
                continue
            table = pa.Table.from_batches([batch], self.schema)
            if table.nbytes > self.result_bytes_max:
                raise LimitExceededError(
                    f"a batch of {table.num_rows} rows of the result is {table.nbytes} bytes, "
                    f"over the limit of {self.result_bytes_max} bytes")  # fmt: skip
            self.row_count += table.num_rows
            return table
        return None

    def close(self) -> None:
        close, self._close = self._close, lambda: None
        close()


def open_stream(connection: Connection, statement: ast.Statement, parameters: Any,
                no_rows: TopicbaseError) -> ResultStream:  # fmt: skip
    """Start ``statement``; its rows as a stream (worker thread). ``no_rows`` is raised if
    the statement returns no rows."""
    limit = connection.server.limits.result_bytes_max
    plain = _plain_query(connection, statement)
    if isinstance(plain, _PlainQuery):
        connection._session().check_duration()  # as the engine checks every statement
        return _duckdb_stream(connection, plain, parameters, limit)
    if plain is _WRITES_NO_ROWS:
        raise no_rows  # before it runs: PostgreSQL refuses such a COPY without writing
    session = connection._session()
    result = connection.catalog.execute(session, statement, parameters)
    if result.table is None:
        raise no_rows
    error = wire_limits.result_error(result.table, connection.server.limits)
    if error is not None:
        raise error
    table = result.table
    oids = [types.type_oid(f.type) for f in table.schema]
    return ResultStream(table.schema, oids, result.notices, limit,
                        iter(table.to_batches(max_chunksize=BATCH_ROWS)))  # fmt: skip


@dataclass(frozen=True)
class _PlainQuery:
    sql: str
    uses_parameters: bool
    line_offset: int


_WRITES_NO_ROWS = "writes, returns no rows"


def _plain_query(connection: Connection, statement: ast.Statement) -> _PlainQuery | str | None:
    """The DuckDB query of ``statement`` if it is one that can be read straight from DuckDB;
    ``_WRITES_NO_ROWS`` for a DML statement without RETURNING; else None."""
    session = connection._session()
    if not isinstance(statement, ast.SqlStatement) or statement.topic_scans \
            or session.state is SessionState.FAILED or not _QUERY_HEAD.match(statement.sql):
        return None  # fmt: skip
    engine_statement = connection.catalog.engine_statement(statement)
    # Plan as the session's engine plans (its catalog also knows the session's DuckDB
    # relations, which decide whether a plain ``FROM name`` reads a topic).
    try:
        plan = planner.plan(engine_statement, session.planning_catalog)
    except TopicbaseError:
        return None  # the engine reports it as it reports any statement
    if plan.explain_only or len(plan.operations) != 1:
        return None
    operation = plan.operations[0]
    if isinstance(operation, RunQuery) and operation.tag in DML_TAGS \
            and not operation.returns_rows:  # fmt: skip
        return _WRITES_NO_ROWS
    if not isinstance(operation, RunQuery) or not operation.returns_rows \
            or operation.tag != "SELECT" or operation.tables_written \
            or operation.system_views or operation.projection is not None:
        return None  # fmt: skip
    return _PlainQuery(operation.sql, operation.uses_parameters, statement_line_offset(plan))


def _duckdb_stream(connection: Connection, query: _PlainQuery, parameters: Any,
                   limit: int) -> ResultStream:  # fmt: skip
    session = connection._session()
    bound = parameters if query.uses_parameters else None
    deadline = _statement_timer(connection)
    try:
        with _translated(query.line_offset, deadline):
            relation = session.cursor.sql(query.sql, params=bound or None)
            if relation is None:
                raise AssertionError("a SELECT without a result")
            duckdb_types = [str(t) for t in relation.types]
            reader = relation.to_arrow_reader(BATCH_ROWS)
    except BaseException:
        if deadline is not None:
            deadline.cancel()
        raise
    oids = [types.column_oid(f.type, sql_type)
            for f, sql_type in zip(reader.schema, duckdb_types, strict=True)]  # fmt: skip

    def batches() -> Iterator[pa.RecordBatch]:
        while True:
            with _translated(query.line_offset, deadline):
                try:
                    batch = reader.read_next_batch()
                except StopIteration:
                    return
            yield batch

    def close() -> None:
        if deadline is not None:
            deadline.cancel()
        reader.close()

    return ResultStream(reader.schema, oids, (), limit, batches(), close)


class _Deadline:
    """``statement_timeout`` of one batched read: cancels the session when it passes."""

    def __init__(self, seconds: float, cancel: Callable[[], None]) -> None:
        self.fired = threading.Event()

        def fire() -> None:
            self.fired.set()
            cancel()

        self._timer = threading.Timer(seconds, fire)
        self._timer.daemon = True
        self._timer.start()

    def cancel(self) -> None:
        self._timer.cancel()


def _statement_timer(connection: Connection) -> _Deadline | None:
    """A started deadline at ``statement_timeout`` (None if 0), as the catalog layer keeps
    for the statements it runs."""
    shown = connection.catalog.settings.show("statement_timeout")
    milliseconds = int(shown[:-2]) if shown.endswith("ms") else int(shown)
    if milliseconds == 0:
        return None
    return _Deadline(milliseconds / 1000, connection._session().cancel)


@contextlib.contextmanager
def _translated(line_offset: int, deadline: _Deadline | None) -> Iterator[None]:
    """DuckDB errors as Topicbase errors; a cancel by ``deadline`` says it was the timeout."""
    try:
        with tables.translated(line_offset):
            yield
    except QueryCanceledError as error:
        if deadline is not None and deadline.fired.is_set():
            raise QueryCanceledError("canceling statement due to statement timeout") from error
        raise
