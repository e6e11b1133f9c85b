"""Planning ``ALTER TOPIC t ALTER CONSUMER c SET OFFSETS TO ... [FORCE]``.

The statement moves a consumer's committed offsets anywhere: to each partition's first
retained offset (``EARLIEST``), to its end (``LATEST``), to the first message written at
or after a point in time (``TIMESTAMP '...'``), or to explicit offsets of the partitions
listed (``(PARTITION 0 OFFSET 10, ...)``). It is Kafka's ``kafka-consumer-groups
--reset-offsets`` and YDB's commit-offset call, written in YQL's ALTER TOPIC family.

Unlike the rest of ALTER TOPIC it changes no definition: it is an offset move, so it
runs inside a transaction and commits or rolls back with it (``engine.offset_reset``).

Pure: checks the topic, the consumer and the partitions against the catalog only.
"""

from __future__ import annotations

from grammar import ast
from planner.catalog import Catalog
from planner.operations import Plan, SetConsumerOffsets
from storage.errors import UndefinedObjectError, UndefinedTopicError

TAG = "ALTER TOPIC"


def plan_set_offsets(statement: ast.SetOffsets, catalog: Catalog) -> Plan:
    info = catalog.topic(statement.topic)
    if info is None:
        if statement.if_exists:
            return Plan((), TAG, notes=(f'topic "{statement.topic}" does not exist, skipping',))
        raise UndefinedTopicError(
            f'topic "{statement.topic}" does not exist', topic=statement.topic
        )
    if statement.consumer not in info.consumers:
        raise UndefinedObjectError(
            f'consumer "{statement.consumer}" does not exist on topic "{info.name}"',
            topic=info.name,
            consumer=statement.consumer,
        )
    for partition, _ in statement.offsets:
        if partition not in info.partitions:
            raise UndefinedObjectError(f'topic "{info.name}" has no partition {partition}')
    partitions = (
        tuple(p for p, _ in statement.offsets) if statement.target == "offsets" else info.partitions
    )
    timestamp_us = None
    if statement.timestamp is not None:
        timestamp_us = int(statement.timestamp.timestamp() * 1_000_000)
    operation = SetConsumerOffsets(
        info.name,
        info.topic_id,
        statement.consumer,
        partitions,
        statement.target,
        timestamp_us,
        statement.offsets,
        statement.force,
    )
    return Plan((operation,), TAG)
