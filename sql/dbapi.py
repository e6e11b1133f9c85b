"""DB-API 2.0 (PEP 249) over an in-process Topicbase database.

``connect(path)`` opens the data directory through ``engine.Database.open`` (shared by
every connection of the process, reference-counted) and gives the connection its own
engine session. So several connections in one process see one database, each with its
own transaction.

Transactions follow psycopg: with ``autocommit = False`` (the default) the first
statement after connect, ``commit()`` or ``rollback()`` opens a transaction with
``BEGIN``; ``commit()`` / ``rollback()`` end it. Statements that are transaction control
themselves (``BEGIN``, ``COMMIT``, ``ROLLBACK``) are sent as they are. Topic DDL
(``CREATE/ALTER/DROP TOPIC``) cannot run inside a transaction block, like PostgreSQL's
``CREATE DATABASE``: run it on a connection with ``autocommit = True``. After an error
inside a transaction every statement fails with 25P02 until ``rollback()``; ``commit()``
of such a transaction rolls it back and raises 25P02, so a failed commit is never
mistaken for a successful one (pgjdbc does the same).

Parameters: ``?`` placeholders with a sequence (``paramstyle = "qmark"``); ``$1``-style
numbered placeholders with a sequence as well; a mapping binds DuckDB's ``$name``
placeholders, and ``$1`` through the keys ``1``/``"1"``. A script of several statements
runs them in order with the same parameters; the cursor then holds the first result
and ``nextset()`` moves to the next, as in psycopg.

Errors: every ``TopicbaseError`` becomes the PEP 249 class its SQLSTATE class maps to
(the mapping psycopg uses, see ``_CLASS_OF_SQLSTATE``), with ``.sqlstate`` and
``.message`` unchanged and the original error as ``__cause__``.

Thread safety: level 2, threads may share the module and connections, not cursors. A
connection serialises its own statements with a lock; connections run in parallel as
far as the engine lets them (its commit step is serialised).
"""

from __future__ import annotations

import datetime
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa

from engine.api import Database, Result, Session, SessionState, ast, parse_one, parse_statements
from sql.formatting import iter_rows
from sql.internal_error import internal_error
from storage.errors import TopicbaseError

apilevel = "2.0"
threadsafety = 2
paramstyle = "qmark"

_TRANSACTION_CONTROL = (ast.Begin, ast.Commit, ast.Rollback)
_BEGIN = parse_one("BEGIN")
_COMMIT = parse_one("COMMIT")
_ROLLBACK = parse_one("ROLLBACK")


# -- exceptions (PEP 249) ------------------------------------------------------------------
class Warning(Exception):
    """PEP 249 ``Warning``."""


class Error(Exception):
    """Root of the DB-API errors; ``sqlstate`` is None for errors of this module itself."""

    def __init__(self, message: str, sqlstate: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.sqlstate = sqlstate

    def __str__(self) -> str:
        return self.message


class InterfaceError(Error):
    """PEP 249 ``InterfaceError``."""


class DatabaseError(Error):
    """PEP 249 ``DatabaseError``."""


class DataError(DatabaseError):
    """PEP 249 ``DataError``."""


class OperationalError(DatabaseError):
    """PEP 249 ``OperationalError``."""


class IntegrityError(DatabaseError):
    """PEP 249 ``IntegrityError``."""


class InternalError(DatabaseError):
    """PEP 249 ``InternalError``."""


class ProgrammingError(DatabaseError):
    """PEP 249 ``ProgrammingError``."""


class NotSupportedError(DatabaseError):
    """PEP 249 ``NotSupportedError``."""


# SQLSTATE class (first two characters) -> exception, as psycopg maps them.
_CLASS_OF_SQLSTATE: dict[str, type[DatabaseError]] = {
    "08": OperationalError,
    "0A": NotSupportedError,
    "20": ProgrammingError,
    "21": ProgrammingError,
    "22": DataError,
    "23": IntegrityError,
    "24": InternalError,
    "25": InternalError,
    "26": InternalError,
    "27": OperationalError,
    "28": OperationalError,
    "2B": InternalError,
    "2D": InternalError,
    "2F": InternalError,
    "34": OperationalError,
    "38": InternalError,
    "39": InternalError,
    "3B": InternalError,
    "3D": ProgrammingError,
    "3F": ProgrammingError,
    "40": OperationalError,
    "42": ProgrammingError,
    "44": ProgrammingError,
    "53": OperationalError,
    "54": OperationalError,
    "55": OperationalError,
    "57": OperationalError,
    "58": OperationalError,
    "F0": InternalError,
    "HV": OperationalError,
    "P0": InternalError,
    "XX": InternalError,
}


def error_of(error: TopicbaseError) -> DatabaseError:
    """The DB-API exception for a Topicbase error: class by SQLSTATE, message unchanged."""
    kind = _CLASS_OF_SQLSTATE.get(error.sqlstate[:2], DatabaseError)
    return kind(error.message, error.sqlstate)


# -- type objects and constructors (PEP 249) -----------------------------------------------
class TypeCode(str):
    """A column's ``type_code``: the Arrow type's name, carrying the Arrow type."""

    arrow_type: pa.DataType

    def __new__(cls, arrow_type: pa.DataType) -> TypeCode:
        code = super().__new__(cls, str(arrow_type))
        code.arrow_type = arrow_type
        return code


class _TypeObject:
    """Compares equal to the type codes of one PEP 249 type group."""

    def __init__(self, name: str, *predicates: Any) -> None:
        self.name = name
        self._predicates = predicates

    def __eq__(self, other: object) -> bool:
        arrow_type = getattr(other, "arrow_type", None)
        return arrow_type is not None and any(test(arrow_type) for test in self._predicates)

    def __hash__(self) -> int:
        return hash(self.name)

    def __repr__(self) -> str:
        return self.name


STRING = _TypeObject("STRING", pa.types.is_string, pa.types.is_large_string)
BINARY = _TypeObject("BINARY", pa.types.is_binary, pa.types.is_large_binary)
NUMBER = _TypeObject("NUMBER", pa.types.is_integer, pa.types.is_floating, pa.types.is_decimal)
DATETIME = _TypeObject("DATETIME", pa.types.is_temporal)
ROWID = _TypeObject("ROWID")

Date = datetime.date
Time = datetime.time
Timestamp = datetime.datetime
Binary = bytes


def DateFromTicks(ticks: float) -> datetime.date:
    return Date(*time.localtime(ticks)[:3])


def TimeFromTicks(ticks: float) -> datetime.time:
    return Time(*time.localtime(ticks)[3:6])


def TimestampFromTicks(ticks: float) -> datetime.datetime:
    return Timestamp(*time.localtime(ticks)[:6])


# -- connection ----------------------------------------------------------------------------
def connect(path: str, *, autocommit: bool = False) -> Connection:
    """Open (creating if needed) the data directory at ``path``; a new session on it."""
    return Connection(path, autocommit=autocommit)


class Connection:
    def __init__(self, path: str, *, autocommit: bool = False) -> None:
        try:
            self._database = Database.open(path)
        except TopicbaseError as error:
            raise error_of(error) from error
        except OSError as error:  # e.g. the directory cannot be created
            raise OperationalError(f"cannot open {path}: {error}", "58030") from error
        try:
            self._session: Session = self._database.connect()
        except BaseException:
            self._database.close()
            raise
        self._autocommit = bool(autocommit)
        self._lock = threading.RLock()
        self._closed = False

    # -- PEP 249 ------------------------------------------------------------------------
    def cursor(self) -> Cursor:
        self._check_open()
        return Cursor(self)

    def commit(self) -> None:
        with self._lock:
            self._check_open()
            if self._session.state is SessionState.IDLE:
                return
            failed = self._session.state is SessionState.FAILED
            result = self._run_statement(_COMMIT, None)
            if failed or result.tag == "ROLLBACK":
                raise InternalError(
                    "the transaction was rolled back because a statement in it failed; "
                    "nothing was committed",
                    "25P02",
                )

    def rollback(self) -> None:
        with self._lock:
            self._check_open()
            if self._session.state is not SessionState.IDLE:
                self._run_statement(_ROLLBACK, None)

    def close(self) -> None:
        """Roll back an open transaction and release the session; closing twice is a no-op."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                self._session.close()
            finally:
                self._database.close()

    # -- extensions ---------------------------------------------------------------------
    @property
    def autocommit(self) -> bool:
        return self._autocommit

    @autocommit.setter
    def autocommit(self, value: bool) -> None:
        with self._lock:
            self._check_open()
            if self._session.state is not SessionState.IDLE:
                raise ProgrammingError(
                    "cannot change autocommit inside a transaction; commit or roll back first"
                )
            self._autocommit = bool(value)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def in_transaction(self) -> bool:
        return not self._closed and self._session.state is not SessionState.IDLE

    def execute(self, operation: str, parameters: Any = None) -> Cursor:
        """A new cursor that has run ``operation`` (as in sqlite3 and psycopg)."""
        return self.cursor().execute(operation, parameters)

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, kind: Any, value: Any, traceback: Any) -> None:
        """Commit on success, roll back on an exception, then close (psycopg's rule)."""
        try:
            if not self._closed:
                if kind is None:
                    self.commit()
                else:
                    self.rollback()
        finally:
            self.close()

    # -- running statements -------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise InterfaceError("the connection is closed", "08003")

    def _run(self, statements: list[ast.Statement], parameters: Any) -> list[Result]:
        with self._lock:
            self._check_open()
            return [self._run_one(statement, parameters) for statement in statements]

    def _run_one(self, statement: ast.Statement, parameters: Any) -> Result:
        if (
            not self._autocommit
            and self._session.state is SessionState.IDLE
            and not isinstance(statement, _TRANSACTION_CONTROL)
        ):
            self._run_statement(_BEGIN, None)
        return self._run_statement(statement, parameters)

    def _run_statement(self, statement: ast.Statement, parameters: Any) -> Result:
        try:
            return self._session.execute_statement(statement, parameters)
        except TopicbaseError as error:
            raise error_of(error) from error
        except Exception as error:  # a bug: logged with an id, XX000 without its text
            raise error_of(internal_error(error, "a DB-API statement")) from None


# -- cursor --------------------------------------------------------------------------------
Description = tuple[str, TypeCode, None, None, int | None, int | None, bool]


class Cursor:
    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self.arraysize = 1
        self.rowcount = -1
        self.lastrowid = None
        self.description: list[Description] | None = None
        self._results: list[Result] = []
        self._rows: Iterator[tuple[Any, ...]] = iter(())
        self._closed = False

    def execute(self, operation: str, parameters: Any = None) -> Cursor:
        statements = self._parse(operation)
        bound = _parameters(parameters)
        self._set_results(self.connection._run(statements, bound))
        return self

    def executemany(self, operation: str, seq_of_parameters: Any) -> Cursor:
        """Run ``operation`` once per parameter set; ``rowcount`` is the total changed."""
        statements = self._parse(operation)
        total = 0
        for parameters in seq_of_parameters:
            results = self.connection._run(statements, _parameters(parameters))
            counts = [result.rowcount for result in results]
            total = -1 if total < 0 or any(c < 0 for c in counts) else total + sum(counts)
        self._set_results([])
        self.rowcount = total
        return self

    def fetchone(self) -> tuple[Any, ...] | None:
        self._check_rows()
        return next(self._rows, None)

    def fetchmany(self, size: int | None = None) -> list[tuple[Any, ...]]:
        self._check_rows()
        count = self.arraysize if size is None else size
        rows = []
        for _ in range(count):
            row = next(self._rows, None)
            if row is None:
                break
            rows.append(row)
        return rows

    def fetchall(self) -> list[tuple[Any, ...]]:
        self._check_rows()
        return list(self._rows)

    def nextset(self) -> bool | None:
        """Move to the next statement's result of a multi-statement ``execute``."""
        self._check_open()
        if len(self._results) <= 1:
            return None
        self._set_results(self._results[1:])
        return True

    def close(self) -> None:
        self._closed = True
        self._results = []
        self._rows = iter(())

    def setinputsizes(self, sizes: Any) -> None:
        """PEP 249 lets this do nothing: parameter types come from the values."""

    def setoutputsize(self, size: Any, column: Any = None) -> None:
        """PEP 249 lets this do nothing: results are fetched whole."""

    def callproc(self, procname: str, parameters: Any = None) -> Any:
        raise NotSupportedError("stored procedures are not supported", "0A000")

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        return self

    def __next__(self) -> tuple[Any, ...]:
        row = self.fetchone()
        if row is None:
            raise StopIteration
        return row

    def __enter__(self) -> Cursor:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    # -- helpers ------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise InterfaceError("the cursor is closed")
        self.connection._check_open()

    def _check_rows(self) -> None:
        self._check_open()
        if self.description is None:
            raise ProgrammingError("the last statement returned no rows")

    def _parse(self, operation: str) -> list[ast.Statement]:
        self._check_open()
        if not isinstance(operation, str):
            raise ProgrammingError(f"the operation must be a str, not {type(operation).__name__}")
        try:
            statements = parse_statements(operation)  # the session's parse cache
        except TopicbaseError as error:
            raise error_of(error) from error
        except Exception as error:  # a bug: logged with an id, XX000 without its text
            raise error_of(internal_error(error, "parsing a DB-API operation")) from None
        if not statements:
            raise ProgrammingError("the operation holds no statement", "42601")
        return statements

    def _set_results(self, results: list[Result]) -> None:
        self._results = results
        current = results[0] if results else None
        table = None if current is None else current.table
        self.rowcount = -1 if current is None else current.rowcount
        self.description = None if table is None else _description(table.schema)
        self._rows = iter(()) if table is None else iter_rows(table)


def _description(schema: pa.Schema) -> list[Description]:
    described = []
    for field in schema:
        precision = scale = None
        if pa.types.is_decimal(field.type):
            precision, scale = field.type.precision, field.type.scale
        described.append((field.name, TypeCode(field.type), None, None, precision, scale, True))
    return described


def _parameters(parameters: Any) -> Any:
    """Parameters as the engine takes them: None, a list, or a dict with str keys."""
    if parameters is None:
        return None
    if isinstance(parameters, Mapping):
        return {str(key): value for key, value in parameters.items()}
    if isinstance(parameters, str | bytes | bytearray) or not isinstance(parameters, Sequence):
        raise ProgrammingError(
            "parameters must be a sequence (for ? or $1) or a mapping, "
            f"not {type(parameters).__name__}"
        )
    return list(parameters)
