"""Retention: delete whole old segments by time and by size.

A sealed segment may go when all its messages are older than the topic's
retention period, or while the partition is over its size budget (oldest
first). Never deleted: the active segment, and anything at or above the
lowest offset an important consumer has not yet committed; storage asks its
caller for that offset through ``RetentionGuard``.

An idle partition (no appends, so no roll) would keep its expired active
segment forever: when every message of the active segment is past the
retention period and no guard protects any of it, the pass first rolls it
(``PartitionLog.roll_expired``, Kafka's rule) and then deletes it as any
sealed segment, in the same pass. The log start then equals the end offset.

An inactive partition (split by autopartitioning) whose data has all expired
and that no important consumer still needs is removed entirely. One that never
held a message stays: there is no write time to expire from, and its lineage
(its children name it as their parent) costs a few empty files.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from storage.errors import ObjectNotInPrerequisiteStateError
from storage.partition_log import PartitionLog
from storage.topic_log import TopicLog


class RetentionGuard(Protocol):
    def protected_offset(self, topic_id: str, partition_id: int) -> int | None:
        """Lowest offset some important consumer still needs, or None for no limit."""
        ...


class NoGuard:
    def protected_offset(self, topic_id: str, partition_id: int) -> int | None:
        return None


@dataclass(slots=True)
class RetentionReport:
    segments_deleted: int = 0
    bytes_deleted: int = 0
    partitions_removed: int = 0


def apply_retention(topic: TopicLog, guard: RetentionGuard, now_us: int) -> RetentionReport:
    """Run one retention pass over every partition of ``topic``."""
    report = RetentionReport()
    for partition_id in topic.partition_ids():
        partition = topic.partition(partition_id)
        protected = guard.protected_offset(topic.topic_id, partition_id)
        if not partition.active and _all_expired(partition, now_us, protected):
            size = partition.size_bytes
            try:
                topic.remove_partition(partition_id)
            except ObjectNotInPrerequisiteStateError:  # rows not synced or copied yet:
                continue  # removed by a later pass
            report.bytes_deleted += size
            report.partitions_removed += 1
            continue
        _roll_if_expired(partition, now_us, protected)
        limit = retention_limit(partition, now_us)
        if protected is not None:
            limit = min(limit, protected)
        before = partition.size_bytes
        report.segments_deleted += partition.delete_segments_before(limit)
        report.bytes_deleted += before - partition.size_bytes
    if topic.ledger is not None:  # the copies the copier kept for whole-frame reads age out
        topic.ledger.drop_kept_files(now_us, topic.config.retention_ms,
                                     topic.config.retention_bytes)  # fmt: skip
    return report


def retention_limit(partition: PartitionLog, now_us: int) -> int:
    """The offset below which whole sealed segments may be deleted."""
    config = partition.config
    segments = partition.segments[:-1]
    limit = partition.start_offset
    if config.retention_ms is not None:
        horizon = now_us - config.retention_ms * 1000
        for segment in segments:
            if segment.last_written_at_us is None or segment.last_written_at_us >= horizon:
                break
            limit = segment.next_offset
    if config.retention_bytes is not None:
        excess = partition.size_bytes - config.retention_bytes
        for segment in segments:
            if excess <= 0:
                break
            excess -= segment.size_bytes
            limit = max(limit, segment.next_offset)
    return limit


def _roll_if_expired(partition: PartitionLog, now_us: int, protected: int | None) -> None:
    """Roll the active segment when all of it expired and nothing of it is protected.

    A roll a guard would keep from deleting is skipped: it would only add an empty
    segment at every pass. ``roll_expired`` checks the times again under the write
    lock, so an append racing with this pass keeps its segment active.
    """
    retention_ms = partition.config.retention_ms
    if retention_ms is None:
        return
    if protected is not None and protected < partition.end_offset:
        return
    last = partition.segments[-1].last_written_at_us
    horizon = now_us - retention_ms * 1000
    if last is not None and last < horizon:
        partition.roll_expired(horizon)


def _all_expired(partition: PartitionLog, now_us: int, protected: int | None) -> bool:
    retention_ms = partition.config.retention_ms
    # The newest write of any segment: after a roll the active segment may be empty.
    segments = partition.segments
    written = [s.last_written_at_us for s in segments if s.last_written_at_us is not None]
    last = max(written, default=None)
    if retention_ms is None or (last is not None and last >= now_us - retention_ms * 1000):
        return False
    if partition.end_offset == 0:
        return False  # never held a message: nothing expired (see the module doc)
    return protected is None or protected >= partition.end_offset
