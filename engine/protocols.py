"""What the engine's lower modules need of a ``Database`` or a ``Session``, as protocols.

A session runs statements over a database. Introspection (SHOW/DESCRIBE TOPIC, the sys
views), offset resets and bulk statements serve the session, so they must not import
``engine.database`` or ``engine.session`` (``Database.connect`` builds a ``Session``, and
the session imports them: an import circle, which ``tests/test_layers.py`` refuses).
They name these protocols instead. ``Database`` and ``Session`` satisfy them structurally:
nothing inherits from them or registers with them.

Invariant: each protocol holds just what its users read. A member added here is a promise
that both sides keep; ``tests/engine/test_protocols.py`` holds the real classes to it.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from engine.catalog import CatalogStore
    from engine.clock import Clock
    from engine.leases import LeaseRegistry
    from engine.result import Result
    from engine.transaction import SessionState
    from grammar import ast
    from storage.topic_log import TopicLog


@runtime_checkable
class TopicSource(Protocol):
    """What introspection and offset resets read of ``engine.database.Database``: the
    catalog, the clock, the consumers' leases, the lock that keeps publishing out while
    end offsets are read, and each topic's log."""

    @property
    def catalog(self) -> CatalogStore: ...

    @property
    def clock(self) -> Clock: ...

    @property
    def leases(self) -> LeaseRegistry: ...

    @property
    def publish_lock(self) -> AbstractContextManager[Any]: ...

    def topic_log(self, topic_id: str) -> TopicLog: ...


@runtime_checkable
class StatementRunner(Protocol):
    """What ``engine.bulk`` needs of ``engine.session.Session``: its id, its state, its
    DuckDB cursor (to register a relation on), running one parsed statement in the
    session's transaction, and leaving a view the session's rollback drops."""

    @property
    def session_id(self) -> int: ...

    @property
    def state(self) -> SessionState: ...

    @property
    def cursor(self) -> Any: ...  # a DuckDB connection (cursor) of the session's own

    def execute_statement(self, statement: ast.Statement, parameters: Any = None) -> Result: ...

    def drop_at_rollback(self, view: str) -> None: ...
