"""The ``topicbase`` PySpark data source: batch reads and exactly-once batch writes.

Reads: the driver asks the Flight door for the cut of a topic (``GetFlightInfo``): one
Spark task per partition range (ranges longer than ``splitRows`` are split); each task
streams its range's stored Arrow frames (``DoGet``) and yields them as Arrow record batches
whose types are the Spark schema's. A table is one task reading it through SQL. With
``spark.sql.python.filterPushdown.enabled``, filters on ``partition`` and ``offset`` are
applied exactly by narrowing the ranges, and ``written_at >= t`` narrows them (Spark
still checks it) — with the source option ``pushFilters = true`` as well.

Writes (batch and streaming, ``streaming.py``; a task's side in ``tasks.py``), exactly
once: the writer object is pickled once, so the id made in its ``__init__`` names this
write in every task and in the driver's
commit. Each task stages its rows through the Flight door's ``stage`` action (parts of
~6 MiB of Arrow IPC, ``client.TopicbaseClient.put``) under ``<write>-<partition>-<attempt>``
and returns that id; the driver's ``commit`` publishes every id in one Topicbase
transaction recorded as ``(sink id, batch id)``: a replayed commit is a no-op, an abort
(or a commit, for attempts that failed) discards what tasks staged. Topic rows take the
topic's write columns (``data``, ``producer_id``, ``seq_no``, ``message_group_id``,
``partition``, ``created_at``, ``metadata``, ``codec``); table rows go to the table's
columns by name.

Process model: the DataSource, its reader and writer are built on the driver and pickled
to Spark's Python workers; every process opens its own Flight connection.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    LessThan,
    LessThanOrEqual,
    WriterCommitMessage,
)
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.types import StructField, StructType

from spark_sql_ext.options import (
    TOPIC_ARROW_TYPES,
    TOPIC_COLUMNS,
    Options,
    Position,
    parse_options,
    resolve,
)
from spark_sql_ext.tasks import (
    RangePartition,
    StagedMessage,
    discard,
    publish,
    read_ticket,
    stage_task,
)


class TopicbaseDataSource(DataSource):
    """``spark.read.format("topicbase")`` and friends (see the module docstring)."""

    @classmethod
    def name(cls) -> str:
        return "topicbase"

    def schema(self) -> StructType | str:
        lowered = {str(k).lower(): str(v) for k, v in self.options.items()}
        if "describe" in lowered:
            return describe(lowered, lowered["describe"])
        if _catalog_request(self.options) is not None:
            return CATALOG_SCHEMAS[_catalog_request(self.options)[0]]
        options = parse_options(self.options)
        if options.topic:
            return options.topic_ddl()
        with options.connect() as client:
            schema, _ = client.tickets({**options.target, "columns": list(options.columns or [])})
        return from_arrow_schema(schema)

    def reader(self, schema: StructType) -> DataSourceReader:
        request = _catalog_request(self.options)
        if request is not None:
            return CatalogRequestReader(dict(self.options), *request)
        options = parse_options(self.options)
        if options.push_filters:
            return TopicbaseFilteringReader(options, schema)
        return TopicbaseReader(options, schema)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceArrowWriter:
        return TopicbaseWriter(parse_options(self.options), schema, overwrite)

    def streamReader(self, schema: StructType) -> Any:
        from spark_sql_ext.streaming import TopicbaseStreamReader

        return TopicbaseStreamReader(parse_options(self.options, streaming=True), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> Any:
        from spark_sql_ext.streaming import TopicbaseStreamWriter

        return TopicbaseStreamWriter(parse_options(self.options, streaming=True), schema)


# Requests of the Java catalog (spark_sql_ext/java), which reaches the server through this
# source: option "relations" lists topics and tables, option "execute" runs a statement.
CATALOG_SCHEMAS = {"relations": "kind STRING, name STRING", "execute": "tag STRING"}


# The Java catalog resolves a name by asking for the schema of option "describe": the
# relation's columns, the first carrying its kind under this metadata key. One Python call,
# no Spark job (listing every relation through a job took ~0.2 s per query).
KIND_METADATA = "topicbase.kind"
NO_SUCH_RELATION = "TOPICBASE_NO_SUCH_RELATION"


def describe(options: dict[str, str], name: str) -> StructType:
    """The schema of topic or table ``name``, its kind in the first field's metadata;
    raises a LookupError naming NO_SUCH_RELATION when there is none."""
    connection = parse_options({**options, "table": "-", "topic": ""})
    with connection.connect() as client:
        kinds = {item["name"]: item["kind"] for item in reversed(client.action("relations"))}
        kind = kinds.get(name)
        if kind is None:
            raise LookupError(f"{NO_SUCH_RELATION}: no topic or table named {name!r}")
        if kind == "topic":
            schema = from_arrow_schema(
                pa.schema([(c, TOPIC_ARROW_TYPES[c]) for c in TOPIC_COLUMNS]))
        else:
            schema = from_arrow_schema(client.tickets({"table": name, "columns": []})[0])
    first, *rest = schema.fields
    marked = StructField(first.name, first.dataType, first.nullable, {KIND_METADATA: kind})
    return StructType([marked, *rest])


def _catalog_request(options: Any) -> tuple[str, str] | None:
    lowered = {str(k).lower(): str(v) for k, v in options.items()}
    if "execute" in lowered:
        return "execute", lowered["execute"]
    if "relations" in lowered:
        return "relations", ""
    return None


class CatalogRequestReader(DataSourceReader):
    """One task that answers a catalog request (run once per Spark action)."""

    def __init__(self, options: dict[str, str], kind: str, argument: str) -> None:
        self.options = options
        self.kind = kind
        self.argument = argument

    def read(self, partition: InputPartition) -> Iterator[tuple[str, ...]]:
        lowered = {k.lower(): v for k, v in self.options.items()}
        options = parse_options({**lowered, "table": "-", "topic": ""})
        with options.connect() as client:
            if self.kind == "relations":
                for item in client.action("relations"):
                    yield item["kind"], item["name"]
            else:
                yield (client.action("execute", {"sql": self.argument})["tag"],)


class TopicbaseReader(DataSourceReader):
    def __init__(self, options: Options, schema: StructType) -> None:
        self.options = options
        self.schema = schema
        self._partitions: set[int] | None = None
        self._low: int | None = None  # offsets >= _low
        self._high: int | None = None  # offsets < _high
        self._since_us: int | None = None

    def partitions(self) -> Sequence[InputPartition]:
        options = self.options
        columns = list(options.columns) if options.columns else [f.name for f in self.schema]
        with options.connect() as client:
            if not options.topic:
                _, tickets = client.tickets({**options.target, "columns": columns})
                return [RangePartition(t) for t in tickets]
            bounds = client.partitions(options.topic)
            if self._partitions is not None:
                bounds = [b for b in bounds if b["partition"] in self._partitions]
            starts = resolve(client, options, options.starting, bounds)
            ends = resolve(client, options, options.ending, bounds)
            if self._since_us is not None:
                since = resolve(client, options, Position("time", time_us=self._since_us), bounds)
                starts = {p: max(o, since[p]) for p, o in starts.items()}
            if self._low is not None:
                starts = {p: max(o, self._low) for p, o in starts.items()}
            if self._high is not None:
                ends = {p: min(o, self._high) for p, o in ends.items()}
        tickets = []
        for bound in bounds:
            partition = bound["partition"]
            start, end = starts[partition], ends[partition]
            while start < end:
                piece = min(end, start + options.split_rows)
                tickets.append({"topic": options.topic, "partition": partition, "start": start,
                                "end": piece, "columns": columns})  # fmt: skip
                start = piece
        return [RangePartition(t) for t in tickets]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, RangePartition):
            return  # Spark's stand-in InputPartition(None) when there is no range to read
        yield from read_ticket(self.options, self.schema, partition.ticket)


class TopicbaseFilteringReader(TopicbaseReader):
    """The reader with filter pushdown: chosen by the option ``pushFilters = true``, to be
    set together with ``spark.sql.python.filterPushdown.enabled`` (Spark 4.3 refuses a
    reader that implements ``pushFilters`` while that setting is off)."""

    def pushFilters(self, filters: list[Filter]) -> Any:
        """Keep the filters on partition and offset (applied exactly through the ranges);
        written_at >= t narrows the ranges but stays with Spark too."""
        for item in filters:
            if self.options.topic and self._push(item):
                continue
            yield item

    def _push(self, item: Filter) -> bool:
        column = item.attribute[0] if len(item.attribute) == 1 else None
        value = getattr(item, "value", None)
        if column == "partition" and isinstance(item, EqualTo | In):
            wanted = {int(v) for v in (value if isinstance(item, In) else (value,))}
            self._partitions = wanted if self._partitions is None else self._partitions & wanted
            return True
        if column == "offset" and isinstance(value, int):
            bounds = {GreaterThan: (value + 1, None), GreaterThanOrEqual: (value, None),
                      LessThan: (None, value), LessThanOrEqual: (None, value + 1),
                      EqualTo: (value, value + 1)}  # fmt: skip
            low, high = bounds.get(type(item), (None, None))
            if low is None and high is None:
                return False
            if low is not None:
                self._low = low if self._low is None else max(self._low, low)
            if high is not None:
                self._high = high if self._high is None else min(self._high, high)
            return True
        if column == "written_at" and isinstance(item, GreaterThan | GreaterThanOrEqual):
            moment = value
            if hasattr(moment, "timestamp"):
                self._since_us = int(moment.timestamp() * 1_000_000)
        return False


class TopicbaseWriter(DataSourceArrowWriter):
    def __init__(self, options: Options, schema: StructType, overwrite: bool) -> None:
        if overwrite:
            raise ValueError("topicbase writes append; mode('overwrite') is not supported")
        self.options = options
        self.prefix = "spark-" + uuid.uuid4().hex  # made once, on the driver
        self.sink_id = options.sink_id or self.prefix
        self.last_outcome: dict[str, Any] | None = None

    def write(self, iterator: Iterator[pa.RecordBatch]) -> StagedMessage:
        return stage_task(self.options, self.prefix, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        batch_id = self.options.batch_id or 0
        self.last_outcome = publish(self.options, self.prefix, self.sink_id, batch_id,
                                    messages)  # type: ignore[arg-type]

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        discard(self.options, self.prefix)
