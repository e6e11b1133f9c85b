"""Many small frame bodies decoded at once, column by column, with numpy (issue 14).

A consumer read over 1000 partitions that hold a few messages each meets thousands
of frames of ~5 messages. ``pa.ipc.read_record_batch`` costs ~7 us of CPU per frame
and ``concat_batches`` of the results as much again. Every body is an Arrow IPC record
batch message of ``WIRE_SCHEMA`` (no compression), so the bodies' flatbuffer metadata
share one layout and differ only in numbers: the row count, each field's length and
null count, each buffer's offset and length, the body length.

``decode_wire_bodies`` parses the first body's metadata (``_Layout``), checks that
every body has exactly the same bytes outside those numbers (hence the same layout:
the parse reads nothing else), reads the numbers of all bodies in one numpy step, and
builds each column of the concatenated wire batch from the bodies' buffers:
fixed-width values and validity bits gathered by index, variable-width offsets
rebased, their bytes copied once. It returns None whenever a body does not match (a
layout of another writer, compression, a buffer out of bounds, fewer bytes than the
metadata): the caller then decodes with Arrow frame by frame, as before.

Invariant: for slices ``(body, skip, rows)`` that it accepts, the result equals
``pa.concat_batches`` of ``pa.ipc.read_record_batch(body, WIRE_SCHEMA).slice(skip,
rows)`` (the tests compare the two on random batches with nulls and maps).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from storage.record_batch import METADATA_TYPE, TIMESTAMP, WIRE_SCHEMA

WIRE_NAMES = tuple(WIRE_SCHEMA.names)
IPC_CONTINUATION = 0xFFFFFFFF
RECORD_BATCH_TYPE = 3  # MessageHeader.RecordBatch in Arrow's Message.fbs
# WIRE_SCHEMA flattened: nodes (fields in depth-first order) and their buffers.
WIRE_NODES = 10  # 7 fields, then the map's struct "entries" and its key and value
WIRE_BUFFERS = 24
# Node index -> its buffer indexes in the body.
SEQ_NO, PRODUCER_ID, GROUP_ID, CREATED_AT, CODEC, DATA, METADATA, ENTRIES, KEY, VALUE = range(10)
_NODE_BUFFERS = (
    (0, 1),
    (2, 3, 4),
    (5, 6, 7),
    (8, 9),
    (10, 11),
    (12, 13, 14),
    (15, 16),
    (17,),
    (18, 19, 20),
    (21, 22, 23),
)
assert sum(len(b) for b in _NODE_BUFFERS) == WIRE_BUFFERS


def node_buffers(node: int) -> tuple[int, ...]:
    """The body's buffer indexes of node ``node`` (``SEQ_NO`` .. ``VALUE``)."""
    return _NODE_BUFFERS[node]


@dataclass(frozen=True)
class _Layout:
    """Where the numbers sit in a body's first ``prefix`` bytes (continuation, length,
    metadata), and what every other byte of that prefix must be."""

    prefix: int  # 8 + metadata length: where the body's buffers start
    body_length_at: int  # int64: the message's body length (bytes after the prefix)
    length_at: int  # int64 row count
    nodes_at: int  # WIRE_NODES x (length, null_count) int64
    buffers_at: int  # WIRE_BUFFERS x (offset, length) int64
    structure: np.ndarray  # bool per prefix byte: not one of the numbers
    template: np.ndarray  # the first body's prefix bytes


def read_u32(raw: bytes, at: int) -> int:
    return int(struct.unpack_from("<I", raw, at)[0])


def table_fields(raw: bytes, table: int) -> list[int]:
    """A flatbuffer table's field positions (0: absent), absolute in ``raw``."""
    vtable = table - int(struct.unpack_from("<i", raw, table)[0])
    size = int(struct.unpack_from("<H", raw, vtable)[0])
    count = (size - 4) // 2
    offsets = struct.unpack_from(f"<{count}H", raw, vtable + 4)
    return [table + o if o else 0 for o in offsets]


def wire_layout(body: pa.Buffer) -> _Layout | None:
    """Parse one body's metadata (Arrow ``Message`` -> ``RecordBatch``)."""
    if body.size < 8:
        return None
    view = memoryview(body)
    continuation, length = struct.unpack_from("<Ii", view, 0)
    if (continuation != IPC_CONTINUATION or length <= 0 or (8 + length) % 8
            or body.size < 8 + length):  # fmt: skip
        return None
    raw = bytes(view[: 8 + length])
    try:
        message = 8 + read_u32(raw, 8)
        fields = table_fields(raw, message) + [0] * 5
        if not fields[1] or raw[fields[1]] != RECORD_BATCH_TYPE or not fields[2] or not fields[3]:
            return None
        if fields[4]:
            return None  # custom metadata: not what our encoder writes
        batch = fields[2] + read_u32(raw, fields[2])
        batch_fields = table_fields(raw, batch) + [0] * 5
        if not batch_fields[0] or not batch_fields[1] or not batch_fields[2] or batch_fields[3]:
            return None  # no length, nodes or buffers, or compressed
        if batch_fields[4] and read_u32(raw, batch_fields[4] + read_u32(raw, batch_fields[4])):
            return None  # variadic buffers (views): not in WIRE_SCHEMA
        nodes = batch_fields[1] + read_u32(raw, batch_fields[1])
        buffers = batch_fields[2] + read_u32(raw, batch_fields[2])
        if read_u32(raw, nodes) != WIRE_NODES or read_u32(raw, buffers) != WIRE_BUFFERS:
            return None
    except (struct.error, IndexError):
        return None
    nodes_at, buffers_at = nodes + 4, buffers + 4
    numbers = [
        (fields[3], 8),
        (batch_fields[0], 8),
        (nodes_at, 16 * WIRE_NODES),
        (buffers_at, 16 * WIRE_BUFFERS),
    ]
    if any(at % 8 or at + size > len(raw) for at, size in numbers):
        return None
    structure = np.ones(len(raw), dtype=bool)
    for at, size in numbers:
        structure[at : at + size] = False
    assert all(size % 8 == 0 for _, size in numbers)  # so words are wholly one or the other
    template = np.frombuffer(raw, dtype=np.uint8).copy()
    return _Layout(len(raw), fields[3], batch_fields[0], nodes_at, buffers_at, structure, template)


def _heads(bodies: Sequence[pa.Buffer]) -> tuple[_Layout, np.ndarray, np.ndarray] | None:
    """The first body's layout, every body's size and its metadata prefix (one row of
    ``layout.prefix`` bytes a body), or None when some body is shorter than that prefix,
    not a multiple of 8 long, or differs from the first one's in a byte that is not a
    number (so every body has that layout, only its numbers are left to check)."""
    count = len(bodies)
    layout = wire_layout(bodies[0])
    if layout is None:
        return None
    prefix = layout.prefix
    sizes = np.fromiter((body.size for body in bodies), dtype=np.int64, count=count)
    if int(sizes.min()) < prefix or np.any(sizes % 8):
        return None
    heads = np.empty((count, prefix), dtype=np.uint8)
    _copy_ranges(heads, bodies, [0] * count, [prefix] * count)
    if not np.array_equal(heads[:, layout.structure], np.broadcast_to(
        layout.template[layout.structure], (count, int(layout.structure.sum()))
    )):  # fmt: skip
        return None
    return layout, sizes, heads


def decode_wire_bodies(
    bodies: Sequence[pa.Buffer], counts: np.ndarray, skips: np.ndarray, rows: np.ndarray
) -> pa.RecordBatch | None:
    """The wire batch of rows ``skips[k] .. skips[k] + rows[k] - 1`` of each body, in
    order, or None if some body does not have the first one's layout or does not hold
    ``counts[k]`` rows (see the module).

    The bodies' bytes are copied once: the ``data`` bytes of the rows taken straight
    into the column, everything else (metadata and the small buffers) into one array
    that the other columns are gathered from."""
    count = len(bodies)
    assert count > 0 and len(skips) == count and len(rows) == count
    headed = _heads(bodies)
    if headed is None:
        return None
    layout, sizes, heads = headed
    prefix = layout.prefix
    checked = _numbers(layout, heads.view("<i8"), sizes, counts, skips, rows)
    if checked is None:
        return None
    nodes, buffers = checked
    positions = buffers[:, :, 0]
    # Every body without its ``data`` bytes (from that buffer to the next one), joined.
    data_buffer = _NODE_BUFFERS[DATA][2]
    cut_from = prefix + positions[:, data_buffer]
    cut_to = prefix + positions[:, data_buffer + 1]
    kept = sizes - (cut_to - cut_from)
    rest = np.empty(int(kept.sum()), dtype=np.uint8)
    _copy_ranges(rest, bodies, [0] * count, cut_from.tolist(), cut_to.tolist(), sizes.tolist())
    data_at = cut_from.copy()  # where the data bytes start in each body
    positions[:, data_buffer + 1 :] -= (cut_to - cut_from)[:, None]
    columns = _Columns(rest, _starts(kept) + prefix, nodes, buffers)
    return _wire_batch(columns, skips, rows, {"bodies": bodies, "data_at": data_at})


def decode_wire_spans(
    big: np.ndarray,
    starts: np.ndarray,
    sizes: np.ndarray,
    counts: np.ndarray,
    skips: np.ndarray,
    rows: np.ndarray,
    names: tuple[str, ...] = WIRE_NAMES,
) -> pa.RecordBatch | None:
    """As ``decode_wire_bodies``, for bodies that lie in one array: body ``k`` is
    ``big[starts[k] : starts[k] + sizes[k]]`` (a read of many partitions into one
    buffer, ``storage.bulk_scan``). Nothing but the ``data`` bytes is copied: the other
    columns are gathered from ``big`` by index. ``big`` is uint8, its length a multiple
    of 8; the starts must be 8-aligned (frames are), else None. ``names``: only those
    columns (``_wire_batch``; a consumer's ``SELECT data``: no producer ids, metadata
    or seq_nos gathered)."""
    count = len(starts)
    assert count > 0 and len(sizes) == count and len(skips) == count and len(rows) == count
    assert big.dtype == np.uint8 and big.size % 8 == 0
    if np.any(starts % 8) or np.any(starts < 0) or np.any(starts + sizes > big.size):
        return None
    first = int(starts[0])
    layout = wire_layout(pa.py_buffer(big[first : first + int(sizes[0])]))
    if layout is None:
        return None
    prefix = layout.prefix
    if int(sizes.min()) < prefix or np.any(sizes % 8):
        return None
    numbers = big.view("<i8")[(starts // 8)[:, None] + np.arange(prefix // 8)]
    # Compared word by word: each number is 8 bytes at an 8-aligned place (``wire_layout``),
    # so every word of the prefix is wholly structure or wholly a number.
    words = layout.structure[::8]
    if not np.array_equal(numbers[:, words], np.broadcast_to(
        layout.template.view("<i8")[words], (count, int(words.sum()))
    )):  # fmt: skip
        return None
    checked = _numbers(layout, numbers, sizes, counts, skips, rows)
    if checked is None:
        return None
    nodes, buffers = checked
    columns = _Columns(big, starts + prefix, nodes, buffers)
    return _wire_batch(columns, skips, rows, {"spans": True}, names)


def _wire_batch(columns: _Columns, skips: np.ndarray, rows: np.ndarray,
                data_from: dict[str, Any],
                names: tuple[str, ...] = WIRE_NAMES) -> pa.RecordBatch | None:  # fmt: skip
    """The ``WIRE_SCHEMA`` batch of the rows ``columns`` finds (``data_from``: where the
    ``data`` bytes come from, as ``_Columns.variable`` takes it), or None where a body's
    buffers do not fit its numbers (the caller decodes with Arrow instead). ``names``:
    only those columns, in that order (each a ``WIRE_SCHEMA`` name, once); the others
    are not built (nor checked: what is built is checked as in the whole batch)."""
    builders = {
        "seq_no": lambda: columns.fixed(SEQ_NO, skips, rows, 8, pa.int64()),
        "producer_id": lambda: columns.variable(PRODUCER_ID, skips, rows, pa.string()),
        "message_group_id": lambda: columns.variable(GROUP_ID, skips, rows, pa.string()),
        "created_at": lambda: columns.fixed(CREATED_AT, skips, rows, 8, TIMESTAMP),
        "codec": lambda: columns.fixed(CODEC, skips, rows, 1, pa.uint8()),
        "data": lambda: columns.variable(DATA, skips, rows, pa.binary(), **data_from),
        "metadata": lambda: columns.map(skips, rows),
    }
    assert tuple(builders) == WIRE_NAMES and len(set(names)) == len(names)
    try:
        arrays = [builders[name]() for name in names]
    except _Mismatch:
        return None
    if names == WIRE_NAMES:
        return pa.RecordBatch.from_arrays(arrays, schema=WIRE_SCHEMA)
    schema = pa.schema([WIRE_SCHEMA.field(name) for name in names])
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _numbers(
    layout: _Layout,
    numbers: np.ndarray,
    sizes: np.ndarray,
    counts: np.ndarray,
    skips: np.ndarray,
    rows: np.ndarray,
) -> tuple[np.ndarray, np.ndarray] | None:
    """The nodes ``(count, WIRE_NODES, 2)`` and buffers ``(count, WIRE_BUFFERS, 2)`` of the bodies
    whose metadata words are ``numbers`` (one row per body), checked: buffers in order
    within their body's bytes, rows within the batch, every top field as long as the
    batch. None when a body fails."""
    count = len(numbers)
    prefix = layout.prefix
    lengths = numbers[:, layout.length_at // 8]
    nodes = numbers[:, layout.nodes_at // 8 : layout.nodes_at // 8 + 2 * WIRE_NODES]
    nodes = nodes.reshape(count, WIRE_NODES, 2)
    buffers = numbers[:, layout.buffers_at // 8 : layout.buffers_at // 8 + 2 * WIRE_BUFFERS]
    buffers = buffers.reshape(count, WIRE_BUFFERS, 2).copy()
    positions, extents = buffers[:, :, 0], buffers[:, :, 1]
    if np.any(extents < 0) or np.any(positions % 8) or np.any(positions < 0):
        return None
    if np.any(positions[:, :-1] + extents[:, :-1] > positions[:, 1:]):
        return None
    if np.any(prefix + positions[:, -1] + extents[:, -1] > sizes):
        return None
    if np.any(lengths != counts) or np.any(skips < 0) or np.any(rows < 1):
        return None
    if np.any(skips + rows > lengths):
        return None
    if np.any(nodes[:, : METADATA + 1, 0] != lengths[:, None]):
        return None
    return nodes, buffers


class _Mismatch(Exception):
    """A body's buffers do not fit its numbers: decode it with Arrow instead."""


class _Columns:
    """Column builders over the bodies joined in ``big`` (buffer ``b`` of body ``k``
    starts at ``data_starts[k] + buffers[k, b, 0]``)."""

    def __init__(
        self, big: np.ndarray, data_starts: np.ndarray, nodes: np.ndarray, buffers: np.ndarray
    ) -> None:
        self.big = big
        self.data_starts = data_starts
        self.nodes = nodes
        self.buffers = buffers

    def _at(self, buffer: int) -> np.ndarray:
        return self.data_starts + self.buffers[:, buffer, 0]

    def _validity(
        self, node: int, skips: np.ndarray, rows: np.ndarray
    ) -> tuple[pa.Buffer | None, int]:
        """The validity bitmap of the rows taken (None when none is null), null count."""
        null_counts = self.nodes[:, node, 1]
        total = int(rows.sum())
        if not null_counts.any():
            return None, 0
        if np.array_equal(null_counts, self.nodes[:, node, 0]):
            return pa.py_buffer(np.zeros((total + 7) // 8, dtype=np.uint8)), total
        buffer = _NODE_BUFFERS[node][0]
        counts = self.nodes[:, node, 0]
        # A body without nulls may carry no bitmap (all valid), one of nulls only may be
        # taken as such; the others' bits are read: bit ``skip + i`` for row i taken.
        body = np.repeat(np.arange(len(rows)), rows)
        valid = np.repeat(null_counts == 0, rows)
        mixed = (null_counts > 0) & (null_counts < counts)
        if mixed.any():
            if np.any(mixed & (self.buffers[:, buffer, 1] * 8 < counts)):
                raise _Mismatch
            local = _ranges(skips, rows)
            pick = mixed[body]
            local = local[pick]
            byte = self.big[self._at(buffer)[body[pick]] + local // 8]
            valid[pick] = ((byte >> (local % 8).astype(np.uint8)) & 1).astype(bool)
        nulls = total - int(np.count_nonzero(valid))
        return pa.py_buffer(np.packbits(valid, bitorder="little")), nulls

    def fixed(
        self, node: int, skips: np.ndarray, rows: np.ndarray, width: int, kind: pa.DataType
    ) -> pa.Array:
        validity, nulls = self._validity(node, skips, rows)
        values_buffer = _NODE_BUFFERS[node][1]
        if np.any((skips + rows) * width > self.buffers[:, values_buffer, 1]):
            raise _Mismatch
        total = int(rows.sum())
        at = self._at(values_buffer) // width + skips  # buffers and bodies are 8-aligned
        index = np.repeat(at - _starts(rows), rows) + np.arange(total)
        dtype = np.dtype(f"<i{width}") if width > 1 else np.dtype(np.uint8)
        values = self.big.view(dtype)[index]
        return pa.Array.from_buffers(kind, total, [validity, pa.py_buffer(values)], nulls)

    def _offsets(self, node: int, skips: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """Each body's ``rows + 1`` int32 offsets from ``skip``, one array per body row."""
        offsets_buffer = _NODE_BUFFERS[node][1]
        if np.any((skips + rows + 1) * 4 > self.buffers[:, offsets_buffer, 1]):
            raise _Mismatch
        at = self._at(offsets_buffer) // 4 + skips
        wanted = rows + 1
        index = np.repeat(at - _starts(wanted), wanted) + np.arange(int(wanted.sum()))
        return self.big.view("<i4")[index].astype(np.int64)

    def _spans(
        self, node: int, skips: np.ndarray, rows: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per body: its first and end offset of the rows taken; and the rows' lengths."""
        offsets = self._offsets(node, skips, rows)
        ends_at = np.cumsum(rows + 1) - 1  # each body's last offset in ``offsets``
        firsts = offsets[ends_at - rows]
        lasts = offsets[ends_at]
        lengths = np.diff(offsets)
        lengths = np.delete(lengths, ends_at[:-1])  # the steps between bodies
        if np.any(lengths < 0) or np.any(firsts < 0):
            raise _Mismatch
        return firsts, lasts, lengths

    def variable(
        self,
        node: int,
        skips: np.ndarray,
        rows: np.ndarray,
        kind: pa.DataType,
        *,
        bodies: Sequence[pa.Buffer] | None = None,
        data_at: np.ndarray | None = None,
        spans: bool = False,
    ) -> pa.Array:
        """A string or binary column; its bytes from ``big``, or, when given, straight
        from the ``bodies`` (where they start in each: ``data_at``). ``spans``: from
        ``big`` too, but one copy per body rather than a gather by byte (the ``data``
        column, most of a read's bytes)."""
        validity, nulls = self._validity(node, skips, rows)
        data_buffer = _NODE_BUFFERS[node][2]
        firsts, lasts, lengths = self._spans(node, skips, rows)
        if np.any(lasts > self.buffers[:, data_buffer, 1]):
            raise _Mismatch
        if spans:
            at = self._at(data_buffer)
            copied = np.empty(int((lasts - firsts).sum()), dtype=np.uint8)
            _copy_spans(copied, self.big, (at + firsts).tolist(), (at + lasts).tolist())
            data = pa.py_buffer(copied)
        elif bodies is None:
            data = pa.py_buffer(self.big[_ranges(self._at(data_buffer) + firsts, lasts - firsts)])
        else:
            assert data_at is not None
            copied = np.empty(int((lasts - firsts).sum()), dtype=np.uint8)
            _copy_ranges(copied, bodies, (data_at + firsts).tolist(), (data_at + lasts).tolist())
            data = pa.py_buffer(copied)
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        if offsets[-1] > np.iinfo(np.int32).max:
            raise _Mismatch
        total = len(lengths)
        offsets32 = pa.py_buffer(offsets.astype(np.int32))
        return pa.Array.from_buffers(kind, total, [validity, offsets32, data], nulls)

    def map(self, skips: np.ndarray, rows: np.ndarray) -> pa.Array:
        """``metadata``: a map<string, binary>, its entries taken with its rows."""
        validity, nulls = self._validity(METADATA, skips, rows)
        firsts, lasts, lengths = self._spans(METADATA, skips, rows)
        entries = lasts - firsts  # entries of each body's rows taken
        if np.any(lasts > self.nodes[:, ENTRIES, 0]):
            raise _Mismatch
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        total = len(lengths)
        children = int(entries.sum())
        if children:
            taken = entries > 0
            child = _Columns(
                self.big, self.data_starts[taken], self.nodes[taken], self.buffers[taken]
            )
            child_skips, child_rows = firsts[taken], entries[taken]
            if child.nodes[:, ENTRIES, 1].any():
                raise _Mismatch  # null entries: not a map Arrow would build
            keys = child.variable(KEY, child_skips, child_rows, pa.string())
            values = child.variable(VALUE, child_skips, child_rows, pa.binary())
        else:
            keys = pa.array([], pa.string())
            values = pa.array([], pa.binary())
        entries_array = pa.StructArray.from_arrays(
            [keys, values], fields=[METADATA_TYPE.key_field, METADATA_TYPE.item_field]
        )
        return pa.Array.from_buffers(
            METADATA_TYPE,
            total,
            [validity, pa.py_buffer(offsets.astype(np.int32))],
            nulls,
            children=[entries_array],
        )


def _starts(counts: np.ndarray) -> np.ndarray:
    """Where each of consecutive runs of ``counts`` starts."""
    starts = np.zeros(len(counts), dtype=np.int64)
    np.cumsum(counts[:-1], out=starts[1:])
    return starts


def _ranges(firsts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """``firsts[k] .. firsts[k] + counts[k] - 1`` for every k, concatenated."""
    return np.repeat(firsts - _starts(counts), counts) + np.arange(int(counts.sum()))


def _copy_ranges(
    out: np.ndarray,
    bodies: Sequence[pa.Buffer],
    froms: list[int],
    tos: list[int],
    then_froms: list[int] | None = None,
    then_tos: list[int] | None = None,
) -> None:
    """Copy ``body[froms[k]:tos[k]]`` (then ``body[then_froms[k]:then_tos[k]]``) of every
    body back to back into ``out``. One slice assignment at a time: no list of thousands
    of views is held (they would survive into the garbage collector's older
    generations and bring on full collections)."""
    target = memoryview(out.reshape(-1)).cast("b")  # a pa.Buffer's views are signed bytes
    position = 0
    for index, body in enumerate(bodies):
        view = memoryview(body)
        size = tos[index] - froms[index]
        target[position : position + size] = view[froms[index] : tos[index]]
        position += size
        if then_froms is not None and then_tos is not None:
            size = then_tos[index] - then_froms[index]
            target[position : position + size] = view[then_froms[index] : then_tos[index]]
            position += size
    assert position == out.size, (position, out.size)


def _copy_spans(out: np.ndarray, big: np.ndarray, froms: list[int], tos: list[int]) -> None:
    """Copy ``big[froms[k]:tos[k]]`` for every k back to back into ``out``."""
    target = memoryview(out)
    source = memoryview(big)
    position = 0
    for start, end in zip(froms, tos, strict=True):
        size = end - start
        target[position : position + size] = source[start:end]
        position += size
    assert position == out.size, (position, out.size)


def refill_seq_nos(
    bodies: Sequence[pa.Buffer], counts: np.ndarray, seq_nos: np.ndarray
) -> list[pa.Buffer] | None:
    """The bodies of the same batches with their ``seq_no`` column filled in: body ``k``
    holds ``counts[k]`` messages whose seq_nos are all null, and comes back with
    ``seq_nos[sum(counts[:k]) : sum(counts[:k + 1])]`` as that column (no nulls), byte
    for byte the body ``serialize_body_buffer`` gives that batch. None when a body is
    not of that shape (another layout, a seq_no that is not null, a buffer out of place):
    the caller serializes the batch.

    A spread statement's shares are staged (encoded) before their publish numbers their
    seq_nos (``storage.spread_publish``); a share's body then differs from its staged one
    only there. In Arrow IPC the null column is a validity bitmap and ``8 n`` value
    bytes; the filled one has no bitmap (an empty buffer at offset 0) and its
    values. So the new body is the staged metadata with those numbers changed (the
    column's null count, its two buffers, every later buffer's offset and the body
    length, all moved back by the bitmap's padded size), the seq_nos, and the staged
    body's bytes after the old values, unchanged. One numpy pass over all bodies'
    metadata, then three copies into a new buffer per body (1000 bodies of 5 messages:
    ~5 ms of CPU, against ~8 ms for a ``serialize`` each)."""
    count = len(bodies)
    assert count > 0 and len(counts) == count and seq_nos.dtype == np.int64
    assert int(counts.sum()) == len(seq_nos)
    headed = _heads(bodies)
    if headed is None:
        return None
    layout, sizes, heads = headed
    prefix = layout.prefix
    words = heads.view("<i8")  # (count, prefix // 8): every number is one aligned word
    checked = _numbers(layout, words, sizes, counts, np.zeros(count, np.int64), counts)
    if checked is None:
        return None
    nodes, buffers = checked
    validity, values = _NODE_BUFFERS[SEQ_NO]
    # The bitmap (every row null: its bits are dropped; its length is Arrow's, as a
    # slice's bits may start within a byte) is the first buffer, the values follow it at
    # the next multiple of 8.
    padded = -(-buffers[:, validity, 1] // 8) * 8
    if not (
        np.array_equal(nodes[:, SEQ_NO, 1], counts)
        and not buffers[:, validity, 0].any()
        and np.array_equal(buffers[:, values, 0], padded)
        and np.array_equal(buffers[:, values, 1], counts * 8)
    ):
        return None
    node_words = layout.nodes_at // 8
    buffer_words = layout.buffers_at // 8
    words[:, node_words + 2 * SEQ_NO + 1] = 0  # null count
    words[:, buffer_words + 2 * validity + 1] = 0  # no bitmap (offset stays 0)
    later = buffer_words + 2 * values + np.arange(0, 2 * (WIRE_BUFFERS - values), 2)
    words[:, later] -= padded[:, None]  # the values buffer and every one after it
    if not np.array_equal(words[:, layout.body_length_at // 8], sizes - prefix):
        return None
    words[:, layout.body_length_at // 8] -= padded
    cuts = (prefix + padded + counts * 8).tolist()
    new_sizes = (sizes - padded).tolist()
    rows = np.cumsum(counts).tolist()
    heads = heads.view(np.int8)  # a pa.Buffer's views are signed bytes
    seq_bytes = memoryview(np.ascontiguousarray(seq_nos)).cast("b")
    filled = []
    start = 0
    for index, body in enumerate(bodies):
        # From Arrow's pool, one body each, as ``serialize`` allocates them (a single
        # buffer for all is a large allocation: its pages are returned to the system
        # when freed, so the next statement faults them in again).
        out = pa.allocate_buffer(new_sizes[index])
        target = memoryview(out)
        end = rows[index]
        size = (end - start) * 8
        target[:prefix] = heads[index]
        target[prefix : prefix + size] = seq_bytes[start * 8 : end * 8]
        target[prefix + size :] = memoryview(body)[cuts[index] :]
        filled.append(out)
        start = end
    return filled
