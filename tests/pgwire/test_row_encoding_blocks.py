"""``row_encoding.DataRows``: blocks of whole DataRow messages, the column fast paths
(bytea hex per block, zero-copy slices, Arrow integer casts) against the reference path
(``wire_types.encode_rows`` + ``messages.data_row``), and rows through a real server."""

from __future__ import annotations

import struct
import uuid

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sql.pgwire.codec import messages as m
from sql.pgwire.codec import row_encoding, wire_types
from sql.pgwire.codec.row_encoding import DataRows, encode_data_rows
from storage.errors import FeatureNotSupportedError, LimitExceededError


def reference(table: pa.Table, oids: list[int], formats: list[int]) -> bytes:
    return b"".join(m.data_row(row) for row in wire_types.encode_rows(table, oids, formats))


def split_messages(data: bytes) -> list[bytes]:
    """The DataRow messages of ``data``; fails unless it is whole messages only."""
    messages = []
    at = 0
    while at < len(data):
        assert data[at : at + 1] == b"D"
        (length,) = struct.unpack("!i", data[at + 1 : at + 5])
        messages.append(data[at : at + 1 + length])
        at += 1 + length
    assert at == len(data)
    return messages


def null_slot_with_bytes() -> pa.Array:
    """A binary array whose NULL slot still spans bytes (Arrow allows it)."""
    offsets = np.array([0, 2, 5, 7], dtype=np.int32)
    validity = np.packbits(np.array([1, 0, 1, 0, 0, 0, 0, 0], dtype=np.uint8), bitorder="little")
    return pa.Array.from_buffers(
        pa.binary(), 3, [pa.py_buffer(validity), pa.py_buffer(offsets), pa.py_buffer(b"abXYZcd")]
    )


@pytest.mark.parametrize("format_code", [0, 1])
def test_null_slot_that_spans_bytes_is_sent_as_null(format_code: int) -> None:
    array = null_slot_with_bytes()
    assert array.to_pylist() == [b"ab", None, b"cd"]
    table = pa.table({"b": array})
    data = encode_data_rows(table, [wire_types.BYTEA], [format_code])
    assert data == reference(table, [wire_types.BYTEA], [format_code])
    second = split_messages(data)[1]
    assert second == b"D" + struct.pack("!ihi", 10, 1, -1)  # no \x, no bytes


@pytest.mark.parametrize("format_code", [0, 1])
@pytest.mark.parametrize("block_bytes", [1, 20, 64, 1000, 10**6])
def test_blocks_are_whole_messages_in_order(format_code: int, block_bytes: int) -> None:
    values = [b"x" * (i * 7 % 50) if i % 5 else None for i in range(60)]
    table = pa.table({"b": pa.array(values, pa.binary()), "n": pa.array(range(60), pa.int64())})
    oids, formats = [wire_types.BYTEA, wire_types.INT8], [format_code] * 2
    blocks = list(DataRows(table, oids, formats).blocks(block_bytes))
    for block in blocks:
        messages = split_messages(block)
        assert len(block) <= block_bytes or len(messages) == 1  # only a lone row is larger
    assert b"".join(blocks) == reference(table, oids, formats)
    assert len(split_messages(b"".join(blocks))) == 60


def test_a_row_larger_than_a_block_is_a_block_alone() -> None:
    table = pa.table({"b": pa.array([b"a", b"z" * 5000, b"c"], pa.binary())})
    blocks = list(DataRows(table, [wire_types.BYTEA], [0]).blocks(100))
    assert [len(split_messages(block)) for block in blocks] == [1, 1, 1]
    assert len(blocks[1]) == 1 + 4 + 2 + 4 + 2 + 10000
    assert b"".join(blocks) == reference(table, [wire_types.BYTEA], [0])


def test_sliced_and_chunked_columns_in_both_formats() -> None:
    blobs = pa.array([bytes([i]) * i for i in range(40)] + [None], pa.binary())
    texts = pa.array([f"t{i}é" if i % 3 else None for i in range(41)], pa.large_string())
    table = pa.table({"b": blobs, "t": texts})
    for candidate in (table.slice(3, 30), pa.concat_tables([table.slice(0, 7), table.slice(9)])):
        for format_code in (0, 1):
            oids, formats = [wire_types.BYTEA, wire_types.TEXT], [format_code] * 2
            for block_bytes in (50, 10**6):
                rows = DataRows(candidate, oids, formats)
                joined = b"".join(rows.blocks(block_bytes))
                assert joined == reference(candidate, oids, formats)


@pytest.mark.parametrize(
    ("arrow_type", "oid"),
    [(pa.int8(), wire_types.INT2), (pa.uint8(), wire_types.INT2), (pa.int16(), wire_types.INT2),
     (pa.uint16(), wire_types.INT4), (pa.int32(), wire_types.INT4), (pa.uint32(), wire_types.INT8),
     (pa.int64(), wire_types.INT8), (pa.int32(), wire_types.INT8), (pa.int16(), wire_types.INT4)],
)  # fmt: skip
def test_integers_in_both_formats(arrow_type: pa.DataType, oid: int) -> None:
    info = np.iinfo(arrow_type.to_pandas_dtype())
    values = [int(info.min), None, 0, int(info.max), 1, None]
    table = pa.table({"n": pa.array(values, arrow_type)})
    for format_code in (0, 1):
        got = encode_data_rows(table, [oid], [format_code])
        assert got == reference(table, [oid], [format_code])


def test_integer_wider_than_its_described_type_fails_as_the_reference_does() -> None:
    table = pa.table({"n": pa.array([1, 2**40], pa.int64())})
    with pytest.raises(wire_types.NumericValueOutOfRangeError):
        reference(table, [wire_types.INT4], [1])
    with pytest.raises(wire_types.NumericValueOutOfRangeError) as raised:
        encode_data_rows(table, [wire_types.INT4], [1])
    assert raised.value.sqlstate == "22003"
    small = pa.table({"n": pa.array([1, -5, None], pa.int64())})  # fits: same bytes
    int4 = [wire_types.INT4]
    assert encode_data_rows(small, int4, [1]) == reference(small, int4, [1])


@pytest.mark.parametrize(
    "oid",
    [wire_types.TEXT, wire_types.VARCHAR, wire_types.JSON, wire_types.JSONB, wire_types.UUID],
)
def test_strings_under_text_like_types(oid: int) -> None:
    values = ['{"a": 1}', None, "00000000-0000-0000-0000-000000000001"]
    if oid == wire_types.UUID:
        values = ["00000000-0000-0000-0000-000000000001", None, str(uuid.uuid4())]
    table = pa.table({"s": pa.array(values, pa.string())})
    for format_code in (0, 1):
        assert encode_data_rows(table, [oid], [format_code]) == reference(
            table, [oid], [format_code]
        )


def test_rows_without_columns() -> None:
    table = pa.table({"a": pa.array([1, 2, 3])}).select([])
    assert table.num_rows == 3
    data = encode_data_rows(table, [], [])
    assert data == (b"D" + struct.pack("!ih", 6, 0)) * 3  # as PostgreSQL sends SELECT FROM t
    assert list(DataRows(table, [], []).blocks(14)) == [data[:14], data[14:]]


def test_a_type_without_binary_output_raises_before_any_block() -> None:
    table = pa.table({"x": pa.array([1.5])})
    with pytest.raises(FeatureNotSupportedError):
        DataRows(table, [9999], [1])


def test_a_row_over_the_message_limit_is_refused() -> None:
    huge = row_encoding._ListFields(np.array([2**31 - 8], dtype=np.int64), [b""])
    with pytest.raises(LimitExceededError) as raised:
        row_encoding._message_sizes([huge], 1)
    assert raised.value.sqlstate == "54000"


@settings(max_examples=60, deadline=None)
@given(
    blobs=st.lists(st.one_of(st.none(), st.binary(max_size=300)), max_size=40),
    block_bytes=st.integers(1, 2000),
    format_code=st.sampled_from([0, 1]),
)
def test_random_blobs_in_random_blocks(blobs, block_bytes: int, format_code: int) -> None:
    table = pa.table({"b": pa.array(blobs, pa.binary()),
                      "i": pa.array(range(len(blobs)), pa.int32())})  # fmt: skip
    oids, formats = [wire_types.BYTEA, wire_types.INT4], [format_code] * 2
    blocks = list(DataRows(table, oids, formats).blocks(block_bytes))
    assert b"".join(blocks) == reference(table, oids, formats)
    assert all(split_messages(block) for block in blocks)


def test_bytea_through_the_server_in_text_and_binary(connect) -> None:
    """Rows spanning several blocks, NULLs included, read back by psycopg both ways."""
    rng = np.random.default_rng(5)
    values = [rng.bytes(int(size)) for size in rng.integers(0, 3000, 400)]
    values[7] = values[123] = None
    values[50] = rng.bytes(400_000)  # larger than a block
    conn = connect(autocommit=True)
    conn.execute("CREATE TABLE blobs (id INTEGER, b BLOB)")
    with conn.cursor() as cursor:
        cursor.executemany("INSERT INTO blobs VALUES (%s, %s)", list(enumerate(values)))
    for binary in (False, True):
        with conn.cursor(binary=binary) as cursor:
            rows = cursor.execute("SELECT id, b FROM blobs ORDER BY id").fetchall()
        assert [row[0] for row in rows] == list(range(400))
        assert [None if row[1] is None else bytes(row[1]) for row in rows] == values


@pytest.mark.parametrize("format_code", [0, 1])
def test_bools_floats_and_integers_over_many_rows(format_code: int) -> None:
    """More rows than one cut of fixed-width pieces (1024), NULLs and float specials."""
    count = 2600
    specials = [float("nan"), float("inf"), float("-inf"), -0.0, 5e-324, 1.7976931348623157e308]
    table = pa.table({
        "flag": pa.array([None if i % 7 == 0 else i % 2 == 0 for i in range(count)]),
        "x": pa.array([None if i % 11 == 0 else specials[i % 6] * (i % 3 + 1)
                       for i in range(count)], pa.float64()),
        "n": pa.array([None if i % 13 == 0 else i * 7919 - 10**6 for i in range(count)],
                      pa.int32()),
    })  # fmt: skip
    oids = [wire_types.BOOL, wire_types.FLOAT8, wire_types.INT4]
    formats = [format_code] * 3
    assert encode_data_rows(table, oids, formats) == reference(table, oids, formats)
    assert encode_data_rows(table.slice(1000, 1100), oids, formats) == reference(
        table.slice(1000, 1100), oids, formats
    )


def test_no_rows_gives_no_blocks_but_still_checks_the_types() -> None:
    empty = pa.chunked_array([], pa.binary())
    assert empty.num_chunks == 0
    table = pa.table({"b": empty})
    assert list(DataRows(table, [wire_types.BYTEA], [0]).blocks()) == []
    assert encode_data_rows(table.slice(0, 0), [wire_types.BYTEA], [1]) == b""
    with pytest.raises(FeatureNotSupportedError):
        DataRows(table, [9999], [1])
