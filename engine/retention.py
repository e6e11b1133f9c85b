"""Retention in the engine: the consumers' guard and the periodic pass.

Storage deletes whole segments by time and size (``storage.cleaner``; an idle
partition's expired active segment is rolled first) and asks its caller for the
lowest offset some consumer still needs. The engine answers from the catalog, per
partition, with the smallest of:

- an important consumer's committed offset (0 for one that never committed, so
  nothing it has not read goes);
- for a consumer with an ``availability_period`` (YDB: it extends the retention of
  the messages the consumer has not committed up to that period; a bounded form of
  ``important``), its committed offset raised to the first message written within
  the period: what it has not committed and is younger than the period stays.

Committed offsets only grow and the catalog's are applied after their commit is
durable, so the guard may lag behind, never run ahead: a lagging answer keeps
more, never less.

Retention also never deletes a frame of a transaction whose commit record is not
checkpointed yet: recovery counts the rows of such a transaction still in a
partition and takes them as the share's leading rows (``published_prefix``), so a
deleted first frame would make it publish rows again (duplicates, or expired data
back). A pass therefore first takes every partition's end offset under the commit
lock after ``quiesce`` (no publish in flight, none can start), then checkpoints
(``checkpointed_ends``): below those ends every transactional frame's record is then
checkpointed, and they are the pass's floor; what is published after them waits
for the next pass. The floor applies to time- and size-based retention alike (it is
part of the guard). Likewise the source ranges of moves committed by reference to them
(``engine.moved_refs``) are kept until the checkpoint passes their records
(``Committer.moved_floor``: pinned under the commit lock, which the pass holds while it
deletes).

A pass runs under the commit lock, one topic at a time, so DDL (which also takes
it) never drops or alters a topic in the middle of its pass; commits wait at most
for one topic's segment deletions. ``RetentionService`` runs passes in a daemon
thread, as Kafka's log cleaner checks retention periodically: every ``interval_s``
seconds, or sooner when a topic's retention period is short (a quarter of the
shortest period, at least ``RETENTION_INTERVAL_MIN_S``; see ``pass_interval_s``),
so that a 1 s retention does not wait a minute. A failing pass is logged and
retried at the next tick.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from storage.cleaner import RetentionReport, apply_retention

log = logging.getLogger(__name__)

DEFAULT_RETENTION_INTERVAL_S = 60.0
# The shortest time between two passes when a topic's retention period is short
# (the background thread wakes this often at most to look at the periods).
RETENTION_INTERVAL_MIN_S = 1.0
# A pass runs at least every (shortest retention period / this).
RETENTION_INTERVAL_DIVISOR = 4


class ImportantConsumersGuard:
    """``storage.cleaner.RetentionGuard`` backed by the engine's catalog: important
    consumers and consumers with an ``availability_period`` (see the module doc)."""

    def __init__(self, database: Any) -> None:
        self._database = database

    def protected_offset(self, topic_id: str, partition_id: int) -> int | None:
        database = self._database
        catalog = database.catalog
        entry = next((e for e in catalog.entries() if e.topic_id == topic_id), None)
        if entry is None:
            return None  # dropped meanwhile: nobody reads it any more
        needed: list[int] = []
        for consumer, settings in entry.consumers.items():
            period = settings.get("availability_period")
            if not settings.get("important") and period is None:
                continue
            committed = catalog.committed(topic_id, consumer, partition_id) or 0
            if period is not None:
                # Messages written before now - period are no longer held back for it.
                horizon = database.clock.now_us() - int(period.total_seconds() * 1_000_000)
                partition = database.topic_log(topic_id).partition(partition_id)
                committed = max(committed, partition.offset_for_time(horizon))
            needed.append(committed)
        pinned = database.committer.moved_floor(topic_id, partition_id)
        if pinned is not None:
            needed.append(pinned)
        return min(needed, default=None)


class CheckpointedGuard:
    """A guard that also keeps every offset at or above the partition's checkpoint
    floor (``checkpointed_ends``); a partition the floors do not know (created since)
    keeps everything."""

    def __init__(self, inner: ImportantConsumersGuard, floors: dict[tuple[str, int], int]) -> None:
        self._inner = inner
        self._floors = floors

    def protected_offset(self, topic_id: str, partition_id: int) -> int | None:
        floor = self._floors.get((topic_id, partition_id), 0)
        needed = self._inner.protected_offset(topic_id, partition_id)
        return floor if needed is None else min(floor, needed)


def checkpointed_ends(database: Any) -> dict[tuple[str, int], int]:
    """Each partition's end offset, below which no frame belongs to a transaction whose
    commit record is still to be checkpointed (see the module doc).

    The ends are taken under the commit lock with no publish in flight (``quiesce``):
    every transaction with a frame below them has then finished its publish and is
    counted for the checkpoint (or failed, and is finished by the checkpoint first).
    The checkpoint then runs outside the commit lock, as the background one does, so
    commits wait only for the ends to be read. Raises if the checkpoint fails or is not whole (the
    pass is then retried; nothing is deleted meanwhile)."""
    floors: dict[tuple[str, int], int] = {}
    with database.commit_lock:
        database.committer.quiesce()
        for entry in database.catalog.entries():
            topic = database.topic_log(entry.topic_id)
            for partition_id in topic.partition_ids():
                floors[(entry.topic_id, partition_id)] = topic.partition(partition_id).end_offset
    database.committer.checkpoint_whole()
    return floors


def run_retention_pass(database: Any) -> RetentionReport:
    """One retention pass over every topic; the totals of what was deleted."""
    total = RetentionReport()
    guard = CheckpointedGuard(ImportantConsumersGuard(database), checkpointed_ends(database))
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


def pass_interval_s(database: Any, ceiling_s: float) -> float:
    """Seconds between passes: ``ceiling_s``, or a quarter of the shortest retention
    period of any topic when that is shorter, never below ``RETENTION_INTERVAL_MIN_S``
    (unless ``ceiling_s`` itself is lower: tests ask for fast passes)."""
    periods = []
    for entry in database.catalog.entries():
        period = entry.settings.get("retention_period")
        if period is not None:
            periods.append(period.total_seconds())
    if not periods:
        return ceiling_s
    adapted = max(RETENTION_INTERVAL_MIN_S, min(periods) / RETENTION_INTERVAL_DIVISOR)
    return min(ceiling_s, adapted)


class RetentionService:
    """Runs ``run_retention_pass`` every ``pass_interval_s`` seconds until ``stop``.

    The thread wakes at least every ``RETENTION_INTERVAL_MIN_S`` to recompute the
    interval, so a topic created (or altered) with a short retention period is
    served at its pace without waiting out a long interval.
    """

    def __init__(self, database: Any, interval_s: float) -> None:
        assert interval_s > 0
        self._database = database
        self._interval_s = interval_s
        self._stopping = threading.Event()
        self.passes = 0
        self._thread = threading.Thread(target=self._loop, name="topicbase-retention", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        clock = self._database.clock
        tick = min(self._interval_s, RETENTION_INTERVAL_MIN_S)
        last = clock.monotonic_s()
        while not self._stopping.wait(tick):
            try:
                due = clock.monotonic_s() - last >= pass_interval_s(
                    self._database, self._interval_s
                )
                if not due:
                    continue
                last = clock.monotonic_s()
                run_retention_pass(self._database)
            except Exception:
                log.exception("retention pass failed; retrying at the next tick")
            self.passes += 1

    def stop(self) -> None:
        """Stop the thread; a pass under way finishes first."""
        self._stopping.set()
        if self._thread is not threading.current_thread():
            self._thread.join()
