"""What Spark's tasks and the driver's commit do against the Flight door, for batch
(``datasource.py``) and streaming (``streaming.py``) alike: read one ticket, stage one
task's rows under its own write id, publish a write's staged ids as ``(sink id, batch id)``,
discard what a write staged.

Everything here is pickled to, or runs in, Spark's Python workers as well as the driver:
each call opens its own Flight connection (``Options.connect``). This module imports
neither the data source nor the stream classes, which both build on it.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import InputPartition, WriterCommitMessage
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from spark_sql_ext.options import Options

WRITE_COLUMNS = ("data", "producer_id", "seq_no", "message_group_id", "partition",
                 "created_at", "metadata", "codec")  # fmt: skip


@dataclass(frozen=True)
class RangePartition(InputPartition):
    """One task's read: a Flight ticket (a topic range, or a whole table)."""

    ticket: dict[str, Any]


def read_ticket(options: Options, schema: StructType, ticket: dict[str, Any]
                ) -> Iterator[pa.RecordBatch]:  # fmt: skip
    """The batches of one ticket, cast to the Arrow types of Spark's schema when needed."""
    target = to_arrow_schema(schema, timezone="UTC", prefers_large_types=False)
    with options.connect() as client:
        for batch in client.read_ticket(ticket):
            if batch.num_rows == 0:
                continue
            if batch.schema != target:
                batch = pa.RecordBatch.from_arrays(
                    [batch.column(f.name).cast(f.type) for f in target], schema=target)
            yield batch


@dataclass(frozen=True)
class StagedMessage(WriterCommitMessage):
    """What a task staged: its write id (None when it had no rows) and row count."""

    write_id: str | None
    rows: int


def stage_task(options: Options, prefix: str, iterator: Iterator[pa.RecordBatch]
               ) -> StagedMessage:  # fmt: skip
    """A task's part of a write: its batches staged under its own write id."""
    from pyspark import TaskContext

    context = TaskContext.get()
    task = f"{context.partitionId()}-{context.attemptNumber()}" if context else uuid.uuid4().hex
    write_id = f"{prefix}-{task}"
    first = next(iterator, None)
    if first is None:
        return StagedMessage(None, 0)
    rows = 0

    def batches() -> Iterator[pa.RecordBatch]:
        nonlocal rows
        for item in itertools.chain([first], iterator):
            rows += item.num_rows
            yield _writable(options, item)

    with options.connect() as client:
        try:
            client.put(options.write_target, batches(), _writable(options, first).schema,
                       write_id)  # fmt: skip
        except BaseException:
            client.abort([write_id])
            raise
    return StagedMessage(write_id, rows)


def _writable(options: Options, batch: pa.RecordBatch) -> pa.RecordBatch:
    """Topic rows keep the topic's write columns only (a read's offset, written_at …
    are the server's to set); table rows go as they are."""
    if not options.topic:
        return batch
    names = [n for n in batch.schema.names if n in WRITE_COLUMNS]
    if "data" not in names:
        raise ValueError('a write to a topic needs a "data" column')
    return batch.select(names)


def publish(options: Options, prefix: str, sink_id: str, batch_id: int,
            messages: list[StagedMessage | None]) -> dict[str, Any]:  # fmt: skip
    """The driver's commit: publish the tasks' writes as ``(sink_id, batch_id)``, then
    discard anything else staged under this write's prefix (failed attempts)."""
    write_ids = [m.write_id for m in messages if m is not None and m.write_id]
    with options.connect() as client:
        outcome = client.commit(sink_id, batch_id, write_ids)
        _discard_prefix(client, prefix)
    return outcome


def discard(options: Options, prefix: str) -> None:
    with options.connect() as client:
        _discard_prefix(client, prefix)


def _discard_prefix(client: Any, prefix: str) -> None:
    """Abort every write under ``prefix-`` (one call; the server then refuses to start
    another under it, so a task starting its write just after this leaves nothing)."""
    client.abort([prefix + "-*"])
