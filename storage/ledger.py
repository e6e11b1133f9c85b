"""The ledger: a topic's shared log of small shares, one frame a statement (issue 14).

At 1000 partitions a statement's shares are a few messages each, and writing each as a
frame in its own partition's file costs more than its bytes. The ledger writes a
statement's small shares once, as one frame (``storage.ledger_format``) in a shared,
append-only log, ``<directory>/<20-digit file number>.ledger``; each partition keeps an
in-memory index into it (``storage.ledger_index``). Phase 1 (round 27): the log, its
index, its reads and its recovery; not yet wired into the produce path, and the copy
into the partitions' segments is the caller's (``release`` records it, ``drop_copied_files``
deletes what it made unneeded).

Append: ``append`` encodes the shares outside any lock, then joins a group-commit round
(``storage.group_commit``): the round's leader gives each frame its sequence number and
each share its base offset (its partition's end), writes every frame of the round with
one ``pwritev`` and syncs once; only then are the frames indexed and visible to reads,
and the appends return their base offsets. A frame is the statement's commit point.

Open (recovery): the partitions' own logs recover first and hand their ends
(``partition_ends``: the next offset each holds in its segments). Every ledger file is
scanned (``ledger_format.scan``: the valid prefix; a torn tail ends a file) and synced (so
nothing found in the page cache only is built upon), in file order; sequence numbers must
follow one another across files. A share wholly below its partition's own end was
copied already and is not indexed; a share at the partition's end is indexed, and the
partition's end moves past it; a share that straddles the end or leaves a gap means
damage (``CorruptSegmentError``): the copy writes whole shares, and a ledger file is
deleted only after every share in it is durable in its partition. New frames go to a new
file (a file is never appended to by two processes).

Invariants: a read sees only frames whose sync returned; a partition's indexed offsets are
contiguous from its ``start`` to its ``end``; files are deleted from the front only, so
the frames left always follow one another. After a failed write or sync the ledger
refuses appends (``StorageIOError``) until it is opened again: frames of the failed round
may or may not be on disk, and their offsets must not be given twice.
Thread-safety: ``append`` and ``read`` may be called from any thread; ``_lock`` guards the
index, the files and the maps; the write and sync run outside it (one leader at a time).
``close`` is for when no append is running (the owner's shutdown); reads after it fail.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from storage import failpoints, file_names, limits
from storage import ledger_format as fmt
from storage.errors import CorruptSegmentError, LimitExceededError, StorageIOError
from storage.frame_read import read_batch
from storage.fs import FileSystem
from storage.group_commit import GroupCommitter, Request
from storage.ledger_index import Chunk, LedgerIndex
from storage.record_batch import READ_SCHEMA, TIMESTAMP, WIRE_SCHEMA, data_bytes

SUFFIX = ".ledger"


def is_small_share(batch: pa.RecordBatch) -> bool:
    """Whether a share is small enough for the ledger (``limits.LEDGER_SHARE_BYTES_MAX``)."""
    return data_bytes(batch) <= limits.LEDGER_SHARE_BYTES_MAX


@dataclass(frozen=True, slots=True)
class _FrameAt:
    file_number: int
    position: int
    end: int
    written_at_us: int


@dataclass(frozen=True, slots=True)
class LedgerSpans:
    """Rows of many partitions as the ledger holds them (``Ledger.spans_many``): the
    frames' bodies (Arrow IPC record batch messages of ``WIRE_SCHEMA``, 8-byte multiples),
    each one's rows and write time; then per span (a partition's rows in one frame; in
    frame order, each frame's in partition order) the index of its body in ``bodies``,
    its partition, its first offset, its first row in the body and its number of rows."""

    bodies: list[pa.Buffer]
    frame_rows: np.ndarray  # int64, one per body
    written_ats: np.ndarray  # int64 (us), one per body
    frames: np.ndarray  # int64, one per span
    partitions: np.ndarray
    firsts: np.ndarray
    rows: np.ndarray
    counts: np.ndarray
    # The one map of a ledger file that holds every body, and each body's place in it
    # (a reader may take the rows from there without copying the bodies); else None.
    home: pa.Buffer | None = None
    home_starts: np.ndarray | None = None

    @staticmethod
    def empty() -> LedgerSpans:
        none = np.empty(0, np.int64)
        return LedgerSpans([], none, none, none, none, none, none, none)


@dataclass(frozen=True, slots=True)
class LedgerWhole:
    """Whole ledger frames for a consumer standing at the first offset of every share in
    them (``Ledger.whole_frames``), in ledger order: per frame its body (an Arrow IPC
    record batch message of ``WIRE_SCHEMA``, a view of the ledger's map), its write time,
    and its shares as the body holds them, one after another: partitions (increasing),
    first offsets and counts. ``next_offsets``: each partition read -> the offset after
    its last row taken (its offsets ascend from the consumer's start with no gap).
    ``size``: the bodies' bytes."""

    bodies: list[pa.Buffer]
    written_ats: list[int]
    partitions: list[np.ndarray]  # int64, per frame
    bases: list[np.ndarray]  # int64, per frame
    counts: list[np.ndarray]  # int64, per frame
    next_offsets: dict[int, int]
    message_count: int
    size: int

    def __len__(self) -> int:
        return len(self.bodies)

    def wire_batches(self) -> list[pa.RecordBatch]:
        """Each frame's rows as its wire batch (zero-copy: a view of its body)."""
        return [pa.ipc.read_record_batch(body, WIRE_SCHEMA) for body in self.bodies]

    def read_batches(self) -> list[tuple[np.ndarray, pa.RecordBatch]]:
        """Each frame's rows as a read batch (``READ_SCHEMA``: offsets and write times
        added) with each row's partition."""
        batches = []
        for wire, partitions, bases, counts, written_at in zip(
            self.wire_batches(), self.partitions, self.bases, self.counts, self.written_ats,
            strict=True,
        ):  # fmt: skip
            times = np.full(len(counts), written_at, np.int64)
            batches.append((np.repeat(partitions, counts).astype(np.int32),
                            read_batch(wire, counts, bases, times)))  # fmt: skip
        return batches


def _all_read(chunk: Chunk, keys: np.ndarray, values: np.ndarray) -> bool:
    """Whether a consumer at ``values`` (the offsets of partitions ``keys``, sorted) has
    read every share of ``chunk`` (a partition it does not read counts as read)."""
    at = np.minimum(np.searchsorted(keys, chunk.partitions), len(keys) - 1)
    known = keys[at] == chunk.partitions
    return bool(np.all(~known | (values[at] >= chunk.bases + chunk.counts)))


# Resume points ``whole_frames`` keeps: a few a partition set (consumers reading the same
# partitions), for a few partition sets (a topic's consumers read all its partitions).
_RESUME_POINTS = 8
# A removed partition's "own end" at recovery: past any offset, so its shares count as copied.
_REMOVED_END = 2**62
_RESUME_SETS = 16


@dataclass(slots=True)
class _File:
    number: int
    path: str
    first: int | None  # sequence of its first frame (None: no frame)
    last: int | None
    size: int  # bytes of valid frames
    fd: int | None = None  # read descriptor
    mapped: pa.Buffer | None = None
    mapped_size: int = 0
    shares: int = 0  # shares of its frames in the index (kept files' memory)


class Ledger:
    def __init__(self, fs: FileSystem, directory: str, *,
                 partition_ends: Mapping[int, int] | None = None,
                 removed: frozenset[int] = frozenset(),
                 file_bytes_max: int = limits.LEDGER_FILE_BYTES_MAX,
                 window_us: int = 0) -> None:  # fmt: skip
        """Open (recover) the ledger in ``directory``. ``partition_ends``: each partition's
        own log end (shares wholly below it are copied); ``removed``: partitions the topic
        removed (inactive, every row expired), whose shares in files kept after their copy
        count as copied, whatever their offsets (none is in ``partition_ends``)."""
        assert removed.isdisjoint(partition_ends or {}), "a removed partition has no log"
        self._fs = fs
        self._directory = directory
        self._file_bytes_max = file_bytes_max
        self._lock = threading.Lock()
        # Held by a group-commit round from its check of ``_closed`` to its index update,
        # and by ``close``: a close waits for the round in flight (it would otherwise
        # close the file under its write), and a round after it refuses. Before ``_lock``.
        self._round_lock = threading.Lock()
        self._index = LedgerIndex()
        # ``whole_frames``' resume points: a partition set (its sorted ids' bytes) -> the
        # (offsets, frame) its polls found every frame below ``frame`` read at, newest last.
        self._whole_resume: dict[bytes, list[tuple[np.ndarray, int]]] = {}
        self._frames: dict[int, _FrameAt] = {}
        self._files: dict[int, _File] = {}
        self._verified: set[int] = set()  # frames whose bytes passed the CRC on a read
        self._failed: BaseException | None = None
        self._closed = False
        # the leader's state: the next sequence, each partition's next offset (frames
        # written but not yet synced included), the file being appended to
        self._next_sequence = 0
        self._next_ends: dict[int, int] = {}
        self._write_fd: int | None = None
        self._write_number = 0
        self._write_size = 0
        # the directory is made with the first file (``_start_file``): a topic whose
        # statements never spread has none
        try:
            self._recover(dict(partition_ends or {}), removed)
        except BaseException:
            self.close()  # the descriptors of the files opened so far
            raise
        self._committer = GroupCommitter(self._flush, window_us)

    # -- recovery ------------------------------------------------------------------------
    def _recover(self, own_ends: dict[int, int], removed: frozenset[int]) -> None:
        for partition, end in own_ends.items():
            self._index.set_end(partition, end)
        numbers = [n for n in (file_names.parse_offset(name, SUFFIX)
                               for name in self._fs.list_directory(self._directory))
                   if n is not None]  # fmt: skip
        expected: int | None = None
        for number in sorted(numbers):
            path = self._path(number)
            fd = self._fs.open_read(path)
            try:
                self._fs.sync(fd)  # what a crash left in the page cache only: made durable
                size = self._fs.file_size(fd)
                # scanned through a map where maps are on (no copy of the file), else read
                raw = self._fs.map_read(fd, size) if size else None
                frames, valid = fmt.scan(raw if raw is not None else self._fs.read_file(path),
                                         path)  # fmt: skip
            except BaseException:
                self._fs.close(fd)
                raise
            entry = _File(number, path, frames[0].sequence if frames else None,
                          frames[-1].sequence if frames else None, valid, fd)  # fmt: skip
            self._files[number] = entry
            for frame in frames:
                if expected is not None and frame.sequence != expected:
                    raise CorruptSegmentError(
                        f"ledger frame {frame.sequence}, {expected} expected",
                        path=path, position=frame.position)  # fmt: skip
                expected = frame.sequence + 1
                entry.shares += self._index_recovered(frame, number, path, own_ends, removed)
            self._write_number = number + 1
        if numbers:  # (no file: no directory, or nothing in it to make durable)
            self._fs.sync_directory(self._directory)
        self._next_sequence = expected or 0
        self._next_ends = self._index.ends()

    def _index_recovered(self, frame: fmt.LedgerFrame, number: int, path: str,
                         own_ends: dict[int, int], removed: frozenset[int]) -> int:  # fmt: skip
        """Index ``frame``'s shares not copied yet; returns how many."""
        shares = frame.shares
        partitions = shares["partition"].astype(np.int64)
        counts = shares["count"].astype(np.int64)
        bases = shares["base"]
        rows = np.cumsum(counts) - counts
        own = np.fromiter((_REMOVED_END if p in removed else own_ends.get(p, 0)
                           for p in partitions.tolist()), np.int64, len(partitions))  # fmt: skip
        copied = bases + counts <= own
        if np.any(~copied & (bases < own)):
            raise CorruptSegmentError("a ledger share straddles its partition's own end",
                                      path=path, position=frame.position)  # fmt: skip
        keep = ~copied
        ends = np.fromiter((self._index.end(p) for p in partitions[keep].tolist()), np.int64,
                           int(keep.sum()))  # fmt: skip
        if np.any(bases[keep] != ends):
            raise CorruptSegmentError("a ledger share leaves a gap in its partition's offsets",
                                      path=path, position=frame.position)  # fmt: skip
        self._index.add(frame.sequence, partitions[keep], bases[keep], counts[keep], rows[keep])
        self._frames[frame.sequence] = _FrameAt(number, frame.position, frame.end,
                                                frame.written_at_us)  # fmt: skip
        return int(keep.sum())

    # -- appending -----------------------------------------------------------------------
    def append(self, shares: Sequence[tuple[int, pa.RecordBatch]], *, transaction_id: int = 0,
               written_at_us: int | None = None) -> list[int]:  # fmt: skip
        """Write one statement's shares ``(partition, wire batch)`` (partitions increasing)
        as one frame; returns each share's base offset once the frame is durable."""
        return self._append(fmt.encode_body(shares), transaction_id, written_at_us)

    def append_whole(self, partitions: np.ndarray, counts: np.ndarray, whole: pa.RecordBatch,
                     *, transaction_id: int = 0, written_at_us: int | None = None
                     ) -> list[int]:  # fmt: skip
        """``append`` of shares given as one batch (``ledger_format.encode_whole``)."""
        encoded = fmt.encode_whole(partitions, counts, whole)
        return self._append(encoded, transaction_id, written_at_us)

    def _append(self, encoded: fmt.EncodedBody, transaction_id: int,
                written_at_us: int | None) -> list[int]:  # fmt: skip
        if encoded.body.size > limits.LEDGER_FRAME_BYTES_MAX:
            raise LimitExceededError(
                f"a ledger frame of {encoded.body.size} bytes is over "
                f"{limits.LEDGER_FRAME_BYTES_MAX}; such a statement's shares are not small"
            )
        when = time.time_ns() // 1000 if written_at_us is None else written_at_us
        bases: np.ndarray = self._committer.submit((encoded, transaction_id, when))
        return bases.tolist()

    def _flush(self, requests: list[Request]) -> None:
        """One group-commit round (the leader only): frame, write, sync, index."""
        with self._round_lock:
            if self._closed:  # (a topic dropped, a store closed): nothing was written
                raise StorageIOError("the ledger is closed", path=self._directory)
            if self._failed is not None:
                raise StorageIOError("the ledger refuses appends after a failed write; "
                                     "reopen it", path=self._directory)  # fmt: skip
            try:
                self._write_round(requests)
            except BaseException as error:
                self._failed = error
                raise

    def _write_round(self, requests: list[Request]) -> None:
        parts: list[bytes | pa.Buffer] = []
        placed = []
        position = self._write_size
        for request in requests:
            encoded, transaction_id, when = request.payload
            ends = self._next_ends
            bases = np.fromiter((ends.get(p, 0) for p in encoded.partitions.tolist()),
                                np.int64, len(encoded.partitions))  # fmt: skip
            sequence = self._next_sequence
            frame = fmt.frame_parts(encoded, bases, sequence=sequence, written_at_us=when,
                                    transaction_id=transaction_id)  # fmt: skip
            size = fmt.frame_bytes(frame)
            if self._write_fd is None or (position > 0
                                          and position + size > self._file_bytes_max):  # fmt: skip
                if parts:  # what this round holds so far goes to the current file
                    self._write_and_sync(parts, placed)
                    parts, placed = [], []
                self._start_file()
                position = 0
            ends.update(zip(encoded.partitions.tolist(), (bases + encoded.counts).tolist(),
                            strict=True))  # fmt: skip
            self._next_sequence = sequence + 1
            placed.append((request, encoded, bases, sequence, position, size, when))
            parts.extend(frame)
            position += size
        self._write_and_sync(parts, placed)

    def _write_and_sync(self, parts: list[bytes | pa.Buffer], placed: list) -> None:
        fd = self._write_fd
        assert fd is not None and placed
        start = placed[0][4]
        if failpoints.armed("ledger.torn_frame"):
            joined = b"".join(bytes(p) for p in parts)
            self._fs.pwrite(fd, joined[: len(joined) // 2], start)
            failpoints.hit("ledger.torn_frame")
        self._fs.pwritev(fd, parts, start)
        failpoints.hit("ledger.after_write")
        self._fs.sync(fd)
        failpoints.hit("ledger.after_sync")
        end = placed[-1][4] + placed[-1][5]
        self._write_size = end
        with self._lock:
            entry = self._files[self._write_number]
            for request, encoded, bases, sequence, position, size, when in placed:
                counts = encoded.counts.astype(np.int64)
                self._index.add(sequence, encoded.partitions.astype(np.int64), bases, counts,
                                np.cumsum(counts) - counts)  # fmt: skip
                self._frames[sequence] = _FrameAt(self._write_number, position,
                                                  position + size, when)  # fmt: skip
                self._verified.add(sequence)  # written from these very bytes
                request.result = bases
                if entry.first is None:
                    entry.first = sequence
                entry.last = sequence
                entry.shares += len(counts)
            entry.size = end

    def _start_file(self) -> None:
        """End the file being written (its frames are synced) and start the next one."""
        if self._write_fd is not None:
            self._fs.close(self._write_fd)
            self._write_fd = None
            self._write_number += 1
        number = self._write_number
        path = self._path(number)
        self._fs.make_directory(self._directory)  # (its entry synced into the topic's)
        fd = self._fs.open_write(path)
        self._write_fd, self._write_size = fd, 0
        self._fs.sync_directory(self._directory)
        with self._lock:
            self._files[number] = _File(number, path, None, None, 0, self._fs.open_read(path))

    # -- reading -------------------------------------------------------------------------
    def end_offset(self, partition: int) -> int:
        with self._lock:
            return self._index.end(partition)

    def start_offset(self, partition: int) -> int:
        with self._lock:
            return self._index.start(partition)

    def cut_at_first_shares(self, starts: Mapping[int, int]) -> dict[int, int] | None:
        """For a reader at ``starts`` below the oldest shares the ledger holds of some of
        its partitions (rows it dropped after their copy, so read from the partitions'
        own logs), where to stop each partition that has shares here so that all of them
        arrive at those shares' edges together: a partition below its first share at that
        share's base, the others where they stand. None when no partition is below its
        first share (``whole_frames`` can take the frames from where the reader is)."""
        with self._lock:
            firsts = self._index.first_bases(starts)
        if all(starts[p] >= first for p, first in firsts.items()):
            return None
        return {p: first if starts[p] < first else starts[p] for p, first in firsts.items()}

    def read(self, partition: int, offset: int, max_messages: int | None = None
             ) -> pa.RecordBatch:  # fmt: skip
        """Messages of ``partition`` from ``offset`` to its end (at most ``max_messages``)
        as one read batch (``READ_SCHEMA``), zero-copy over the ledger's mapped frames
        where maps are on. An offset outside ``[start, end]`` is a ``ValueError``."""
        with self._lock:
            end = self._index.end(partition)
            if max_messages is not None:
                end = min(end, offset + max_messages)
            spans = self._index.spans(partition, offset, max(end, offset))
            bodies = {}
            for span in spans:
                if span.frame not in bodies:
                    bodies[span.frame] = self._body(span.frame)
        wires = {frame: pa.ipc.read_record_batch(body, WIRE_SCHEMA)
                 for frame, (body, _) in bodies.items()}  # fmt: skip
        pieces = [wires[s.frame].slice(s.row, s.count) for s in spans]
        count = sum(s.count for s in spans)
        if not pieces:
            wire = pa.RecordBatch.from_pylist([], schema=WIRE_SCHEMA)
        else:
            wire = pa.concat_batches(pieces) if len(pieces) > 1 else pieces[0]
        offsets = np.arange(offset, offset + count, dtype=np.int64)
        times = np.fromiter((bodies[s.frame][1] for s in spans), np.int64, len(spans))
        written = np.repeat(times, np.fromiter((s.count for s in spans), np.int64, len(spans)))
        columns = wire.columns
        return pa.RecordBatch.from_arrays(
            [pa.array(offsets), *columns[:4], pa.array(written, TIMESTAMP), *columns[4:]],
            schema=READ_SCHEMA,
        )

    def read_many(self, starts: Mapping[int, int], max_messages: int, *,
                  whole_frames: bool = False) -> tuple[pa.Table, np.ndarray]:  # fmt: skip
        """Messages of many partitions, each from its offset in ``starts``, at most
        ``max_messages`` in all, as written: frame after frame in ledger order, each frame's
        rows in partition order (so each partition's messages ascend in offset). Returns a
        read table (``READ_SCHEMA``) and each row's partition. A frame read whole is a
        zero-copy view of the ledger's map; a frame read in part is one ``take``. Each
        partition gets a prefix of what it has past its start (a poll may resume at the
        next offsets). With ``whole_frames``, the last frame read is not cut at
        ``max_messages``: each partition then gets whole shares (the copy's need)."""
        with self._lock:
            chosen = []
            total = 0
            for selection in self._index.select(dict(starts)):
                chosen.append((selection, self._body(selection[0])))
                total += int(selection[4].sum())
                if total >= max_messages:
                    break
        batches, partitions = [], []
        left = max(total, max_messages) if whole_frames else max_messages
        for (_, parts, firsts, rows, counts), (body, written_at) in chosen:
            if left <= 0:
                break
            wire = pa.ipc.read_record_batch(body, WIRE_SCHEMA)
            indices = np.repeat(rows - np.cumsum(counts) + counts, counts) + np.arange(
                int(counts.sum())
            )  # the wanted rows, ascending
            indices = indices[:left]
            count = len(indices)
            whole = count == wire.num_rows
            if not whole:
                wire = wire.take(pa.array(indices))
            offsets = (indices + np.repeat(firsts - rows, counts)[:count]).astype(np.int64)
            written = np.full(count, written_at, np.int64)
            columns = wire.columns
            batches.append(pa.RecordBatch.from_arrays(
                [pa.array(offsets), *columns[:4], pa.array(written, TIMESTAMP), *columns[4:]],
                schema=READ_SCHEMA))  # fmt: skip
            partitions.append(np.repeat(parts, counts)[:count])
            left -= count
        table = pa.Table.from_batches(batches, schema=READ_SCHEMA)
        return table, (np.concatenate(partitions) if partitions else np.empty(0, np.int64))

    def spans_many(self, wanted: Mapping[int, tuple[int, int]]) -> LedgerSpans | None:
        """Where the ledger holds offsets ``[low, high)`` of each partition of ``wanted``
        (``partition -> (low, high)``): the frames' bodies and each partition's rows in
        them, as arrays (``LedgerSpans``), without reading a row. None when a range is
        not wholly in the ledger now: ``low`` below the partition's start (copied and
        released since the caller looked at its log: read the log instead) or ``high``
        past its end. Taken under the ledger's lock, so no release cuts what it found;
        the bodies stay valid after it (views keep the maps, the files' deletion does not
        unmap them)."""
        asked = {p: r for p, r in wanted.items() if r[1] > r[0]}
        with self._lock:
            for partition, (low, high) in asked.items():
                if not self._index.start(partition) <= low <= high <= self._index.end(partition):
                    return None
            if not asked:
                return LedgerSpans.empty()
            keys = np.fromiter(asked, np.int64, len(asked))
            order = np.argsort(keys)
            keys = keys[order]
            highs = np.fromiter((r[1] for r in asked.values()), np.int64, len(asked))[order]
            left = int(sum(high - low for low, high in asked.values()))
            bodies: list[pa.Buffer] = []
            frames_read: list[int] = []
            frame_rows, written_ats, parts = [], [], []
            for frame, partitions, firsts, rows, counts in self._index.select(
                {p: r[0] for p, r in asked.items()}
            ):  # fmt: skip
                limit = highs[np.searchsorted(keys, partitions)]
                counts = np.minimum(counts, limit - firsts)
                keep = counts > 0
                if not keep.any():
                    continue
                body, written_at, record_count = self._frame_body(frame)
                frames_read.append(frame)
                parts.append((np.full(int(keep.sum()), len(bodies), np.int64), partitions[keep],
                              firsts[keep], rows[keep], counts[keep]))  # fmt: skip
                bodies.append(body)
                frame_rows.append(record_count)
                written_ats.append(written_at)
                left -= int(counts[keep].sum())
                if left <= 0:
                    break
            home = self._home(frames_read)
        assert left == 0, f"the ledger's index lacks {left} rows it claims"
        columns = [np.concatenate(column) for column in zip(*parts, strict=True)]
        home_starts = None
        if home is not None:
            home_starts = np.fromiter((b.address - home.address for b in bodies), np.int64,
                                      len(bodies))  # fmt: skip
            sizes = np.fromiter((b.size for b in bodies), np.int64, len(bodies))
            if np.any(home_starts < 0) or np.any(home_starts + sizes > home.size):
                home, home_starts = None, None  # a body of an earlier map of the file
        per_body = np.array(frame_rows, np.int64), np.array(written_ats, np.int64)
        return LedgerSpans(bodies, *per_body, *columns, home, home_starts)

    def whole_frames(self, starts: Mapping[int, int], max_messages: int,
                     max_bytes: int) -> LedgerWhole | None:  # fmt: skip
        """The oldest frames a consumer at ``starts`` (partition -> its next offset) reads
        whole: walking the frames in ledger order, a frame whose every share it has read
        is passed; the next ones are taken while every share of each starts exactly at
        the consumer's offset of its partition (as the previous frames taken leave it)
        and the frames fit ``max_messages`` and ``max_bytes``. None when no frame is
        taken: a frame holding a partition not in ``starts``, or one the consumer stands
        inside of (its poll then reads as usual, partition by partition), or the first
        frame alone over a budget, or nothing unread within
        ``limits.LEDGER_WHOLE_WALK_MAX`` frames. A walk starts where an earlier one found
        every frame before read at offsets no higher than these (its resume point,
        ``_resume_point``; offsets only move back by a reset or a rollback, and then the
        point does not apply): a consumer does not walk again past the frames it read
        (the copier keeps copied files for such reads, ``drop_copied_files``).

        Sound because a partition's offsets in the ledger are contiguous: a share that
        starts at the consumer's offset holds exactly the next rows of its partition, so
        each partition's rows taken follow its start with no gap and ascend. Frames in
        the index are durable (indexed after their sync); rows below a partition's
        ``start`` (copied into its segments since) are the same rows, still readable here
        until their file is dropped, which happens only under this lock."""
        if max_messages <= 0 or max_bytes <= 0 or not starts or not self._index.entries:
            return None  # (``entries``, read unlocked, a hint: None is always a safe answer)
        keys = np.fromiter(starts, np.int64, len(starts))
        order = np.argsort(keys)
        keys = keys[order]
        values = np.fromiter(starts.values(), np.int64, len(starts))[order]
        bodies: list[pa.Buffer] = []
        written_ats: list[int] = []
        parts: list[np.ndarray] = []
        firsts: list[np.ndarray] = []
        counts: list[np.ndarray] = []
        messages = size = passed = 0
        touched = np.zeros(len(keys), bool)  # the partitions of the frames taken
        with self._lock:
            last = self._index.last_chunk()
            if last is None or _all_read(last, keys, values):
                return None  # nothing new (a poll of a consumer keeping up, often)
            resume = self._resume_point(keys, values)
            read_below = resume  # every frame below this one is read at ``values``
            for chunk in self._index.live_chunks(resume):
                partitions, bases, count = chunk.partitions, chunk.bases, chunk.counts
                at = np.minimum(np.searchsorted(keys, partitions), len(keys) - 1)
                if not np.array_equal(keys[at], partitions):
                    break  # a partition this poll does not read
                have = values[at]
                if np.all(have >= bases + count):  # (``_all_read``, ``at`` known)
                    passed += 1  # read already
                    read_below = chunk.frame + 1
                    if not bodies and passed > limits.LEDGER_WHOLE_WALK_MAX:
                        break
                    continue
                if not np.array_equal(have, bases):
                    break  # the consumer stands inside it, or behind it
                rows = int(count.sum())
                body, written_at, record_count = self._frame_body(chunk.frame)
                if record_count != rows or not np.array_equal(chunk.rows, np.cumsum(count) - count):
                    break  # not one share after another from row 0: the usual reads
                if messages + rows > max_messages or size + body.size > max_bytes:
                    break
                values[at] = bases + count
                touched[at] = True
                read_below = chunk.frame + 1
                bodies.append(body)
                written_ats.append(written_at)
                parts.append(partitions)
                firsts.append(bases)
                counts.append(count)
                messages += rows
                size += body.size
            if read_below > resume:
                self._note_resume_point(keys, values, read_below)
            if not bodies:
                return None
        # (a mask over the sorted keys, not a ``unique`` of the frames' partitions: ~170 us
        # a poll of 1000 partitions; docs/scale.md round 38)
        next_offsets = dict(zip(keys[touched].tolist(), values[touched].tolist(), strict=True))
        return LedgerWhole(bodies, written_ats, parts, firsts, counts, next_offsets, messages,
                           size)  # fmt: skip

    def _resume_point(self, keys: np.ndarray, values: np.ndarray) -> int:
        """The highest frame below which an earlier ``whole_frames`` of the partitions
        ``keys`` found every frame read at offsets no higher than ``values`` (so read at
        ``values`` too: a frame's shares never change); 0 when none applies (an offset
        moved back, another consumer's point). Caller holds the lock."""
        best = 0
        for seen, frame in self._whole_resume.get(keys.tobytes(), ()):
            if frame > best and np.all(values >= seen):
                best = frame
        return best

    def _note_resume_point(self, keys: np.ndarray, values: np.ndarray, frame: int) -> None:
        """Every frame below ``frame`` is read at ``values`` (of partitions ``keys``): kept
        for the next polls (``_resume_point``), the newest ``_RESUME_POINTS`` a partition
        set, of the newest ``_RESUME_SETS`` sets. Caller holds the lock."""
        key = keys.tobytes()
        points = self._whole_resume.pop(key, [])
        points.append((values.copy(), frame))
        self._whole_resume[key] = points[-_RESUME_POINTS:]  # re-inserted: the newest set
        while len(self._whole_resume) > _RESUME_SETS:
            del self._whole_resume[next(iter(self._whole_resume))]

    def _home(self, frames: list[int]) -> pa.Buffer | None:
        """The map that holds the bodies of ``frames`` (read just now by ``_frame_body``:
        a body is a view of its file's current map), if one file holds them all and it
        is mapped; else None (caller holds the lock)."""
        numbers = {self._frames[frame].file_number for frame in frames}
        if len(numbers) != 1:
            return None
        return self._files[numbers.pop()].mapped

    def _body(self, sequence: int) -> tuple[pa.Buffer, int]:
        """Frame ``sequence``'s body and its time (``_frame_body``)."""
        body, written_at, _ = self._frame_body(sequence)
        return body, written_at

    def _frame_body(self, sequence: int) -> tuple[pa.Buffer, int, int]:
        """Frame ``sequence``'s body (a view of its file's map, or read), its time and its
        rows; checked against its CRC on the first read (caller holds the lock)."""
        at = self._frames[sequence]
        entry = self._files[at.file_number]
        if entry.fd is None:
            raise StorageIOError("the ledger is closed", path=entry.path)
        if entry.mapped is None or entry.mapped_size < at.end:
            size = max(at.end, entry.size)
            entry.mapped = self._fs.map_read(entry.fd, size)
            entry.mapped_size = size if entry.mapped is not None else 0
        if entry.mapped is not None:
            raw = entry.mapped.slice(at.position, at.end - at.position)
        else:
            data = self._fs.pread(entry.fd, at.end - at.position, at.position)
            raw = pa.py_buffer(data)
        frame = None
        if sequence not in self._verified or entry.mapped is None:
            frame = fmt.decode_frame(memoryview(raw), 0)
            if frame is None or frame.sequence != sequence:
                raise CorruptSegmentError("a ledger frame failed its check on a read",
                                          path=entry.path, position=at.position)  # fmt: skip
            self._verified.add(sequence)
        record_count, share_count, body_bytes = fmt.HEADER.unpack_from(memoryview(raw))[4:7]
        body_at = fmt.HEADER_BYTES + share_count * fmt.SHARE_BYTES
        return raw.slice(body_at, body_bytes), at.written_at_us, record_count

    # -- copy and retention --------------------------------------------------------------
    def release(self, partition: int, copied_end: int) -> None:
        """Offsets of ``partition`` below ``copied_end`` are durable in its own segments
        (the caller synced them): the ledger need not keep them."""
        with self._lock:
            self._index.release(partition, copied_end)

    def ends(self) -> dict[int, int]:
        """Every partition's ``end_offset``, taken at once."""
        with self._lock:
            return self._index.ends()

    def pending(self) -> dict[int, tuple[int, int]]:
        """Partitions with offsets not yet copied into their own segments:
        ``partition -> (start, end)``, ``start < end``."""
        with self._lock:
            starts = self._index.starts()
            return {p: (starts.get(p, 0), end) for p, end in self._index.ends().items()
                    if end > starts.get(p, 0)}  # fmt: skip

    def advance(self, partition: int, own_end: int) -> None:
        """The partition's own log was appended to past everything the ledger holds of it
        (a write that did not go through the ledger): its next ledger share starts at
        ``own_end``. The caller holds what keeps every other append to the partition out
        (its log's write lock, ``storage.ledger_route``), so no frame of it is in flight.
        An ``own_end`` past the ledger's end while the ledger still holds uncopied
        offsets of the partition is damage (``CorruptSegmentError``)."""
        with self._lock:
            end = self._index.end(partition)
            if own_end <= end:
                return
            if self._index.start(partition) < end or self._next_ends.get(partition, 0) > end:
                raise CorruptSegmentError(
                    f"ledger partition {partition}: its own log ends at {own_end}, past "
                    f"offsets the ledger holds uncopied (to {end})", path=self._directory,
                    position=0)  # fmt: skip
            self._index.set_end(partition, own_end)
            self._next_ends[partition] = own_end

    def share_edges(self, partition: int, offset: int, end: int) -> list[int]:
        """The offsets in ``(offset, end]`` where a share of ``partition`` ends (``offset``
        and ``end`` at share edges, within ``[start, end]``): where a copy may cut."""
        with self._lock:
            spans = self._index.spans(partition, offset, end)
        edges, at = [], offset
        for span in spans:
            at += span.count
            edges.append(at)
        return edges

    def skip_copied(self, partition: int, own_end: int) -> None:
        """The partition's own log already ends at ``own_end``, past the ledger's ``start``
        (a copy appended it, then failed or crashed before ``release``): release up to it,
        by the open's rule: shares wholly below are copied; ``own_end`` inside a share (a
        straddle) or past the ledger's end is damage (``CorruptSegmentError``)."""
        with self._lock:
            end = self._index.end(partition)
            start = self._index.start(partition)
            if own_end < start or own_end > end or not self._index.at_share_edge(
                    partition, own_end):  # fmt: skip
                raise CorruptSegmentError(
                    f"ledger partition {partition}: its own log ends at {own_end}, not at the "
                    f"end of a share in the ledger's [{start}, {end})", path=self._directory,
                    position=0)  # fmt: skip
            self._index.release(partition, own_end)

    def drop_copied_files(self, keep_bytes: int = 0, keep_since_us: int | None = None,
                          keep_shares: int | None = None, *,
                          unread: Mapping[int, int] | None = None,
                          keep_unread_bytes: int = 0) -> int:  # fmt: skip
        """Delete, from the front, ledger files none of whose shares is still needed (all
        released), never the file being written, but keep the newest of those up to
        ``keep_bytes`` and ``keep_shares`` indexed shares in all (``limits.
        LEDGER_KEEP_COPIED_SHARES`` when None), whose last frame was written at or after
        ``keep_since_us`` (no bound when None): their frames stay indexed and readable
        whole (``whole_frames``: a consumer a little behind reads them there rather than
        partition by partition from the copies).

        ``unread``: the readers' lowest next offset of each partition (0 where absent;
        the engine's consumers' committed offsets, ``ledger_route.lowest_offsets``). Past
        ``keep_bytes``, files up to ``keep_unread_bytes`` in all are kept as long as each
        holds a frame some reader has not read (``LedgerIndex.first_unread_frame``, a
        bisection a partition under the lock), the share and age bounds still
        applying: a consumer behind by more than ``keep_bytes`` then still reads whole the
        frames written since its last commit, instead of finding the oldest ones dropped
        by the pass that ended the producing (round 35; ``docs/scale.md``). Kept files stay
        contiguous: the first one not kept and all older ones go.

        Returns how many were deleted. Each removal is made durable (a directory sync)
        before the next one."""
        assert keep_bytes >= 0 and keep_unread_bytes >= 0
        dropped = 0
        with self._lock:
            needed = self._index.first_needed_frame()  # (None: every share copied)
            droppable: list[_File] = []  # the front's files that are all copied, in order
            for number in sorted(self._files):
                entry = self._files[number]
                if number == self._write_number and self._write_fd is not None:
                    break
                if needed is not None and entry.last is not None and entry.last >= needed:
                    break  # (files are in frame order: this one holds the needed frame)
                droppable.append(entry)
            kept = kept_shares = 0
            most_shares = limits.LEDGER_KEEP_COPIED_SHARES if keep_shares is None else keep_shares
            unread_from: int | None = -1  # (-1: not looked up yet; None: nothing unread)
            while droppable and kept_shares + droppable[-1].shares <= most_shares:
                newest = droppable[-1].last
                if keep_since_us is not None and newest is not None and (
                        self._frames[newest].written_at_us < keep_since_us):  # fmt: skip
                    break  # this one and every older one are past the age kept
                if kept + droppable[-1].size > keep_bytes:  # past the budget: kept only
                    if unread is None or kept + droppable[-1].size > keep_unread_bytes:
                        break  # (while some reader has not read it, within the larger one)
                    if unread_from == -1:
                        unread_from = self._index.first_unread_frame(unread)
                    if unread_from is None or newest is None or newest < unread_from:
                        break  # every reader is past this file's frames
                kept_shares += droppable[-1].shares
                kept += droppable.pop().size  # the newest copied files stay, within budget
            for entry in droppable:
                number = entry.number
                frames = range(entry.first, entry.last + 1) if entry.first is not None else ()
                self._fs.remove(entry.path)
                # each removal durable before the next: a crash must not bring back an
                # earlier file without a later one (a hole in the sequence at the open)
                self._fs.sync_directory(self._directory)
                failpoints.hit("ledger.mid_drop")
                if entry.fd is not None:
                    self._fs.close(entry.fd)
                del self._files[number]
                for f in frames:
                    self._frames.pop(f, None)
                    self._verified.discard(f)
                if entry.last is not None:
                    self._index.drop_front(entry.last + 1)
                dropped += 1
        return dropped

    def copied_file_bytes(self) -> int:
        """Bytes of the files before the one being written: at most what
        ``drop_copied_files`` may keep or drop (a hint, taken under the lock)."""
        with self._lock:
            return sum(entry.size for number, entry in self._files.items()
                       if number != self._write_number or self._write_fd is None)  # fmt: skip

    # -- the rest ------------------------------------------------------------------------
    @property
    def next_sequence(self) -> int:
        """The sequence number the next frame gets: how many frames this ledger numbered,
        across opens (a failed round's included; a hint, read without the leader's turn:
        for tests and counters)."""
        return self._next_sequence

    @property
    def file_numbers(self) -> list[int]:
        with self._lock:
            return sorted(self._files)

    def _path(self, number: int) -> str:
        return os.path.join(self._directory, file_names.offset_name(number) + SUFFIX)

    def close(self) -> None:
        """Close the files, once the append in flight (if any) is written and synced;
        appends after it are refused (``StorageIOError``)."""
        with self._round_lock, self._lock:
            self._closed = True
            for entry in self._files.values():
                if entry.fd is not None:
                    self._fs.close(entry.fd)
                    entry.fd = None
                entry.mapped = None
            if self._write_fd is not None:
                self._fs.close(self._write_fd)
                self._write_fd = None
