"""A kept lookup's flight answered in one function (``connection.lookup_flight``) sends the
bytes the message loop's own handling sends: the same transcript of raw flights runs
against a server with the flight path and one without it, and every reply is compared
byte for byte (found and missing rows, a NULL column, text and binary results, a binary
parameter, wrong and NULL parameters, a REVOKE and a GRANT between lookups, a DROP TABLE,
a transaction block and a failed one, a ``statement_timeout``, a described statement, a row
over the server's result limit, statement logging, a Describe of the portal a flight's Sync
dropped)."""

from __future__ import annotations

import logging
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sql.pgwire.codec import messages as m
from sql.pgwire.connection import lookup_flight, output
from sql.pgwire.limits import ServerLimits
from sql.pgwire.server import ServerThread
from sql.pgwire.users import add_user
from tests.key_lookup_spy import served_lookups
from tests.pgwire.rawclient import RawClient, error_fields, startup_packet

INT8 = 20
RESULT_BYTES_MAX = 100_000  # the servers' result limit: key 500's row is over it (54000)


def _parse(name: str, text: str, oids: list[int]) -> bytes:
    body = m.cstr(name) + m.cstr(text) + struct.pack("!H", len(oids))
    return m.message(b"P", body + b"".join(struct.pack("!I", oid) for oid in oids))


def _flight(statement: str, values: list[bytes | None], formats: list[int] = (),
            results: list[int] = ()) -> bytes:  # fmt: skip
    """Bind (unnamed portal) / Describe / Execute / Sync, as psycopg sends a prepared one."""
    body = m.cstr("") + m.cstr(statement) + struct.pack("!H", len(formats))
    body += b"".join(struct.pack("!h", f) for f in formats) + struct.pack("!H", len(values))
    for value in values:
        body += struct.pack("!i", -1) if value is None else struct.pack("!i", len(value)) + value
    body += struct.pack("!H", len(results)) + b"".join(struct.pack("!h", f) for f in results)
    return m.message(b"B", body) + lookup_flight.FLIGHT_TAIL


def _sync() -> bytes:
    return m.message(b"S", b"")


class _Client(RawClient):
    def login(self, user: str) -> None:
        self.send(startup_packet(user=user, database="topicbase"))
        assert self.read() == (b"R", struct.pack("!i", 3))
        self.send(m.message(b"p", m.cstr(f"{user}-pw")))
        self.until_ready()

    def ask(self, data: bytes) -> list[tuple[bytes, bytes]]:
        self.send(data)
        return self.until_ready()

    def sql(self, text: str) -> None:
        replies = self.ask(m.message(b"Q", m.cstr(text)))
        assert not [body for kind, body in replies if kind == b"E"], replies


def _transcript(port: int) -> list[list[tuple[bytes, bytes]]]:
    """Every reply of the transcript (messages but BackendKeyData, which differs)."""
    admin, bob = _Client(port), _Client(port)
    try:
        admin.login("alice")
        bob.login("bob")
        admin.sql("CREATE TABLE kv (k BIGINT PRIMARY KEY, v VARCHAR, n DOUBLE)")
        admin.sql("INSERT INTO kv SELECT i, 'value ' || i, CASE WHEN i % 3 = 0 THEN NULL "
                  "ELSE i * 1.5 END FROM range(100) t(i)")  # fmt: skip
        admin.sql("INSERT INTO kv VALUES (500, repeat('x', 300000), 1)")  # over the limit
        admin.sql("GRANT SELECT ON kv TO bob")
        replies = [
            bob.ask(_parse("s1", "SELECT v, n FROM kv WHERE k = $1", [0]) + _sync()),
            bob.ask(_parse("s2", "SELECT n AS x, k, v FROM kv WHERE k = $1", [INT8]) + _sync()),
            bob.ask(_parse("s3", "SELECT v FROM kv WHERE k = $1", [0])
                    + m.message(b"D", b"Ss3\x00") + _sync()),
        ]
        lookups = [
            _flight("s1", [b"1"]), _flight("s1", [b"2"]), _flight("s1", [b"3"]),  # NULL n
            _flight("s1", [b"1000"]),  # missing
            _flight("s1", [b"4"], results=[1]), _flight("s1", [b"5"], results=[0, 1]),
            _flight("s2", [struct.pack("!q", 7)], formats=[1]),
            _flight("s2", [struct.pack("!q", 6)], formats=[1], results=[1]),
            _flight("s2", [b"8"]), _flight("s3", [b"9"]), _flight("s3", [b"10"], results=[1]),
            _flight("s1", [b"abc"]), _flight("s1", [b"1.5"]), _flight("s1", [None]),
            _flight("s1", [b"99999999999999999999"]), _flight("s2", [b"\x00\x01"], formats=[1]),
            _flight("s1", [b"11"]), _flight("s1", [b"500"]), _flight("s3", [b"500"]),
        ]
        for _ in range(2):
            replies += [bob.ask(flight) for flight in lookups]
        # The unnamed portal a flight bound is dropped at its Sync: a Describe of it is 34000.
        bob.send(_flight("s1", [b"20"]) + m.message(b"D", b"P\x00") + _sync())
        replies += [bob.until_ready(), bob.until_ready()]  # two Syncs: two ReadyForQuery
        # Statement logging (superusers set it) logs flight-answered lookups as any other.
        replies.append(admin.ask(_parse("a1", "SELECT v FROM kv WHERE k = $1", [0]) + _sync()))
        replies += [admin.ask(_flight("a1", [b"21"])) for _ in range(3)]
        admin.sql("SET log_statement = 'all'")
        replies += [admin.ask(_flight("a1", [b"22"])) for _ in range(2)]
        admin.sql("SET log_statement = 'none'")
        admin.sql("REVOKE SELECT ON kv FROM bob")
        replies += [bob.ask(_flight("s1", [b"12"])), bob.ask(_flight("s3", [b"12"]))]
        admin.sql("GRANT SELECT ON kv TO bob")
        replies += [bob.ask(_flight("s1", [b"13"])) for _ in range(2)]
        replies.append(bob.ask(m.message(b"Q", m.cstr("BEGIN"))))
        replies += [bob.ask(_flight("s1", [b"14"])), bob.ask(_flight("s1", [b"x"])),
                    bob.ask(m.message(b"Q", m.cstr("SELECT * FROM no_such_table")))]
        replies += [bob.ask(_flight("s1", [b"15"])), bob.ask(m.message(b"Q", m.cstr("ROLLBACK")))]
        replies += [bob.ask(_flight("s1", [b"16"])) for _ in range(2)]
        bob.sql("SET statement_timeout = 5000")  # the ordinary way runs (its timer)
        replies += [bob.ask(_flight("s1", [b"18"])) for _ in range(2)]
        bob.sql("RESET statement_timeout")
        replies.append(bob.ask(_flight("s1", [b"19"])))
        admin.sql("DROP TABLE kv")
        replies += [bob.ask(_flight("s1", [b"17"])), bob.ask(_flight("s2", [b"17"]))]
        admin.sql("CREATE TABLE kv (k BIGINT PRIMARY KEY, v VARCHAR, n DOUBLE)")
        replies += [bob.ask(_flight("s1", [b"17"])), bob.ask(_flight("s1", [b"17"]))]
        return [[r for r in reply if r[0] != b"K"] for reply in replies]
    finally:
        admin.close()
        bob.close()


@pytest.fixture
def users(tmp_path: Path) -> str:
    users_file = str(tmp_path / "users.json")
    add_user(users_file, "alice", "alice-pw", superuser=True)
    add_user(users_file, "bob", "bob-pw")
    return users_file


def _served(tmp_path: Path, users_file: str, name: str) -> Iterator[ServerThread]:
    limits = ServerLimits(result_bytes_max=RESULT_BYTES_MAX)
    server = ServerThread(str(tmp_path / name), "127.0.0.1", 0, limits, auth="password",
                          users_file=users_file)  # fmt: skip
    try:
        yield server
    finally:
        server.stop()


def _logged_lookups(caplog: pytest.LogCaptureFixture) -> int:
    """How many statements the servers logged that are the lookup ``a1``'s text."""
    return sum("SELECT v FROM kv WHERE k = $1" in record.getMessage() for record in caplog.records)


def test_a_flight_answered_whole_sends_the_general_paths_bytes(
    tmp_path: Path, users: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    served_lookups(monkeypatch)
    caplog.set_level(logging.INFO)
    answered: list[bool] = []
    original = lookup_flight.answer

    def counted(connection: Any, body: bytes) -> bool:
        taken = original(connection, body)
        answered.append(taken)
        return taken

    monkeypatch.setattr(lookup_flight, "answer", counted)
    for server in _served(tmp_path, users, "flight"):
        with_flights = _transcript(server.port)
    taken = answered.count(True)
    logged_with_flights = _logged_lookups(caplog)
    caplog.clear()
    monkeypatch.setattr(lookup_flight, "answer", lambda connection, body: False)
    for server in _served(tmp_path, users, "general"):
        general = _transcript(server.port)
    assert logged_with_flights == _logged_lookups(caplog) >= 2  # the two under 'all'
    assert len(with_flights) == len(general)
    for index, (flight, ordinary) in enumerate(zip(with_flights, general, strict=True)):
        assert flight == ordinary, index
    # The flight path answered the lookups it could (found, missing, NULL, both formats,
    # binary parameters, a described statement) and left the rest to the message loop.
    assert taken >= 20, answered
    assert answered.count(False) >= 10, answered
    errors = {error_fields(body)["C"] for reply in general for kind, body in reply
              if kind == b"E"}  # fmt: skip
    assert {"22P02", "42501", "25P02", "42P01", "54000", "34000"} <= errors, errors


def test_a_row_too_wide_for_a_flight_is_not_looked_up_twice_again(
    tmp_path: Path, users: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lookup whose row has more values than a flight answers runs once in the flight,
    is declined and runs again on the message loop; from then on its flights go to the
    message loop at once: one engine lookup each (review R1 round 16, 3.2)."""
    served = served_lookups(monkeypatch)
    width = output.INLINE_VALUES + 7
    columns = ", ".join(f"c{i} INTEGER" for i in range(width - 1))
    for server in _served(tmp_path, users, "wide"):
        client = _Client(server.port)
        try:
            client.login("alice")
            client.sql(f"CREATE TABLE wide (k BIGINT PRIMARY KEY, {columns})")
            client.sql("INSERT INTO wide (k) SELECT i FROM range(10) t(i)")
            client.ask(_parse("w", "SELECT * FROM wide WHERE k = $1", [0]) + _sync())
            for key in range(5):
                reply = client.ask(_flight("w", [str(key).encode()]))
                rows = [body for kind, body in reply if kind == b"D"]
                assert len(rows) == 1 and struct.unpack_from("!H", rows[0])[0] == width
        finally:
            client.close()
    # the first run (not yet known as a lookup), the second flight's two runs, then one each
    assert len(served) == 1 + 2 + 3, served
