"""The one-codec checks of a move's read and publish, and the byte counts read from two
offsets (round 19, docs/move_profile.md): the same answers as the NumPy and ``nbytes``
ways they replace, without making an ndarray."""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

import storage.partition_log as partition_log_module
from storage.codecs import Codec, decode_column, encode, uniform_codec
from storage.errors import UnsupportedCodecError
from storage.frame_cuts import _data_bytes
from storage.partition_log import PartitionLog
from storage.record_batch import build_wire_batch, data_bytes


def _numpy_uniform(column: pa.Array) -> int | None:
    """The reference: what every message's codec is, found through NumPy."""
    if not len(column) or column.null_count:
        return None
    ids = column.to_numpy(zero_copy_only=False)
    return int(ids[0]) if bool((ids == ids[0]).all()) else None


def test_uniform_codec_names_the_one_codec_or_none() -> None:
    raw, zstd = Codec.RAW.value, Codec.ZSTD.value
    assert uniform_codec(pa.array([raw] * 100, pa.uint8())) == raw
    assert uniform_codec(pa.array([zstd] * 3, pa.uint8())) == zstd
    assert uniform_codec(pa.array([raw] * 50 + [zstd] + [raw] * 49, pa.uint8())) is None
    assert uniform_codec(pa.array([raw, None, raw], pa.uint8())) is None
    assert uniform_codec(pa.array([], pa.uint8())) is None
    mixed = pa.array([zstd] * 7 + [raw] * 90 + [zstd] * 3, pa.uint8())
    assert uniform_codec(mixed.slice(7, 90)) == raw  # a slice: its own rows only
    assert uniform_codec(mixed.slice(6, 90)) is None
    assert uniform_codec(mixed.slice(8, 90)) is None
    assert uniform_codec(pa.chunked_array([pa.array([raw] * 4, pa.uint8())])) == raw
    two_chunks = pa.chunked_array([pa.array([raw], pa.uint8()), pa.array([raw], pa.uint8())])
    assert uniform_codec(two_chunks) is None  # not judged: the callers' NumPy way decides
    assert uniform_codec(pa.array([raw, raw], pa.int64())) is None


def test_uniform_codec_agrees_with_numpy_on_random_columns() -> None:
    rng = random.Random(19)
    for _ in range(400):
        count = rng.randrange(0, 300)
        ids = [Codec.RAW.value] * count
        for _ in range(rng.choice([0, 0, 1, 3])):
            if count:
                ids[rng.randrange(count)] = rng.choice([c.value for c in Codec])
        column = pa.array(ids, pa.uint8())
        start = rng.randrange(0, count + 1)
        piece = column.slice(start, rng.randrange(0, count - start + 1))
        assert uniform_codec(piece) == _numpy_uniform(piece), (ids, start, len(piece))


def test_a_one_codec_batch_is_checked_without_an_ndarray(
    open_partition: Callable[..., PartitionLog], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch of one codec (every move's share) is judged from its bytes: no ``np``
    call and no ``to_pylist``; refusals stay as they were (on main the 100-message batch
    made an ndarray with ``np.frombuffer``)."""
    made: list[str] = []

    class _Counting:
        def __getattr__(self, name: str) -> Any:
            made.append(name)
            return getattr(np, name)

    monkeypatch.setattr(partition_log_module, "np", _Counting())
    partition = open_partition(supported_codecs=frozenset({Codec.RAW}))
    batch = build_wire_batch([b"m%d" % i for i in range(100)], codec=Codec.RAW)
    partition._check_codecs(batch)
    partition._check_codecs(batch.slice(10, 80))
    assert made == []
    zstd = build_wire_batch([encode(Codec.ZSTD, b"z")] * 100, codec=Codec.ZSTD)
    with pytest.raises(UnsupportedCodecError, match="codec zstd is not supported"):
        partition._check_codecs(zstd)
    mixed = build_wire_batch([b"x"] * 100, codec=[Codec.RAW] * 99 + [Codec.GZIP])
    with pytest.raises(UnsupportedCodecError, match="codec gzip is not supported"):
        partition._check_codecs(mixed)
    with pytest.raises(UnsupportedCodecError, match="unknown codec id 9"):
        partition._check_codecs(build_wire_batch([b"x"] * 100, codec=9))


def test_decode_column_of_raw_messages_is_the_column_itself() -> None:
    data = pa.array([os.urandom(10) for _ in range(100)], pa.binary())
    raw = pa.array([Codec.RAW.value] * 100, pa.uint8())
    assert decode_column(raw, data) is data
    assert decode_column(raw.slice(3, 50), data.slice(3, 50)).equals(data.slice(3, 50))
    plain = [b"alpha" * 10, b"beta" * 10, b"gamma"]
    sent = pa.array([encode(Codec.GZIP, plain[0]), plain[1], encode(Codec.ZSTD, plain[2])])
    ids = pa.array([Codec.GZIP.value, Codec.RAW.value, Codec.ZSTD.value], pa.uint8())
    assert decode_column(ids, sent).to_pylist() == plain


@pytest.mark.parametrize(("start", "count"), [(0, 1000), (3, 100), (300, 100), (999, 1),
                                              (0, 0), (5, 0), (13, 77)])  # fmt: skip
def test_data_bytes_are_the_data_columns_nbytes(start: int, count: int) -> None:
    """``data_bytes`` (the staged-bytes count of a moved share) is ``nbytes`` of the data
    column, read from two offsets; ``frame_cuts._data_bytes`` the value range."""
    messages = [os.urandom(i % 50) for i in range(1000)]
    batch = build_wire_batch(messages).slice(start, count)
    column = batch.column("data")
    assert column.buffers()[0] is None  # no validity bitmap: the wire data column's case
    assert data_bytes(batch) == column.nbytes
    assert _data_bytes(column) == sum(len(m) for m in messages[start : start + count])


@pytest.mark.parametrize(("start", "count"), [(0, 1000), (3, 100), (300, 100), (999, 1),
                                              (0, 0), (7, 2), (13, 77), (8, 8)])  # fmt: skip
def test_data_bytes_count_a_validity_bitmap_without_nulls(start: int, count: int) -> None:
    """A data column with a validity bitmap and no null (a batch made by a take, as a
    moved share's may be): ``data_bytes`` is still the column's ``nbytes``, the bitmap's
    bytes that the slice's rows cover included (it was short by them, round 19's R1)."""
    messages = [os.urandom(i % 50) for i in range(1000)]
    batch = build_wire_batch(messages).take(pa.array(range(1000))).slice(start, count)
    column = batch.column("data")
    assert column.buffers()[0] is not None and column.null_count == 0
    assert data_bytes(batch) == column.nbytes
