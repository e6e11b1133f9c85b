"""A consumer read whose rows go out as DataRows (the extended protocol: psycopg's binary
results, JDBC; and a simple query's text results) commits its offsets only once its rows
were sent, before CommandComplete (``connection.copy_commit.hold``), as a COPY read commits
before its end marker.

Against the real server, with a raw frontend (``rawclient``) so that a test can stop
reading in the middle of a result, and psycopg for the rest: while the rows are being sent
the offsets have not moved; a client that goes away, a portal described but never
executed, or a commit refused (40001, another read moved the offsets meanwhile) commit
nothing, so the next read returns the same messages; the refused commit is an
ErrorResponse in place of CommandComplete. Without the hold, each of these committed
before the first row went out.
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Callable, Iterator

import psycopg
import pytest

from sql.pgwire.codec import messages as m
from sql.pgwire.server import ServerThread
from tests.pgwire.rawclient import RawClient, error_fields

Connect = Callable[..., psycopg.Connection]
READ = "SELECT data FROM TOPIC {topic} WITH (consumer = 'c', max_messages = {count})"
SYNC = m.message(b"S")


def _fill(db: psycopg.Connection, topic: str, rows: int, size: int) -> list[bytes]:
    """``rows`` messages of ``size`` bytes, each starting with its number; what was written."""
    db.execute(f"CREATE TOPIC {topic} (CONSUMER c) WITH (min_active_partitions = 1)")
    db.execute(f"INSERT INTO TOPIC {topic} (data) SELECT CAST(lpad(CAST(i AS VARCHAR), 8, "
               f"'0') || repeat('x', {size - 8}) AS BLOB) FROM range({rows}) t(i) "
               "ORDER BY i")  # fmt: skip
    return [f"{i:08d}".encode() + b"x" * (size - 8) for i in range(rows)]


def committed(db: psycopg.Connection, topic: str) -> int | None:
    row = db.execute("SELECT committed_offset FROM sys.consumers WHERE topic = %s AND "
                     "consumer = 'c'", [topic]).fetchone()  # fmt: skip
    assert row is not None
    return row[0]


def binary_read(db: psycopg.Connection, topic: str, count: int) -> list[bytes]:
    """A read with binary results (the extended protocol) through psycopg."""
    cursor = db.cursor(binary=True)
    return [bytes(row[0]) for row in cursor.execute(READ.format(topic=topic, count=count))]


def read_flight(topic: str, count: int, *, execute: bool = True, simple: bool = False) -> bytes:
    """Parse, Bind (binary results), Describe (runs the read), Execute (unless not
    ``execute``) of the unnamed portal, then Sync: what psycopg sends for a binary read;
    ``simple``: a Query message instead (text results)."""
    text = READ.format(topic=topic, count=count)
    if simple:
        return m.message(b"Q", m.cstr(text))
    parse = m.message(b"P", m.cstr("") + m.cstr(text) + struct.pack("!h", 0))
    bind = m.message(b"B", m.cstr("") + m.cstr("") + struct.pack("!hhhh", 0, 0, 1, 1))
    describe = m.message(b"D", b"P\0")
    run = m.message(b"E", m.cstr("") + struct.pack("!i", 0)) if execute else b""
    return parse + bind + describe + run + SYNC


@pytest.fixture
def raw(server: ServerThread) -> Iterator[Callable[[], RawClient]]:
    """Raw frontends, logged in, whose receive buffer is fixed at 64 KiB: with the
    server's send buffer (at most ``tcp_wmem``'s 4 MiB) a result of 30 MB cannot be wholly
    in the kernel while the client has read only its first rows."""
    opened: list[RawClient] = []

    def open_client() -> RawClient:
        client = RawClient(server.port)
        client.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        opened.append(client)
        client.start()
        return client

    yield open_client
    for client in opened:
        client.close()


def _until_first_row(client: RawClient) -> list[bytes]:
    """The messages' kinds up to the first DataRow."""
    kinds: list[bytes] = []
    while not kinds or kinds[-1] != b"D":
        item = client.read()
        assert item is not None, f"the connection closed after {kinds}"
        kinds.append(item[0])
    return kinds


def _rest(client: RawClient) -> tuple[int, list[tuple[bytes, bytes]]]:
    """The DataRows still to come (counted) and the messages after them, to ReadyForQuery."""
    rows, tail = 0, []
    while True:
        item = client.read()
        assert item is not None, "the connection closed before ReadyForQuery"
        if item[0] == b"D" and not tail:
            rows += 1
            continue
        tail.append(item)
        if item[0] == b"Z":
            return rows, tail


def _wait_until_closed(server: ServerThread, count: int) -> None:
    deadline = time.monotonic() + 30
    while len(server.server.connections) > count:
        assert time.monotonic() < deadline, "the server kept the lost client's connection"
        time.sleep(0.02)


FLIGHTS = pytest.mark.parametrize("simple", [False, True], ids=["extended", "simple"])
FIRST = {False: [b"1", b"2", b"T", b"D"], True: [b"T", b"D"]}


@FLIGHTS
def test_the_offsets_move_once_the_rows_were_sent(connect: Connect, raw, simple: bool) -> None:
    """30 MB of rows: while the server is still sending them (its client has read the
    first), another connection sees the offsets where they were; once CommandComplete
    came they are past the read, and reads through psycopg go on from there."""
    admin = connect(autocommit=True)
    written = _fill(admin, "big", rows=3000, size=10240)
    client = raw()
    client.send(read_flight("big", 2990, simple=simple))
    assert _until_first_row(client) == FIRST[simple]
    assert committed(admin, "big") is None  # the rows are on their way: nothing moved
    rows, tail = _rest(client)
    assert rows == 2989
    assert [kind for kind, _ in tail] == [b"C", b"Z"]
    assert tail[0][1] == b"SELECT 2990\0" and tail[1][1] == b"I"
    assert committed(admin, "big") == 2990
    assert binary_read(admin, "big", 100) == written[2990:]


@FLIGHTS
def test_a_client_gone_mid_result_commits_nothing(connect: Connect, raw, server: ServerThread,
                                                  simple: bool) -> None:  # fmt: skip
    """The client resets its connection after the first rows of a 30 MB result: the
    server's send fails, the read's transaction is rolled back, and another connection's
    read returns the same messages."""
    admin = connect(autocommit=True)
    written = _fill(admin, "big", rows=3000, size=10240)
    lost = raw()
    lost.send(read_flight("big", 3000, simple=simple))
    _until_first_row(lost)
    lost.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    lost.close()  # with unread data and a zero linger: a reset, as a client that dies
    _wait_until_closed(server, 1)
    assert committed(admin, "big") is None
    assert binary_read(admin, "big", 3) == written[:3]


def test_a_portal_described_but_not_executed_commits_nothing(connect: Connect, raw) -> None:
    """Describe of the portal runs the read (for its row description), but no Execute
    sends its rows: at the next message (Sync) its transaction is rolled back."""
    admin = connect(autocommit=True)
    written = _fill(admin, "small", rows=50, size=100)
    client = raw()
    client.send(read_flight("small", 10, execute=False))
    got = client.until_ready()
    assert [kind for kind, _ in got] == [b"1", b"2", b"T", b"Z"]
    assert got[-1][1] == b"I"  # the held transaction ended: idle again
    assert committed(admin, "small") is None
    assert binary_read(admin, "small", 10) == written[:10]
    assert committed(admin, "small") == 10


@FLIGHTS
def test_a_refused_commit_replaces_command_complete(connect: Connect, raw, simple: bool) -> None:
    """Another read moves the offsets while a read's rows are still being sent: that
    read's commit is refused with 40001 after its rows, in place of CommandComplete, and
    the other read's offsets stay."""
    admin = connect(autocommit=True)
    written = _fill(admin, "big", rows=3000, size=10240)
    client = raw()
    client.send(read_flight("big", 3000, simple=simple))
    _until_first_row(client)
    assert binary_read(admin, "big", 100) == written[:100]  # moves the offsets meanwhile
    rows, tail = _rest(client)
    assert rows == 2999  # every row came...
    assert [kind for kind, _ in tail] == [b"E", b"Z"]  # ... but no CommandComplete
    assert error_fields(tail[0][1])["C"] == "40001"
    assert tail[1][1] == b"I"
    assert committed(admin, "big") == 100
    assert binary_read(admin, "big", 3) == written[100:103]


def test_inside_a_block_the_offsets_commit_with_the_block(connect: Connect) -> None:
    """No transaction of the read's own inside a block (a regression guard): the block's
    binary reads go on from each other and ROLLBACK undoes them."""
    admin = connect(autocommit=True)
    written = _fill(admin, "small", rows=50, size=100)
    db = connect()  # psycopg opens a block before the first statement
    assert binary_read(db, "small", 10) == written[:10]
    assert binary_read(db, "small", 10) == written[10:20]
    db.rollback()
    assert committed(admin, "small") is None
    assert binary_read(db, "small", 10) == written[:10]
    db.commit()
    assert committed(admin, "small") == 10


def test_a_move_without_rows_commits_as_before(connect: Connect) -> None:
    """A consumer statement without rows (INSERT INTO TOPIC ... SELECT ... WITH consumer)
    through the extended protocol commits at its Execute (a regression guard: its
    transaction is held like a read's and committed before CommandComplete)."""
    admin = connect(autocommit=True)
    written = _fill(admin, "a", rows=20, size=100)
    admin.execute("CREATE TOPIC b WITH (min_active_partitions = 1)")
    db = connect(autocommit=True)
    cursor = db.cursor(binary=True)
    cursor.execute("INSERT INTO TOPIC b (data) SELECT data FROM TOPIC a WITH "
                   "(consumer = 'c', max_messages = %s)", [5])  # fmt: skip
    assert cursor.rowcount == 5
    assert committed(admin, "a") == 5
    moved = admin.execute("SELECT data FROM TOPIC b ORDER BY \"offset\"").fetchall()
    assert [bytes(row[0]) for row in moved] == written[:5]


def test_a_portal_fetched_in_parts_commits_with_its_last_part(connect: Connect, raw) -> None:
    """Execute with a row limit (PortalSuspended) keeps the read's transaction; the Execute
    that sends the last rows commits it; a portal left suspended at Sync is rolled back."""
    admin = connect(autocommit=True)
    written = _fill(admin, "small", rows=50, size=100)
    text = READ.format(topic="small", count=10)
    parse = m.message(b"P", m.cstr("") + m.cstr(text) + struct.pack("!h", 0))
    bind = m.message(b"B", m.cstr("") + m.cstr("") + struct.pack("!hhhh", 0, 0, 1, 1))
    describe = m.message(b"D", b"P\0")
    client = raw()
    client.send(parse + bind + describe + m.message(b"E", m.cstr("") + struct.pack("!i", 3))
                + m.message(b"H"))  # Flush: the first part now  # fmt: skip
    kinds = []
    while not kinds or kinds[-1] != b"s":
        item = client.read()
        assert item is not None
        kinds.append(item[0])
    assert kinds == [b"1", b"2", b"T", b"D", b"D", b"D", b"s"]
    assert committed(admin, "small") is None  # 7 rows still to send
    client.send(m.message(b"E", m.cstr("") + struct.pack("!i", 0)) + SYNC)
    got = client.until_ready()
    assert [kind for kind, _ in got] == [b"D"] * 7 + [b"C", b"Z"]
    assert committed(admin, "small") == 10
    client.send(parse + bind + describe + m.message(b"E", m.cstr("") + struct.pack("!i", 3))
                + SYNC)  # fmt: skip
    got = client.until_ready()
    assert [kind for kind, _ in got] == [b"1", b"2", b"T", b"D", b"D", b"D", b"s", b"Z"]
    assert got[-1][1] == b"I"
    assert committed(admin, "small") == 10  # the suspended read was rolled back
    assert binary_read(admin, "small", 5) == written[10:15]


def test_a_copy_executed_while_a_read_is_held_runs_on_its_own(connect: Connect, raw) -> None:
    """A COPY portal bound before a read's portal was described (which runs the read and
    holds its transaction) and executed next: the held read is rolled back first, and the
    COPY reads and commits in a transaction of its own, not inside the held one."""
    admin = connect(autocommit=True)
    written = _fill(admin, "small", rows=50, size=100)
    read = READ.format(topic="small", count=10)
    copy = f"COPY ({READ.format(topic='small', count=5)}) TO STDOUT"
    no_types = struct.pack("!h", 0)
    client = raw()
    client.send(
        m.message(b"P", m.cstr("s_read") + m.cstr(read) + no_types)
        + m.message(b"P", m.cstr("s_copy") + m.cstr(copy) + no_types)
        + m.message(b"B", m.cstr("p_copy") + m.cstr("s_copy") + struct.pack("!hhh", 0, 0, 0))
        + m.message(b"B", m.cstr("") + m.cstr("s_read") + struct.pack("!hhhh", 0, 0, 1, 1))
        + m.message(b"D", b"P\0")  # runs the read: its transaction is held
        + m.message(b"E", m.cstr("p_copy") + struct.pack("!i", 0))
        + SYNC
    )
    got = client.until_ready()
    kinds = [kind for kind, _ in got]
    assert kinds[:5] == [b"1", b"1", b"2", b"2", b"T"] and kinds[-1] == b"Z"
    assert b"E" not in kinds and b"H" in kinds and b"C" in kinds
    assert got[-1][1] == b"I"
    assert committed(admin, "small") == 5  # the COPY's own read, from the start
    assert binary_read(admin, "small", 5) == written[5:10]
