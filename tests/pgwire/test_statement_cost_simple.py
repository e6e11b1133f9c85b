"""Small results of the simple query protocol without Arrow (docs/statement_cost.md, round
5): a streamed query whose result the engine read whole on the rows' way
(``tables.RowsReader``) reaches the wire as ``Rows`` (``RowStream.take_whole``,
``ResultStream.whole_rows``) and its values are encoded as they are; a reader of batches
(COPY TO, DECLARE) still gets the same Arrow batches."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pytest

from engine import tables
from engine.api import Database, Rows, parse_statements
from engine.session import Session
from sql.pgwire.codec import wire_types
from tests.engine.conftest import spy_rows_way
from tests.engine.test_statement_cost_results import VALUES


@pytest.fixture
def session(tmp_path: Path) -> Iterator[Session]:
    database = Database.open(str(tmp_path / "data"))
    opened = database.connect()
    yield opened
    opened.close()
    database.close()


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """How often rows went out as Python values and how often ``Rows`` became Arrow."""
    counts = {"from_rows": 0, "to_arrow": 0}
    encode = wire_types.encode_value_rows
    to_arrow = Rows.to_arrow

    def encoding(rows: Any, oids: list[int], formats: list[int]) -> Any:
        counts["from_rows"] += 1
        return encode(rows, oids, formats)

    def building(self: Rows) -> pa.Table:
        counts["to_arrow"] += 1
        return to_arrow(self)

    monkeypatch.setattr(wire_types, "encode_value_rows", encoding)
    monkeypatch.setattr(Rows, "to_arrow", building)
    return counts


def test_simple_query_small_results_go_out_from_rows_with_the_same_values(
    connect: Callable[..., psycopg.Connection], counted: dict[str, int]
) -> None:
    """Every plain type, four runs of one text through the simple protocol: the first from
    DuckDB's Arrow (the text is not known small yet), the later ones from rows, never
    turned into Arrow; the values and the column names and types are the same."""
    conn = connect(autocommit=True)
    conn.prepare_threshold = None  # always the simple protocol (no parameters)
    for kind, values in VALUES.items():
        sql = f"SELECT x, 7 AS n FROM unnest({values}::{kind}[]) AS t(x)"
        runs = []
        for _ in range(4):
            cursor = conn.execute(sql)
            described = [(c.name, c.type_code) for c in cursor.description or []]
            runs.append((described, cursor.fetchall()))
        assert all(repr(run) == repr(runs[0]) for run in runs), (kind, runs)
    assert counted["from_rows"] >= 3 * len(VALUES)  # the later runs of every type
    assert counted["to_arrow"] == 0


def test_simple_query_small_result_names_and_empty_results(
    connect: Callable[..., psycopg.Connection], counted: dict[str, int]
) -> None:
    """PostgreSQL's column names (``?column?``), an empty result, several statements in one
    Query: the same on every run."""
    conn = connect(autocommit=True)
    conn.prepare_threshold = None
    conn.execute("CREATE TABLE e (a INTEGER)")
    for _ in range(4):
        cursor = conn.execute("SELECT 1, 2 AS b")
        assert [c.name for c in cursor.description or []] == ["?column?", "b"]
        assert cursor.fetchall() == [(1, 2)]
        cursor = conn.execute("SELECT a FROM e")
        assert [c.name for c in cursor.description or []] == ["a"]
        assert cursor.fetchall() == []
        assert cursor.rowcount == 0
        cursor = conn.execute("SELECT 3 AS c; SELECT 'x' AS d")
        assert cursor.fetchall() == [(3,)]
        assert cursor.nextset() and cursor.fetchall() == [("x",)]
    assert counted["from_rows"] >= 3 and counted["to_arrow"] == 0


def test_a_simple_query_small_result_over_the_limit_is_still_refused(tmp_path: Any) -> None:
    from sql.pgwire.limits import ServerLimits
    from sql.pgwire.server import ServerThread

    running = ServerThread(str(tmp_path / "data"), "127.0.0.1", 0,
                           ServerLimits(result_bytes_max=2000))  # fmt: skip
    try:
        with psycopg.connect(host="127.0.0.1", port=running.port, user="tester",
                             autocommit=True, prepare_threshold=None) as conn:  # fmt: skip
            # 1500 characters: over the rows' bound (4 bytes a character), under the
            # limit as Arrow; 2500: over it either way. Each text runs several times (the
            # later runs on the rows' way).
            for size in (10, 2500, 1500, 10, 2500, 1500, 2500, 1500, 2500):
                sql = f"SELECT repeat('x', {size}) AS v"
                if size < 2000:
                    assert conn.execute(sql).fetchone() == ("x" * size,)
                else:
                    with pytest.raises(psycopg.errors.ProgramLimitExceeded):
                        conn.execute(sql)
            assert conn.execute("SELECT 1").fetchone() == (1,)  # the session goes on
    finally:
        running.stop()


def test_a_stream_read_whole_gives_batches_or_rows_alike(session: Session) -> None:
    """The engine's side: a small plain query's stream offers its rows whole once the text
    is known small; read as batches instead (COPY TO, DECLARE) it gives the same table,
    and once a batch was read the rows are no longer offered."""
    session.execute("CREATE TABLE w (k INTEGER, v VARCHAR)")
    session.execute("INSERT INTO w VALUES (1, 'a'), (2, NULL)")
    (statement,) = parse_statements("SELECT k AS key, v FROM w ORDER BY k")
    tables._small_results.clear()
    seen = []
    for way in ("batches", "whole", "batches", "whole"):
        stream = session.open_stream(statement, no_rows=None)
        assert stream is not None
        try:
            if way == "whole" and stream.whole is not None:
                whole = stream.take_whole()
                assert whole is not None and stream.row_count == 2
                assert stream.next_batch() is None
                assert whole.schema.equals(stream.schema)
                seen.append((way, whole.to_arrow()))
            else:
                batch = stream.next_batch()
                assert batch is not None
                assert stream.take_whole() is None  # a batch was read: batches only
                rest = stream.next_batch()
                assert rest is None
                seen.append((way, pa.Table.from_batches([batch])))
        finally:
            stream.close()
    assert [way for way, _ in seen] == ["batches", "whole", "batches", "whole"]
    first = seen[0][1]
    assert first.column_names == ["key", "v"]
    assert all(table.equals(first) for _, table in seen), seen


def test_client_side_bound_lookups_take_the_rows_way_after_the_first(
    connect: Callable[..., psycopg.Connection], monkeypatch: pytest.MonkeyPatch
) -> None:
    """psycopg's ``ClientCursor`` sends each lookup as a text of its own (the simple
    protocol): after the first, each takes the rows' way by its shape
    (``tables._rows_way``), and every value is right."""
    taken = spy_rows_way(monkeypatch)
    tables._small_results.clear()  # no shape known from another test
    conn = connect(autocommit=True)
    conn.execute("CREATE TABLE kv (k BIGINT PRIMARY KEY, v VARCHAR NOT NULL)")
    conn.execute("INSERT INTO kv SELECT i, 'value ' || i FROM range(100) t(i)")
    cursor = psycopg.ClientCursor(conn)
    for key in (5, 17, 42, 99, 100):
        row = cursor.execute("SELECT v FROM kv WHERE k = %s", [key]).fetchone()
        assert row == (None if key == 100 else (f"value {key}",))
    assert len([sql for sql in taken if sql.startswith("SELECT v FROM kv")]) == 4


def test_results_as_rows_ask_no_description_and_uuid_json_still_go_out_as_such(
    connect: Callable[..., psycopg.Connection], described: list[str]
) -> None:
    """A small result read as ``Rows`` has only DuckDB VARCHAR string columns: the wire
    asks the engine for no description to tell UUID and JSON apart, prepared or simple;
    UUID and JSON columns (never ``Rows``) still go out as UUID and JSON."""
    import uuid

    conn = connect(autocommit=True)
    conn.execute("CREATE TABLE w (k INTEGER, v VARCHAR, u UUID, j JSON)")
    conn.execute("INSERT INTO w VALUES (1, 'x', '00000000-0000-0000-0000-000000000001', "
                 "'{\"a\": 1}')")  # fmt: skip
    for prepare in (True, False):
        conn.execute("SELECT v FROM w WHERE k = %s", [1], prepare=prepare)  # first: Arrow
        before = len(described)
        for _ in range(4):
            row = conn.execute("SELECT v FROM w WHERE k = %s", [1], prepare=prepare).fetchone()
            assert row == ("x",)
        conn.execute("INSERT INTO w VALUES (9, 'z', NULL, NULL)")  # moves the catalog
        assert conn.execute("SELECT v FROM w WHERE k = %s", [9], prepare=prepare).fetchone() \
            == ("z",)
        assert len(described) == before, prepare
        conn.execute("DELETE FROM w WHERE k = 9")
    for _ in range(3):
        value, document = conn.execute("SELECT u, j FROM w WHERE k = %s", [1],
                                       prepare=True).fetchone() or (None, None)  # fmt: skip
        assert isinstance(value, uuid.UUID) and value.int == 1
        assert document == {"a": 1}
