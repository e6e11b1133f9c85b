"""The ledger's in-memory index: for each partition, which ledger frame and rows hold which
of its offsets.

Entries arrive a frame at a time (``add``): one entry per share, ``(partition, base,
count, frame, row)`` with ``frame`` the frame's sequence number and ``row`` the share's
first row in the frame's body. They are kept as per-frame numpy chunks (an append costs a
few array operations, not one Python step per partition); a lookup needs them by
partition, so the first lookup after appends builds a partition-ordered view of all
entries (one stable sort: within a partition, append order is offset order) and the
lookups after it reuse it until the next append.

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

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

_ENTRY = np.dtype(
    [("partition", "<i8"), ("base", "<i8"), ("count", "<i8"), ("frame", "<i8"), ("row", "<i8")]
)

# a frame's wanted rows: (frame, partitions, first offsets, first rows, counts)
_Selection = tuple[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray]


@dataclass(frozen=True, slots=True)
class Span:
    """Rows ``[row, row + count)`` of frame ``frame`` hold offsets ``[base, base + count)``."""

    frame: int
    row: int
    base: int
    count: int


class LedgerIndex:
    def __init__(self) -> None:
        self._chunks: deque[np.ndarray] = deque()
        self._ends: dict[int, int] = {}
        self._starts: dict[int, int] = {}
        self._view: np.ndarray | None = None  # entries ordered by partition (then offset)
        self._bounds: dict[int, tuple[int, int]] | None = None
        self.entries = 0

    # -- writing -------------------------------------------------------------------------
    def add(self, frame: int, partitions: np.ndarray, bases: np.ndarray, counts: np.ndarray,
            rows: np.ndarray) -> None:  # fmt: skip
        """Index shares of one frame (partitions increasing; each base its partition's end;
        ``rows`` each share's first row in the frame's body)."""
        if not len(partitions):
            return
        chunk = np.empty(len(partitions), _ENTRY)
        chunk["partition"] = partitions
        chunk["base"] = bases
        chunk["count"] = counts
        chunk["frame"] = frame
        chunk["row"] = rows
        ends = (bases + counts).tolist()
        self._ends.update(zip(partitions.tolist(), ends, strict=True))
        self._chunks.append(chunk)
        self.entries += len(chunk)
        self._view = None

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
        while self._chunks and self._chunks[0]["frame"][0] < frames_below:
            self.entries -= len(self._chunks.popleft())
        self._view = None

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
        entries = self._entries_of(partition)
        bases = entries["base"]
        first = int(np.searchsorted(bases, offset, side="right")) - 1
        last = int(np.searchsorted(bases, end, side="left"))
        if first < 0:
            raise ValueError(f"partition {partition}: offset {offset} is not indexed")
        spans = []
        for entry in entries[first:last].tolist():
            _, base, count, frame, row = entry
            low = max(base, offset)
            high = min(base + count, end)
            spans.append(Span(frame, row + low - base, low, high - low))
        return spans

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
        keys = np.fromiter(starts, np.int64, len(starts))
        order = np.argsort(keys)
        keys = keys[order]
        values = np.fromiter(starts.values(), np.int64, len(starts))[order]
        never = np.iinfo(np.int64).max  # a partition not read: no row of it is wanted
        for chunk in self._chunks:
            partitions = chunk["partition"]
            at = np.minimum(np.searchsorted(keys, partitions), len(keys) - 1)
            wanted = np.where(keys[at] == partitions, values[at], never)
            bases = chunk["base"]
            ends = bases + chunk["count"]
            keep = ends > wanted
            if not keep.any():
                continue
            first = np.maximum(bases, wanted)[keep]
            yield (int(chunk["frame"][0]), partitions[keep], first,
                   chunk["row"][keep] + first - bases[keep], ends[keep] - first)  # fmt: skip

    def frames_needed(self) -> dict[int, bool]:
        """Per frame: whether any of its shares is not copied yet (retention's question)."""
        needed: dict[int, bool] = {}
        starts = self._starts
        for chunk in self._chunks:
            tops = chunk["base"] + chunk["count"]
            copied = np.fromiter((starts.get(p, 0) for p in chunk["partition"].tolist()),
                                 np.int64, len(chunk))  # fmt: skip
            needed[int(chunk["frame"][0])] = bool(np.any(tops > copied))
        return needed

    def _entries_of(self, partition: int) -> np.ndarray:
        if self._view is None:
            whole = np.concatenate(self._chunks) if self._chunks else np.empty(0, _ENTRY)
            order = np.argsort(whole["partition"], kind="stable")
            view = whole[order]
            keys, firsts = np.unique(view["partition"], return_index=True)
            lasts = np.append(firsts[1:], len(view))
            self._bounds = dict(zip(keys.tolist(), zip(firsts.tolist(), lasts.tolist(),
                                                       strict=True), strict=True))  # fmt: skip
            self._view = view
        assert self._bounds is not None
        low, high = self._bounds.get(partition, (0, 0))
        return self._view[low:high]
