"""Results sent in bounded batches, for COPY TO and DECLARE (never one whole Arrow table).

The engine decides how a statement is read (``Session.open_stream``, the one door): a
plain query over tables is streamed from DuckDB batch by batch, after the same planning,
sandbox and privilege checks as every statement; anything else (a topic read, a session
command of the PostgreSQL emulation, a write with RETURNING) runs through the
connection's catalog layer as the server runs every statement, and its whole result is
cut into batches here. A write without RETURNING is refused before it runs (it has no rows
to give). ``statement_timeout`` covers the batched read from its start to its close
(57014).

This module adds what the wire needs: column OIDs (from DuckDB's own type names when
known, so UUID and JSON stay apart from text) and the per-batch result limit.

Invariants:

- The engine refuses other statements on the session while a stream is open, so a
  ``ResultStream`` must be closed first. COPY TO drains it within its own exchange (no
  other message of the connection is read meanwhile); DECLARE drains it into
  ``spill.collect`` at once.
- Every batch held is checked against ``result_bytes_max`` (54000), so the limit bounds what
  is held at a time, not the whole result; a result held whole is checked whole.
- Runs on the connection's worker thread (one thread at a time), like every engine call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from engine.api import BATCH_ROWS, Rows, RowStream, ast, from_table
from sql.pgwire import limits as wire_limits
from sql.pgwire.codec import wire_types
from sql.pgwire.connection.context import CommandContext
from storage.errors import LimitExceededError, TopicbaseError

__all__ = ["BATCH_ROWS", "ResultStream", "open_stream", "try_stream"]


@dataclass
class ResultStream:
    """The batches of one result with their column OIDs; ``close`` frees the engine's."""

    rows: RowStream
    oids: list[int]
    result_bytes_max: int

    @property
    def schema(self) -> pa.Schema:
        return self.rows.schema

    @property
    def notices(self) -> tuple[str, ...]:
        return self.rows.notices

    @property
    def row_count(self) -> int:
        return self.rows.row_count

    def next_batch(self) -> pa.Table | None:
        """The next batch as a table (None at the end); 54000 if one batch is over the limit."""
        batch = self.rows.next_batch()
        if batch is None:
            return None
        table = pa.Table.from_batches([batch], self.schema)
        if table.nbytes > self.result_bytes_max:
            raise LimitExceededError(
                f"a batch of {table.num_rows} rows of the result is {table.nbytes} bytes, "
                f"over the limit of {self.result_bytes_max} bytes")  # fmt: skip
        return table

    def whole_rows(self) -> Rows | None:
        """The whole result as ``Rows`` if the engine read it whole already and no batch
        was taken (the stream is then at its end: close it), else None; 54000 if it is
        over the limit (judged as a batch of it is: its Arrow size, built only when the
        bound ``Rows.nbytes_bound`` does not settle it)."""
        whole = self.rows.take_whole()
        if whole is None:
            return None
        if whole.nbytes_bound() > self.result_bytes_max:
            nbytes = whole.to_arrow().nbytes
            if nbytes > self.result_bytes_max:
                raise LimitExceededError(
                    f"a batch of {whole.num_rows} rows of the result is {nbytes} bytes, "
                    f"over the limit of {self.result_bytes_max} bytes")  # fmt: skip
        return whole

    def close(self) -> None:
        self.rows.close()


def try_stream(context: CommandContext, statement: ast.Statement, parameters: Any,
               no_rows: TopicbaseError | None) -> ResultStream | None:  # fmt: skip
    """``statement``'s rows streamed by the engine if it is a plain query, else None (the
    caller runs it whole). Worker thread."""
    session = context.session
    catalog = context.catalog
    if catalog.is_session_command(statement):
        return None  # SET, SHOW …: answered by the PostgreSQL emulation
    rows = session.open_stream(
        catalog.engine_statement(statement), parameters,
        no_rows=no_rows, timeout_s=_statement_timeout_s(context))  # fmt: skip
    if rows is None:
        return None
    assert rows.duckdb_types is not None
    oids = [wire_types.column_oid(f.type, sql_type)
            for f, sql_type in zip(rows.schema, rows.duckdb_types, strict=True)]  # fmt: skip
    return ResultStream(rows, oids, context.limits.result_bytes_max)


def open_stream(context: CommandContext, statement: ast.Statement, parameters: Any,
                no_rows: TopicbaseError) -> ResultStream:  # fmt: skip
    """Start ``statement``; its rows as a stream (worker thread). ``no_rows`` is raised if
    the statement returns no rows."""
    limit = context.limits.result_bytes_max
    streamed = try_stream(context, statement, parameters, no_rows)
    if streamed is not None:
        return streamed
    session = context.session
    result = context.catalog.execute(session, statement, parameters)
    if result.table is None:
        raise no_rows
    error = wire_limits.result_error(result.table, context.limits)
    if error is not None:
        raise error
    table = result.table
    oids = [wire_types.type_oid(f.type) for f in table.schema]
    return ResultStream(from_table(table, result.notices), oids, limit)


def _statement_timeout_s(context: CommandContext) -> float | None:
    """``statement_timeout`` in seconds (None if 0), as the catalog layer keeps it for the
    statements it runs."""
    shown = context.catalog.settings.show("statement_timeout")
    milliseconds = int(shown[:-2]) if shown.endswith("ms") else int(shown)
    return milliseconds / 1000 if milliseconds else None
