"""Small results as Python values (``engine.result.Rows``, issue 14, docs/statement_cost.md):
a session's query whose result the rows' way reads whole hands its rows on without building
their Arrow table; ``Result.table`` builds it when read, equal to DuckDB's own."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from engine import tables
from engine.database import Database
from engine.result import Result, Rows
from engine.session import Session

from .test_statement_cost_results import VALUES


@pytest.fixture
def session(tmp_path: Path) -> Iterator[Session]:
    database = Database.open(str(tmp_path / "data"))
    tables._small_results.clear()
    opened = database.connect()
    yield opened
    opened.close()
    database.close()


def _key(value: Any) -> Any:
    if isinstance(value, float):
        return "nan" if math.isnan(value) else (value, math.copysign(1.0, value))
    return value


def _same(mine: pa.Table, theirs: pa.Table) -> None:
    assert mine.schema.equals(theirs.schema, check_metadata=True), (mine.schema, theirs.schema)
    for a, b in zip(mine.columns, theirs.columns, strict=True):
        assert [_key(v) for v in a.to_pylist()] == [_key(v) for v in b.to_pylist()]


@pytest.mark.parametrize("kind", list(VALUES))
def test_a_small_result_comes_as_rows_whose_table_is_duckdb_s(
    session: Session, kind: str
) -> None:
    sql = f"SELECT x, x AS y, 1 AS \"?c\" FROM unnest({VALUES[kind]}::{kind}[]) AS t(x)"
    first = session.execute(sql)[-1]  # the relation's way: DuckDB's own Arrow table
    assert first.rows is None and first.table is not None
    again = session.execute(sql)[-1]
    rows = again.rows
    assert rows is not None and "_table" in again.__dict__ and again.__dict__["_table"] is None
    assert again.tag == first.tag and again.columns == first.columns == ["x", "y", "?c"]
    assert again.rowcount == first.rowcount == rows.num_rows
    _same(again.table, first.table)
    assert again.rows is rows and again.table is again.table  # built once


def test_postgresql_s_column_names_rename_the_rows(session: Session) -> None:
    for _ in range(3):
        result = session.execute("SELECT 1, 'a' || 'b'")[-1]
    assert result.rows is not None
    assert result.columns == ["?column?", "?column?"]
    assert result.table.column_names == ["?column?", "?column?"]
    assert [column.to_pylist() for column in result.table.columns] == [[1], ["ab"]]


def test_what_is_not_small_or_not_last_stays_arrow(session: Session) -> None:
    session.execute("CREATE TABLE t AS SELECT i AS id FROM range(100) r(i)")
    for _ in range(3):
        big = session.execute("SELECT id FROM t ORDER BY id")[-1]
        dml = session.execute("UPDATE t SET id = id WHERE id < 0")[-1]
    assert big.rows is None and big.table is not None and big.table.num_rows == 100
    assert dml.rows is None and dml.tag == "UPDATE 0"


def test_rows_slice_rename_and_bound_their_arrow_size() -> None:
    schema = pa.schema([("a", pa.int64()), ("b", pa.string()), ("c", pa.bool_()),
                        ("d", pa.binary())])  # fmt: skip
    rows = Rows([(1, "x" * 300, True, b"\0" * 70), (None, None, None, None), (3, "ü", False, b"")],
                schema)  # fmt: skip
    table = rows.to_arrow()
    assert rows.nbytes_bound() >= max(table.nbytes, table.get_total_buffer_size())
    assert rows.slice(1, 5).rows == rows.rows[1:]
    renamed = rows.rename_columns(["w", "x", "y", "z"])
    assert renamed.column_names == ["w", "x", "y", "z"] and renamed.rows is rows.rows
    assert renamed.to_arrow().schema.types == table.schema.types
    assert rows.rename_columns(["w", "x", "y", "z"]).schema is renamed.schema  # kept


def test_a_result_made_of_arrow_is_unchanged() -> None:
    table = pa.table({"a": [1]})
    result = Result("SELECT 1", table)
    assert result.rows is None and result.table is table and result.columns == ["a"]
    assert Result("BEGIN").table is None and Result("BEGIN").rowcount == -1
