"""What the planner may know of the database: a read-only ``Catalog`` protocol.

The engine implements it; tests implement it with plain dicts. Planning stays
pure: no I/O, no DuckDB, no storage.
"""

from __future__ import annotations

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
