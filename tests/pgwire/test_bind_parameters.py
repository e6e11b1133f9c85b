"""Many-parameter Binds: the one-loop Bind parser, batch parameter decoding, gathered output.

``parse_bind`` and ``decode_parameters`` are compared with the field-by-field reference
(``decode_parameter``) on good and bad input; a 1000-row INSERT goes through psycopg with
binary and text ``bytea`` parameters, unprepared and prepared, and reads back intact.
"""

from __future__ import annotations

import asyncio
import struct
from typing import Any

import pytest

from sql.pgwire.codec import messages as m
from sql.pgwire.codec import wire_types
from sql.pgwire.connection.output import FLUSH_BYTES, GatheringWriter
from storage.errors import TopicbaseError
from tests.pgwire.rawclient import RawClient, error_fields


def bind_body(values: list[bytes | None], formats: list[int], results: list[int]) -> bytes:
    body = m.cstr("portal") + m.cstr("stmt") + struct.pack("!H", len(formats))
    body += struct.pack(f"!{len(formats)}h", *formats) + struct.pack("!H", len(values))
    for value in values:
        body += struct.pack("!i", -1) if value is None else struct.pack("!i", len(value)) + value
    return body + struct.pack("!H", len(results)) + struct.pack(f"!{len(results)}h", *results)


# -- parse_bind ------------------------------------------------------------------------------
def test_parse_bind_reads_many_values() -> None:
    values: list[bytes | None] = [
        None if i % 7 == 3 else bytes([i % 256]) * (i % 5 * 300) for i in range(1000)
    ]
    bind = m.parse_bind(bind_body(values, [1] * 1000, [0, 1]))
    assert (bind.portal, bind.statement) == ("portal", "stmt")
    assert bind.parameters == values
    assert all(v is None or type(v) is bytes for v in bind.parameters)
    assert bind.parameter_formats == [1] * 1000
    assert bind.result_formats == [0, 1]


def test_counts_are_unsigned() -> None:
    """PostgreSQL reads Bind's and Parse's counts as unsigned Int16: 40000 parameters."""
    values: list[bytes | None] = [None] * 40_000
    values[-1] = b"last"
    bind = m.parse_bind(bind_body(values, [0], []))
    assert len(bind.parameters) == 40_000 and bind.parameters[-1] == b"last"
    body = m.cstr("") + m.cstr("q") + struct.pack("!H", 40_000) + struct.pack("!i", 25) * 40_000
    assert m.parse_parse(body).parameter_oids == [25] * 40_000
    description = m.parameter_description([17] * 40_000)
    assert description[:1] == b"t" and struct.unpack("!H", description[5:7]) == (40_000,)
    assert len(description) == 1 + 4 + 2 + 4 * 40_000


def _length_word(value: int) -> bytes:
    return struct.pack("!i", value)


@pytest.mark.parametrize(
    "body",
    [
        m.cstr("") + m.cstr("") + struct.pack("!hh", 0, 1) + _length_word(-2) + b"ab",
        m.cstr("") + m.cstr("") + struct.pack("!hh", 0, 2) + _length_word(3) + b"abc"
        + _length_word(10) + b"short",  # the last value runs past the end
        m.cstr("") + m.cstr("") + struct.pack("!hh", 0, 2) + _length_word(50) + b"abc"
        + _length_word(1) + b"x",  # a middle value runs past the end
        m.cstr("") + m.cstr("") + struct.pack("!hh", 0, 2) + _length_word(1) + b"a" + b"\0\0",
        m.cstr("") + m.cstr("") + struct.pack("!hh", 3, 1),  # formats cut short
        m.cstr("") + m.cstr("") + struct.pack("!hh", 0, 1) + _length_word(1) + b"a"
        + struct.pack("!h", 2) + b"\0",  # result formats cut short
        m.cstr("") + m.cstr(""),  # no counts at all
        b"no terminator",
    ],
)  # fmt: skip
def test_parse_bind_refuses_malformed_bodies(body: bytes) -> None:
    with pytest.raises(m.ProtocolError) as raised:
        m.parse_bind(body)
    assert raised.value.sqlstate == "08P01"


def test_parse_parse_reads_parameter_oids() -> None:
    oids = list(range(-3, 997))
    body = m.cstr("s") + m.cstr("SELECT 1") + struct.pack(f"!h{len(oids)}i", len(oids), *oids)
    assert m.parse_parse(body) == m.Parse("s", "SELECT 1", oids)
    with pytest.raises(m.ProtocolError):
        m.parse_parse(body[:-1])


# -- decode_parameters -------------------------------------------------------------------------
CASES: list[tuple[bytes | None, int, int]] = [
    (None, wire_types.BYTEA, 1),
    (b"\x00\xffbin", wire_types.BYTEA, 1),
    (b"", wire_types.BYTEA, 1),
    (b"\\x00ff41", wire_types.BYTEA, 0),
    (b"\\xABcd", wire_types.BYTEA, 0),
    (b"\\x00 ff", wire_types.BYTEA, 0),  # whitespace between digit pairs: the general path
    (b"\\x0", wire_types.BYTEA, 0),  # odd count of digits: an error, as before
    (b"\\xzz", wire_types.BYTEA, 0),
    (b"\\x\xc3\xa9", wire_types.BYTEA, 0),  # not hex, not even ASCII
    (b"\\001\\\\x", wire_types.BYTEA, 0),  # escape format
    (b"plain", wire_types.BYTEA, 0),
    (b"\\x", wire_types.BYTEA, 0),
    (struct.pack("!i", 7), wire_types.INT4, 1),
    (b"12", wire_types.INT4, 0),
    (b"abc", wire_types.INT4, 0),
    (b"text", 0, 0),
    (b"\xff", wire_types.TEXT, 0),
    (b"x", wire_types.BYTEA, 2),  # unsupported format code
]


def outcome(decode: Any, *arguments: Any) -> tuple[str, Any]:
    try:
        return "value", decode(*arguments)
    except TopicbaseError as error:
        return type(error).__name__, (error.sqlstate, error.message)


@pytest.mark.parametrize(("value", "oid", "fmt"), CASES)
def test_decode_parameters_matches_decode_parameter(value: bytes | None, oid: int,
                                                    fmt: int) -> None:  # fmt: skip
    expected = outcome(wire_types.decode_parameter, value, oid, fmt)
    got = outcome(lambda *a: wire_types.decode_parameters(*a)[0], [value], [oid], [fmt])
    assert got == expected


def test_decode_parameters_in_bulk() -> None:
    good = [case for case in CASES if outcome(wire_types.decode_parameter, *case)[0] == "value"]
    values, oids, formats = (list(column) for column in zip(*good, strict=True))
    assert wire_types.decode_parameters(values, oids, formats) == [
        wire_types.decode_parameter(*case) for case in good
    ]
    payloads: list[bytes | None] = [bytes([i % 256]) * 1024 for i in range(1000)]
    payloads[10] = None
    decoded = wire_types.decode_parameters(payloads, [wire_types.BYTEA] * 1000, [1] * 1000)
    assert decoded == payloads and decoded is not payloads
    with pytest.raises(ValueError):  # counts that differ are the caller's bug, not data
        wire_types.decode_parameters([b"a", b"b"], [wire_types.BYTEA], [1, 1])


# -- through psycopg ---------------------------------------------------------------------------
@pytest.mark.parametrize("placeholder", ["%b", "%t"])
def test_thousand_bytea_parameters_through_psycopg(connect, placeholder: str) -> None:
    """Binary (``%b``) and hex text (``%t``) bytea, 1000 per statement, 7 statements: the
    first ones unprepared, then psycopg prepares the statement (a named Parse) and binds it."""
    conn = connect(autocommit=True)
    conn.execute("CREATE TOPIC t (CONSUMER c)")
    insert = "INSERT INTO TOPIC t (data) VALUES " + ", ".join([f"({placeholder})"] * 1000)
    sent = []
    for statement in range(7):
        batch = [bytes([statement, i % 256]) + bytes(range(256)) * (i % 3) for i in range(1000)]
        batch[statement] = b""
        conn.execute(insert, batch)
        sent += batch
    got = []
    while rows := conn.execute(
        "SELECT data FROM TOPIC t WITH (consumer = 'c', max_messages = 5000)"
    ).fetchall():
        got += [row[0] for row in rows]
    assert got == sent


# -- gathered output ---------------------------------------------------------------------------
class RecordingWriter:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.drains = 0
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    async def drain(self) -> None:
        self.drains += 1

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str) -> str:
        return f"info {name}"


def test_gathering_writer_keeps_small_messages_until_drain() -> None:
    inner = RecordingWriter()
    writer = GatheringWriter(inner)  # type: ignore[arg-type]
    writer.write(b"1")
    writer.write(b"22")
    assert inner.writes == []
    asyncio.run(writer.drain())
    assert (inner.writes, inner.drains) == ([b"122"], 1)
    big = b"x" * FLUSH_BYTES
    writer.write(b"3")
    writer.write(big)  # a large write first sends what is kept, then itself, in order
    assert inner.writes == [b"122", b"3", big]
    for _ in range(FLUSH_BYTES // 1000 + 1):  # kept bytes over the bound go out unasked
        writer.write(b"y" * 1000)
    assert len(inner.writes) == 4 and len(inner.writes[3]) >= FLUSH_BYTES
    writer.write(b"last")
    writer.close()
    assert inner.writes[-1] == b"last" and inner.closed
    assert writer.get_extra_info("peername") == "info peername"


def test_flush_and_sync_send_the_gathered_responses(server) -> None:
    """Responses of a flight wait for Flush or Sync, as PostgreSQL's do; Flush sends all
    that is ready without ending the flight."""
    client = RawClient(server.port)
    try:
        client.start()
        parse = m.message(b"P", m.cstr("") + m.cstr("SELECT $1::INTEGER") + b"\0\0")
        client.send(parse + _bind_unnamed([b"41"]) + m.message(b"E", m.cstr("") + b"\0\0\0\0"))
        client.send(m.message(b"H"))
        got = [client.read() for _ in range(4)]
        assert [item[0] for item in got if item] == [b"1", b"2", b"D", b"C"]
        assert got[2] is not None and got[2][1] == struct.pack("!hi", 1, 2) + b"41"
        client.send(m.message(b"S"))
        assert client.until_ready()[-1][0] == b"Z"
    finally:
        client.close()


def test_parameter_numbers_past_the_protocol_limit(server) -> None:
    """``$70000`` could never be bound (Bind counts to 65535): Parse refuses it (54000)
    instead of preparing 70000 parameters; the connection goes on."""
    client = RawClient(server.port)
    try:
        client.start()
        client.send(m.message(b"P", m.cstr("") + m.cstr("SELECT $70000") + b"\0\0")
                    + m.message(b"S"))  # fmt: skip
        got = client.until_ready()
        assert [kind for kind, _ in got] == [b"E", b"Z"]
        assert error_fields(got[0][1])["C"] == "54000"
        client.send(m.message(b"P", m.cstr("") + m.cstr("SELECT $2::INT + $1::INT") + b"\0\0")
                    + _bind_unnamed([b"1", b"2"]) + m.message(b"E", m.cstr("") + b"\0\0\0\0")
                    + m.message(b"S"))  # fmt: skip
        got = client.until_ready()
        assert [kind for kind, _ in got] == [b"1", b"2", b"D", b"C", b"Z"]
        assert got[2][1] == struct.pack("!hi", 1, 1) + b"3"
    finally:
        client.close()


def _bind_unnamed(values: list[bytes | None]) -> bytes:
    body = m.cstr("") + m.cstr("") + struct.pack("!hh", 0, len(values))
    for value in values:
        body += struct.pack("!i", -1) if value is None else struct.pack("!i", len(value)) + value
    return m.message(b"B", body + struct.pack("!h", 0))
