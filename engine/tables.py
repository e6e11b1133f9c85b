"""DuckDB: the only module of Topicbase that imports ``duckdb``.

Holds the database file beside the store (``<data>/tables.duckdb``), hands out
one cursor per session, and translates DuckDB's exceptions into Topicbase
errors with a PostgreSQL SQLSTATE. DuckDB gives each cursor its own
transaction context (MVCC); a write-write conflict surfaces as
``SerializationFailure`` (40001).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import duckdb
import pyarrow as pa

from storage import errors

TABLES_FILE = "tables.duckdb"


class UndefinedColumnError(errors.TopicbaseError):
    sqlstate = "42703"


class UndefinedFunctionError(errors.TopicbaseError):
    sqlstate = "42883"


class UniqueViolationError(errors.TopicbaseError):
    sqlstate = "23505"


class NotNullViolationError(errors.TopicbaseError):
    sqlstate = "23502"


class NumericOutOfRangeError(errors.TopicbaseError):
    sqlstate = "22003"


class DivisionByZeroError(errors.TopicbaseError):
    sqlstate = "22012"


class InvalidTextRepresentationError(errors.TopicbaseError):
    sqlstate = "22P02"


class DuplicateTableError(errors.TopicbaseError):
    sqlstate = "42P07"


Connection = duckdb.DuckDBPyConnection


# PostgreSQL's arithmetic in DuckDB's SQL: ``/`` of integers is integer division (5/2 = 2)
# and any division by zero raises (22012), where DuckDB would give 2.5 and inf or NULL.
DIALECT_CONFIG = {"integer_division": True, "error_on_division_by_zero": True}


def connect(path: str, *, read_only: bool = False) -> Connection:
    """Open the DuckDB file (or ``:memory:``), refusing a file another process holds.

    ``read_only`` opens an existing file without ever writing it (``topicbase check``).
    """
    try:
        return duckdb.connect(path, read_only=read_only, config=dict(DIALECT_CONFIG))
    except duckdb.IOException as error:
        raise errors.ObjectInUseError(f"cannot open {path}: {error}") from error


def translate(error: duckdb.Error) -> errors.TopicbaseError:
    """Map a DuckDB exception to a Topicbase error carrying a SQLSTATE."""
    message = str(error)
    text = _strip_prefix(message)
    lowered = message.lower()
    if isinstance(error, duckdb.ParserException):
        return errors.SqlSyntaxError(text)
    if "transaction is aborted" in lowered:
        return errors.InFailedTransactionError(
            "current transaction is aborted, commands ignored until end of transaction block"
        )
    if isinstance(error, duckdb.TransactionException) or "conflict" in lowered:
        return errors.SerializationFailure(
            f"could not serialize access due to concurrent update: {text}"
        )
    if isinstance(error, duckdb.ConstraintException):
        if "not null" in lowered:
            return NotNullViolationError(text)
        return UniqueViolationError(text)
    if isinstance(error, duckdb.CatalogException):
        if "already exists" in lowered:
            return DuplicateTableError(text)
        if "function" in lowered or "macro" in lowered:
            return UndefinedFunctionError(text)
        return errors.UndefinedTopicError(text)
    if isinstance(error, duckdb.BinderException):
        if "column" in lowered or "referenced" in lowered:
            return UndefinedColumnError(text)
        if "function" in lowered:
            return UndefinedFunctionError(text)
        return errors.TopicbaseError(text)
    if isinstance(error, duckdb.OutOfRangeException):
        return NumericOutOfRangeError(text)
    if "division by zero" in lowered:
        return DivisionByZeroError("division by zero")  # PostgreSQL's words, no DuckDB advice
    if isinstance(error, duckdb.ConversionException | duckdb.InvalidInputException):
        return InvalidTextRepresentationError(text)
    if isinstance(error, duckdb.IOException):
        return errors.StorageIOError(text)
    if isinstance(error, duckdb.NotImplementedException):
        return errors.FeatureNotSupportedError(text)
    if isinstance(error, duckdb.InterruptException):
        return errors.QueryCanceledError("canceling statement due to user request")
    return errors.TopicbaseError(text)


def _strip_prefix(message: str) -> str:
    return re.sub(r"^[A-Za-z ]+ Error: ", "", message, count=1)


@contextmanager
def translated(line_offset: int = 0) -> Iterator[None]:
    """Run a block, turning DuckDB exceptions into Topicbase errors.

    ``line_offset`` moves the ``LINE n:`` of DuckDB's syntax errors to the
    statement's place in its script.
    """
    try:
        yield
    except duckdb.Error as error:
        translated_error = translate(error)
        if line_offset and isinstance(translated_error, errors.SqlSyntaxError):
            translated_error = _shift_lines(translated_error, line_offset)
        raise translated_error from error
    except RuntimeError as error:  # DuckDB reports an interrupt this way
        if "interrupted" in str(error).lower():
            raise errors.QueryCanceledError(
                "canceling statement due to user request"
            ) from error
        raise


def _shift_lines(error: errors.SqlSyntaxError, offset: int) -> errors.SqlSyntaxError:
    def shift(match: re.Match[str]) -> str:
        return f"LINE {int(match.group(1)) + offset}:"

    message = re.sub(r"LINE (\d+):", shift, error.message)
    # Keep the caret under the same character: the "LINE n: " prefix may have grown.
    old_prefix = re.search(r"LINE (\d+): ", error.message)
    if old_prefix:
        grown = len(str(int(old_prefix.group(1)) + offset)) - len(old_prefix.group(1))
        if grown:
            lines = message.split("\n")
            message = "\n".join(
                " " * grown + line if set(line.strip()) == {"^"} else line for line in lines
            )
    return errors.SqlSyntaxError(message)


def run(cursor: Connection, sql: str, parameters: Any = None) -> None:
    with translated():
        cursor.execute(sql, parameters)


def query_arrow(
    cursor: Connection, sql: str, parameters: Any = None, *, line_offset: int = 0
) -> pa.Table | None:
    """Run ``sql``; return its result as Arrow (DML gives DuckDB's one-row ``Count``).

    None when the statement produced no relation at all.
    """
    with translated(line_offset):
        relation = cursor.sql(sql, params=parameters or None)
        if relation is None:
            return None
        return relation.to_arrow_table()


def execute_count(
    cursor: Connection, sql: str, parameters: Any = None, *, line_offset: int = 0
) -> int | None:
    """Run a statement that returns no rows; the number of rows it changed, if DuckDB says.

    Cheaper than ``query_arrow`` for DML: no Arrow result is built.
    """
    with translated(line_offset):
        cursor.execute(sql, parameters or None)
        if cursor.description is None or cursor.description[0][0] != "Count":
            return None
        row = cursor.fetchone()
        return None if row is None else int(row[0])


def register(cursor: Connection, name: str, table: pa.Table) -> None:
    with translated():
        cursor.register(name, table)


def unregister(cursor: Connection, name: str) -> None:
    with translated():
        cursor.unregister(name)


def interrupt(cursor: Connection) -> None:
    cursor.interrupt()


def batch_reader(
    cursor: Connection, sql: str, parameters: Any, batch_rows: int
) -> tuple[pa.RecordBatchReader, list[str]]:
    """Start a query; its Arrow batch reader and DuckDB's type name of each column.

    The caller translates errors (``translated``) and must close the reader before the
    cursor runs anything else."""
    relation = cursor.sql(sql, params=parameters or None)
    assert relation is not None, "only queries that return rows are streamed"
    duckdb_types = [str(t) for t in relation.types]
    return relation.to_arrow_reader(batch_rows), duckdb_types
