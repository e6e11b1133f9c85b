"""The SQL fronts of Topicbase: the ``topicbase`` console and DB-API 2.0 ``connect()``.

Fronts format results and errors; they hold no database logic. ``sql.connect`` is
``sql.dbapi.connect``; the rest of PEP 249 (exceptions, type objects, ``apilevel``...)
lives in ``sql.dbapi`` and is re-exported here.
"""

from __future__ import annotations

from sql.dbapi import (
    BINARY,
    DATETIME,
    NUMBER,
    ROWID,
    STRING,
    Connection,
    Cursor,
    DatabaseError,
    DataError,
    Error,
    IntegrityError,
    InterfaceError,
    InternalError,
    NotSupportedError,
    OperationalError,
    ProgrammingError,
    Warning,
    apilevel,
    connect,
    paramstyle,
    threadsafety,
)

__all__ = [
    "BINARY",
    "DATETIME",
    "NUMBER",
    "ROWID",
    "STRING",
    "Connection",
    "Cursor",
    "DataError",
    "DatabaseError",
    "Error",
    "IntegrityError",
    "InterfaceError",
    "InternalError",
    "NotSupportedError",
    "OperationalError",
    "ProgrammingError",
    "Warning",
    "apilevel",
    "connect",
    "paramstyle",
    "threadsafety",
]
