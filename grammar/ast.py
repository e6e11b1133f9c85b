"""The syntax tree of Topicbase's SQL: one frozen dataclass per statement.

This module owns the shapes the parser yields and the planner consumes. It holds
no logic. Invariants every node keeps:

- Nodes are immutable and hashable; collections are tuples, never lists or dicts.
- Every statement carries ``text`` (its source, without the closing semicolon and
  without leading comments) and ``position`` (where that text starts in the whole
  script). Positions are 1-based line and column plus a 0-based character offset.
- Settings and options are ``tuple[tuple[name, value], ...]`` in the order written,
  with names lower-cased and values already checked and normalised by
  ``grammar.settings`` (so ``dict(node.settings)`` is safe: names are unique).
- Literal values are plain Python: ``int``, ``float``, ``str``, ``bool``, ``None``,
  ``bytes``, ``datetime.timedelta`` (``Interval('PT1S')``), timezone-aware UTC
  ``datetime.datetime`` (``Timestamp(...)``/``Datetime(...)``), a tuple of codec
  names for ``supported_codecs``, key/value pairs for a message's ``metadata``, or
  ``Parameter`` for ``$1``/``?`` placeholders.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TypeAlias


@dataclass(frozen=True)
class SourcePosition:
    """Where a piece of text starts in the whole script."""

    line: int
    column: int
    offset: int


@dataclass(frozen=True)
class Parameter:
    """A bind parameter: ``$3`` has index 3; the n-th ``?`` has index n."""

    index: int


Value: TypeAlias = (
    int
    | float
    | str
    | bool
    | bytes
    | timedelta
    | datetime
    | tuple[str, ...]
    | tuple[tuple[str, str], ...]
    | Parameter
    | None
)
Settings: TypeAlias = tuple[tuple[str, Value], ...]


# -- topic DDL ------------------------------------------------------------------------
@dataclass(frozen=True)
class ConsumerDefinition:
    """``CONSUMER name [WITH (...)]`` inside ``CREATE TOPIC (...)``."""

    name: str
    settings: Settings
    position: SourcePosition


@dataclass(frozen=True)
class CreateTopic:
    name: str
    if_not_exists: bool
    consumers: tuple[ConsumerDefinition, ...]
    settings: Settings
    position: SourcePosition
    text: str


@dataclass(frozen=True)
class AddConsumer:
    name: str
    settings: Settings
    position: SourcePosition


@dataclass(frozen=True)
class DropConsumer:
    name: str
    position: SourcePosition


@dataclass(frozen=True)
class AlterConsumerSet:
    name: str
    settings: Settings
    position: SourcePosition


@dataclass(frozen=True)
class AlterConsumerReset:
    name: str
    setting_names: tuple[str, ...]
    position: SourcePosition


@dataclass(frozen=True)
class SetTopicSettings:
    settings: Settings
    position: SourcePosition


@dataclass(frozen=True)
class ResetTopicSettings:
    setting_names: tuple[str, ...]
    position: SourcePosition


AlterAction: TypeAlias = (
    AddConsumer
    | DropConsumer
    | AlterConsumerSet
    | AlterConsumerReset
    | SetTopicSettings
    | ResetTopicSettings
)


@dataclass(frozen=True)
class AlterTopic:
    name: str
    if_exists: bool
    actions: tuple[AlterAction, ...]
    position: SourcePosition
    text: str


@dataclass(frozen=True)
class DropTopic:
    name: str
    if_exists: bool
    position: SourcePosition
    text: str


# -- transactions and introspection ---------------------------------------------------
@dataclass(frozen=True)
class Begin:
    position: SourcePosition
    text: str


@dataclass(frozen=True)
class Commit:
    position: SourcePosition
    text: str


@dataclass(frozen=True)
class Rollback:
    position: SourcePosition
    text: str


@dataclass(frozen=True)
class ShowTopics:
    position: SourcePosition
    text: str


@dataclass(frozen=True)
class DescribeTopic:
    name: str
    position: SourcePosition
    text: str


@dataclass(frozen=True)
class OffsetRange:
    """``PARTITION p [FROM start] UPTO end``: offsets [start, end) of one partition.

    ``start`` is None when the range begins at the consumer's committed offset.
    """

    partition: int
    start: int | None
    end: int
    position: SourcePosition


@dataclass(frozen=True)
class CommitOffsets:
    """``COMMIT OFFSETS ON TOPIC t FOR CONSUMER c (PARTITION 0 UPTO 10, ...)``."""

    topic: str
    consumer: str
    ranges: tuple[OffsetRange, ...]
    position: SourcePosition
    text: str


@dataclass(frozen=True)
class CommitWrites:
    """``COMMIT WRITES ('id', ...) SINK 's' BATCH n``: publish staged writes exactly once,
    recorded as ``(sink, batch)`` (``engine.write_statements``). Ids are distinct, in the
    order written."""

    write_ids: tuple[str, ...]
    sink_id: str
    batch_id: int
    position: SourcePosition
    text: str


@dataclass(frozen=True)
class AbortWrites:
    """``ABORT WRITES ('id', ...)``: discard staged writes (unknown ids are ignored)."""

    write_ids: tuple[str, ...]
    position: SourcePosition
    text: str


@dataclass(frozen=True)
class SetOffsets:
    """``ALTER TOPIC t ALTER CONSUMER c SET OFFSETS TO target [FORCE]``: move a consumer's
    committed offsets anywhere (Kafka's ``--reset-offsets``), with the transaction.

    ``target`` is "earliest", "latest", "timestamp" (``timestamp`` set: the first
    message written at or after it) or "offsets" (``offsets``: (partition, offset) pairs,
    partitions listed once each). ``force`` allows it while the consumer has live members.
    """

    topic: str
    consumer: str
    target: str
    timestamp: datetime | None
    offsets: tuple[tuple[int, int], ...]
    force: bool
    if_exists: bool
    position: SourcePosition
    text: str


# -- topic reads and writes inside ordinary SQL ---------------------------------------
@dataclass(frozen=True)
class TopicScan:
    """``TOPIC name [WITH (...)]`` standing as a relation; replaced by ``placeholder``.

    ``position`` is where the ``TOPIC`` keyword stands in the script.
    """

    topic: str
    options: Settings
    placeholder: str
    position: SourcePosition


@dataclass(frozen=True)
class SqlStatement:
    """Ordinary DuckDB SQL. ``sql`` is ``text`` with each topic scan replaced by its
    placeholder relation name; with no scans, ``sql == text``."""

    sql: str
    topic_scans: tuple[TopicScan, ...]
    position: SourcePosition
    text: str


@dataclass(frozen=True)
class InsertTopic:
    """``INSERT INTO TOPIC t [(columns)] VALUES ... | query [WITH (...)] [RETURNING ...]``.

    Exactly one of ``values`` (literal rows, one value per column) and ``query`` is set.
    """

    topic: str
    columns: tuple[str, ...]
    values: tuple[tuple[Value, ...], ...] | None
    query: SqlStatement | None
    options: Settings
    returning: tuple[str, ...]
    position: SourcePosition
    text: str


@dataclass(frozen=True)
class Explain:
    statement: Statement
    analyze: bool
    position: SourcePosition
    text: str


# -- privileges and roles (PostgreSQL's GRANT/REVOKE and SET ROLE) --------------------
@dataclass(frozen=True)
class Grant:
    """``GRANT privileges ON [TABLE | TOPIC | SCHEMA | SEQUENCE] names TO grantees``; also
    REVOKE.

    ``privileges`` are upper-case and checked against ``object_kind`` ("ALL" stands for
    every privilege of the kind); ``grantees`` are user names, "" for PUBLIC. For a
    REVOKE, ``grant_option`` means ``GRANT OPTION FOR`` (only the option is taken).
    """

    revoke: bool
    privileges: tuple[str, ...]
    object_kind: str  # "table" (tables and views) | "topic" | "schema" | "sequence"
    objects: tuple[str, ...]
    grantees: tuple[str, ...]
    grant_option: bool
    position: SourcePosition
    text: str


@dataclass(frozen=True)
class SetRole:
    """``SET ROLE name | NONE``, ``RESET ROLE``, ``SET SESSION AUTHORIZATION name |
    DEFAULT``, ``RESET SESSION AUTHORIZATION``; ``role`` None means back to the default."""

    role: str | None
    session_authorization: bool
    position: SourcePosition
    text: str


Statement: TypeAlias = (
    CreateTopic
    | AlterTopic
    | DropTopic
    | Begin
    | Commit
    | Rollback
    | ShowTopics
    | DescribeTopic
    | CommitOffsets
    | CommitWrites
    | AbortWrites
    | SetOffsets
    | InsertTopic
    | SqlStatement
    | Explain
    | Grant
    | SetRole
)
