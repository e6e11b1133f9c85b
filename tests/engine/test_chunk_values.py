"""engine.chunk_values: a value read from an array's buffers equals ``as_py``'s, for every
type (the ones read from buffers and the ones that fall back), nulls, sliced arrays and
strings of every kind."""

from __future__ import annotations

import math
import random
import struct

import numpy as np
import pyarrow as pa
import pytest

from engine import key_lookup
from engine.chunk_values import VIEW_BYTES, ChunkValues


def _same(left: object, right: object) -> bool:
    if isinstance(left, float) and isinstance(right, float):
        return struct.pack("<d", left) == struct.pack("<d", right)  # NaN and -0.0 by bits
    return type(left) is type(right) and left == right


def _arrays() -> list[pa.Array]:
    rng = random.Random(5)
    ints = {
        pa.int8(): (-(2**7), 2**7 - 1), pa.int16(): (-(2**15), 2**15 - 1),
        pa.int32(): (-(2**31), 2**31 - 1), pa.int64(): (-(2**63), 2**63 - 1),
        pa.uint8(): (0, 2**8 - 1), pa.uint16(): (0, 2**16 - 1),
        pa.uint32(): (0, 2**32 - 1), pa.uint64(): (0, 2**64 - 1),
    }  # fmt: skip
    arrays = []
    for kind, (low, high) in ints.items():
        values = [low, high, 0, *[rng.randint(low, high) for _ in range(50)]]
        arrays.append(pa.array(values, kind))
        arrays.append(pa.array([None if i % 3 == 0 else v for i, v in enumerate(values)], kind))
    doubles = [0.0, -0.0, math.inf, -math.inf, math.nan, 1e308, 5e-324, 0.1,
               *[rng.uniform(-1e9, 1e9) for _ in range(20)]]  # fmt: skip
    arrays.append(pa.array(doubles, pa.float64()))
    arrays.append(pa.array([None, *doubles, None], pa.float64()))
    texts = ["", "a", "ä€𝄞", "nul\x00inside", "x" * 300, *[str(rng.random()) for _ in range(20)]]
    for kind in (pa.string(), pa.large_string()):
        arrays.append(pa.array(texts, kind))
        arrays.append(pa.array([None, *texts, None, ""], kind))
        arrays.append(pa.array(["", "", None], kind))
        arrays.append(pa.array([None, None], kind))
    # Types read through ``as_py`` (the fallback): the values must come out the same too.
    arrays.append(pa.array([1.5, None, -2.25], pa.float32()))
    arrays.append(pa.array([True, None, False], pa.bool_()))
    arrays.append(pa.array([b"\x00\xff", None, b""], pa.binary()))
    arrays.append(pa.array([[1, 2], None, []], pa.list_(pa.int32())))
    arrays.append(pa.array([1, None, 3], pa.timestamp("us")))
    return arrays


@pytest.mark.parametrize("array", _arrays(), ids=lambda a: str(a.type))
def test_every_value_is_as_py_gives_it(array: pa.Array) -> None:
    for piece in (array, array.slice(1), array.slice(2, max(len(array) - 3, 0))):
        values = ChunkValues(piece)
        for at in range(len(piece)):
            assert _same(values.value(at), piece[at].as_py()), (piece.type, at)


def test_values_of_a_chunked_column_read_each_chunk() -> None:
    column = pa.chunked_array([pa.array(["a", None]), pa.array(["bc", "d"]).slice(1)])
    got = [ChunkValues(chunk).value(at) for chunk in column.chunks for at in range(len(chunk))]
    assert got == column.to_pylist()


# -- the index's use of them (engine.key_lookup._Index) ---------------------------------------
def _index_of(chunk_sizes: list[int]) -> key_lookup._Index:
    """An index over ``k`` = 0, 1, ... in chunks of ``chunk_sizes`` rows, ``v`` = 'v<k>'."""
    batches, start = [], 0
    for size in chunk_sizes:
        keys = list(range(start, start + size))
        batches.append(pa.record_batch([pa.array(keys, pa.int64()),
                                        pa.array([f"v{k}" for k in keys])], names=["k", "v"]))
        start += size
    table = pa.Table.from_batches(batches)
    keys = np.arange(start, dtype=np.int64)
    return key_lookup._indexed(table, keys, ("BIGINT", "VARCHAR"), (0,), (0, 0), 0.0)


@pytest.mark.parametrize("chunk_sizes", [[2, 2, 5], [3, 3, 3, 1], [4], [1, 7, 2], [2048, 2048, 9]])
def test_every_row_is_found_in_its_chunk(chunk_sizes: list[int]) -> None:
    """Chunks of one size but a longer last one (review R1-5), a shorter last one, one chunk,
    chunks of different sizes (found by search)."""
    index = _index_of(chunk_sizes)
    for row in range(sum(chunk_sizes)):
        assert index.row((row,)) == row
        assert index.cell(1, row) == f"v{row}"
    assert index.row((sum(chunk_sizes),)) is None and index.row((-1,)) is None


def test_values_are_made_for_the_chunks_read_and_counted_at_their_most() -> None:
    """A build makes no views (review R1-1: they were made for every chunk and column before
    the cap was checked); a lookup makes those of its chunk and columns; the index's size
    counts every chunk and column at ``VIEW_BYTES``."""
    index = _index_of([4, 4, 4, 4])
    assert all(values is None for column in index.values for values in column)
    assert index.cell(1, 9) == "v9"
    made = [[values is not None for values in column] for column in index.values]
    assert made == [[False] * 4, [False, False, True, False]]
    assert index.nbytes >= index.table.nbytes + 16 * 8 + VIEW_BYTES * 4 * 2
