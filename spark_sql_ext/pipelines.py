"""The Spark pipelines: resharding a topic by a key and folding a topic into a table.

Both are ordinary Structured Streaming queries over the ``topicbase`` source and sink, so
they run unchanged on a laptop (``local[2]``) or a cluster (executors reach the server's
Flight door), and both are exactly once: the source reads exact offset ranges replayed from
the checkpoint, and the sink publishes each micro-batch with ``(sinkId, batchId)``.

- ``reshard``: a topic sharded by server (say) into a topic partitioned by a key taken from
  each message (a JSON field): the key becomes the ``message_group_id``, which routes every
  message of a key to one partition. Order: a source partition's range is read and written
  by one task in order, and tasks are published in range order, so each source's messages
  keep their order within a key.
- ``to_table``: a topic folded into a DuckDB table keyed by a JSON field of each message,
  by ``mode`` (``FOLD_MODES``): ``count`` (per-key message counts, the sink's ``add``),
  ``sum`` (per-key sums of a numeric JSON field, ``add``) or ``upsert`` (each key's latest
  value of a JSON field, the sink's ``upsert``). Each micro-batch's rows are published in
  the same transaction as its idempotency record. A message whose value field is missing
  (or JSON null) is skipped by ``sum`` and ``upsert``; a message whose key field is missing
  (or JSON null) is not folded by any mode (its NULL key would fail the table's key on
  every replay and stop the fold). "Latest" is the topic's order: a
  micro-batch is reduced to one row per key before its write, the row of the key's last
  message by ``(partition, offset)`` (Spark's tasks write in no defined order, so the
  order is made explicit here); a later micro-batch replaces an earlier one's value. For a
  key whose messages all go to one partition (a topic partitioned by the key, as
  ``reshard`` makes) that is the key's last message.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

FOLD_MODES = ("count", "sum", "upsert")
# A Spark SQL type name for --value-type: a word, optionally with (precision[, scale]).
_TYPE = re.compile(r"[A-Za-z][A-Za-z0-9_]*(\(\s*\d+\s*(,\s*\d+\s*)?\))?")
DEFAULT_VALUE_TYPES = {"sum": "DOUBLE", "upsert": "STRING"}


@dataclass(frozen=True)
class Connection:
    """Where the pipeline's source and sink are: the Flight door's ``url``
    (``topicbase://host:port``, or ``topicbase+tls://host:port`` with ``tls_root_certs``, a
    PEM file that must exist on every node; without it the system's roots are trusted)."""

    url: str
    user: str
    password: str
    tls_root_certs: str | None = None

    def options(self) -> dict[str, str]:
        options = {"url": self.url, "user": self.user, "password": self.password}
        if self.tls_root_certs:
            options["tlsRootCerts"] = self.tls_root_certs
        return options


def json_path(field: str) -> str:
    """``$.field`` for ``get_json_object``; a field that would end the SQL string literal
    it goes into (a quote or backslash) is refused (ValueError) rather than spliced."""
    if not field or "'" in field or "\\" in field:
        raise ValueError(f"a JSON field name without quotes or backslashes, not {field!r}")
    return "$." + field


def _quoted(column: str) -> str:
    """``column`` as a Spark SQL quoted identifier: in backticks, a backtick doubled."""
    return "`" + column.replace("`", "``") + "`"


def _trigger(writer: Any, once: bool, interval: str) -> Any:
    return writer.trigger(availableNow=True) if once else writer.trigger(processingTime=interval)


def reshard(spark: Any, connection: Connection, source: str, target: str, key: str,
            checkpoint: str, *, consumer: str | None = None, once: bool = True,
            interval: str = "1 second", max_per_trigger: int | None = None,
            starting_offsets: str = "earliest") -> Any:  # fmt: skip
    """Start the resharding query; returns Spark's StreamingQuery. ``starting_offsets``
    (``earliest``, ``latest``, JSON offsets per partition or an ISO time) counts only when
    the checkpoint is new: a restart continues from the checkpoint."""
    read = spark.readStream.format("topicbase").options(
        **connection.options(), topic=source, columns="data", startingOffsets=starting_offsets)
    if consumer:
        read = read.option("consumer", consumer)
    if max_per_trigger:
        read = read.option("maxMessagesPerTrigger", str(max_per_trigger))
    path = "$." + key
    messages = read.load().selectExpr(
        "data", f"get_json_object(CAST(data AS STRING), '{path}') AS message_group_id")
    writer = (messages.writeStream.format("topicbase")
              .options(**connection.options(), topic=target,
                       sinkId=f"reshard:{source}->{target}")
              .option("checkpointLocation", checkpoint))  # fmt: skip
    return _trigger(writer, once, interval).start()


def to_table(spark: Any, connection: Connection, source: str, table: str, key: str,
             checkpoint: str, *, key_column: str = "key", count_column: str = "n",
             mode: str = "count", value: str | None = None, value_column: str = "value",
             value_type: str | None = None,
             consumer: str | None = None, once: bool = True, interval: str = "1 second",
             max_per_trigger: int | None = None,
             starting_offsets: str = "earliest") -> Any:  # fmt: skip
    """Start the query that folds ``source`` into ``table`` by ``mode`` (module docstring):
    ``count`` adds each key's message count to ``count_column``; ``sum`` adds each key's sum
    of the JSON field ``value`` (cast to ``value_type``, default DOUBLE: a value that is not
    a number fails the query under Spark's ANSI casts) to ``value_column``; ``upsert``
    stores each key's latest ``value`` (default STRING) in ``value_column``. The table must
    exist, keyed by ``key_column``. ``starting_offsets`` as for ``reshard``. Bad arguments
    raise ValueError before the query starts."""
    if mode not in FOLD_MODES:
        raise ValueError(f"mode {mode!r}: one of {', '.join(FOLD_MODES)}")
    if (value is None) != (mode == "count"):
        raise ValueError("--value (a JSON field) is for modes sum and upsert, and needed there")
    chosen_type = value_type or DEFAULT_VALUE_TYPES.get(mode, "BIGINT")
    if not _TYPE.fullmatch(chosen_type):
        raise ValueError(f"value type {chosen_type!r}: a Spark SQL type name such as BIGINT")
    key_path = json_path(key)
    value_path = None if value is None else json_path(value)
    columns = "data" if mode != "upsert" else "partition,offset,data"
    read = spark.readStream.format("topicbase").options(
        **connection.options(), topic=source, columns=columns, startingOffsets=starting_offsets)
    if consumer:
        read = read.option("consumer", consumer)
    if max_per_trigger:
        read = read.option("maxMessagesPerTrigger", str(max_per_trigger))
    key_name, count_name = _quoted(key_column), _quoted(count_column)
    value_name = _quoted(value_column)
    keyed = f"get_json_object(CAST(data AS STRING), '{key_path}') AS {key_name}"
    has_key = f"{key_name} IS NOT NULL"
    options = {**connection.options(), "table": table, "key": key_column}
    if mode == "count":
        rows = read.load().selectExpr(keyed, f"CAST(1 AS BIGINT) AS {count_name}").where(has_key)
        writer = (rows.writeStream.format("topicbase")
                  .options(**options, mode="add", sinkId=f"to-table:{source}->{table}")
                  .option("checkpointLocation", checkpoint))  # fmt: skip
        return _trigger(writer, once, interval).start()
    extracted = (f"CAST(get_json_object(CAST(data AS STRING), '{value_path}') "
                 f"AS {chosen_type}) AS {value_name}")  # fmt: skip
    # A sink id of its own per mode and column: a fold of another mode into the same
    # table (another checkpoint) must not take this one's recorded batches for its own.
    sink_id = f"to-table:{source}->{table}:{mode}:{value_column}"
    if mode == "sum":
        rows = read.load().selectExpr(keyed, extracted).where(
            f"{has_key} AND {value_name} IS NOT NULL")
        writer = (rows.writeStream.format("topicbase")
                  .options(**options, mode="add", sinkId=sink_id)
                  .option("checkpointLocation", checkpoint))  # fmt: skip
        return _trigger(writer, once, interval).start()
    rows = read.load().selectExpr("`partition`", "`offset`", keyed, extracted).where(
        f"{has_key} AND {value_name} IS NOT NULL")
    publish = _latest_per_key(options, sink_id, key_column, value_column)
    writer = rows.writeStream.foreachBatch(publish).option("checkpointLocation", checkpoint)
    return _trigger(writer, once, interval).start()


def _latest_per_key(options: dict[str, str], sink_id: str, key_column: str,
                    value_column: str) -> Any:  # fmt: skip
    """The ``foreachBatch`` function of an upsert fold: the micro-batch reduced to each
    key's row of greatest ``(partition, offset)`` (a row number over that order, descending:
    exactly one row per key, offsets being unique within a partition), written as a batch
    write ``(sink_id, Spark's batch id)`` in mode ``upsert``. A replayed micro-batch reads
    the same offsets, so it reduces to the same rows and its commit finds its record."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    def publish(batch: Any, batch_id: int) -> None:
        key, value = F.col(_quoted(key_column)), F.col(_quoted(value_column))
        order = Window.partitionBy(key).orderBy(F.col("partition").desc(),
                                                       F.col("offset").desc())  # fmt: skip
        latest = (batch.withColumn("__latest", F.row_number().over(order))
                  .where(F.col("__latest") == 1).select(key, value))  # fmt: skip
        (latest.write.format("topicbase").mode("append")
         .options(**options, mode="upsert", sinkId=sink_id, batchId=str(batch_id))
         .save())  # fmt: skip

    return publish
