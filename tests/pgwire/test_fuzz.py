"""Protocol fuzzing: hostile and broken clients against one real server.

Every case sends bytes no well-behaved client would (truncated packets, wrong lengths,
unknown message types, garbage before startup, absurd startup parameters, seeded random
streams, hypothesis-built message sequences, clients vanishing mid-message or
mid-statement) and then checks, with ``assert_healthy``, that:

- the server answered with an error and/or closed the socket, never hung (every socket
  read has a timeout, and a stream ends with a half-close so the server sees EOF);
- no answer was ``XX000`` (an internal error: a bug, not bad input);
- an ``observer`` psycopg session opened before the fuzzing, holding an open
  transaction, carries on and commits;
- a new psycopg session works, with parameters;
- the server has closed every fuzzing socket and session (its socket count, session
  table and open-transaction count return to the observer's own).

Random cases print their seed on failure (``random.Random(seed)`` replays them).
"""

from __future__ import annotations

import contextlib
import random
import socket
import struct
import time
from collections.abc import Iterator

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sql.pgwire.codec import messages as m
from sql.pgwire.server import ServerThread
from tests.pgwire.rawclient import RawClient, error_fields, query, startup_packet

FRONTEND_KINDS = b"QPBDECSHXdcfF"  # every frontend type, incl. COPY and FunctionCall
RANDOM_CASES = 60


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    running = ServerThread(str(tmp_path_factory.mktemp("fuzz") / "data"), "127.0.0.1", 0)
    yield running
    running.stop()


@pytest.fixture(scope="module")
def observer(fuzz_server: ServerThread) -> Iterator[psycopg.Connection]:
    """A session opened before the fuzzing that keeps a transaction open through it."""
    conn = psycopg.connect(host="127.0.0.1", port=fuzz_server.port, autocommit=True,
                           connect_timeout=10)  # fmt: skip
    conn.execute("CREATE TOPIC observed (CONSUMER watcher)")
    conn.execute("CREATE TOPIC quiet (CONSUMER watcher)")  # stays empty: reads long-poll
    conn.execute("CREATE TOPIC copied")  # broken COPYs must leave it empty
    conn.execute("CREATE TABLE kept (k INTEGER)")
    yield conn
    conn.close()


class Health:
    """The observer's transaction, written to across the cases and checked at each."""

    def __init__(self, server: ServerThread, observer: psycopg.Connection) -> None:
        self.server = server
        self.observer = observer
        self.rows = 0

    def check(self, label: str) -> None:
        self.observer.execute("BEGIN")
        self.observer.execute("INSERT INTO kept VALUES (%s)", [self.rows])
        self.observer.execute("INSERT INTO TOPIC observed (data) VALUES (%s)", [label.encode()])
        self.observer.execute("COMMIT")
        self.rows += 1
        assert self.observer.execute("SELECT count(*) FROM kept").fetchone() == (self.rows,)
        with psycopg.connect(host="127.0.0.1", port=self.server.port, autocommit=True,
                             connect_timeout=10) as fresh:  # fmt: skip
            got = fresh.execute("SELECT %s::INTEGER * 2, %s::BYTEA", [21, b"\x00ok"]).fetchone()
            assert got == (42, b"\x00ok"), label
        self._wait_until_clean(label)

    def _wait_until_clean(self, label: str) -> None:
        """Bounded wait for the server to close what the fuzzing client left."""
        pg = self.server.server
        for _ in range(1000):
            if pg.open_sockets == 1 and len(pg.connections) == 1:
                break
            time.sleep(0.01)
        assert pg.open_sockets == 1, f"{label}: {pg.open_sockets} sockets still open"
        assert len(pg.connections) == 1, f"{label}: sessions left: {list(pg.connections)}"
        assert self.server.database.open_transactions == 0, f"{label}: transaction left open"


@pytest.fixture(scope="module")
def health(fuzz_server: ServerThread, observer: psycopg.Connection) -> Health:
    return Health(fuzz_server, observer)


def exchange(port: int, data: bytes, *, started: bool = True) -> list[tuple[bytes, bytes]]:
    """Send ``data`` (after a valid startup if ``started``), half-close, read to the end."""
    client = RawClient(port)
    try:
        if started:
            client.start()
        client.try_send(data)
        with contextlib.suppress(OSError):  # the server may have closed first
            client.sock.shutdown(socket.SHUT_WR)
        return client.read_all()
    finally:
        client.close()


def assert_no_internal_error(items: list[tuple[bytes, bytes]], label: str) -> None:
    for kind, body in items:
        if kind == b"E":
            fields = error_fields(body)
            assert fields.get("C") != "XX000", f"{label}: internal error {fields}"


def fatal_sqlstates(items: list[tuple[bytes, bytes]]) -> list[str]:
    return [error_fields(b)["C"] for k, b in items if k == b"E"
            and error_fields(b)["S"] == "FATAL"]  # fmt: skip


# -- hand-written cases -----------------------------------------------------------------------
TRUNCATED = {
    "startup cut short": (False, struct.pack("!i", 100) + b"abc"),
    "startup length word cut": (False, b"\x00\x00"),
    "header cut short": (True, b"Q\x00\x00"),
    "body cut short": (True, b"Q" + struct.pack("!i", 50) + b"SELECT"),
    "parse cut short": (True, m.message(b"P", m.cstr("") + m.cstr("SELECT 1"))[:-3]),
    "bind then gone": (
        True,
        m.message(b"P", m.cstr("") + m.cstr("SELECT $1") + b"\0\0")
        + m.message(b"B", b"\0\0\0\0\0\1\0\0\0\5ab"),
    ),
}


@pytest.mark.parametrize("name", list(TRUNCATED))
def test_truncated(fuzz_server: ServerThread, health: Health, name: str) -> None:
    started, data = TRUNCATED[name]
    got = exchange(fuzz_server.port, data, started=started)
    assert_no_internal_error(got, name)
    health.check(name)


LENGTHS = {
    "negative": (-1, "08P01"),
    "most negative": (-(1 << 31), "08P01"),
    "zero": (0, "08P01"),
    "less than itself": (3, "08P01"),
    "over 1 GiB": ((1 << 31) - 1, "08P01"),
    "over the message limit": (200 * 1024 * 1024, "54000"),
}


@pytest.mark.parametrize("name", list(LENGTHS))
@pytest.mark.parametrize("kind", [b"Q", b"P", b"B", b"d"])
def test_wrong_lengths(fuzz_server: ServerThread, health: Health, name: str,
                       kind: bytes) -> None:  # fmt: skip
    length, sqlstate = LENGTHS[name]
    got = exchange(fuzz_server.port, kind + struct.pack("!i", length) + b"tail")
    assert fatal_sqlstates(got) == [sqlstate], got
    health.check(f"{name} {kind!r}")


@pytest.mark.parametrize("kind", [b"?", b"\x00", b"\xff", b"A", b"Z", b"R", b"p"])
def test_unknown_message_types(fuzz_server: ServerThread, health: Health, kind: bytes) -> None:
    got = exchange(fuzz_server.port, m.message(kind, b"xyz") + query("SELECT 1"))
    assert fatal_sqlstates(got) == ["08P01"], got
    assert b"D" not in [k for k, _ in got], "nothing after a fatal error may run"
    health.check(f"type {kind!r}")


GARBAGE = {
    "http": b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
    "tls hello": bytes.fromhex("16030100a5010000a10303") + b"\0" * 40,
    "zeros": b"\0" * 64,
    "ones": b"\xff" * 64,
    "old protocol 2": struct.pack("!ii", 296, 2 << 16) + b"\0" * 288,
    "query before startup": query("SELECT 1"),
    "huge startup length": struct.pack("!i", 1 << 30) + b"xxxx",
}


@pytest.mark.parametrize("name", list(GARBAGE))
def test_garbage_before_startup(fuzz_server: ServerThread, health: Health, name: str) -> None:
    got = exchange(fuzz_server.port, GARBAGE[name], started=False)
    assert_no_internal_error(got, name)
    assert len(fatal_sqlstates(got)) <= 1
    health.check(name)


def _raw_startup(body: bytes) -> bytes:
    body = struct.pack("!i", m.PROTOCOL_V3) + body
    return struct.pack("!i", len(body) + 4) + body


ABSURD_STARTUPS = {
    "long value": startup_packet(application_name="a" * 9000),
    "over the startup limit": startup_packet(application_name="a" * 20_000),
    "many parameters": startup_packet(**{f"p{i}": "v" for i in range(600)}),
    "no user": _raw_startup(b"database\0x\0\0"),
    "empty user": startup_packet(user=""),
    "unterminated list": _raw_startup(b"user\0tester\0"),
    "unterminated value": _raw_startup(b"user\0tes"),
    "invalid utf-8": _raw_startup(b"user\0\xff\xfe\0\0"),
    "odd names": startup_packet(
        **{
            "options": "-c search_path=x",
            "replication": "true",
            "\x01": "\x02",
            "database": "../../etc",
        }
    ),
    "cancel of nobody": struct.pack("!iiii", 16, m.CANCEL_REQUEST, 424242, 1),
    "cancel cut short": struct.pack("!iii", 12, m.CANCEL_REQUEST, 1),
    "ssl then garbage": struct.pack("!ii", 8, m.SSL_REQUEST) + b"\x16\x03\x01garbage",
}


@pytest.mark.parametrize("name", list(ABSURD_STARTUPS))
def test_absurd_startup(fuzz_server: ServerThread, health: Health, name: str) -> None:
    client = RawClient(fuzz_server.port)
    try:
        client.try_send(ABSURD_STARTUPS[name]) and client.try_send(query("SELECT 1"))
        with contextlib.suppress(OSError):  # the server may have closed first
            client.sock.shutdown(socket.SHUT_WR)
        raw = client.sock.recv(1) if name == "ssl then garbage" else b""
        assert raw in (b"", b"N", b"S")
        got = client.read_all()
    finally:
        client.close()
    assert_no_internal_error(got, name)
    kinds = [k for k, _ in got]
    # Either refused with one error (08P01, 28000, ...) or started and answered the query.
    assert kinds.count(b"E") <= 1 or b"Z" in kinds, got
    health.check(name)


def test_client_vanishes_during_a_long_poll(fuzz_server: ServerThread, health: Health) -> None:
    client = RawClient(fuzz_server.port)
    client.start()
    client.send(query("BEGIN; SELECT data FROM TOPIC quiet WITH (consumer = 'watcher', "
                      "wait = Interval('PT2S'))"))  # fmt: skip
    client.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    client.close()  # a reset while the statement runs; its transaction must be rolled back
    health.check("vanished during a long poll")


def test_client_vanishes_mid_transaction(fuzz_server: ServerThread, health: Health) -> None:
    client = RawClient(fuzz_server.port)
    client.start()
    client.send(query("BEGIN; INSERT INTO kept VALUES (-1)"))
    client.until_ready()
    client.send(query("INSERT INTO TOPIC observed (data) VALUES ('never')")[:-4])
    client.close()
    health.check("vanished mid-transaction")
    rows = health.observer.execute("SELECT count(*) FROM kept WHERE k = -1").fetchone()
    assert rows == (0,), "the vanished client's transaction must not commit"


# -- broken COPY FROM STDIN ---------------------------------------------------------------------
COPY_IN = query("COPY TOPIC copied (data) FROM STDIN")
BROKEN_COPIES = {
    "unknown type": (m.message(b"d", b"one\n") + m.message(b"?", b"x"), "08P01", False),
    "negative length": (m.message(b"d", b"one\n") + b"d" + struct.pack("!i", -7), "08P01", True),
    "over the message limit": (
        b"d" + struct.pack("!i", 100 * 1024 * 1024) + b"xx",
        "54000",
        True,
    ),
    "vanished mid-data": (
        m.message(b"d", b"one\n") + b"d" + struct.pack("!i", 500) + b"tw",
        None,
        True,
    ),
    "random bytes": (random.Random(7).randbytes(300), None, None),
}


@pytest.mark.parametrize("name", list(BROKEN_COPIES))
def test_broken_copy_in_writes_nothing(fuzz_server: ServerThread, health: Health,
                                       name: str) -> None:  # fmt: skip
    data, sqlstate, fatal = BROKEN_COPIES[name]
    got = exchange(fuzz_server.port, COPY_IN + data)
    assert got and got[0][0] == b"G", got  # CopyInResponse came first
    assert_no_internal_error(got, name)
    found = [error_fields(b) for k, b in got if k == b"E"]
    if sqlstate is not None:
        assert [f["C"] for f in found] == [sqlstate], got
        assert (found[0]["S"] == "FATAL") is fatal, got
    health.check(f"COPY {name}")
    count = health.observer.execute(
        "SELECT count(*) FROM TOPIC copied WITH (max_messages = 100000)"
    ).fetchone()
    assert count == (0,), f"{name}: a broken COPY wrote messages"


# -- seeded random streams ----------------------------------------------------------------------
def _valid_messages(rng: random.Random) -> list[bytes]:
    """A short valid conversation to mutate."""
    return [
        query(rng.choice(["SELECT 1", "BEGIN", "COMMIT", "SHOW TOPICS", "SELECT 'x' || 1"])),
        m.message(b"P", m.cstr("s") + m.cstr("SELECT $1::INTEGER") + struct.pack("!hi", 1, 23)),
        m.message(
            b"B",
            m.cstr("")
            + m.cstr("s")
            + struct.pack("!hhhi", 1, 1, 1, 4)
            + struct.pack("!i", rng.randrange(1 << 31))
            + struct.pack("!hh", 1, 0),
        ),
        m.message(b"D", b"P\0"),
        m.message(b"E", b"\0" + struct.pack("!i", rng.randrange(-2, 3))),
        m.message(b"C", b"S" + m.cstr("s")),
        m.message(b"H"),
        m.message(b"S"),
    ]


def _random_stream(rng: random.Random) -> bytes:
    parts: list[bytes] = []
    for _ in range(rng.randrange(1, 8)):
        choice = rng.random()
        if choice < 0.35:  # a valid message with bytes flipped (framing mostly intact)
            message = bytearray(rng.choice(_valid_messages(rng)))
            for _ in range(rng.randrange(1, 4)):
                message[rng.randrange(len(message))] = rng.randrange(256)
            parts.append(bytes(message))
        elif choice < 0.65:  # a known type with a random body, correctly framed
            kind = FRONTEND_KINDS[rng.randrange(len(FRONTEND_KINDS))]
            parts.append(m.message(bytes([kind]), rng.randbytes(rng.randrange(0, 64))))
        elif choice < 0.8:
            parts.append(rng.choice(_valid_messages(rng)))
        else:  # plain random bytes
            parts.append(rng.randbytes(rng.randrange(1, 128)))
    return b"".join(parts)


def test_random_streams(fuzz_server: ServerThread, health: Health) -> None:
    for seed in range(RANDOM_CASES):
        rng = random.Random(seed)
        started = rng.random() < 0.9
        stream = _random_stream(rng)
        try:
            got = exchange(fuzz_server.port, stream, started=started)
        except TimeoutError as error:
            raise AssertionError(f"seed {seed}: the server hung on {stream!r}") from error
        assert_no_internal_error(got, f"seed {seed} ({stream!r})")
        if seed % 10 == 9:
            health.check(f"seed {seed}")
    health.check("after the random streams")


# -- hypothesis: framed message sequences -------------------------------------------------------
framed = st.tuples(st.sampled_from(list(FRONTEND_KINDS)), st.binary(max_size=48)).map(
    lambda item: m.message(bytes([item[0]]), item[1])
)


@settings(max_examples=80, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
@given(messages=st.lists(framed, min_size=1, max_size=6))
def test_hypothesis_message_sequences(fuzz_server: ServerThread, health: Health,
                                      messages: list[bytes]) -> None:  # fmt: skip
    got = exchange(fuzz_server.port, b"".join(messages))
    assert_no_internal_error(got, repr(messages))


def test_healthy_after_hypothesis(health: Health) -> None:
    health.check("after hypothesis")
    observed = health.observer.execute(
        "SELECT count(*) FROM TOPIC observed WITH (max_messages = 100000)"
    ).fetchone()
    assert observed == (health.rows,)
