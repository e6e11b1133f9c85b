"""Every wire type through psycopg 3 (sync and async): parameters in text and binary,
results in text and binary, OIDs in the row description, and bad parameter input.

Each value goes into a DuckDB table column of the matching type as a bind parameter and
comes back out of a SELECT; the row description must carry PostgreSQL's OID, and the
value must read back equal (psycopg parses each type by its OID, so a wrong OID or a
wrong wire format fails the comparison or the load).
"""

from __future__ import annotations

import asyncio
import datetime
import decimal
import math
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from psycopg import errors
from psycopg.types.json import Json, Jsonb

from sql.pgwire.connection import connection as connection_module
from sql.pgwire.server import ServerThread

UTC = datetime.UTC
PLUS_TWO = datetime.timezone(datetime.timedelta(hours=2))


@dataclass(frozen=True)
class Case:
    column_type: str  # DuckDB type of the column
    oid: int  # PostgreSQL OID the result column must be described with
    value: Any  # what is bound
    expected: Any  # what must come back


CASES = {
    "bool": Case("BOOLEAN", 16, True, True),
    "int2": Case("SMALLINT", 21, -12345, -12345),
    "int4": Case("INTEGER", 23, -2_000_000_000, -2_000_000_000),
    "int8": Case("BIGINT", 20, 9_000_000_000_000_000_000, 9_000_000_000_000_000_000),
    "float4": Case("REAL", 700, 1.5, 1.5),
    "float8": Case("DOUBLE", 701, math.pi, math.pi),
    "numeric": Case(
        "DECIMAL(20, 6)",
        1700,
        decimal.Decimal("-12345678901234.123456"),
        decimal.Decimal("-12345678901234.123456"),
    ),
    "numeric_small": Case(
        "DECIMAL(9, 4)", 1700, decimal.Decimal("0.0001"), decimal.Decimal("0.0001")
    ),
    "text": Case("VARCHAR", 25, 'héllo "wörld"\n\t\\', 'héllo "wörld"\n\t\\'),
    "bytea": Case("BLOB", 17, b"\x00\xff\x01bin\\", b"\x00\xff\x01bin\\"),
    "date": Case("DATE", 1082, datetime.date(2024, 2, 29), datetime.date(2024, 2, 29)),
    "timestamp": Case(
        "TIMESTAMP",
        1114,
        datetime.datetime(2024, 2, 29, 12, 34, 56, 789012),
        datetime.datetime(2024, 2, 29, 12, 34, 56, 789012),
    ),
    "timestamptz": Case(
        "TIMESTAMPTZ",
        1184,
        datetime.datetime(2024, 2, 29, 12, 34, 56, 789012, tzinfo=PLUS_TWO),
        datetime.datetime(2024, 2, 29, 10, 34, 56, 789012, tzinfo=UTC),
    ),
    "interval": Case(
        "INTERVAL",
        1186,
        datetime.timedelta(days=3, seconds=3723, microseconds=500000),
        datetime.timedelta(days=3, seconds=3723, microseconds=500000),
    ),
    "negative_interval": Case(
        "INTERVAL",
        1186,
        datetime.timedelta(days=-2, seconds=5),
        datetime.timedelta(days=-2, seconds=5),
    ),
    "uuid": Case(
        "UUID",
        2950,
        uuid.UUID("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"),
        uuid.UUID("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"),
    ),
    "json": Case(
        "JSON", 114, Json({"a": [1, 2.5, None], "b": "ü"}), {"a": [1, 2.5, None], "b": "ü"}
    ),
    "jsonb": Case("JSON", 114, Jsonb({"k": {"n": True}}), {"k": {"n": True}}),
}


def _check_round_trip(conn: psycopg.Connection, case: Case, v: str = "v") -> None:
    conn.execute(f"CREATE TABLE {v} (id INTEGER, x {case.column_type})")
    conn.execute(f"INSERT INTO {v} VALUES (1, %t)", [case.value])  # text parameter
    conn.execute(f"INSERT INTO {v} VALUES (2, %b)", [case.value])  # binary parameter
    conn.execute(f"INSERT INTO {v} VALUES (3, %s)", [None])
    for binary in (False, True):
        cur = conn.cursor(binary=binary)
        rows = cur.execute(f"SELECT x FROM {v} WHERE id >= %s ORDER BY id", [0]).fetchall()
        assert cur.description is not None
        assert cur.description[0].type_code == case.oid, (binary, cur.description[0])
        assert rows == [(case.expected,), (case.expected,), (None,)], binary
        # The value also works as a parameter in a comparison, in both formats.
        for marker in ("%t", "%b"):
            found = cur.execute(f"SELECT id FROM {v} WHERE x = {marker} ORDER BY id",
                                [case.value])
            assert found.fetchall() == [(1,), (2,)], (binary, marker)


async def _check_round_trip_async(conn: psycopg.AsyncConnection, case: Case, v: str) -> None:
    await conn.execute(f"CREATE TABLE {v} (id INTEGER, x {case.column_type})")
    await conn.execute(f"INSERT INTO {v} VALUES (1, %t)", [case.value])
    await conn.execute(f"INSERT INTO {v} VALUES (2, %b)", [case.value])
    for binary in (False, True):
        cur = conn.cursor(binary=binary)
        await cur.execute(f"SELECT x FROM {v} WHERE id >= %s ORDER BY id", [0])
        assert cur.description is not None
        assert cur.description[0].type_code == case.oid
        assert await cur.fetchall() == [(case.expected,), (case.expected,)]


@pytest.fixture(scope="module")
def types_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    """One server for the round trips and the bad inputs below (~100 cases): each round
    trip writes a table of its own (``v_<type>_<way>``: its texts are its own too, so no
    case finds another's statements described or kept), each case its own connection."""
    running = ServerThread(str(tmp_path_factory.mktemp("types") / "data"), "127.0.0.1", 0)
    yield running
    running.stop()


def _connect_to(server: ServerThread) -> psycopg.Connection:
    return psycopg.connect(host="127.0.0.1", port=server.port, user="tester",
                           dbname="topicbase", connect_timeout=10, autocommit=True)  # fmt: skip


@pytest.mark.parametrize("inline", [True, False], ids=["inline", "data_rows"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_round_trip_sync(types_server: ServerThread, name: str, inline: bool,
                         monkeypatch) -> None:  # fmt: skip
    """Small results are encoded value by value on the event loop, larger ones by
    ``row_encoding.DataRows``: every type goes through both (``INLINE_VALUES = 0``)."""
    if not inline:
        monkeypatch.setattr(connection_module, "INLINE_VALUES", 0)
    with _connect_to(types_server) as conn:
        _check_round_trip(conn, CASES[name], f"v_{name}_{'inline' if inline else 'rows'}")


@pytest.mark.parametrize("name", sorted(CASES))
def test_round_trip_async(types_server: ServerThread, name: str) -> None:
    async def run() -> None:
        conn = await psycopg.AsyncConnection.connect(
            host="127.0.0.1", port=types_server.port, user="tester", dbname="topicbase",
            autocommit=True,
        )  # fmt: skip
        async with conn:
            await _check_round_trip_async(conn, CASES[name], f"v_{name}_async")

    asyncio.run(run())


def test_results_of_expressions_in_both_formats(connect) -> None:
    """Values computed by DuckDB (not stored), including the special floats and numerics."""
    conn = connect(autocommit=True)
    query = (
        "SELECT 'NaN'::DOUBLE a, 'Infinity'::DOUBLE b, '-Infinity'::REAL c, "
        "0::DECIMAL(10, 3) d, -0.5::DECIMAL(4, 2) e, 123456789012345678::HUGEINT f, "
        "INTERVAL 14 MONTH + INTERVAL 3 DAY + INTERVAL 5 SECOND g, "
        "TIME '12:34:56.5' h, NULL::UUID i"
    )
    for binary in (False, True):
        row = conn.cursor(binary=binary).execute(query).fetchone()
        assert row is not None
        assert math.isnan(row[0]) and row[1] == math.inf and row[2] == -math.inf
        assert row[3] == decimal.Decimal("0.000") and row[4] == decimal.Decimal("-0.50")
        assert row[5] == 123456789012345678
        # 14 months on the wire; psycopg reads a year as 365 days and a month as 30
        assert row[6] == datetime.timedelta(days=365 + 2 * 30 + 3, seconds=5)
        assert row[7] == datetime.time(12, 34, 56, 500000)
        assert row[8] is None
    text = conn.pgconn.exec_(b"SELECT INTERVAL 14 MONTH - INTERVAL 3 DAY + INTERVAL 90 MINUTE")
    assert text.get_value(0, 0) == b"1 year 2 mons -3 days +01:30:00"


def test_topic_data_is_bytea(connect) -> None:
    conn = connect(autocommit=True)
    conn.execute("CREATE TOPIC events (CONSUMER c)")
    conn.execute("INSERT INTO TOPIC events (data, seq_no, producer_id) VALUES (%b, %s, %s)",
                 [b"\x00\x01\xfe", 1, "p"])  # fmt: skip
    for binary in (False, True):
        cur = conn.cursor(binary=binary)
        cur.execute("SELECT data, seq_no, producer_id, written_at FROM TOPIC events")
        assert [d.type_code for d in cur.description or ()] == [17, 20, 25, 1184]
        data, seq_no, producer, written = cur.fetchone() or ()
        assert (data, seq_no, producer) == (b"\x00\x01\xfe", 1, "p")
        assert written.tzinfo is not None


@pytest.mark.parametrize(
    ("value", "oid", "fmt", "sqlstate"),
    [
        (b"abc", 23, 0, "22P02"),  # not an integer
        (b"99999", 21, 0, "22003"),  # out of int2's range
        (b"maybe", 16, 0, "22P02"),
        (b"2024-13-01", 1082, 0, "22007"),
        (b"1.2.3", 1700, 0, "22P02"),
        (b"not-a-uuid", 2950, 0, "22P02"),
        (b"{", 114, 0, "22P02"),
        (b"3 fortnights", 1186, 0, "22P02"),
        (b"\x00\x01\x02", 23, 1, "22P03"),  # three bytes for an int4
        (b"\x00\x01", 2950, 1, "22P03"),
        (b"\x00\x01\x00\x00\x50\x00\x00\x00\x00\x01", 1700, 1, "22P03"),  # bad numeric sign
        (b"\x02{}", 3802, 1, "22P03"),  # unknown jsonb version
    ],
)
def test_bad_parameter_input_gets_sqlstate(types_server: ServerThread, value: bytes, oid: int,
                                           fmt: int, sqlstate: str) -> None:  # fmt: skip
    with _connect_to(types_server) as conn:
        result = conn.pgconn.exec_params(b"SELECT $1 IS NULL", [value], [oid], [fmt])
        assert result.status == psycopg.pq.ExecStatus.FATAL_ERROR
        assert result.error_field(psycopg.pq.DiagnosticField.SQLSTATE) == sqlstate.encode()
        # The connection carries on.
        assert conn.execute("SELECT %s::INTEGER + 1", [41]).fetchone() == (42,)


def test_bad_text_for_an_untyped_parameter_is_22p02(connect) -> None:
    conn = connect(autocommit=True)
    conn.execute("CREATE TABLE n (x INTEGER)")
    with pytest.raises(errors.InvalidTextRepresentation):
        conn.execute("INSERT INTO n VALUES (%s)", ["twelve"])
    conn.execute("INSERT INTO n VALUES (%s)", ["12"])
    assert conn.execute("SELECT x FROM n").fetchall() == [(12,)]


def test_text_parameter_forms(connect) -> None:
    """Text forms PostgreSQL accepts, sent with explicit OIDs through libpq."""
    conn = connect(autocommit=True)
    forms = [
        (b"yes", 16, b"t"),
        (b"\\001\\\\x", 17, b"\\x015c78"),  # bytea escape format
        (b"2024-01-02 03:04:05+05:30", 1184, b"2024-01-01 21:34:05+00"),
        (b"2024-01-02T03:04:05Z", 1184, b"2024-01-02 03:04:05+00"),
        (b"P1DT2H", 1186, b"1 day 02:00:00"),
        (b"1 day 02:00:00", 1186, b"1 day 02:00:00"),
        (b"Infinity", 701, b"Infinity"),
        (b"  42 ", 23, b"42"),
    ]
    for text, oid, shown in forms:
        result = conn.pgconn.exec_params(b"SELECT $1", [text], [oid], [0])
        assert result.status == psycopg.pq.ExecStatus.TUPLES_OK, result.error_message
        assert result.ftype(0) == oid
        assert result.get_value(0, 0) == shown, text
    ago = conn.pgconn.exec_params(b"SELECT $1 = INTERVAL '-2 hours'", [b"2 hours ago"], [1186], [0])
    assert ago.get_value(0, 0) == b"t"


def test_oids_follow_a_changed_column_type(connect) -> None:
    """UUID and JSON are Arrow strings: the OID comes from a description of the statement,
    which must not outlive the table it described."""
    conn = connect(autocommit=True)
    query = "SELECT x FROM m WHERE 1 = %s"
    conn.execute("CREATE TABLE m (x UUID)")
    conn.execute("INSERT INTO m VALUES (%s)", [uuid.UUID(int=7)])
    cur = conn.execute(query, [1])
    assert cur.description is not None and cur.description[0].type_code == 2950
    assert cur.fetchall() == [(uuid.UUID(int=7),)]
    conn.execute("DROP TABLE m")
    conn.execute("CREATE TABLE m (x VARCHAR)")
    conn.execute("INSERT INTO m VALUES ('plain text')")
    cur = conn.execute(query, [1])
    assert cur.description is not None and cur.description[0].type_code == 25
    assert cur.fetchall() == [("plain text",)]


def test_server_side_prepared_statements_keep_their_types(connect) -> None:
    conn = connect(autocommit=True)
    conn.execute("CREATE TABLE docs (id UUID, body JSON, n DECIMAL(6, 2))")
    key = uuid.UUID(int=42)
    conn.execute("INSERT INTO docs VALUES (%s, %s, %s)", [key, Json({"x": 1}), 1.25],
                 prepare=True)  # fmt: skip
    for binary in (False, True, False):
        cur = conn.cursor(binary=binary)
        cur.execute("SELECT id, body, n FROM docs WHERE id = %s", [key], prepare=True)
        assert [d.type_code for d in cur.description or ()] == [2950, 114, 1700]
        assert cur.fetchall() == [(key, {"x": 1}, decimal.Decimal("1.25"))]


def test_simple_query_results_describe_uuid_and_json(connect) -> None:
    """psycopg's ClientCursor sends the simple protocol: its RowDescription too names
    uuid and json (DuckDB hands both over as Arrow strings)."""
    conn = connect(autocommit=True)
    conn.execute("CREATE TABLE docs (id UUID, body JSON, note VARCHAR)")
    key = uuid.UUID("12345678-1234-5678-1234-567812345678")
    conn.execute("INSERT INTO docs VALUES (%s, %s, 'plain')", [key, Json({"a": [1, 2]})])
    with psycopg.ClientCursor(conn) as cursor:
        cursor.execute("SELECT id, body, note FROM docs")
        assert cursor.description is not None
        oids = [column.type_code for column in cursor.description]
        assert oids == [2950, 114, 25]
        assert cursor.fetchall() == [(key, {"a": [1, 2]}, "plain")]
