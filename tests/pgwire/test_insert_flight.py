"""An ``INSERT INTO TOPIC ... VALUES`` flight answered in one function
(``connection.insert_flight``) sends the bytes the message loop's own handling sends and
stores the same messages: one transcript of raw flights runs against a server with the
flight path and one without it, and every reply is compared byte for byte (binary, text
and untyped parameters, a described statement, producer ids with a duplicate, two rows,
no parameter, RETURNING, a NULL, a wrong parameter count, a bad UTF-8 text, a missing
topic, a REVOKE and a GRANT between flights, a transaction block and a failed one, a
``statement_timeout``, statement logging, a Describe of the portal a flight's Sync
dropped, the topic dropped and made again); the transcript ends by reading the topic
back. A flight's acknowledgement waits for the sync of its message."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import pytest

from engine.session import Session
from sql.pgwire.codec import messages as m
from sql.pgwire.connection import insert_flight
from storage import fs as storage_fs
from storage.errors import TopicbaseError
from tests.pgwire import flights
from tests.pgwire.rawclient import (
    FlightClient,
    error_fields,
    flight,
    parse,
    sync,
)

BYTEA = 17
TEXT = 25


INSERT = "INSERT INTO TOPIC t (data) VALUES ($1)"
KEYED = "INSERT INTO TOPIC t (data, producer_id, seq_no) VALUES ($1, $2, $3)"
TWO_ROWS = "INSERT INTO TOPIC t (data) VALUES ($1), ($2)"


def _transcript(port: int) -> list[list[tuple[bytes, bytes]]]:
    """Every reply of the transcript (messages but BackendKeyData, which differs)."""
    admin, bob = FlightClient(port), FlightClient(port)
    try:
        admin.login("alice")
        bob.login("bob")
        admin.sql("CREATE TOPIC t WITH (min_active_partitions = 1)")
        admin.sql("GRANT INSERT ON TOPIC t TO bob")
        replies = [
            bob.ask(parse("i1", INSERT, [BYTEA]) + sync()),
            bob.ask(parse("i2", INSERT, [0]) + m.message(b"D", b"Si2\x00") + sync()),
            bob.ask(parse("i3", KEYED, [0, 0, 0]) + sync()),
            bob.ask(parse("i4", INSERT + " RETURNING offset", [0]) + sync()),
            bob.ask(parse("i5", TWO_ROWS, [0, 0]) + sync()),
            bob.ask(parse("i6", "INSERT INTO TOPIC nosuch (data) VALUES ($1)", [0]) + sync()),
            bob.ask(parse("i7", "INSERT INTO TOPIC t (data) VALUES ('literal')", []) + sync()),
            bob.ask(parse("i8", INSERT, [TEXT]) + sync()),
        ]
        sent = [
            flight("i1", [b"\x00\x01binary"], [1]), flight("i1", [b"\\x4142"]),
            flight("i2", [b"described"]), flight("i8", ["t\u00e9xt".encode()]),
            flight("i3", [b"m", b"p1", b"1"]), flight("i3", [b"m", b"p1", b"1"]),  # duplicate
            flight("i4", [b"returning"]), flight("i5", [b"one", b"two"]),
            flight("i6", [b"nowhere"]), flight("i7", []),
            flight("i1", [None], [1]), flight("i8", [None]),  # NULL data
            flight("i1", [b"a", b"b"], [1]),  # wrong parameter count
            flight("i8", [b"\xed\xa0\x80"]),  # not UTF-8
            flight("nosuch", [b"x"]),
        ]
        for _ in range(2):
            replies += [bob.ask(flight) for flight in sent]
        # The unnamed portal a flight bound is dropped at its Sync: a Describe of it is 34000.
        bob.send(flight("i1", [b"dropped"], [1]) + m.message(b"D", b"P\x00") + sync())
        replies += [bob.until_ready(), bob.until_ready()]
        admin.sql("REVOKE INSERT ON TOPIC t FROM bob")
        replies += [bob.ask(flight("i1", [b"refused"], [1])), bob.ask(flight("i2", [b"no"]))]
        admin.sql("GRANT INSERT ON TOPIC t TO bob")
        replies += [bob.ask(flight("i1", [b"granted"], [1])) for _ in range(2)]
        replies.append(bob.ask(m.message(b"Q", m.cstr("BEGIN"))))
        replies += [bob.ask(flight("i1", [b"in a block"], [1])),
                    bob.ask(m.message(b"Q", m.cstr("SELECT * FROM no_such_table"))),
                    bob.ask(flight("i1", [b"failed block"], [1])),
                    bob.ask(m.message(b"Q", m.cstr("ROLLBACK")))]  # fmt: skip
        bob.sql("SET statement_timeout = 5000")
        replies += [bob.ask(flight("i1", [b"timed"], [1])) for _ in range(2)]
        bob.sql("RESET statement_timeout")
        replies.append(admin.ask(parse("a1", INSERT, [BYTEA]) + sync()))
        admin.sql("SET log_statement = 'all'")
        replies += [admin.ask(flight("a1", [b"logged"], [1])) for _ in range(2)]
        admin.sql("SET log_statement = 'none'")
        # A kept decision is the identity's: after SET ROLE to a role without the grant
        # the same prepared statement is refused, after RESET ROLE it runs again.
        admin.sql("REVOKE INSERT ON TOPIC t FROM bob")
        admin.sql("SET ROLE bob")
        replies += [admin.ask(flight("a1", [b"as bob"], [1])) for _ in range(2)]
        admin.sql("RESET ROLE")
        replies += [admin.ask(flight("a1", [b"as alice"], [1])) for _ in range(2)]
        admin.sql("GRANT INSERT ON TOPIC t TO bob")
        replies.append(admin.ask(m.message(b"Q", m.cstr("SELECT data FROM TOPIC t"))))
        admin.sql("DROP TOPIC t")
        replies += [bob.ask(flight("i1", [b"dropped topic"], [1])), bob.ask(flight("i7", []))]
        admin.sql("CREATE TOPIC t WITH (min_active_partitions = 1)")
        admin.sql("GRANT INSERT ON TOPIC t TO bob")
        replies += [bob.ask(flight("i1", [b"again"], [1])) for _ in range(2)]
        replies.append(admin.ask(m.message(b"Q", m.cstr("SELECT data FROM TOPIC t"))))
        return flights.without_key_data(replies)
    finally:
        admin.close()
        bob.close()


@pytest.fixture
def users(tmp_path: Path) -> str:
    return flights.users_file(tmp_path)


def _logged(caplog: pytest.LogCaptureFixture) -> int:
    return flights.logged(caplog, "statement (user alice", INSERT)


def _counted(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    answered: list[bool] = []
    original = insert_flight.answer

    def counted(connection: Any, body: bytes) -> bool:
        taken = original(connection, body)
        answered.append(taken)
        return taken

    monkeypatch.setattr(insert_flight, "answer", counted)
    return answered


def _kept_way(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """What each ``Session.append_prepared`` call did: "ran", "none" (left to the
    ordinary path) or the SQLSTATE it raised."""
    outcomes: list[str] = []
    original = Session.append_prepared

    def recorded(session: Session, statement: Any, parameters: Any) -> Any:
        try:
            result = original(session, statement, parameters)
        except TopicbaseError as error:
            outcomes.append(error.sqlstate)
            raise
        outcomes.append("none" if result is None else "ran")
        return result

    monkeypatch.setattr(Session, "append_prepared", recorded)
    return outcomes


def test_an_insert_flight_answered_whole_sends_the_general_paths_bytes(
    tmp_path: Path, users: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The flight path (with the engine's kept way for a prepared INSERT of plain rows,
    ``Session.append_prepared``: round 29) against the message loop's own handling."""
    caplog.set_level(logging.INFO)
    answered = _counted(monkeypatch)
    kept_way = _kept_way(monkeypatch)
    for server in flights.served(tmp_path, users, "flight"):
        with_flights = _transcript(server.port)
    logged_with_flights = _logged(caplog)
    caplog.clear()
    monkeypatch.setattr(insert_flight, "answer", lambda connection, body: False)
    for server in flights.served(tmp_path, users, "general"):
        general = _transcript(server.port)
    assert logged_with_flights == _logged(caplog) == 2  # the two under 'all'
    assert len(with_flights) == len(general)
    for index, (replied, ordinary) in enumerate(zip(with_flights, general, strict=True)):
        assert replied == ordinary, index
    # The flight path answered the INSERTs it could (binary, text, untyped, described,
    # keyed, two rows, no parameter, errors of the statement) and left the rest (RETURNING,
    # Bind errors, blocks) to the message loop.
    assert answered.count(True) >= 30, answered
    assert answered.count(False) >= 10, answered
    # The kept way ran the repeated plain INSERTs, and its door refused what the general
    # path refuses (after the REVOKE, and as bob by SET ROLE) with the same bytes (above).
    assert kept_way.count("ran") >= 12, kept_way
    assert kept_way.count("42501") >= 3, kept_way
    errors = {error_fields(body)["C"] for reply in general for kind, body in reply
              if kind == b"E"}  # fmt: skip
    assert {"42501", "25P02", "42P01", "34000", "08P01"} <= errors, errors
    tags = [body for reply in general for kind, body in reply if kind == b"C"]
    assert b"INSERT 0 0\x00" in tags and b"INSERT 0 2\x00" in tags, tags
    read_back = [body for kind, body in general[-1] if kind == b"D"]
    assert len(read_back) == 2


def test_a_flights_acknowledgement_waits_for_its_sync(
    tmp_path: Path, users: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the fsync of a flight's message is held, the client gets nothing: not the
    BindComplete, not the CommandComplete; once the sync returned, the whole answer."""
    answered = _counted(monkeypatch)
    holding = threading.Event()
    entered = threading.Event()
    release = threading.Event()
    original = storage_fs.FileSystem.sync

    def held_sync(self: Any, fd: int) -> None:
        if holding.is_set():
            entered.set()
            assert release.wait(20)
        original(self, fd)

    monkeypatch.setattr(storage_fs.FileSystem, "sync", held_sync)
    for server in flights.served(tmp_path, users, "held"):
        client = FlightClient(server.port)
        try:
            client.login("alice")
            client.sql("CREATE TOPIC t WITH (min_active_partitions = 1)")
            client.ask(parse("i", INSERT, [BYTEA]) + sync())
            assert client.ask(flight("i", [b"first"], [1]))[-2:] == [
                (b"C", b"INSERT 0 1\x00"), (b"Z", b"I")]
            holding.set()
            client.send(flight("i", [b"held"], [1]))
            assert entered.wait(20)
            client.sock.settimeout(0.5)
            with pytest.raises(TimeoutError):
                client.sock.recv(1)  # nothing while the sync is held
            client.sock.settimeout(20)
            holding.clear()
            release.set()
            assert client.until_ready() == [(b"2", b""), (b"n", b""), (b"C", b"INSERT 0 1\x00"),
                                            (b"Z", b"I")]  # fmt: skip
        finally:
            release.set()
            client.close()
    assert answered.count(True) >= 2, answered


def test_a_failure_after_the_flight_was_taken_still_answers_its_sync(
    tmp_path: Path, users: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Anything failing once the flight is off the reader (here CommandComplete's encoding)
    is answered as an error followed by ReadyForQuery: the flight's Sync was consumed with
    it, so the loop's skipping to a Sync would leave the client waiting (review R3-18 F1);
    the connection goes on."""
    answered = _counted(monkeypatch)
    failing = threading.Event()
    original = m.command_complete

    def command_complete(tag: str) -> bytes:
        if failing.is_set() and tag.startswith("INSERT"):
            failing.clear()
            raise RuntimeError("CommandComplete could not be encoded")
        return original(tag)

    monkeypatch.setattr(m, "command_complete", command_complete)
    for server in flights.served(tmp_path, users, "after_take"):
        client = FlightClient(server.port)
        try:
            client.login("alice")
            client.sql("CREATE TOPIC t WITH (min_active_partitions = 1)")
            client.ask(parse("i", INSERT, [BYTEA]) + sync())
            failing.set()
            client.sock.settimeout(10)
            replies = client.ask(flight("i", [b"boom"], [1]))
            assert answered[-1] is True
            assert [kind for kind, _ in replies] == [b"2", b"E", b"Z"], replies
            assert error_fields(replies[1][1])["C"] == "XX000"
            assert client.ask(flight("i", [b"after"], [1]))[-2:] == [
                (b"C", b"INSERT 0 1\x00"), (b"Z", b"I")]
        finally:
            client.close()
