"""Plans of ``COMMIT WRITES`` and ``ABORT WRITES``: the SQL side of staged bulk writes.

A client (the Spark catalog's JVM writer, any SQL client) stages rows with ``COPY ...
FROM STDIN (FORMAT arrow, WRITE_ID 'id')`` and then publishes a set of staged writes
exactly once with ``COMMIT WRITES ('id', ...) SINK 's' BATCH n``, or discards them with
``ABORT WRITES ('id', ...)``. Both run in ``engine.write_statements`` with the semantics
of the Arrow Flight door's ``commit`` and ``abort`` actions (``engine.bulk_write``).

Pure: the plan holds the statement's values; nothing is looked up here (a write's target
and owner are checked when it runs, as the Flight door checks them).
"""

from __future__ import annotations

from dataclasses import dataclass

from grammar import ast
from planner.catalog import Catalog
from planner.operations import Plan


@dataclass(frozen=True)
class CommitStagedWrites:
    """Publish ``write_ids`` with the idempotency record ``(sink_id, batch_id)``."""

    write_ids: tuple[str, ...]
    sink_id: str
    batch_id: int

    def describe(self) -> str:
        return (f"CommitStagedWrites {len(self.write_ids)} writes as sink {self.sink_id!r} "
                f"batch {self.batch_id}")  # fmt: skip


@dataclass(frozen=True)
class AbortStagedWrites:
    """Discard ``write_ids`` (unknown ids are ignored: an abort may be replayed)."""

    write_ids: tuple[str, ...]

    def describe(self) -> str:
        return f"AbortStagedWrites {len(self.write_ids)} writes"


def plan_commit_writes(statement: ast.CommitWrites, catalog: Catalog) -> Plan:
    operation = CommitStagedWrites(statement.write_ids, statement.sink_id, statement.batch_id)
    return Plan((operation,), "COMMIT WRITES")  # type: ignore[arg-type]


def plan_abort_writes(statement: ast.AbortWrites, catalog: Catalog) -> Plan:
    return Plan((AbortStagedWrites(statement.write_ids),), "ABORT WRITES")  # type: ignore[arg-type]
