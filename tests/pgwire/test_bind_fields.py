"""The lookup flight reads a Bind's fields itself (``lookup_flight._bind_fields``, a
tight loop for 1000-parameter Binds); it must accept exactly what the general path's
``messages.parse_bind`` accepts and read the same fields, or a flight could answer a
Bind the general path refuses with 08P01 (a parameter length of -2 read as NULL, say).
Each body here runs through both: ``_bind_fields`` gives None exactly where
``parse_bind`` raises ``ProtocolError``, and the same formats, values and result formats
otherwise."""

from __future__ import annotations

import random
import struct

import pytest

from sql.pgwire.codec.messages import ProtocolError, parse_bind
from sql.pgwire.connection.lookup_flight import _bind_fields


def _body(
    values: list[bytes | None],
    formats: tuple[int, ...] = (0,),
    results: tuple[int, ...] = (0,),
    lengths: dict[int, int] | None = None,
) -> bytes:
    """An unnamed portal's Bind of statement ``s``; ``lengths`` overrides the length
    field written for the value at that index (its bytes are written as they are)."""
    out = b"\0s\0" + struct.pack("!H", len(formats)) + struct.pack(f"!{len(formats)}h", *formats)
    out += struct.pack("!H", len(values))
    for index, value in enumerate(values):
        length = -1 if value is None else len(value)
        length = (lengths or {}).get(index, length)
        out += struct.pack("!i", length) + (value or b"")
    return out + struct.pack("!H", len(results)) + struct.pack(f"!{len(results)}h", *results)


def _agree(body: bytes) -> None:
    """Both readers accept ``body`` with the same fields, or both refuse it."""
    at = body.index(b"\0", 1) + 1  # after the statement's name, as the flight starts
    fields = _bind_fields(body, at)
    try:
        bind = parse_bind(body)
    except ProtocolError:
        assert fields is None, (body, fields)
        return
    assert fields is not None, body
    formats, values, results = fields
    assert (formats, values, results) == (list(bind.parameter_formats), list(bind.parameters),
                                          list(bind.result_formats))  # fmt: skip


VALID = _body([b"1", None, b"", b"abc" * 100], formats=(0, 1, 0, 1), results=(1,))


@pytest.mark.parametrize("length", [-2, -7, -(2**31)])
def test_a_length_below_minus_one_is_refused_by_both(length: int) -> None:
    body = _body([b"1", None], lengths={1: length})  # no bytes follow the length
    _agree(body)
    assert _bind_fields(body, 3) is None


@pytest.mark.parametrize("length", [4, 300, 2**31 - 1])
def test_a_length_past_the_end_is_refused_by_both(length: int) -> None:
    body = _body([b"1", b"xyz"], lengths={1: length})
    _agree(body)
    assert _bind_fields(body, 3) is None


def test_valid_binds_read_the_same_fields() -> None:
    _agree(VALID)
    _agree(_body([]))
    _agree(_body([None] * 1000, formats=(), results=()))
    _agree(_body([b"v%d" % i for i in range(1000)], formats=(1,), results=(0, 1)))


def test_every_truncation_of_a_bind_is_refused_by_both_alike() -> None:
    for cut in range(3, len(VALID)):
        _agree(VALID[:cut])


def test_random_byte_changes_agree() -> None:
    rng = random.Random(21)
    for _ in range(3000):
        body = bytearray(VALID)
        for _ in range(rng.randint(1, 3)):
            position = rng.randrange(3, len(body))
            body[position] = rng.choice((0x00, 0xFF, 0x80, 0x7F, rng.randrange(256)))
        _agree(bytes(body))
