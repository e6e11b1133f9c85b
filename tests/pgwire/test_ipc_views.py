"""``sql.pgwire.codec.ipc_views``: a record batch's IPC message as buffers, the body's
buffers views of the batch's own memory, read back by pyarrow (full validation) as the
batch; layouts it does not handle give None (the caller serialises with pyarrow).
``copy_data`` cuts such buffers into CopyData of at most ``chunk_bytes`` each.
(The JVM reader reads these messages in tests/spark/test_wire_read.py.)"""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pytest

from sql.pgwire.codec import copy_arrow
from sql.pgwire.codec.ipc_views import batch_views

TYPES = [pa.int32(), pa.int64(), pa.timestamp("us", tz="UTC"), pa.string(), pa.binary()]


def _column(kind: pa.DataType, rows: int, nulls: bool, chance: random.Random) -> pa.Array:
    values = []
    for i in range(rows):
        if nulls and chance.random() < 0.2:
            values.append(None)
        elif kind == pa.string():
            values.append("é" * chance.randrange(0, 40))
        elif kind == pa.binary():
            values.append(chance.randbytes(chance.randrange(0, 1500)))
        else:
            values.append(chance.randrange(-2**31, 2**31) if kind == pa.int32() else i * 7919)
    return pa.array(values, kind)


def _read_back(views: list) -> pa.ipc.Message:
    data = b"".join(bytes(view) for view in views)
    message = pa.ipc.read_message(pa.py_buffer(data))
    return message


@pytest.mark.parametrize("seed", range(12))
def test_batches_of_every_handled_type_read_back_equal(seed: int) -> None:
    chance = random.Random(seed)
    rows = chance.choice([1, 7, 8, 300, 4097])
    kinds = chance.sample(TYPES, chance.randrange(1, len(TYPES) + 1))
    nulls = seed % 2 == 1
    batch = pa.record_batch([_column(k, rows, nulls, chance) for k in kinds],
                            names=[f"c{i}" for i in range(len(kinds))])  # fmt: skip
    start = chance.choice([0, 8, 16]) if rows > 16 else 0
    for piece in (batch, batch.slice(start, rows - start), batch.slice(start, 1)):
        views = batch_views(piece)
        assert views is not None
        got = pa.ipc.read_record_batch(_read_back(views), piece.schema)
        got.validate(full=True)
        assert got.equals(piece)
        assert len(b"".join(bytes(v) for v in views)) % 8 == 0


def test_the_data_is_sent_from_the_batch_own_buffer() -> None:
    data = pa.array([bytes([i % 251]) * 1024 for i in range(2000)], pa.binary())
    batch = pa.record_batch([data], names=["data"]).slice(100, 1500)
    views = batch_views(batch)
    assert views is not None
    base = data.buffers()[2]
    largest = max(views, key=len)
    assert len(largest) == 1500 * 1024
    address = pa.py_buffer(largest).address
    assert base.address <= address < base.address + base.size  # a view, not a copy


def test_offsets_not_starting_at_zero_are_rebased() -> None:
    offsets = np.array([5, 7, 7, 12], dtype=np.int32)
    column = pa.Array.from_buffers(pa.binary(), 3, [None, pa.py_buffer(offsets.tobytes()),
                                                    pa.py_buffer(b"xxxxxabcccdefg")])  # fmt: skip
    batch = pa.record_batch([column], names=["data"])
    views = batch_views(batch)
    assert views is not None
    got = pa.ipc.read_record_batch(_read_back(views), batch.schema)
    got.validate(full=True)
    assert got.column(0).to_pylist() == [b"ab", b"", b"cccde"]


def test_other_layouts_are_left_to_pyarrow() -> None:
    chance = random.Random(5)
    with_nulls = pa.record_batch([_column(pa.int64(), 40, True, chance)], names=["n"])
    assert with_nulls.column(0).null_count
    assert batch_views(with_nulls.slice(3, 20)) is None  # a bitmap not at a whole byte
    mapped = pa.record_batch([pa.array([[("k", b"v")]], pa.map_(pa.string(), pa.binary()))],
                             names=["metadata"])  # fmt: skip
    assert batch_views(mapped) is None
    schema = mapped.schema
    messages = copy_arrow.batch_messages(mapped, schema)  # serialised by pyarrow instead
    stream = copy_arrow.copy_data(schema.serialize()) + messages + copy_arrow.end_messages()
    payloads = _payloads(stream)
    assert pa.ipc.open_stream(b"".join(payloads)).read_all().to_batches()[0].equals(mapped)


def _payloads(pieces: list) -> list[bytes]:
    """The CopyData payloads of ``pieces`` (headers and payload slices, in order)."""
    data = b"".join(bytes(piece) for piece in pieces)
    payloads, at = [], 0
    while at < len(data):
        assert data[at:at + 1] == b"d"
        length = int.from_bytes(data[at + 1:at + 5], "big")
        payloads.append(data[at + 5:at + 1 + length])
        at += 1 + length
    return payloads


@pytest.mark.parametrize("chunk", [1, 5, 64, 65536])
def test_copy_data_cuts_buffers_end_to_end_into_bounded_messages(chunk: int) -> None:
    chance = random.Random(chunk)
    parts = [chance.randbytes(chance.choice([0, 1, 3, 64, 100, 5000])) for _ in range(30)]
    views = [memoryview(part) if i % 2 else part for i, part in enumerate(parts)]
    payloads = _payloads(copy_arrow.copy_data(views, chunk))
    assert b"".join(payloads) == b"".join(parts)
    assert all(len(p) == chunk for p in payloads[:-1]) and 0 < len(payloads[-1]) <= chunk
