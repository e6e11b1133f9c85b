"""Per-statement work done once instead of per execution (issue 14, docs/statement_cost.md):
the rows' way of small results builds a result shape's Arrow schema once
(``engine.tables._row_shape``), the text encoders of column types are made once
(``wire_types.column_encoder``), and a Parse works out once whether its statement is one
the wire server runs itself (``Prepared.wire``/``copy``)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
import pytest

from engine import tables
from sql.pgwire.codec import messages as m
from sql.pgwire.codec import wire_types
from sql.pgwire.connection.extended import ExtendedProtocol
from sql.pgwire.connection.portals import Prepared


@pytest.fixture
def cursor() -> Iterator[tables.Connection]:
    connection = tables.connect(":memory:")
    tables._small_results.clear()
    tables._row_shapes.clear()
    yield connection.cursor()
    connection.close()


def _head(cursor: tables.Connection, sql: str) -> pa.Table:
    head, more = tables._small_head(cursor, sql, None)
    assert head is not None and not more
    return head


def test_a_result_shape_is_built_once_told_apart_by_names_and_types(
    cursor: tables.Connection,
) -> None:
    first = _head(cursor, "SELECT 1 AS a, 'x' AS b")
    again = _head(cursor, "SELECT 2 AS a, 'y' AS b")
    assert first.schema.equals(again.schema)
    assert len(tables._row_shapes) == 1  # one shape, kept
    renamed = _head(cursor, "SELECT 1 AS c, 'x' AS b")
    retyped = _head(cursor, "SELECT 1::BIGINT AS a, 'x' AS b")
    assert renamed.schema.names == ["c", "b"]
    assert retyped.schema.field("a").type == pa.int64()
    assert first.schema.field("a").type == pa.int32()
    assert len(tables._row_shapes) == 3
    assert again.to_pylist() == [{"a": 2, "b": "y"}]


def test_a_shape_of_other_types_is_left_to_duckdb(cursor: tables.Connection) -> None:
    head, more = tables._small_head(cursor, "SELECT DATE '2024-01-02' AS d", None)
    assert head is None and more
    assert list(tables._row_shapes.values()) == [None]
    assert tables._small_results["SELECT DATE '2024-01-02' AS d"] is False


def test_text_encoders_are_made_once_per_type() -> None:
    assert wire_types.column_encoder(wire_types.INT4, 0) is wire_types.column_encoder(
        wire_types.INT4, 0
    )
    encode = wire_types.column_encoder(wire_types.TEXT, 0)
    assert encode("é") == "é".encode()
    table = pa.table({"a": pa.array([1, None], pa.int32()), "b": ["x", "y"]})
    rows = wire_types.encode_rows(table, [wire_types.INT4, wire_types.TEXT], [0, 0])
    assert rows == [[b"1", b"x"], [None, b"y"]]


def test_a_parse_says_once_whether_the_wire_server_runs_its_statement() -> None:
    class Connection(ExtendedProtocol):
        def __init__(self) -> None:
            self.statements: dict[str, Prepared] = {}
            self.sent: list[bytes] = []

        def send(self, data: bytes) -> None:
            self.sent.append(data)

        async def call(self, function: Callable[..., Any], *arguments: Any) -> Any:
            return function(*arguments)

    connection = Connection()
    for name, query in (("q", "SELECT 1"), ("c", "COPY t TO STDOUT"),
                        ("f", "FETCH 1 FROM cur")):  # fmt: skip
        asyncio.run(connection.on_parse(m.Parse(name, query, [])))
    flags = {name: (p.wire, p.copy) for name, p in connection.statements.items()}
    assert flags == {"q": (False, False), "c": (True, True), "f": (True, False)}
