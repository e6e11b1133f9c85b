"""engine.chunk_values: a value read from an array's buffers equals ``as_py``'s, for every
type (the ones read from buffers and the ones that fall back), nulls, sliced arrays and
strings of every kind."""

from __future__ import annotations

import math
import random
import struct

import pyarrow as pa
import pytest

from engine.chunk_values import ChunkValues


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
