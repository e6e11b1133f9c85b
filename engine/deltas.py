"""Counter deltas: blind counter upserts committed in the staging log, applied to DuckDB later.

A statement ``INSERT INTO t VALUES ($1, $2) ON CONFLICT (k) DO UPDATE SET n = n + EXCLUDED.n``
(the shape ``planner.duckdb_sql.counter_update`` recognises, narrowed by ``plan_delta``) in
an explicit transaction that has not touched DuckDB otherwise is not run at its statement:
the session keeps it as a *delta* (table, key values, amounts) and the transaction stays
topic-only. It commits by ``Committer.commit_in_log`` (one group-committed fsync) with its
deltas in its commit record. The ``DeltaApplier`` of the database then adds committed deltas
to DuckDB in log order, in groups (summed per key: additions commute), and in the same DuckDB
transaction moves a durable *applied-through* position (``APPLIED_TABLE``); a group's keys of
one table go in one set-based UPDATE (``_add_set``), and the applier gathers a group for up to
``GATHER_S`` unless a statement waits for the deltas (``wait_visible``). Recovery applies
the deltas of records past that position (idempotent: the position and the rows commit
together); the checkpoint waits until every registered delta is applied before it may pass a
record (``drain``), so no record whose deltas are unapplied is ever dropped.

**Why the applier can never fail on a committed delta** (the rule, all of it checked before
a delta is kept; otherwise the statement runs the DuckDB way, as before):

1. *Shape*: every value of the INSERT is a parameter; every non-key column is assigned
   exactly ``c = c + EXCLUDED.c``; the table's only unique constraint is exactly the
   conflict key, it has no CHECK / FOREIGN KEY / other index / generated column /
   collation (``tables.upsert_columns``), it is a base table of a persistent database
   (not ``temp``), and is named by its qualified name in the delta. *Which* table: the
   one DuckDB resolves the bare name to, and only when that is certain (``relation_of``:
   the only relation of that name anywhere, in the current schema of the search path's
   first entry; never the internal schema), so the delta writes what the statement would
   have written, the table the sandbox and privileges checked by that name. A session's
   plans are forgotten after any statement but a plain query or DML (``SET search_path``).
2. *Types*: counter columns are TINYINT, SMALLINT, INTEGER or BIGINT; key columns VARCHAR
   or one of those; the given key values are Python ``str`` / ``int`` of the key's type and
   range and the amounts ``int`` (no NULL, no bool, no float, no text to cast), and text
   encodes as UTF-8 (a lone surrogate does not): no cast of the applier can fail and keys
   compare in DuckDB as they compare in Python.
3. *No overflow*, by a bound that cannot be wrong: per table, ``B`` bounds ``|v|`` of every
   counter value of every row as DuckDB holds it, and ``R`` is the sum, over the deltas
   kept and not yet folded into ``B``, of each delta's largest ``|amount|``. Any value the
   row can take in any order of applying them is within ``B + R`` of zero; a delta is kept
   only if ``B + R + max|amount| <= `` the smallest counter type's maximum. ``B`` is
   learned by reading ``min``/``max`` of the counter columns under the apply lock (no group
   commits meanwhile), is grown by ``R``'s share when a group is applied, and is valid only
   while no DuckDB-way writer could have changed the table (the *epoch* below).
4. *No other writer meanwhile*: every session transaction that may write DuckDB tables the
   DuckDB way (any statement ``Transaction.note_plan`` counts as writing, DDL, DROP,
   ALTER, GRANT and a flushed delta included) calls ``writer_begins`` before that
   statement runs: under the commit lock it counts itself, moves the epoch and then waits
   until every delta registered so far is applied. While a writer is open no delta is
   kept, and a kept delta whose epoch moved before its commit is run the DuckDB way at
   COMMIT (also when the epoch moved during the commit's validation: ``DeltasOutdated``).
   The plan must be as fresh: the epoch is read before the statement's plan is worked
   out and must be unchanged at ``reserve`` (a DROP and CREATE in between would make a
   stale plan); nor is a delta kept while the applier fails on a group. A kept statement
   run the DuckDB way runs only on the table it was kept for (same oid and columns, else
   40001: ``Session._check_unmoved``), never on another table that took its name.
   So the applier never writes a table while a DuckDB-way writer is open (no write-write
   conflict, no DDL in between, no value changed behind ``B``); it retries a group that
   fails all the same (a conflict, an I/O error) and never drops one. Every attempt is
   idempotent (the position is read in the attempt's DuckDB transaction and the records
   at or before it skipped), reads wait through failures and raise 58030 only once
   ``FAILURES_PERSISTENT`` attempts in a row failed, and recovery that cannot apply them
   fails the open (58030) rather than drop a committed delta.
5. *Bounded*: a transaction's kept deltas take at most ``RECORD_BYTES_MAX`` of its commit
   record and count in the staged-writes memory budget; past either the upsert runs the
   DuckDB way (with the kept ones before it). The committed, unapplied deltas of the
   database are bounded (``PENDING_*_MAX``): past it nothing is kept, and a commit that
   would pass it runs its deltas the DuckDB way. Every wait of a statement for the
   applier ends at the session's cancel (57014: CancelRequest, ``statement_timeout``).

Reads see committed deltas: every statement that uses the session's DuckDB cursor first
waits (``wait_visible``) until every delta registered before it is applied (a compare of
two counters when none are pending); an explicit transaction does so when its DuckDB
transaction opens, before its snapshot. A later statement of the transaction that keeps
deltas and touches DuckDB first runs the kept statements in its DuckDB transaction
(``Session._flush_deltas``), which then commits the DuckDB way. Semantics change: two
sessions adding to one key no longer meet DuckDB's write-write conflict (serializable for
blind increments, which commute).

Thread-safety: ``_mutex`` guards the counters, entries and bounds; ``_apply_lock`` is held
while a group is applied or a bound learned; the commit lock is taken before ``_mutex``,
never after. Nothing here waits while holding the commit lock.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import logging
import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from engine import key_lookup, tables
from engine.catalog import SCHEMA
from engine.tables import quote_identifier
from planner.operations import UpsertShape
from storage import failpoints
from storage.errors import QueryCanceledError, SerializationFailure, StorageIOError

# The bounds of kept and of committed-but-unapplied deltas, with their reasons in
# ``storage.limits``; read by these names (tests lower them on this module).
from storage.limits import DELTAS_PENDING_BYTES_MAX as PENDING_BYTES_MAX
from storage.limits import DELTAS_PENDING_DELTAS_MAX as PENDING_DELTAS_MAX
from storage.limits import DELTAS_PENDING_RECORDS_MAX as PENDING_RECORDS_MAX
from storage.limits import DELTAS_RECORD_BYTES_MAX as RECORD_BYTES_MAX  # noqa: F401 (session)

log = logging.getLogger(__name__)

APPLIED_TABLE = f"{SCHEMA}.delta_applied"
APPLIED_DDL = f"""
CREATE TABLE IF NOT EXISTS {APPLIED_TABLE} (file_number BIGINT NOT NULL, position BIGINT NOT NULL);
"""
GROUP_MAX = 256  # commit records applied in one DuckDB transaction at most
# A table's keys of a group are applied by one UPDATE joined to them (``_add_set``) from
# this many keys on; fewer by an UPDATE per key (cheaper for one: measured, move_profile.md).
SET_BASED_MIN = 2
# The applier gathers a group: once the head record is durable it waits up to GATHER_S for
# more (until GATHER_RECORDS are durable), unless a statement waits for the deltas (a read,
# a writer, the checkpoint's drain, close), which wakes it at once. Each group costs a DuckDB
# transaction (~2-2.5 ms CPU at 4 sessions whatever its size: move_profile.md round 8), so
# fewer, larger groups cost less; nobody sees the delay (every reader waits for the deltas
# registered before it, and its wait starts the group). 40 ms (was 10): at 16 sessions of
# the move groups of ~35 records instead of ~18, the applier's CPU 0.15 -> 0.10 ms per
# transaction, at 4 sessions 0.19-0.23 -> 0.11-0.13 (move_profile.md round 10).
GATHER_S = 0.04
GATHER_RECORDS = 64
# A failure of the head group is persistent (reads raise 58030 instead of waiting) once this
# many attempts in a row failed (~0.25 s of retries with the backoff): a transient error
# that the next attempt fixes makes nobody fail.
FAILURES_PERSISTENT = 8
# How often a wait (``wait_visible``, ``_learn``) looks at its statement's cancel flag.
CANCEL_POLL_S = 0.02
INTEGER_MAX = {"TINYINT": 2**7 - 1, "SMALLINT": 2**15 - 1, "INTEGER": 2**31 - 1,
               "BIGINT": 2**63 - 1}  # fmt: skip
KEY_TYPES = frozenset({"VARCHAR", *INTEGER_MAX})
LogPosition = tuple[int, int]
Cancelled = Callable[[], bool]  # whether the waiting statement was cancelled (57014)


def enabled() -> bool:
    """Counter deltas are on unless ``TOPICBASE_COUNTER_DELTAS=0`` (for A/B measurements)."""
    return os.environ.get("TOPICBASE_COUNTER_DELTAS", "1") != "0"


@dataclass(frozen=True, slots=True)
class DeltaPlan:
    """How one upsert text becomes a delta on one schema generation (``plan_delta``)."""

    table: tuple[str, str, str]  # database, schema, table
    keys: tuple[str, ...]
    key_types: tuple[str, ...]
    counters: tuple[str, ...]
    counter_types: tuple[str, ...]
    key_parameters: tuple[int, ...]  # 0-based parameter of each key column
    amount_parameters: tuple[int, ...]  # 0-based parameter of each counter column
    parameter_count: int
    limit: int  # the smallest counter type's maximum
    table_oid: int  # DuckDB's oid of the table when planned (``relation_of``)
    columns: tuple[tuple[str, str], ...]  # (name, type) of the table when planned

    def bind(self, parameters: Any) -> Delta | None:
        """The delta of one execution, or None if a value breaks rule 2 (module doc)."""
        if not isinstance(parameters, list | tuple) or len(parameters) != self.parameter_count:
            return None
        keys = tuple(parameters[i] for i in self.key_parameters)
        amounts = tuple(parameters[i] for i in self.amount_parameters)
        for value, kind in zip(keys, self.key_types, strict=True):
            if kind == "VARCHAR":
                if type(value) is not str or "\x00" in value or not _utf8(value):
                    return None
            elif type(value) is not int or not -INTEGER_MAX[kind] - 1 <= value <= INTEGER_MAX[kind]:
                return None
        for value, kind in zip(amounts, self.counter_types, strict=True):
            if type(value) is not int or not -INTEGER_MAX[kind] - 1 <= value <= INTEGER_MAX[kind]:
                return None
        return Delta(self, keys, amounts)


def _utf8(text: str) -> bool:
    """Whether ``text`` encodes as UTF-8 (a lone surrogate does not: DuckDB refuses it
    with 22P02 at the statement, which the applier could never apply)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


@dataclass(frozen=True, slots=True)
class Delta:
    plan: DeltaPlan
    key_values: tuple[Any, ...]
    amounts: tuple[int, ...]

    def record_bytes(self) -> int:
        """A bound of this delta's bytes in the commit record's JSON (``to_json``): a
        character of a key takes at most 12 bytes there (a surrogate pair of escapes), an
        integer at most 21, the plan's names their text, escaped, plus separators."""
        p = self.plan
        names = sum(len(n) for n in (*p.table, *p.keys, *p.key_types, *p.counters,
                                      *p.counter_types))  # fmt: skip
        keys = sum(len(v) if type(v) is str else 4 for v in self.key_values)
        fields = len(p.keys) * 2 + len(p.counters) * 2 + 3 + len(self.key_values)
        return 12 * (names + keys) + 24 * (len(self.amounts) + fields) + 64

    def to_json(self) -> list:
        p = self.plan
        return [list(p.table), list(p.keys), list(p.key_types), list(p.counters),
                list(p.counter_types), list(self.key_values), list(self.amounts)]  # fmt: skip


@dataclass(frozen=True, slots=True)
class StoredDelta:
    """A delta as its commit record holds it (what the applier and recovery need)."""

    table: tuple[str, str, str]
    keys: tuple[str, ...]
    key_types: tuple[str, ...]
    counters: tuple[str, ...]
    counter_types: tuple[str, ...]
    key_values: tuple[Any, ...]
    amounts: tuple[int, ...]

    @staticmethod
    def from_json(item: list) -> StoredDelta:
        table, keys, key_types, counters, counter_types, key_values, amounts = item
        return StoredDelta(tuple(table), tuple(keys), tuple(key_types), tuple(counters),
                           tuple(counter_types), tuple(key_values), tuple(amounts))  # type: ignore[arg-type]  # fmt: skip


def stored(delta: Delta) -> StoredDelta:
    return StoredDelta.from_json(delta.to_json())


def plan_delta(shape: UpsertShape, columns: tuple[tuple[str, str], ...],
               relation: tuple[str, str, int]) -> DeltaPlan | None:  # fmt: skip
    """The delta plan of ``shape`` on a table of ``columns`` ((name, type), lower case) in
    ``relation`` (database, schema, table oid: ``relation_of``), or None unless rules 1-2
    of the module doc hold.
    The caller has checked the table with ``tables.upsert_columns`` (rule 1's table part)."""
    if relation[0] == "temp":
        return None
    types = dict(columns)
    names = tuple(name for name, _ in columns)
    given = shape.columns if shape.columns is not None else names
    if len(given) != len(shape.values) or sorted(given) != sorted(names):
        return None
    if not all(v.startswith("$") and v[1:].isdigit() for v in shape.values):
        return None
    position = {column: int(value[1:]) - 1 for column, value in zip(given, shape.values,
                                                                     strict=True)}  # fmt: skip
    numbers = sorted(position.values())
    if numbers != list(range(len(numbers))):
        return None  # a parameter used twice or a gap: not this shape
    keys = tuple(shape.conflict)
    counters = tuple(name for name in names if name not in keys)
    assigned = {column: text for column, text in shape.assignments}
    if sorted(assigned) != sorted(counters) or not counters:
        return None
    for column in counters:
        if not _is_blind_increment(assigned[column], column, shape.table):
            return None
    if any(types[k] not in KEY_TYPES for k in keys):
        return None
    if any(types[c] not in INTEGER_MAX for c in counters):
        return None
    return DeltaPlan(
        (relation[0], relation[1], shape.table), keys, tuple(types[k] for k in keys), counters,
        tuple(types[c] for c in counters), tuple(position[k] for k in keys),
        tuple(position[c] for c in counters), len(numbers),
        min(INTEGER_MAX[types[c]] for c in counters), relation[2], columns,
    )  # fmt: skip


def _is_blind_increment(text: str, column: str, table: str) -> bool:
    """``column + EXCLUDED.column`` (or the sum the other way round), nothing else."""
    import sqlglot
    from sqlglot import expressions as exp

    try:
        tree = sqlglot.parse_one(text, read="duckdb")
    except sqlglot.errors.SqlglotError:
        return False
    while isinstance(tree, exp.Paren):
        tree = tree.this
    if not isinstance(tree, exp.Add):
        return False
    sides = [tree.this, tree.expression]
    own = [s for s in sides if isinstance(s, exp.Column) and s.name.lower() == column
           and s.table.lower() in ("", table)]  # fmt: skip
    excluded = [s for s in sides if isinstance(s, exp.Column) and s.name.lower() == column
                and s.table.lower() == "excluded"]  # fmt: skip
    return len(own) == 1 and len(excluded) == 1


_SIMPLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_$]*")


def relation_of(cursor: Any, table: str) -> tuple[str, str, int] | None:
    """(database, schema, table_oid) of the base table an unqualified ``table`` names for
    this connection, or None unless it is known to be exactly the one DuckDB resolves.

    Kept only when ``table`` is the name of exactly one relation (table or view) in every
    database and schema this connection sees, and that relation is a base table in the
    connection's current schema of its current database: the first entry of its search
    path (an empty search path: ``main``), given as a plain name or ``database.schema``.
    DuckDB resolves an unqualified name through that entry first (temporary objects
    before it; none can have the name), so the DuckDB way's statement writes this table
    and no other. A table in another schema (``__topicbase`` included), a quoted or
    unusual search path, a temporary table: None, so the statement runs the DuckDB way
    (which resolves the name itself, or fails). The oid names the table as it is now
    (a rename keeps it, a new table of the name gets another: ``check_unmoved``)."""
    rows = _relations_named(cursor, table)
    if len(rows) != 1 or rows[0][2] is None:
        return None
    database, schema, oid = str(rows[0][0]), str(rows[0][1]), int(rows[0][2])
    if not _first_in_path(cursor, database, schema):
        return None
    return database, schema, oid


def _relations_named(cursor: Any, table: str) -> list[tuple[Any, ...]]:
    """Every relation named ``table`` (case-insensitively) in every database and schema
    this connection sees, as (database, schema, oid): tables with their oid, views with
    None."""
    return tables.fetch_rows(
        cursor,
        "SELECT database_name, schema_name, table_oid FROM duckdb_tables() "
        "WHERE lower(table_name) = ? UNION ALL "
        "SELECT database_name, schema_name, NULL FROM duckdb_views() WHERE lower(view_name) = ?",
        [table.lower(), table.lower()],
    )


def _first_in_path(cursor: Any, database: str, schema: str) -> bool:
    """Whether ``database.schema`` is the current schema of the current database, the
    first entry of the search path (an empty one: ``main``), given plainly; never the
    internal schema, ``temp`` or ``system``."""
    if schema.lower() == SCHEMA.lower() or database.lower() in ("temp", "system"):
        return False
    current = tables.fetch_rows(
        cursor, "SELECT current_database(), current_setting('search_path')", None
    )
    if len(current) != 1:
        return False
    current_database, path = str(current[0][0]), str(current[0][1])
    first = path.split(",")[0].strip() if path.strip() else "main"
    parts = first.split(".")
    if len(parts) == 1:
        parts = [current_database, parts[0]]
    if len(parts) != 2 or not all(_SIMPLE_NAME.fullmatch(part) for part in parts):
        return False
    if [parts[0].lower(), parts[1].lower()] != [database.lower(), schema.lower()]:
        return False
    return database.lower() == current_database.lower()


def resolves_to(cursor: Any, table: str, relation: tuple[str, str, int]) -> bool:
    """Whether the unqualified ``table`` still names, for this connection, the base table
    ``relation`` (database, schema, oid: ``relation_of`` when its delta was kept), as
    DuckDB resolves it: the table of that oid still has the name and lives in the search
    path's first entry, the current schema, and no temporary relation of the name comes
    before it. Relations of the name elsewhere (another schema) do not matter here."""
    database, schema, oid = relation
    rows = tables.fetch_rows(
        cursor,
        "SELECT database_name, schema_name, lower(table_name) FROM duckdb_tables() "
        "WHERE table_oid = ?",
        [oid],
    )
    if len(rows) != 1 or [str(v).lower() for v in rows[0]] != [
            database.lower(), schema.lower(), table.lower()]:  # fmt: skip
        return False
    shadows = [row for row in _relations_named(cursor, table) if row[0] == "temp"]
    return not shadows and _first_in_path(cursor, database, schema)


def _check_cancelled(cancelled: Cancelled | None) -> None:
    if cancelled is not None and cancelled():
        raise QueryCanceledError("canceling statement due to user request")


def _summed(deltas: list[StoredDelta]) -> tuple[dict[tuple, list[int]], dict[tuple, StoredDelta]]:
    """The deltas' amounts summed per (shape, key), and one delta of each shape."""
    sums: dict[tuple, list[int]] = {}
    shapes: dict[tuple, StoredDelta] = {}
    for d in deltas:
        shape = (d.table, d.keys, d.key_types, d.counters, d.counter_types)
        shapes.setdefault(shape, d)
        found = sums.setdefault((shape, d.key_values), [0] * len(d.amounts))
        for i, amount in enumerate(d.amounts):
            found[i] += amount
    return sums, shapes


def _applied_position(cursor: Any) -> LogPosition:
    rows = tables.fetch_rows(cursor, f"SELECT file_number, position FROM {APPLIED_TABLE}")
    return max([(0, 0), *((int(a), int(b)) for a, b in rows)])


def _qualified(table: tuple[str, str, str]) -> str:
    return ".".join(quote_identifier(part) for part in table)


def _per_shape(sums: dict[tuple, list[int]]) -> dict[tuple, list[tuple[tuple, list[int]]]]:
    """``_summed``'s sums as (key values, amounts) rows per shape (a table's delta kind)."""
    rows: dict[tuple, list[tuple[tuple, list[int]]]] = {}
    for (shape, key_values), amounts in sums.items():
        rows.setdefault(shape, []).append((key_values, amounts))
    return rows


def _add_one(cursor: Any, d: StoredDelta, key_values: tuple, amounts: list[int]) -> None:
    """One key's summed amounts: UPDATE its row, or INSERT it when there is none."""
    table = _qualified(d.table)
    sets = ", ".join(f"{quote_identifier(c)} = {quote_identifier(c)} + CAST(${i + 1} AS {t})"
                     for i, (c, t) in enumerate(zip(d.counters, d.counter_types,
                                                    strict=True)))  # fmt: skip
    first = len(amounts)
    keys = zip(d.keys, d.key_types, strict=True)
    where = " AND ".join(f"{quote_identifier(k)} = CAST(${first + i + 1} AS {t})"
                         for i, (k, t) in enumerate(keys))  # fmt: skip
    count = tables.execute_count(cursor, f"UPDATE {table} SET {sets} WHERE {where}",
                                 [*amounts, *key_values])  # fmt: skip
    if count:
        return
    names = ", ".join(quote_identifier(c) for c in (*d.keys, *d.counters))
    values = ", ".join(f"CAST(${i + 1} AS {t})"
                       for i, t in enumerate((*d.key_types, *d.counter_types)))  # fmt: skip
    tables.run(cursor, f"INSERT INTO {table} ({names}) VALUES ({values})",
               [*key_values, *amounts])  # fmt: skip


def _add_set(cursor: Any, d: StoredDelta, rows: list[tuple[tuple, list[int]]]) -> None:
    """Several keys' summed amounts in one UPDATE (and one INSERT of the keys it did not
    find). The keys and amounts go in as one list parameter per column, cast to the
    column's type (as ``_add_one`` casts each value; rule 2 makes every cast succeed),
    and ``unnest`` zips them back into rows ``__v(k0.., a0..)``; every name is qualified
    by its alias (``__t`` the table), so no column name of the table can capture one.
    The statement texts depend on the shape only (DuckDB's parse is kept per text)."""
    table = _qualified(d.table)
    types = (*d.key_types, *d.counter_types)
    lists = ", ".join(f"unnest(CAST(${i + 1} AS {t}[]))" for i, t in enumerate(types))
    aliases = ", ".join([*(f'"k{i}"' for i in range(len(d.keys))),
                         *(f'"a{i}"' for i in range(len(d.counters)))])  # fmt: skip
    source = f'(SELECT {lists}) AS "__v"({aliases})'
    match = " AND ".join(f'"__t".{quote_identifier(k)} = "__v"."k{i}"'
                         for i, k in enumerate(d.keys))  # fmt: skip
    sets = ", ".join(f'{quote_identifier(c)} = "__t".{quote_identifier(c)} + "__v"."a{i}"'
                     for i, c in enumerate(d.counters))  # fmt: skip
    parameters = [list(column) for column in zip(*(k + tuple(a) for k, a in rows),
                                                  strict=True)]  # fmt: skip
    updated = tables.execute_count(
        cursor, f'UPDATE {table} AS "__t" SET {sets} FROM {source} WHERE {match}', parameters
    )
    if updated == len(rows):
        return
    names = ", ".join(quote_identifier(c) for c in (*d.keys, *d.counters))
    inserted = tables.execute_count(
        cursor,
        f"INSERT INTO {table} ({names}) SELECT * FROM {source} WHERE NOT EXISTS "
        f'(SELECT 1 FROM {table} AS "__t" WHERE {match})',
        parameters,
    )
    if (updated or 0) + (inserted or 0) != len(rows):  # cannot be: each key is in one of them
        raise StorageIOError(
            f"counter deltas of {table}: {updated} rows updated and {inserted} inserted "
            f"for {len(rows)} keys"
        )


class DeltasOutdated(SerializationFailure):
    """A commit's kept deltas may no longer commit as such (a DuckDB-way writer began since
    they were kept): nothing was committed; they may run the DuckDB way instead."""


@dataclass(slots=True)
class Reservation:
    """A kept delta's share of its table's ``R`` (rule 3), taken at its statement."""

    table: tuple[str, str, str]
    amount: int
    epoch: int


@dataclass(slots=True)
class _Entry:
    """One commit record's deltas, registered under the commit lock in log order."""

    deltas: list[StoredDelta]
    reservations: list[Reservation]
    log_end: LogPosition
    size: int = 0  # the deltas' ``record_bytes`` (the backlog bound)
    durable: bool = False
    doubt: BaseException | None = None


@dataclass(slots=True)
class _Bound:
    epoch: int
    value: int


@dataclass(slots=True)
class ApplierStats:
    groups: int = 0
    records: int = 0
    retries: int = 0
    keys: int = 0
    waits: int = 0
    learned: int = 0
    refused: dict[str, int] = field(default_factory=dict)


class DeltaApplier:
    """Applies committed counter deltas to DuckDB in log order (see the module doc)."""

    def __init__(self, database: Any) -> None:
        self._database = database
        self._cursor = database.root.cursor()
        tables.run(self._cursor, APPLIED_DDL)
        # One row, moved by an UPDATE in each group's transaction (one statement, not two).
        tables.run(self._cursor, f"INSERT INTO {APPLIED_TABLE} SELECT 0, 0 WHERE NOT EXISTS "
                                 f"(SELECT 1 FROM {APPLIED_TABLE})")  # fmt: skip
        self._mutex = threading.Lock()
        self._changed = threading.Condition(self._mutex)
        self._work = threading.Condition(self._mutex)  # the applier's: work to do, or hurry
        self._idle = False  # the applier waits for a durable head record (``_work``)
        self._hurry = 0  # statements waiting for the applier (``wait_visible``)
        self._apply_lock = threading.Lock()
        self._entries: collections.deque[_Entry] = collections.deque()
        self._registered = 0
        self._applied = 0
        self._queued_deltas = 0  # in ``_entries`` (the backlog bound)
        self._queued_bytes = 0
        self._writers = 0
        self._epoch = 0
        self._bounds: dict[tuple[str, str, str], _Bound] = {}
        self._reserved: dict[tuple[str, str, str], int] = {}
        self._halted: BaseException | None = None
        self._failing: BaseException | None = None  # the last group's error, until one applies
        self._failures = 0  # attempts of the head group that failed in a row
        self._closing = False
        self._thread: threading.Thread | None = None
        self.applied_through: LogPosition = (0, 0)
        self.stats = ApplierStats()

    # -- recovery ---------------------------------------------------------------------
    def read_applied_through(self) -> LogPosition:
        self.applied_through = _applied_position(self._cursor)
        return self.applied_through

    def recover(self, records: list[tuple[LogPosition, list[list]]]) -> int:
        """Apply the deltas of committed records past the applied-through position, in one
        DuckDB transaction with the position (idempotent). Returns how many records.

        If they cannot be applied the database does not open (58030, naming the cause):
        each is a committed transaction's, so dropping one would lose it silently, and
        opening with tables that miss it would let reads see a state that never was.
        Every cause known to make an apply fail is refused at the statement (the rules
        of the module doc), so what is left is an I/O error (the next open retries) or a
        bug; the records stay in the staging log (the checkpoint never passed them)."""
        through = self.read_applied_through()
        pending = sorted((end, ds) for end, ds in records if end > through and ds)
        if not pending:
            return 0
        try:  # in groups as the applier applies them (each moves the position)
            for start in range(0, len(pending), GROUP_MAX):
                self._apply([(end, [StoredDelta.from_json(d) for d in ds])
                             for end, ds in pending[start:start + GROUP_MAX]])  # fmt: skip
        except Exception as error:
            raise StorageIOError(
                f"{len(pending)} committed commit records' counter deltas (after log position "
                f"{through}) cannot be applied to their tables: {error}; they are kept in the "
                "staging log and applied at the next open that can"
            ) from error
        return len(pending)

    # -- the statement: may this delta be kept? -------------------------------------------
    def epoch_now(self) -> int:
        """The writers' epoch, read before a statement's delta plan is worked out: a plan
        may be used only if no DuckDB-way writer (DDL included) began since (``reserve``)."""
        with self._mutex:
            return self._epoch

    def reserve(self, delta: Delta, learn_cursor: Any, epoch: int, kept: tuple[int, int] = (0, 0),
                cancelled: Cancelled | None = None) -> Reservation | None:  # fmt: skip
        """Rule 3 and 4 at the statement: a reservation if the delta may be kept, else None
        (the statement then runs the DuckDB way). ``epoch`` is ``epoch_now`` from before
        the delta's plan was worked out: a writer that began since (a DROP and CREATE of
        the table, say) may have made the plan stale, so nothing is kept. Nothing is kept
        either while the applier fails on a group (it may be this kind of delta that it
        cannot apply). ``learn_cursor`` reads the table's bound when it is not known (a
        cursor outside any open DuckDB transaction). ``kept`` (deltas, bytes) the
        transaction kept before this one: nothing is kept that would take the queue past
        its bound (``PENDING_*_MAX``) at the commit. Waiting to learn a bound ends with 57014
        when ``cancelled()``."""
        plan = delta.plan
        amount = max(abs(a) for a in delta.amounts)
        with self._mutex:
            if (self._writers or self._halted is not None or self._closing
                    or self._failing is not None or self._epoch != epoch):  # fmt: skip
                return None
            if self._over_bound(kept[0] + 1, kept[1] + delta.record_bytes()):
                self.stats.refused["backlog"] = self.stats.refused.get("backlog", 0) + 1
                return None
            bound = self._bounds.get(plan.table)
            known = bound is not None and bound.epoch == epoch
        if not known:
            learned = self._learn(plan, learn_cursor, epoch, cancelled)
            if learned is None:
                return None
        with self._mutex:
            if self._writers or self._epoch != epoch:
                return None
            bound = self._bounds.get(plan.table)
            if bound is None or bound.epoch != epoch:
                return None
            reserved = self._reserved.get(plan.table, 0)
            if bound.value + reserved + amount > plan.limit:
                self.stats.refused["overflow"] = self.stats.refused.get("overflow", 0) + 1
                return None
            self._reserved[plan.table] = reserved + amount
            return Reservation(plan.table, amount, epoch)

    def _over_bound(self, deltas: int, size: int) -> bool:
        """Whether a record of ``deltas`` deltas of ``size`` bytes would take the queue of
        committed, unapplied deltas past its bound (caller holds ``_mutex``)."""
        return (len(self._entries) + 1 > PENDING_RECORDS_MAX
                or self._queued_deltas + deltas > PENDING_DELTAS_MAX
                or self._queued_bytes + size > PENDING_BYTES_MAX)  # fmt: skip

    def _learn(self, plan: DeltaPlan, cursor: Any, epoch: int,
               cancelled: Cancelled | None = None) -> int | None:  # fmt: skip
        """Read the table's largest ``|value|`` while no group commits (``_apply_lock``,
        waited for with the statement's cancel honoured: 57014)."""
        columns = ", ".join(
            f"min({quote_identifier(c)}), max({quote_identifier(c)})" for c in plan.counters
        )
        while not self._apply_lock.acquire(timeout=CANCEL_POLL_S):
            _check_cancelled(cancelled)
        try:
            with self._mutex:
                if self._writers or self._epoch != epoch:
                    return None
            rows = tables.fetch_rows(cursor, f"SELECT {columns} FROM {_qualified(plan.table)}")
            values = [abs(int(v)) for v in rows[0] if v is not None] if rows else []
            value = max(values, default=0)
            with self._mutex:
                if self._writers or self._epoch != epoch:
                    return None
                self._bounds[plan.table] = _Bound(epoch, value)
                self.stats.learned += 1
        finally:
            self._apply_lock.release()
        return value

    def release(self, reservations: list[Reservation]) -> None:
        """Kept deltas that will not be applied (rollback, run the DuckDB way instead)."""
        if not reservations:
            return
        with self._mutex:
            for r in reservations:
                self._reserved[r.table] -= r.amount
                assert self._reserved[r.table] >= 0
            reservations.clear()

    def still_valid(self, reservations: list[Reservation]) -> bool:
        with self._mutex:
            return not self._writers and self._halted is None and all(
                r.epoch == self._epoch for r in reservations)  # fmt: skip

    # -- the commit (caller holds the commit lock) ----------------------------------------
    def check_commit(self, reservations: list[Reservation], deltas: list[Delta]) -> None:
        """Refuse a commit whose deltas were kept before a DuckDB-way writer began, or
        that would take the queue of unapplied deltas past its bound (``DeltasOutdated``:
        the session then runs them the DuckDB way and commits so), or while the applier
        stopped at a record in doubt (58030)."""
        with self._mutex:
            halted = self._halted
        if halted is not None:
            raise StorageIOError(
                f"counter deltas wait behind a commit whose outcome is in doubt: {halted}; "
                "reopen the database"
            )
        if not self.still_valid(reservations):
            raise DeltasOutdated(
                "another transaction began writing tables while this one committed its "
                "counter upserts as deltas; retry"
            )
        with self._mutex:
            over = self._over_bound(len(deltas), sum(d.record_bytes() for d in deltas))
            if over:
                self.stats.refused["backlog"] = self.stats.refused.get("backlog", 0) + 1
        if over:
            raise DeltasOutdated("too many committed counter deltas wait to be applied")

    def register(self, deltas: list[Delta], reservations: list[Reservation],
                 log_end: LogPosition) -> _Entry:  # fmt: skip
        """A commit record with ``deltas`` was appended (under the commit lock): queue it in
        log order; the entry takes the reservations over."""
        entry = _Entry([stored(d) for d in deltas], list(reservations), log_end,
                       sum(d.record_bytes() for d in deltas))  # fmt: skip
        reservations.clear()
        with self._mutex:
            assert self._writers == 0
            self._entries.append(entry)
            self._registered += 1
            self._queued_deltas += len(entry.deltas)
            self._queued_bytes += entry.size
        return entry

    def durable(self, entry: _Entry) -> None:
        """The entry's commit record is durable (committed): the applier may apply it."""
        with self._mutex:
            entry.durable = True
            if self._idle or len(self._entries) >= GATHER_RECORDS or self._backlog_half():
                self._work.notify()
            self._start()

    def in_doubt(self, entry: _Entry, error: BaseException) -> None:
        """The entry's record's sync failed: its outcome is for recovery to decide, so the
        applier stops at it until the database is reopened."""
        with self._mutex:
            entry.doubt = error
            if self._halted is None:
                self._halted = error
            self._changed.notify_all()
            self._work.notify()

    # -- writers and readers ------------------------------------------------------------
    def writer_begins(self, cancelled: Cancelled | None = None) -> None:
        """A transaction may now write tables the DuckDB way: no delta is kept until it
        ends, and every delta committed so far is applied before this returns (waited for
        outside the commit lock; 57014 when ``cancelled()``, the writer then ended)."""
        with self._database.commit_lock, self._mutex:
            self._writers += 1
            self._epoch += 1
        try:
            self.wait_visible(cancelled)
        except BaseException:
            self.writer_ends()
            raise

    def writer_ends(self) -> None:
        with self._mutex:
            assert self._writers > 0
            self._writers -= 1
            self._epoch += 1

    def wait_visible(self, cancelled: Cancelled | None = None) -> None:
        """Wait until every delta registered before this call is applied (a statement is
        about to take a DuckDB snapshot). Raises 58030 if the applier stopped at a
        record in doubt (reopen the database), 57014 once ``cancelled()`` (the session's
        cancel flag, which a CancelRequest and ``statement_timeout`` set: looked at every
        ``CANCEL_POLL_S``). Never called under the commit lock (nothing registers
        meanwhile, and every commit would wait)."""
        with self._mutex:
            target = self._registered
            if self._applied >= target:
                return
            self.stats.waits += 1
            self._start()
            self._hurry += 1
            self._work.notify()
            try:
                self._wait_applied(target, cancelled)
            finally:
                self._hurry -= 1

    def _wait_applied(self, target: int, cancelled: Cancelled | None) -> None:
        """``wait_visible``'s wait (caller holds ``_mutex``)."""
        while self._applied < target:
            if self._halted is not None:
                raise StorageIOError(
                    "counter deltas wait behind a commit whose outcome is in doubt; "
                    f"reopen the database: {self._halted}"
                )
            if self._failing is not None and self._failures >= FAILURES_PERSISTENT:
                raise StorageIOError(
                    "committed counter deltas cannot be applied to their tables yet (the "
                    f"applier retries; a reopen applies them): {self._failing}"
                )
            if cancelled is None:
                self._changed.wait()
            else:
                self._changed.wait(CANCEL_POLL_S)
                if cancelled():
                    raise QueryCanceledError("canceling statement due to user request")

    def drain(self) -> None:
        """``wait_visible`` for the checkpoint: every registered delta applied (bounded by
        ``PENDING_*_MAX``)."""
        self.wait_visible()

    @property
    def pending(self) -> int:
        return self._registered - self._applied

    # -- the applier thread -----------------------------------------------------------
    def _start(self) -> None:
        """Start the applier thread if needed (caller holds ``_mutex``)."""
        if self._thread is None and not self._closing:
            self._thread = threading.Thread(target=self._loop, name="topicbase-deltas",
                                            daemon=True)  # fmt: skip
            self._thread.start()

    def _loop(self) -> None:
        delay = 0.001
        while True:
            with self._mutex:
                while not (self._entries and self._entries[0].durable) and not (
                    self._closing and not self._entries
                ):
                    if self._closing and self._entries and self._entries[0].doubt is not None:
                        return
                    self._idle = True
                    try:
                        self._work.wait()
                    finally:
                        self._idle = False
                if not self._entries:
                    return
                self._gather()
                group = []
                for entry in self._entries:
                    if not entry.durable or len(group) >= GROUP_MAX:
                        break
                    group.append(entry)
            try:
                self._apply([(e.log_end, e.deltas) for e in group], group)
            except Exception as error:  # never dropped: retried until it applies
                with self._mutex:
                    self._failing = error
                    self._failures += 1
                    self._changed.notify_all()
                    if self._closing:
                        return  # left for the next open's recovery (the position did not move)
                self.stats.retries += 1
                log.warning("counter deltas not applied yet (retried): %s", error)
                time.sleep(delay)
                delay = min(delay * 2, 1.0)
                continue
            delay = 0.001

    def _gather(self) -> None:
        """Wait up to ``GATHER_S`` for more durable records (caller holds ``_mutex``, the
        head is durable), unless someone waits for the deltas, ``GATHER_RECORDS`` are
        durable already or the backlog is half its bound; a retry after a failure does
        not wait."""
        deadline = time.monotonic() + GATHER_S
        while not (
            self._hurry
            or self._writers
            or self._closing
            or self._failing is not None
            or self._halted is not None
            or self._durable_head() >= GATHER_RECORDS
            or self._backlog_half()
        ):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            self._work.wait(remaining)

    def _backlog_half(self) -> bool:
        """Whether the committed, unapplied deltas take half of a ``PENDING_*_MAX`` bound
        (caller holds ``_mutex``): the applier then gathers no longer (past the bound
        commits run their deltas the DuckDB way)."""
        return (2 * len(self._entries) >= PENDING_RECORDS_MAX
                or 2 * self._queued_deltas >= PENDING_DELTAS_MAX
                or 2 * self._queued_bytes >= PENDING_BYTES_MAX)  # fmt: skip

    def _durable_head(self) -> int:
        """How many records from the head on are durable, counted up to ``GATHER_RECORDS``
        (caller holds ``_mutex``)."""
        count = 0
        for entry in itertools.islice(self._entries, GATHER_RECORDS):
            if not entry.durable:
                break
            count += 1
        return count

    def _apply(self, records: list[tuple[LogPosition, list[StoredDelta]]],
               group: list[_Entry] | None = None) -> None:  # fmt: skip
        """Add the deltas of ``records`` (log order; summed per key) and move the
        applied-through position to the last record's end in one DuckDB transaction; then
        (``group``) count them applied.

        Idempotent, so any attempt may be retried: the records at or before the position
        are skipped (an earlier attempt committed them and then failed, at
        ``deltas.after_commit`` say); if none is left only the bookkeeping runs. The
        position is read in the same DuckDB transaction for recovery and for a retry (the
        outcome of the failed attempt is known only there); a first attempt after one that
        succeeded knows it (``applied_through``, one DuckDB statement less per group)."""
        assert records and all(a[0] < b[0] for a, b in itertools.pairwise(records))
        cursor = self._cursor
        changed = key_lookup.table_names(tuple(d.table[2] for _, ds in records for d in ds))
        with self._apply_lock:
            # The key lookups' indexes of these tables are outdated from before this
            # DuckDB commit can be seen until after it (``key_lookup.changing_tables``),
            # and that ends before a reader waiting for the deltas is woken below.
            with key_lookup.changing_tables(changed):
                tables.run(cursor, "BEGIN TRANSACTION")
                try:
                    retry = group is None or self._failures > 0
                    through = _applied_position(cursor) if retry else self.applied_through
                    sums, shapes = _summed([d for end, ds in records if end > through
                                            for d in ds])  # fmt: skip
                    for shape, rows in _per_shape(sums).items():
                        self._add(cursor, shapes[shape], rows)
                    failpoints.hit("deltas.before_commit")
                    log_end = max(through, records[-1][0])
                    tables.run(cursor, f"UPDATE {APPLIED_TABLE} SET file_number = ?, "
                                       "position = ?", list(log_end))  # fmt: skip
                    tables.run(cursor, "COMMIT")
                except BaseException:
                    with contextlib.suppress(Exception):  # DuckDB may have aborted it already
                        tables.run(cursor, "ROLLBACK")
                    raise
            failpoints.hit("deltas.after_commit")
            self.applied_through = log_end
            if group is None:
                return
            with self._mutex:
                for entry in group:
                    assert self._entries[0] is entry
                    self._entries.popleft()
                    self._queued_deltas -= len(entry.deltas)
                    self._queued_bytes -= entry.size
                    for r in entry.reservations:  # folded into B (rule 3)
                        self._reserved[r.table] -= r.amount
                        bound = self._bounds.get(r.table)
                        if bound is not None:
                            bound.value += r.amount
                self._applied += len(group)
                self._failing = None
                self._failures = 0
                self.stats.groups += 1
                self.stats.records += len(group)
                self.stats.keys += len(sums)
                self._changed.notify_all()

    @staticmethod
    def _add(cursor: Any, d: StoredDelta, rows: list[tuple[tuple, list[int]]]) -> None:
        """Add each key's summed amounts (``rows``: distinct keys) to ``d``'s table: UPDATE
        the rows there, INSERT those that are not. One key: an UPDATE by the key (and an
        INSERT if it changed nothing); more (``SET_BASED_MIN``): one UPDATE joined to the
        keys and amounts passed as lists, and one INSERT of the keys it did not find, only
        when it found fewer than all (the same rows: each key is updated or inserted once)."""
        if len(rows) < SET_BASED_MIN:
            for key_values, amounts in rows:
                _add_one(cursor, d, key_values, amounts)
            return
        _add_set(cursor, d, rows)

    def close(self) -> None:
        """Apply what is durable and stop the thread (a record in doubt stays for recovery)."""
        with self._mutex:
            self._closing = True
            self._changed.notify_all()
            self._work.notify_all()
            thread = self._thread
            if thread is None and self._entries and self._halted is None:
                self._thread = thread = threading.Thread(target=self._loop, daemon=True)
                thread.start()
        if thread is not None:
            thread.join()
        self._cursor.close()
