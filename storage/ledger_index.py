"""The ledger's in-memory index: for each partition, which ledger frame and rows hold which
of its offsets.

Entries arrive a frame at a time (``add``): one entry per share, ``(partition, base,
count, frame, row)`` with ``frame`` the frame's sequence number and ``row`` the share's
first row in the frame's body. They are kept as per-frame numpy chunks (an append costs a
few array operations, not one Python step per partition). A lookup needs them by
partition: per partition, lists of the entries' bases, frames, rows and counts, extended
at the first lookup after appends from the chunks added since (work in proportion to the
new entries, not to the index: a poll after each statement pays for one statement's
entries). A read of many partitions finds, per partition, the frame of its first wanted
offset in those lists (a bisection each) and walks the chunks from the earliest of them.

Per partition the index also keeps ``end`` (the next offset: past the last share, or the
partition's own log end when no share of it is in the ledger) and ``start`` (the first
offset still served from the ledger: those below were copied into the partition's own
segments, ``release``).

Invariants: a partition's entries are contiguous in offsets (each base is the previous
entry's base plus its count), and they cover ``[start, end)`` at least; ``start <= end``;
frames are added in sequence order; entries of frames dropped from the front (``drop_front``,
retention) are gone from every lookup. Not thread-safe: the ledger calls it under its lock.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

import numpy as np

# An entry is a row of five int64 columns (a plain 2-D array: numpy copies and gathers it
# ~10x faster than the same entries as a structured dtype).
PARTITION, BASE, COUNT, FRAME, ROW = range(5)
_COLUMNS = 5
_NONE = np.empty((0, _COLUMNS), np.int64)  # a dropped chunk's place
_WALK_ALL_BELOW_CHUNKS = 32
# ``_list_new`` sorts the new chunks' shares by partition from this many chunks on.
_LIST_GROUPED_MIN_CHUNKS = 4

# a frame's wanted rows: (frame, partitions, first offsets, first rows, counts)
_Selection = tuple[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray]


@dataclass(frozen=True, slots=True)
class Span:
    """Rows ``[row, row + count)`` of frame ``frame`` hold offsets ``[base, base + count)``."""

    frame: int
    row: int
    base: int
    count: int


@dataclass(frozen=True, slots=True)
class Chunk:
    """One frame's shares: partitions (increasing), first offsets, counts and first rows."""

    frame: int
    partitions: np.ndarray
    bases: np.ndarray
    counts: np.ndarray
    rows: np.ndarray


def _chunk(chunk: np.ndarray) -> Chunk:
    return Chunk(int(chunk[0, FRAME]), chunk[:, PARTITION], chunk[:, BASE], chunk[:, COUNT],
                 chunk[:, ROW])  # fmt: skip


class _Lists:
    """One partition's entries, in offset order, as parallel lists."""

    __slots__ = ("bases", "counts", "frames", "rows")

    def __init__(self) -> None:
        self.bases: list[int] = []
        self.frames: list[int] = []
        self.rows: list[int] = []
        self.counts: list[int] = []


class _Lookup:
    """A partition -> offset mapping (0 where absent) looked up for an array of partitions
    at once: its keys sorted once, then one ``searchsorted`` an array (a pass's 48 frames
    of 1000 shares each cost ~48,000 ``dict.get`` calls in Python before, docs/scale.md
    round 38)."""

    __slots__ = ("_keys", "_values")

    def __init__(self, mapping: Mapping[int, int]) -> None:
        keys = np.fromiter(mapping.keys(), np.int64, len(mapping))
        values = np.fromiter(mapping.values(), np.int64, len(mapping))
        order = np.argsort(keys)
        self._keys, self._values = keys[order], values[order]

    def __call__(self, partitions: np.ndarray) -> np.ndarray:
        if not len(self._keys):
            return np.zeros(len(partitions), np.int64)
        at = np.minimum(np.searchsorted(self._keys, partitions), len(self._keys) - 1)
        return np.where(self._keys[at] == partitions, self._values[at], 0)


class LedgerIndex:
    def __init__(self) -> None:
        self._chunks: list[np.ndarray] = []  # in frame order, from ``_first_chunk`` on
        self._chunk_frames: list[int] = []  # each chunk's frame
        self._first_chunk = 0  # chunks before it were dropped (retention)
        self._ends: dict[int, int] = {}
        self._starts: dict[int, int] = {}
        self._lists: dict[int, _Lists] = {}
        self._listed = 0  # chunks before this one are in ``_lists``
        # Every frame below this one has all its shares copied (``first_needed_frame``): a
        # share's offsets never change and a partition's copied start only grows, so a
        # frame once copied stays so, and the walk for the first needed frame starts here.
        self._copied_below = 0
        self.entries = 0
        self.chunks_walked = 0  # by ``select``, in all (a figure for tests and benches)

    # -- writing -------------------------------------------------------------------------
    def add(self, frame: int, partitions: np.ndarray, bases: np.ndarray, counts: np.ndarray,
            rows: np.ndarray) -> None:  # fmt: skip
        """Index shares of one frame (partitions increasing; each base its partition's end;
        ``rows`` each share's first row in the frame's body)."""
        if not len(partitions):
            return
        chunk = np.empty((len(partitions), _COLUMNS), np.int64)
        chunk[:, PARTITION] = partitions
        chunk[:, BASE] = bases
        chunk[:, COUNT] = counts
        chunk[:, FRAME] = frame
        chunk[:, ROW] = rows
        ends = (bases + counts).tolist()
        self._ends.update(zip(partitions.tolist(), ends, strict=True))
        self._chunks.append(chunk)
        self._chunk_frames.append(frame)
        self.entries += len(chunk)

    def set_end(self, partition: int, end: int) -> None:
        """A partition's end and start with no share of it in the ledger (its own log's end)."""
        self._ends[partition] = end
        self._starts[partition] = end

    def release(self, partition: int, copied_end: int) -> None:
        """Offsets below ``copied_end`` of ``partition`` are in its own segments now."""
        if copied_end > self._ends.get(partition, 0):
            raise ValueError(f"partition {partition}: copied to {copied_end} past its end")
        self._starts[partition] = max(self._starts.get(partition, 0), copied_end)

    def drop_front(self, frames_below: int) -> None:
        """Forget the entries of frames numbered below ``frames_below`` (their file deleted)."""
        self._list_new()
        cut = bisect.bisect_left(self._chunk_frames, frames_below, self._first_chunk)
        for index in range(self._first_chunk, cut):
            self.entries -= len(self._chunks[index])
            self._chunks[index] = _NONE
        self._first_chunk = cut
        if cut > 1024 and cut * 2 > len(self._chunks):  # compact now and then
            del self._chunks[:cut], self._chunk_frames[:cut]
            self._listed = len(self._chunks)  # every chunk was listed above
            self._first_chunk = 0
        for lists in self._lists.values():
            drop = bisect.bisect_left(lists.frames, frames_below)
            if drop:
                for column in (lists.bases, lists.frames, lists.rows, lists.counts):
                    del column[:drop]

    # -- reading -------------------------------------------------------------------------
    def end(self, partition: int) -> int:
        return self._ends.get(partition, 0)

    def start(self, partition: int) -> int:
        return self._starts.get(partition, 0)

    def ends(self) -> dict[int, int]:
        return dict(self._ends)

    def starts(self) -> dict[int, int]:
        return dict(self._starts)

    def spans(self, partition: int, offset: int, end: int) -> list[Span]:
        """The spans that hold offsets ``[offset, end)`` of ``partition``, cut to that range,
        in offset order. ``offset`` below the partition's ``start`` (copied) or a range past
        its end is the caller's error (``ValueError``)."""
        if offset < self.start(partition) or end > self.end(partition) or offset > end:
            raise ValueError(
                f"partition {partition}: [{offset}, {end}) is not in the ledger "
                f"[{self.start(partition)}, {self.end(partition)})"
            )
        if offset == end:
            return []
        lists = self._lists_of(partition)
        first = bisect.bisect_right(lists.bases, offset) - 1
        last = bisect.bisect_left(lists.bases, end)
        if first < 0:
            raise ValueError(f"partition {partition}: offset {offset} is not indexed")
        spans = []
        for index in range(first, last):
            base, count = lists.bases[index], lists.counts[index]
            low = max(base, offset)
            high = min(base + count, end)
            spans.append(Span(lists.frames[index], lists.rows[index] + low - base, low, high - low))
        return spans

    def at_share_edge(self, partition: int, offset: int) -> bool:
        """Whether ``offset`` is where a share of ``partition`` starts, or its end."""
        if offset == self.end(partition):
            return True
        bases = self._lists_of(partition).bases
        at = bisect.bisect_left(bases, offset)
        return at < len(bases) and bases[at] == offset

    def select(self, starts: dict[int, int]) -> Iterator[_Selection]:
        """For a read of many partitions from ``starts`` (partition -> first offset wanted,
        at or above its ``start``, at or below its ``end``): per frame in sequence order that
        holds any of it, ``(frame, partitions, first offsets, first rows, counts)`` of its
        wanted rows (the table's order, so rows ascend). One pass of array operations a
        frame, none a partition."""
        for partition, offset in starts.items():
            if not self.start(partition) <= offset <= self.end(partition):
                raise ValueError(
                    f"partition {partition}: offset {offset} is not in the ledger "
                    f"[{self.start(partition)}, {self.end(partition)})")  # fmt: skip
        if not starts:
            return
        earliest = None  # the frame of the earliest wanted offset
        live = len(self._chunks) - self._first_chunk
        # finding it costs a bisection a partition (1000: ~1 ms), walking a chunk ~30 us:
        # worth it only past a few dozen chunks
        for partition, offset in starts.items() if live > _WALK_ALL_BELOW_CHUNKS else ():
            if offset == self.end(partition):
                continue
            lists = self._lists_of(partition)
            at = bisect.bisect_right(lists.bases, offset) - 1
            if at < 0:
                raise ValueError(f"partition {partition}: offset {offset} is not indexed")
            frame = lists.frames[at]
            earliest = frame if earliest is None else min(earliest, frame)
        if earliest is None and live > _WALK_ALL_BELOW_CHUNKS:
            return  # every partition is at its end
        keys = np.fromiter(starts, np.int64, len(starts))
        order = np.argsort(keys)
        keys = keys[order]
        values = np.fromiter(starts.values(), np.int64, len(starts))[order]
        never = np.iinfo(np.int64).max  # a partition not read: no row of it is wanted
        first = self._first_chunk if earliest is None else bisect.bisect_left(
            self._chunk_frames, earliest, self._first_chunk)  # fmt: skip
        for chunk in self._chunks[first:]:
            self.chunks_walked += 1
            partitions = chunk[:, PARTITION]
            at = np.minimum(np.searchsorted(keys, partitions), len(keys) - 1)
            wanted = np.where(keys[at] == partitions, values[at], never)
            bases = chunk[:, BASE]
            ends = bases + chunk[:, COUNT]
            keep = ends > wanted
            if not keep.any():
                continue
            first = np.maximum(bases, wanted)[keep]
            yield (int(chunk[0, FRAME]), partitions[keep], first,
                   chunk[:, ROW][keep] + first - bases[keep], ends[keep] - first)  # fmt: skip

    def live_chunks(self, first_frame: int = 0) -> Iterator[Chunk]:
        """Every frame's shares still indexed, in frame order (``Chunk``: views, not
        copies), from frame ``first_frame`` on."""
        first = self._first_chunk
        if first_frame > 0:
            first = bisect.bisect_left(self._chunk_frames, first_frame, first)
        for chunk in self._chunks[first:]:
            if len(chunk):
                yield _chunk(chunk)

    def last_chunk(self) -> Chunk | None:
        """The last frame's shares, if any frame is indexed."""
        live = self._chunks[self._first_chunk :]
        return _chunk(live[-1]) if live and len(live[-1]) else None

    def first_needed_frame(self) -> int | None:
        """The oldest indexed frame with a share not copied yet (the files before its file
        may go), None when every share is copied. Walks only the frames from the last
        call's answer on (``_copied_below``), not the copied ones kept for reads."""
        first = bisect.bisect_left(self._chunk_frames, self._copied_below, self._first_chunk)
        if first < len(self._chunks):
            copied_start = _Lookup(self._starts)
            for index in range(first, len(self._chunks)):
                chunk = self._chunks[index]
                tops = chunk[:, BASE] + chunk[:, COUNT]
                if np.any(tops > copied_start(chunk[:, PARTITION])):
                    self._copied_below = self._chunk_frames[index]
                    return self._copied_below
        if self._chunks:
            self._copied_below = max(self._copied_below, self._chunk_frames[-1] + 1)
        return None

    def first_unread_frame(self, unread: Mapping[int, int]) -> int | None:
        """The oldest indexed frame holding an offset not read yet: a share of partition
        ``p`` ending past ``unread.get(p, 0)`` (the readers' lowest next offset of each
        partition, ``storage.ledger_route.lowest_offsets``), None when every share ends
        at or below it. A bisection a partition."""
        self._list_new()
        oldest: int | None = None
        for partition, entry in self._lists.items():
            bases = entry.bases
            if not bases:
                continue
            floor = unread.get(partition, 0)
            at = max(0, bisect.bisect_right(bases, floor) - 1)
            if bases[at] + entry.counts[at] <= floor:
                at += 1  # that share is read: the next one, if any
            if at < len(bases) and (oldest is None or entry.frames[at] < oldest):
                oldest = entry.frames[at]
        return oldest

    def first_bases(self, partitions: Iterable[int]) -> dict[int, int]:
        """Each of ``partitions``' lowest offset indexed (its oldest share the ledger still
        holds, copied or not), for those with a share indexed."""
        self._list_new()
        lists = self._lists
        return {p: entry.bases[0] for p in partitions
                if (entry := lists.get(p)) is not None and entry.bases}  # fmt: skip

    def _lists_of(self, partition: int) -> _Lists:
        self._list_new()
        return self._lists.get(partition) or _Lists()

    def _list_new(self) -> None:
        """Put the chunks added since the last lookup into the per-partition lists.

        A few chunks go share by share; more at once (a copier's pass over 48 frames of
        1000 shares each) are sorted by partition first, so that each partition's lists
        grow by one ``extend`` of its shares, in frame order (the stable sort keeps it):
        ~48,000 Python steps a pass become ~1000 (docs/scale.md round 37)."""
        new = self._chunks[max(self._listed, self._first_chunk) :]
        if len(new) >= _LIST_GROUPED_MIN_CHUNKS:
            self._list_grouped(new)
        else:
            lists = self._lists
            for chunk in new:
                for partition, base, count, frame, row in chunk.tolist():
                    entry = lists.get(partition)
                    if entry is None:
                        entry = lists[partition] = _Lists()
                    entry.bases.append(base)
                    entry.frames.append(frame)
                    entry.rows.append(row)
                    entry.counts.append(count)
        self._listed = len(self._chunks)

    def _list_grouped(self, chunks: list[np.ndarray]) -> None:
        """``_list_new`` of many chunks: their shares sorted by partition (stable: in frame
        order within one), each partition's appended with one ``extend`` a column."""
        shares = np.concatenate(chunks)
        assert len(shares), "an indexed chunk holds a share at least"
        shares = shares[np.argsort(shares[:, PARTITION], kind="stable")]
        partitions = shares[:, PARTITION]
        cuts = (np.flatnonzero(np.diff(partitions)) + 1).tolist()
        firsts, lasts = [0, *cuts], [*cuts, len(shares)]
        bases, counts = shares[:, BASE].tolist(), shares[:, COUNT].tolist()
        frames, rows = shares[:, FRAME].tolist(), shares[:, ROW].tolist()
        lists = self._lists
        for partition, first, last in zip(partitions[firsts].tolist(), firsts, lasts,
                                          strict=True):  # fmt: skip
            entry = lists.get(partition)
            if entry is None:
                entry = lists[partition] = _Lists()
            entry.bases.extend(bases[first:last])
            entry.frames.extend(frames[first:last])
            entry.rows.extend(rows[first:last])
            entry.counts.extend(counts[first:last])
