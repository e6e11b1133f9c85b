"""Tests of storage/record_batch.py: the frame format, wire batches and their limits."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from storage import limits
from storage.codecs import Codec
from storage.errors import InvalidParameterValueError, LimitExceededError
from storage.record_batch import (
    HEADER_BYTES,
    READ_SCHEMA,
    WIRE_SCHEMA,
    build_wire_batch,
    check_wire_batch,
    decode_body,
    decode_header,
    encode_frame,
    frame_checksum_ok,
    serialize_body,
)


def _frame(batch: pa.RecordBatch, base_offset: int = 100, written_at_us: int = 5) -> bytes:
    body = serialize_body(batch)
    return encode_frame(
        body, base_offset=base_offset, written_at_us=written_at_us, record_count=batch.num_rows
    )


def _checksum_ok(frame: bytes) -> bool:
    header = decode_header(frame)
    assert header is not None
    view = memoryview(frame)
    return frame_checksum_ok(header, view[:HEADER_BYTES], view[HEADER_BYTES:])


def _decode(frame: bytes) -> pa.RecordBatch:
    header = decode_header(frame)
    assert header is not None
    return decode_body(header, pa.py_buffer(frame[HEADER_BYTES:]))


# -- frames -------------------------------------------------------------------------------


@settings(max_examples=50, deadline=None)
@given(
    data=st.lists(st.binary(max_size=300), min_size=1, max_size=30),
    base_offset=st.integers(0, 2**40),
    written_at_us=st.integers(0, 2**62),
)
def test_frame_round_trip_keeps_every_message(
    data: list[bytes], base_offset: int, written_at_us: int
) -> None:
    batch = build_wire_batch(data, seq_no=list(range(len(data))), producer_id="p")
    frame = _frame(batch, base_offset, written_at_us)
    header = decode_header(frame)
    assert header is not None
    assert len(frame) % 8 == 0 and header.frame_bytes == len(frame)
    assert (header.base_offset, header.record_count) == (base_offset, len(data))
    assert header.next_offset == base_offset + len(data)
    assert _checksum_ok(frame)
    read = _decode(frame)
    assert read.schema.equals(READ_SCHEMA)
    assert read.column("data").to_pylist() == data
    assert read.column("offset").to_pylist() == list(range(base_offset, base_offset + len(data)))
    written = read.column("written_at").cast(pa.int64()).to_pylist()
    assert written == [written_at_us] * len(data)


def test_body_is_padded_to_a_multiple_of_8_bytes() -> None:
    for size in range(1, 17):
        body = serialize_body(build_wire_batch([b"x" * size]))
        assert len(body) % 8 == 0


@pytest.mark.parametrize("position", [HEADER_BYTES, HEADER_BYTES + 17, -1])
def test_flipped_body_byte_fails_the_checksum(position: int) -> None:
    frame = bytearray(_frame(build_wire_batch([b"hello", b"world"])))
    frame[position] ^= 0x40
    assert not _checksum_ok(bytes(frame))


@pytest.mark.parametrize("position", [8, 16, 24, 28, 32, 36])
def test_flipped_header_field_fails_the_checksum(position: int) -> None:
    frame = bytearray(_frame(build_wire_batch([b"hello"])))
    frame[position] ^= 0x01
    header = decode_header(bytes(frame))
    assert header is not None
    assert not _checksum_ok(bytes(frame))


def test_header_with_wrong_magic_is_not_a_frame_start() -> None:
    frame = bytearray(_frame(build_wire_batch([b"hello"])))
    frame[0:4] = b"XXXX"
    assert decode_header(bytes(frame)) is None


# -- wire batches ---------------------------------------------------------------------------


def test_build_wire_batch_fills_every_column() -> None:
    batch = build_wire_batch(
        [b"a", b"", b"ccc"],
        seq_no=[1, None, 3],
        producer_id=["p1", None, "p2"],
        message_group_id="g",
        created_at_us=[10, 20, 30],
        codec=[Codec.RAW, Codec.GZIP, Codec.ZSTD],
        metadata=[{"k": b"v"}, None, {"a": b"1", "b": b"2"}],
    )
    assert batch.schema.equals(WIRE_SCHEMA)
    assert batch.column("data").to_pylist() == [b"a", b"", b"ccc"]
    assert batch.column("seq_no").to_pylist() == [1, None, 3]
    assert batch.column("producer_id").to_pylist() == ["p1", None, "p2"]
    assert batch.column("message_group_id").to_pylist() == ["g", "g", "g"]
    assert batch.column("created_at").cast(pa.int64()).to_pylist() == [10, 20, 30]
    assert batch.column("codec").to_pylist() == [1, 2, 4]
    assert batch.column("metadata").to_pylist() == [[("k", b"v")], None, [("a", b"1"), ("b", b"2")]]
    check_wire_batch(batch)


def test_build_wire_batch_leaves_unset_columns_null() -> None:
    batch = build_wire_batch([b"a", b"b"])
    for name in ("seq_no", "producer_id", "message_group_id", "created_at", "metadata"):
        assert batch.column(name).null_count == 2, name
    assert batch.column("codec").to_pylist() == [Codec.RAW, Codec.RAW]


def test_scalar_arguments_apply_to_every_message() -> None:
    batch = build_wire_batch([b"a", b"b", b"c"], producer_id="p", created_at_us=7, codec=4)
    assert batch.column("producer_id").to_pylist() == ["p"] * 3
    assert batch.column("created_at").cast(pa.int64()).to_pylist() == [7] * 3
    assert batch.column("codec").to_pylist() == [4] * 3


def test_read_batch_keeps_metadata_and_nulls() -> None:
    batch = build_wire_batch([b"a", b"b"], metadata=[{"key": b"\x00\xff"}, None])
    read = _decode(_frame(batch))
    assert read.column("metadata").to_pylist() == [[("key", b"\x00\xff")], None]
    assert read.column("seq_no").to_pylist() == [None, None]


def test_sliced_wire_batch_round_trips_only_its_rows() -> None:
    batch = build_wire_batch([b"a", b"bb", b"ccc", b"dddd"]).slice(1, 2)
    check_wire_batch(batch)
    assert _decode(_frame(batch)).column("data").to_pylist() == [b"bb", b"ccc"]


# -- limits and schema checks ---------------------------------------------------------------


def test_message_over_the_size_limit_raises_54000() -> None:
    batch = build_wire_batch([b"small", b"x" * (limits.MESSAGE_BYTES_MAX + 1)])
    with pytest.raises(LimitExceededError) as raised:
        check_wire_batch(batch)
    assert raised.value.sqlstate == "54000"
    assert str(limits.MESSAGE_BYTES_MAX) in str(raised.value)


def test_message_at_the_size_limit_is_accepted() -> None:
    check_wire_batch(build_wire_batch([b"x" * limits.MESSAGE_BYTES_MAX]))


def test_batch_with_too_many_messages_raises_54000(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "BATCH_MESSAGES_MAX", 3)
    check_wire_batch(build_wire_batch([b"a"] * 3))
    with pytest.raises(LimitExceededError):
        check_wire_batch(build_wire_batch([b"a"] * 4))


def test_batch_over_the_byte_limit_raises_54000(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "BATCH_BYTES_MAX", 1000)
    with pytest.raises(LimitExceededError):
        check_wire_batch(build_wire_batch([b"x" * 600, b"y" * 600]))


def test_batch_of_another_schema_is_refused() -> None:
    other = pa.RecordBatch.from_pydict({"data": [b"a"]})
    with pytest.raises(InvalidParameterValueError) as raised:
        check_wire_batch(other)
    assert raised.value.sqlstate == "22023"


def test_batch_with_a_missing_column_is_refused() -> None:
    batch = build_wire_batch([b"a"])
    with pytest.raises(InvalidParameterValueError):
        check_wire_batch(batch.drop_columns(["metadata"]))


def test_empty_batch_is_refused() -> None:
    with pytest.raises(InvalidParameterValueError):
        check_wire_batch(build_wire_batch([]))
