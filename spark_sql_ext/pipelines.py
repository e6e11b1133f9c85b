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
- ``to_table``: a topic folded into a DuckDB table ``(key, n)`` of per-key message counts
  (``mode = add``: each micro-batch's counts are added to the totals in the same
  transaction as its idempotency record).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


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
             consumer: str | None = None, once: bool = True, interval: str = "1 second",
             max_per_trigger: int | None = None,
             starting_offsets: str = "earliest") -> Any:  # fmt: skip
    """Start the query that adds each key's message count to ``table`` (``starting_offsets``
    as for ``reshard``)."""
    read = spark.readStream.format("topicbase").options(
        **connection.options(), topic=source, columns="data", startingOffsets=starting_offsets)
    if consumer:
        read = read.option("consumer", consumer)
    if max_per_trigger:
        read = read.option("maxMessagesPerTrigger", str(max_per_trigger))
    path = "$." + key
    counts = read.load().selectExpr(
        f"get_json_object(CAST(data AS STRING), '{path}') AS `{key_column}`",
        f"CAST(1 AS BIGINT) AS `{count_column}`")
    writer = (counts.writeStream.format("topicbase")
              .options(**connection.options(), table=table, mode="add", key=key_column,
                       sinkId=f"to-table:{source}->{table}")
              .option("checkpointLocation", checkpoint))  # fmt: skip
    return _trigger(writer, once, interval).start()
