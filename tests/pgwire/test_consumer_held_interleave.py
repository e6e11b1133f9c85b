"""A consumer read's portal fetched in parts (Execute with a row limit) holds its
transaction between its parts (``ExtendedProtocol.held``). If the client runs another
statement between the parts (legal pipelining: Parse/Bind/Execute of another portal), the
held read is rolled back, its offsets do not move, and the next read returns the same
messages. The first portal's later Execute must then say so (ErrorResponse 55000) rather
than send the rest of its rows and a CommandComplete as if the read had committed (it did
before: the messages were delivered twice, silently). Nothing is lost either way.
"""

from __future__ import annotations

import struct

from sql.pgwire.codec import messages as m
from tests.pgwire.rawclient import error_fields
from tests.pgwire.test_consumer_rows_commit import (  # noqa: F401 (the fixture)
    READ,
    SYNC,
    Connect,
    _fill,
    binary_read,
    committed,
    raw,
)

NO_TYPES = struct.pack("!h", 0)


def _read_portal(name: str, count: int) -> bytes:
    """Parse and Bind (binary results) of a read of ``count`` messages as portal ``name``."""
    text = READ.format(topic="small", count=count)
    bind = m.cstr(name) + m.cstr(name) + struct.pack("!hhhh", 0, 0, 1, 1)
    return m.message(b"P", m.cstr(name) + m.cstr(text) + NO_TYPES) + m.message(b"B", bind)


def _execute(portal: str, rows: int) -> bytes:
    return m.message(b"E", m.cstr(portal) + struct.pack("!i", rows))


def _select_one(portal: str) -> bytes:
    return (m.message(b"P", m.cstr(portal) + m.cstr("SELECT 1") + NO_TYPES)
            + m.message(b"B", m.cstr(portal) + m.cstr(portal) + struct.pack("!hhh", 0, 0, 0))
            + _execute(portal, 0))  # fmt: skip


def test_a_read_interrupted_by_another_portal_fails_its_next_execute(
    connect: Connect,
    raw,  # noqa: F811 (the fixture)
) -> None:
    admin = connect(autocommit=True)
    written = _fill(admin, "small", rows=50, size=100)
    client = raw()
    client.send(_read_portal("p1", 10) + _execute("p1", 3) + _select_one("p2")
                + _execute("p1", 0) + SYNC)  # fmt: skip
    got = client.until_ready()
    kinds = [kind for kind, _ in got]
    # p1's three rows, suspended; SELECT 1 whole; then p1's Execute fails, skip to Sync.
    assert kinds == [b"1", b"2", b"D", b"D", b"D", b"s", b"1", b"2", b"D", b"C", b"E", b"Z"]
    fields = error_fields(got[-2][1])
    assert fields["C"] == "55000" and "rolled back" in fields["M"]
    assert got[-1][1] == b"I"
    assert committed(admin, "small") is None  # nothing committed
    assert binary_read(admin, "small", 5) == written[:5]  # the same messages again
    assert binary_read(admin, "small", 50) == written[5:]  # and nothing lost


def test_an_interrupted_read_portal_fails_until_it_is_gone(
    connect: Connect,
    raw,  # noqa: F811 (the fixture)
) -> None:
    """A Close of another statement interrupts the read too; after the error and Sync,
    the portal (autocommit: closed at Sync) no longer exists; a fresh read starts over."""
    admin = connect(autocommit=True)
    written = _fill(admin, "small", rows=50, size=100)
    client = raw()
    client.send(_read_portal("p1", 10) + _execute("p1", 4)
                + m.message(b"C", b"Sother\0") + _execute("p1", 2) + SYNC)  # fmt: skip
    got = client.until_ready()
    kinds = [kind for kind, _ in got]
    assert kinds == [b"1", b"2", b"D", b"D", b"D", b"D", b"s", b"3", b"E", b"Z"]
    assert error_fields(got[-2][1])["C"] == "55000"
    client.send(_execute("p1", 0) + SYNC)
    got = client.until_ready()
    assert error_fields(got[0][1])["C"] == "34000"  # portal "p1" does not exist
    client.send(_read_portal("p3", 10) + _execute("p3", 0) + SYNC)  # s"p1" still exists
    got = client.until_ready()
    kinds = [kind for kind, _ in got]
    assert kinds.count(b"D") == 10 and b"E" not in kinds
    assert [bytes(body[6:]) for kind, body in got if kind == b"D"] == written[:10]
    assert committed(admin, "small") == 10
    assert binary_read(admin, "small", 5) == written[10:15]


def test_a_kept_literal_answer_between_a_reads_parts_interrupts_it_too(
    connect: Connect,
    raw,  # noqa: F811 (the fixture)
) -> None:
    """A literal SELECT whose row and response bytes are kept (run a few times before)
    still settles another portal's held read when it runs between the read's parts: its
    kept response bytes never skip the interruption (running the portal settles the held
    read; ``_send_kept_response`` also refuses while one is held)."""
    admin = connect(autocommit=True)
    written = _fill(admin, "small", rows=50, size=100)
    client = raw()
    prepare = m.message(b"P", m.cstr("s1") + m.cstr("SELECT 1") + NO_TYPES)
    run_s1 = (m.message(b"B", m.cstr("") + m.cstr("s1") + struct.pack("!hhh", 0, 0, 0))
              + _execute("", 0))  # fmt: skip
    client.send(prepare + SYNC)
    client.until_ready()
    for _ in range(4):  # the row and its response bytes are kept by now
        client.send(run_s1 + SYNC)
        assert [kind for kind, _ in client.until_ready()] == [b"2", b"D", b"C", b"Z"]
    client.send(_read_portal("p1", 10) + _execute("p1", 3) + run_s1 + _execute("p1", 0) + SYNC)
    got = client.until_ready()
    kinds = [kind for kind, _ in got]
    assert kinds == [b"1", b"2", b"D", b"D", b"D", b"s", b"2", b"D", b"C", b"E", b"Z"]
    assert error_fields(got[-2][1])["C"] == "55000"
    assert committed(admin, "small") is None  # nothing committed
    assert binary_read(admin, "small", 50) == written  # the same messages again, all of them
