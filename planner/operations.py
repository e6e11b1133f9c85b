"""The operations the engine can run, and the ``Plan`` that orders them.

A plan is an ordered tuple of atomic operations on topics and tables. Every
operation names the topics (with partitions) and tables it touches, so
``EXPLAIN`` can show them and the engine can check them before running.
Names here are deliberately not the AST's: an AST node says what was written,
an operation says what will be done.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ReadRecords:
    """Read messages of ``topic`` into the relation ``placeholder``.

    With ``consumer`` the read starts at the consumer's committed offsets and
    the range read is committed with the transaction; without, it is a peek.
    """

    topic: str
    topic_id: str
    partitions: tuple[int, ...]
    placeholder: str
    consumer: str | None
    options: dict[str, Any]

    def describe(self) -> str:
        mode = f"consumer {self.consumer}" if self.consumer else "peek"
        extra = ", ".join(f"{k}={v}" for k, v in sorted(self.options.items()) if k != "consumer")
        parts = ",".join(map(str, self.partitions))
        return f"ReadRecords topic={self.topic} partitions=[{parts}] {mode}" + (
            f" ({extra})" if extra else ""
        )


@dataclass(frozen=True)
class UpsertShape:
    """A one-row ``INSERT … ON CONFLICT (keys) DO UPDATE SET`` of arithmetic: the pieces
    ``counter_update`` needs. ``values`` are DuckDB SQL texts, each a literal or ``$n``
    (1-based, the statement's own parameter numbers); names are lower case."""

    table: str
    columns: tuple[str, ...] | None  # the INSERT's column list, None: the table's order
    values: tuple[str, ...]
    conflict: tuple[str, ...]
    assignments: tuple[tuple[str, str], ...]  # (column, expression as DuckDB SQL)


@dataclass(frozen=True)
class UpsertCheck:
    """How the engine tells that an ``INSERT … ON CONFLICT … DO UPDATE`` (without ``WHERE``)
    proposed two rows of one key, which PostgreSQL refuses (21000) and DuckDB would apply
    once, dropping the other (``planner.duckdb_sql.upsert_check``). Every proposed row is
    then either inserted or updates a row, and DuckDB counts each: the statement changed
    fewer rows than it proposed exactly when it proposed a key twice. ``rows``: the number
    of rows of its VALUES; else ``count_sql`` counts the rows its query proposes (run with
    the statement's parameters, before it)."""

    rows: int | None
    count_sql: str | None


@dataclass(frozen=True)
class LookupValue:
    """One side of a lookup's equality: a parameter (``parameter``: 1-based number) or a
    literal (``literal``: a Python int of an integer literal or a str of a string one)."""

    parameter: int | None = None
    literal: int | str | None = None


@dataclass(frozen=True)
class LookupShape:
    """A SELECT of plain columns of one table whose WHERE is only equalities of a column
    and a value (``planner.key_lookup``): ``table`` as written (unqualified); ``columns``
    each projected table column (as written) with its alias (None: DuckDB names it after
    the column), None for ``*``; ``equalities`` (column as written, value) in text order;
    ``parameters`` how many distinct parameters the text uses ($1..$n)."""

    table: str
    columns: tuple[tuple[str, str | None], ...] | None
    equalities: tuple[tuple[str, LookupValue], ...]
    parameters: int


@dataclass(frozen=True)
class RunQuery:
    """Run DuckDB SQL over tables and the relations earlier ``ReadRecords`` produced."""

    sql: str
    tables_read: tuple[str, ...]
    tables_written: tuple[str, ...]
    returns_rows: bool
    tag: str
    system_views: tuple[str, ...] = ()
    uses_parameters: bool = True
    # Set when the query only picks columns of one topic relation: the engine then
    # takes them from the Arrow table directly, without a round trip through DuckDB.
    # (relation placeholder, ((source column, output name), ...))
    projection: tuple[str, tuple[tuple[str, str], ...]] | None = None
    # PostgreSQL's names of the result columns (``planner.column_names``), which the
    # engine gives DuckDB's result; None when the text does not tell (``*``).
    column_names: tuple[str, ...] | None = None
    # A counter-style upsert the engine may run as an UPDATE first (``upsert_shape``).
    upsert: UpsertShape | None = None
    # An upsert of several rows whose count the engine checks (``UpsertCheck``).
    upsert_check: UpsertCheck | None = None
    # A primary-key lookup the engine may answer from an index (``planner.key_lookup``).
    lookup: LookupShape | None = None
    # A SELECT of literals and parameters alone (``planner.literal_select``): it reads
    # nothing of the database or the session, so the engine may run it elsewhere.
    literal_only: bool = False

    def describe(self) -> str:
        read = ",".join(self.tables_read) or "-"
        written = ",".join(self.tables_written) or "-"
        return f"RunQuery reads=[{read}] writes=[{written}]"


@dataclass(frozen=True)
class AppendRecords:
    """Append rows to ``topic``: literal ``rows`` or the result of the preceding query."""

    topic: str
    topic_id: str
    partitions: tuple[int, ...]
    columns: tuple[str, ...]
    rows: tuple[tuple[Any, ...], ...] | None
    options: dict[str, Any]
    returning: tuple[str, ...]

    def describe(self) -> str:
        source = f"{len(self.rows)} literal rows" if self.rows is not None else "query result"
        parts = ",".join(map(str, self.partitions))
        return f"AppendRecords topic={self.topic} partitions=[{parts}] from {source}"


@dataclass(frozen=True)
class CommitConsumerOffsets:
    topic: str
    topic_id: str
    consumer: str
    ranges: tuple[tuple[int, int | None, int], ...]  # (partition, start or None, end)

    def describe(self) -> str:
        spans = ", ".join(
            f"p{p}:[{'committed' if s is None else s},{e})" for p, s, e in self.ranges
        )
        return f"CommitConsumerOffsets topic={self.topic} consumer={self.consumer} {spans}"


@dataclass(frozen=True)
class SetConsumerOffsets:
    """Move ``consumer``'s committed offsets of ``partitions`` to ``target`` (see
    ``ast.SetOffsets``); ``offsets`` holds the explicit (partition, offset) pairs."""

    topic: str
    topic_id: str
    consumer: str
    partitions: tuple[int, ...]
    target: str  # "earliest" | "latest" | "timestamp" | "offsets"
    timestamp_us: int | None
    offsets: tuple[tuple[int, int], ...]
    force: bool

    def describe(self) -> str:
        where = {
            "timestamp": f"timestamp_us={self.timestamp_us}",
            "offsets": ", ".join(f"p{p}:{o}" for p, o in self.offsets),
        }.get(self.target, self.target)
        forced = " force" if self.force else ""
        return f"SetConsumerOffsets topic={self.topic} consumer={self.consumer} {where}{forced}"


@dataclass(frozen=True)
class CreateTopicEntry:
    name: str
    settings: dict[str, Any]
    consumers: dict[str, dict[str, Any]]
    if_not_exists: bool

    def describe(self) -> str:
        return f"CreateTopic {self.name} consumers=[{','.join(self.consumers)}]"


@dataclass(frozen=True)
class AlterTopicEntry:
    name: str
    topic_id: str
    settings: dict[str, Any]  # the complete new settings
    consumers: dict[str, dict[str, Any]]  # the complete new consumer set
    added_partitions: int

    def describe(self) -> str:
        return f"AlterTopic {self.name} consumers=[{','.join(self.consumers)}]" + (
            f" add_partitions={self.added_partitions}" if self.added_partitions else ""
        )


@dataclass(frozen=True)
class DropTopicEntry:
    name: str
    topic_id: str | None
    if_exists: bool

    def describe(self) -> str:
        return f"DropTopic {self.name}"


@dataclass(frozen=True)
class TransactionControl:
    action: str  # "begin" | "commit" | "rollback"

    def describe(self) -> str:
        return f"Transaction {self.action.upper()}"


@dataclass(frozen=True)
class Introspect:
    """SHOW TOPICS / DESCRIBE TOPIC: answered from the catalog and storage."""

    what: str  # "topics" | "topic"
    topic: str | None = None

    def describe(self) -> str:
        return f"Introspect {self.what}" + (f" {self.topic}" if self.topic else "")


@dataclass(frozen=True)
class ChangePrivileges:
    """GRANT or REVOKE: ``privileges`` ("ALL" for every one of the kind) on ``objects`` of
    ``object_kind`` ("table", "topic", "schema") to or from ``grantees`` ("" is PUBLIC)."""

    revoke: bool
    privileges: tuple[str, ...]
    object_kind: str
    objects: tuple[str, ...]
    grantees: tuple[str, ...]
    grant_option: bool

    def describe(self) -> str:
        verb = "Revoke" if self.revoke else "Grant"
        whom = ",".join(g or "PUBLIC" for g in self.grantees)
        return (f"{verb} {','.join(self.privileges)} on {self.object_kind} "
                f"{','.join(self.objects)} {'from' if self.revoke else 'to'} {whom}")  # fmt: skip


@dataclass(frozen=True)
class SwitchRole:
    """SET ROLE / SET SESSION AUTHORIZATION (``role`` None: back to the default)."""

    role: str | None
    session_authorization: bool

    def describe(self) -> str:
        what = "SessionAuthorization" if self.session_authorization else "Role"
        return f"Set{what} {self.role or 'DEFAULT'}"


Operation = (
    ReadRecords
    | RunQuery
    | AppendRecords
    | CommitConsumerOffsets
    | SetConsumerOffsets
    | CreateTopicEntry
    | AlterTopicEntry
    | DropTopicEntry
    | TransactionControl
    | Introspect
    | ChangePrivileges
    | SwitchRole
)


@dataclass(frozen=True)
class Plan:
    """Operations in the order the engine runs them; ``tag`` is the command tag."""

    operations: tuple[Operation, ...]
    tag: str
    explain_only: bool = False
    notes: tuple[str, ...] = field(default=())
    line: int = 1  # where the statement starts in its script (for error positions)

    def describe(self) -> str:
        lines = [f"Plan {self.tag}"]
        lines += [f"  {index}. {op.describe()}" for index, op in enumerate(self.operations, 1)]
        lines += [f"  note: {note}" for note in self.notes]
        return "\n".join(lines)
