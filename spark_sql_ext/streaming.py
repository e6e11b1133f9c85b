"""Streaming reads and exactly-once streaming writes of the ``topicbase`` data source.

Stream offsets are Spark JSON dicts ``{"<partition>": <next offset>}``. ``latestOffset``
looks at the topic's partitions (``partitions`` action) and advances each partition,
parents before children (a child of a split stays where it is until its parent is read to
its end, so per-producer order survives autopartitioning), by at most the read limit in
total (``maxMessagesPerTrigger``; ``Trigger.AvailableNow`` and ``ReadAllAvailable`` take
everything). A batch reads exactly ``[start, end)`` of each partition, so a restart that
replays a batch from the checkpoint reads the same messages. ``commit(end)`` runs when a
batch is done (it lags one batch) and, with the ``consumer`` option, moves that consumer's
committed offsets in Topicbase so ``sys.consumers`` shows the pipeline's lag.

The stream writer stages per task as the batch writer does and commits each micro-batch
as ``(sinkId, batchId)``: Spark replays a micro-batch after a crash with the same id, and
Topicbase then publishes nothing. ``sinkId`` must therefore stay the same across restarts
of one query and differ between queries: it is required.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from spark_sql_ext.options import OptionError, Options, resolve
from spark_sql_ext.tasks import RangePartition, discard, publish, read_ticket, stage_task


def _decode(offset: dict[str, Any]) -> dict[int, int]:
    return {int(p): int(o) for p, o in offset.items()}


def _encode(offsets: dict[int, int]) -> dict[str, int]:
    return {str(p): o for p, o in sorted(offsets.items())}


class TopicbaseStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: Options, schema: StructType) -> None:
        if not options.topic:
            raise OptionError("a streaming read needs a topic")
        self.options = options
        self.schema = schema
        self._client: Any = None
        self._target: dict[int, int] | None = None  # Trigger.AvailableNow: read up to here

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_client": None}

    def _connection(self) -> Any:
        if self._client is None:
            self._client = self.options.connect()
        return self._client

    def _bounds(self) -> list[dict[str, Any]]:
        bounds = self._connection().partitions(self.options.topic)
        if self._target is not None:  # nothing written after the AvailableNow snapshot
            bounds = [{**b, "end": min(b["end"], self._target.get(b["partition"], b["start"]))}
                      for b in bounds]  # fmt: skip
        return bounds

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = None
        self._target = {b["partition"]: b["end"] for b in self._bounds()}

    def initialOffset(self) -> dict[str, int]:
        bounds = self._bounds()
        return _encode(resolve(self._connection(), self.options, self.options.starting, bounds))

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self.options.max_per_trigger
        return ReadAllAvailable() if limit is None else ReadMaxRows(limit)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, int]:
        position = _decode(start)
        remaining = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        bounds = {b["partition"]: b for b in self._bounds()}
        ends: dict[int, int] = {}
        for partition in sorted(bounds):
            bound = bounds[partition]
            begin = max(position.get(partition, bound["start"]), bound["start"])
            parent = bound.get("parent")
            if parent is not None and parent in bounds and ends.get(parent, 0) < bounds[parent][
                    "end"]:  # fmt: skip
                ends[partition] = begin  # the parent is not read to its end yet
                continue
            available = bound["end"] - begin
            take = available if remaining is None else min(available, remaining)
            ends[partition] = begin + take
            if remaining is not None:
                remaining -= take
        return _encode(ends)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        begin, finish = _decode(start), _decode(end)
        columns = list(self.options.columns) if self.options.columns else [
            f.name for f in self.schema]  # fmt: skip
        tickets = []
        for partition, stop in sorted(finish.items()):
            offset = begin.get(partition, 0)
            while offset < stop:
                piece = min(stop, offset + self.options.split_rows)
                tickets.append(RangePartition({
                    "topic": self.options.topic, "partition": partition, "start": offset,
                    "end": piece, "columns": columns}))  # fmt: skip
                offset = piece
        return tickets

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, RangePartition):
            return  # Spark's stand-in InputPartition(None) when there is no range to read
        yield from read_ticket(self.options, self.schema, partition.ticket)

    def commit(self, end: dict[str, Any]) -> None:
        if self.options.consumer and end:
            self._connection().commit_offsets(self.options.topic, self.options.consumer,
                                              _decode(end))  # fmt: skip

    def stop(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


class TopicbaseStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, options: Options, schema: StructType) -> None:
        if not options.sink_id:
            raise OptionError(
                'a streaming write needs the option "sinkId": the same for every run of one '
                "query (its batches are recognised by it after a restart), unique per query"
            )
        self.options = options
        self.sink_id = options.sink_id
        self.prefix = "spark-" + uuid.uuid4().hex

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        from pyspark import TaskContext

        # A micro-batch's tasks get their own prefix: ids differ between batches.
        context = TaskContext.get()
        batch = context.getLocalProperty("streaming.sql.batchId") if context else None
        return stage_task(self.options, f"{self.prefix}-b{batch}", iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        publish(self.options, f"{self.prefix}-b{batchId}", self.sink_id, batchId,
                messages)  # type: ignore[arg-type]

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        discard(self.options, f"{self.prefix}-b{batchId}")
