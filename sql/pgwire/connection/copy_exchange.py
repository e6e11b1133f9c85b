"""COPY over the wire: the CopyOut and CopyIn exchanges (the statement: ``copy_statement``).

Supported:

- ``COPY (query) TO STDOUT``, ``COPY table [(columns)] TO STDOUT``,
  ``COPY TOPIC name [(columns)] TO STDOUT`` (a peek at the whole topic);
- ``COPY table [(columns)] FROM STDIN``, ``COPY TOPIC name [(columns)] FROM STDIN``
  with the topic write columns of ``INSERT INTO TOPIC`` (default: ``data``).

Formats text, CSV, binary (``copy_binary``) and Arrow (``copy_arrow``: one Arrow IPC
stream; COPY TO reads a topic range straight from storage) both ways;
files and programs are refused (0A000). COPY TO starts the query and reads its rows in
batches (``result_stream``: a plain query straight from DuckDB's Arrow reader, at most
``result_stream.BATCH_ROWS`` rows held at a time, each batch within the result limit),
sent one CopyData per row, as PostgreSQL does. A statement with effects (a consumer's
read) commits them once its rows were sent (``copy_commit``), before the binary trailer.
COPY FROM parses the data as it arrives (off the event loop), holds it as string
columns, checks every value against the target column's type (22P02 with the line of
the first bad row, nothing written), then inserts everything with one Arrow-backed
``INSERT ... SELECT`` through the session (``engine.bulk``): it is part of the open
transaction, or one transaction of its own in autocommit. CopyFail is 57014, and so is
a CancelRequest or ``statement_timeout`` (``copy_wait``: also while the client sends
nothing; nothing is written, the bytes held are let go at once). Any other
message than CopyData, CopyDone, CopyFail, Flush or Sync during COPY IN is 08P01.
"""

from __future__ import annotations

import asyncio
import re
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from engine.api import INSERT_COLUMNS, parse, parse_statements, run_over_relation
from sql.pgwire import limits as wire_limits
from sql.pgwire.codec import copy_binary, wire_types
from sql.pgwire.codec import messages as m
from sql.pgwire.codec.copy_arrow import ArrowCopyDecoder
from sql.pgwire.codec.copy_binary import BinaryCopyDecoder
from sql.pgwire.codec.copy_format import (
    LINE_COLUMN,
    ROWS_PER_CHUNK,
    CopyDecoder,
    InvalidTextRepresentationError,
    encode_header,
    encode_lines,
)
from sql.pgwire.connection import copy_arrow, copy_commit, copy_staged, result_stream
from sql.pgwire.connection.context import CommandContext
from sql.pgwire.connection.copy_statement import CopyStatement
from sql.pgwire.connection.copy_wait import CancelledInsideMessage, CopyWatch, skip_rest
from sql.pgwire.connection.portals import ProtocolViolation
from sql.pgwire.emulation.pg_settings import milliseconds
from storage import limits
from storage.errors import (
    FeatureNotSupportedError,
    LimitExceededError,
    NumericValueOutOfRangeError,
    QueryCanceledError,
    SqlSyntaxError,
    UndefinedColumnError,
    UndefinedTopicError,
)
from storage.limits import COPY_IN_BYTES_MAX

_INT16 = struct.Struct("!h")
_TOPIC_TYPES = {"data": "BLOB", "producer_id": "VARCHAR", "seq_no": "BIGINT",
                "message_group_id": "VARCHAR", "partition": "INTEGER",
                "created_at": "TIMESTAMPTZ", "metadata": "VARCHAR", "codec": "VARCHAR"}  # fmt: skip
_TOPIC_OIDS = {"data": wire_types.BYTEA, "producer_id": wire_types.TEXT, "seq_no": wire_types.INT8,
               "message_group_id": wire_types.TEXT, "partition": wire_types.INT4,
               "created_at": wire_types.TIMESTAMPTZ, "metadata": wire_types.TEXT,
               "codec": wire_types.TEXT}  # fmt: skip



# -- COPY TO STDOUT ---------------------------------------------------------------------------
def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _source_query(statement: CopyStatement) -> str:
    if statement.query is not None:
        return statement.query
    columns = ", ".join(_quote(c) for c in statement.columns) or "*"
    if statement.topic is not None:
        return f"SELECT {columns} FROM TOPIC {_quote(statement.topic)}"
    return f"SELECT {columns} FROM {statement.relation}"


async def copy_to_client(context: CommandContext, statement: CopyStatement) -> None:
    """Start the source query, then CopyOutResponse, CopyData, CopyDone, COPY n.

    As PostgreSQL does, each row goes in a CopyData of its own (psycopg's ``read_row`` reads
    one row per message); in binary, the file header goes with the first row (or with the
    trailer, if there is none) and the trailer alone. The rows are read and encoded one batch
    at a time (``result_stream``): what is held is one batch, each within the result limit
    (54000), never the whole result. The stream is closed however the exchange ends (DuckDB
    refuses other statements on the session while it is open). FORMAT arrow: ``copy_arrow``."""
    statements = parse_statements(_source_query(statement))  # cached: a reader's loop repeats it
    if len(statements) != 1:
        raise SqlSyntaxError("COPY takes exactly one query")
    if statement.fmt.arrow:
        await copy_arrow.copy_arrow_to_client(context, statements[0], statement.fmt.arrow_zstd)
        return
    stream, held = await context.call(
        copy_commit.open_held, context, statements[0],
        FeatureNotSupportedError("COPY query must return rows (a SELECT, VALUES or a "
                                 "statement with RETURNING)"))  # fmt: skip
    binary = statement.fmt.binary
    try:
        for notice in stream.notices:
            context.send(m.notice_response(notice))
        context.send(_copy_out_response(len(stream.oids), binary))
        header = copy_binary.BINARY_HEADER if binary else b""
        if not binary and statement.fmt.header:
            context.send(m.copy_data(encode_header(stream.schema.names, statement.fmt)))
        while True:
            chunks = await context.call(_next_messages, stream, statement, header)
            if chunks is None:
                break
            header = b""
            for chunk in chunks:
                context.send(chunk)
                await context.drain()
        await context.call(held.commit)  # a consumer read's offsets: all rows were sent
        if binary:
            context.send(m.copy_data(header + copy_binary.BINARY_TRAILER))
    finally:
        await context.call(stream.close)
        await context.call(held.rollback)  # if not committed
    context.send(m.copy_done())
    context.send(m.command_complete(f"COPY {stream.row_count}"))


def _copy_out_response(column_count: int, binary: bool) -> bytes:
    """CopyOutResponse: text or binary, overall and for each column."""
    code = 1 if binary else 0
    return m.message(b"H", bytes([code]) + m.column_count_field(column_count)
                     + _INT16.pack(code) * column_count)  # fmt: skip


def _next_messages(stream: result_stream.ResultStream, statement: CopyStatement,
                   header: bytes) -> list[bytes] | None:  # fmt: skip
    """The next batch of rows as CopyData messages, one per row, joined ``ROWS_PER_CHUNK``
    at a time; ``header`` goes before the first row. None at the end (worker thread)."""
    table = stream.next_batch()
    if table is None:
        return None
    chunks = []
    for start in range(0, table.num_rows, ROWS_PER_CHUNK):
        chunk = table.slice(start, ROWS_PER_CHUNK)
        if statement.fmt.binary:
            rows = copy_binary.encode_binary_tuples(chunk, stream.oids)
        else:
            rows = encode_lines(chunk, statement.fmt, stream.oids)
        if header:
            rows[0], header = header + rows[0], b""
        chunks.append(b"".join(m.copy_data(row) for row in rows))
    return chunks


# -- COPY FROM STDIN ----------------------------------------------------------------------------
@dataclass(frozen=True)
class _Target:
    """Where COPY FROM writes: column names and DuckDB types, and the INSERT head."""

    columns: list[str]
    duckdb_types: list[str]
    insert_head: str  # "INSERT INTO t (a, b)" or "INSERT INTO TOPIC t (data)"
    ordered: bool  # topics keep the input order


async def _target(context: CommandContext, statement: CopyStatement) -> _Target:
    session = context.session
    if statement.topic is not None:
        if context.database.catalog.entry(statement.topic) is None:
            raise UndefinedTopicError(f'topic "{statement.topic}" does not exist')
        columns = list(statement.columns or ("data",))
        for name in columns:
            if name not in INSERT_COLUMNS:
                raise UndefinedColumnError(f'column "{name}" of topic "{statement.topic}" does '
                                           f"not exist; writable: {', '.join(INSERT_COLUMNS)}")
        head = f"INSERT INTO TOPIC {_quote(statement.topic)} ({', '.join(map(_quote, columns))})"
        return _Target(columns, [_TOPIC_TYPES[c] for c in columns], head, True)
    assert statement.relation is not None
    describe = parse(f"DESCRIBE SELECT * FROM {statement.relation}")[0]
    described = await context.call(session.execute_statement, describe)
    assert described.table is not None
    types_by_name = dict(zip(described.table.column("column_name").to_pylist(),
                             described.table.column("column_type").to_pylist(), strict=True))
    columns = list(statement.columns or types_by_name)
    for name in columns:
        if name not in types_by_name:
            raise UndefinedColumnError(
                f'column "{name}" of relation "{statement.relation}" does not exist')
    head = f"INSERT INTO {statement.relation} ({', '.join(map(_quote, columns))})"
    return _Target(columns, [types_by_name[c] for c in columns], head, False)


async def copy_from_client(context: CommandContext, statement: CopyStatement) -> None:
    """CopyInResponse, then CopyData until CopyDone; write all rows or none. A
    CancelRequest or ``statement_timeout`` ends it (57014), even while the client sends
    nothing (``copy_wait``); nothing is written then. The bell is listened to from the
    start: a cancel that comes while the COPY is set up (its DESCRIBE clears the session's
    flag) fails it before CopyInResponse (review R1 round 16, 2.2)."""
    cut = None
    with context.cancel_bell.listening() as rung:
        try:
            await _copy_from_client(context, statement, rung)
        except CancelledInsideMessage as inside:  # the COPY's data is let go by now
            cut = CancelledInsideMessage(inside.reason, inside.length)  # no traceback kept
    if cut is not None:
        await skip_rest(context.reader, cut)  # raises its 57014, in step with the client


async def _copy_from_client(context: CommandContext, statement: CopyStatement,
                            rung: asyncio.Future[None]) -> None:  # fmt: skip
    timeout_ms = milliseconds(context.catalog.settings.values["statement_timeout"])
    deadline = None
    if timeout_ms:  # counted from the message's arrival, the wire's work on it included
        left_s = await context.call(context.session.statement_time_left, timeout_ms / 1000)
        deadline = time.monotonic() + left_s
    await context.call(context.session.begin_front_read)  # a cancel from now on is this COPY's
    target = await _target(context, statement)
    relation_name = statement.topic or statement.relation or ""
    if statement.write_id is not None:  # staged under the id, published by COMMIT WRITES
        kind, name = (("topic", statement.topic) if statement.topic is not None
                      else ("table", copy_staged.table_name(statement.relation or "")))
        watch = CopyWatch(context.session, rung, deadline, lambda: f"COPY {relation_name}")
        watch.check()  # cancelled (or timed out) while it was set up: no CopyInResponse
        await copy_staged.copy_staged_from_client(context, statement.write_id, kind, name,
                                                  target.columns, watch,
                                                  frames=statement.frames)  # fmt: skip
        return
    decoder: CopyDecoder | BinaryCopyDecoder | ArrowCopyDecoder
    if statement.fmt.arrow:
        decoder = ArrowCopyDecoder(target.columns, relation_name, LINE_COLUMN)
    elif statement.fmt.binary:
        oids = await _column_oids(context, statement, target)
        decoder = BinaryCopyDecoder(oids, target.columns, relation_name)
    else:
        blobs = frozenset(i for i, kind in enumerate(target.duckdb_types) if kind == "BLOB")
        decoder = CopyDecoder(statement.fmt, target.columns, relation_name, blobs)
    watch = CopyWatch(context.session, rung, deadline, lambda: _reading_at(decoder))
    watch.check()  # cancelled (or timed out) while it was set up: no CopyInResponse
    context.send(m.copy_in_response(len(target.columns), statement.fmt.binary))
    await context.drain()
    held = _Held()
    try:
        await _receive(context, decoder, held, watch)
        watch.check()  # a cancel or the deadline that came with the last messages
        await context.call(decoder.finish)
        count = decoder.row_count
        if count:
            await context.call(_write_before, deadline, context.cancel_bell.rang, context.session,
                               decoder, target)  # fmt: skip
    finally:  # written or refused: the data is let go with the decoder
        context.holdings.give(held.nbytes)
    context.send(m.command_complete(f"COPY {count}"))


def _reading_at(decoder: CopyDecoder | BinaryCopyDecoder | ArrowCopyDecoder) -> str:
    """A cancelled COPY's CONTEXT: the line (row) it was reading, as PostgreSQL's."""
    if isinstance(decoder, ArrowCopyDecoder):  # a stream of batches: no lines
        return f"COPY {decoder.relation}"
    return f"COPY {decoder.relation}, line {decoder.line_number + 1}"


@dataclass
class _Held:
    """The bytes of one COPY's data counted in the server's ``MemoryBudget``."""

    nbytes: int = 0


async def _column_oids(context: CommandContext, statement: CopyStatement, target: _Target
                       ) -> list[int]:  # fmt: skip
    """The type OIDs clients were told for the target columns (binary values follow them)."""
    if statement.topic is not None:
        return [_TOPIC_OIDS[c] for c in target.columns]
    columns = ", ".join(map(_quote, target.columns))
    probe = parse(f"SELECT {columns} FROM {statement.relation} LIMIT 0")[0]
    result = await context.call(context.session.execute_statement, probe)
    assert result.table is not None
    return [wire_types.column_oid(f.type, sql_type)  # as Describe reports them (UUID, JSON)
            for f, sql_type in zip(result.table.schema, target.duckdb_types, strict=True)]


async def _receive(context: CommandContext,
                   decoder: CopyDecoder | BinaryCopyDecoder | ArrowCopyDecoder,
                   held: _Held, watch: CopyWatch) -> None:  # fmt: skip
    """Feed CopyData to the decoder until CopyDone; CopyFail and strangers are errors.
    Each chunk is counted in the server's budget (``held``) before it is fed: 53200 past
    it, as 54000 past the connection's own ``COPY_IN_BYTES_MAX``. A cancel or the
    statement's deadline ends it before the next message, or while it is awaited (57014)."""
    while True:
        watch.check()
        header = await watch.read(context.reader, 5)
        body = await watch.read_body(context.reader, context.holdings,  # held while it arrives
                                     wire_limits.message_body_length(header, context.limits))
        kind = header[:1]
        if kind == b"d":
            if decoder.bytes_seen + len(body) > COPY_IN_BYTES_MAX:
                raise LimitExceededError(f"COPY FROM STDIN data exceeds the limit of "
                                         f"{COPY_IN_BYTES_MAX} bytes")  # fmt: skip
            context.holdings.take(len(body), "COPY FROM STDIN data")
            held.nbytes += len(body)
            await context.call(decoder.feed, body)
        elif kind == b"c":
            return
        elif kind == b"f":
            reason = m.parse_copy_fail(body)
            raise QueryCanceledError(f"COPY from stdin failed: {reason}")
        elif kind == b"X":
            raise asyncio.IncompleteReadError(b"", None)
        elif kind not in (b"H", b"S"):  # Flush and Sync are ignored during COPY IN
            raise ProtocolViolation(
                f"unexpected message type 0x{kind[0]:02X} during COPY from stdin")


def _write_before(deadline: float | None, rang: Callable[[], bool], session: Any,
                  decoder: CopyDecoder | BinaryCopyDecoder | ArrowCopyDecoder,
                  target: _Target) -> None:  # fmt: skip
    """``_write``, cancelled (57014) by a CancelRequest (``rang``: the COPY's bell) or once
    the COPY's ``statement_timeout`` deadline passes: the statement's time runs from the
    COPY's start to the end of its insert, as in PostgreSQL. Both are checked before each
    of the insert's statements (every statement clears the session's cancel flag, and
    interrupting an idle DuckDB cursor does nothing: review R1 round 17, F1 and F9); the
    statement running when they come is interrupted (the CancelRequest's
    ``Session.cancel``, the deadline's timer)."""

    def in_time() -> None:
        if deadline is not None and time.monotonic() >= deadline:
            raise QueryCanceledError("canceling statement due to statement timeout")
        if rang():
            raise QueryCanceledError("canceling statement due to user request")

    in_time()
    if deadline is None:
        _write(session, decoder, target, in_time)
        return
    timer = threading.Timer(max(0.0, deadline - time.monotonic()), session.cancel)
    timer.daemon = True
    timer.start()
    try:
        _write(session, decoder, target, in_time)
    except QueryCanceledError as error:
        if not timer.is_alive() and not rang():  # it fired: say why, as PostgreSQL
            raise QueryCanceledError("canceling statement due to statement timeout") from error
        raise
    finally:
        timer.cancel()


def _write(session: Any, decoder: CopyDecoder | BinaryCopyDecoder | ArrowCopyDecoder,
           target: _Target, in_time: Callable[[], None] | None = None) -> None:  # fmt: skip
    """Check every value against its column type, then insert all rows (worker thread).

    Text and CSV rows are held as text (bytes for BLOB columns); DuckDB casts them to the
    column types, after a probe with TRY_CAST has found no value that does not convert.
    Binary and Arrow rows come typed: DuckDB casts them (a value that does not fit is its
    error, and nothing is written)."""
    strings = decoder.to_arrow()
    if in_time is not None:
        in_time()
    names = [f"c{index}" for index in range(len(target.columns))]
    relation = strings.rename_columns([*names, LINE_COLUMN])
    checks = [
        (index, name, kind) for index, (name, kind) in enumerate(zip(names, target.duckdb_types,
                                                                     strict=True))
        if kind not in ("VARCHAR", "BLOB") and isinstance(decoder, CopyDecoder)
    ]  # fmt: skip
    if checks:
        flags = ", ".join(f"({n} IS NOT NULL AND (TRY_CAST({n} AS {k}) IS NULL"
                          f"{_NOT_AN_INTEGER.format(n) if k in _INTEGER_TYPES else ''})) AS bad{i}"
                          for i, n, k in checks)  # fmt: skip
        condition = " OR ".join(f"bad{i}" for i, _, _ in checks)
        probe = (f"SELECT * FROM (SELECT {LINE_COLUMN}, {', '.join(names)}, {flags} FROM "
                 f"{{relation}}) WHERE {condition} ORDER BY {LINE_COLUMN} LIMIT 1")  # fmt: skip
        found = run_over_relation(session, relation, [probe], in_time)[0].table
        assert found is not None
        if found.num_rows:
            _raise_bad_value(found.to_pylist()[0], checks, target, decoder.relation)
    order = f" ORDER BY {LINE_COLUMN}" if target.ordered else ""
    select = ", ".join(f"CAST({n} AS {k})" for n, k in zip(names, target.duckdb_types,
                                                           strict=True))  # fmt: skip
    step = limits.BATCH_MESSAGES_MAX if target.ordered else relation.num_rows
    lines = relation.column(LINE_COLUMN).to_pylist()
    texts = []
    for start in range(0, relation.num_rows, step):
        first, last = lines[start], lines[min(start + step, relation.num_rows) - 1]
        texts.append(f"{target.insert_head} SELECT {select} FROM {{relation}} WHERE "
                     f"{LINE_COLUMN} BETWEEN {first} AND {last}{order}")  # fmt: skip
    run_over_relation(session, relation, texts, in_time)


# PostgreSQL's integer input (blanks, a sign, digits, blanks): DuckDB's cast also reads
# 1.5 (rounded), 1e2, 0x10 and 1_000, which PostgreSQL refuses (22P02).
_INTEGER_TYPES = frozenset(("SMALLINT", "INTEGER", "BIGINT"))
_NOT_AN_INTEGER = " OR NOT regexp_full_match({0}, '\\s*[+-]?[0-9]+\\s*')"
_INTEGER_TEXT = re.compile(r"\s*[+-]?[0-9]+\s*", re.ASCII)


def _raise_bad_value(row: dict[str, Any], checks: list[tuple[int, str, str]], target: _Target,
                     relation: str) -> None:  # fmt: skip
    for index, name, kind in checks:
        if row[f"bad{index}"]:
            column, value = target.columns[index], row[name]
            where = f'COPY {relation}, line {row[LINE_COLUMN]}, column {column}: "{value}"'
            if kind in _INTEGER_TYPES and _INTEGER_TEXT.fullmatch(value):  # DuckDB's refusal
                raise NumericValueOutOfRangeError(
                    f'value "{value}" is out of range for type {kind.lower()}', where=where)
            raise InvalidTextRepresentationError(
                f'invalid input syntax for type {kind.lower()}: "{value}"', where=where)
    raise AssertionError("a probed row has a bad column")
