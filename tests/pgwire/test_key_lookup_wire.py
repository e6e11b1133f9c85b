"""Key lookups through the wire (``engine.key_lookup``): the same bytes as DuckDB's way
for every type, in text and binary, and a COPY into the table seen by the next lookup."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import psycopg
import pytest

from engine import key_lookup
from tests.key_lookup_spy import served_lookups

WIDE = (
    "CREATE TABLE wide (k BIGINT PRIMARY KEY, b BOOLEAN, i2 SMALLINT, u4 UINTEGER, "
    "f FLOAT, d DOUBLE, dec DECIMAL(18,3), s VARCHAR, bl BLOB, dt DATE, ts TIMESTAMP, "
    "tz TIMESTAMPTZ, iv INTERVAL, u UUID, j JSON, li INTEGER[], hi HUGEINT)"
)
ROWS = [
    "(1, true, -3, 4000000000, 'nan', '-0.0', -12.5, 'é✓', '\\x00\\xFF'::BLOB, '0001-01-01', "
    "'2024-01-01 01:02:03.456789', '2024-01-01 01:02:03+05', INTERVAL 3 DAY, "
    "'8d2f4b1e-0000-4000-8000-000000000001', '{\"a\": 1}', [1, NULL], 170141183460469231)",
    "(2, NULL, NULL, NULL, NULL, 'inf', NULL, '', ''::BLOB, '2024-02-29', '1970-01-01', NULL, "
    "NULL, NULL, NULL, [], NULL)",
]


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Lookups the key path answered (a spy), with an index built after one lookup."""
    return served_lookups(monkeypatch)


def _wide(connect: Callable[..., psycopg.Connection]) -> psycopg.Connection:
    """An autocommit connection to a database holding ``wide`` with ``ROWS``."""
    connection = connect(autocommit=True)
    connection.execute(WIDE)
    connection.execute(f"INSERT INTO wide VALUES {', '.join(ROWS)}")
    return connection


def _twice_the_duckdb_way(monkeypatch: pytest.MonkeyPatch, read: Callable[[], Any]) -> list[Any]:
    """``read`` run twice with the key path off (``TOPICBASE_KEY_INDEX_BYTES=0``), then
    the path turned back on."""
    monkeypatch.setenv(key_lookup.BYTES_VARIABLE, "0")
    answers = [read() for _ in range(2)]
    monkeypatch.delenv(key_lookup.BYTES_VARIABLE)
    return answers


def _raw(
    connection: psycopg.Connection, sql: str, key: Any, binary: bool | None
) -> tuple[Any, ...]:
    """Names, type OIDs, modifiers, formats and the raw bytes of every value; ``binary``
    None: the key bound on the client's side, a simple Query (psycopg's ClientCursor)."""
    if binary is None:
        cursor: Any = psycopg.ClientCursor(connection)
        cursor.execute(sql, [key])
    else:
        cursor = connection.cursor(binary=binary)
        cursor.execute(sql, [key], prepare=True)
    result = cursor.pgresult
    assert result is not None
    columns = tuple(
        (result.fname(i), result.ftype(i), result.fmod(i), result.fformat(i))
        for i in range(result.nfields)
    )
    values = tuple(
        tuple(result.get_value(row, i) for i in range(result.nfields))
        for row in range(result.ntuples)
    )
    return result.command_status, columns, values


def test_the_wire_sends_the_same_bytes_both_ways(
    connect: Callable[..., psycopg.Connection],
    served: list[int],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    connection = _wide(connect)
    queries = [
        "SELECT * FROM wide WHERE k = %s",
        "SELECT s, f, d, bl, b FROM wide WHERE k = %s",
        "SELECT dec AS money, tz, u, j, li FROM wide WHERE k = %s",
    ]
    for sql in queries:
        for binary in (False, True, None):
            for key in (1, 2, 3):
                duckdb_way = _twice_the_duckdb_way(
                    monkeypatch, partial(_raw, connection, sql, key, binary)
                )
                before = len(served)
                index_way = [_raw(connection, sql, key, binary) for _ in range(2)]
                assert index_way == duckdb_way, (sql, binary, key)
                assert len(served) > before


def test_a_copy_into_the_table_is_seen_by_the_next_lookup(
    connect: Callable[..., psycopg.Connection], served: list[int]
) -> None:
    reader = connect(autocommit=True)
    writer = connect(autocommit=True)
    reader.execute("CREATE TABLE kv (k BIGINT PRIMARY KEY, v VARCHAR)")
    reader.execute("INSERT INTO kv VALUES (1, 'one')")
    lookup = "SELECT v FROM kv WHERE k = %s"
    assert reader.execute(lookup, [1]).fetchall() == [("one",)]
    assert reader.execute(lookup, [2]).fetchall() == []
    assert served
    with writer.cursor().copy("COPY kv FROM STDIN") as copy:
        copy.write_row((2, "two"))
    served.clear()
    assert reader.execute(lookup, [2]).fetchall() == [("two",)]
    assert reader.execute(lookup, [2]).fetchall() == [("two",)]
    assert served


def test_copy_and_cursors_over_a_lookup_read_the_same_batches(
    connect: Callable[..., psycopg.Connection],
    served: list[int],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    connection = _wide(connect)

    def read() -> tuple[Any, ...]:
        copied = []
        for query in ("SELECT * FROM wide WHERE k = 1", "SELECT s, f FROM wide WHERE k = 2"):
            with connection.cursor().copy(f"COPY ({query}) TO STDOUT") as copy:
                copied.append(b"".join(bytes(chunk) for chunk in copy))
        with connection.transaction(), connection.cursor(name="c") as named:
            named.execute("SELECT s, d FROM wide WHERE k = 1")
            fetched = named.fetchall()
        return tuple(copied), fetched

    duckdb_way = _twice_the_duckdb_way(monkeypatch, read)
    before = len(served)
    assert [read() for _ in range(2)] == duckdb_way
    assert len(served) > before
