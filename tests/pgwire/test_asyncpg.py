"""asyncpg against ``sql.pgwire``.

asyncpg prepares every statement with parameters: Parse with no parameter types,
Describe Statement, then Bind with *binary* parameters encoded by the types the server
described, and decodes binary results by the described row. So every test here checks
the server's statement description (inferred parameter types, result columns) as well.
"""

from __future__ import annotations

import asyncio
import datetime
import decimal
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import asyncpg
import pytest

from sql.pgwire.server import ServerThread

UTC = datetime.UTC


def run(server: ServerThread, body: Callable[[asyncpg.Connection], Awaitable[None]]) -> None:
    """Run ``body`` with a fresh asyncpg connection to ``server``, closed afterwards."""

    async def main() -> None:
        conn = await asyncpg.connect(
            host="127.0.0.1", port=server.port, user="tester", database="topicbase", timeout=10
        )
        try:
            await body(conn)
        finally:
            await conn.close()

    asyncio.run(main())


async def connect(server: ServerThread) -> asyncpg.Connection:
    return await asyncpg.connect(
        host="127.0.0.1", port=server.port, user="tester", database="topicbase", timeout=10
    )


def test_connect_and_fetch_with_parameters(server) -> None:
    async def body(conn: asyncpg.Connection) -> None:
        assert conn.get_server_version().major == 15
        await conn.execute(
            "CREATE TABLE people (id INTEGER PRIMARY KEY, name VARCHAR, age SMALLINT)"
        )
        status = await conn.execute("INSERT INTO people VALUES ($1, $2, $3)", 1, "ann", 31)
        assert status == "INSERT 0 1"
        await conn.execute("INSERT INTO people VALUES ($1, $2, $3)", 2, "bob", None)
        rows = await conn.fetch("SELECT id, name, age FROM people WHERE id >= $1 ORDER BY id", 1)
        assert [tuple(r) for r in rows] == [(1, "ann", 31), (2, "bob", None)]
        assert rows[0]["name"] == "ann"
        row = await conn.fetchrow("SELECT name, age + $1 AS older FROM people WHERE name = $2",
                                  10, "ann")  # fmt: skip
        assert dict(row) == {"name": "ann", "older": 41}
        assert await conn.fetchval("SELECT count(*) FROM people WHERE name LIKE $1", "b%") == 1
        assert await conn.fetchval("SELECT $1::INTEGER * 2", 21) == 42
        assert await conn.fetchval("SELECT $1", "untyped is text") == "untyped is text"
        assert await conn.fetch("SELECT id FROM people WHERE id = $1", 99) == []

    run(server, body)


VALUES: list[tuple[str, Any]] = [
    ("BOOLEAN", False),
    ("SMALLINT", -32768),
    ("INTEGER", 2_147_483_647),
    ("BIGINT", -9_223_372_036_854_775_808),
    ("REAL", -0.25),
    ("DOUBLE", 1e300),
    ("DECIMAL(18, 4)", decimal.Decimal("-98765432101234.5678")),
    ("DECIMAL(38, 10)", decimal.Decimal("0.0000000001")),
    ("VARCHAR", "ünïcode ✓ 'quoted'"),
    ("BLOB", bytes(range(256))),
    ("DATE", datetime.date(1999, 12, 31)),
    ("TIMESTAMP", datetime.datetime(1970, 1, 1, 0, 0, 0, 1)),
    ("TIMESTAMPTZ", datetime.datetime(2030, 6, 15, 23, 59, 59, 999999, tzinfo=UTC)),
    ("INTERVAL", datetime.timedelta(days=400, hours=5, microseconds=7)),
    ("UUID", uuid.UUID("12345678-1234-5678-1234-567812345678")),
    ("JSON", '{"nested": {"list": [1, "two", null]}}'),
]


@pytest.fixture(scope="module")
def types_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    """One server for the type round trips: each case writes a table of its own
    (``v_<number>``, so its texts are its own too: no case finds another's statements
    described or kept) on a connection of its own."""
    running = ServerThread(str(tmp_path_factory.mktemp("asyncpg") / "data"), "127.0.0.1", 0)
    yield running
    running.stop()


@pytest.mark.parametrize(("column_type", "value"), VALUES, ids=[v[0] for v in VALUES])
def test_every_type_round_trips_in_binary(
    types_server: ServerThread, column_type: str, value: Any
) -> None:
    v = f"v_{[t for t, _ in VALUES].index(column_type)}"

    async def body(conn: asyncpg.Connection) -> None:
        await conn.execute(f"CREATE TABLE {v} (id INTEGER, x {column_type})")
        await conn.execute(f"INSERT INTO {v} VALUES ($1, $2)", 1, value)
        await conn.execute(f"INSERT INTO {v} VALUES ($1, $2)", 2, None)
        assert await conn.fetchval(f"SELECT x FROM {v} WHERE id = $1", 1) == value
        assert await conn.fetchval(f"SELECT x FROM {v} WHERE id = $1", 2) is None
        assert await conn.fetchval(f"SELECT id FROM {v} WHERE x = $1", value) == 1

    run(types_server, body)


def test_prepared_statement_describes_parameters_and_columns(server) -> None:
    async def body(conn: asyncpg.Connection) -> None:
        await conn.execute(
            "CREATE TABLE items (id BIGINT, label VARCHAR, price DECIMAL(10, 2), added TIMESTAMPTZ)"
        )
        insert = await conn.prepare("INSERT INTO items VALUES ($1, $2, $3, $4)")
        assert [t.name for t in insert.get_parameters()] == ["int8", "text", "numeric",
                                                             "timestamptz"]  # fmt: skip
        assert insert.get_attributes() == ()
        moment = datetime.datetime(2025, 1, 1, 12, tzinfo=UTC)
        for n in range(3):
            await insert.fetch(n, f"item {n}", decimal.Decimal(n) + decimal.Decimal("0.99"), moment)
        select = await conn.prepare(
            "SELECT id, label, price * $1 AS total FROM items "
            "WHERE id BETWEEN $2 AND $3 ORDER BY id"
        )
        assert [t.name for t in select.get_parameters()] == ["numeric", "int8", "int8"]
        assert [(a.name, a.type.name) for a in select.get_attributes()] == [
            ("id", "int8"), ("label", "text"), ("total", "numeric")
        ]  # fmt: skip
        assert [tuple(r) for r in await select.fetch(decimal.Decimal(2), 1, 2)] == [
            (1, "item 1", decimal.Decimal("3.98")), (2, "item 2", decimal.Decimal("5.98"))
        ]  # fmt: skip
        assert await select.fetchval(decimal.Decimal(1), 0, 0, column=2) == decimal.Decimal("0.99")
        # A named prepared statement is reused across executions.
        assert len(await select.fetch(decimal.Decimal(1), 0, 10)) == 3

    run(server, body)


def test_transactions_commit_and_roll_back(server) -> None:
    async def body(conn: asyncpg.Connection) -> None:
        await conn.execute("CREATE TABLE ledger (n INTEGER)")
        await conn.execute("CREATE TOPIC audit (CONSUMER reader)")
        async with conn.transaction():
            await conn.execute("INSERT INTO ledger VALUES ($1)", 1)
            await conn.execute("INSERT INTO TOPIC audit (data) VALUES ($1)", b"one")
            assert conn.is_in_transaction()
        with pytest.raises(RuntimeError):
            async with conn.transaction():
                await conn.execute("INSERT INTO ledger VALUES ($1)", 2)
                await conn.execute("INSERT INTO TOPIC audit (data) VALUES ($1)", b"two")
                raise RuntimeError("roll back")
        assert not conn.is_in_transaction()
        assert [r["n"] for r in await conn.fetch("SELECT n FROM ledger")] == [1]
        data = await conn.fetch("SELECT data FROM TOPIC audit WITH (consumer = 'reader')")
        assert [r["data"] for r in data] == [b"one"]

    run(server, body)


def test_topic_writes_are_invisible_until_commit(server) -> None:
    async def main() -> None:
        writer, reader = await connect(server), await connect(server)
        try:
            await writer.execute("CREATE TOPIC t (CONSUMER c)")
            transaction = writer.transaction()
            await transaction.start()
            await writer.execute("INSERT INTO TOPIC t (data) VALUES ($1)", b"pending")
            peek = "SELECT count(*) FROM TOPIC t WITH (from_offset = $1)"
            assert await reader.fetchval(peek, 0) == 0
            await transaction.commit()
            assert await reader.fetchval(peek, 0) == 1
        finally:
            await writer.close()
            await reader.close()

    asyncio.run(main())


def test_topic_insert_returning_and_consumer_read(server) -> None:
    async def body(conn: asyncpg.Connection) -> None:
        await conn.execute("CREATE TOPIC events (CONSUMER c) WITH (min_active_partitions = 1)")
        insert = ('INSERT INTO TOPIC events (data, producer_id, seq_no) VALUES ($1, $2, $3) '
                  'RETURNING partition, "offset", status')  # fmt: skip
        first = await conn.fetchrow(insert, b"\x00payload", "producer-1", 1)
        assert dict(first) == {"partition": 0, "offset": 0, "status": "written"}
        again = await conn.fetchrow(insert, b"\x00payload", "producer-1", 1)
        assert again["status"] == "duplicate"
        await conn.fetchrow(insert, b"second", "producer-1", 2)
        read = ('SELECT "offset", data, seq_no, producer_id, written_at FROM TOPIC events '
                "WITH (consumer = 'c', max_messages = $1)")  # fmt: skip
        rows = await conn.fetch(read, 10)
        assert [(r["offset"], r["data"], r["seq_no"]) for r in rows] == [
            (0, b"\x00payload", 1), (1, b"second", 2)
        ]  # fmt: skip
        assert rows[0]["producer_id"] == "producer-1"
        assert rows[0]["written_at"].tzinfo is not None
        assert await conn.fetch(read, 10) == []  # the consumer's offset moved

    run(server, body)


def test_executemany_into_table_and_topic(server) -> None:
    async def body(conn: asyncpg.Connection) -> None:
        await conn.execute("CREATE TABLE points (x INTEGER, label VARCHAR)")
        await conn.executemany("INSERT INTO points VALUES ($1, $2)",
                               [(n, f"p{n}") for n in range(50)])  # fmt: skip
        assert await conn.fetchval("SELECT sum(x) FROM points") == sum(range(50))
        await conn.execute("CREATE TOPIC stream")
        await conn.executemany(
            "INSERT INTO TOPIC stream (data, message_group_id) VALUES ($1, $2)",
            [(f"m{n}".encode(), "g") for n in range(20)],
        )
        rows = await conn.fetch("SELECT data FROM TOPIC stream WITH (from_offset = 0)")
        assert [r["data"] for r in rows] == [f"m{n}".encode() for n in range(20)]

    run(server, body)


def test_cursor_fetches_in_chunks(server) -> None:
    async def body(conn: asyncpg.Connection) -> None:
        await conn.execute("CREATE TABLE seq AS SELECT range AS n FROM range(25)")
        async with conn.transaction():
            seen = [r["n"] async for r in conn.cursor("SELECT n FROM seq WHERE n >= $1 ORDER BY n",
                                                      5, prefetch=7)]  # fmt: skip
            assert seen == list(range(5, 25))
            cursor = await conn.cursor("SELECT n FROM seq ORDER BY n")
            assert [r["n"] for r in await cursor.fetch(3)] == [0, 1, 2]
            assert (await cursor.fetchrow())["n"] == 3

    run(server, body)


def test_errors_carry_sqlstates_and_the_connection_survives(server) -> None:
    async def body(conn: asyncpg.Connection) -> None:
        await conn.execute("CREATE TABLE u (id INTEGER PRIMARY KEY)")
        with pytest.raises(asyncpg.UndefinedTableError):  # 42P01
            await conn.fetch("SELECT * FROM no_such_table WHERE id = $1", 1)
        with pytest.raises(asyncpg.PostgresSyntaxError):  # 42601
            await conn.fetch("SELEC $1")
        with pytest.raises(asyncpg.InvalidTextRepresentationError):  # 22P02, from DuckDB
            await conn.fetchval("SELECT CAST(x AS INTEGER) FROM (SELECT $1 AS x)", "twelve")
        with pytest.raises(asyncpg.UndefinedColumnError):  # 42703
            await conn.fetch("SELECT nope FROM u WHERE id = $1", 1)
        await conn.execute("INSERT INTO u VALUES ($1)", 1)
        with pytest.raises(asyncpg.UniqueViolationError):  # 23505
            await conn.execute("INSERT INTO u VALUES ($1)", 1)
        with pytest.raises(asyncpg.DataError):  # refused by asyncpg: $1 was described as int4
            await conn.execute("INSERT INTO u VALUES ($1)", "not a number")
        async with conn.transaction():
            with pytest.raises(asyncpg.UniqueViolationError):  # 23505
                await conn.execute("INSERT INTO u VALUES ($1)", 1)
            with pytest.raises(asyncpg.InFailedSQLTransactionError):  # 25P02
                await conn.fetchval("SELECT id FROM u WHERE id = $1", 1)
        # Leaving the block sends COMMIT, which ends a failed transaction as a rollback.
        assert not conn.is_in_transaction()
        assert await conn.fetchval("SELECT id FROM u WHERE id = $1", 1) == 1

    run(server, body)


def test_prepared_statement_after_the_table_changed(server) -> None:
    """A changed result type is 0A000 "cached plan must not change result type", which
    asyncpg answers by preparing the statement again (outside a transaction)."""

    async def body(conn: asyncpg.Connection) -> None:
        await conn.execute("CREATE TABLE w (a INTEGER)")
        await conn.execute("INSERT INTO w VALUES (1)")
        query = "SELECT * FROM w WHERE 1 = $1"
        assert [tuple(r) for r in await conn.fetch(query, 1)] == [(1,)]
        await conn.execute("DROP TABLE w")
        await conn.execute("CREATE TABLE w (a VARCHAR, b BOOLEAN)")
        await conn.execute("INSERT INTO w VALUES ('x', true)")
        assert [tuple(r) for r in await conn.fetch(query, 1)] == [("x", True)]
        statement = await conn.prepare(query)
        await conn.execute("DROP TABLE w")
        await conn.execute("CREATE TABLE w (a DOUBLE, b BOOLEAN)")
        with pytest.raises(asyncpg.InvalidCachedStatementError):
            await statement.fetch(1)

    run(server, body)
