"""One read of many partitions' small frames into one buffer (issue 14: a consumer poll
over 1000 partitions that hold a few messages each).

``PartitionLog.read_frames`` reads one partition: a ``pread``, then per frame a header
object, a checksum, a body buffer and a ``FrameSlice``; the poll then decodes the
slices of all partitions together. At 1000 partitions of 4 frames of 5 messages, the
objects and calls per frame and per partition were most of the poll's CPU.
``scan_many`` copies the same frames into one array, from each segment's read-only map
where it has one (``LogSegment.mapped``, the map single-partition reads check frames
in), else with one ``pread`` per partition (``LogSegment.read_into``), walks the
headers there (a frame of every partition at a time, in numpy: ``_walk``), checks each
frame's checksum, and keeps what it found as numbers in arrays (``ScannedFrames``); the
decode gathers the columns from that array (``wire_columns.decode_wire_spans``).

Checksums are checked as a single partition's read through its map checks them
(``storage.verified_frames``, ``TOPICBASE_VERIFY_READS``): a frame copied from a map
that lies in a run this process wrote from memory or verified before is not checked
again, and the frames checked here are marked verified; a window read with ``pread``
is checked whole at every read. At 1000 partitions of 4 frames that is 4,000
``crc32c`` calls (~3-5 ms a poll) a poll of frames this process wrote no longer makes.

It is a fast path, all or nothing: it handles only the plain case, and returns None for
anything else, before or after reading (the caller then reads as before, which also
raises the errors that belong to the case): a range over two segments or below the
log start, a read window over ``SCAN_WINDOW_BYTES``, a frame over ``SMALL_SLICE_ROWS``
messages (read alone and zero-copy as before, and kept in the frame cache), a bad header
or checksum, a short read, a segment deleted under it, a byte budget the frames (or
the windows) would reach (a poll stopped by bytes is read as before). The first window
is walked as soon as it is read, so a poll of large frames reads no other.

Invariant: for a plan ``[(partition, log, start, count)]`` it accepts, the slices are
exactly those ``log.read_frames(start, max_messages=count, max_bytes=B)`` would return
for each partition in turn with ``B`` whatever of ``max_bytes`` earlier partitions
left (the budget never binds), and each partition's next offset is ``start + count``.

With the topic's ledger on (``storage.ledger_route``), a partition may hold rows past its
own segments in the ledger (``PartitionLog.reads_across``): the plan's part of it past
its own end is read there (``Ledger.spans_many``: spans of the ledger's frames, whose
bodies have the segments' frames' layout), not copied into the partition first (the
settle a partition read makes). The messages are those ``read_frames`` would return
after that settle, in the same order; the slices are the ledger frames' (one per share
a frame holds), not the copy's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import crc32c
import numpy as np
import pyarrow as pa

from storage import limits, verified_frames
from storage.buffer_pool import BUFFERS
from storage.column_codec import compressed_bodies, unpacked_bytes
from storage.frame_read import SMALL_SLICE_ROWS, read_batch
from storage.ledger import LedgerSpans
from storage.partition_log import LedgerTail, PartitionLog
from storage.record_batch import HEADER, HEADER_BYTES, MAGIC, WIRE_SCHEMA
from storage.segment import LogSegment
from storage.wire_columns import decode_wire_spans

# A partition whose wanted frames lie in a read window larger than this is left to
# ``read_frames`` (a poll that stops inside a big segment would read the rest of it).
SCAN_WINDOW_BYTES = 4 * 1024 * 1024


@dataclass(slots=True)
class ScannedFrames:
    """The frame slices of one ``scan_many``, as arrays (one entry per slice, grouped by
    partition in the plan's order): slice ``k`` is ``rows[k]`` messages from message
    ``skips[k]`` of a frame of ``counts[k]`` messages whose body is
    ``buffer[body_starts[k] : body_starts[k] + body_sizes[k]]``."""

    buffer: np.ndarray  # uint8, every partition's read window
    partitions: np.ndarray  # int32
    body_starts: np.ndarray  # int64, 8-aligned
    body_sizes: np.ndarray  # int64
    counts: np.ndarray  # int64: messages in the frame
    skips: np.ndarray  # int64
    rows: np.ndarray  # int64
    firsts: np.ndarray  # int64: offset of the slice's first message
    written_ats: np.ndarray  # int64: the frame's written_at (us)
    next_offsets: dict[int, int]  # partition -> where its next read starts
    message_count: int
    size: int  # the slices' share of their frames' bytes, as ``FrameSlice.size`` counts
    released: bool = False  # ``buffer`` went back to the pool (``decode``)
    pooled: bool = True  # ``buffer`` came from the pool (else: a view of a ledger's map)

    def __len__(self) -> int:
        return len(self.rows)

    def in_order(self, partitions: Sequence[int]) -> ScannedFrames:
        """The same slices, partitions in the order of ``partitions`` (each partition's
        slices keep their order)."""
        ids = np.fromiter(partitions, np.int64, len(partitions))
        by_id = np.argsort(ids, kind="stable")
        at = np.searchsorted(ids[by_id], self.partitions)
        assert np.array_equal(ids[by_id][at], self.partitions), "a partition not listed"
        order = np.argsort(by_id[at], kind="stable")  # each slice's partition's rank
        if np.array_equal(order, np.arange(len(order))):
            return self
        assert not self.released
        return ScannedFrames(
            self.buffer, self.partitions[order], self.body_starts[order],
            self.body_sizes[order], self.counts[order], self.skips[order], self.rows[order],
            self.firsts[order], self.written_ats[order], self.next_offsets,
            self.message_count, self.size, pooled=self.pooled,
        )  # fmt: skip

    def decode(self) -> pa.RecordBatch:
        """One read batch (``READ_SCHEMA``) of all the slices, in order. Once only: the
        buffer then goes back to the pool (``storage.buffer_pool``)."""
        assert len(self) > 0 and not self.released
        wire = decode_wire_spans(
            self.buffer, self.body_starts, self.body_sizes, self.counts, self.skips, self.rows
        )
        if wire is None:  # a body of another layout: an Arrow IPC read per frame
            wire = self._read_each()  # zero-copy: the batch keeps the buffer
        elif self.pooled:
            BUFFERS.give(self.buffer)  # the columnar decode copied all it keeps
        self.released = True
        return read_batch(wire, self.rows, self.firsts, self.written_ats)

    def decode_stored(self, names: tuple[str, ...]) -> pa.RecordBatch:
        """As ``decode``, only the stored columns ``names`` (``WIRE_SCHEMA`` names, each
        once) of all the slices, as they are stored: none of the others, nor the
        ``offset`` and ``written_at`` columns, is built. Once only, as ``decode``."""
        assert len(self) > 0 and not self.released
        wire = decode_wire_spans(
            self.buffer, self.body_starts, self.body_sizes, self.counts, self.skips, self.rows,
            names,
        )  # fmt: skip
        if wire is None:
            wire = self._read_each().select(list(names))
        elif self.pooled:
            BUFFERS.give(self.buffer)
        self.released = True
        assert wire.num_rows == self.message_count
        return wire

    def _read_each(self) -> pa.RecordBatch:
        buffer = pa.py_buffer(self.buffer)
        wires = []
        for start, size, count, skip, rows in zip(
            self.body_starts.tolist(), self.body_sizes.tolist(), self.counts.tolist(),
            self.skips.tolist(), self.rows.tolist(), strict=True,
        ):  # fmt: skip
            wire = pa.ipc.read_record_batch(buffer.slice(start, size), WIRE_SCHEMA)
            assert wire.num_rows == count, (wire.num_rows, count)
            wires.append(wire.slice(skip, rows) if skip or rows < count else wire)
        return wires[0] if len(wires) == 1 else pa.concat_batches(wires)


def scan_many(
    plan: Sequence[tuple[int, PartitionLog, int, int]], max_bytes: int
) -> ScannedFrames | None:
    """Read ``count`` messages from ``start`` of each ``(partition id, log, start, count)``
    of ``plan``, in order, within ``max_bytes`` of frames in all; None when this path
    does not apply (see the module: the caller reads as before)."""
    if not plan or not 0 < max_bytes <= limits.READ_BYTES_MAX:
        return None
    windows = []
    in_logs = []  # the plan's parts in the partitions' own segments
    across: dict[int, tuple[int, int]] = {}  # partition -> [low, high) in the ledger
    tail: LedgerTail | None = None
    total = 0
    for partition, log, start, count in plan:
        if not 0 < count <= limits.READ_MESSAGES_MAX:
            return None
        in_log = count
        if log.reads_across:  # rows past its own end are read where the ledger holds them
            own = log.own_end
            in_log = max(0, min(count, own - start))
            if in_log < count:
                if tail is not None and log.ledger_tail is not tail:
                    return None  # (one topic's plan has one ledger)
                tail = log.ledger_tail
                across[partition] = (start + in_log, start + count)
        if in_log:
            # ``ends`` (``reader_end``) did not settle: neither does this (the messages
            # asked of the segments lie below their own end)
            window = log.frame_window(start, in_log, SCAN_WINDOW_BYTES, settle=False)
            if window is None:
                return None
            windows.append(window)
            in_logs.append((partition, log, start, in_log))
            total += window[2] - window[1]
    spans = None
    if across:
        assert tail is not None
        spans = tail.spans_many(across)
        if spans is None:
            return None  # released under us: the partition reads settle and read the logs
    ledger_bytes = 0 if spans is None else sum(_aligned(len(body)) for body in spans.bodies)
    if total + ledger_bytes == 0 or total > max_bytes:
        # Windows over the byte budget: it would likely stop the read. (This also bounds
        # what the path holds at once, as the budget bounds the partition reads.)
        return None
    if not in_logs and spans is not None and spans.home is not None:
        # all in one ledger file: its rows are taken from its map, nothing copied first
        home = np.frombuffer(spans.home, np.uint8)
        return _with_ledger(home[: home.size // 8 * 8], None, plan, across, _NOTHING, spans,
                            max_bytes)  # fmt: skip
    # Pooled: a fresh array of ~24 MB faults in its pages again (``buffer_pool``).
    buffer = BUFFERS.take(_aligned(total) + ledger_bytes)
    found = _scan_into(buffer, in_logs, windows, max_bytes) if in_logs else _NOTHING
    if found is not None and spans is not None:
        found = _with_ledger(buffer, _aligned(total), plan, across, found, spans, max_bytes)
    if found is None:
        BUFFERS.give(buffer)
    return found


def _aligned(size: int) -> int:
    return -(-size // 8) * 8


# ``_scan_into`` of no window: the log parts of a read that is all in the ledger.
_NOTHING = ScannedFrames(
    np.empty(0, np.uint8), *(np.empty(0, np.int64) for _ in range(8)), {}, 0, 0
)


def _with_ledger(
    buffer: np.ndarray,
    at: int | None,
    plan: Sequence[tuple[int, PartitionLog, int, int]],
    across: dict[int, tuple[int, int]],
    logs: ScannedFrames,
    spans: LedgerSpans,
    max_bytes: int,
) -> ScannedFrames | None:
    """The read across: ``logs`` (the plan's parts in the partitions' segments, read into
    ``buffer`` below ``at``) and the ledger's rows past them (``spans``), whose frame
    bodies are copied into ``buffer`` from ``at`` on (``at`` None: ``buffer`` is the map
    of the ledger file that holds them, ``spans.home``, and nothing is copied), as one
    ``ScannedFrames``: the partitions' slices in the plan's order, each one's segments'
    before its ledger rows (so its offsets ascend), every partition's next offset its
    planned end. None when the byte budget would have stopped the read, or a body holds
    compressed messages (the partition reads then charge them as they decode)."""
    if at is None:  # ``buffer`` is the ledger file's map holding every body
        assert spans.home_starts is not None
        starts = spans.home_starts
    else:
        starts = np.empty(len(spans.bodies), np.int64)
        view = memoryview(buffer).cast("b")
        for index, body in enumerate(spans.bodies):
            starts[index] = at
            view[at : at + len(body)] = memoryview(body).cast("b")
            at += _aligned(len(body))
    if compressed_bodies(buffer, starts).any():
        return None
    frames = spans.frames
    body_sizes = np.fromiter((len(b) for b in spans.bodies), np.int64, len(spans.bodies))
    counts = spans.frame_rows[frames]
    sizes = np.maximum(1, (body_sizes[frames] + HEADER_BYTES) * spans.counts // counts)
    if logs.size + int(sizes.sum()) >= max_bytes:
        return None
    ids = np.fromiter((entry[0] for entry in plan), np.int64, len(plan))
    sorting = np.argsort(ids)  # the k-th smallest id is the plan's ``sorting[k]``-th
    by_id = ids[sorting]

    def ranks(partitions: np.ndarray) -> np.ndarray:
        """Twice each partition's place in the plan (its segments' slices go first)."""
        return sorting[np.searchsorted(by_id, partitions)] * 2

    order = np.argsort(np.concatenate((ranks(logs.partitions), ranks(spans.partitions) + 1)),
                       kind="stable")  # fmt: skip

    def merged(mine: np.ndarray, theirs: np.ndarray, dtype: type) -> np.ndarray:
        return np.concatenate((mine.astype(dtype), theirs.astype(dtype)))[order]

    ends = {partition: start + count for partition, _, start, count in plan}
    assert all(n == (across[p][0] if p in across else ends[p])
               for p, n in logs.next_offsets.items()), (logs.next_offsets, across)  # fmt: skip
    return ScannedFrames(
        buffer,
        merged(logs.partitions, spans.partitions, np.int32),
        merged(logs.body_starts, starts[frames], np.int64),
        merged(logs.body_sizes, body_sizes[frames], np.int64),
        merged(logs.counts, counts, np.int64),
        merged(logs.skips, spans.rows, np.int64),
        merged(logs.rows, spans.counts, np.int64),
        merged(logs.firsts, spans.firsts, np.int64),
        merged(logs.written_ats, spans.written_ats[frames], np.int64),
        ends,
        logs.message_count + int(spans.counts.sum()),
        logs.size + int(sizes.sum()),
        pooled=at is not None,
    )


def _scan_into(
    buffer: np.ndarray,
    plan: Sequence[tuple[int, PartitionLog, int, int]],
    windows: list[tuple[LogSegment, int, int]],
    max_bytes: int,
) -> ScannedFrames | None:
    """``scan_many`` once the windows are known, into ``buffer``."""
    view = memoryview(buffer)
    signed = view.cast("b")  # as an Arrow buffer's view is, for the copy from a map
    lows = np.empty(len(plan), dtype=np.int64)
    highs = np.empty(len(plan), dtype=np.int64)
    # Per window, in segment bytes: the run of frames this process verified (or wrote
    # from memory) that holds the window's start, for a window copied from a map (its
    # frames inside it are not checked again, ``verified_frames``); [0, 0) otherwise.
    # ``from_map``: the frames checked of that window are marked verified after
    # (a ``pread`` window never is: its frames are checked at every read).
    run_lows = np.zeros(len(plan), dtype=np.int64)
    run_highs = np.zeros(len(plan), dtype=np.int64)
    from_map = np.zeros(len(plan), dtype=bool)
    # Each window's segment's ``VerifiedRuns.generation`` before its bytes were copied: a
    # drop or a cut after it voids that window's marks (review R2-16-1).
    generations = [0] * len(plan)
    once = verified_frames.ONCE
    at = 0
    for index, ((_, log, _, _), (segment, position, limit)) in enumerate(
        zip(plan, windows, strict=True)
    ):
        end = at + limit - position
        assert at % 8 == 0 and end % 8 == 0, (at, end)  # frames are 8-byte multiples
        try:
            generations[index] = segment.verified.generation
            mapped = segment.mapped(limit, log.config.segment_bytes)
            if mapped is not None:
                # The published bytes, copied from the segment's map: no ``pread``
                # (~4 us less a partition). The map (kept by ``mapped`` while copying)
                # is never handed out: what this scan returns holds only ``buffer``.
                signed[at:end] = mapped[1][position:limit]
                got = end - at
                from_map[index] = True
                if once:  # after the copy: bytes dropped from the page cache before it
                    # are forgotten by then (``VerifiedRuns.forget_below``), so checked
                    run_lows[index], run_highs[index] = _run_at(segment, position)
            else:
                got = segment.read_into(view[at:end], position)
        except FileNotFoundError:
            return None  # retention deleted the segment: read_frames retries
        if got != end - at:
            return None
        if index == 0 and _walk_one(buffer, 0, at, end, plan[0][2], plan[0][3]) is None:
            return None  # the first window is not plain (large frames?): read no more
        lows[index], highs[index] = at, end
        at = end
    starts = np.fromiter((entry[2] for entry in plan), np.int64, len(plan))
    wanted = np.fromiter((entry[3] for entry in plan), np.int64, len(plan))
    walked = _walk(buffer, lows, highs, starts, wanted)
    if walked is None:
        return None
    frames, offsets = walked
    where, at, body, count, skip, rows, first, written, _ = frames
    # Each frame's place in its segment, and whether a verified run holds it.
    shifts = np.fromiter((w[1] for w in windows), np.int64, len(windows)) - lows
    placed = at + shifts[where]
    trusted = (run_lows[where] <= placed) & (placed + HEADER_BYTES + body <= run_highs[where])
    if not _checked(view, frames, trusted):
        return None  # damage: read_frames reports it
    _mark_verified(windows, generations, placed, frames, from_map[where] & ~trusted)
    whole = HEADER_BYTES + body
    # A frame whose data column is compressed whole, or of zstd messages, is charged what
    # it decodes to, as the partition reads charge it (``FrameSlice.size``): a ~1 KB
    # frame may hold 16 MiB of messages.
    for index in np.flatnonzero(compressed_bodies(buffer, at + HEADER_BYTES)).tolist():
        start = int(at[index]) + HEADER_BYTES
        whole[index] += unpacked_bytes(view[start : start + int(body[index])], messages=True)
    if int(whole.sum()) >= max_bytes:
        return None  # the budget would have stopped the read somewhere: read as before
    sizes = np.where(rows == count, whole, np.maximum(1, whole * rows // count))
    ids = np.fromiter((entry[0] for entry in plan), np.int32, len(plan))
    return ScannedFrames(
        buffer,
        ids[where],
        at + HEADER_BYTES,
        body,
        count,
        skip,
        rows,
        first,
        written,
        dict(zip(ids.tolist(), offsets.tolist(), strict=True)),
        int(rows.sum()),
        int(sizes.sum()),
    )


def _run_at(segment: LogSegment, position: int) -> tuple[int, int]:
    """The run of verified bytes of ``segment`` that holds ``position``, else (0, 0)."""
    for low, high in segment.verified.snapshot():
        if low <= position < high:
            return low, high
    return 0, 0


def _checked(view: memoryview, frames: _Frames, trusted: np.ndarray) -> bool:
    """Whether every frame not ``trusted`` (a flag a frame) has its checksum (header
    bytes [8, 48) and the body, contiguous in the buffer)."""
    _, at, body, _, _, _, _, _, checksum = frames
    check = np.flatnonzero(~trusted)
    crc = crc32c.crc32c
    for low, high, expected in zip(
        (at[check] + 8).tolist(), (at[check] + HEADER_BYTES + body[check]).tolist(),
        checksum[check].tolist(), strict=True,
    ):  # fmt: skip
        if crc(view[low:high]) != expected:
            return False
    return True


def _mark_verified(
    windows: list[tuple[LogSegment, int, int]],
    generations: list[int],
    placed: np.ndarray,
    frames: _Frames,
    marked: np.ndarray,
) -> None:
    """Mark the ``marked`` frames (just checked, copied from a map; ``placed``: where
    each frame starts in its segment) as verified in their segment, one run a window:
    a later read of them through the map is not checked again (``verified_frames``).
    A window's frames taken are consecutive (the walk takes from the frame holding
    the start on), so those marked are one byte range of the segment. A window whose
    segment's ``generations`` entry moved since its copy marks nothing."""
    if not marked.any():
        return
    where = frames[0][marked]
    lows = placed[marked]
    highs = lows + HEADER_BYTES + frames[2][marked]
    # Frames are in buffer order and the windows lie in the buffer in plan order, so
    # each window's frames are one run of ``where``.
    assert np.all(np.diff(where) >= 0)
    cuts = np.flatnonzero(np.diff(where)) + 1
    firsts = np.concatenate(([0], cuts))
    lasts = np.concatenate((cuts, [len(where)])) - 1
    for window, low, high in zip(
        where[firsts].tolist(), lows[firsts].tolist(), highs[lasts].tolist(), strict=True
    ):  # fmt: skip
        windows[window][0].verified.add(low, high, generations[window])


# While at least this many partitions are still being walked, a step walks one frame of
# each at once in numpy; the last few are walked frame by frame in Python.
_WALK_VECTOR_MIN = 16
_MAGIC_WORD = int.from_bytes(MAGIC, "little")
_Frames = tuple[np.ndarray, ...]


def _walk(
    buffer: np.ndarray, lows: np.ndarray, highs: np.ndarray, starts: np.ndarray,
    wanted: np.ndarray,
) -> tuple[_Frames, np.ndarray] | None:  # fmt: skip
    """The frames to take of each window ``buffer[lows[k]:highs[k]]``: from the one
    holding offset ``starts[k]`` on, ``wanted[k]`` messages (frames before it, where
    the sparse index started the window, passed over). Returns the frames' arrays
    (window, position, body bytes, messages, skip, rows, first offset, written_at,
    checksum), in buffer order, and each window's next offset; None on anything not
    plain (a bad or cut header, a gap, a large frame)."""
    u32 = buffer.view("<u4")
    i64 = buffer.view("<i8")
    position = lows.copy()
    offset = starts.copy()
    remaining = wanted.copy()
    active = np.flatnonzero(remaining > 0)
    found: list[_Frames] = []
    while active.size >= _WALK_VECTOR_MIN:
        at = position[active]
        high = highs[active]
        if np.any(at + HEADER_BYTES > high):
            return None
        words, longs = at // 4, at // 8
        body = u32[words + 7].astype(np.int64)
        count = u32[words + 6].astype(np.int64)
        base = i64[longs + 1]
        ends = at + HEADER_BYTES + body
        if np.any(u32[words] != _MAGIC_WORD) or np.any(body % 8) or np.any(count == 0):
            return None
        if np.any(ends > high):
            return None
        from_offset = offset[active]
        taking = base + count > from_offset  # else before the start: passed over
        if taking.any():
            taken = active[taking]
            skip = from_offset[taking] - base[taking]
            count = count[taking]
            if np.any(skip < 0) or np.any(count > SMALL_SLICE_ROWS):
                return None
            rows = np.minimum(count - skip, remaining[taken])
            found.append((
                taken, at[taking], body[taking], count, skip, rows, from_offset[taking],
                i64[longs[taking] + 2], u32[words[taking] + 1].astype(np.int64),
            ))  # fmt: skip
            offset[taken] += rows
            remaining[taken] -= rows
        position[active] = ends
        active = active[remaining[active] > 0]
    for window in active.tolist():
        tail = _walk_one(buffer, window, int(position[window]), int(highs[window]),
                         int(offset[window]), int(remaining[window]))  # fmt: skip
        if tail is None:
            return None
        found.append(tail[0])
        offset[window] = tail[1]
    if not found:
        return None
    frames = tuple(np.concatenate(parts) for parts in zip(*found, strict=True))
    order = np.argsort(frames[1], kind="stable")
    return tuple(column[order] for column in frames), offset


def _walk_one(
    buffer: np.ndarray, window: int, at: int, high: int, offset: int, remaining: int
) -> tuple[_Frames, int] | None:
    """``_walk`` of one window, frame by frame (in Python)."""
    view = memoryview(buffer)
    unpack = HEADER.unpack_from
    columns: list[list[int]] = [[] for _ in range(9)]
    while remaining > 0:
        if at + HEADER_BYTES > high:
            return None
        magic, checksum, base, written, count, body, _, _, _ = unpack(view, at)
        end = at + HEADER_BYTES + body
        if magic != MAGIC or body % 8 or count == 0 or end > high:
            return None
        if base + count > offset:
            skip = offset - base
            if skip < 0 or count > SMALL_SLICE_ROWS:
                return None
            rows = min(count - skip, remaining)
            for column, value in zip(
                columns, (window, at, body, count, skip, rows, offset, written, checksum),
                strict=True,
            ):  # fmt: skip
                column.append(value)
            offset += rows
            remaining -= rows
        at = end
    return tuple(np.array(column, dtype=np.int64) for column in columns), offset
