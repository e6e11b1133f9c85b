"""Running ``ReadRecords``: topic messages into an Arrow table for one statement.

A peek reads from ``from_offset`` (default: each partition's start) and
commits nothing. A consumer read starts where the transaction's earlier read
of that partition ended, else at the consumer's committed offset (else the
partition start), skips what ``read_from``/``max_lag`` exclude, and records
the range read in the transaction. ``max_messages``/``max_bytes`` bound the
whole read over all partitions; ``wait`` long-polls when nothing is there yet.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import datetime, timedelta
from typing import Any

import pyarrow as pa

from engine.clock import Clock
from engine.topic_relation import SCHEMA, relation_batch
from engine.transaction import Transaction
from planner.operations import ReadRecords
from storage.errors import InvalidParameterValueError, LimitExceededError, QueryCanceledError
from storage.topic_log import TopicLog

DEFAULT_MAX_MESSAGES = 10_000
DEFAULT_MAX_BYTES = 64 * 1024 * 1024
CANCEL_CHECK_S = 0.1


def read_records(
    operation: ReadRecords,
    topic: TopicLog,
    committed: dict[int, int | None],
    transaction: Transaction,
    clock: Clock,
    cancelled: Callable[[], bool] = lambda: False,
    publish_gate: AbstractContextManager[Any] | None = None,
) -> pa.Table:
    """Read the operation's partitions; ``committed`` maps partition -> committed offset.

    A ``wait`` stops early, with 57014, when ``cancelled()`` turns true (checked
    whenever the topic's readers are woken, and at least every 100 ms).
    """
    options = operation.options
    starts = {
        p: _start(operation, topic, p, committed, transaction, clock) for p in operation.partitions
    }
    wait: timedelta = options.get("wait") or timedelta(0)
    gate = publish_gate if publish_gate is not None else contextlib.nullcontext()
    batches = _read_all(operation, topic, starts, gate)
    if not batches and wait > timedelta(0):
        deadline = clock.monotonic_s() + wait.total_seconds()
        while not batches:
            if cancelled():
                raise QueryCanceledError("canceling statement due to user request")
            remaining = deadline - clock.monotonic_s()
            if remaining <= 0:
                break
            if topic.wait_for_any(starts, min(remaining, CANCEL_CHECK_S)):
                batches = _read_all(operation, topic, starts, gate)
    if operation.consumer is not None:
        _record_ranges(operation, starts, batches, committed, transaction)
    decode = bool(options.get("decode", True))
    return pa.Table.from_batches(
        [relation_batch(p, b, decode=decode) for p, b in batches], schema=SCHEMA
    )


def _start(
    operation: ReadRecords,
    topic: TopicLog,
    partition_id: int,
    committed: dict[int, int | None],
    transaction: Transaction,
    clock: Clock,
) -> int:
    partition = topic.partition(partition_id)
    options = operation.options
    if operation.consumer is None:
        start = options.get("from_offset")
        start = partition.start_offset if start is None else int(start)
    else:
        key = (operation.topic_id, operation.consumer, partition_id)
        start = transaction.read_position(key)
        if start is None:
            start = committed.get(partition_id) or 0
    start = max(start, partition.start_offset)
    read_from = options.get("read_from")
    if read_from is not None:
        start = max(start, partition.offset_for_time(_to_us(read_from)))
    max_lag = options.get("max_lag")
    if max_lag is not None:
        horizon = clock.now_us() - int(max_lag.total_seconds() * 1_000_000)
        start = max(start, partition.offset_for_time(horizon))
    return start


def _to_us(value: Any) -> int:
    if isinstance(value, datetime):
        return int(value.timestamp() * 1_000_000)
    if isinstance(value, int):
        return value * 1_000_000
    raise InvalidParameterValueError(f"read_from must be a Timestamp or seconds, not {value!r}")


def _read_all(
    operation: ReadRecords,
    topic: TopicLog,
    starts: dict[int, int],
    publish_gate: AbstractContextManager[Any],
) -> list[tuple[int, pa.RecordBatch]]:
    """Read every partition up to one consistent cut of their end offsets.

    The cut is taken under ``publish_gate``, which transactional publishes
    hold while they append to all their partitions, so a read sees a
    transaction's messages in every partition or in none.
    """
    options = operation.options
    remaining = int(options.get("max_messages") or DEFAULT_MAX_MESSAGES)
    budget = int(options.get("max_bytes") or DEFAULT_MAX_BYTES)
    with publish_gate:
        ends = {p: topic.partition(p).end_offset for p in starts}
    batches: list[tuple[int, pa.RecordBatch]] = []
    cut_short = False
    for partition_id, start in starts.items():
        available = ends[partition_id] - start
        if available <= 0:
            continue
        if remaining <= 0 or budget <= 0:
            cut_short = True
            break
        result = topic.partition(partition_id).read(
            start, max_messages=min(remaining, available), max_bytes=budget
        )
        reached = start
        for batch in result.batches:
            batches.append((partition_id, batch))
            remaining -= batch.num_rows
            budget -= batch.nbytes
            reached = batch.column("offset")[-1].as_py() + 1
        cut_short = cut_short or reached < ends[partition_id]
    if cut_short and options.get("complete"):
        raise LimitExceededError(
            f"topic {operation.topic} holds more than one read may return "
            f"({options.get('max_messages')} messages, {options.get('max_bytes')} bytes); "
            "read it in ranges with FROM TOPIC ... WITH (partition = ..., from_offset = ..., "
            "max_messages = ...)"
        )
    return batches


def _record_ranges(
    operation: ReadRecords,
    starts: dict[int, int],
    batches: list[tuple[int, pa.RecordBatch]],
    committed: dict[int, int | None],
    transaction: Transaction,
) -> None:
    assert operation.consumer is not None
    ends = dict(starts)
    for partition_id, batch in batches:
        last = batch.column("offset")[-1].as_py()
        ends[partition_id] = max(ends[partition_id], last + 1)
    for partition_id, start in starts.items():
        key = (operation.topic_id, operation.consumer, partition_id)
        if (
            ends[partition_id] == start
            and transaction.read_position(key) is None
            and (committed.get(partition_id) or 0) == start
        ):
            continue  # nothing read and nothing skipped: no offset to move
        transaction.record_read(key, committed.get(partition_id), start, ends[partition_id])
