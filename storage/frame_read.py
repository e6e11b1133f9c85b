"""Reads left as frames: what a read found, decoded later, many partitions at once.

A partition read (``PartitionLog.read_frames``) stops before decoding: it returns
``FrameSlice``s, each one frame's header and body and the part of it the read takes
(``skip`` messages from its start, then ``rows``). A reader that reads many partitions
(a consumer poll over 1000 partitions holding a few messages each) decodes all their
slices in one step (``decode_slices``): one Arrow IPC read per frame, then the columns
and the batch built once for the whole read, instead of once per partition. Large
frames are decoded alone, without copying their messages.

Invariants: ``0 <= skip``, ``1 <= rows`` and ``skip + rows <= header.record_count``;
the offsets of a slice are ``first_offset .. next_offset - 1``. A slice's ``size`` is
its share of the frame's bytes (header and body, prorated by messages), the unit the
storage read's own byte budget counts in.

A partition keeps the large frame its last read stopped inside (``FrameCache``), so a
sequence of small reads from one big frame (a move of 100 messages from frames of 1000)
reads, checks and decodes it once instead of once per read.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from storage.column_codec import unpacked_bytes
from storage.record_batch import (
    HEADER_BYTES,
    READ_SCHEMA,
    TIMESTAMP,
    WIRE_SCHEMA,
    FrameHeader,
    decode_body,
)
from storage.wire_columns import decode_wire_bodies

# Slices of at most this many messages are decoded together (``decode_slices``): their
# fixed cost dominates, and copying their few messages once is cheap.
SMALL_SLICE_ROWS = 64
# Runs of at least this many small slices are decoded column by column across their
# frames (``wire_columns``); fewer go through one Arrow IPC read each.
COLUMNAR_MIN_SLICES = 8
# What the frames kept for the next read (``FrameCache``) may hold in all, in the bytes of
# the read windows they keep alive.
FRAME_CACHE_BYTES = 64 * 1024 * 1024


class CachedFrame:
    """One checked large frame of a segment, kept for the next read of its partition,
    with its read batch decoded on first use (``batch``). The frame's bytes never
    change while its segment is in the partition's visible list (appends go after
    published frames, a fence cuts only unpublished bytes, retention removes whole
    segments), so the entry is valid exactly while ``segment`` is listed there.
    Two threads may decode it at once; both get equal batches and one is kept."""

    __slots__ = ("_batch", "body", "header", "mapped", "position", "segment", "unpacked")

    def __init__(
        self,
        segment: object,
        position: int,
        header: FrameHeader,
        body: pa.Buffer,
        *,
        mapped: bool = False,
    ):
        self.segment = segment
        self.position = position
        self.header = header
        self.body = body
        self.mapped = mapped  # ``body`` is a view of the segment's map (``Frame.mapped``)
        self._batch: pa.RecordBatch | None = None
        # A body whose data column is compressed whole (``storage.column_codec``) decodes
        # into that many bytes of heap, which the decoded batch keeps: counted from the start.
        self.unpacked = unpacked_bytes(body)

    @property
    def kept_bytes(self) -> int:
        """The bytes this entry keeps alive: its body's whole read window (for a view of
        a segment's map, which holds no heap memory, the frame's own bytes), and the data
        its decoded batch holds when the body is column-compressed (``unpacked``)."""
        if self.mapped:
            return self.header.frame_bytes + self.unpacked
        parent = self.body.parent
        return (parent.size if parent is not None else self.body.size) + self.unpacked

    def holds(self, segment: object, offset: int) -> bool:
        header = self.header
        return self.segment is segment and header.base_offset <= offset < header.next_offset

    def batch(self) -> pa.RecordBatch:
        """The whole frame's read batch (``decode_body``), decoded once."""
        batch = self._batch
        if batch is None:
            batch = self._batch = decode_body(self.header, self.body)
        return batch


@dataclass(slots=True)
class FrameSlice:
    """``rows`` messages from message ``skip`` on of one checked frame. Never changed once
    made (not frozen only because a frozen dataclass costs ~2 us to build, and a read
    over 1000 partitions builds one per frame)."""

    header: FrameHeader
    body: pa.Buffer
    skip: int
    rows: int
    # The partition's kept copy of this frame (``FrameCache``), whose decode is shared
    # by every read of it; None for a frame no later read is expected to need.
    cached: CachedFrame | None = field(default=None, compare=False, repr=False)
    # The bytes the frame's data column decodes to when it is compressed whole
    # (``column_codec.unpacked_bytes``), else 0: charged by ``size`` beside the stored bytes.
    unpacked: int = 0

    def __post_init__(self) -> None:
        assert self.skip >= 0 and self.rows >= 1, (self.skip, self.rows)
        assert self.skip + self.rows <= self.header.record_count, (self.skip, self.rows)

    @property
    def first_offset(self) -> int:
        return self.header.base_offset + self.skip

    @property
    def next_offset(self) -> int:
        return self.header.base_offset + self.skip + self.rows

    @property
    def size(self) -> int:
        """The slice's share of the frame's bytes (at least 1): its stored bytes and, for a
        frame whose data column is compressed whole, the bytes that column decodes to (a
        read's byte budgets count what the read holds decoded, not the ~1,000x smaller
        stored frame)."""
        frame_bytes = HEADER_BYTES + self.header.body_bytes + self.unpacked
        if self.rows == self.header.record_count:
            return frame_bytes
        return max(1, frame_bytes * self.rows // self.header.record_count)

    def below(self, end: int) -> FrameSlice | None:
        """This slice without the offsets at or past ``end`` (None if nothing is left)."""
        if self.next_offset <= end:
            return self
        rows = end - self.first_offset
        if rows <= 0:
            return None
        return FrameSlice(self.header, self.body, self.skip, rows, self.cached, self.unpacked)

    def wire_batch(self) -> pa.RecordBatch:
        """This slice's stored columns (``WIRE_SCHEMA``'s, by name; a kept frame's decoded
        batch has them too), zero-copy: for a reader that needs none of the columns
        ``decode_body`` adds (``offset``, ``written_at``), e.g. a read of ``data`` alone."""
        if self.cached is not None:
            batch = self.cached.batch()
        else:
            batch = pa.ipc.read_record_batch(self.body, WIRE_SCHEMA)
            assert batch.num_rows == self.header.record_count
        if self.skip > 0 or self.rows < batch.num_rows:
            batch = batch.slice(self.skip, self.rows)
        return batch

    def decode(self) -> pa.RecordBatch:
        """This slice's read batch, alone and zero-copy (for a large frame; runs of
        small ones go through ``decode_small``)."""
        if self.cached is not None:
            batch = self.cached.batch()
        else:
            batch = decode_body(self.header, self.body)
        if self.skip > 0 or self.rows < batch.num_rows:
            batch = batch.slice(self.skip, self.rows)
        return batch


@dataclass(frozen=True, slots=True)
class FrameRead:
    """A partition read before decoding (``PartitionLog.read_frames``)."""

    slices: list[FrameSlice]
    next_offset: int  # where the next read should start
    start_offset: int  # the log start offset when read
    end_offset: int  # the visible end offset when read

    @property
    def message_count(self) -> int:
        return sum(s.rows for s in self.slices)

    @property
    def size(self) -> int:
        return sum(s.size for s in self.slices)


def decode_slices(slices: Sequence[FrameSlice]) -> list[pa.RecordBatch]:
    """The read batches of ``slices``, in order: each large slice (over
    ``SMALL_SLICE_ROWS`` messages) alone and zero-copy, each run of small ones as one
    batch. The slices need not be consecutive, nor of one partition: the ``offset``
    column is each slice's own offsets."""
    batches: list[pa.RecordBatch] = []
    run: list[FrameSlice] = []
    for piece in slices:
        if piece.header.record_count > SMALL_SLICE_ROWS:
            if run:
                batches.append(decode_small(run))
                run = []
            batches.append(piece.decode())
        else:
            run.append(piece)
    if run:
        batches.append(decode_small(run))
    return batches


def decode_small(slices: Sequence[FrameSlice]) -> pa.RecordBatch:
    """One read batch of ``slices`` (the messages copied once): as ``decode_body`` of
    each frame, sliced and concatenated, with the ``offset`` and ``written_at`` columns
    built once for all of them. Many slices are decoded column by column across their
    frames (``wire_columns``), without an Arrow IPC read per frame; a frame that does
    not fit that path sends the whole run through Arrow, frame by frame."""
    assert slices
    count = len(slices)
    rows = np.empty(count, dtype=np.int64)
    skips = np.empty(count, dtype=np.int64)
    counts = np.empty(count, dtype=np.int64)
    firsts = np.empty(count, dtype=np.int64)
    written_ats = np.empty(count, dtype=np.int64)
    for index, piece in enumerate(slices):
        header = piece.header
        rows[index] = piece.rows
        skips[index] = piece.skip
        counts[index] = header.record_count
        firsts[index] = header.base_offset + piece.skip
        written_ats[index] = header.written_at_us
    wire = None
    if count >= COLUMNAR_MIN_SLICES:
        wire = decode_wire_bodies([piece.body for piece in slices], counts, skips, rows)
    if wire is None:
        wire = _read_each(slices)
    return read_batch(wire, rows, firsts, written_ats)


def read_batch(
    wire: pa.RecordBatch, rows: np.ndarray, firsts: np.ndarray, written_ats: np.ndarray
) -> pa.RecordBatch:
    """The read batch (``READ_SCHEMA``) of ``wire``, the wire rows of slices of ``rows[k]``
    messages from offset ``firsts[k]`` of frames written at ``written_ats[k]``, in order:
    the ``offset`` and ``written_at`` columns built in one numpy step each."""
    count = len(rows)
    total = int(rows.sum())
    assert wire.num_rows == total, (wire.num_rows, total)
    # offset of row i of slice k: firsts[k] + (i - where slice k starts in the batch)
    starts = np.zeros(count, dtype=np.int64)
    np.cumsum(rows[:-1], out=starts[1:])
    offsets = np.arange(total, dtype=np.int64) + np.repeat(firsts - starts, rows)
    written = np.repeat(written_ats, rows)
    columns = wire.columns
    return pa.RecordBatch.from_arrays(
        [
            pa.Array.from_buffers(pa.int64(), total, [None, pa.py_buffer(offsets)]),
            *columns[:4],
            pa.Array.from_buffers(TIMESTAMP, total, [None, pa.py_buffer(written)]),
            *columns[4:],
        ],
        schema=READ_SCHEMA,
    )


def _read_each(slices: Sequence[FrameSlice]) -> pa.RecordBatch:
    """The wire batch of ``slices``: an Arrow IPC read of each frame, sliced, concatenated."""
    wires = []
    for piece in slices:
        header = piece.header
        wire = pa.ipc.read_record_batch(piece.body, WIRE_SCHEMA)
        assert wire.num_rows == header.record_count, (wire.num_rows, header.record_count)
        if piece.skip > 0 or piece.rows < header.record_count:
            wire = wire.slice(piece.skip, piece.rows)
        wires.append(wire)
    return wires[0] if len(wires) == 1 else pa.concat_batches(wires)


class FrameCache:
    """For each partition, the large frame (over ``SMALL_SLICE_ROWS`` messages) its last
    read stopped inside: the next read of that partition usually starts there (a
    consumer's next poll, the next move), and takes it from here instead of reading,
    checking and decoding the whole frame again (issue 14: each 100-message move from
    frames of 1000 re-read 1 MiB).

    Bounded: one entry per partition, and at most ``capacity_bytes`` kept alive in
    all (``CachedFrame.kept_bytes``), least recently used entries dropped first; an
    entry larger than that is not kept. Keys are the partitions themselves (by
    identity); a partition drops its entry when it deletes segments or closes.
    Thread-safe.
    """

    def __init__(self, capacity_bytes: int = FRAME_CACHE_BYTES) -> None:
        assert capacity_bytes >= 0
        self.capacity_bytes = capacity_bytes
        self._entries: OrderedDict[object, CachedFrame] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    @property
    def kept_bytes(self) -> int:
        return self._bytes

    def get(self, owner: object) -> CachedFrame | None:
        with self._lock:
            entry = self._entries.get(owner)
            if entry is not None:
                self._entries.move_to_end(owner)
            return entry

    def put(self, owner: object, entry: CachedFrame) -> None:
        size = entry.kept_bytes
        with self._lock:
            old = self._entries.pop(owner, None)
            if old is not None:
                self._bytes -= old.kept_bytes
            if size > self.capacity_bytes:
                return
            while self._entries and self._bytes + size > self.capacity_bytes:
                _, evicted = self._entries.popitem(last=False)
                self._bytes -= evicted.kept_bytes
            self._entries[owner] = entry
            self._bytes += size

    def discard(self, owner: object) -> None:
        with self._lock:
            old = self._entries.pop(owner, None)
            if old is not None:
                self._bytes -= old.kept_bytes


# The process's cache, shared by every partition (its bound is for the whole process).
FRAME_CACHE = FrameCache()
