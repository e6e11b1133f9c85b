"""pg8000 (``pg8000.native`` and the DB-API ``pg8000.dbapi``) against ``sql.pgwire``.

pg8000 sends Parse + Sync, then Describe Statement + Sync, then Bind with *text*
parameters + Execute + Sync, and decodes the text results by the OIDs of the statement's
description: without a real description (parameter count and result columns before
any Bind) it cannot run a parameterised statement at all.
"""

from __future__ import annotations

import datetime
import decimal
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pg8000.dbapi
import pg8000.native
import pytest

from sql.pgwire.server import ServerThread

UTC = datetime.UTC


@pytest.fixture
def native(server: ServerThread) -> Iterator[Callable[[], pg8000.native.Connection]]:
    opened: list[pg8000.native.Connection] = []

    def open_connection() -> pg8000.native.Connection:
        conn = pg8000.native.Connection("tester", host="127.0.0.1", port=server.port,
                                        database="topicbase", timeout=10)  # fmt: skip
        opened.append(conn)
        return conn

    yield open_connection
    for conn in opened:
        conn.close()


@pytest.fixture
def dbapi(server: ServerThread) -> Iterator[pg8000.dbapi.Connection]:
    conn = pg8000.dbapi.connect("tester", host="127.0.0.1", port=server.port,
                                database="topicbase", timeout=10)  # fmt: skip
    yield conn
    conn.close()


def test_native_parameters_and_columns(native) -> None:
    conn = native()
    conn.run("CREATE TABLE people (id INTEGER PRIMARY KEY, name VARCHAR, score DOUBLE)")
    conn.run("INSERT INTO people VALUES (:id, :name, :score)", id=1, name="ann", score=2.5)
    conn.run("INSERT INTO people VALUES (:id, :name, :score)", id=2, name="bob", score=None)
    assert conn.row_count == 1
    rows = conn.run("SELECT id, name, score FROM people WHERE id >= :low ORDER BY id", low=1)
    assert rows == [[1, "ann", 2.5], [2, "bob", None]]
    assert [(c["name"], c["type_oid"]) for c in conn.columns] == [
        ("id", 23), ("name", 25), ("score", 701)
    ]  # fmt: skip
    assert conn.run("SELECT :x::INTEGER + 1 AS y", x=41) == [[42]]
    assert conn.run("SELECT count(*) FROM people WHERE name = :n", n="zed") == [[0]]


VALUES: list[tuple[str, Any, int]] = [
    ("BOOLEAN", True, 16),
    ("SMALLINT", 300, 21),
    ("INTEGER", -7, 23),
    ("BIGINT", 2**62, 20),
    ("DOUBLE", 0.1, 701),
    ("DECIMAL(12, 3)", decimal.Decimal("-1234.500"), 1700),
    ("VARCHAR", "tab\there, 'quote' and ✓", 25),
    ("BLOB", b"\x00\x01binary\xff", 17),
    ("DATE", datetime.date(2024, 12, 31), 1082),
    ("TIMESTAMP", datetime.datetime(2024, 12, 31, 23, 59, 59, 123456), 1114),
    ("TIMESTAMPTZ", datetime.datetime(2024, 12, 31, 23, 59, 59, 123456, tzinfo=UTC), 1184),
    ("INTERVAL", datetime.timedelta(days=2, hours=3, minutes=4, seconds=5), 1186),
    ("UUID", uuid.UUID("0d1f7f3c-35a6-4d2e-9d80-3f3c0f1b2a99"), 2950),
]


@pytest.fixture(scope="module")
def types_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    """One server for the type round trips: each case writes a table of its own
    (``v_<number>``, so its texts are its own too: no case finds another's statements
    described or kept) on a connection of its own."""
    running = ServerThread(str(tmp_path_factory.mktemp("pg8000") / "data"), "127.0.0.1", 0)
    yield running
    running.stop()


@pytest.mark.parametrize(("column_type", "value", "oid"), VALUES, ids=[v[0] for v in VALUES])
def test_native_every_type_round_trips(
    types_server: ServerThread, column_type: str, value: Any, oid: int
) -> None:
    v = f"v_{[t for t, _, _ in VALUES].index(column_type)}"
    conn = pg8000.native.Connection("tester", host="127.0.0.1", port=types_server.port,
                                    database="topicbase", timeout=10)  # fmt: skip
    try:
        conn.run(f"CREATE TABLE {v} (id INTEGER, x {column_type})")
        conn.run(f"INSERT INTO {v} VALUES (1, :x)", x=value)
        conn.run(f"INSERT INTO {v} VALUES (2, :x)", x=None)
        assert conn.run(f"SELECT x FROM {v} WHERE id = :id", id=1) == [[value]]
        assert conn.columns[0]["type_oid"] == oid
        assert conn.run(f"SELECT x FROM {v} WHERE id = :id", id=2) == [[None]]
        assert conn.run(f"SELECT id FROM {v} WHERE x = :x", x=value) == [[1]]
    finally:
        conn.close()


def test_native_json_result_is_parsed(native) -> None:
    conn = native()
    conn.run("CREATE TABLE docs (body JSON)")
    conn.run("INSERT INTO docs VALUES (:b)", b='{"a": [1, 2], "b": null}')
    assert conn.run("SELECT body FROM docs WHERE :t", t=True) == [[{"a": [1, 2], "b": None}]]
    assert conn.columns[0]["type_oid"] == 114


def test_native_prepared_statement(native) -> None:
    conn = native()
    conn.run("CREATE TABLE kv (k VARCHAR, v BIGINT)")
    insert = conn.prepare("INSERT INTO kv VALUES (:k, :v)")
    for n in range(5):
        insert.run(k=f"key{n}", v=n * n)
    insert.close()
    select = conn.prepare("SELECT k, v FROM kv WHERE v >= :low ORDER BY v")
    assert select.run(low=9) == [["key3", 9], ["key4", 16]]
    assert select.run(low=100) == []
    assert [c["name"] for c in select.columns] == ["k", "v"]
    select.close()


def test_native_topic_insert_and_read(native) -> None:
    conn = native()
    conn.run("CREATE TOPIC events (CONSUMER c)")
    returned = conn.run(
        'INSERT INTO TOPIC events (data, producer_id, seq_no) VALUES (:d, :p, :s) '
        'RETURNING "offset", status', d=b"\x00one", p="w1", s=1,
    )  # fmt: skip
    assert returned == [[0, "written"]]
    duplicate = conn.run('INSERT INTO TOPIC events (data, producer_id, seq_no) '
                         'VALUES (:d, :p, :s) RETURNING status', d=b"x", p="w1", s=1)  # fmt: skip
    assert duplicate == [["duplicate"]]
    conn.run("INSERT INTO TOPIC events (data) VALUES (:d)", d="text becomes bytes")
    rows = conn.run("SELECT \"offset\", data FROM TOPIC events WITH (consumer = 'c', "
                    "max_messages = :n)", n=10)  # fmt: skip
    assert rows == [[0, b"\x00one"], [1, b"text becomes bytes"]]
    assert conn.columns[1]["type_oid"] == 17


def test_native_transactions(native) -> None:
    conn, other = native(), native()
    conn.run("CREATE TABLE t (n INTEGER)")
    conn.run("CREATE TOPIC q (CONSUMER c)")
    conn.run("BEGIN")
    conn.run("INSERT INTO t VALUES (:n)", n=1)
    conn.run("INSERT INTO TOPIC q (data) VALUES (:d)", d=b"in-txn")
    assert other.run("SELECT count(*) FROM TOPIC q WITH (from_offset = :o)", o=0) == [[0]]
    conn.run("COMMIT")
    assert other.run("SELECT count(*) FROM TOPIC q WITH (from_offset = :o)", o=0) == [[1]]
    conn.run("BEGIN")
    conn.run("INSERT INTO t VALUES (:n)", n=2)
    conn.run("ROLLBACK")
    assert other.run("SELECT n FROM t") == [[1]]


def test_native_errors_carry_sqlstates(native) -> None:
    conn = native()
    conn.run("CREATE TABLE u (id INTEGER PRIMARY KEY)")
    cases = [
        ("SELECT * FROM missing WHERE id = :i", {"i": 1}, "42P01"),
        ("SELEC :i", {"i": 1}, "42601"),
        ("INSERT INTO u VALUES (:i)", {"i": "abc"}, "22P02"),  # described int4; text "abc"
        ("INSERT INTO u VALUES (:i)", {"i": 2**40}, "22003"),
        ("SELECT nope FROM u WHERE id = :i", {"i": 1}, "42703"),
    ]
    for sql, params, sqlstate in cases:
        with pytest.raises(pg8000.native.DatabaseError) as raised:
            conn.run(sql, **params)
        assert raised.value.args[0]["C"] == sqlstate, (sql, raised.value.args[0])
        assert conn.run("SELECT :x::INTEGER", x=7) == [[7]]  # the connection carries on
    conn.run("INSERT INTO u VALUES (:i)", i=1)
    conn.run("BEGIN")
    with pytest.raises(pg8000.native.DatabaseError) as raised:
        conn.run("INSERT INTO u VALUES (:i)", i=1)
    assert raised.value.args[0]["C"] == "23505"
    with pytest.raises(pg8000.native.DatabaseError) as raised:
        conn.run("SELECT id FROM u WHERE id = :i", i=1)
    assert raised.value.args[0]["C"] == "25P02"
    conn.run("ROLLBACK")
    assert conn.run("SELECT id FROM u WHERE id = :i", i=1) == [[1]]


def test_dbapi_cursor_executemany_and_transactions(dbapi) -> None:
    cur = dbapi.cursor()
    cur.execute("CREATE TABLE orders (id INTEGER, amount DECIMAL(8, 2), placed DATE)")
    dbapi.commit()
    cur.executemany(
        "INSERT INTO orders VALUES (%s, %s, %s)",
        [(n, decimal.Decimal(n) / 4, datetime.date(2024, 1, n + 1)) for n in range(10)],
    )
    dbapi.commit()
    cur.execute("SELECT id, amount, placed FROM orders WHERE amount > %s ORDER BY id",
                (decimal.Decimal("1.5"),))  # fmt: skip
    rows = cur.fetchall()
    assert [tuple(r) for r in rows] == [
        (n, decimal.Decimal(n) / 4, datetime.date(2024, 1, n + 1)) for n in range(7, 10)
    ]
    assert [d[0] for d in cur.description] == ["id", "amount", "placed"]
    assert [d[1] for d in cur.description] == [23, 1700, 1082]
    cur.execute("INSERT INTO orders VALUES (%s, %s, %s)", (99, None, None))
    dbapi.rollback()
    cur.execute("SELECT count(*) FROM orders WHERE id = %s", (99,))
    assert cur.fetchone() == [0]
    dbapi.commit()


def test_dbapi_topic_round_trip_and_error(dbapi) -> None:
    dbapi.autocommit = True
    cur = dbapi.cursor()
    cur.execute("CREATE TOPIC logs (CONSUMER c)")
    cur.executemany("INSERT INTO TOPIC logs (data, message_group_id) VALUES (%s, %s)",
                    [(f"line {n}".encode(), "g") for n in range(5)])  # fmt: skip
    cur.execute("SELECT data FROM TOPIC logs WITH (consumer = 'c', max_messages = %s)", (3,))
    assert [r[0] for r in cur.fetchall()] == [b"line 0", b"line 1", b"line 2"]
    with pytest.raises(pg8000.dbapi.DatabaseError) as raised:
        cur.execute("SELECT data FROM TOPIC logs WITH (consumer = 'nobody') WHERE 1 = %s", (1,))
    assert raised.value.args[0]["C"] == "42704"
    cur.execute("SELECT data FROM TOPIC logs WITH (consumer = 'c')")
    assert [r[0] for r in cur.fetchall()] == [b"line 3", b"line 4"]
