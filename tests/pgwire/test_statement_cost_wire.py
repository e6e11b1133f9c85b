"""Per-statement work done once instead of per execution (issue 14, docs/statement_cost.md):
the rows' way of small results builds a result shape's Arrow schema once
(``engine.tables._row_shape``), the text encoders of column types are made once
(``wire_types.column_encoder``), and a Parse works out once whether its statement is one
the wire server runs itself (``Prepared.wire``/``copy``)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import psycopg
import pyarrow as pa
import pytest

from engine import tables
from engine.api import SessionState
from sql.pgwire.codec import messages as m
from sql.pgwire.codec import wire_types
from sql.pgwire.connection import portals
from sql.pgwire.connection.extended import ExtendedProtocol
from sql.pgwire.connection.portals import Prepared
from storage import errors


@pytest.fixture
def cursor() -> Iterator[tables.Connection]:
    connection = tables.connect(":memory:")
    tables._small_results.clear()
    tables._row_shapes.clear()
    yield connection.cursor()
    tables._small_results.clear()
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


def test_a_row_description_is_encoded_once_per_shape() -> None:
    first = portals.described_row(["v", "n"], [wire_types.TEXT, wire_types.INT8], [0, 1])
    assert portals.described_row(["v", "n"], [wire_types.TEXT, wire_types.INT8], [0, 1]) is first
    fields = [m.Column("v", wire_types.TEXT, -1, -1, 0), m.Column("n", wire_types.INT8, 8, -1, 1)]
    assert first == m.row_description(fields)
    other = portals.described_row(["v", "n"], [wire_types.TEXT, wire_types.INT8], [0, 0])
    assert other != first  # formats are part of the shape, as are names and OIDs
    with pytest.raises(ValueError):
        portals.described_row(["v"], [wire_types.TEXT, wire_types.INT8], [0, 0])
    long_names = ["x" * 5000]
    assert portals.described_row(long_names, [wire_types.TEXT], [0]) is not (
        portals.described_row(long_names, [wire_types.TEXT], [0]))  # fmt: skip


def test_a_parse_says_once_whether_the_wire_server_runs_its_statement() -> None:
    class Connection(ExtendedProtocol):
        def __init__(self) -> None:
            self.statements: dict[str, Prepared] = {}
            self.sent: list[bytes] = []

        def send(self, data: bytes) -> None:
            self.sent.append(data)

        async def call(self, function: Callable[..., Any], *arguments: Any) -> Any:
            return function(*arguments)

        session = SimpleNamespace(state=SessionState.IDLE)  # Parse refuses nothing

    connection = Connection()
    for name, query in (("q", "SELECT 1"), ("c", "COPY t TO STDOUT"),
                        ("f", "FETCH 1 FROM cur")):  # fmt: skip
        asyncio.run(connection.on_parse(m.Parse(name, query, [])))
    flags = {name: (p.wire, p.copy) for name, p in connection.statements.items()}
    assert flags == {"q": (False, False), "c": (True, True), "f": (True, False)}


# -- DuckDB's kept plans (engine.tables.CursorPlans) ------------------------------------------
def _plans_in_duckdb(cursor: tables.Connection) -> list[str]:
    rows = cursor.execute("SELECT name FROM duckdb_prepared_statements()").fetchall()
    return sorted(name for (name,) in rows if name.startswith(tables.PLAN_PREFIX))


def _rows(cursor: tables.Connection, sql: str) -> list[dict[str, object]]:
    table = tables.query_arrow(cursor, sql)
    assert table is not None
    return table.to_pylist()


def _kept(cursor: tables.Connection, sql: str) -> list[dict[str, object]]:
    """Run ``sql`` until it runs from a kept plan (relation, rows, rows + PREPARE)."""
    for _ in range(3):
        rows = _rows(cursor, sql)
    assert tables._plans_of(cursor).name(sql) is not None
    return rows


def test_a_repeated_query_runs_from_its_kept_plan(cursor: tables.Connection) -> None:
    cursor.execute("CREATE TABLE t (a INTEGER)")
    cursor.execute("INSERT INTO t VALUES (1), (2)")
    sql = "SELECT sum(a)::BIGINT AS s FROM t"
    assert _rows(cursor, sql) == [{"s": 3}]  # the relation's way
    assert _rows(cursor, sql) == [{"s": 3}]  # the rows' way, seen once
    assert _plans_in_duckdb(cursor) == []
    assert _rows(cursor, sql) == [{"s": 3}]  # seen twice: PREPAREd
    assert len(_plans_in_duckdb(cursor)) == 1
    cursor.execute("INSERT INTO t VALUES (4)")
    assert _rows(cursor, sql) == [{"s": 7}]  # EXECUTEd: the data of now
    assert len(_plans_in_duckdb(cursor)) == 1
    assert tables.query_arrow(cursor, "SELECT $1::INTEGER AS p", [5]).to_pylist() == [{"p": 5}]


def test_a_kept_plan_binds_as_its_text_after_ddl_and_search_path(
    cursor: tables.Connection,
) -> None:
    cursor.execute("CREATE TABLE t (a INTEGER)")
    cursor.execute("INSERT INTO t VALUES (1)")
    sql = "SELECT * FROM t"
    assert _kept(cursor, sql) == [{"a": 1}]
    cursor.execute("ALTER TABLE t ADD COLUMN b VARCHAR DEFAULT 'x'")
    assert _rows(cursor, sql) == [{"a": 1, "b": "x"}]
    cursor.execute("CREATE SCHEMA s")
    cursor.execute("CREATE TABLE s.t (z BIGINT)")
    cursor.execute("INSERT INTO s.t VALUES (42)")
    cursor.execute("SET search_path = 's'")
    assert _rows(cursor, sql) == [{"z": 42}]
    cursor.execute("SET search_path = 'main'")
    cursor.execute("CREATE TEMP TABLE t (q INTEGER)")
    cursor.execute("INSERT INTO temp.t VALUES (7)")
    assert _rows(cursor, sql) == [{"q": 7}]


def test_a_plan_whose_table_is_gone_fails_as_its_text_and_is_forgotten(
    cursor: tables.Connection,
) -> None:
    cursor.execute("CREATE TABLE t (a INTEGER)")
    sql = "SELECT count(*) AS n FROM t"
    assert _kept(cursor, sql) == [{"n": 0}]
    cursor.execute("DROP TABLE t")
    with pytest.raises(errors.TopicbaseError) as raised:
        tables.query_arrow(cursor, sql)
    assert raised.value.sqlstate == "42P01"
    assert tables._plans_of(cursor).name(sql) is None
    cursor.execute("CREATE TABLE t (a VARCHAR)")
    cursor.execute("INSERT INTO t VALUES ('x'), ('y')")
    assert _kept(cursor, sql) == [{"n": 2}]
    assert len(_plans_in_duckdb(cursor)) == 1  # the failed plan was DEALLOCATEd


def test_a_plan_made_in_a_rolled_back_transaction_still_runs(cursor: tables.Connection) -> None:
    cursor.execute("CREATE TABLE t (a INTEGER)")
    cursor.execute("BEGIN")
    cursor.execute("INSERT INTO t VALUES (5)")
    assert _kept(cursor, "SELECT max(a) AS m FROM t") == [{"m": 5}]
    cursor.execute("ROLLBACK")
    assert _rows(cursor, "SELECT max(a) AS m FROM t") == [{"m": None}]


def test_plans_are_bounded_per_cursor(cursor: tables.Connection) -> None:
    for number in range(tables.PLANS_PER_CURSOR + 10):
        _kept(cursor, f"SELECT {number} AS n")
    assert len(_plans_in_duckdb(cursor)) <= tables.PLANS_PER_CURSOR
    assert _rows(cursor, "SELECT 3 AS n") == [{"n": 3}]


def test_only_single_parameterless_selects_are_kept(cursor: tables.Connection) -> None:
    cursor.execute("CREATE TABLE t (a INTEGER)")
    for sql in ("SELECT 1 AS a; SELECT 2 AS a", "WITH x AS (SELECT 1 AS a) SELECT a FROM x"):
        for _ in range(3):
            tables.query_arrow(cursor, sql)
        assert tables._plans_of(cursor).name(sql) is None
    for _ in range(3):
        tables.query_arrow(cursor, "SELECT $1::INTEGER AS a", [1])
    assert _plans_in_duckdb(cursor) == []


def test_plan_runs_do_not_move_the_catalog_version_descriptions_are_kept_by(
    cursor: tables.Connection,
) -> None:
    cursor.execute("CREATE TABLE t (a INTEGER)")
    _kept(cursor, "SELECT count(*) AS n FROM t")
    before = tables.catalog_version(cursor)
    for _ in range(3):
        _rows(cursor, "SELECT count(*) AS n FROM t")
    assert tables.catalog_version(cursor) == before
    cursor.execute("ALTER TABLE t ADD COLUMN b INTEGER")
    assert tables.catalog_version(cursor) != before


def test_streamed_results_from_a_kept_plan_keep_their_duckdb_types(
    cursor: tables.Connection,
) -> None:
    sql = "SELECT 1 AS a, 'x' AS b"
    _kept(cursor, sql)
    reader, duckdb_types = tables.batch_reader(cursor, sql, None, 100)
    assert duckdb_types == ["INTEGER", "VARCHAR"]
    assert reader.read_all().to_pylist() == [{"a": 1, "b": "x"}]


def test_a_query_over_a_registered_relation_is_not_kept(cursor: tables.Connection) -> None:
    sql = "SELECT count(*) AS n FROM stand_in"
    for rows in ([1, 2], [1, 2, 3], [4]):
        tables.register(cursor, "stand_in", pa.table({"a": rows}))
        assert _rows(cursor, sql) == [{"n": len(rows)}]
        tables.unregister(cursor, "stand_in")
    assert tables._plans_of(cursor).name(sql) is None
    assert _plans_in_duckdb(cursor) == []


def test_kept_plans_through_the_wire_follow_the_tables(
    connect: Callable[..., psycopg.Connection],
) -> None:
    """psycopg, simple and prepared: a repeated query keeps giving what its text gives
    while its table changes under it, in and out of transactions."""
    conn = connect(autocommit=True)
    conn.execute("CREATE TABLE t (a INTEGER)")
    conn.execute("INSERT INTO t VALUES (1)")
    query = "SELECT count(*) AS n, max(a) AS m FROM t"
    for prepare in (False, True):
        for _ in range(4):
            assert conn.execute(query, prepare=prepare).fetchone() == (1, 1)
    with tables._plans_lock:  # the server runs in this process: its session kept a plan
        assert any(len(plans) for plans in tables._plans.values())
    conn.execute("INSERT INTO t VALUES (5)")
    assert conn.execute(query, prepare=True).fetchone() == (2, 5)
    with conn.transaction():
        conn.execute("INSERT INTO t VALUES (9)")
        assert conn.execute(query, prepare=False).fetchone() == (3, 9)
    conn.execute("DROP TABLE t")
    with pytest.raises(psycopg.errors.UndefinedTable):
        conn.execute(query, prepare=True)
    conn.execute("CREATE TABLE t (a VARCHAR)")
    conn.execute("INSERT INTO t VALUES ('x')")
    for prepare in (True, False, True):
        assert conn.execute(query, prepare=prepare).fetchone() == (1, "x")


def test_an_executed_statement_is_described_again_only_when_the_catalog_moved(
    connect: Callable[..., psycopg.Connection], described: list[str]
) -> None:
    """An undescribed prepared query with text columns gets its UUID and JSON columns told
    apart by the engine's description after each run; the connection keeps it while
    DuckDB's catalog version stands still, and asks again once anything moved it. (A
    DATE column keeps the result off the rows' way: a result as ``Rows`` asks for no
    description at all, ``test_statement_cost_simple``.)"""
    import datetime

    conn = connect(autocommit=True)
    conn.execute("CREATE TABLE u (k INTEGER, v VARCHAR, d DATE)")
    conn.execute("INSERT INTO u VALUES (1, 'x', DATE '2024-01-02')")
    query = "SELECT v, d FROM u WHERE k = %s"
    day = datetime.date(2024, 1, 2)
    assert conn.execute(query, [1], prepare=True).fetchone() == ("x", day)
    before = len(described)
    for _ in range(6):
        assert conn.execute(query, [1], prepare=True).fetchone() == ("x", day)
    assert len(described) == before  # kept: nothing moved the catalog
    conn.execute("INSERT INTO u VALUES (2, 'y', DATE '2024-01-02')")  # a write moves it
    assert conn.execute(query, [2], prepare=True).fetchone() == ("y", day)
    assert len(described) == before + 1
    conn.execute("DROP TABLE u")
    conn.execute("CREATE TABLE u (k INTEGER, v UUID, d DATE)")
    conn.execute("INSERT INTO u VALUES (1, '00000000-0000-0000-0000-000000000001', NULL)")
    for _ in range(3):  # the same prepared text: now a UUID column, sent as one
        (value, _day) = conn.execute(query, [1], prepare=True).fetchone() or (None, None)
        assert isinstance(value, uuid.UUID) and value.int == 1


@pytest.mark.parametrize("binary", [False, True])
def test_small_results_sent_from_rows_equal_those_sent_from_arrow(
    connect: Callable[..., psycopg.Connection], binary: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """The first run of a text goes out from DuckDB's Arrow table, the later ones from the
    rows as Python values (``engine.api.Rows``): the same values, text and binary."""
    from tests.engine.test_statement_cost_results import VALUES

    from_rows: list[int] = []
    encode = wire_types.encode_value_rows

    def counting(rows: Any, oids: list[int], formats: list[int]) -> Any:
        from_rows.append(len(rows))
        return encode(rows, oids, formats)

    monkeypatch.setattr(wire_types, "encode_value_rows", counting)
    conn = connect(autocommit=True)
    for kind, values in VALUES.items():
        if binary and kind.startswith("U") and kind != "UUID":
            continue  # unsigned types have no binary output (PostgreSQL has none)
        sql = f"SELECT x, 7 AS n FROM unnest({values}::{kind}[]) AS t(x)"
        runs = [conn.cursor(binary=binary).execute(sql, prepare=True).fetchall()
                for _ in range(4)]  # fmt: skip
        assert all(repr(run) == repr(runs[0]) for run in runs), (kind, runs)
    assert len(from_rows) >= 2 * 9  # the later runs of every type went out from rows


def test_a_small_result_over_the_result_limit_is_still_refused(tmp_path: Any) -> None:
    from sql.pgwire.limits import ServerLimits
    from sql.pgwire.server import ServerThread

    running = ServerThread(str(tmp_path / "data"), "127.0.0.1", 0,
                           ServerLimits(result_bytes_max=2000))  # fmt: skip
    try:
        with psycopg.connect(host="127.0.0.1", port=running.port, user="tester",
                             autocommit=True) as conn:  # fmt: skip
            # 1500 characters: over the rows' bound (4 bytes a character), under the
            # limit as Arrow; 2500: over it either way.
            for size in (10, 2500, 1500, 10, 2500, 1500, 2500, 1500):
                sql = "SELECT repeat('x', %s::INTEGER) AS v"
                if size < 2000:
                    assert conn.execute(sql, [size], prepare=True).fetchone() == ("x" * size,)
                else:
                    with pytest.raises(psycopg.errors.ProgramLimitExceeded):
                        conn.execute(sql, [size], prepare=True)
    finally:
        running.stop()
