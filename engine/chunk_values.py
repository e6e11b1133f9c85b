"""One value of an Arrow array read straight from its buffers, as ``array[i].as_py()`` gives it.

A key lookup (``engine.key_lookup``) answers one row by taking one value of each projected
column out of the index's Arrow chunks. ``array[i].as_py()`` builds an Arrow scalar and
then the Python value: a few microseconds in a warm loop, tens in the server, where each
lookup runs with cold caches (docs/statement_cost.md, round 9). For the types a lookup
answers most (integers, doubles, strings) the value is read here from ``memoryview``s of
the array's buffers, made once per chunk when the index is built (``ChunkValues``); any
other type falls back to ``as_py`` itself.

Invariants: ``value(i)`` equals ``array[i].as_py()`` for every ``0 <= i < len(array)``
(None where the validity bitmap says null); the views hold the array's buffers (no copy)
and nothing else; an array is never changed after it is wrapped (Arrow arrays are
immutable). Thread-safe: nothing is written after ``__init__``.
"""

from __future__ import annotations

import struct
from typing import Any

import pyarrow as pa

# Arrow types whose value a memoryview of the data buffer gives exactly as ``as_py``: the
# struct format of each (integers of every width, and doubles: the float bits as they are).
_FIXED_FORMATS: dict[pa.DataType, str] = {
    pa.int8(): "b", pa.int16(): "h", pa.int32(): "i", pa.int64(): "q",
    pa.uint8(): "B", pa.uint16(): "H", pa.uint32(): "I", pa.uint64(): "Q",
    pa.float64(): "d",
}  # fmt: skip
# Strings: the format of their offsets buffer.
_STRING_OFFSETS: dict[pa.DataType, str] = {pa.string(): "i", pa.large_string(): "q"}

_OTHER, _FIXED, _STRING = 0, 1, 2
# Bytes one ``ChunkValues`` takes at most (its object and views, not the data they show),
# for an index's size: measured with tracemalloc (review R1-1 of round 14) at 90 (a type
# read through ``as_py``), 466 (integers), 842 (strings, or integers with NULLs) and 1218
# (strings with NULLs); plus the index's slot for it.
VIEW_BYTES = 1400


def _view(buffer: pa.Buffer, fmt: str) -> memoryview:
    """``buffer`` as items of ``fmt`` (a buffer may be longer than a whole number of them)."""
    size = struct.calcsize(fmt)
    raw = memoryview(buffer)
    return raw[: len(raw) // size * size].cast(fmt)


class ChunkValues:
    """The values of one Arrow array (an index chunk of one column), read one at a time."""

    __slots__ = ("_array", "_kind", "_offset", "_offsets", "_validity", "_values")

    def __init__(self, array: pa.Array) -> None:
        self._array = array
        self._offset = array.offset
        kind = array.type
        self._validity: memoryview | None = None
        self._offsets: memoryview | None = None
        self._values: memoryview | None = None
        buffers = array.buffers()
        if kind in _FIXED_FORMATS and buffers[1] is not None:
            self._kind = _FIXED
            self._values = _view(buffers[1], _FIXED_FORMATS[kind])
        elif kind in _STRING_OFFSETS and buffers[1] is not None and buffers[2] is not None:
            self._kind = _STRING
            self._offsets = _view(buffers[1], _STRING_OFFSETS[kind])
            self._values = memoryview(buffers[2])
        elif kind in _STRING_OFFSETS and buffers[1] is not None:  # only empty strings/nulls
            self._kind = _STRING
            self._offsets = _view(buffers[1], _STRING_OFFSETS[kind])
            self._values = memoryview(b"")
        else:
            self._kind = _OTHER
            return
        if array.null_count and buffers[0] is not None:
            self._validity = memoryview(buffers[0])

    def value(self, at: int) -> Any:
        """``array[at].as_py()``."""
        kind = self._kind
        if kind == _OTHER:
            return self._array[at].as_py()
        index = at + self._offset
        validity = self._validity
        if validity is not None and not (validity[index >> 3] >> (index & 7)) & 1:
            return None
        values = self._values
        assert values is not None
        if kind == _FIXED:
            return values[index]
        offsets = self._offsets
        assert offsets is not None
        return str(values[offsets[index] : offsets[index + 1]], "utf-8")
