"""Raw-socket tests of ``sql.pgwire``: startup negotiation, bad input, extended protocol."""

from __future__ import annotations

import struct

import pytest

from sql.pgwire.codec import messages as m
from tests.pgwire.rawclient import RawClient as Client
from tests.pgwire.rawclient import error_fields as fields

SSL = struct.pack("!ii", 8, m.SSL_REQUEST)
GSSENC = struct.pack("!ii", 8, m.GSSENC_REQUEST)


def kinds(items: list[tuple[bytes, bytes]]) -> bytes:
    return b"".join(kind for kind, _ in items)


@pytest.fixture
def client(server):
    opened: list[Client] = []

    def open_client() -> Client:
        c = Client(server.port)
        opened.append(c)
        return c

    yield open_client
    for c in opened:
        c.close()


def assert_psycopg_works(connect) -> None:
    conn = connect(autocommit=True)
    assert conn.execute("SELECT %s", [42]).fetchone() == (42,)


def test_negotiation_and_startup(client) -> None:
    c = client()
    c.send(SSL)
    assert c.read_byte() == b"N"
    c.send(GSSENC)
    assert c.read_byte() == b"N"
    got = c.start()
    assert got[0] == (b"R", struct.pack("!i", 0))
    statuses = dict(tuple(body[:-1].decode().split("\0")) for kind, body in got if kind == b"S")
    assert statuses["server_version"] == "15.0 (Topicbase 0.1)"
    assert statuses["client_encoding"] == "UTF8"
    assert statuses["TimeZone"] == "UTC"
    assert b"K" in kinds(got)
    assert got[-1] == (b"Z", b"I")
    c.send(m.message(b"X"))
    assert c.closed()


@pytest.mark.parametrize(
    "garbage",
    [
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        struct.pack("!i", 2),  # a length shorter than itself
        struct.pack("!ii", 8, 1234),  # an unknown protocol version
        struct.pack("!i", 1 << 30) + b"xxxx",
    ],
)
def test_garbage_before_startup(client, connect, garbage: bytes) -> None:
    c = client()
    c.send(garbage)
    item = c.read()
    assert item is not None and item[0] == b"E"
    assert fields(item[1])["S"] == "FATAL"
    assert c.closed()
    assert_psycopg_works(connect)


def test_truncated_packets(client, connect) -> None:
    c = client()
    c.send(struct.pack("!i", 100) + b"abc")  # a startup packet cut short
    c.close()
    c = client()
    c.start()
    c.send(b"Q" + struct.pack("!i", 50) + b"SELECT")  # a message cut short
    c.close()
    c = client()
    c.start()
    c.send(b"Q" + struct.pack("!i", 1))  # a bad message length
    item = c.read()
    assert item is not None and item[0] == b"E" and fields(item[1])["C"] == "08P01"
    assert c.closed()
    c = client()
    c.start()
    c.send(m.message(b"?", b"xyz"))  # an unknown message type
    item = c.read()
    assert item is not None and item[0] == b"E"
    assert c.closed()
    c = client()
    c.start()
    c.send(m.message(b"P", b"no terminator"))  # a malformed body
    item = c.read()
    assert item is not None and item[0] == b"E"
    assert c.closed()
    assert_psycopg_works(connect)


def query(text: str) -> bytes:
    return m.message(b"Q", m.cstr(text))


def test_simple_query_messages(client) -> None:
    c = client()
    c.start()
    c.send(query("SELECT 1 AS a, 'x' AS b; CREATE TABLE t (a INTEGER); ;"))
    got = c.until_ready()
    assert kinds(got) == b"TDCCZ"
    assert got[1][1] == struct.pack("!hi", 2, 1) + b"1" + struct.pack("!i", 1) + b"x"
    assert got[2][1] == b"SELECT 1\0"
    assert got[3][1] == b"CREATE TABLE\0"
    c.send(query("   "))
    assert kinds(c.until_ready()) == b"IZ"
    c.send(query("SELECT 1;\nCREATE TOPIC x WITH ("))
    got = c.until_ready()
    assert kinds(got) == b"EZ"
    error = fields(got[0][1])
    assert error["C"] == "42601" and error["S"] == "ERROR"
    assert error["P"] == "32"
    c.send(query("SELECT '\\x00ff'::BLOB AS b, TRUE AS t"))
    got = c.until_ready()
    assert got[1][1] == struct.pack("!hi", 2, 8) + b"\\x006666" + struct.pack("!i", 1) + b"t"


def test_transaction_status(client) -> None:
    c = client()
    c.start()
    c.send(query("BEGIN"))
    assert c.until_ready()[-1] == (b"Z", b"T")
    c.send(query("SELECT * FROM missing_table"))
    got = c.until_ready()
    assert got[-1] == (b"Z", b"E")
    c.send(query("SELECT 1"))
    got = c.until_ready()
    assert fields(got[0][1])["C"] == "25P02"
    assert got[-1] == (b"Z", b"E")
    c.send(query("ROLLBACK"))
    assert c.until_ready()[-1] == (b"Z", b"I")


def parse_message(text: str, name: str = "", oids: tuple[int, ...] = ()) -> bytes:
    body = m.cstr(name) + m.cstr(text) + struct.pack("!h", len(oids))
    body += b"".join(struct.pack("!i", o) for o in oids)
    return m.message(b"P", body)


def bind_message(
    values: list[bytes | None], formats: tuple[int, ...] = (), results: tuple[int, ...] = (),
    statement: str = "", portal: str = "",
) -> bytes:  # fmt: skip
    body = m.cstr(portal) + m.cstr(statement) + struct.pack("!h", len(formats))
    body += b"".join(struct.pack("!h", f) for f in formats) + struct.pack("!h", len(values))
    for value in values:
        body += struct.pack("!i", -1) if value is None else struct.pack("!i", len(value)) + value
    body += struct.pack("!h", len(results)) + b"".join(struct.pack("!h", r) for r in results)
    return m.message(b"B", body)


def execute_message(portal: str = "", max_rows: int = 0) -> bytes:
    return m.message(b"E", m.cstr(portal) + struct.pack("!i", max_rows))


SYNC = m.message(b"S")


def test_extended_protocol(client) -> None:
    c = client()
    c.start()
    c.send(
        parse_message("SELECT i FROM range($1::BIGINT) t(i) ORDER BY i", "s1", (20,))
        + m.message(b"D", b"Ss1\0")
        + bind_message([struct.pack("!q", 5)], (1,), (1,), "s1")
        + m.message(b"D", b"P\0")
        + execute_message("", 2)
        + execute_message("", 0)
        + SYNC
    )
    got = c.until_ready()
    assert kinds(got) == b"1tT2TDDsDDDCZ"  # Describe of the statement: its row, unrun
    assert got[1][1] == struct.pack("!hi", 1, 20)
    assert got[5][1] == struct.pack("!hiq", 1, 8, 0)  # binary int8
    assert got[-2][1] == b"SELECT 3\0"
    # Text parameters, an unnamed statement, NoData for a statement without rows.
    c.send(
        parse_message("CREATE TABLE p (a INTEGER, b VARCHAR)")
        + bind_message([])
        + m.message(b"D", b"P\0")
        + execute_message()
        + parse_message("INSERT INTO p VALUES ($1, $2)")
        + bind_message([b"7", b"seven"])
        + execute_message()
        + m.message(b"C", b"Ss1\0")
        + SYNC
    )
    got = c.until_ready()
    assert kinds(got) == b"12nC12C3Z"
    assert got[-3][1] == b"INSERT 0 1\0"


def test_extended_error_skips_until_sync(client) -> None:
    c = client()
    c.start()
    c.send(
        parse_message("CREATE TOPIC x WITH (")
        + bind_message([])
        + execute_message()
        + SYNC
        + parse_message("SELECT 1")
        + bind_message([])
        + execute_message()
        + m.message(b"H")
    )
    got = c.until_ready()
    assert kinds(got) == b"EZ"
    assert fields(got[0][1])["C"] == "42601"
    assert fields(got[0][1])["P"] == "22"
    assert kinds([c.read(), c.read(), c.read(), c.read()]) == b"12DC"
    c.send(parse_message("SELEC 1") + bind_message([]) + execute_message() + SYNC)
    got = c.until_ready()
    assert kinds(got) == b"12EZ" and fields(got[2][1])["C"] == "42601"
    c.send(bind_message([], statement="nope") + execute_message() + SYNC)
    got = c.until_ready()
    assert kinds(got) == b"EZ" and fields(got[0][1])["C"] == "26000"
    c.send(parse_message("SELECT $1::INTEGER") + bind_message([]) + SYNC)
    got = c.until_ready()
    assert kinds(got) == b"1EZ" and fields(got[1][1])["C"] == "08P01"


def test_a_row_limit_reached_on_the_last_row_suspends_the_portal(client) -> None:
    """As PostgreSQL: an Execute whose row limit is reached suspends the portal even when
    no row is left (the next Execute completes with ``SELECT 0``); a limit above the rows
    left completes at once (review R2-N1 of round 13: the last row completed at once)."""
    c = client()
    c.start()
    c.send(
        parse_message("SELECT i FROM range(3) t(i) ORDER BY i")
        + bind_message([])
        + execute_message("", 1)  # 1 of 3: suspended
        + execute_message("", 2)  # the last 2, the limit reached: suspended
        + execute_message("", 2)  # nothing left: SELECT 0
        + bind_message([])
        + execute_message("", 4)  # 3 rows under the limit: complete
        + SYNC
    )
    got = c.until_ready()
    assert kinds(got) == b"12DsDDsC2DDDCZ"
    tags = [body for kind, body in got if kind == b"C"]
    assert tags == [b"SELECT 0\0", b"SELECT 3\0"]
