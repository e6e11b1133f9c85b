"""The one error hierarchy of Topicbase.

Every layer may import this module; it imports nothing of the project. Each
error class carries a PostgreSQL SQLSTATE in the class attribute ``sqlstate``;
fronts report ``sqlstate`` and the message unchanged. ``assert`` is for our own
bugs and is never turned into one of these errors.
"""

from __future__ import annotations

from typing import Any


class TopicbaseError(Exception):
    """Root of every error Topicbase raises on purpose.

    ``sqlstate`` is a five-character PostgreSQL error code. ``context`` holds
    optional structured details (file, position, setting name...) for fronts
    that want them; the message already says everything a person needs.
    """

    sqlstate: str = "XX000"

    def __init__(self, message: str, **context: Any) -> None:
        super().__init__(message)
        self.message = message
        self.context: dict[str, Any] = context

    def __str__(self) -> str:
        return self.message


# -- class 0A: feature not supported -------------------------------------------------
class FeatureNotSupportedError(TopicbaseError):
    sqlstate = "0A000"


# -- class 21: cardinality violation ------------------------------------------------
class CardinalityViolationError(TopicbaseError):
    """A statement would affect one row twice (``INSERT … ON CONFLICT DO UPDATE``)."""

    sqlstate = "21000"


# -- class 22: data exception ---------------------------------------------------------
class DataError(TopicbaseError):
    sqlstate = "22000"


class InvalidParameterValueError(DataError):
    """A setting or option has a value of the wrong type or out of range."""

    sqlstate = "22023"


class UnsupportedCodecError(InvalidParameterValueError):
    """A write used a codec the topic does not accept, or one not installed here."""


class InvalidBinaryDataError(DataError):
    sqlstate = "22P03"


class NumericValueOutOfRangeError(DataError):
    """A number outside the range its column can hold (``seq_no`` outside 0..2^63-1)."""

    sqlstate = "22003"


class DivisionByZeroError(DataError):
    sqlstate = "22012"


class DatetimeFieldOverflowError(DataError):
    """A timestamp outside the range readers can return (years 1..9999, finite)."""

    sqlstate = "22008"


class InvalidRowCountError(DataError):
    """A negative LIMIT or OFFSET (PostgreSQL's ``invalid_row_count_in_limit_clause``)."""

    sqlstate = "2201W"


class InvalidTextRepresentationError(DataError):
    """A value whose text is not of its type (``'x'::int``, bad bytea in COPY data).

    ``where`` (optional, keyword): the CONTEXT line of a COPY data error."""

    sqlstate = "22P02"


class CharacterNotInRepertoireError(DataError):
    """Text that is not UTF-8: a Python ``str`` with a lone surrogate (no UTF-8 bytes), or
    COPY data bytes that do not decode.

    ``where`` (optional, keyword): the CONTEXT line of a COPY data error."""

    sqlstate = "22021"


# -- class 23: integrity constraint violation -----------------------------------------------
class NotNullViolationError(TopicbaseError):
    sqlstate = "23502"


# -- class 25: invalid transaction state ------------------------------------------------
class InvalidTransactionStateError(TopicbaseError):
    sqlstate = "25000"


class InFailedTransactionError(InvalidTransactionStateError):
    sqlstate = "25P02"


class ActiveSqlTransactionError(InvalidTransactionStateError):
    """A statement that cannot run inside a transaction block (topic DDL)."""

    sqlstate = "25001"


class NoActiveSqlTransactionError(InvalidTransactionStateError):
    """A command that needs a transaction block outside one (SAVEPOINT, DECLARE … WITHOUT
    HOLD)."""

    sqlstate = "25P01"


# -- class 26/34: invalid SQL statement name, invalid cursor name ------------------------------
class UndefinedPreparedStatementError(TopicbaseError):
    sqlstate = "26000"


class DuplicatePreparedStatementError(TopicbaseError):
    """A PREPARE (or the protocol's Parse) of a name the session already holds."""

    sqlstate = "42P05"


class UndefinedCursorError(TopicbaseError):
    """A cursor or portal that does not exist."""

    sqlstate = "34000"


# -- class 40: transaction rollback ---------------------------------------------------
class SerializationFailure(TopicbaseError):
    """An optimistic check failed at commit; the transaction is safe to retry."""

    sqlstate = "40001"


# -- class 42: syntax error or access rule violation -----------------------------------
class SyntaxErrorOrAccessRuleViolation(TopicbaseError):
    """A statement the binder refused for a reason no narrower class names (DuckDB's
    binder errors are about the statement as written, never the server's bug)."""

    sqlstate = "42000"


class SqlSyntaxError(TopicbaseError):
    """A statement does not parse. ``line`` and ``column`` are 1-based."""

    sqlstate = "42601"

    def __init__(
        self, message: str, *, line: int | None = None, column: int | None = None, **context: Any
    ) -> None:
        super().__init__(message, **context)
        self.line = line
        self.column = column


class UndefinedObjectError(TopicbaseError):
    sqlstate = "42704"


class UndefinedTopicError(TopicbaseError):
    sqlstate = "42P01"


class DuplicateObjectError(TopicbaseError):
    sqlstate = "42710"


class DuplicateTopicError(TopicbaseError):
    sqlstate = "42P07"


class DuplicateTableError(TopicbaseError):
    """A table or view of that name exists (DuckDB's catalog error, mapped)."""

    sqlstate = "42P07"


class UndefinedFunctionError(TopicbaseError):
    sqlstate = "42883"


class UniqueViolationError(TopicbaseError):
    sqlstate = "23505"


class InvalidNameError(TopicbaseError):
    sqlstate = "42602"


class UndefinedColumnError(TopicbaseError):
    sqlstate = "42703"


class DuplicateColumnError(TopicbaseError):
    sqlstate = "42701"


class DatatypeMismatchError(TopicbaseError):
    """A value of another type than expected: rows whose schema differs from the one their
    write was started with, an array element of another type than its array's."""

    sqlstate = "42804"


class WrongObjectTypeError(TopicbaseError):
    """An operation on an object of a type it does not apply to: a field taken from a
    value that is no struct (PostgreSQL's "column notation .a applied to type integer,
    which is not a composite type")."""

    sqlstate = "42809"


class GroupingError(TopicbaseError):
    """A column neither grouped nor aggregated, or an aggregate where none may stand (in
    WHERE, in GROUP BY, nested in another aggregate)."""

    sqlstate = "42803"


class WindowingError(TopicbaseError):
    """A window function where none may stand (in WHERE, in another window's definition)."""

    sqlstate = "42P20"


class InvalidColumnReferenceError(TopicbaseError):
    """An ORDER BY or GROUP BY position that names no column of the select list."""

    sqlstate = "42P10"


class AmbiguousColumnError(TopicbaseError):
    """A column name that more than one relation of the FROM clause has."""

    sqlstate = "42702"


class DuplicateAliasError(TopicbaseError):
    """One name for two relations of a FROM clause."""

    sqlstate = "42712"


class AmbiguousFunctionError(TopicbaseError):
    """More than one function or operator fits the arguments equally well."""

    sqlstate = "42725"


class DuplicateCursorError(TopicbaseError):
    """A cursor or portal name already in use."""

    sqlstate = "42P03"


# -- class 53/54: resources and limits -------------------------------------------------
class InsufficientPrivilegeError(TopicbaseError):
    """Not allowed: a missing GRANT, or something the sandbox never allows (host files,
    the network, global settings, the internal catalog)."""

    sqlstate = "42501"


class StatementTooComplexError(TopicbaseError):
    """Nesting deeper than the parser and DuckDB may safely follow."""

    sqlstate = "54001"


class InsufficientResourcesError(TopicbaseError):
    sqlstate = "53000"


class DiskFullError(InsufficientResourcesError):
    """The operating system had no room left for a write (ENOSPC, EDQUOT): PostgreSQL's
    ``disk_full``. The statement fails; what it wrote is given back."""

    sqlstate = "53100"


class OutOfMemoryError(InsufficientResourcesError):
    """A statement needed more memory than its limit allows (and could not spill)."""

    sqlstate = "53200"


class TooManyConnectionsError(InsufficientResourcesError):
    sqlstate = "53300"


class ConfigurationLimitExceededError(InsufficientResourcesError):
    """A configured share of a resource the whole server draws on (temporary disk) would
    be passed: PostgreSQL's ``configuration_limit_exceeded``, the code of its
    ``temp_file_limit``. Retrying once others gave theirs back may work (unlike 54000)."""

    sqlstate = "53400"


class LimitExceededError(TopicbaseError):
    """A configured limit (message size, batch size, wait time...) was hit."""

    sqlstate = "54000"


class TooManyColumnsError(LimitExceededError):
    """A result with more columns than the PostgreSQL protocol's Int16 column count holds."""

    sqlstate = "54011"


# -- class 55: object not in prerequisite state ----------------------------------------
class ObjectNotInPrerequisiteStateError(TopicbaseError):
    sqlstate = "55000"


class PartitionInactiveError(ObjectNotInPrerequisiteStateError):
    """A write went to a partition that was split and is now read-only."""


class ObjectInUseError(TopicbaseError):
    """Another process owns the data directory."""

    sqlstate = "55006"


# -- class 57: operator intervention ---------------------------------------------------
class QueryCanceledError(TopicbaseError):
    sqlstate = "57014"


class IdleSessionTimeoutError(TopicbaseError):
    """A session idle (outside a transaction) past ``idle_session_timeout``; it is closed."""

    sqlstate = "57P05"


class IdleInTransactionSessionTimeoutError(InvalidTransactionStateError):
    """A session idle inside a transaction past ``idle_in_transaction_session_timeout``;
    its transaction is rolled back and the session closed."""

    sqlstate = "25P03"


# -- class 58: system error -------------------------------------------------------------
class StorageIOError(TopicbaseError):
    """The operating system refused a read, write or fsync."""

    sqlstate = "58030"


class PartitionFencedError(StorageIOError):
    """An fsync failed earlier; the partition refuses writes until it is reopened.

    After a failed fsync the kernel may have dropped dirty pages and cleared
    the error, so a later fsync could falsely succeed (PostgreSQL's
    "fsyncgate"). Reopening re-reads the file and recovers from what is there.
    """


# -- class XX: internal error -----------------------------------------------------------
class InternalError(TopicbaseError):
    """What a client sees of a bug (any exception that is not a TopicbaseError): a short
    id that names the log entry holding the traceback, never the exception's text."""

    sqlstate = "XX000"


class CorruptSegmentError(TopicbaseError):
    """A checksum or structure check failed inside the log, not at its torn tail."""

    sqlstate = "XX001"

    def __init__(self, message: str, *, path: str, position: int, **context: Any) -> None:
        super().__init__(f"{message} (file {path}, position {position})", **context)
        self.path = path
        self.position = position
