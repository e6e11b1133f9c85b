"""What the bulk-commit tests share: ``COMMIT WRITES`` of staged writes in a session of
their own."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from engine import bulk_write
from engine.database import Database


def commit_writes(database: Any, batch_id: int, write_ids: list[str], sink: str = "s") -> dict:
    """Commit ``write_ids`` as ``(sink, batch_id)``; the commit's answer."""
    session = database.connect()
    try:
        return bulk_write.for_database(database).commit(session, sink, batch_id, write_ids)
    finally:
        session.close()


@contextlib.contextmanager
def topic_for_alice_and_bob(tmp_path: Path) -> Iterator[Database]:
    """A database (no retention thread) with topic ``t`` of 2 partitions that users
    ``alice`` and ``bob`` may insert into; closed on exit."""
    db = Database.open(str(tmp_path / "data"), retention_interval_s=None)
    session = db.connect()
    session.execute("CREATE TOPIC t WITH (min_active_partitions = 2)")
    session.execute("GRANT INSERT ON TOPIC t TO alice")
    session.execute("GRANT INSERT ON TOPIC t TO bob")
    session.close()
    try:
        yield db
    finally:
        db.close()


def messages_by_partition(database: Any, partitions: int = 2) -> dict[int, list[bytes]]:
    """Topic ``t``'s messages (``data``) per partition, in offset order."""
    session = database.connect()
    try:
        table = session.execute('SELECT partition, data FROM TOPIC t ORDER BY "offset"')[-1].table
    finally:
        session.close()
    found: dict[int, list[bytes]] = {p: [] for p in range(partitions)}
    for row in table.to_pylist():
        found[row["partition"]].append(row["data"])
    return found


def stage_batch(database: Any, write_id: str, batch: Any, rows_per_append: int) -> None:
    """Stage ``batch`` for topic ``t`` under ``write_id`` (a session of its own), appended
    in slices of ``rows_per_append`` rows, as a COPY's batches arrive."""
    session = database.connect()
    try:
        bulk = bulk_write.for_database(database)
        bulk.start(session, write_id, "topic", "t")
        slices = [batch.slice(s, rows_per_append) for s in range(0, batch.num_rows,
                                                                rows_per_append)]  # fmt: skip
        bulk.append(session, write_id, slices, batch.schema)
    finally:
        session.close()
