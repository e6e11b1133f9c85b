"""A statement's outcome (``Result``): a value type with no behaviour of the engine's.

It lives in a leaf module so that what runs statements through a session (``engine.bulk``)
and what the session returns share it without importing ``engine.session``.

``Rows`` is a small result as DuckDB's Python values (``engine.tables``' rows' way: at
most ``SMALL_RESULT_ROWS`` rows of plain column types) with the Arrow schema the engine
would give them; ``tables.FetchReader`` also builds the batches of a bigger result that
the rows' way streams from ones. A ``Result`` made from one builds its Arrow table only when asked
(``Result.table``): building even a one-value table costs ~40-60 us right after DuckDB
ran (docs/statement_cost.md), and a front that encodes the values itself (the wire
server) never needs it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from grammar.bounded_cache import SCHEMA_COLUMN_BYTES, BoundedCache


@dataclass(frozen=True)
class Rows:
    """Rows of Python values (tuples, one value per column, None for NULL) and their
    Arrow ``schema``. Invariant: every value converts to its column's Arrow type exactly
    (``pa.array(values, type)``), as ``engine.tables`` guarantees for the types it makes
    these of (``tables._ROW_ARROW_TYPES``, by DuckDB's type name): so a string column of
    ``Rows`` is DuckDB's VARCHAR, never its UUID or JSON (Arrow strings too, which a front
    describes apart: the wire server asks no description for ``Rows``)."""

    rows: list[tuple[Any, ...]]
    schema: pa.Schema

    @property
    def num_rows(self) -> int:
        return len(self.rows)

    @property
    def num_columns(self) -> int:
        return len(self.schema)

    @property
    def column_names(self) -> list[str]:
        return self.schema.names

    def rename_columns(self, names: Sequence[str]) -> Rows:
        """These rows under ``names`` (as ``pa.Table.rename_columns``)."""
        return Rows(self.rows, _renamed(self.schema, tuple(names)))

    def slice(self, offset: int, length: int) -> Rows:
        return Rows(self.rows[offset : offset + length], self.schema)

    def to_arrow(self) -> pa.Table:
        """The Arrow table of these rows (as DuckDB's relation would give it)."""
        columns = list(zip(*self.rows, strict=True)) if self.rows else [() for _ in self.schema]
        return pa.Table.from_arrays(
            [pa.array(values, f.type) for values, f in zip(columns, self.schema, strict=True)],
            schema=self.schema,
        )

    def nbytes_bound(self) -> int:
        """At least the ``nbytes`` (and buffer size) of ``to_arrow()``: every buffer
        counted padded to 64 bytes, text at 4 bytes a character."""

        def padded(size: int) -> int:
            return (size + 63) // 64 * 64 + 64

        count = len(self.rows)
        total = 0
        for index, column in enumerate(self.schema):
            total += padded((count + 7) // 8)  # validity
            kind = column.type
            if pa.types.is_boolean(kind):
                total += padded((count + 7) // 8)
            elif pa.types.is_string(kind) or pa.types.is_binary(kind):
                size = 0
                for row in self.rows:
                    value = row[index]
                    if value is not None:
                        size += 4 * len(value) if isinstance(value, str) else len(value)
                total += padded(4 * (count + 1)) + padded(size)
            else:
                total += padded(kind.bit_width // 8 * count)
        return total


_RENAMED_MAX = 1024
# (id of a schema, names) -> (that schema, it renamed): a repeated query's result shape
# (``engine.tables`` keeps one schema object per shape) is renamed once, not per run.
# An entry holds two schemas and the names: ``2 * SCHEMA_COLUMN_BYTES`` a column, so that a
# client's wide results cannot make it hold more than its byte budget (``BoundedCache``; 250
# results of 2,000 columns held ~300 MB when only the entries were counted, review R2-N1).
_renamed_schemas = BoundedCache("engine.result.renamed_schemas", _RENAMED_MAX)


def _renamed(schema: pa.Schema, names: tuple[str, ...]) -> pa.Schema:
    key = (id(schema), names)
    kept = _renamed_schemas.get(key)
    if kept is not None and kept[0] is schema:
        return kept[1]
    fields = [field.with_name(name) for field, name in zip(schema, names, strict=True)]
    renamed = pa.schema(fields, metadata=schema.metadata)
    cost = sum(2 * SCHEMA_COLUMN_BYTES + len(name) for name in names)
    _renamed_schemas.put(key, (schema, renamed), cost)
    return renamed


@dataclass
class Result:
    """One statement's outcome: a command tag and, for row-returning statements, a table.

    ``table`` may be given as ``Rows`` (``rows`` then keeps them): the Arrow table is
    built from them the first time ``table`` is read. (``dataclasses.replace`` passes
    the built table on.)"""

    tag: str
    table: pa.Table | None = None
    notices: tuple[str, ...] = field(default=())
    # The rows are a kept literal row (``Session.answer_literal``): the same row tuples,
    # of the same values, for every run of the statement's text, so a front may keep what
    # it made of them by the tuples' identity.
    kept: bool = field(default=False, compare=False)

    @property
    def rows(self) -> Rows | None:
        """The small result's ``Rows`` when ``table`` was given as such, else None."""
        return self.__dict__.get("_rows")

    @property
    def columns(self) -> list[str]:
        if self.rows is not None:
            return self.rows.column_names
        return [] if self.table is None else self.table.column_names

    @property
    def rowcount(self) -> int:
        if self.rows is not None:
            return self.rows.num_rows
        if self.table is not None:
            return self.table.num_rows
        last = self.tag.rsplit(" ", 1)[-1]
        return int(last) if last.isdigit() else -1


def _table(self: Result) -> pa.Table | None:
    table = self.__dict__.get("_table")
    if table is None and self.rows is not None:
        table = self.__dict__["_table"] = self.rows.to_arrow()
    return table


def _set_table(self: Result, value: pa.Table | Rows | None) -> None:
    rows = None
    if isinstance(value, Rows):
        rows, value = value, None
    self.__dict__["_rows"] = rows
    self.__dict__["_table"] = value


# ``table`` as a property over the dataclass field: a ``Rows`` given for it is kept in
# ``rows`` and turned into Arrow on first read.
Result.table = property(_table, _set_table)  # type: ignore[assignment]
