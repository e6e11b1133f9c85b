"""What the planner may know of the database: a read-only ``Catalog`` protocol.

The engine implements it; tests implement it with plain dicts. Planning stays
pure: no I/O, no DuckDB, no storage.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class TopicInfo:
    """A topic as the catalog knows it.

    ``settings`` are the normalised YDB topic settings as stored; ``consumers``
    maps each consumer name to its settings; ``partitions`` are the ids of all
    partitions (active and inactive), ``active_partitions`` the writable ones.
    """

    name: str
    topic_id: str
    settings: dict[str, Any]
    consumers: dict[str, dict[str, Any]]
    partitions: tuple[int, ...]
    active_partitions: tuple[int, ...] = field(default=())


class Catalog(Protocol):
    def topic(self, name: str) -> TopicInfo | None:
        """The topic called ``name``, or None."""
        ...

    def topic_names(self) -> list[str]: ...


@dataclass(frozen=True)
class SessionCatalog:
    """A ``Catalog`` seen from one session, which can also tell DuckDB's relations.

    ``has_duckdb_relation(name)`` is True when the session's DuckDB connection sees a
    table or view called ``name`` (case-insensitively, as DuckDB resolves names) where
    an unqualified name would find it (a ``main`` schema, or DuckDB's ``pg_catalog``).
    The planner asks it only for names that also name a topic, to decide whether a
    plain ``FROM name`` reads the table (tables win) or the topic (see
    ``planner.relations``). A plain ``Catalog`` without it never turns a plain
    relation into a topic read.
    """

    topics: Catalog
    has_duckdb_relation: Callable[[str], bool]

    def topic(self, name: str) -> TopicInfo | None:
        return self.topics.topic(name)

    def topic_names(self) -> list[str]:
        return self.topics.topic_names()
