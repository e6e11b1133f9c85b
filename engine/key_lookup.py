"""Primary-key lookups answered beside DuckDB, from an index of a table's committed rows.

``SELECT v FROM kv WHERE k = $1`` costs ~330 us of DuckDB CPU whatever the table
(binding and optimizing again on every run, docs/statement_cost.md, round 6); answered
from a sorted key array and the table's Arrow columns it costs a few microseconds. This
module holds those indexes and the rules that keep them right.

What it answers (``answer``): an autocommit statement (no transaction, so its snapshot
would be the latest commit) whose plan is one plain SELECT of the lookup shape
(``planner.key_lookup``) on a base table of schema ``main`` whose PRIMARY KEY is exactly
the equalities' columns, of integer or VARCHAR keys, each value proved to compare as
DuckDB compares it (else DuckDB runs it). The statement was planned and checked by the
door (sandbox, privileges) as any statement before it gets here. Anything else, or
anything in doubt, returns None and the statement runs in DuckDB as before.

Coherence (``TableChanges``): a version per table name and one for every table, and a
count of commits under way. Every DuckDB commit that may have written a table is
bracketed by ``changing`` / ``changed`` (``changing_tables``): the session brackets
an autocommit statement that may write tables (its DuckDB commit is inside it) and the
COMMIT of an explicit transaction that may have (``Transaction.tables_changed``: the
tables its DML and DDL name, nothing for statements that change no table such as SHOW
or DESCRIBE, None: any table). Names are folded as DuckDB folds them, in ASCII only
(``fold``: "Ä" is not "ä"); a table whose name is not ASCII is not looked up. An
index is used only while no change of its table is under way and the versions are
those it was built at; it is built from a DuckDB snapshot taken after the versions were
read, and kept only if they did not move meanwhile. So a lookup that
starts after a writer's commit returned never sees the rows from before it: the
writer's ``changing`` moved the version before its commit could become visible.

The index: for one integer key, its values sorted (``searchsorted``, in the column's
own dtype); for any other key (VARCHAR, several columns), Python's hashes of the keys
sorted, each hit confirmed on the row's own key values; both beside DuckDB's Arrow
columns of the table, each batch DuckDB handed the build one chunk (1M rows of
``(k BIGINT, v VARCHAR)``: ~50-80 ms of CPU to build, 26 MiB, a probe ~1 us). A build
first sums every row's bytes in one scan that holds no rows (a table past the cap is
not read), then reads batch by batch (~1 MiB of rows on average, at most 16 MiB) and
still gives up as soon as what it holds (the rows and each batch's arrays) passes the
cap, so it never holds more than the cap and one batch; between batches it stops for a
cancel or statement timeout of its statement (57014).

When (``KeyIndexes``): an index is built only for a table looked up this way
``threshold`` times since its last change (``FIRST_BUILD_LOOKUPS`` at first). A table
written more often than that is never indexed; an index dropped by a change before its
lookups paid for its build (``SAVING_PER_LOOKUP_S`` saved each) makes that table's
threshold grow 4-fold, so alternating writes and bursts of lookups cost at most a
bounded share of extra work. Only lookups by the key count (as the last build found
the key). All indexes of a database together hold at most ``bytes_max()`` bytes
(``$TOPICBASE_KEY_INDEX_BYTES``; malformed: the path is off), the least recently used
dropped first; a table whose estimated size (DuckDB's count of rows, then the scan's
sum of the rows' bytes) is above it is never read. A change that may be of any table
drops every index but raises no table's threshold.

Writers of tables outside a session's statements (a background applier of deltas, say)
bracket their DuckDB commits with ``changing_tables`` too; a lookup takes the session's
``cursor`` first, where a read waits for writes committed but not yet in DuckDB.

Nothing is on disk: recovery needs nothing, and a restarted process rebuilds on use.
"""

from __future__ import annotations

import bisect
import contextlib
import itertools
import os
import re
import string
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa

from engine import tables
from engine.chunk_values import VIEW_BYTES, ChunkValues
from engine.result import Rows
from engine.tables import quote_identifier
from grammar.bounded_cache import SCHEMA_COLUMN_BYTES, TEXT_COST_PER_CHAR, BoundedCache
from planner.operations import LookupShape, LookupValue, Plan, RunQuery
from storage import errors

BYTES_VARIABLE = "TOPICBASE_KEY_INDEX_BYTES"
KEY_INDEX_BYTES_DEFAULT = 256 * 1024 * 1024
FIRST_BUILD_LOOKUPS = 64
THRESHOLD_CEILING = 1 << 20  # of the threshold (an algorithm's bound, not a limit users meet)
# DuckDB's CPU for one lookup that the index saves (docs/statement_cost.md: ~270-350 us).
SAVING_PER_LOOKUP_S = 300e-6
_STATS_MAX = 4096  # tables with lookup counts kept per database (then all forgotten)
# While an index is read: batches of about _BATCH_BYTES on average (by the rows' mean
# bytes, ``_row_bytes``) and at most _WIDE_BATCH_BYTES even if every row were the widest,
# of _MIN_READ_ROWS to READ_ROWS rows (DuckDB's vector, its own unit); each batch is a
# chunk of the index's columns (not copied again). A batch costs more than its buffers:
# DuckDB's Arrow arrays and pyarrow's objects, measured at 1.2-1.4 KiB a column a batch
# whatever its rows (1, 16 or 2048), so that much is counted towards the cap too. (Sized
# by the widest row alone, one 1 MB value made batches of one row: 20,000 rows of 42
# columns held ~950 MB against 7 MB counted; review R1-2 of round 14.)
READ_ROWS = 2048
_MIN_READ_ROWS = 1
_BATCH_BYTES = 1 << 20
_WIDE_BATCH_BYTES = 16 << 20
_BATCH_COLUMN_BYTES = 1536
_KEY_BYTES_PER_ROW = 8  # a row's key value or hash in the index
_PYTHON_KEY_BYTES = 64  # a hashed key's Python object while its hash is taken (a bound)

_INTEGER_RANGES = {
    "TINYINT": (-(2**7), 2**7 - 1), "SMALLINT": (-(2**15), 2**15 - 1),
    "INTEGER": (-(2**31), 2**31 - 1), "BIGINT": (-(2**63), 2**63 - 1),
    "UTINYINT": (0, 2**8 - 1), "USMALLINT": (0, 2**16 - 1),
    "UINTEGER": (0, 2**32 - 1), "UBIGINT": (0, 2**64 - 1),
}  # fmt: skip
_KEY_TYPES = frozenset({*_INTEGER_RANGES, "VARCHAR"})
_CANONICAL_INTEGER = re.compile(r"-?[1-9][0-9]*|0")
# Table definitions whose rows a plain read might not give as stored, or whose keys might
# not compare as Python compares them: refused (the statement runs in DuckDB).
_REFUSED_WORDS = ("COLLATE", "GENERATED", " AS (")
# A rough bytes-per-row of a column for the size estimate before a build.
_FIXED_WIDTHS = {"BOOLEAN": 1, "TINYINT": 1, "UTINYINT": 1, "SMALLINT": 2, "USMALLINT": 2,
                 "INTEGER": 4, "UINTEGER": 4, "FLOAT": 4, "DATE": 4, "BIGINT": 8,
                 "UBIGINT": 8, "DOUBLE": 8, "TIMESTAMP": 8}  # else 32  # fmt: skip


def fold(name: str) -> str:
    """``name`` as DuckDB compares names: ASCII letters folded to lower case, nothing else
    ("Ä" and "ä" are two names to DuckDB)."""
    return name.translate(_ASCII_LOWER)


_ASCII_LOWER = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)


def bytes_max() -> int:
    """The byte cap of every database's indexes: ``$TOPICBASE_KEY_INDEX_BYTES`` if set
    (0 turns the path off), else 256 MiB. A bad value is 22023."""
    return _cap_of(os.environ.get(BYTES_VARIABLE))


def _cap_of(value: str | None) -> int:
    """``bytes_max`` of the variable's value ``value`` (None: unset)."""
    text = (value or "").strip()
    if not text:
        return KEY_INDEX_BYTES_DEFAULT
    try:
        number = int(text)
    except ValueError:
        number = -1
    if number < 0:
        raise errors.InvalidParameterValueError(
            f"{BYTES_VARIABLE} must be a whole number of bytes, at least 0 (got {text!r})"
        )
    return number


def _cap_or_off() -> int:
    """``bytes_max`` for a lookup: a malformed value turns the path off (0) rather than
    failing every statement of the lookup shape (DuckDB answers them all). The variable
    is read on every lookup (a change takes effect at once); its value is parsed once.
    Read from the mapping behind ``os.environ`` (CPython's ``_data``, which every change
    through ``os.environ`` updates) when there is one: one dict look-up, where
    ``os.environ.get`` of an unset name costs three Python calls and a KeyError raised
    and caught (~3 us a lookup with the server's cold caches, docs/statement_cost.md)."""
    global _cap_parsed
    if _ENVIRON_DATA is not None:
        raw = _ENVIRON_DATA.get(_ENVIRON_KEY)
    else:
        raw = os.environ.get(BYTES_VARIABLE)
    parsed = _cap_parsed
    if parsed[0] is raw:
        return parsed[1]
    text = os.environ.get(BYTES_VARIABLE)
    try:
        cap = _cap_of(text)
    except errors.InvalidParameterValueError:
        cap = 0
    _cap_parsed = (raw, cap)
    return cap


# The dict behind ``os.environ`` (encoded names to encoded values) and the variable's
# name as its key; None where ``os.environ`` has no such dict (then it is asked itself).
_ENVIRON_DATA: dict[Any, Any] | None = getattr(os.environ, "_data", None)
_ENVIRON_KEY: Any = (
    os.environ.encodekey(BYTES_VARIABLE) if hasattr(os.environ, "encodekey") else None
)
if not isinstance(_ENVIRON_DATA, dict) or _ENVIRON_KEY is None:
    _ENVIRON_DATA = None
# (the variable's value as last read, its cap): the same object while the value stands
_cap_parsed: tuple[Any, int] = (object(), KEY_INDEX_BYTES_DEFAULT)


# -- which tables may have changed --------------------------------------------------------------
_NAMES_MAX = 1 << 16  # names with a version of their own (then the oldest share ``_floor``)


class TableChanges:
    """Versions of tables by name (folded, without schema) and of every table, with
    counts of changes under way.

    ``changing(names)`` is called before a commit that may change those tables (None:
    any table) can start, ``changed(names)`` after it ended, whatever its outcome.
    ``basis(name)`` is None while a change of ``name`` may be committing, else a value
    that moves with every change of it, and only with changes of it or of every table
    (names are exact: no other table's change moves it), except that once more than
    ``_NAMES_MAX`` names changed the one changed longest ago (none under way) is
    forgotten: its version becomes ``_floor``, the highest version forgotten, so a
    never-changed name's version may move too (a false alarm, never a missed change).

    Invariants: every version comes from ``_clock`` (strictly increasing); a name's
    version is ``_versions[name]`` if kept, else ``_floor``; ``_floor`` <= ``_clock``;
    a change gives the name ``_clock + 1``, above every version it had before."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._clock = 0
        self._floor = 0
        self._versions: dict[str, int] = {}  # least recently changed first
        self._under_way: dict[str, int] = {}
        self._all_version = 0
        self._all_under_way = 0

    def changing(self, names: frozenset[str] | None) -> None:
        with self._lock:
            self._move(names, 1)

    def changed(self, names: frozenset[str] | None) -> None:
        with self._lock:
            self._move(names, -1)

    def _move(self, names: frozenset[str] | None, step: int) -> None:
        if names is None:
            self._all_under_way += step
            self._all_version += 1
            assert self._all_under_way >= 0, "changed() without changing()"
            return
        for name in names:
            under_way = self._under_way.get(name, 0) + step
            assert under_way >= 0, "changed() without changing()"
            if under_way:
                self._under_way[name] = under_way
            else:
                self._under_way.pop(name, None)
            self._clock += 1
            self._versions.pop(name, None)
            self._versions[name] = self._clock  # the most recently changed last
        while len(self._versions) > _NAMES_MAX:
            oldest = next((n for n in self._versions if n not in self._under_way), None)
            if oldest is None:
                break
            self._floor = max(self._floor, self._versions.pop(oldest))

    def basis(self, name: str) -> tuple[int, int] | None:
        with self._lock:
            if self._all_under_way or name in self._under_way:
                return None
            return self._all_version, self._versions.get(name, self._floor)


TABLE_CHANGES = TableChanges()  # one per process, as DuckDB's files are


def table_names(names: tuple[str, ...]) -> frozenset[str]:
    """The names ``TableChanges`` knows tables by: the last part of each (possibly
    qualified) name, folded as DuckDB folds names (``fold``). An indexed table's name
    has no dot (``answer``)."""
    return frozenset(fold(name.rsplit(".", 1)[-1]) for name in names)


def changing_tables(
    names: frozenset[str] | None,
) -> contextlib.AbstractContextManager[None]:
    """Bracket a DuckDB commit that may change ``names`` (None: any table; an empty set:
    none, nothing is done: a shared context that does nothing, as for every read-only
    autocommit statement). The one call a writer of tables needs."""
    if names is not None and not names:
        return _NOTHING_CHANGES
    return _changing(names)


_NOTHING_CHANGES = contextlib.nullcontext()


@contextlib.contextmanager
def _changing(names: frozenset[str] | None) -> Iterator[None]:
    TABLE_CHANGES.changing(names)
    try:
        yield
    finally:
        TABLE_CHANGES.changed(names)


# -- the indexes ------------------------------------------------------------------------------
@dataclass
class _Index:
    """One table's committed rows: ``table`` (DuckDB's Arrow; every column chunked alike,
    chunk ``c`` starting at row ``starts[c]``), its DuckDB type names and the key's
    columns. ``sorted_keys`` (ascending) holds one integer key's values (in the column's
    own dtype), or else Python's ``hash`` of each key (its value, or the tuple of its
    values: equal keys hash alike within the process); ``order`` maps a position in it
    to the row (None: the rows are in that order already). A hashed key is confirmed by
    comparing the row's own key values (``hashed``)."""

    basis: tuple[int, int]
    table: pa.Table
    starts: list[int]
    types: tuple[str, ...]
    lower_names: dict[str, int]  # folded column name (``fold``) -> index (unique)
    key_columns: tuple[int, ...]
    sorted_keys: np.ndarray
    order: np.ndarray | None
    hashed: bool
    nbytes: int
    build_s: float
    served: int = 0
    chunks: list[list[pa.Array]] = field(init=False, repr=False)  # of ``table``'s columns
    # ``chunks``' values as ``as_py`` gives them, read from the buffers (``chunk_values``):
    # made for a chunk of a column at its first read (``cell_values``), so a build holds
    # none and an index only those of the chunks it answered from; the index's ``nbytes``
    # counts them all at ``VIEW_BYTES`` each, their most. A race makes one twice (the same).
    values: list[list[ChunkValues | None]] = field(init=False, repr=False)
    # ``sorted_keys`` and ``order`` as memoryviews: ``bisect`` over one and an item of each
    # are Python ints, cheaper with cold caches than numpy's ``searchsorted`` and scalars,
    # and exact for uint64 keys (numpy compares a Python int with them as float64).
    key_view: memoryview = field(init=False, repr=False)
    order_view: memoryview | None = field(init=False, repr=False)
    # The rows of every chunk but the last, when they all hold as many (else 0).
    chunk_rows: int = field(init=False, repr=False)
    # What a statement's shape comes to on this index (``_shape_work``), by the shape's id.
    shapes: BoundedCache = field(init=False, repr=False, default_factory=lambda: BoundedCache(
        "engine.key_lookup.index_shapes", _SHAPES_PER_INDEX))

    def __post_init__(self) -> None:
        self.chunks = [column.chunks for column in self.table.columns]
        self.values = [[None] * len(chunks) for chunks in self.chunks]
        self.key_view = memoryview(np.ascontiguousarray(self.sorted_keys))
        self.order_view = None if self.order is None else memoryview(
            np.ascontiguousarray(self.order))  # fmt: skip
        starts = self.starts
        steps = {b - a for a, b in itertools.pairwise(starts)}
        self.chunk_rows = steps.pop() if len(steps) == 1 else 0

    def row(self, key: tuple[Any, ...]) -> int | None:
        """The row whose key is ``key`` (values of the key columns' types), or None."""
        keys = self.key_view
        count = len(keys)
        if not count:
            return None
        order = self.order_view
        if not self.hashed:
            wanted = key[0]
            at = bisect.bisect_left(keys, wanted)
            if at >= count or keys[at] != wanted:
                return None
            return at if order is None else order[at]
        wanted = hash(key[0] if len(key) == 1 else key)
        at = bisect.bisect_left(keys, wanted)
        while at < count and keys[at] == wanted:
            row = at if order is None else order[at]
            if tuple(self.cell(i, row) for i in self.key_columns) == key:
                return row
            at += 1
        return None

    def chunk_of(self, row: int) -> tuple[int, int]:
        """(chunk, row within it) of ``row``: every column is chunked alike."""
        starts = self.starts
        if len(starts) == 1:
            return 0, row
        size = self.chunk_rows  # chunks of one size (the last may be shorter): no search
        chunk = min(row // size, len(starts) - 1) if size else bisect.bisect_right(starts, row) - 1
        assert 0 <= chunk < len(starts) and row >= starts[chunk], (row, chunk)
        return chunk, row - starts[chunk]

    def cell(self, column: int, row: int) -> Any:
        """The value of ``column`` in ``row`` as ``as_py`` gives it."""
        chunk, at = self.chunk_of(row)
        return self.cell_values(column, chunk).value(at)

    def cell_values(self, column: int, chunk: int) -> ChunkValues:
        """The values of ``chunk`` of ``column`` (made at its first read)."""
        values = self.values[column][chunk]
        if values is None:
            values = self.values[column][chunk] = ChunkValues(self.chunks[column][chunk])
        return values


@dataclass
class _Stats:
    basis: tuple[int, int] | None = None
    lookups: int = 0
    threshold: int = 0
    too_big: bool = False  # until the table changes
    # The key's columns (``fold``) as the last build found them, while the schema
    # generation (``tables.SCHEMA_GENERATIONS``) is ``key_schema``: lookups by other
    # columns are not counted.
    key_columns: frozenset[str] | None = None
    key_schema: int | None = None


@dataclass
class KeyIndexes:
    """A database's indexes (least recently used first) and lookup counts per table."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    indexes: OrderedDict[str, _Index] = field(default_factory=OrderedDict)
    stats: dict[str, _Stats] = field(default_factory=dict)
    building: set[str] = field(default_factory=set)
    nbytes: int = 0

    def drop(self, name: str, *, changed: bool = True) -> None:
        """Forget ``name``'s index (under ``lock``); a change of the table (``changed``)
        or an eviction that came before its lookups paid for its build raises the
        table's threshold (a change of other tables, ``changed=False``, does not)."""
        index = self.indexes.pop(name, None)
        if index is None:
            return
        self.nbytes -= index.nbytes
        stats = self.stats.get(name)
        if stats is not None and changed:
            paid = index.served * SAVING_PER_LOOKUP_S >= index.build_s
            stats.threshold = (FIRST_BUILD_LOOKUPS if paid
                               else min(stats.threshold * 4, THRESHOLD_CEILING))  # fmt: skip

    def keep(self, name: str, index: _Index, cap: int) -> bool:
        """Keep ``index`` (under ``lock``), dropping the least recently used to fit."""
        self.drop(name)
        if index.nbytes > cap:
            return False
        while self.indexes and self.nbytes + index.nbytes > cap:
            oldest = next(iter(self.indexes))
            self.drop(oldest)
        self.indexes[name] = index
        self.nbytes += index.nbytes
        return True


_databases: weakref.WeakKeyDictionary[Any, KeyIndexes] = weakref.WeakKeyDictionary()
_databases_lock = threading.Lock()


def indexes_of(database: Any) -> KeyIndexes:
    found = _databases.get(database)
    if found is None:
        with _databases_lock:
            found = _databases.setdefault(database, KeyIndexes())
    return found


# -- what a session may still look up --------------------------------------------------------
# Statements after which a session's unqualified names still resolve as a fresh
# connection's (``keeps_names``): no SET/RESET/USE (search_path, schema), nothing else.
_NAME_KEEPING_TAGS = frozenset({
    "SELECT", "INSERT", "UPDATE", "DELETE", "MERGE", "EMPTY", "SHOW", "DESCRIBE", "EXPLAIN",
    "CREATE TABLE", "DROP TABLE", "ALTER TABLE", "CREATE VIEW", "DROP VIEW", "CREATE INDEX",
    "DROP INDEX", "CREATE SEQUENCE", "DROP SEQUENCE", "TRUNCATE TABLE", "CREATE SCHEMA",
    "DROP SCHEMA", "CHECKPOINT", "ANALYZE", "VACUUM", "COMMENT",
})  # fmt: skip
_TEMPORARY = re.compile(r"\bTEMP(?:ORARY)?\b", re.IGNORECASE)


def keeps_names(plan: Plan) -> bool:
    """Whether after ``plan`` the session's names still resolve as a fresh connection's:
    every query of it is of ``_NAME_KEEPING_TAGS`` and creates nothing temporary (only a
    CREATE can; the word anywhere in its text counts: a false alarm only costs this
    session its lookups). The text of other statements is not searched."""
    return all(
        operation.tag in _NAME_KEEPING_TAGS
        and not (operation.tag.startswith("CREATE") and _TEMPORARY.search(operation.sql))
        for operation in plan.operations
        if isinstance(operation, RunQuery)
    )


def names_may_change(plan: Plan, plain: bool | None) -> bool:
    """Whether after ``plan`` a session must find again whether its names are plain
    (``names_plain``), given what it knew before (``plain``; None: to be found anyway):
    after anything but ``keeps_names``, and while not plain after any DROP or ALTER too
    (of a temporary relation, say), so a session is never left without lookups for good."""
    if plain is None:
        return False
    if not keeps_names(plan):
        return True
    return plain is False and any(
        operation.tag.startswith(("DROP", "ALTER"))
        for operation in plan.operations
        if isinstance(operation, RunQuery)
    )


# A connection's names resolve as a fresh one's: DuckDB's default search path (or just
# ``main``, what the wire sends at RESET ALL / DISCARD ALL), schema ``main``, no temporary
# table or view of its own (DuckDB's internal views are temporary: not counted).
_NAMES_SQL = (
    "SELECT current_setting('search_path'), current_schema(), "
    "(SELECT count(*) FROM duckdb_tables() WHERE temporary) "
    "+ (SELECT count(*) FROM duckdb_views() WHERE temporary AND NOT internal)"
)
_PLAIN_SEARCH_PATHS = frozenset({"", "main"})


def names_plain(cursor: Any) -> bool | None:
    """Whether the names of a session's DuckDB connection ``cursor`` (outside any
    transaction) resolve as a fresh connection's (``_NAMES_SQL``); None if it could not
    be asked (the statement then runs in DuckDB; asked again next time)."""
    try:
        rows = cursor.execute(_NAMES_SQL).fetchall()
    except Exception:  # a closing database, say: DuckDB answers the statement
        return None
    search_path, schema, temporary = rows[0]
    return search_path.strip() in _PLAIN_SEARCH_PATHS and schema == "main" and not temporary


# -- the door -----------------------------------------------------------------------------------
def lookup_plan(plan: Plan) -> tuple[RunQuery, LookupShape] | None:
    """The query and its lookup shape if ``plan`` is one plain SELECT of that shape. The
    query is immutable and the planner keeps one per statement text (a new ``Plan``
    around it each time), so a query found to be of the shape is kept by its id (held
    beside it: its id is not reused meanwhile). Only those, and only short ones: every
    other statement is judged again (its first tests fail fast), so that no big text
    (a client-bound INSERT of megabytes) is held here."""
    if plan.explain_only or len(plan.operations) != 1:
        return None
    operation = plan.operations[0]
    kept = _lookup_queries.get(id(operation))
    if kept is not None and kept[0] is operation:
        return kept[1]
    found = _lookup_query(operation)
    if found is not None and len(operation.sql) <= _LOOKUP_QUERY_CHARS_MAX:
        # the query (pinned here even once the planner's cache forgot it) and its shape
        columns = len(found[1].columns or ()) + len(found[1].equalities)
        cost = TEXT_COST_PER_CHAR * len(operation.sql) + SCHEMA_COLUMN_BYTES * columns
        _lookup_queries.put(id(operation), (operation, found), cost)
    return found


# At most this many lookup queries of at most this many characters each are kept.
_LOOKUP_QUERIES_MAX = 256
_LOOKUP_QUERY_CHARS_MAX = 4096
_lookup_queries = BoundedCache("engine.key_lookup.lookup_queries", _LOOKUP_QUERIES_MAX)


def _lookup_query(operation: Any) -> tuple[RunQuery, LookupShape] | None:
    """``lookup_plan`` of a plan of this one operation, worked out."""
    if (not isinstance(operation, RunQuery) or operation.tag != "SELECT"
            or not operation.returns_rows or operation.tables_written
            or operation.system_views or operation.projection is not None
            or len(operation.tables_read) != 1):  # fmt: skip
        return None
    shape = operation.lookup
    if (shape is None or "." in shape.table or shape.table.startswith("__")
            or not shape.table.isascii()
            or fold(shape.table) != fold(operation.tables_read[0])):  # fmt: skip
        return None
    return operation, shape


class Answer(NamedTuple):
    """A lookup's result as DuckDB would give it (``Rows`` for plain column types, else
    DuckDB's Arrow) and DuckDB's type name of each of its columns."""

    result: pa.Table | Rows
    duckdb_types: list[str]


def answer(database: Any, plan: Plan, parameters: Any,
           stop: Callable[[], bool] = lambda: False, *, build: bool = True,
           ) -> Answer | None:  # fmt: skip
    """The result of ``plan`` from the table's index, or None: DuckDB must run it.

    The caller guarantees: an autocommit statement, planned and checked by the door,
    on a session whose names resolve as the build's cursor resolves them (``names_plain``:
    the default search path or ``main``, no temporary relation of its own) and with no
    relation registered on its connection.
    ``stop`` says the statement was cancelled (or timed out): a build under way for it
    then ends at its next batch with 57014. ``build=False``: only an index that stands at
    the table's basis answers; the lookup is neither counted towards a build nor builds
    one (a caller that then runs the statement the ordinary way asks again, and that
    counts it once)."""
    found = lookup_plan(plan)
    if found is None:
        return None
    _, shape = found
    cap = _cap_or_off()
    if cap == 0:
        return None
    name = fold(shape.table)
    basis = TABLE_CHANGES.basis(name)
    if basis is None:
        return None
    registry = indexes_of(database)
    index = registry.indexes.get(name)
    if index is None or index.basis != basis:
        if not build:
            return None
        index = _index_for(database, registry, name, basis, cap, shape, stop)
        if index is None:
            return None
    work = _shape_work(index, shape)
    key = _bound_key(index, shape, parameters, work)
    if key is None:
        return None
    columns = work.columns
    if columns is None:
        return None
    if TABLE_CHANGES.basis(name) != index.basis:
        return None  # a change began while the key was bound: DuckDB answers
    index.served += 1
    with registry.lock:
        if name in registry.indexes:
            registry.indexes.move_to_end(name)
    row = index.row(key)
    return Answer(_result(index, columns, row, work.schema), list(work.duckdb_types))


class KeptWay:
    """A kept lookup plan's way to its answers (``Session.answer_lookup``): what ``answer``
    works out for the plan's query from the index it answered from (the shape's work,
    the result's schema renamed as the statement names its columns), kept while that
    index is the table's (an index never changes: a change of its table makes a new
    one). ``answer`` asks what ``answer`` asks every time: the cap, the index still the
    table's and at the table's basis (read after the key is bound, as ``answer`` reads
    it again then), the key bound as ``_bound_key`` binds it. Only results of the rows'
    way (``Rows``); anything else is ``answer``'s. The index is held weakly: a dropped
    index is freed as ever (the cap on the indexes' bytes stands). Not thread-safe: one
    per kept plan of one session, used under the session's lock."""

    __slots__ = ("_index", "_name", "_names", "_registry", "_schema", "_shape", "_work")

    def __init__(self, query: RunQuery, shape: LookupShape) -> None:
        self._shape = shape
        self._name = fold(shape.table)
        self._names = query.column_names
        self._index: weakref.ref[_Index] | None = None
        self._registry: tuple[Any, KeyIndexes] | None = None  # (database, its indexes)
        self._work: _ShapeWork | None = None
        self._schema: pa.Schema | None = None

    def answer(self, database: Any, parameters: Any) -> Rows | None:
        """``answer(...).result`` of the plan from the table's index as it stands
        (``build=False``) when that is ``Rows`` of the statement's column names, else
        None (the caller asks ``answer``)."""
        if _cap_or_off() == 0:
            return None
        name = self._name
        kept = self._registry
        if kept is None or kept[0] is not database:
            kept = self._registry = (database, indexes_of(database))
        registry = kept[1]
        index = registry.indexes.get(name)
        if index is None:
            return None
        if self._index is None or self._index() is not index:
            work = _shape_work(index, self._shape)
            if work.schema is None or work.columns is None:
                return None  # DuckDB's Arrow, or no such column: ``answer``'s
            if not _keeps_shape(work):
                return None  # too wide to hold per plan (review R1-4): ``answer``'s
            schema = work.schema
            names = self._names
            if names is not None and len(names) == len(schema) != 0:  # as _query_result
                schema = Rows([], schema).rename_columns(names).schema
            self._index, self._work, self._schema = weakref.ref(index), work, schema
        work = self._work
        assert work is not None and work.columns is not None and self._schema is not None
        key = _bound_key(index, self._shape, parameters, work)
        if key is None:
            return None
        if TABLE_CHANGES.basis(name) != index.basis:
            return None  # changed, or a change under way: ``answer`` (then DuckDB) decides
        index.served += 1
        indexes = registry.indexes
        try:  # the most recently used already (the usual case): no lock to take
            last = next(reversed(indexes), None)
        except RuntimeError:  # changed by another thread between the two calls
            last = None
        if last != name:
            with registry.lock:
                if name in indexes:
                    indexes.move_to_end(name)
        result = _result(index, work.columns, index.row(key), self._schema)
        assert type(result) is Rows
        return result


def _index_for(database: Any, registry: KeyIndexes, name: str, basis: tuple[int, int],
               cap: int, shape: LookupShape, stop: Callable[[], bool],
               ) -> _Index | None:  # fmt: skip
    """The index of ``name`` at ``basis``, built now if the table was looked up by its key
    often enough since its last change; None meanwhile. A build stopped by ``stop`` raises
    57014 (the statement was cancelled)."""
    with registry.lock:
        old = registry.indexes.get(name)
        if old is not None and old.basis != basis:
            # Only a change of this table (its own version moved, not only "every
            # table") counts against the index's build.
            registry.drop(name, changed=old.basis[1] != basis[1])
        stats = registry.stats.get(name)
        if stats is None:
            if len(registry.stats) >= _STATS_MAX:
                registry.stats.clear()
            stats = registry.stats[name] = _Stats(threshold=FIRST_BUILD_LOOKUPS)
        if stats.basis != basis:
            stats.basis, stats.lookups, stats.too_big = basis, 0, False
        schema = tables.SCHEMA_GENERATIONS.stable()
        if stats.key_schema is None or stats.key_schema != schema:
            stats.key_columns = None  # a schema change may have changed the key
        wanted = frozenset(fold(column) for column, _ in shape.equalities)
        if stats.key_columns is not None and wanted != stats.key_columns:
            return None  # not a lookup by the key: no reason to build
        stats.lookups += 1
        if stats.too_big or stats.lookups < stats.threshold or name in registry.building:
            return None
        registry.building.add(name)
    try:
        index = _build(database, name, basis, cap, stop)
    finally:
        with registry.lock:
            registry.building.discard(name)
    with registry.lock:
        if index is None:
            stats.too_big = True  # not indexable as it stands: until it changes
            return None
        # As of the schema generation before the build (None: a change was under way).
        stats.key_columns = frozenset(fold(index.table.column_names[i])
                                      for i in index.key_columns)  # fmt: skip
        stats.key_schema = schema
        if TABLE_CHANGES.basis(name) != basis:
            return None
        if not registry.keep(name, index, cap):
            stats.too_big = True  # bigger than its estimate said: until it changes
            return None
    return index


class _Stopped(Exception):
    """The statement building an index was cancelled (``stop``)."""


def _build(database: Any, name: str, basis: tuple[int, int], cap: int,
           stop: Callable[[], bool]) -> _Index | None:  # fmt: skip
    """An index of ``name`` from one DuckDB snapshot taken after ``basis`` was read, or
    None if the table is not one this path answers for (see the module), holds more
    than ``cap`` bytes, or changed meanwhile. Read batch by batch: it never holds more
    than ``cap`` (and one batch) of the table, and ``stop`` is asked between batches."""
    started = time.perf_counter()
    try:
        with tables.translated():  # DuckDB's errors (a database closing) as ours
            cursor = database.root.cursor()
            try:
                cursor.execute("BEGIN TRANSACTION")
                try:
                    found = _read_table(cursor, name, cap, lambda: _stopped(stop, name, basis))
                finally:
                    cursor.execute("ROLLBACK")  # it only read
            finally:
                cursor.close()
    except _Stopped:
        raise errors.QueryCanceledError("canceling statement due to user request") from None
    except Exception:  # an index is optional: on any failure to build one (a database
        return None  # closing, a type DuckDB gives no Arrow for, memory) DuckDB answers
    if found is None or TABLE_CHANGES.basis(name) != basis:
        return None
    return _indexed(*found, basis, time.perf_counter() - started)


def _stopped(stop: Callable[[], bool], name: str, basis: tuple[int, int]) -> bool:
    """Between two batches of a build: raise ``_Stopped`` if the statement was
    cancelled; True if the table changed (the build is of no use any more)."""
    if stop():
        raise _Stopped
    return TABLE_CHANGES.basis(name) != basis


class _Read(NamedTuple):
    """A table as ``_read_table`` read it: the batches (one chunk of every column each),
    the key's values (integers) or hashes (anything else) in row order, the column types."""

    table: pa.Table
    keys: np.ndarray
    types: tuple[str, ...]
    key_columns: tuple[int, ...]


def _read_table(cursor: Any, name: str, cap: int, give_up: Callable[[], bool]) -> _Read | None:
    """The table's rows as DuckDB's Arrow, its column types and key columns, if it is
    the only relation of that name anywhere the connection looks, a base table of
    ``main`` in the database's own catalog, with a primary key of integer or VARCHAR
    columns, nothing in its definition that changes reads or comparisons, and within
    ``cap`` bytes (estimated first, then counted batch by batch as it is read, with its
    key arrays: the read stops as soon as they pass ``cap``). ``give_up`` is asked
    between batches."""
    cursor.execute(
        "SELECT database_name, schema_name, table_name, sql, estimated_size, temporary "
        "FROM duckdb_tables() WHERE lower(table_name) = ? UNION ALL "
        "SELECT database_name, schema_name, view_name, NULL, NULL, temporary FROM duckdb_views() "
        "WHERE lower(view_name) = ?",
        [name, name],
    )
    # DuckDB finds a relation by its name folded in ASCII only ("Ä" is not "ä"); its
    # lower() folds all of Unicode: those of another name under it are left out.
    relations = [r for r in cursor.fetchall() if fold(str(r[2])) == name]
    cursor.execute("SELECT current_database(), current_setting('default_collation')")
    current, collation = cursor.fetchone()
    if len(relations) != 1:
        return None
    database_name, schema, table_name, sql, estimated, temporary = relations[0]
    if (sql is None or temporary or schema != "main" or database_name != current or collation
            or any(word in sql.upper() for word in _REFUSED_WORDS)):  # fmt: skip
        return None
    cursor.execute(
        "SELECT constraint_type, constraint_column_names FROM duckdb_constraints() "
        "WHERE database_name = ? AND schema_name = 'main' AND table_name = ? "
        "AND constraint_type = 'PRIMARY KEY'",
        [database_name, table_name],
    )
    keys = cursor.fetchall()
    if len(keys) != 1:
        return None
    cursor.execute(
        "SELECT column_name, data_type FROM duckdb_columns() WHERE database_name = ? "
        "AND schema_name = 'main' AND table_name = ? ORDER BY column_index",
        [database_name, table_name],
    )
    columns = cursor.fetchall()
    folded = [fold(str(c)) for c, _ in columns]
    key_names = [fold(str(k)) for k in keys[0][1]]
    if len(set(folded)) != len(folded) or len(set(key_names)) != len(key_names):
        return None
    if any(k not in folded or columns[folded.index(k)][1] not in _KEY_TYPES for k in key_names):
        return None
    width = 16 + sum(_FIXED_WIDTHS.get(str(kind), 32) for _, kind in columns)
    if (estimated or 0) * width > cap:
        return None  # by DuckDB's estimate of the rows: not even scanned
    relation_name = f"{quote_identifier(database_name)}.main.{quote_identifier(table_name)}"
    everything = f"SELECT * FROM {relation_name}"
    # Every row's bytes, summed, their maximum and the rows, in one scan that holds no
    # rows: a table past the cap is not read, and a batch holds ~1 MiB of rows on average
    # and at most 16 MiB.
    total, widest, count = cursor.execute(
        f"SELECT coalesce(sum(w), 0), coalesce(max(w), 0), count(*) "
        f"FROM (SELECT {_row_bytes(columns)} AS w FROM {relation_name})"
    ).fetchall()[0]
    if int(total) > cap:
        return None
    relation = cursor.sql(everything)
    types = tuple(str(kind) for kind in relation.types)
    if [fold(str(column)) for column in relation.columns] != folded:
        return None
    key_columns = tuple(folded.index(k) for k in key_names)
    hashed = not (len(key_columns) == 1 and types[key_columns[0]] in _INTEGER_RANGES)
    mean = -(-int(total) // max(int(count), 1))
    rows = max(_MIN_READ_ROWS, min(READ_ROWS, _BATCH_BYTES // max(mean, 1),
                                   _WIDE_BATCH_BYTES // max(int(widest), 1)))  # fmt: skip
    reader = relation.to_arrow_reader(rows)
    try:
        read = _read_batches(reader, key_columns, hashed, cap, give_up)
    finally:
        reader.close()
    if read is None:
        return None
    batches, key_parts = read
    table = pa.Table.from_batches(batches, schema=reader.schema)
    empty = np.empty(0, np.int64)
    found = np.concatenate(key_parts) if key_parts else empty
    return _Read(table, found, types, key_columns)


def _read_batches(reader: pa.RecordBatchReader, key_columns: tuple[int, ...], hashed: bool,
                  cap: int, give_up: Callable[[], bool],
                  ) -> tuple[list[pa.RecordBatch], list[np.ndarray]] | None:  # fmt: skip
    """DuckDB's batches and each one's keys (``_Read``), or None once what the index would
    hold (the rows read, ``_BATCH_COLUMN_BYTES`` a column a batch for the arrays
    themselves and ``_KEY_BYTES_PER_ROW`` a row for the keys), with a batch's keys as
    Python objects while they are hashed, would pass ``cap``, or ``give_up`` says so. So
    a build holds at most ``cap`` and one batch of the table."""
    batches: list[pa.RecordBatch] = []
    key_parts: list[np.ndarray] = []
    held = 0
    for batch in reader:
        if give_up():
            return None
        if not batch.num_rows:
            continue
        held += (batch.nbytes + _BATCH_COLUMN_BYTES * batch.num_columns
                 + _KEY_BYTES_PER_ROW * batch.num_rows)  # fmt: skip
        transient = 0
        if hashed:  # the keys as Python objects while they are hashed
            transient += batch.num_rows * _PYTHON_KEY_BYTES + sum(
                batch.column(i).nbytes for i in key_columns
            )
        if held + transient > cap:
            return None
        batches.append(batch)
        key_parts.append(_keys_of(batch, key_columns, hashed))
    return batches, key_parts


def _keys_of(batch: pa.RecordBatch, key_columns: tuple[int, ...], hashed: bool) -> np.ndarray:
    """One batch's keys: the integer key's values, or the keys' Python hashes."""
    if not hashed:
        return batch.column(key_columns[0]).to_numpy()
    values = [batch.column(i).to_pylist() for i in key_columns]
    keys_of = values[0] if len(values) == 1 else zip(*values, strict=True)
    return np.fromiter(map(hash, keys_of), np.int64, count=batch.num_rows)


def _row_bytes(columns: list[tuple[Any, Any]]) -> str:
    """A SQL expression of about the bytes one row takes in DuckDB's Arrow (and its key in
    the index): fixed widths as they are, VARCHAR and BLOB by their bytes, anything else
    (nested, DECIMAL, UUID...) by its text's bytes; 8 a column for offsets and validity."""
    parts = [str(_KEY_BYTES_PER_ROW + 8 * len(columns))]
    for column, kind in columns:
        name, kind = quote_identifier(str(column)), str(kind)
        if kind in _FIXED_WIDTHS:
            parts.append(str(_FIXED_WIDTHS[kind]))
        elif kind == "VARCHAR":
            parts.append(f"coalesce(strlen({name}), 0)")
        elif kind == "BLOB":
            parts.append(f"coalesce(octet_length({name}), 0)")
        else:
            parts.append(f"coalesce(strlen(CAST({name} AS VARCHAR)), 0)")
    return " + ".join(parts)


def _indexed(data: pa.Table, keys: np.ndarray, types: tuple[str, ...],
             key_columns: tuple[int, ...], basis: tuple[int, int],
             build_s: float) -> _Index:  # fmt: skip
    """The lookup structure over ``data`` (see ``_Index``): one integer key's values
    sorted, or the keys' hashes sorted (any other key: VARCHAR, several columns)."""
    hashed = not (len(key_columns) == 1 and types[key_columns[0]] in _INTEGER_RANGES)
    assert len(keys) == data.num_rows
    order = None
    if len(keys) > 1 and not bool(np.all(keys[1:] > keys[:-1])):
        order = np.argsort(keys, kind="stable")
        keys = keys[order]
    lengths = [len(chunk) for chunk in data.column(0).chunks] if data.num_columns else []
    starts = list(itertools.accumulate(lengths[:-1], initial=0)) if lengths else []
    extra = (keys.nbytes + (0 if order is None else order.nbytes) + 8 * len(starts)
             + (VIEW_BYTES + _BATCH_COLUMN_BYTES) * len(lengths) * data.num_columns)  # fmt: skip
    lower_names = {fold(name): i for i, name in enumerate(data.column_names)}
    return _Index(basis, data, starts, types, lower_names, key_columns, keys, order, hashed,
                  data.nbytes + extra, build_s)  # fmt: skip


class _ShapeWork(NamedTuple):
    """What a lookup shape comes to on one index, worked out once (``_shape_work``): it
    depends on the shape and on the index's columns and types alone, and an index never
    changes (a change of its table makes a new one)."""

    shape: LookupShape  # held: its id (the key it is kept by) is not reused meanwhile
    # (key column, the equality giving its value) in the key's column order; None when
    # the equalities do not name exactly the key's columns, once each.
    key_equalities: tuple[tuple[int, int], ...] | None
    columns: list[tuple[int, str]] | None  # ``_projected``
    schema: pa.Schema | None  # the rows' way's schema of those columns (``tables.row_schema``)
    duckdb_types: tuple[str, ...]  # DuckDB's type name of each projected column


_SHAPES_PER_INDEX = 64
_SHAPE_LITERAL_CHARS_MAX = 4096  # of a kept shape's literal values together
# A kept shape's projected columns: each entry holds its columns and a schema of them, so a
# text of 20,000 aliased columns would hold megabytes per entry (review R2-F2, round 13).
_SHAPE_COLUMNS_MAX = 256


def _shape_work(index: _Index, shape: LookupShape) -> _ShapeWork:
    """``_ShapeWork`` of ``shape`` on ``index``, kept on the index by the shape's id (the
    planner keeps one plan, so one shape object, per statement text)."""
    kept = index.shapes.get(id(shape))
    if kept is not None and kept.shape is shape:
        return kept
    by_column: dict[int, int] = {}
    for number, (column, _) in enumerate(shape.equalities):
        position = index.lower_names.get(fold(column))
        if position is None or position in by_column:
            by_column = {}
            break
        by_column[position] = number
    key_equalities = None
    if by_column and set(by_column) == set(index.key_columns):
        key_equalities = tuple((i, by_column[i]) for i in index.key_columns)
    columns = _projected(index, shape)
    schema = None
    duckdb_types: tuple[str, ...] = ()
    if columns is not None:
        schema = tables.row_schema([(name, index.types[i]) for i, name in columns])
        duckdb_types = tuple(index.types[i] for i, _ in columns)
    work = _ShapeWork(shape, key_equalities, columns, schema, duckdb_types)
    # a text's big string literal, or a projection of very many columns, is not held
    if _keeps_shape(work):
        # the shape is pinned here (held beside its id): its columns, and the schema's
        projected = 0 if columns is None else len(columns)
        cost = (SCHEMA_COLUMN_BYTES * (2 * projected + len(shape.equalities))
                + 4 * _literal_chars(shape))  # fmt: skip
        index.shapes.put(id(shape), work, cost)
    return work


def _literal_chars(shape: LookupShape) -> int:
    return sum(len(str(value.literal)) for _, value in shape.equalities
               if value.parameter is None)  # fmt: skip


def _keeps_shape(work: _ShapeWork) -> bool:
    """Whether ``work`` is small enough to be held (on its index, or by a kept plan's
    ``KeptWay``): its literals and its projected columns within their bounds."""
    projected = 0 if work.columns is None else len(work.columns)
    return (projected <= _SHAPE_COLUMNS_MAX
            and _literal_chars(work.shape) <= _SHAPE_LITERAL_CHARS_MAX)  # fmt: skip


def _bound_key(index: _Index, shape: LookupShape, parameters: Any,
               work: _ShapeWork) -> tuple[Any, ...] | None:  # fmt: skip
    """The key the equalities give, in the key's column order, each value converted as
    DuckDB converts it for that column; None when one cannot be proved the same (the
    statement then runs in DuckDB, which answers or refuses it itself)."""
    if shape.parameters:
        if not isinstance(parameters, list | tuple) or len(parameters) != shape.parameters:
            return None
    elif parameters:
        return None
    if work.key_equalities is None:
        return None
    key = []
    equalities = shape.equalities
    for position, number in work.key_equalities:
        converted = _converted(index.types[position], equalities[number][1], parameters)
        if converted is None:
            return None
        key.append(converted)
    return tuple(key)


def _converted(kind: str, value: LookupValue, parameters: Any) -> Any:
    """``value`` as a key of DuckDB type ``kind``, or None if not proved DuckDB's."""
    given = value.literal if value.parameter is None else parameters[value.parameter - 1]
    if kind == "VARCHAR":
        if type(given) is not str:
            return None
        if not given.isascii():
            try:
                given.encode()
            except UnicodeEncodeError:
                return None  # no UTF-8 (a lone surrogate): DuckDB's to refuse
        return given
    if type(given) is str:
        if not _CANONICAL_INTEGER.fullmatch(given):
            return None
        given = int(given)
    if type(given) is not int:
        return None  # None (NULL), bool, float, Decimal...: DuckDB decides
    low, high = _INTEGER_RANGES[kind]
    return given if low <= given <= high else None


def _projected(index: _Index, shape: LookupShape) -> list[tuple[int, str]] | None:
    """(column index, DuckDB's output name) of each projected column."""
    names = index.table.column_names
    if shape.columns is None:
        return list(enumerate(names))
    projected = []
    for column, alias in shape.columns:
        position = index.lower_names.get(fold(column))
        if position is None:
            return None
        projected.append((position, names[position] if alias is None else alias))
    return projected


def _result(index: _Index, columns: list[tuple[int, str]], row: int | None,
            schema: pa.Schema | None) -> pa.Table | Rows:  # fmt: skip
    """The one row (or none) as DuckDB gives it: ``Rows`` when every column is of the rows'
    way's plain types (``schema``: ``tables.row_schema`` of the columns), else DuckDB's
    Arrow of that row."""
    if schema is not None:
        if row is None:
            return Rows([], schema)
        chunk, at = index.chunk_of(row)
        cell_values = index.cell_values
        return Rows([tuple([cell_values(i, chunk).value(at) for i, _ in columns])], schema)
    # A copy of the row taken from its chunk, not a slice: a slice keeps (and its buffer
    # size counts) the whole chunk's buffers, and fronts bound results by buffer size.
    chunk, at = (0, None) if row is None else index.chunk_of(row)
    if not index.table.column(0).num_chunks:  # no rows at all
        table = index.table.select([i for i, _ in columns])
    else:
        arrays = [index.chunks[i][chunk] for i, _ in columns]
        fields = [index.table.schema.field(i) for i, _ in columns]
        table = pa.Table.from_arrays(arrays, schema=pa.schema(fields, index.table.schema.metadata))
        table = table.take(pa.array([] if at is None else [at], pa.int64()))
    return table.rename_columns([name for _, name in columns])
