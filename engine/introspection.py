"""SHOW TOPICS, DESCRIBE TOPIC and the ``sys.`` views, as Arrow tables.

``sys.topics``: one row per topic; ``sys.partitions``: start/end offsets,
bytes, active flag, parent; ``sys.consumers``: per consumer and partition the
committed offset and the lag in messages and in seconds (age of the oldest
unread message).

The lag counts from the consumer's position: its committed offset, or the log
start when retention deleted past it (the consumer reads on from there). A
partition that retention removes (inactive after a split, all its data expired)
leaves every view; one removed while a view is being built is skipped, not an error.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pyarrow as pa

from engine import privilege_views, routing
from engine.catalog import TopicEntry, encode_settings
from engine.clock import utc_from_us
from engine.protocols import TopicSource
from storage.errors import InvalidParameterValueError, StorageIOError
from storage.partition_log import PartitionLog
from storage.topic_log import TopicLog


def show_topics(database: TopicSource) -> pa.Table:
    rows = []
    for entry in database.catalog.entries():
        topic = database.topic_log(entry.topic_id)
        rows.append(
            {
                "name": entry.name,
                "partitions": len(topic.partition_ids()),
                "consumers": ",".join(sorted(entry.consumers)),
                "retention_period": _show(entry.settings.get("retention_period")),
                "supported_codecs": _show(entry.settings.get("supported_codecs")),
            }
        )
    return pa.Table.from_pylist(
        rows,
        schema=pa.schema(
            [
                ("name", pa.string()),
                ("partitions", pa.int32()),
                ("consumers", pa.string()),
                ("retention_period", pa.string()),
                ("supported_codecs", pa.string()),
            ]
        ),
    )


def topics_view(database: TopicSource) -> pa.Table:
    rows = []
    for entry in database.catalog.entries():
        topic = database.topic_log(entry.topic_id)
        rows.append(
            {
                "name": entry.name,
                "topic_id": entry.topic_id,
                "partitions": len(topic.partition_ids()),
                "active_partitions": len(topic.active_partition_ids()),
                "consumers": len(entry.consumers),
                "settings": encode_settings(entry.settings),
                "created_at": entry.created_at,
            }
        )
    schema = pa.schema(
        [
            ("name", pa.string()),
            ("topic_id", pa.string()),
            ("partitions", pa.int32()),
            ("active_partitions", pa.int32()),
            ("consumers", pa.int32()),
            ("settings", pa.string()),
            ("created_at", pa.timestamp("us", tz="UTC")),
        ]
    )
    return pa.Table.from_pylist(rows, schema=schema)


def _end_offsets(topic: TopicLog) -> dict[int, int]:
    ends = {}
    for partition_id in topic.partition_ids():
        try:
            ends[partition_id] = topic.partition(partition_id).end_offset
        except (InvalidParameterValueError, KeyError):
            continue  # removed by retention since the list was taken
    return ends


def partitions_view(database: TopicSource, entries: list[TopicEntry] | None = None) -> pa.Table:
    """One row per partition. The end offsets are one cut, taken under the publish lock (as
    ``engine.bulk_read.partition_bounds`` takes it): a transaction's publish is in them whole
    or not at all, so ranges planned from them (a Spark read) never split one."""
    rows = []
    now_us = database.clock.now_us()
    entries = entries or database.catalog.entries()
    logs = [database.topic_log(entry.topic_id) for entry in entries]
    with database.publish_lock:
        cuts = [_end_offsets(topic) for topic in logs]
    for entry, topic, cut in zip(entries, logs, cuts, strict=True):
        for partition_id, end in cut.items():  # a partition made since the cut is not in it
            try:
                partition = topic.partition(partition_id)
                info = topic.partition_info(partition_id)
                speed = topic.write_speed(partition_id)
            except (InvalidParameterValueError, KeyError):
                continue  # removed by retention since the list was taken
            key_range = info.key_range
            rows.append(
                {
                    "topic": entry.name,
                    "partition": partition_id,
                    "start_offset": min(partition.start_offset, end),
                    "end_offset": end,
                    "bytes": partition.size_bytes,
                    "segments": len(partition.segments),
                    "active": info.active,
                    "parent": info.parent,
                    "children": ",".join(map(str, info.children)),
                    "state": "active" if info.active else "inactive",
                    "key_range_start": None if key_range is None else f"{key_range.low:016x}",
                    "key_range_end": None if key_range is None else f"{key_range.high - 1:016x}",
                    "write_speed_bytes_per_second": speed.speed_now(now_us),
                    "write_speed_limit": speed.speed if topic.autopartitioning.throttled else None,
                    "throttled_ms": speed.throttled_us // 1000,
                    "split_at": None if info.split_at_us is None else utc_from_us(info.split_at_us),
                }
            )
    schema = pa.schema(
        [
            ("topic", pa.string()),
            ("partition", pa.int32()),
            ("start_offset", pa.int64()),
            ("end_offset", pa.int64()),
            ("bytes", pa.int64()),
            ("segments", pa.int32()),
            ("active", pa.bool_()),
            ("parent", pa.int32()),
            # Autopartitioning: lineage, the key range (hex, both ends inclusive, of the
            # 64-bit hash space, docs/autopartitioning.md), the write speed measured over
            # the last whole second, the speed limit, and the time writes waited for it.
            ("children", pa.string()),
            ("state", pa.string()),
            ("key_range_start", pa.string()),
            ("key_range_end", pa.string()),
            ("write_speed_bytes_per_second", pa.int64()),
            ("write_speed_limit", pa.int64()),
            ("throttled_ms", pa.int64()),
            ("split_at", pa.timestamp("us", tz="UTC")),
        ]
    )
    return pa.Table.from_pylist(rows, schema=schema)


def consumers_view(database: TopicSource, entries: list[TopicEntry] | None = None) -> pa.Table:
    rows = []
    now_us = database.clock.now_us()
    for entry in entries or database.catalog.entries():
        topic = database.topic_log(entry.topic_id)
        for consumer, settings in sorted(entry.consumers.items()):
            for partition_id in topic.partition_ids():
                try:
                    partition = topic.partition(partition_id)
                except InvalidParameterValueError:
                    continue  # removed by retention since the list was taken
                committed = database.catalog.committed(entry.topic_id, consumer, partition_id)
                lag, lag_seconds = _lag(partition, committed, now_us)
                rows.append(
                    {
                        "topic": entry.name,
                        "consumer": consumer,
                        "partition": partition_id,
                        "important": bool(settings.get("important")),
                        "committed_offset": committed,
                        "end_offset": partition.end_offset,
                        "lag_messages": lag,
                        "lag_seconds": lag_seconds,
                    }
                )
    schema = pa.schema(
        [
            ("topic", pa.string()),
            ("consumer", pa.string()),
            ("partition", pa.int32()),
            ("important", pa.bool_()),
            ("committed_offset", pa.int64()),
            ("end_offset", pa.int64()),
            ("lag_messages", pa.int64()),
            ("lag_seconds", pa.float64()),
        ]
    )
    return pa.Table.from_pylist(rows, schema=schema)


def _lag(partition: PartitionLog, committed: int | None, now_us: int) -> tuple[int, float]:
    """Messages from the consumer's position (committed, or the log start if retention
    passed it) to the end, and the age in seconds of the first of them."""
    start = partition.start_offset
    position = max(committed or 0, start)
    lag = max(0, partition.end_offset - position)
    if not lag:
        return 0, 0.0
    try:
        oldest = partition.read(position, max_messages=1, max_bytes=1)
    except StorageIOError:
        return lag, 0.0  # its segments went under the read (retention): no age to tell
    if not oldest.batches:
        return lag, 0.0
    written = oldest.batches[0].column("written_at")[0].value
    return lag, max(0.0, (now_us - written) / 1_000_000)


SYSTEM_VIEWS = {
    "topics": topics_view,
    "partitions": partitions_view,
    "consumers": consumers_view,
    # Owners, grants and roles (engine.privilege_views).
    "owners": privilege_views.owners_view,
    "grants": privilege_views.grants_view,
    "roles": privilege_views.roles_view,
}


def describe_topic(database: TopicSource, name: str) -> pa.Table:
    """Settings, consumers and partitions of one topic as (section, name, value) rows."""
    entry = database.catalog.entry(name)
    assert entry is not None
    rows: list[dict[str, Any]] = [
        {"section": "topic", "name": "name", "value": entry.name},
        {"section": "topic", "name": "topic_id", "value": entry.topic_id},
    ]
    rows += [
        {"section": "setting", "name": key, "value": _show(value)}
        for key, value in sorted(entry.settings.items())
    ]
    for consumer, settings in sorted(entry.consumers.items()):
        shown = ", ".join(
            f"{k}={_show(v)}"
            for k, v in sorted(settings.items())
            if v not in (None, (), False) or k == "important"
        )
        rows.append({"section": "consumer", "name": consumer, "value": shown})
    for row in partitions_view(database, [entry]).to_pylist():
        rows.append(
            {"section": "partition", "name": str(row["partition"]), "value": _partition_text(row)}
        )
    rows.append({"section": "routing", "name": "writes", "value": routing_text(database, entry)})
    for row in consumers_view(database, [entry]).to_pylist():
        value = (
            f"committed={_committed_text(row['committed_offset'])} lag={row['lag_messages']} "
            f"lag_seconds={row['lag_seconds']:.1f}"
        )
        rows.append(
            {"section": "offset", "name": f"{row['consumer']}/{row['partition']}", "value": value}
        )
    return pa.Table.from_pylist(
        rows,
        schema=pa.schema([("section", pa.string()), ("name", pa.string()), ("value", pa.string())]),
    )


def routing_text(database: TopicSource, entry: TopicEntry) -> str:
    """How writes to the topic find their partition (``engine.routing``)."""
    return routing.routing_text(database.topic_log(entry.topic_id))


def _partition_text(row: dict[str, Any]) -> str:
    """One partition of DESCRIBE TOPIC: offsets, state, lineage, key range, write speed."""
    text = (
        f"start={row['start_offset']} end={row['end_offset']} bytes={row['bytes']} "
        f"{'active' if row['active'] else 'inactive'}"
    )
    if row["parent"] is not None:
        text += f" parent={row['parent']}"
    if row["children"]:
        text += f" children={row['children']}"
    if row["key_range_start"] is not None:
        text += f" keys=[{row['key_range_start']}..{row['key_range_end']}]"
    if row["write_speed_limit"] is not None:
        text += (
            f" write_speed={row['write_speed_bytes_per_second']}/{row['write_speed_limit']}B/s"
            f" throttled_ms={row['throttled_ms']}"
        )
    return text


def _committed_text(offset: int | None) -> str:
    """No committed offset yet reads "none" (never Python's ``None``)."""
    return "none" if offset is None else str(offset)


def _show(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, tuple):
        return ",".join(map(str, value))
    if isinstance(value, timedelta):
        return _iso_interval(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int) and value > 10**15:
        return utc_from_us(value).isoformat()
    return str(value)


def _iso_interval(value: timedelta) -> str:
    seconds = int(value.total_seconds())
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, seconds = divmod(rest, 60)
    text = "P" + (f"{days}D" if days else "")
    clock = (
        (f"{hours}H" if hours else "")
        + (f"{minutes}M" if minutes else "")
        + (f"{seconds}S" if seconds else "")
    )
    return text + ("T" + clock if clock else ("" if days else "T0S"))
