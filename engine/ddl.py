"""Running topic DDL: storage and catalog change together.

CREATE makes the storage topic first, then commits the catalog row; a crash
in between leaves a storage topic the catalog does not list, which
``Database.open`` drops. DROP removes the catalog row first, then the files.
ALTER commits the new settings and adds partitions (never removes them).
"""

from __future__ import annotations

from typing import Any

from engine.catalog import OWNER_SUPERUSER, TopicEntry
from engine.clock import utc_from_us
from planner.operations import AlterTopicEntry, CreateTopicEntry, DropTopicEntry
from storage import limits
from storage.autopartition import AutoPartitioning
from storage.codecs import parse_codec_list
from storage.config import TopicConfig

MIB = 1024 * 1024
SEGMENT_MS_MIN = 60_000


def storage_config(settings: dict[str, Any], base: TopicConfig, partitions: int) -> TopicConfig:
    """The storage knobs implied by a topic's YDB settings.

    Retention deletes whole sealed segments, so segments roll by age at a quarter of
    the retention period (between a minute and the storage default): a message then
    goes at most 1.25 retention periods after it was written, however slow the topic.
    """
    retention = settings.get("retention_period")
    retention_ms = None if retention is None else int(retention.total_seconds() * 1000)
    storage_mb = int(settings.get("retention_storage_mb") or 0)
    return TopicConfig(
        partition_count=partitions,
        supported_codecs=parse_codec_list(settings.get("supported_codecs") or ("raw",)),
        fsync_policy=base.fsync_policy,
        segment_bytes=base.segment_bytes,
        segment_ms=segment_ms_for(retention_ms),
        retention_ms=retention_ms,
        retention_bytes=storage_mb * MIB if storage_mb else None,
        producer_expiry_ms=base.producer_expiry_ms,
        group_commit_window_us=base.group_commit_window_us,
    ).validate()


def autopartitioning_of(settings: dict[str, Any]) -> AutoPartitioning:
    """The autopartitioning and write-speed knobs implied by a topic's YDB settings."""
    window = settings.get("auto_partitioning_stabilization_window")
    return AutoPartitioning(
        strategy=str(settings.get("auto_partitioning_strategy") or "disabled"),
        up_percent=int(settings.get("auto_partitioning_up_utilization_percent") or 80),
        down_percent=int(settings.get("auto_partitioning_down_utilization_percent") or 30),
        window_us=300_000_000 if window is None else int(window.total_seconds() * 1_000_000),
        max_active=int(settings.get("max_active_partitions") or 0),
        write_speed=int(settings.get("partition_write_speed_bytes_per_second") or 0),
        burst=int(settings.get("partition_write_burst_bytes") or 0),
    ).validate()


def segment_ms_for(retention_ms: int | None) -> int:
    """Segment age at which a topic with this retention rolls (see ``storage_config``)."""
    if retention_ms is None:
        return limits.SEGMENT_MS_DEFAULT
    return min(limits.SEGMENT_MS_DEFAULT, max(SEGMENT_MS_MIN, retention_ms // 4))


def run_create(database: Any, operation: CreateTopicEntry, owner: str = OWNER_SUPERUSER) -> None:
    partitions = int(operation.settings["min_active_partitions"])
    base = TopicConfig(fsync_policy=database.fsync_policy)
    topic = database.store.create_topic(storage_config(operation.settings, base, partitions))
    try:
        auto = autopartitioning_of(operation.settings)
        if auto != topic.autopartitioning:
            topic.alter(topic.config, auto)
    except BaseException:
        database.store.drop_topic(topic.topic_id)
        raise
    entry = TopicEntry(
        operation.name,
        topic.topic_id,
        operation.settings,
        operation.consumers,
        utc_from_us(database.clock.now_us()),
    )
    try:
        database.catalog.add_topic(entry, owner)
    except BaseException:
        database.store.drop_topic(topic.topic_id)
        raise


def run_alter(database: Any, operation: AlterTopicEntry) -> None:
    entry = database.catalog.entry(operation.name)
    topic = database.topic_log(operation.topic_id)
    partitions = topic.config.partition_count + operation.added_partitions
    config = storage_config(operation.settings, topic.config, partitions)
    auto = autopartitioning_of(operation.settings)
    database.catalog.update_topic(
        TopicEntry(
            entry.name, entry.topic_id, operation.settings, operation.consumers, entry.created_at
        )
    )
    topic.alter(config, auto)


def run_drop(database: Any, operation: DropTopicEntry) -> None:
    entry = database.catalog.remove_topic(operation.name)
    database.store.drop_topic(entry.topic_id)
