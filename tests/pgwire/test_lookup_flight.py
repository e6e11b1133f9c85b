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
from pathlib import Path
from typing import Any

import pytest

from sql.pgwire.codec import messages as m
from sql.pgwire.connection import lookup_flight, output
from sql.pgwire.limits import ServerLimits
from tests.key_lookup_spy import served_lookups
from tests.pgwire import flights
from tests.pgwire.rawclient import (
    FlightClient,
    error_fields,
    flight,
    parse,
    sync,
)

INT8 = 20
RESULT_BYTES_MAX = 100_000  # the servers' result limit: key 500's row is over it (54000)
LIMITS = ServerLimits(result_bytes_max=RESULT_BYTES_MAX)


def _transcript(port: int) -> list[list[tuple[bytes, bytes]]]:
    """Every reply of the transcript (messages but BackendKeyData, which differs)."""
    admin, bob = FlightClient(port), FlightClient(port)
    try:
        admin.login("alice")
        bob.login("bob")
        admin.sql("CREATE TABLE kv (k BIGINT PRIMARY KEY, v VARCHAR, n DOUBLE)")
        admin.sql("INSERT INTO kv SELECT i, 'value ' || i, CASE WHEN i % 3 = 0 THEN NULL "
                  "ELSE i * 1.5 END FROM range(100) t(i)")  # fmt: skip
        admin.sql("INSERT INTO kv VALUES (500, repeat('x', 300000), 1)")  # over the limit
        admin.sql("GRANT SELECT ON kv TO bob")
        replies = [
            bob.ask(parse("s1", "SELECT v, n FROM kv WHERE k = $1", [0]) + sync()),
            bob.ask(parse("s2", "SELECT n AS x, k, v FROM kv WHERE k = $1", [INT8]) + sync()),
            bob.ask(parse("s3", "SELECT v FROM kv WHERE k = $1", [0])
                    + m.message(b"D", b"Ss3\x00") + sync()),
        ]
        lookups = [
            flight("s1", [b"1"]), flight("s1", [b"2"]), flight("s1", [b"3"]),  # NULL n
            flight("s1", [b"1000"]),  # missing
            flight("s1", [b"4"], results=[1]), flight("s1", [b"5"], results=[0, 1]),
            flight("s2", [struct.pack("!q", 7)], formats=[1]),
            flight("s2", [struct.pack("!q", 6)], formats=[1], results=[1]),
            flight("s2", [b"8"]), flight("s3", [b"9"]), flight("s3", [b"10"], results=[1]),
            flight("s1", [b"abc"]), flight("s1", [b"1.5"]), flight("s1", [None]),
            flight("s1", [b"99999999999999999999"]), flight("s2", [b"\x00\x01"], formats=[1]),
            flight("s1", [b"11"]), flight("s1", [b"500"]), flight("s3", [b"500"]),
        ]
        for _ in range(2):
            replies += [bob.ask(flight) for flight in lookups]
        # The unnamed portal a flight bound is dropped at its Sync: a Describe of it is 34000.
        bob.send(flight("s1", [b"20"]) + m.message(b"D", b"P\x00") + sync())
        replies += [bob.until_ready(), bob.until_ready()]  # two Syncs: two ReadyForQuery
        # Statement logging (superusers set it) logs flight-answered lookups as any other.
        replies.append(admin.ask(parse("a1", "SELECT v FROM kv WHERE k = $1", [0]) + sync()))
        replies += [admin.ask(flight("a1", [b"21"])) for _ in range(3)]
        admin.sql("SET log_statement = 'all'")
        replies += [admin.ask(flight("a1", [b"22"])) for _ in range(2)]
        admin.sql("SET log_statement = 'none'")
        admin.sql("REVOKE SELECT ON kv FROM bob")
        replies += [bob.ask(flight("s1", [b"12"])), bob.ask(flight("s3", [b"12"]))]
        admin.sql("GRANT SELECT ON kv TO bob")
        replies += [bob.ask(flight("s1", [b"13"])) for _ in range(2)]
        replies.append(bob.ask(m.message(b"Q", m.cstr("BEGIN"))))
        replies += [bob.ask(flight("s1", [b"14"])), bob.ask(flight("s1", [b"x"])),
                    bob.ask(m.message(b"Q", m.cstr("SELECT * FROM no_such_table")))]
        replies += [bob.ask(flight("s1", [b"15"])), bob.ask(m.message(b"Q", m.cstr("ROLLBACK")))]
        replies += [bob.ask(flight("s1", [b"16"])) for _ in range(2)]
        bob.sql("SET statement_timeout = 5000")  # the ordinary way runs (its timer)
        replies += [bob.ask(flight("s1", [b"18"])) for _ in range(2)]
        bob.sql("RESET statement_timeout")
        replies.append(bob.ask(flight("s1", [b"19"])))
        admin.sql("DROP TABLE kv")
        replies += [bob.ask(flight("s1", [b"17"])), bob.ask(flight("s2", [b"17"]))]
        admin.sql("CREATE TABLE kv (k BIGINT PRIMARY KEY, v VARCHAR, n DOUBLE)")
        replies += [bob.ask(flight("s1", [b"17"])), bob.ask(flight("s1", [b"17"]))]
        return flights.without_key_data(replies)
    finally:
        admin.close()
        bob.close()


@pytest.fixture
def users(tmp_path: Path) -> str:
    return flights.users_file(tmp_path)


def _logged_lookups(caplog: pytest.LogCaptureFixture) -> int:
    """How many statements the servers logged that are the lookup ``a1``'s text."""
    return flights.logged(caplog, "SELECT v FROM kv WHERE k = $1")


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
    for server in flights.served(tmp_path, users, "flight", LIMITS):
        with_flights = _transcript(server.port)
    taken = answered.count(True)
    logged_with_flights = _logged_lookups(caplog)
    caplog.clear()
    monkeypatch.setattr(lookup_flight, "answer", lambda connection, body: False)
    for server in flights.served(tmp_path, users, "general", LIMITS):
        general = _transcript(server.port)
    assert logged_with_flights == _logged_lookups(caplog) >= 2  # the two under 'all'
    assert len(with_flights) == len(general)
    for index, (replied, ordinary) in enumerate(zip(with_flights, general, strict=True)):
        assert replied == ordinary, index
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
    for server in flights.served(tmp_path, users, "wide", LIMITS):
        client = FlightClient(server.port)
        try:
            client.login("alice")
            client.sql(f"CREATE TABLE wide (k BIGINT PRIMARY KEY, {columns})")
            client.sql("INSERT INTO wide (k) SELECT i FROM range(10) t(i)")
            client.ask(parse("w", "SELECT * FROM wide WHERE k = $1", [0]) + sync())
            for key in range(5):
                reply = client.ask(flight("w", [str(key).encode()]))
                rows = [body for kind, body in reply if kind == b"D"]
                assert len(rows) == 1 and struct.unpack_from("!H", rows[0])[0] == width
        finally:
            client.close()
    # the first run (not yet known as a lookup), the second flight's two runs, then one each
    assert len(served) == 1 + 2 + 3, served
