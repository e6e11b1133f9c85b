"""The options of the ``topicbase`` Spark data source, parsed and checked once.

``url`` (``topicbase://host:port`` of the Flight door; ``topicbase+tls://`` for TLS with
``tlsRootCerts`` a PEM file; ``tlsClientCert``/``tlsClientKey``, PEM files, when the door
asks clients for a certificate), ``user/``password``, ``topic`` or ``table``, ``columns``
(comma-separated topic columns), ``startingOffsets``/``endingOffsets`` (``earliest``,
``latest``, JSON ``{"0": 23, "1": -2}`` per partition — -2 earliest, -1 latest — also
Kafka's ``{"topic": {...}}`` shape — or an ISO-8601 timestamp), ``maxMessagesPerTrigger``,
``consumer`` (a streaming read commits the consumer's offsets as batches complete:
advisory, the read itself is positioned by Spark's checkpoint), ``splitRows`` (messages
per task at most), ``sinkId`` (writes: the idempotency key of a sink; required for
streaming writes so a restarted query recognises its own batches), ``batchId`` (a batch
write's id within its sink, e.g. foreachBatch's), ``mode`` (table writes: ``append``,
``upsert`` or ``add`` — rows summed by key and added to the table's totals) and ``key``,
``pushFilters`` (``true``: push filters on partition, offset and written_at; needs
``spark.sql.python.filterPushdown.enabled``).

Invariant: an ``Options`` is plain data (picklable), so readers and writers carry it to
the tasks; the Flight client is made where it is used.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa

from spark_sql_ext.client import TopicbaseClient

TOPIC_COLUMNS = ("partition", "offset", "seq_no", "producer_id", "message_group_id",
                 "created_at", "written_at", "codec", "data", "metadata")  # fmt: skip
TOPIC_DDL = {
    "partition": "INT", "offset": "BIGINT", "seq_no": "BIGINT", "producer_id": "STRING",
    "message_group_id": "STRING", "created_at": "TIMESTAMP", "written_at": "TIMESTAMP",
    "codec": "STRING", "data": "BINARY", "metadata": "MAP<STRING, BINARY>",
}  # fmt: skip
# The same columns as Arrow types (what the Flight door streams).
TOPIC_ARROW_TYPES = {
    "partition": pa.int32(), "offset": pa.int64(), "seq_no": pa.int64(),
    "producer_id": pa.string(), "message_group_id": pa.string(),
    "created_at": pa.timestamp("us", tz="UTC"), "written_at": pa.timestamp("us", tz="UTC"),
    "codec": pa.string(), "data": pa.binary(), "metadata": pa.map_(pa.string(), pa.binary()),
}  # fmt: skip
EARLIEST, LATEST = -2, -1
DEFAULT_SPLIT_ROWS = 1_000_000


class OptionError(ValueError):
    """A bad or missing option of the data source."""


@dataclass(frozen=True)
class Position:
    """Where a read starts or ends: ``earliest``, ``latest``, per-partition offsets (with
    -2/-1 for earliest/latest) or a time (microseconds since the epoch)."""

    kind: str  # "earliest" | "latest" | "offsets" | "time"
    offsets: tuple[tuple[int, int], ...] = ()
    time_us: int = 0


@dataclass(frozen=True)
class Options:
    url: str
    user: str
    password: str
    topic: str | None
    table: str | None
    columns: tuple[str, ...] | None
    starting: Position
    ending: Position
    max_per_trigger: int | None
    consumer: str | None
    split_rows: int
    sink_id: str | None
    tls_root_certs: str | None
    tls_client_cert: str | None = None
    tls_client_key: str | None = None
    write_mode: str = "append"
    key: tuple[str, ...] = ()
    batch_id: int | None = None
    push_filters: bool = False

    @property
    def target(self) -> dict[str, str]:
        return {"topic": self.topic} if self.topic else {"table": self.table or ""}

    @property
    def write_target(self) -> dict[str, Any]:
        """What a write's ``stage`` calls name: the target, and for tables the mode and key."""
        if self.topic:
            return self.target
        return {**self.target, "mode": self.write_mode, "key": list(self.key)}

    def connect(self) -> TopicbaseClient:
        return TopicbaseClient(self.url, self.user, self.password,
                               tls_root_certs=self.tls_root_certs,
                               tls_client_cert=self.tls_client_cert,
                               tls_client_key=self.tls_client_key)  # fmt: skip

    def topic_ddl(self) -> str:
        columns = self.columns or TOPIC_COLUMNS
        return ", ".join(f"`{c}` {TOPIC_DDL[c]}" for c in columns)


def parse_position(text: str | None, default: str, what: str) -> Position:
    value = (text or default).strip()
    if value.lower() in ("earliest", "latest"):
        return Position(value.lower())
    if value.startswith("{"):
        try:
            decoded = json.loads(value)
            if len(decoded) == 1 and isinstance(next(iter(decoded.values())), dict):
                decoded = next(iter(decoded.values()))  # Kafka's {"topic": {...}}
            offsets = tuple(sorted((int(p), int(o)) for p, o in decoded.items()))
        except (ValueError, TypeError, AttributeError):
            raise OptionError(f"{what}: {value!r} is not a JSON object of offsets") from None
        return Position("offsets", offsets)
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise OptionError(
            f"{what} must be earliest, latest, JSON offsets or an ISO-8601 time, not {value!r}"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return Position("time", time_us=int(moment.timestamp() * 1_000_000))


def _positive(options: Mapping[str, str], name: str) -> int | None:
    text = options.get(name)
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        raise OptionError(f"{name} must be an integer, not {text!r}") from None
    if value < 1:
        raise OptionError(f"{name} must be at least 1, not {value}")
    return value


def parse_options(raw: Mapping[str, Any], *, streaming: bool = False) -> Options:
    """Options from Spark's (case-insensitive) option map."""
    options = {str(k).lower(): str(v) for k, v in raw.items()}
    topic, table = options.get("topic"), options.get("table")
    if bool(topic) == bool(table):
        raise OptionError('give exactly one of the options "topic" and "table"')
    url = options.get("url")
    if not url:
        raise OptionError('the option "url" (topicbase://host:port of the Flight door) is missing')
    columns = None
    if options.get("columns"):
        columns = tuple(c.strip() for c in options["columns"].split(",") if c.strip())
        unknown = [c for c in columns if topic and c not in TOPIC_COLUMNS]
        if unknown:
            raise OptionError(f'"{unknown[0]}" is not a topic column ({", ".join(TOPIC_COLUMNS)})')
    return Options(
        url=url, user=options.get("user", ""), password=options.get("password", ""),
        topic=topic, table=table, columns=columns,
        starting=parse_position(options.get("startingoffsets"),
                                "latest" if streaming else "earliest", "startingOffsets"),
        ending=parse_position(options.get("endingoffsets"), "latest", "endingOffsets"),
        max_per_trigger=_positive(options, "maxmessagespertrigger"),
        consumer=options.get("consumer") or None,
        split_rows=_positive(options, "splitrows") or DEFAULT_SPLIT_ROWS,
        sink_id=options.get("sinkid") or None,
        tls_root_certs=options.get("tlsrootcerts") or None,
        tls_client_cert=options.get("tlsclientcert") or None,
        tls_client_key=options.get("tlsclientkey") or None,
        write_mode=_mode(options), key=tuple(
            k.strip() for k in options.get("key", "").split(",") if k.strip()),
        batch_id=None if options.get("batchid") is None else int(options["batchid"]),
        push_filters=options.get("pushfilters", "false").lower() == "true",
    )  # fmt: skip


def _mode(options: Mapping[str, str]) -> str:
    mode = options.get("mode", "append").lower()
    if mode not in ("append", "upsert", "add"):
        raise OptionError(f"mode must be append, upsert or add, not {mode!r}")
    if mode != "append" and not options.get("key"):
        raise OptionError(f'mode {mode} needs the option "key" (the key columns)')
    return mode


def resolve(client: TopicbaseClient, options: Options, position: Position,
            bounds: list[dict[str, Any]]) -> dict[int, int]:  # fmt: skip
    """A position as one offset per partition, given the partitions' current bounds."""
    if position.kind == "earliest":
        return {b["partition"]: b["start"] for b in bounds}
    if position.kind == "latest":
        return {b["partition"]: b["end"] for b in bounds}
    if position.kind == "time":
        _, tickets = client.tickets({**options.target, "columns": ["offset"],
                                     "start_time_us": position.time_us,
                                     "split_rows": 1 << 62})  # fmt: skip
        found = {t["partition"]: t["start"] for t in tickets}
        return {b["partition"]: found.get(b["partition"], b["end"]) for b in bounds}
    given = dict(position.offsets)
    result = {}
    for bound in bounds:
        offset = given.get(bound["partition"], EARLIEST)
        if offset == EARLIEST:
            offset = bound["start"]
        elif offset == LATEST:
            offset = bound["end"]
        result[bound["partition"]] = min(max(offset, bound["start"]), bound["end"])
    return result
