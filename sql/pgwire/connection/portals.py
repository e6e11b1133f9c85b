"""Prepared statements and portals of the extended protocol, and how rows are described.

``Prepared`` (a Parse: the statement, its parameter OIDs, once described its columns) and
``Portal`` (a Bind: parameters, result formats, the result as Execute sends it); the
errors of the extended protocol; ``error_fields`` (SQLSTATE, message and Position of any
error, the caret of a syntax error turned into Position); RowDescription builders; and
the revalidation of a described statement (PostgreSQL's ``RevalidateCachedQuery``).
Used by ``connection`` only; nothing here talks to a socket or runs a statement.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from engine.api import Description, Result, Rows, ast
from sql.internal_error import internal_error, out_of_memory
from sql.pgwire.codec import messages as m
from sql.pgwire.codec import wire_types
from sql.pgwire.memory_budget import ConnectionHoldings
from storage.errors import (
    FeatureNotSupportedError,
    SqlSyntaxError,
    TopicbaseError,
)


class ProtocolViolation(TopicbaseError):
    """A message that parsed but does not fit (08P01); unlike ProtocolError, not fatal."""

    sqlstate = "08P01"


@dataclass
class Prepared:
    """A parsed statement. ``parameter_oids`` holds the client's OIDs (0: unspecified)
    until Describe fills the zeros with the types the engine inferred (text where it
    could not); ``columns`` is then the described result, (name, OID) pairs, or None.
    ``wire``/``copy``: the statement is one the wire server runs itself
    (``commands.is_wire_statement``), a COPY (``commands.is_copy_statement``); worked
    out once at Parse, not again at each Bind, Describe and Execute."""

    query: str
    statement: ast.Statement | None  # None: an empty query
    parameter_oids: list[int]
    described: bool = False
    columns: list[tuple[str, int]] | None = None
    wire: bool = field(kw_only=True)
    copy: bool = field(kw_only=True)
    # Whether its text is of the primary-key lookup shape (``engine.api.lookup_shaped``),
    # worked out at its first execution: only those are offered to ``answer_lookup``.
    lookup: bool | None = field(default=None, kw_only=True)
    # Set once a lookup flight of it ran and found its row wider than a flight answers
    # (``output.INLINE_VALUES``): its later flights go to the message loop at once
    # instead of running the lookup twice (review R1 round 16, 3.2).
    too_wide_for_flight: bool = field(default=False, kw_only=True)
    # An ``INSERT INTO TOPIC ... VALUES`` without RETURNING (``insert_flight.takes``),
    # worked out at Parse: its flights may be answered by ``insert_flight``.
    insert: bool = field(default=False, kw_only=True)
    # Set when the message loop's last run of it was answered from a kept literal row
    # (``Session.answer_literal``), cleared when a literal flight's answer was refused:
    # its flights may be answered by ``literal_flight``.
    literal: bool = field(default=False, kw_only=True)


@dataclass
class Portal:
    prepared: Prepared
    parameters: list[Any]
    result_formats: list[int]
    result: Result | None = None
    executed: bool = False
    position: int = 0
    oids: list[int] = field(default_factory=list)
    formats: list[int] = field(default_factory=list)
    # Untyped text parameters, by index, as sent, to decode at Execute by the statement's
    # type there (described then): array literals ({...}), decoded where it takes a list, and
    # texts an integer cast in DuckDB reads but PostgreSQL refuses (``1.5``: 22P02) where it
    # takes an integer (``wire_types.integer_cast_differs``).
    untyped: list[tuple[int, bytes]] = field(default_factory=list)
    # The RowDescription of the result when a kept shape gave it (``rows_shape``).
    row_description: bytes | None = None
    # The bytes of its Bind message, counted in the server's ``MemoryBudget`` while the
    # portal is held (``HeldPortals``), and those of its rows once ``hold_rows`` counted them.
    held_bytes: int = 0
    rows_held: bool = False


class HeldPortals(dict[str, Portal]):
    """A connection's portals by name, their Bind messages' bytes held in the connection's
    ``ConnectionHoldings`` (``sql.pgwire.memory_budget``: its floor first, then the server's
    budget) while the portal is held (``hold`` at Bind; given back when a portal is
    replaced, closed, cleared at Sync or at a transaction's end, or the connection ends).

    Invariants: ``held_bytes`` is the sum of the portals' ``held_bytes``, all of it held in
    ``holdings``. Changed by ``hold``, ``pop``, ``clear`` and ``release`` only (never
    ``[name] =``), on the connection's one loop."""

    def __init__(self, holdings: ConnectionHoldings) -> None:
        super().__init__()
        self.holdings = holdings
        self.held_bytes = 0

    def hold(self, name: str, portal: Portal, nbytes: int) -> None:
        """Store ``portal`` (of a Bind of ``nbytes``) under ``name``, replacing the one of
        that name (dropped first, as PostgreSQL drops the unnamed portal a Bind replaces);
        53200 (nothing stored) past the connection's share or the budget."""
        if name in self:
            self.pop(name)
        holdings = self.holdings
        held = holdings.held + nbytes
        if held - holdings.floor > holdings.charged:  # beyond what is already accounted
            holdings.take(nbytes, "a Bind message")
        else:  # ``holdings.take``'s way within the floor, inlined: a Bind per statement
            holdings.held = held
        portal.held_bytes = nbytes
        dict.__setitem__(self, name, portal)
        self.held_bytes += nbytes

    def hold_rows(self, portal: Portal, nbytes: int) -> None:
        """Count the ``nbytes`` of rows a named portal keeps between messages (its result,
        kept until the portal is closed, replaced or dropped at the transaction's end, as a
        SQL cursor's are: round 26, 1,000 named portals a connection each held a result of
        up to ``result_bytes_max`` in a transaction block, uncounted); once a portal.
        53200 past the connection's share or the budget (nothing counted)."""
        if portal.rows_held:
            return
        self.holdings.take(nbytes, "a portal's rows")
        portal.rows_held = True
        portal.held_bytes += nbytes
        self.held_bytes += nbytes

    def pop(self, name: str, default: Any = None) -> Any:  # type: ignore[override]
        portal = super().pop(name, None)
        if portal is None:
            return default
        self.held_bytes -= portal.held_bytes
        self.holdings.give(portal.held_bytes)
        return portal

    def clear(self) -> None:
        if self:
            dict.clear(self)
            holdings = self.holdings
            if holdings.charged:
                holdings.give(self.held_bytes)
            else:  # ``holdings.give``'s way within the floor, inlined: a Sync per statement
                holdings.held -= self.held_bytes
            self.held_bytes = 0

    def release(self) -> None:
        """Drop every portal (the connection ends)."""
        self.clear()


def error_fields(error: BaseException, query: str | None = None) -> tuple[str, str, int | None]:
    """SQLSTATE, message and 1-based character position (if known) of ``error``.

    A syntax error's "LINE n: …" excerpt and caret (the console shows them) become the
    Position field instead, as PostgreSQL sends it: clients such as psql draw their own."""
    if isinstance(error, TopicbaseError):
        message, line, column = _without_caret(error.message)
        if isinstance(error, SqlSyntaxError) and error.line and error.column:
            line, column = error.line, error.column
        position = None
        if query and line and column:
            lines = query.split("\n")
            if line <= len(lines):
                position = sum(len(text) + 1 for text in lines[: line - 1]) + column
        return error.sqlstate, message, position
    if isinstance(error, KeyboardInterrupt):
        return "57014", "canceling statement due to user request", None
    if isinstance(error, MemoryError):  # an allocation refused (the process cap): 53200
        refused = out_of_memory(error, "a wire statement")
        return refused.sqlstate, refused.message, None
    # A bug: the traceback goes to the log under an id; the client gets only the id.
    internal = internal_error(error, "a wire statement")
    return internal.sqlstate, internal.message, None


_CARET = re.compile(r"\n*LINE (\d+): ([^\n]*)\n( *)\^+ *$")


def _without_caret(message: str) -> tuple[str, int | None, int | None]:
    """``message`` without a trailing "LINE n: text" + caret excerpt, and the 1-based line
    and column the caret points at (None when there is none, or the excerpt was cut)."""
    found = _CARET.search(message)
    if found is None:
        return message, None, None
    prefix = len(f"LINE {found.group(1)}: ")
    column = len(found.group(3)) - prefix + 1
    excerpt_cut = found.group(2).startswith("...")
    if column < 1 or excerpt_cut:
        return message[: found.start()], None, None
    return message[: found.start()], int(found.group(1)), column


def result_formats(count: int, formats: list[int]) -> list[int]:
    """Bind's result format codes for ``count`` columns (none: all text; one: for all)."""
    if not formats:
        return [0] * count
    if len(formats) == 1:
        return formats * count
    if len(formats) != count:
        raise ProtocolViolation(f"bind message has {len(formats)} result formats but query has "
                                f"{count} columns")  # fmt: skip
    return formats


def result_columns(table: pa.Table | Rows, formats: list[int]) -> tuple[list[int], list[int]]:
    return [wire_types.type_oid(f.type) for f in table.schema], result_formats(
        table.num_columns, formats
    )


def row_description(table: pa.Table | Rows, oids: list[int], formats: list[int]) -> bytes:
    return described_row(table.column_names, oids, formats)


_ROW_DESCRIPTIONS_KEPT = 1024
_ROW_DESCRIPTION_NAME_CHARS = 4096  # longer names together (expressions): not kept
# (names, OIDs, formats) -> the RowDescription message: a repeated statement's is encoded
# once (it depends on these alone); cleared when full. Thread-safe as dict operations are.
_row_descriptions: dict[tuple[tuple[str, ...], tuple[int, ...], tuple[int, ...]], bytes] = {}


def described_row(names: list[str], oids: list[int], formats: list[int]) -> bytes:
    key = (tuple(names), tuple(oids), tuple(formats))
    message = _row_descriptions.get(key)
    if message is None:
        message = m.row_description(
            [
                m.Column(name, oid, wire_types.type_size(oid), -1, fmt)
                for name, oid, fmt in zip(names, oids, formats, strict=True)
            ]
        )
        if sum(map(len, names)) <= _ROW_DESCRIPTION_NAME_CHARS:
            if len(_row_descriptions) >= _ROW_DESCRIPTIONS_KEPT:
                _row_descriptions.clear()
            _row_descriptions[key] = message
    return message


@dataclass(frozen=True)
class RowsShape:
    """How the rows of one result shape go out: OIDs, formats, the RowDescription."""

    schema: pa.Schema
    oids: list[int]
    formats: list[int]
    row_description: bytes


_ROWS_SHAPES_KEPT = 1024
# (id of a ``Rows`` schema, result formats) -> its ``RowsShape``. The engine keeps one
# schema object per result shape (``engine.tables``' rows' way, ``Result``'s renaming),
# so a repeated statement finds its shape here instead of working out OIDs, formats and
# the RowDescription per run. The schema is held, so its id is not reused while kept.
_rows_shapes: dict[tuple[int, tuple[int, ...]], RowsShape] = {}


def rows_shape(schema: pa.Schema, asked: list[int]) -> RowsShape:
    """The OIDs, formats (``asked``: Bind's result formats) and RowDescription of
    ``Rows`` of ``schema``, as ``result_columns`` and ``row_description`` make them (a
    ``Rows`` string column is VARCHAR: no description refines it). Raises as they do for
    a wrong count of formats or a binary format a type cannot send."""
    key = (id(schema), tuple(asked))
    shape = _rows_shapes.get(key)
    if shape is not None and shape.schema is schema:
        return shape
    oids = [wire_types.type_oid(f.type) for f in schema]
    formats = result_formats(len(oids), asked)
    for fmt, oid in zip(formats, oids, strict=True):
        if fmt == 1:
            wire_types.column_encoder(oid, 1)  # raises for types without binary output
    shape = RowsShape(schema, oids, formats, described_row(schema.names, oids, formats))
    if len(_rows_shapes) >= _ROWS_SHAPES_KEPT:
        _rows_shapes.clear()
    _rows_shapes[key] = shape
    return shape


class CachedPlanChangedError(FeatureNotSupportedError):
    """A prepared statement's rows no longer match its description (0A000). Sent with
    PostgreSQL's routine name, by which clients (asyncpg) know to prepare again."""


def revalidation_error(text: str) -> bytes:
    fields = [b"S" + m.cstr("ERROR"), b"V" + m.cstr("ERROR"), b"C" + m.cstr("0A000"),
              b"M" + m.cstr(text), b"R" + m.cstr("RevalidateCachedQuery")]  # fmt: skip
    return m.message(b"E", b"".join(fields) + b"\0")


def described_oids(described: list[tuple[str, int]], oids: list[int]) -> list[int]:
    """The OIDs a described statement's rows go out with: its description's, which may
    only add what Arrow cannot tell (UUID, JSON for text). Anything else means the tables
    changed since the description; the client must prepare again, as with PostgreSQL."""
    refined = [(wire_types.TEXT, wire_types.UUID), (wire_types.TEXT, wire_types.JSON)]
    if len(described) != len(oids) or any(
        oid != wanted and (oid, wanted) not in refined
        for (_, wanted), oid in zip(described, oids, strict=False)
    ):
        raise FeatureNotSupportedError("cached plan must not change result type")
    return [oid for _, oid in described]


def apply_description(prepared: Prepared, description: Description | None) -> None:
    """Fix ``prepared``'s parameter types and result columns from the engine's description
    (parameters the client typed keep the client's type)."""
    inferred = [] if description is None else list(description.parameter_types)
    count = max(len(prepared.parameter_oids), len(inferred))
    declared = [*prepared.parameter_oids, *[0] * (count - len(prepared.parameter_oids))]
    inferred += [None] * (count - len(inferred))
    prepared.parameter_oids = [
        oid if oid not in (0, wire_types.UNKNOWN) else wire_types.sql_type_oid(sql_type)
        for oid, sql_type in zip(declared, inferred, strict=True)
    ]
    columns = None if description is None else description.columns
    prepared.columns = None if columns is None else [
        (c.name, wire_types.column_oid(c.arrow_type, c.sql_type)) for c in columns
    ]  # fmt: skip
    # A statement the wire server runs itself (FETCH ...) has no engine description:
    # Describe of its portal still runs it to find its rows.
    prepared.described = description is not None
