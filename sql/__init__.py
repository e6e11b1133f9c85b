"""The SQL fronts of Topicbase: the ``topicbase`` console and DB-API 2.0 ``connect()``.

Fronts format results and errors; they hold no database logic. ``sql.connect`` is
``sql.dbapi.connect``; the rest of PEP 249 (exceptions, type objects, ``apilevel``...)
lives in ``sql.dbapi`` and is re-exported here, imported on first use (PEP 562): the
console's ``serve``, ``user`` and ``--help`` need no engine, and a process that starts
one of them does not pay for importing it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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


def __getattr__(name: str) -> Any:
    """``sql.dbapi``'s name ``name`` (one of ``__all__``), imported on first use."""
    if name not in __all__:
        raise AttributeError(f"module 'sql' has no attribute {name!r}")
    from sql import dbapi

    value = getattr(dbapi, name)
    globals()[name] = value
    return value
