"""Results read in bounded batches: the engine side of COPY TO and DECLARE.

A front that must not hold a whole result (COPY … TO STDOUT, a cursor over a large query)
asks the session for a ``RowStream`` (``Session.open_stream``). A *plain query* (one
DuckDB query over tables that returns rows: no topic scan, no write, no view the engine
registers first) is read through DuckDB's Arrow record-batch reader, ``BATCH_ROWS`` rows
at a time; anything else runs as an ordinary statement and its result is cut into
batches (``from_result``). Either way the statement went through the session's door:
planned, then checked by the sandbox and privileges, then run.

Invariants:

- DuckDB allows no other statement on a cursor while one of its results is open, so a
  stream must be closed before its session runs anything else; the session refuses
  other statements while one is open (``Session._require_no_stream``).
- ``close`` is idempotent and always cancels the statement deadline.
- A DuckDB error while reading a batch inside an explicit transaction fails the
  transaction (25P02 until ROLLBACK), as any failed statement does.

Thread-safety: a stream belongs to its session and is read from one thread at a time.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pyarrow as pa

from engine import tables
from engine.result import Rows
from storage.errors import QueryCanceledError

BATCH_ROWS = 8192  # rows of one batch read from DuckDB


@dataclass
class RowStream:
    """The batches of one result, read one at a time.

    ``duckdb_types`` holds DuckDB's own type names when the rows come straight from
    DuckDB (they tell UUID and JSON from text), else None. ``whole``: the whole result as
    ``Rows`` when DuckDB's rows were read whole already (``tables.RowsReader``), for a
    reader that takes them at once (``take_whole``) instead of as Arrow batches.
    """

    schema: pa.Schema
    notices: tuple[str, ...]
    duckdb_types: list[str] | None
    _batches: Iterator[pa.RecordBatch]
    _close: Callable[[], None] = field(default=lambda: None)
    row_count: int = 0
    whole: Rows | None = None

    def take_whole(self) -> Rows | None:
        """The whole result as ``Rows`` (with this stream's ``schema``) if it was read
        whole and no batch was read yet, the stream then at its end; else None (read the
        batches)."""
        whole, self.whole = self.whole, None
        if whole is None or self.row_count:
            return None
        self._batches = iter(())
        self.row_count = whole.num_rows
        return whole

    def next_batch(self) -> pa.RecordBatch | None:
        """The next non-empty batch, or None at the end."""
        self.whole = None  # read as batches from now on
        for batch in self._batches:
            if batch.num_rows:
                self.row_count += batch.num_rows
                return batch
        return None

    def close(self) -> None:
        close, self._close = self._close, lambda: None
        close()


def named(table: pa.Table, names: tuple[str, ...] | None) -> pa.Table:
    """``table`` with its columns renamed to ``names`` (PostgreSQL's result column names,
    ``RunQuery.column_names``), if there is one name per column."""
    if names is None or table.num_columns != len(names) or table.column_names == list(names):
        return table
    return table.rename_columns(list(names))


def from_table(table: pa.Table, notices: tuple[str, ...] = ()) -> RowStream:
    """A stream over a result the engine already holds whole."""
    return RowStream(
        table.schema, notices, None, iter(table.to_batches(max_chunksize=BATCH_ROWS))
    )


def answered(
    result: pa.Table | Rows, duckdb_types: list[str], names: tuple[str, ...] | None
) -> RowStream:
    """A stream over a result the engine answered beside DuckDB (``engine.key_lookup``),
    shaped as ``duckdb_stream`` shapes DuckDB's: the columns given ``names``, ``Rows``
    offered whole (their Arrow built only if a batch is asked for)."""
    schema = result.schema
    if names is not None and len(names) == len(schema):
        schema = pa.schema([f.with_name(n) for f, n in zip(schema, names, strict=True)])

    def batches() -> Iterator[pa.RecordBatch]:
        table = result.to_arrow() if isinstance(result, Rows) else result
        for batch in table.to_batches(max_chunksize=BATCH_ROWS):
            yield pa.RecordBatch.from_arrays(batch.columns, schema=schema)

    whole = Rows(result.rows, schema) if isinstance(result, Rows) else None
    return RowStream(schema, (), duckdb_types, batches(), whole=whole)


class Deadline:
    """A statement timeout over a batched read: calls ``cancel`` when it passes."""

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


@contextlib.contextmanager
def translated(line_offset: int, deadline: Deadline | None) -> Iterator[None]:
    """DuckDB errors as Topicbase errors; a cancel by ``deadline`` says it was the timeout."""
    try:
        with tables.translated(line_offset):
            yield
    except QueryCanceledError as error:
        if deadline is not None and deadline.fired.is_set():
            raise QueryCanceledError("canceling statement due to statement timeout") from error
        raise


def duckdb_stream(
    cursor: tables.Connection,
    sql: str,
    parameters: object,
    line_offset: int,
    deadline: Deadline | None,
    on_error: Callable[[], None],
    on_close: Callable[[], None],
    names: tuple[str, ...] | None = None,
) -> RowStream:
    """Start ``sql`` on ``cursor`` and read it through DuckDB's Arrow batch reader; the
    columns are given ``names`` (see ``named``)."""
    try:
        with translated(line_offset, deadline):
            reader, duckdb_types = tables.batch_reader(cursor, sql, parameters, BATCH_ROWS)
    except BaseException:
        if deadline is not None:
            deadline.cancel()
        on_error()
        raise

    schema = reader.schema
    if names is not None and len(names) == len(schema):
        schema = pa.schema([f.with_name(n) for f, n in zip(schema, names, strict=True)])

    def batches() -> Iterator[pa.RecordBatch]:
        while True:
            try:
                with translated(line_offset, deadline):
                    try:
                        batch = reader.read_next_batch()
                    except StopIteration:
                        return
            except BaseException:
                on_error()
                raise
            yield pa.RecordBatch.from_arrays(batch.columns, schema=schema)

    def close() -> None:
        if deadline is not None:
            deadline.cancel()
        try:
            reader.close()
        finally:
            on_close()

    whole = None
    if isinstance(reader, tables.RowsReader):
        whole = Rows(reader.rows.rows, schema)
    return RowStream(schema, (), duckdb_types, batches(), close, whole=whole)
