"""A prepared parameterless SELECT of literals whose row is kept is answered without the
engine's general statement path (``Session.answer_literal``) and its DataRow and
CommandComplete come from the connection's kept bytes (``_send_kept_response``): the
client gets byte for byte what the ordinary path sends, with every format and row limit,
the door's checks still run on every execution, and what is kept stays bounded
(docs/statement_cost.md round 9)."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engine import privileges
from engine.session import Session
from sql.pgwire.codec import messages as m
from sql.pgwire.server import ServerThread
from storage import limits
from storage.errors import InsufficientPrivilegeError
from tests.pgwire.rawclient import RawClient, errors

TEXT = "SELECT 1 AS a, 'x' AS b, -2 AS c"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerThread]:
    thread = ServerThread(str(tmp_path / "data"), "127.0.0.1", 0)
    try:
        yield thread
    finally:
        thread.stop()


@pytest.fixture
def client(server: ServerThread) -> Iterator[RawClient]:
    raw = RawClient(server.port)
    raw.start(user="topicbase", database="topicbase")
    try:
        yield raw
    finally:
        raw.close()


@pytest.fixture
def ordinary_runs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The texts ``Session.execute_statement`` ran (the engine's general path), any thread."""
    ran: list[str] = []
    original = Session.execute_statement

    def spying(self: Session, statement: Any, parameters: Any = None) -> Any:
        ran.append(getattr(statement, "sql", type(statement).__name__))
        return original(self, statement, parameters)

    monkeypatch.setattr(Session, "execute_statement", spying)
    return ran


def _parse(name: str, sql: str) -> bytes:
    return m.message(b"P", m.cstr(name) + m.cstr(sql) + struct.pack("!h", 0))


def _bind(portal: str, statement: str, formats: tuple[int, ...] = ()) -> bytes:
    body = m.cstr(portal) + m.cstr(statement) + struct.pack("!hh", 0, 0)
    body += struct.pack("!h", len(formats)) + b"".join(struct.pack("!h", f) for f in formats)
    return m.message(b"B", body)


def _describe_portal(portal: str) -> bytes:
    return m.message(b"D", b"P" + m.cstr(portal))


def _execute(portal: str, max_rows: int = 0) -> bytes:
    return m.message(b"E", m.cstr(portal) + struct.pack("!i", max_rows))


SYNC = m.message(b"S")


def _flight(formats: tuple[int, ...] = ()) -> bytes:
    """psycopg's flight of a prepared statement: Bind, Describe portal, Execute, Sync."""
    return _bind("", "s", formats) + _describe_portal("") + _execute("") + SYNC


def _limited() -> bytes:
    """A named portal executed a row at a time, then once more, then closed."""
    return (_bind("p", "s") + _execute("p", 1) + _execute("p", 1) + _execute("p", 0)
            + m.message(b"C", b"P" + m.cstr("p")) + SYNC)  # fmt: skip


def _twice() -> bytes:
    """A portal executed twice (the second Execute finds it run to its end)."""
    return _bind("q", "s") + _execute("q") + _execute("q", 2) + SYNC


def _run(client: RawClient, data: bytes) -> list[tuple[bytes, bytes]]:
    client.send(data)
    return client.until_ready()


FLIGHTS = [_flight(), _flight((1,)), _flight((0, 1, 0)), _limited(), _twice()]


def test_kept_answers_are_byte_identical_to_the_ordinary_path(
    client: RawClient, ordinary_runs: list[str]
) -> None:
    assert _run(client, _parse("s", TEXT) + SYNC)[0][0] == b"1"
    # The ordinary path: the first run (DuckDB's Arrow), the second (its rows, kept then),
    # and with a statement_timeout (never answered from what is kept) for every flight.
    ordinary = [_run(client, _flight()), _run(client, _flight())]
    assert ordinary_runs.count(TEXT) == 2
    _run(client, m.message(b"Q", m.cstr("SET statement_timeout = 100000")))
    expected = [_run(client, flight) for flight in FLIGHTS]
    assert ordinary_runs.count(TEXT) == 2 + len(FLIGHTS)
    _run(client, m.message(b"Q", m.cstr("RESET statement_timeout")))
    assert ordinary == [expected[0], expected[0]]
    ordinary_runs.clear()
    for _ in range(3):
        assert [_run(client, flight) for flight in FLIGHTS] == expected
    assert ordinary_runs == []  # every one answered from the kept row
    assert [kind for kind, _ in expected[0]] == [b"2", b"T", b"D", b"C", b"Z"]
    assert [kind for kind, _ in expected[3]] == [b"2", b"D", b"s", b"C", b"C", b"3", b"Z"]


def test_a_transaction_takes_the_ordinary_path(
    client: RawClient, ordinary_runs: list[str]
) -> None:
    _run(client, _parse("s", TEXT) + SYNC)
    kept = [_run(client, _flight()) for _ in range(3)][-1]
    ordinary_runs.clear()
    assert _run(client, _flight()) == kept
    assert ordinary_runs == []  # answered from the kept row outside a transaction
    _run(client, m.message(b"Q", m.cstr("BEGIN")))
    ordinary_runs.clear()
    inside = _run(client, _flight())
    assert ordinary_runs == [TEXT]
    assert inside[:-1] == kept[:-1] and inside[-1] == (b"Z", b"T")
    _run(client, m.message(b"Q", m.cstr("SELECT * FROM no_such_table")))
    failed = _run(client, _flight())
    assert [e["C"] for e in errors(failed)] == ["25P02"]
    _run(client, m.message(b"Q", m.cstr("ROLLBACK")))
    assert _run(client, _flight()) == kept


def test_the_door_s_checks_refuse_a_kept_answer_on_the_next_execution(
    client: RawClient, ordinary_runs: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _run(client, _parse("s", TEXT) + SYNC)
    kept = [_run(client, _flight()) for _ in range(3)][-1]
    checked = privileges.check_plan
    calls: list[int] = []

    def spying(plan: Any, identity: Any, session: Any, memo: Any = None) -> None:
        calls.append(1)
        checked(plan, identity, session, memo=memo)

    monkeypatch.setattr(privileges, "check_plan", spying)
    ordinary_runs.clear()
    for _ in range(3):
        assert _run(client, _flight()) == kept
    assert len(calls) == 3 and ordinary_runs == []

    def refusing(plan: Any, identity: Any, session: Any, memo: Any = None) -> None:
        raise InsufficientPrivilegeError("permission denied: refused for the test")

    monkeypatch.setattr(privileges, "check_plan", refusing)
    refused = _run(client, _flight())
    assert [e["C"] for e in errors(refused)] == ["42501"]
    monkeypatch.setattr(privileges, "check_plan", checked)
    assert _run(client, _flight()) == kept


def test_kept_responses_stay_bounded(server: ServerThread, client: RawClient) -> None:
    count = limits.KEPT_LITERAL_RESPONSES_MAX + 8
    for n in range(count):
        _run(client, _parse(f"s{n}", f"SELECT {n} AS n") + SYNC)
    for _ in range(3):
        for n in range(count):
            got = _run(client, _bind("", f"s{n}") + _describe_portal("") + _execute("") + SYNC)
            assert got[2] == (b"D", struct.pack("!hi", 1, len(str(n))) + str(n).encode())
    (connection,) = server.server.connections.values()
    assert 0 < len(connection.kept_responses) <= limits.KEPT_LITERAL_RESPONSES_MAX
    assert 0 < len(connection.session._literal_plans) <= limits.KEPT_LITERAL_PLANS_MAX
    # A row whose text is short enough to be kept (characters) but whose encoded response
    # is not (bytes): four UTF-8 bytes a character.
    wide_value = "\U0001f600" * (limits.KEPT_LITERAL_RESPONSE_BYTES_MAX // 4 + 10)
    wide = f"SELECT '{wide_value}' AS w"
    assert len(wide) <= limits.LITERAL_RESULT_TEXT_CHARS_MAX
    _run(client, _parse("w", wide) + SYNC)
    connection.kept_responses.clear()
    for _ in range(3):
        got = _run(client, _bind("", "w") + _describe_portal("") + _execute("") + SYNC)
        assert got[2][0] == b"D" and len(got[2][1]) > limits.KEPT_LITERAL_RESPONSE_BYTES_MAX
    assert connection.kept_responses == {}  # too big to keep: encoded every time
