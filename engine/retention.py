"""Retention in the engine: the important-consumer guard and the periodic pass.

Storage deletes whole sealed segments by time and size (``storage.cleaner``) and
asks its caller for the lowest offset an important consumer still needs. The
engine answers from the catalog: for each partition, the smallest committed
offset of the topic's important consumers (0 for one that never committed, so
nothing it has not read goes). Committed offsets only grow and the catalog's are
applied after their commit is durable, so the guard may lag behind, never run ahead:
a lagging answer keeps more, never less.

A pass runs under the commit lock, one topic at a time, so DDL (which also takes
it) never drops or alters a topic in the middle of its pass; commits wait at most
for one topic's segment deletions. ``RetentionService`` runs a pass every
``interval_s`` seconds in a daemon thread, as Kafka's log cleaner checks
retention periodically; a failing pass is logged and retried at the next tick.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from storage.cleaner import RetentionReport, apply_retention

log = logging.getLogger(__name__)

DEFAULT_RETENTION_INTERVAL_S = 60.0


class ImportantConsumersGuard:
    """``storage.cleaner.RetentionGuard`` backed by the engine's catalog."""

    def __init__(self, database: Any) -> None:
        self._database = database

    def protected_offset(self, topic_id: str, partition_id: int) -> int | None:
        catalog = self._database.catalog
        entry = next((e for e in catalog.entries() if e.topic_id == topic_id), None)
        if entry is None:
            return None  # dropped meanwhile: nobody reads it any more
        important = [c for c, settings in entry.consumers.items() if settings.get("important")]
        committed = [catalog.committed(topic_id, c, partition_id) or 0 for c in important]
        return min(committed, default=None)


def run_retention_pass(database: Any) -> RetentionReport:
    """One retention pass over every topic; the totals of what was deleted."""
    total = RetentionReport()
    guard = ImportantConsumersGuard(database)
    for entry in database.catalog.entries():
        with database.commit_lock:
            if database.catalog.entry(entry.name) is not entry:
                continue  # dropped or altered since the list was taken: next pass
            topic = database.topic_log(entry.topic_id)
            report = apply_retention(topic, guard, database.clock.now_us())
        if report.segments_deleted or report.partitions_removed:
            log.info(
                "retention: topic %s: %d segments, %d bytes, %d inactive partitions deleted",
                entry.name,
                report.segments_deleted,
                report.bytes_deleted,
                report.partitions_removed,
            )
        total.segments_deleted += report.segments_deleted
        total.bytes_deleted += report.bytes_deleted
        total.partitions_removed += report.partitions_removed
    return total


class RetentionService:
    """Runs ``run_retention_pass`` every ``interval_s`` seconds until ``stop``."""

    def __init__(self, database: Any, interval_s: float) -> None:
        assert interval_s > 0
        self._database = database
        self._interval_s = interval_s
        self._stopping = threading.Event()
        self.passes = 0
        self._thread = threading.Thread(target=self._loop, name="topicbase-retention", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stopping.wait(self._interval_s):
            try:
                run_retention_pass(self._database)
            except Exception:
                log.exception("retention pass failed; retrying at the next tick")
            self.passes += 1

    def stop(self) -> None:
        """Stop the thread; a pass under way finishes first."""
        self._stopping.set()
        if self._thread is not threading.current_thread():
            self._thread.join()
