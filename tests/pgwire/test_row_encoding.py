"""``row_encoding.encode_data_rows`` sends exactly the bytes of the reference path
(``wire_types.encode_rows`` + ``messages.data_row``), for every column type and format."""

from __future__ import annotations

import datetime
import decimal
import struct

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sql.pgwire.codec import messages as m
from sql.pgwire.codec import wire_types
from sql.pgwire.codec.row_encoding import encode_data_rows


def reference(table: pa.Table, oids: list[int], formats: list[int]) -> bytes:
    return b"".join(m.data_row(row) for row in wire_types.encode_rows(table, oids, formats))


def both(table: pa.Table, format_code: int) -> tuple[bytes, bytes]:
    oids = [wire_types.type_oid(f.type) for f in table.schema]
    formats = [format_code] * table.num_columns
    return encode_data_rows(table, oids, formats), reference(table, oids, formats)


COLUMNS = {
    "binary": pa.array([b"", b"\x00\xff\\x", None, b"a" * 300], pa.binary()),
    "large_binary": pa.array([b"z", None, b"", b"\x01"], pa.large_binary()),
    "string": pa.array(["", "héllo", None, "tab\tnew\nline"], pa.string()),
    "large_string": pa.array(["x", None, "ü", ""], pa.large_string()),
    "int8": pa.array([-128, 0, None, 127], pa.int8()),
    "int16": pa.array([-32768, 1, 2, None], pa.int16()),
    "int32": pa.array([None, -(2**31), 2**31 - 1, 0], pa.int32()),
    "int64": pa.array([-(2**63), None, 2**63 - 1, 42], pa.int64()),
    "uint8": pa.array([0, 255, None, 7], pa.uint8()),
    "uint16": pa.array([0, 65535, None, 7], pa.uint16()),
    "uint32": pa.array([0, 2**32 - 1, None, 7], pa.uint32()),
    "uint64": pa.array([0, 2**64 - 1, None, 7], pa.uint64()),
    "float64": pa.array([1.5, float("nan"), None, -0.0], pa.float64()),
    "bool": pa.array([True, False, None, True]),
    "date": pa.array([datetime.date(2024, 1, 2), None, datetime.date(1, 1, 1), None]),
    "timestamp": pa.array([datetime.datetime(2024, 1, 2, 3, 4, 5, 6), None, None, None]),
    "decimal": pa.array([decimal.Decimal("1.25"), None, decimal.Decimal("-3"), None]),
    "dictionary": pa.array(["a", "b", None, "a"]).dictionary_encode(),
    "list": pa.array([[1, 2], None, [], [3]]),
}


@pytest.mark.parametrize("name", list(COLUMNS))
def test_each_type_in_text_format(name: str) -> None:
    table = pa.table({name: COLUMNS[name]})
    new, old = both(table, 0)
    assert new == old


@pytest.mark.parametrize(
    "name",
    ["binary", "large_binary", "string", "large_string", "int16", "int32", "int64", "bool",
     "float64"],
)  # fmt: skip
def test_each_type_in_binary_format(name: str) -> None:
    table = pa.table({name: COLUMNS[name]})
    new, old = both(table, 1)
    assert new == old


def test_all_columns_together_and_sliced() -> None:
    table = pa.table(COLUMNS)
    assert both(table, 0)[0] == both(table, 0)[1]
    sliced = table.slice(1, 2)  # Arrow offsets that do not start at 0
    assert both(sliced, 0)[0] == both(sliced, 0)[1]
    chunked = pa.concat_tables([table.slice(0, 2), table.slice(2, 2)])  # several chunks
    assert both(chunked, 0)[0] == both(chunked, 0)[1]


def test_message_framing() -> None:
    table = pa.table({"a": pa.array([b"xy", None]), "b": pa.array([7, 8], pa.int32())})
    data, _ = both(table, 1)
    assert data[:1] == b"D"
    (length,) = struct.unpack("!i", data[1:5])
    first = data[1 : 1 + length]
    assert struct.unpack("!h", first[4:6]) == (2,)
    assert first[6:] == struct.pack("!i", 2) + b"xy" + struct.pack("!i", 4) + struct.pack("!i", 7)
    assert data[1 + length : 2 + length] == b"D"


def test_empty_table() -> None:
    table = pa.table({"a": pa.array([], pa.binary())})
    assert both(table, 0) == (b"", b"")


@settings(max_examples=100, deadline=None)
@given(
    blobs=st.lists(st.one_of(st.none(), st.binary(max_size=40)), max_size=30),
    texts=st.data(),
    format_code=st.sampled_from([0, 1]),
)
def test_random_rows_match_the_reference(blobs, texts, format_code: int) -> None:
    count = len(blobs)
    strings = texts.draw(st.lists(st.one_of(st.none(), st.text(max_size=20)),
                                  min_size=count, max_size=count))  # fmt: skip
    numbers = texts.draw(st.lists(st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)),
                                  min_size=count, max_size=count))  # fmt: skip
    table = pa.table({
        "blob": pa.array(blobs, pa.binary()),
        "text": pa.array(strings, pa.string()),
        "number": pa.array(numbers, pa.int64()),
    })  # fmt: skip
    new, old = both(table, format_code)
    assert new == old
    single = table.select(["blob"])
    assert both(single, format_code)[0] == both(single, format_code)[1]
