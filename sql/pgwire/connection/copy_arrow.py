"""``COPY ... TO STDOUT (FORMAT arrow)``: a result sent as one Arrow IPC stream.

The exchange is PostgreSQL's COPY OUT: CopyOutResponse (overall format 1, binary, and one
column of format 1 per result column, as PostgreSQL announces a binary COPY), CopyData
messages whose payloads together are one Arrow IPC stream (``codec.copy_arrow``: schema,
batches, end-of-stream; each payload at most 64 KiB; a batch's messages go out with few
``writev`` calls from the serialised batch, ``output.send_views``), CopyDone, then
``COPY <rows>``.
Clients read it as any binary COPY (psycopg: ``b"".join(cursor.copy(...))``; psql:
``\\copy (...) TO 'file'``) and hand the bytes to an Arrow stream reader.

Two ways to the batches, giving the same rows:

- a topic range read, ``SELECT <columns> FROM TOPIC t WHERE partition = p AND offset >= a
  AND offset < b`` (``*`` for all columns; recognised on the parsed statement by
  ``engine.api.match_range_read``, never on text), streams the stored frames of that range
  with only those columns (``engine.api.read_range``: the SELECT privilege is checked, a
  range cut by retention or reaching past the partition's end is 22023, nothing is decoded
  message by message). Its columns have the types of ``engine.api.project_schema``. With
  ``COMPRESSION zstd`` (asked by a client that decompresses Arrow IPC body compression
  itself: the Spark JVM's reader, when the server announces ``topicbase_copy_compression``)
  a whole frame stored column-compressed goes out as it is stored, its record batch
  declaring body compression ZSTD (``engine.packed_read``); every other batch, and every
  batch of a COPY that did not ask, is plain;
- anything else (tables, topics, views, sys views, VALUES) is run as the query it is,
  through the session's one door (``result_stream``): its Arrow batches go out as they come,
  one at a time, each within the result limit (54000), never converted to rows.

A statement with effects on the general path (a consumer's read, which moves its offsets;
a write with RETURNING) commits them only once its batches were sent, before the stream's
end marker (``copy_commit``): a COPY that fails, is cancelled or loses its client before
that commits nothing.

Errors found before the first batch (privileges, a bad range, a bad query) come before
CopyOutResponse, as an ordinary error; an error after it ends the COPY with ErrorResponse,
as in PostgreSQL. ``statement_timeout`` covers both ways (57014), and a CancelRequest
ends a range read before its next batch (57014).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pyarrow as pa

from engine.api import (
    OffsetRange,
    PackedBatch,
    SessionState,
    ast,
    match_range_read,
    project_schema,
    read_range,
)
from sql.pgwire.codec import copy_arrow
from sql.pgwire.codec import messages as m
from sql.pgwire.connection import copy_commit, result_stream
from sql.pgwire.connection.context import CommandContext
from storage.errors import FeatureNotSupportedError, QueryCanceledError

_TOPIC_COLUMNS = frozenset(project_schema(None).names)


@dataclass
class _RangeSource:
    """The batches of a topic range read (worker thread)."""

    batches: Iterator[pa.RecordBatch | PackedBatch]
    schema: pa.Schema
    deadline: float | None
    cancelled: Callable[[], bool] = lambda: False  # a CancelRequest came for the session
    row_count: int = 0
    notices: tuple[str, ...] = field(default=())

    def next_batch(self) -> pa.RecordBatch | PackedBatch | None:
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise QueryCanceledError("canceling statement due to statement timeout")
        if self.cancelled():
            raise QueryCanceledError("canceling statement due to user request")
        batch = next(self.batches, None)
        if batch is not None:
            self.row_count += batch.num_rows
        return batch

    def close(self) -> None:
        close = getattr(self.batches, "close", None)
        if close is not None:
            close()


@dataclass
class _QuerySource:
    """The batches of any other query, as the engine streams them (worker thread); a
    statement with effects (a consumer read) holds them in ``held`` until the COPY was
    sent (``copy_commit``)."""

    stream: result_stream.ResultStream
    held: copy_commit.Held
    pending: list[pa.RecordBatch] = field(default_factory=list)

    @property
    def schema(self) -> pa.Schema:
        return self.stream.schema

    @property
    def notices(self) -> tuple[str, ...]:
        return self.stream.notices

    @property
    def row_count(self) -> int:
        return self.stream.row_count

    def next_batch(self) -> pa.RecordBatch | None:
        if self.held.context.session.cancel_requested:  # since the statement began
            raise QueryCanceledError("canceling statement due to user request")
        while not self.pending:
            table = self.stream.next_batch()
            if table is None:
                return None
            self.pending = table.to_batches()
        return self.pending.pop(0)

    def close(self) -> None:
        """Free the stream; effects not committed by now are rolled back."""
        try:
            self.stream.close()
        finally:
            self.held.rollback()


_Source = _RangeSource | _QuerySource


def range_source(context: CommandContext, statement: ast.Statement,
                 packed: bool = False) -> _RangeSource | None:  # fmt: skip
    """``statement`` as a topic range read started on storage, or None if it is not one (or
    the session is in a failed transaction, which the ordinary path refuses); ``packed``:
    the client takes body-compressed batches (``COMPRESSION zstd``). Worker thread."""
    match = match_range_read(statement)
    if match is None or context.session.state is SessionState.FAILED:
        return None
    if any(name not in _TOPIC_COLUMNS for name in match.columns):
        return None  # the ordinary path reports the unknown column as DuckDB does
    columns = list(match.columns) or None
    schema = project_schema(columns)
    offsets = OffsetRange(match.partition, match.start, match.end)
    session = context.session
    session.check_duration()  # as every statement: a too old transaction is 54000
    session.begin_front_read()  # a CancelRequest from now on ends this read (57014)
    batches = read_range(session, match.topic, offsets, columns, packed=packed)
    timeout_s = _statement_timeout_s(context)
    # counted from the message's arrival, the wire's work on it included
    deadline = (None if timeout_s is None
                else time.monotonic() + session.statement_time_left(timeout_s))  # fmt: skip
    return _RangeSource(batches, schema, deadline, lambda: bool(session.cancel_requested))


def _statement_timeout_s(context: CommandContext) -> float | None:
    """``statement_timeout`` in seconds (None if 0), as ``result_stream`` reads it."""
    shown = context.catalog.settings.show("statement_timeout")
    milliseconds = int(shown[:-2]) if shown.endswith("ms") else int(shown)
    return milliseconds / 1000 if milliseconds else None


def _open(context: CommandContext, statement: ast.Statement, packed: bool
          ) -> tuple[_Source, list[bytes | memoryview], bool]:  # fmt: skip
    """Start the source and read up to its first batch, so that errors found there come
    before CopyOutResponse: the source, the first messages (schema and first batch, or
    schema and end of stream) and whether they end the stream. Worker thread."""
    source: _Source | None = range_source(context, statement, packed)
    if source is None:
        source = _QuerySource(*copy_commit.open_held(
            context, statement,
            FeatureNotSupportedError("COPY query must return rows (a SELECT, VALUES or a "
                                     "statement with RETURNING)")))  # fmt: skip
    try:
        schema = copy_arrow.plain_schema(source.schema)
        first = source.next_batch()
        messages = copy_arrow.schema_messages(schema)
        if first is not None:
            messages += _batch_messages(first, schema)
        else:
            messages += copy_arrow.end_messages()
    except BaseException:
        source.close()
        raise
    return source, messages, first is None


def _commit(source: _Source) -> None:
    """Commit what the statement holds (``copy_commit``), once its data was sent."""
    if isinstance(source, _QuerySource):
        source.held.commit()


def _next_messages(source: _Source, schema: pa.Schema) -> list[bytes | memoryview] | None:
    """CopyData of the next batch (none for an empty batch); None at the end."""
    batch = source.next_batch()
    if batch is None:
        return None
    return _batch_messages(batch, schema)


def _batch_messages(batch: pa.RecordBatch | PackedBatch, schema: pa.Schema
                    ) -> list[bytes | memoryview]:  # fmt: skip
    if isinstance(batch, PackedBatch):  # only a range read asked to pack gives one
        assert batch.schema.equals(schema), (batch.schema, schema)
        return copy_arrow.packed_messages(batch)
    return copy_arrow.batch_messages(batch, schema)


async def copy_arrow_to_client(context: CommandContext, statement: ast.Statement,
                               packed: bool = False) -> None:  # fmt: skip
    """Run ``statement`` and send its result as an Arrow IPC stream in a COPY OUT;
    ``packed``: the client asked for ``COMPRESSION zstd`` (module doc)."""
    source, messages, ended = await context.call(_open, context, statement, packed)
    schema = copy_arrow.plain_schema(source.schema)
    try:
        for notice in source.notices:
            context.send(m.notice_response(notice))
        context.send(_copy_out_response(len(schema)))
        if ended:  # an empty result: its end marker is among the first messages
            await context.call(_commit, source)
        while True:
            await context.send_views(messages)  # one writev per ~512 KiB (output.send_views)
            if ended:
                break
            following = await context.call(_next_messages, source, schema)
            if following is None:
                await context.call(_commit, source)  # all but the end marker was sent
                # The end marker (13 bytes) is kept with CopyDone, CommandComplete and
                # ReadyForQuery: they go out in one write, waking the client once.
                context.send(b"".join(copy_arrow.end_messages()))
                break
            messages = following
    finally:
        await context.call(source.close)
    context.send(m.copy_done())
    context.send(m.command_complete(f"COPY {source.row_count}"))


def _copy_out_response(column_count: int) -> bytes:
    """CopyOutResponse of a binary COPY: format 1 overall and for each column."""
    body = bytes([1]) + column_count.to_bytes(2, "big") + b"\x00\x01" * column_count
    return m.message(b"H", body)
