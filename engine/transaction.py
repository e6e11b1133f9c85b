"""A session's transaction: what it read from topics and what it will publish.

The read set records, per (topic id, consumer, partition), the committed
offset the read started from (``basis``, None when nothing was committed yet)
and the end of the range read. At commit each basis must still be the
committed offset (nobody moved it meanwhile), or the transaction fails with
40001; then the committed offsets move to the ends of the ranges.

The write set holds topic writes (wire batches with their target partition or
None for routing) to publish at commit. Reads inside the transaction do not
see its own topic writes. An explicit transaction keeps only a small buffer of
them in memory and spills the rest to a file of its own, under a cap for the
whole database (``engine.staged_writes``: 54000 past it); ``release`` gives its
share back and deletes the file when the transaction ends, however it ends.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from engine.key_lookup import table_names
from engine.staged_writes import SpilledBatch, TransactionStaging
from planner.access import relation_access
from planner.operations import (
    AppendRecords,
    CommitConsumerOffsets,
    Introspect,
    ReadRecords,
    RunQuery,
    SetConsumerOffsets,
    TransactionControl,
)

ReadKey = tuple[str, str, int]  # (topic id, consumer, partition)


class SessionState(enum.Enum):
    IDLE = "idle"
    IN_TRANSACTION = "in transaction"
    FAILED = "failed transaction"


@dataclass(slots=True)
class ReadRange:
    basis: int | None  # the committed offset observed when the first read began
    start: int
    end: int


class PendingWrite:
    """One staged topic write: a batch in memory, or where it was spilled."""

    __slots__ = ("_batch", "_spilled", "_staging", "moved", "nbytes", "partition", "topic_id")

    def __init__(
        self, topic_id: str, batch: pa.RecordBatch, partition: int | None, moved: Any = None
    ) -> None:
        self.topic_id = topic_id
        self.partition = partition
        # Where its messages were read from (``engine.moved_refs.MovedSource``), when the
        # batch is ``moved_batch`` of that data: it may be committed by reference.
        self.moved = moved
        # What the batch holds in memory: its buffers, a sliced one counted whole (it
        # stays alive whole). ``batch.nbytes`` (slices counted by range) costs ~20 us.
        self.nbytes = batch.get_total_buffer_size()
        self._batch: pa.RecordBatch | None = batch
        self._spilled: SpilledBatch | None = None
        self._staging: TransactionStaging | None = None

    @property
    def batch(self) -> pa.RecordBatch:
        """The batch (read back from the spill file if it was spilled)."""
        if self._batch is not None:
            return self._batch
        assert self._staging is not None and self._spilled is not None
        return self._staging.read(self._spilled)

    @property
    def spilled(self) -> bool:
        return self._batch is None

    def place(self, staging: TransactionStaging) -> None:
        """Account for the write in ``staging``: it stays in memory or goes to disk."""
        assert self._batch is not None and self._staging is None
        spilled = staging.place(self._batch, self.nbytes)
        if spilled is not None:
            self._batch, self._spilled, self._staging = None, spilled, staging


@dataclass(slots=True)
class Transaction:
    explicit: bool
    started_s: float = 0.0  # monotonic time of BEGIN
    reads: dict[ReadKey, ReadRange] = field(default_factory=dict)
    writes: list[PendingWrite] = field(default_factory=list)
    staged_bytes: int = 0
    # Leases the reads of members were made under: (topic id, consumer, partition) -> lease.
    leases: dict[ReadKey, Any] = field(default_factory=dict)
    # Offset moves of explicit COMMIT OFFSETS statements, committed with the transaction.
    offset_moves: dict[ReadKey, int] = field(default_factory=dict)
    # Ranges of those statements the committed offset has not reached yet: remembered by
    # the catalog (``Catalog.remember_ranges``) only when the transaction commits, so a
    # rolled-back or failed COMMIT OFFSETS moves nothing later.
    offset_ranges: dict[ReadKey, list[tuple[int, int]]] = field(default_factory=dict)
    # A DuckDB transaction is open on the session's connection for this transaction: an
    # explicit one's from its first statement that needed DuckDB (``Session.cursor``; BEGIN
    # opens none), an autocommit statement's when it wrote catalog rows or its commit
    # opened one for its record row. Only an open one is committed or rolled back.
    duckdb_open: bool = False
    # Whether a statement of the transaction may have changed a DuckDB table (or the
    # catalog's tables): such a transaction commits through DuckDB (a record row and
    # DuckDB's COMMIT); one that did not commits in the staging log alone
    # (``engine.commit``). Set conservatively by ``note_plan`` and ``note_table_write``.
    touches_tables: bool = False
    # The tables (``key_lookup.table_names``) its statements may have changed, None: any
    # (DDL, a statement not understood, a front's own write); kept beside
    # ``touches_tables`` by ``note_plan`` and ``note_table_write``. Its DuckDB commit is
    # bracketed with them (``key_lookup.changing_tables``).
    tables_changed: frozenset[str] | None = frozenset()
    # Set once the transaction passed its commit point (its COMMIT succeeded); never for
    # one that rolled back, explicitly, as a failed transaction, or at a failed COMMIT.
    # Fronts read it after the fact (a WITH HOLD cursor outlives only a committed one).
    committed: bool = False
    # Explicit transactions: the memory buffer and spill file of their writes (None:
    # writes stay in memory, as an autocommit statement's, which never wait for COMMIT).
    staging: TransactionStaging | None = None
    # engine.privilege_cache's generation when the DuckDB transaction opened (before
    # DuckDB took this transaction's snapshot; None before that): while it has not
    # moved, what this transaction reads of owners and grants is what everyone would
    # read, and may be cached.
    privilege_generation: int | None = None
    # Counter upserts kept as deltas (``engine.deltas``), with their reservations and the
    # statements (text, parameters) to run the DuckDB way if the transaction touches
    # DuckDB later or its deltas may not commit as such.
    deltas: list[Any] = field(default_factory=list)
    reservations: list[Any] = field(default_factory=list)
    delta_statements: list[tuple[str, Any]] = field(default_factory=list)
    delta_bytes: int = 0  # bound of the kept deltas' bytes in the commit record
    # Whether this transaction counts as a DuckDB-way writer (``DeltaApplier.writer_begins``).
    delta_writer: bool = False

    def note_plan(self, plan: Any) -> None:
        """Before a statement of the transaction runs: note whether it may write tables.
        Only topic reads and writes, offset commands, introspection and SELECTs that
        write no table are known not to; anything else counts as a table write."""
        if not self.touches_tables and not all(map(_table_free, plan.operations)):
            self.touches_tables = True
        for operation in plan.operations:
            if self.tables_changed is None:
                break
            changed = _tables_changed_by(operation)
            self.tables_changed = None if changed is None else self.tables_changed | changed

    def note_table_write(self, names: tuple[str, ...] | None = None) -> None:
        """A front wrote tables through the session's cursor itself (in this transaction):
        ``names`` (as written: possibly qualified), None when not known (any table)."""
        self.touches_tables = True
        if self.tables_changed is not None:
            self.tables_changed = (
                None if names is None else self.tables_changed | table_names(names)
            )

    def read_position(self, key: ReadKey) -> int | None:
        """Where this transaction's next read of ``key`` continues, if it read before."""
        existing = self.reads.get(key)
        return None if existing is None else existing.end

    def record_read(self, key: ReadKey, basis: int | None, start: int, end: int) -> None:
        existing = self.reads.get(key)
        if existing is None:
            self.reads[key] = ReadRange(basis, start, end)
            return
        assert start >= existing.end or start == existing.start, (start, existing)
        existing.end = max(existing.end, end)

    def add_write(self, write: PendingWrite) -> None:
        """Stage ``write``; 54000 (and nothing staged) past the database's cap."""
        if self.staging is not None:
            write.place(self.staging)
        self.writes.append(write)
        self.staged_bytes += write.nbytes

    def writes_to_commit(self) -> list[PendingWrite]:
        """The writes, for COMMIT to read: waits first for a turn to read spilled ones back
        into memory (``engine.staged_writes``; ``release`` ends the turn)."""
        if self.staging is not None:
            self.staging.start_read_back()
        return self.writes

    def release(self) -> None:
        """The transaction ended: give its staged bytes back, delete its spill file."""
        if self.staging is not None:
            self.staging.release()


_DML_TAGS = ("INSERT", "UPDATE", "DELETE", "MERGE")
# Statements that change no table's rows nor which table a name is (catalog listings,
# descriptions, a checkpoint, statistics, a comment). Not RESET, PRAGMA, CALL nor any SET
# but ``_SESSION_NAMES_SET``: a setting such as ``default_collation`` changes how every
# table's keys compare.
_NO_TABLE_CHANGE_TAGS = frozenset({
    "SHOW", "DESCRIBE", "SUMMARIZE", "CHECKPOINT", "EMPTY", "ANALYZE", "VACUUM", "COMMENT",
})  # fmt: skip
# SET of the per-connection settings that say where names are looked up (the sandbox
# allows no other SET): how this session's names resolve (``key_lookup.names_plain``),
# not any table's rows nor how keys compare.
_SESSION_NAMES_SET = re.compile(
    r"SET\s+(?:SESSION\s+|LOCAL\s+)?(?:search_path|schema)\s*(?:=|TO\b)", re.IGNORECASE
)
# DDL whose relations ``planner.access.relation_access`` names (what it creates, drops,
# renames, alters, indexes or truncates, and what it reads); any other (schemas,
# sequences, macros, types) may change tables it does not name.
_NAMED_DDL_TAGS = frozenset({
    "CREATE TABLE", "DROP TABLE", "ALTER TABLE", "CREATE VIEW", "DROP VIEW", "CREATE INDEX",
    "TRUNCATE TABLE",
})  # fmt: skip
# PRAGMAs that only report (not ``PRAGMA x = ...``, a setting, nor import_database).
_REPORTING_PRAGMA = re.compile(
    r"PRAGMA\s+(version|platform|database_size|database_list|show_tables|show_tables_expanded"
    r"|table_info|storage_info|show|functions|collations|metadata_info|user_agent)\s*(\(|;|$)",
    re.IGNORECASE,
)
_EXPLAIN_ONLY = re.compile(r"EXPLAIN\s+(?!ANALY[SZ]E\b)[A-Za-z]", re.IGNORECASE)
_TABLE_FREE = (
    ReadRecords, AppendRecords, CommitConsumerOffsets, SetConsumerOffsets, Introspect,
    TransactionControl,
)  # fmt: skip


def _tables_changed_by(operation: Any) -> frozenset[str] | None:
    """The tables (``key_lookup.table_names``) ``operation`` may change; None: any."""
    if _table_free(operation):
        return frozenset()
    if not isinstance(operation, RunQuery):
        return None
    if operation.tag in _DML_TAGS and operation.tables_written:
        return table_names(operation.tables_written + operation.tables_read)
    if operation.tag in _NO_TABLE_CHANGE_TAGS:
        return frozenset()
    if operation.tag == "SET" and _SESSION_NAMES_SET.match(operation.sql.lstrip()):
        return frozenset()
    if operation.tag == "EXPLAIN":  # without ANALYZE nothing runs
        return frozenset() if _EXPLAIN_ONLY.match(operation.sql.lstrip()) else None
    if operation.tag == "PRAGMA":
        return frozenset() if _REPORTING_PRAGMA.match(operation.sql.strip()) else None
    if operation.tag in _NAMED_DDL_TAGS:
        access = relation_access(operation.sql)
        if access.opaque is not None:
            return None
        # Every relation it names (those it only reads too: a few more invalidations
        # rather than one missed); none (something temporary, say): any table.
        named = [name for name, _ in access.needs] + [name for name, _ in access.created]
        named += [*access.dropped, *(name for pair in access.renamed for name in pair)]
        return table_names(tuple(named)) if named else None
    return None


def _table_free(operation: Any) -> bool:
    """True for an operation known not to change any DuckDB table."""
    if isinstance(operation, _TABLE_FREE):
        return True
    if isinstance(operation, RunQuery):
        return operation.projection is not None or (
            operation.tag == "SELECT" and not operation.tables_written
        )
    return False
