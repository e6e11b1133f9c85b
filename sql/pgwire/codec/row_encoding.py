"""DataRow messages for a chunk of result rows, built a column at a time.

The same bytes as ``wire_types.encode_rows`` + ``messages.data_row`` (which stay the reference:
``tests/pgwire/test_row_encoding*.py`` compare the two), with few Python operations per
row, because sending result rows is the hot path of every SELECT through the server.

``DataRows(table, oids, formats)`` turns each column into a ``_Fields``: the length word
of every row's field (-1 for NULL), as a numpy array, and a way to get the field bytes of
a run of rows as bytes-like pieces. The common columns never go through Python values:

- ``bytea``/``text`` values are ``memoryview`` slices of the Arrow data buffer, or, when
  they are small, ``bytes`` copied out by Arrow (a string column is cast to binary, so
  its UTF-8 is never decoded and re-encoded);
- ``bytea`` in text format is ``\\x`` + hex: one ``binascii.hexlify`` over the bytes of a
  whole block of rows, sliced by the doubled offsets (the ``\\x`` goes with the length
  word, below);
- integers in text format are Arrow's decimal cast (== ``str(int)``); integers, ``bool``
  and ``float8`` in binary format and ``bool`` in text are a numpy cast to the wire bytes;
- every other column uses ``wire_types.column_encoder`` value by value (the reference encoder).

The fixed-size bytes in front of each field (before the first one the DataRow header
``'D'``, message length and column count; the field's length word; ``\\x`` for text
bytea) are packed for all rows in a numpy record array and cut with one ``struct`` call.
``DataRows.blocks`` then joins fronts and pieces (interleaved by list slice assignment)
into blocks of whole messages of at most ``BLOCK_BYTES`` (a larger row is a block
alone), one block at a time.

Why blocks: a chunk-sized buffer (2 MiB for 1000 rows of 1 KiB ``bytea`` as hex) is
above glibc malloc's default mmap threshold, so each chunk mapped and faulted in fresh
pages (~1000 page faults per chunk, measured, costing about as much as the hex itself);
blocks of ``BLOCK_BYTES`` reuse the same heap memory, block after block, whatever the
process's malloc settings (``topicbase serve`` also raises the threshold:
``engine.malloc_tuning``), and bound what one result holds in memory at a time.

Pure functions and objects; no I/O. Measured on 1000 rows of 1 KiB ``bytea``: ~0.3 ms to
build ``DataRows`` and ~0.5 ms to join its blocks (binary results); in text format the
hex (~2 ns a byte) is most of the cost.
"""

from __future__ import annotations

import binascii
import bisect
import functools
import struct
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from sql.pgwire.codec import wire_types
from storage.errors import LimitExceededError
from storage.limits import WIRE_ROW_MESSAGE_BYTES_MAX

HEX_LEAD = b"\\x"  # text-format bytea: PostgreSQL's bytea_output = hex
# Blocks of DataRow messages (and the hex of a block's bytea) stay below glibc malloc's
# default mmap threshold (128 KiB), so their memory is reused instead of mapped afresh.
BLOCK_BYTES = 120 * 1024
# Below this average size, values are copied out of Arrow (``to_pylist``, or a bytes slice
# of a block's hex) rather than viewed (a ``memoryview`` costs ~150 ns whatever its size;
# a copy of 1 KiB about as much, of 4 KiB far more).
SMALL_VALUE_BYTES = 768
_ROW_OVERHEAD = 4 + 2  # the message length word and the column count
_FIELD_OVERHEAD = 4  # each field's length word
# Arrow string columns whose text of a non-NULL value is the string itself (wire_types.
# _TEXT_ENCODERS / _plain_text return a str unchanged for these), in text and binary format.
_STRING_AS_IS_TEXT = (wire_types.TEXT, wire_types.VARCHAR, wire_types.BPCHAR, wire_types.JSON,
                      wire_types.JSONB, wire_types.UUID)  # fmt: skip
_STRING_AS_IS_BINARY = (wire_types.TEXT, wire_types.VARCHAR, wire_types.BPCHAR, wire_types.JSON)
# NUMERIC: uint64
_INTEGER_TEXT_OIDS = (wire_types.INT2, wire_types.INT4, wire_types.INT8, wire_types.NUMERIC)
_INTEGER_BINARY_WIDTHS = {wire_types.INT2: 2, wire_types.INT4: 4, wire_types.INT8: 8}


class _Fields(ABC):
    """One column's wire fields for ``n`` rows.

    Invariants: ``len(lengths) == n``; ``lengths[i]`` is row i's field length word, -1 for
    NULL; ``pieces(start, stop)`` gives one bytes-like piece per row of ``[start, stop)``:
    for a non-NULL row the field is ``lead + piece`` and ``lengths[i] == len(lead) +
    len(piece)``; a NULL row's piece is empty.
    """

    def __init__(self, lengths: np.ndarray, lead: bytes = b"") -> None:
        self.lengths = lengths
        self.lead = lead
        # The fields as an Arrow ``binary`` array (a NULL row's slot null), when they are
        # the values of one as they are: ``DataRows`` then joins the messages in Arrow.
        self.arrow: pa.Array | None = None

    @abstractmethod
    def pieces(self, start: int, stop: int) -> list[Any]:
        """One piece per row of ``[start, stop)`` (see the class invariants)."""


class _ListFields(_Fields):
    """Pieces made up front (small fixed-width values, or the reference encoder's bytes)."""

    def __init__(self, lengths: np.ndarray, pieces: list[Any]) -> None:
        super().__init__(lengths)
        self._pieces = pieces

    def pieces(self, start: int, stop: int) -> list[Any]:
        return self._pieces[start:stop]


class _BufferFields(_Fields):
    """The values of a binary array, or their hex (``\\x`` is the lead): pieces are made
    per block of rows, as slices of the Arrow data buffer or of one ``binascii.hexlify``
    over the block's bytes (views of large values, copies of small ones), so nothing of
    the size of the whole chunk is allocated (a multi-MiB buffer made and freed per chunk
    costs page faults about as dear as the hex itself)."""

    def __init__(self, array: pa.Array, hex_text: bool) -> None:
        offsets = _offsets(array)
        first, last = int(offsets[0]), int(offsets[-1])
        self._array = array
        self._small = last - first < SMALL_VALUE_BYTES * len(array)  # on average
        buffer = array.buffers()[2]
        self._data = memoryview(buffer)[first:last] if buffer is not None else memoryview(b"")
        self._offsets = offsets
        self._bounds_list: list[int] | None = None  # made by ``pieces``' first call
        lengths = offsets[1:] - offsets[:-1]
        self._hex = hex_text
        if hex_text:
            lengths = lengths * 2 + len(HEX_LEAD)
        nulls = _null_rows(array)
        self._nulls: list[int] = [] if nulls is None else nulls.tolist()
        if nulls is not None:
            lengths[nulls] = -1
        super().__init__(lengths, HEX_LEAD if hex_text else b"")
        if not hex_text and not self._small and pa.types.is_binary(array.type):
            self.arrow = array  # (small values: ``pieces``' copies cost less than the join)

    @property
    def _bounds(self) -> list[int]:
        """Each value's start in ``_data``, and the end of the last (``len + 1`` ints):
        made once, only if pieces are asked for (Arrow's join needs none)."""
        if self._bounds_list is None:
            self._bounds_list = (self._offsets - self._offsets[0]).tolist()
        return self._bounds_list

    def pieces(self, start: int, stop: int) -> list[Any]:
        bounds = self._bounds
        starts = bounds[start:stop]
        stops = bounds[start + 1 : stop + 1]
        if self._hex:
            base = starts[0] if starts else 0
            run: Any = binascii.hexlify(self._data[base : stops[-1] if stops else 0])
            if not self._small:
                run = memoryview(run)
            pieces = [
                run[2 * (begin - base) : 2 * (end - base)]
                for begin, end in zip(starts, stops, strict=True)
            ]
        elif self._small:  # copies, made in C, are cheaper than views of small values
            pieces = self._array.slice(start, stop - start).to_pylist()
        else:
            data = self._data
            pieces = [data[begin:end] for begin, end in zip(starts, stops, strict=True)]
        nulls = self._nulls
        if nulls:  # a NULL slot may still span bytes in Arrow
            for row in nulls[bisect.bisect_left(nulls, start) : bisect.bisect_left(nulls, stop)]:
                pieces[row - start] = b""
        return pieces


def _one_array(column: pa.ChunkedArray) -> pa.Array:
    if column.num_chunks == 1:
        return column.chunk(0)
    return column.combine_chunks()


def _null_rows(array: pa.Array) -> np.ndarray | None:
    """Indexes of the NULL rows (ascending), or None when there are none."""
    if array.null_count == 0:
        return None
    return np.flatnonzero(array.is_null().to_numpy(zero_copy_only=False))


def _offsets(array: pa.Array) -> np.ndarray:
    """The ``len(array) + 1`` value offsets of a binary or large_binary array, as int64."""
    width = np.int64 if pa.types.is_large_binary(array.type) else np.int32
    raw = np.frombuffer(array.buffers()[1], dtype=width, count=len(array) + 1,
                        offset=array.offset * np.dtype(width).itemsize)  # fmt: skip
    return raw.astype(np.int64)


def _as_binary(array: pa.Array) -> pa.Array:
    """A string array viewed as binary (zero-copy: the UTF-8 bytes are kept as they are)."""
    if pa.types.is_large_string(array.type):
        return array.cast(pa.large_binary())
    if pa.types.is_string(array.type):
        return array.cast(pa.binary())
    return array


def _fixed_width_fields(array: pa.Array, packed: np.ndarray) -> _Fields:
    """Fields of ``packed.itemsize`` bytes: ``packed[i]`` is row i's field (whatever it
    holds for a NULL row is not sent)."""
    count = len(array)
    width = packed.dtype.itemsize
    pieces: list[Any] = _cut(packed.tobytes(), width, count)
    lengths = np.full(count, width, dtype=np.int64)
    nulls = _null_rows(array)
    if nulls is not None:
        lengths[nulls] = -1
        for row in nulls.tolist():
            pieces[row] = b""
    return _ListFields(lengths, pieces)


def _integer_fits(data_type: pa.DataType, width: int) -> bool:
    """Every value of ``data_type`` fits a signed integer of ``width`` bytes."""
    bits = data_type.bit_width
    return bits <= 8 * width if pa.types.is_signed_integer(data_type) else bits < 8 * width


def _encoded_fields(array: pa.Array, oid: int, format_code: int) -> _Fields:
    """The reference encoder (``wire_types.column_encoder``), value by value."""
    encode: Callable[[Any], bytes] = wire_types.column_encoder(oid, format_code)
    pieces: list[Any] = [b"" if v is None else encode(v) for v in array.to_pylist()]
    lengths = np.fromiter(map(len, pieces), dtype=np.int64, count=len(pieces))
    nulls = _null_rows(array)
    if nulls is not None:
        lengths[nulls] = -1
    return _ListFields(lengths, pieces)


def column_fields(column: pa.ChunkedArray, oid: int, format_code: int) -> _Fields:
    """The wire fields of one column of type ``oid`` in ``format_code`` (0 text, 1 binary),
    which ``wire_types.column_encoder`` supports."""
    array = _one_array(column)
    data_type = array.type
    is_binary = pa.types.is_binary(data_type) or pa.types.is_large_binary(data_type)
    is_string = pa.types.is_string(data_type) or pa.types.is_large_string(data_type)
    if is_binary and oid == wire_types.BYTEA:
        return _BufferFields(array, hex_text=format_code == 0)
    as_is = _STRING_AS_IS_TEXT if format_code == 0 else _STRING_AS_IS_BINARY
    if is_string and oid in as_is:
        return _BufferFields(_as_binary(array), hex_text=False)
    if pa.types.is_integer(data_type):
        if format_code == 0 and oid in _INTEGER_TEXT_OIDS:  # Arrow's decimal text == str(int)
            return _BufferFields(_as_binary(array.cast(pa.string())), hex_text=False)
        width = _INTEGER_BINARY_WIDTHS.get(oid)
        if format_code == 1 and width is not None and _integer_fits(data_type, width):
            values = array.fill_null(0).to_numpy(zero_copy_only=False)
            return _fixed_width_fields(array, values.astype(f">i{width}"))
    if pa.types.is_boolean(data_type) and oid == wire_types.BOOL:
        truth = array.fill_null(False).to_numpy(zero_copy_only=False)
        if format_code == 1:
            return _fixed_width_fields(array, truth.astype(np.uint8))  # 1 or 0, as "!?"
        return _fixed_width_fields(array, np.where(truth, b"t", b"f"))
    if pa.types.is_float64(data_type) and oid == wire_types.FLOAT8 and format_code == 1:
        values = array.fill_null(0.0).to_numpy(zero_copy_only=False)
        return _fixed_width_fields(array, values.astype(">f8"))  # the same bits as "!d"
    return _encoded_fields(array, oid, format_code)


def _message_sizes(columns: list[_Fields], count: int) -> np.ndarray:
    """Each row's DataRow message length word (the message is one byte more)."""
    sizes = np.full(count, _ROW_OVERHEAD, dtype=np.int64)
    for fields in columns:
        sizes += _FIELD_OVERHEAD + np.maximum(fields.lengths, 0)
    if count and int(sizes.max()) > WIRE_ROW_MESSAGE_BYTES_MAX:
        raise LimitExceededError("a result row is too large to send (over 2 GiB)")
    return sizes


_CUT_RUN = 1024  # pieces per cached Struct (its format has one code per piece)
# ``_joined_in_arrow``'s kernel, called directly (``pc.binary_join_element_wise``'s Python
# wrapper finds the function and makes its options on every call).
_JOIN = pc.get_function("binary_join_element_wise")
_JOIN_OPTIONS = pc.JoinOptions(null_handling="replace", null_replacement="")
_NO_SEPARATOR = pa.scalar(b"", pa.binary())


@functools.lru_cache(maxsize=64)
def _splitter(width: int, count: int) -> struct.Struct:
    return struct.Struct(f"{width}s" * count)


def _cut(data: bytes, width: int, count: int) -> list[bytes]:
    """``data`` (``count * width`` bytes) cut into ``count`` pieces of ``width`` bytes, a
    run of pieces per C call (a slice per piece in Python costs several times as much)."""
    pieces: list[bytes] = []
    for first in range(0, count, _CUT_RUN):
        run = min(_CUT_RUN, count - first)
        pieces += _splitter(width, run).unpack_from(data, first * width)
    return pieces


def _front_records(columns: list[_Fields], sizes: np.ndarray) -> list[np.ndarray]:
    """For each column, a record per row of the bytes in front of its field piece: the
    DataRow header before the first column, then the field's length word and its lead
    (which a NULL field does not have: ``_fronts`` cuts it off)."""
    count = len(sizes)
    fronts: list[np.ndarray] = []
    for index, fields in enumerate(columns):
        layout: list[tuple[str, str]] = []
        if index == 0:
            layout += [("kind", "S1"), ("size", ">i4"), ("columns", ">i2")]
        layout.append(("length", ">i4"))
        if fields.lead:
            layout.append(("lead", f"S{len(fields.lead)}"))
        records = np.empty(count, dtype=np.dtype(layout))
        if index == 0:
            records["kind"] = b"D"
            records["size"] = sizes
            records["columns"] = len(columns)
        records["length"] = fields.lengths
        if fields.lead:
            records["lead"] = fields.lead
        fronts.append(records)
    return fronts


def _fronts(columns: list[_Fields], records: list[np.ndarray]) -> list[list[bytes]]:
    """For each column, the bytes in front of each row's field piece (``_front_records``
    cut per row)."""
    fronts: list[list[bytes]] = []
    for fields, front_records in zip(columns, records, strict=True):
        front = _cut(front_records.tobytes(), front_records.dtype.itemsize, len(front_records))
        if fields.lead:  # a NULL has no lead: its field is the length word alone
            for row in np.flatnonzero(fields.lengths < 0).tolist():
                front[row] = front[row][: -len(fields.lead)]
        fronts.append(front)
    return fronts


def _joined_in_arrow(columns: list[_Fields], records: list[np.ndarray]) -> memoryview | None:
    """Every row's DataRow message, end to end, joined by Arrow's C++ kernel
    (``binary_join_element_wise``: per row, each column's front record then its field,
    a NULL field as nothing) when every column's fields are an Arrow ``binary`` array of
    large values without a lead (a consumer's ``data``); else None. Measured on 1000 rows
    of 1 KiB: 0.20 ms to build and join, against 0.30 ms for ``blocks``' Python join.
    The joined buffer comes from Arrow's memory pool, which keeps and reuses its memory
    (no fresh pages per chunk, unlike glibc's large blocks)."""
    if not columns or any(f.arrow is None or f.lead for f in columns):
        return None
    parts: list[pa.Array] = []
    for fields, front_records in zip(columns, records, strict=True):
        assert fields.arrow is not None
        width, count = front_records.dtype.itemsize, len(front_records)
        starts = np.arange(0, width * (count + 1), width, dtype=np.int32)  # a record a row
        fronts = pa.Array.from_buffers(pa.binary(), count, [
            None, pa.py_buffer(starts), pa.py_buffer(front_records)])  # fmt: skip
        parts += [fronts, fields.arrow]
    joined = _JOIN.call([*parts, _NO_SEPARATOR], _JOIN_OPTIONS)  # no wrapper: ~9 us less
    bounds = joined.buffers()[1], joined.buffers()[2]
    assert bounds[0] is not None and bounds[1] is not None
    offsets = _offsets(joined)
    return memoryview(bounds[1])[int(offsets[0]) : int(offsets[-1])]


class DataRows:
    """The DataRow messages of every row of a table, ready to be joined a block at a time.

    Building it does the per-value work (every column's fields, each row's fixed bytes);
    ``blocks`` then joins the messages, in order, into blocks of whole messages of about
    ``block_bytes`` each (at least one row; a larger row is a block alone), one block per
    step, so nothing of the size of the whole result is allocated. Rows of large binary
    values only (a consumer's ``data``) are joined whole by Arrow instead
    (``_joined_in_arrow``: one buffer of Arrow's pool for the table, which the caller
    keeps to a chunk of rows) and the blocks are views of it. A type or value that
    cannot be sent raises while building (for a type, even with no rows), before any block
    exists.
    """

    def __init__(self, table: pa.Table, oids: list[int], formats: list[int]) -> None:
        assert len(oids) == len(formats) == table.num_columns
        self.count = table.num_rows
        for oid, fmt in zip(oids, formats, strict=True):
            wire_types.column_encoder(oid, fmt)  # refuses a format or binary type it cannot send
        self._columns = [] if self.count == 0 else [
            column_fields(table.column(i), oid, fmt)
            for i, (oid, fmt) in enumerate(zip(oids, formats, strict=True))
        ]  # fmt: skip
        sizes = _message_sizes(self._columns, self.count)
        self._records = _front_records(self._columns, sizes) if self._columns else []
        self._end_array: np.ndarray = np.cumsum(sizes + 1)  # each message's end

    def blocks(self, block_bytes: int | None = None) -> Iterator[bytes | memoryview]:
        """The messages joined into blocks of about ``block_bytes`` (``BLOCK_BYTES``)."""
        block_bytes = block_bytes or BLOCK_BYTES
        count = self.count
        if not self._columns:  # rows without columns: the header alone
            header = b"D" + _ROW_OVERHEAD.to_bytes(4, "big") + bytes(2)
            per_block = max(1, block_bytes // len(header))
            for start in range(0, count, per_block):
                yield header * min(per_block, count - start)
            return
        joined = _joined_in_arrow(self._columns, self._records)
        if joined is not None:  # blocks are views of the one joined buffer
            yield from _views(joined, self._end_array, block_bytes)
            return
        ends: list[int] = self._end_array.tolist()
        fronts = _fronts(self._columns, self._records)
        stride = 2 * len(self._columns)
        start = 0
        while start < count:
            reached = ends[start - 1] if start else 0
            stop = max(start + 1, bisect.bisect_right(ends, reached + block_bytes, start))
            parts: list[Any] = [b""] * (stride * (stop - start))
            for index, (front, fields) in enumerate(zip(fronts, self._columns, strict=True)):
                parts[2 * index :: stride] = front[start:stop]
                parts[2 * index + 1 :: stride] = fields.pieces(start, stop)
            yield b"".join(parts)
            start = stop


def _views(joined: memoryview, ends: np.ndarray, block_bytes: int) -> Iterator[memoryview]:
    """``joined`` (messages end to end; ``ends[i]`` is message i's end) cut into views of
    whole messages of about ``block_bytes`` each (a larger message is a view alone)."""
    assert len(joined) == int(ends[-1])
    count, start, reached = len(ends), 0, 0
    search = ends.searchsorted  # the method: numpy's module function wraps it in Python
    while start < count:
        # the first message past the block's budget, but at least one message a block
        stop = max(start + 1, int(search(reached + block_bytes, "right")))
        end = int(ends[stop - 1])
        yield joined[reached:end]
        start, reached = stop, end


def encode_data_rows(table: pa.Table, oids: list[int], formats: list[int]) -> bytes:
    """The DataRow messages of every row of ``table``, concatenated."""
    return b"".join(DataRows(table, oids, formats).blocks())
