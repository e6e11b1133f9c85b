"""``row_encoding.DataRows``' Arrow join: rows whose columns are all large binary values (a
consumer's ``data``) are joined into DataRow messages by Arrow's C++ kernel, and give the
same bytes as the reference path (``wire_types.encode_rows`` + ``messages.data_row``), in
blocks of whole messages, NULLs (even a NULL slot that spans bytes) and sliced arrays
included."""

from __future__ import annotations

import struct

import numpy as np
import pyarrow as pa
import pytest

from sql.pgwire.codec import messages as m
from sql.pgwire.codec import row_encoding, wire_types
from sql.pgwire.codec.row_encoding import DataRows


def reference(table: pa.Table, oids: list[int], formats: list[int]) -> bytes:
    return b"".join(m.data_row(row) for row in wire_types.encode_rows(table, oids, formats))


def whole_messages(block: bytes) -> int:
    """How many DataRow messages ``block`` holds; fails unless it is whole messages."""
    at = count = 0
    while at < len(block):
        assert block[at : at + 1] == b"D"
        at += 1 + struct.unpack("!i", block[at + 1 : at + 5])[0]
        count += 1
    assert at == len(block)
    return count


@pytest.fixture
def joins(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Whether each ``blocks`` call joined in Arrow."""
    seen: list[bool] = []
    original = row_encoding._joined_in_arrow

    def spying(columns, records):  # type: ignore[no-untyped-def]
        joined = original(columns, records)
        seen.append(joined is not None)
        return joined

    monkeypatch.setattr(row_encoding, "_joined_in_arrow", spying)
    return seen


def _values(count: int, seed: int) -> list[bytes | None]:
    rng = np.random.default_rng(seed)
    return [None if i % 7 == 3 else rng.bytes(int(rng.integers(800, 3000)))
            for i in range(count)]  # fmt: skip


@pytest.mark.parametrize("block_bytes", [1, 5000, 120 * 1024, 10**8])
def test_large_binary_columns_join_in_arrow_as_the_reference_encodes(
        joins: list[bool], block_bytes: int) -> None:  # fmt: skip
    table = pa.table({
        "data": pa.array(_values(300, 1), pa.binary()),
        "text": pa.array([None if v is None else v.hex() for v in _values(300, 2)]),
    })  # fmt: skip
    for format_code in (0, 1):
        oids, formats = [wire_types.BYTEA, wire_types.TEXT], [1, format_code]
        blocks = [bytes(block) for block in DataRows(table, oids, formats).blocks(block_bytes)]
        assert b"".join(blocks) == reference(table, oids, formats)
        counts = [whole_messages(block) for block in blocks]
        assert sum(counts) == 300
        assert all(count == 1 or len(block) <= block_bytes
                   for count, block in zip(counts, blocks, strict=True))  # fmt: skip
    assert joins == [True, True]


def test_a_sliced_table_and_a_null_slot_with_bytes_join_as_the_reference(
        joins: list[bool]) -> None:  # fmt: skip
    big = b"x" * 2000
    offsets = np.array([0, 2000, 2003, 4003], dtype=np.int32)
    validity = np.packbits(np.array([1, 0, 1, 0, 0, 0, 0, 0], dtype=np.uint8), bitorder="little")
    buffers = [pa.py_buffer(validity), pa.py_buffer(offsets), pa.py_buffer(big + b"XYZ" + big)]
    spanning = pa.Array.from_buffers(pa.binary(), 3, buffers)
    assert spanning.to_pylist() == [big, None, big]
    sliced = pa.table({"data": pa.array(_values(50, 3), pa.binary())}).slice(7, 30)
    for table in (pa.table({"data": spanning}), sliced):
        data = b"".join(DataRows(table, [wire_types.BYTEA], [1]).blocks())
        assert data == reference(table, [wire_types.BYTEA], [1])
    assert joins == [True, True]


def test_small_values_hex_text_and_other_types_keep_the_python_join(joins: list[bool]) -> None:
    small = pa.table({"data": pa.array([b"ab", None, b"c" * 100], pa.binary())})
    large = pa.table({"data": pa.array(_values(20, 4), pa.binary()),
                      "n": pa.array(range(20), pa.int64())})  # fmt: skip
    cases = [(small, [wire_types.BYTEA], [1]), (large, [wire_types.BYTEA, wire_types.INT8], [1, 1]),
             (large.select(["data"]), [wire_types.BYTEA], [0])]  # fmt: skip
    for table, oids, formats in cases:
        data = b"".join(DataRows(table, oids, formats).blocks())
        assert data == reference(table, oids, formats)
    assert joins == [False, False, False]
