"""A consumer's read as a COPY: ``COPY (SELECT ... FROM TOPIC t WITH (consumer = 'c', ...))
TO STDOUT (FORMAT arrow | binary)`` against the real server, through psycopg.

It has the plain read's semantics, committed at the COPY's end (``connection.copy_commit``):
the messages come once across repeated reads and the consumer's offsets move past them,
exactly as the plain statement moves them; a COPY that is cancelled, whose client goes away,
or whose commit is refused (40001) before its end commits nothing, so the next read returns
the same messages. Inside a transaction block the offsets commit with the block.
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Callable

import psycopg
import pyarrow as pa
import pytest

from sql.pgwire.server import ServerThread

Connect = Callable[..., psycopg.Connection]
READ = "SELECT data FROM TOPIC {topic} WITH (consumer = 'c', max_messages = {count})"


def _fill(db: psycopg.Connection, topic: str, rows: int, size: int = 16) -> list[bytes]:
    """``rows`` messages of ``size`` bytes, each starting with its number; what was written."""
    db.execute(f"CREATE TOPIC {topic} (CONSUMER c) WITH (min_active_partitions = 1)")
    for start in range(0, rows, 10000):
        count = min(10000, rows - start)
        db.execute(f"INSERT INTO TOPIC {topic} (data) SELECT CAST(lpad(CAST(i AS VARCHAR), 8, "
                   f"'0') || repeat('x', {size - 8}) AS BLOB) FROM range({start}, "
                   f"{start + count}) t(i) ORDER BY i")  # fmt: skip
    return [f"{i:08d}".encode() + b"x" * (size - 8) for i in range(rows)]


def arrow_copy(topic: str, count: int) -> str:
    return f"COPY ({READ.format(topic=topic, count=count)}) TO STDOUT (FORMAT arrow)"


def copy_read(db: psycopg.Connection, topic: str, count: int,
              on_first_block: Callable[[], None] = lambda: None) -> list[bytes]:  # fmt: skip
    """One consumer read as COPY (FORMAT arrow): the messages, decoded with pyarrow;
    ``on_first_block`` runs once the first CopyData (the stream's schema) came."""
    cursor = db.cursor()
    blocks: list[bytes] = []
    with cursor.copy(arrow_copy(topic, count)) as copy:
        for block in copy:
            if not blocks:
                on_first_block()
            blocks.append(bytes(block))
    table = pa.ipc.open_stream(b"".join(blocks)).read_all()
    assert table.column_names == ["data"] and cursor.rowcount == table.num_rows
    return table.column("data").to_pylist()


def committed(db: psycopg.Connection, topic: str) -> int | None:
    row = db.execute("SELECT committed_offset FROM sys.consumers WHERE topic = %s AND "
                     "consumer = 'c'", [topic]).fetchone()  # fmt: skip
    assert row is not None
    return row[0]


def plain_read(db: psycopg.Connection, topic: str, count: int) -> list[bytes]:
    return [bytes(row[0]) for row in db.execute(READ.format(topic=topic, count=count))]


def small_receive_buffer(db: psycopg.Connection) -> psycopg.Connection:
    """Fix the client socket's receive buffer at 64 KiB (the kernel's autotuning grows it
    up to ``tcp_rmem``'s maximum, 32 MiB here, otherwise): with the server's send buffer
    (at most ``tcp_wmem``'s 4 MiB), a COPY of 10 MB cannot be wholly in the kernel while
    its client has read only its first CopyData, so the server is still sending then."""
    with socket.fromfd(db.fileno(), socket.AF_INET, socket.SOCK_STREAM) as shared:
        shared.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    return db


def _wait_until_closed(server: ServerThread, count: int) -> None:
    """Wait (up to 30 s) until the server holds ``count`` connections: a lost client's
    connection has ended, its session closed."""
    deadline = time.monotonic() + 30
    while len(server.server.connections) > count:
        assert time.monotonic() < deadline, "the server kept the lost client's connection"
        time.sleep(0.02)


def test_copy_reads_return_each_message_once_and_commit_at_their_end(
        connect: Connect) -> None:  # fmt: skip
    """Reads of 1000 of 10 KiB (10 MB: more than the socket buffers hold, so the server
    is still sending when the client has the first CopyData): while a COPY read sends, the
    offsets have not moved (another connection sees the last read's); once it ended they
    are past its messages, as the plain read leaves them, and a plain read goes on from
    there. Every message comes once."""
    db = small_receive_buffer(connect(autocommit=True))
    written = _fill(db, "big", rows=3500, size=10240)
    other = connect(autocommit=True)
    got: list[bytes] = []
    for expected in (None, 1000, 2700):
        seen: list[int | None] = []
        read = copy_read(db, "big", 1000,
                         lambda seen=seen: seen.append(committed(other, "big")))  # fmt: skip
        assert seen == [expected]
        got += read
        assert committed(other, "big") == (expected or 0) + len(read)
        if expected == 1000:
            got += plain_read(db, "big", 700)
    assert got == written
    assert copy_read(db, "big", 1000) == []  # an empty read: a valid, empty stream
    assert committed(other, "big") == 3500


def test_a_cancelled_copy_read_commits_nothing_and_the_next_read_returns_its_messages(
        connect: Connect) -> None:  # fmt: skip
    """30 MB do not fit the socket buffers: the server is still sending when the client
    cancels after its first CopyData, so the COPY ends with 57014 before its end and the
    offsets stay; the connection stays usable and in autocommit."""
    db = small_receive_buffer(connect(autocommit=True))
    written = _fill(db, "big", rows=3000, size=10240)
    assert copy_read(db, "big", 10) == written[:10]
    received = 0
    with (
        pytest.raises(psycopg.errors.QueryCanceled, match="user request"),
        db.cursor().copy(arrow_copy("big", 2990)) as copy,
    ):
        for block in copy:
            if received == 0:
                db.cancel_safe()
            received += len(block)
    assert received > 0
    assert db.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert committed(db, "big") == 10
    assert copy_read(db, "big", 5) == written[10:15]


def test_a_client_gone_mid_copy_commits_nothing(connect: Connect, server: ServerThread) -> None:
    """The client breaks its socket after the first CopyData of a 30 MB read: the server's
    send fails, the COPY's transaction is rolled back, and another connection's read
    returns the same messages."""
    admin = connect(autocommit=True)
    written = _fill(admin, "big", rows=3000, size=10240)
    lost = small_receive_buffer(connect(autocommit=True))
    with (
        pytest.raises(psycopg.OperationalError),
        lost.cursor().copy(arrow_copy("big", 3000)) as copy,
    ):
        for _ in copy:
            # A duplicate descriptor shares the socket: shut down, it ends the COPY on
            # the client (psycopg reads the end of the stream) ...
            with socket.fromfd(lost.fileno(), socket.AF_INET, socket.SOCK_STREAM) as shared:
                shared.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                shared.shutdown(socket.SHUT_RDWR)
    lost.close()  # ... and closed with a zero linger, it resets the connection, as a
    # client that dies with unread data does
    _wait_until_closed(server, 1)
    assert admin.execute("SELECT count(*) FROM sys.consumers").fetchone() == (1,)
    assert committed(admin, "big") is None
    assert copy_read(admin, "big", 3) == written[:3]


def test_a_copy_read_whose_commit_is_refused_ends_without_its_end_marker(
        connect: Connect) -> None:  # fmt: skip
    """Another read moves the offsets while a COPY read is still sending (its client has
    not read yet): the COPY's commit is refused with 40001 after its rows, in place of the
    stream's end marker and CopyDone, and the other read's offsets stay."""
    db = small_receive_buffer(connect(autocommit=True))
    written = _fill(db, "big", rows=3000, size=10240)
    other = connect(autocommit=True)
    blocks: list[bytes] = []
    with (
        pytest.raises(psycopg.errors.SerializationFailure, match="moved"),
        db.cursor().copy(arrow_copy("big", 3000)) as copy,
    ):
        for block in copy:
            if not blocks:  # the server has read its rows and is blocked sending them
                assert plain_read(other, "big", 100) == written[:100]
            blocks.append(bytes(block))
    data = b"".join(blocks)
    assert not data.endswith(b"\xff\xff\xff\xff\x00\x00\x00\x00")  # no end-of-stream marker
    reader = pa.ipc.open_stream(data)
    assert reader.read_next_batch().num_rows > 0  # the rows came...
    with pytest.raises((pa.ArrowInvalid, OSError, StopIteration)):
        reader.read_next_batch()  # ... but the stream is cut short
    assert committed(db, "big") == 100
    assert copy_read(db, "big", 3) == written[100:103]


def test_in_a_transaction_block_the_offsets_commit_with_the_block(connect: Connect) -> None:
    """No transaction of the COPY's own inside a block (a regression guard: the block's
    reads go on from each other, ROLLBACK undoes them, COMMIT keeps them), and a cancelled
    COPY read fails the block (25P02), so its offsets never commit."""
    admin = connect(autocommit=True)
    written = _fill(admin, "big", rows=3000, size=10240)
    db = small_receive_buffer(connect())  # psycopg opens a block before the first statement
    assert copy_read(db, "big", 10) == written[:10]
    assert copy_read(db, "big", 10) == written[10:20]
    db.rollback()
    assert copy_read(db, "big", 10) == written[:10]
    db.commit()
    assert committed(admin, "big") == 10
    assert copy_read(db, "big", 10) == written[10:20]
    with (
        pytest.raises(psycopg.errors.QueryCanceled),
        db.cursor().copy(arrow_copy("big", 2980)) as copy,
    ):
        for index, _ in enumerate(copy):
            if index == 0:
                db.cancel_safe()
    with pytest.raises(psycopg.errors.InFailedSqlTransaction):
        copy_read(db, "big", 1)
    db.rollback()
    assert committed(admin, "big") == 10
    assert copy_read(db, "big", 3) == written[10:13]


def test_copy_binary_read_commits_at_its_end_as_the_arrow_one(connect: Connect) -> None:
    db = small_receive_buffer(connect(autocommit=True))
    written = _fill(db, "big", rows=1500, size=10240)
    other = connect(autocommit=True)
    cursor = db.cursor()
    rows: list[bytes] = []
    with cursor.copy(f"COPY ({READ.format(topic='big', count=1000)}) TO STDOUT "
                     "(FORMAT binary)") as copy:  # fmt: skip
        copy.set_types(["bytea"])
        for row in copy.rows():
            if not rows:  # 10 MB: the server is still sending
                assert committed(other, "big") is None
            rows.append(bytes(row[0]))
    assert rows == written[:1000] and cursor.rowcount == 1000
    assert committed(other, "big") == 1000
    assert copy_read(db, "big", 1000) == written[1000:]


def test_bad_input_is_an_error_with_sqlstate_and_commits_nothing(connect: Connect) -> None:
    db = connect(autocommit=True)
    written = _fill(db, "events", rows=5)
    bad = [
        ("SELECT data FROM TOPIC events WITH (consumer = 'nobody')", "42704"),
        ("SELECT data FROM TOPIC events WITH (consumer = 'c', max_messages = -1)", "22023"),
        ("SELECT data FROM TOPIC missing WITH (consumer = 'c')", "42P01"),
        ("SELECT nothing FROM TOPIC events WITH (consumer = 'c')", "42703"),
        ("SELECT data FROM TOPIC events WITH (consumer = 'c', bogus = 1)", "22023"),
    ]
    for query, sqlstate in bad:
        with (
            pytest.raises(psycopg.Error) as raised,
            db.cursor().copy(f"COPY ({query}) TO STDOUT (FORMAT arrow)") as copy,
        ):
            for _ in copy:
                pass
        assert raised.value.sqlstate == sqlstate, query
        assert db.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert committed(db, "events") is None
    assert copy_read(db, "events", 5) == written
