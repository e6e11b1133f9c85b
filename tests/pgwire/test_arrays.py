"""Array parameters (``sql.pgwire.codec.arrays``): what psycopg and asyncpg send for a list."""

from __future__ import annotations

import datetime
import struct

import pytest

from sql.pgwire.codec import arrays
from sql.pgwire.codec import messages as m
from sql.pgwire.server import ServerThread
from tests.pgwire import rawclient
from tests.pgwire.rawclient import RawClient


@pytest.mark.parametrize("marker", ["%t", "%b"], ids=["text", "binary"])
def test_psycopg_lists_as_parameters(connect, marker: str) -> None:
    conn = connect(autocommit=True)
    conn.execute("CREATE TABLE lists (id INTEGER, xs INTEGER[], words VARCHAR[])")
    conn.execute(
        f"INSERT INTO lists VALUES (1, {marker}, {marker})",
        [[1, None, 3], ["a b", 'say "hi"', None, "back\\slash", ""]],
    )
    conn.execute(f"INSERT INTO lists VALUES (2, {marker}, {marker})", [[], []])
    rows = conn.execute("SELECT id, xs, words FROM lists ORDER BY id").fetchall()
    assert rows == [
        (1, [1, None, 3], ["a b", 'say "hi"', None, "back\\slash", ""]),
        (2, [], []),
    ]
    found = conn.execute(f"SELECT id FROM lists WHERE id = ANY({marker}) ORDER BY id", [[2, 5]])
    assert found.fetchall() == [(2,)]
    dates = [datetime.date(2026, 11, 22), None]
    count = conn.execute(f"SELECT len({marker}::DATE[]) AS n", [dates]).fetchone()
    assert count == (2,)
    # A list result still comes back as json (its elements as json gives them).
    assert conn.execute(f"SELECT {marker}::DATE[] AS d", [dates]).fetchone() == (
        ["2026-11-22", None],
    )


def test_psycopg_two_dimensional_array(connect) -> None:
    conn = connect(autocommit=True)
    for marker in ("%t", "%b"):
        row = conn.execute(f"SELECT {marker}::INTEGER[][] AS m", [[[1, 2], [3, 4]]]).fetchone()
        assert row == ([[1, 2], [3, 4]],)


def _described_parameter_oids(client: RawClient, query: str) -> list[int]:
    """ParameterDescription of ``query`` parsed with unspecified parameter types."""
    parse = m.message(b"P", b"\0" + query.encode() + b"\0" + struct.pack("!h", 0))
    client.send(parse + m.message(b"D", b"S\0") + m.message(b"S", b""))
    replies = client.until_ready()
    assert not rawclient.errors(replies), rawclient.errors(replies)
    (body,) = [body for kind, body in replies if kind == b"t"]
    (count,) = struct.unpack_from("!h", body)
    return list(struct.unpack_from(f"!{count}I", body, 2))


def test_an_array_parameter_is_described_as_the_list_it_binds(
    connect, server: ServerThread
) -> None:
    """``x = ANY($1)`` and a list column: Describe names the array type, as drivers that
    describe first need (int8[] 1016, a VARCHAR list as text[] 1009)."""
    connect(autocommit=True).execute("CREATE TABLE nums (n BIGINT, tags VARCHAR[])")
    client = RawClient(server.port)
    try:
        client.start(user="tester")
        assert _described_parameter_oids(client, "SELECT n FROM nums WHERE n = ANY($1)") == [
            1016
        ]
        assert _described_parameter_oids(client, "INSERT INTO nums VALUES (1, $1)") == [1009]
    finally:
        client.close()


def _bind_int4_array(value: bytes, format_code: int) -> bytes:
    """Parse/Bind/Execute/Sync of ``SELECT $1`` with ``value`` as an int4[] parameter."""
    parse = m.message(b"P", b"\0SELECT $1 AS a\0" + struct.pack("!hI", 1, 1007))
    bind = m.message(
        b"B",
        b"\0\0" + struct.pack("!hh", 1, format_code) + struct.pack("!hi", 1, len(value))
        + value + struct.pack("!h", 0),
    )  # fmt: skip
    execute = m.message(b"E", b"\0" + struct.pack("!i", 0))
    return parse + bind + execute + m.message(b"S", b"")


def test_bad_array_parameters_get_sqlstates_over_the_wire(server: ServerThread) -> None:
    client = RawClient(server.port)
    try:
        client.start(user="tester")
        cases = [
            (b"{1,2", 0, "22P02"),
            (b"{{1},{2,3}}", 0, "22P02"),
            (b"{1,,2}", 0, "22P02"),
            (b"{abc}", 0, "22P02"),
            (_binary(1, 20, [1], [b"\0" * 8]), 1, "42804"),
            (_binary(1, 23, [2], [_int4(1)]), 1, "22P03"),
        ]
        for value, format_code, sqlstate in cases:
            client.send(_bind_int4_array(value, format_code))
            assert [e["C"] for e in rawclient.errors(client.until_ready())] == [sqlstate], value
        client.send(_bind_int4_array(b"{7,NULL}", 0))  # the connection carries on
        replies = client.until_ready()
        assert not rawclient.errors(replies) and any(kind == b"D" for kind, _ in replies)
    finally:
        client.close()


def _binary(dimensions: int, oid: int, sizes: list[int], elements: list[bytes | None]) -> bytes:
    out = struct.pack("!iiI", dimensions, 0, oid)
    for size in sizes:
        out += struct.pack("!ii", size, 1)
    for element in elements:
        out += struct.pack("!i", -1) if element is None else struct.pack("!i", len(element))
        out += element or b""
    return out


def _int4(value: int) -> bytes:
    return struct.pack("!i", value)


def test_binary_decoding_edges() -> None:
    decode = arrays.decode_binary
    element = lambda data: struct.unpack("!i", data)[0]  # noqa: E731
    assert decode(_binary(1, 23, [3], [_int4(1), None, _int4(3)]), 23, element) == [1, None, 3]
    assert decode(_binary(0, 23, [], []), 23, element) == []
    grid = _binary(2, 23, [2, 2], [_int4(i) for i in range(4)])
    assert decode(grid, 23, element) == [[0, 1], [2, 3]]
    with pytest.raises(arrays.ArrayElementTypeError):
        decode(_binary(1, 20, [1], [b"\0" * 8]), 23, element)
    for bad in (
        _binary(1, 23, [2], [_int4(1)]),  # fewer elements than the size says
        _binary(1, 23, [1], [_int4(1)]) + b"\0",  # bytes left over
        _binary(7, 23, [1] * 7, [_int4(1)]),  # too many dimensions
        _binary(1, 23, [-1], []),
        b"\0\0",
    ):
        with pytest.raises(arrays.ArrayBinaryError):
            decode(bad, 23, element)


def test_text_decoding_edges() -> None:
    decode = arrays.decode_text
    assert decode(" { 1 , NULL ,null, \"NULL\" } ", str) == ["1", None, None, "NULL"]
    assert decode('{"a\\"b", "c\\\\d"}', str) == ['a"b', "c\\d"]
    assert decode("{{},{}}", str) == [[], []]
    for bad in ("[1:2]={1,2}", "{1,2", "1,2}", "{1,{2}}", "{{1},{2,3}}", "{1,,2}", "{1}x",
                '{"open}', "{" * 7 + "}" * 7):  # fmt: skip
        with pytest.raises(arrays.ArrayTextError, match="malformed array literal"):
            decode(bad, str)


def test_untyped_text_starting_with_a_brace_stays_text(connect) -> None:
    """psycopg sends a str untyped; JSON text is not taken for an array."""
    conn = connect(autocommit=True)
    conn.execute("CREATE TABLE docs (body JSON, note VARCHAR)")
    conn.execute("INSERT INTO docs VALUES (%s, %s)", ['{"a": [1, 2]}', "{not an array"])
    assert conn.execute("SELECT body, note FROM docs").fetchone() == (
        {"a": [1, 2]},
        "{not an array",
    )
