"""What the bulk-commit tests share: ``COMMIT WRITES`` of staged writes in a session of
their own."""

from __future__ import annotations

from typing import Any

from engine import bulk_write


def commit_writes(database: Any, batch_id: int, write_ids: list[str], sink: str = "s") -> dict:
    """Commit ``write_ids`` as ``(sink, batch_id)``; the commit's answer."""
    session = database.connect()
    try:
        return bulk_write.for_database(database).commit(session, sink, batch_id, write_ids)
    finally:
        session.close()
