"""A statement costs one engine call of its connection (``Connection.call``).

Before login, and for TLS connections, every engine call runs on the connection's worker
thread: a hop there and back costs tens of microseconds of thread wake-ups, as much as the
rest of the wire's own work on a ``SELECT 1`` (plaintext connections run them inline on
their own thread once logged in: ``test_own_thread``). So the per-statement work the
engine is asked for goes in one call: the revalidation of a described statement, the
statement itself and the description that tells UUID and JSON text columns apart (extended
protocol), or the stream's opening, its first batch and its closing when that batch is the
whole result, else the whole result (simple query). Counted, not timed:
``Connection.call`` is wrapped.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from sql.pgwire.connection.connection import Connection


@pytest.fixture
def hops(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The names of the functions each connection ran on its worker, in order."""
    calls: list[str] = []
    original = Connection.call

    async def counted(self: Connection, function: Any, *arguments: Any) -> Any:
        calls.append(getattr(function, "__name__", repr(function)))
        return await original(self, function, *arguments)

    monkeypatch.setattr(Connection, "call", counted)
    yield calls


def _table(conn: Any) -> None:
    conn.execute("CREATE TABLE kv (k BIGINT PRIMARY KEY, v VARCHAR NOT NULL, u UUID)")
    conn.execute("INSERT INTO kv SELECT i, 'value ' || i, NULL FROM range(100) t(i)")
    conn.execute("UPDATE kv SET u = '6e0c8a4c-1d53-4ae4-9a5e-2b0a3c0e9f11' WHERE k = 7")


def test_a_prepared_lookup_is_one_hop(connect, hops: list[str]) -> None:
    conn = connect(autocommit=True)
    _table(conn)
    lookup = "SELECT v, u FROM kv WHERE k = %s"
    for key in range(6):  # psycopg prepares it (named) from the 5th run on
        conn.execute(lookup, [key]).fetchone()
    for key in range(7, 10):
        del hops[:]
        row = conn.execute(lookup, [key]).fetchone()
        assert row is not None and row[0] == f"value {key}"
        assert len(hops) == 1, hops


def test_text_columns_are_described_in_the_same_hop(connect, hops: list[str]) -> None:
    conn = connect(autocommit=True)
    _table(conn)
    lookup = f"SELECT v, u FROM kv WHERE k = %s -- {uuid.uuid4()}"  # a text never seen
    del hops[:]
    row = conn.execute(lookup, [7], prepare=False).fetchone()
    assert row == ("value 7", uuid.UUID("6e0c8a4c-1d53-4ae4-9a5e-2b0a3c0e9f11"))  # UUID OID
    assert len(hops) == 2, hops  # Parse of a text not seen yet, then the portal's one hop
    del hops[:]
    conn.execute(lookup, [8], prepare=False).fetchone()
    assert len(hops) == 1, hops  # a text parsed before is found on the event loop


def test_a_simple_query_is_one_hop(connect, hops: list[str]) -> None:
    conn = connect(autocommit=True)
    _table(conn)
    for sql, expected in (
        (b"SELECT v, u FROM kv WHERE k = 7", [b"value 7", b"6e0c8a4c-1d53-4ae4-9a5e-2b0a3c0e9f11"]),
        (b"SELECT 1", [b"1"]),  # streamed: opened, read and closed in the one hop
        (b"SHOW client_encoding", [b"UTF8"]),  # not streamed: run whole in the same hop
    ):
        for _ in range(2):  # the first may parse the text on the worker
            del hops[:]
            result = conn.pgconn.exec_(sql)
            assert [result.get_value(0, i) for i in range(result.nfields)] == expected
        assert len(hops) == 1, (sql, hops)
