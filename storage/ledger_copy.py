"""The copy of a topic's ledger into its partitions' own segments (issue 14, phase 2a).

``copy_ledger`` takes what the ledger (``storage.ledger``) holds past each partition's
``start`` (whole frames, up to about ``max_messages`` messages), appends each partition's
rows to its own ``PartitionLog`` as ONE frame at the same offsets
(``PartitionLog.append_copied``: producer state recorded, synced whatever the fsync
policy), then ``release``s them in the ledger, and at the end deletes the ledger files
nothing needs any more (``drop_copied_files``). Not wired into the engine yet: the
caller owns the ledger and the logs (one copier at a time; while a partition has
uncopied ledger entries, nothing else appends to its log).

Idempotent across crashes and failures. The order per partition is: append and sync in
its log, then release in the ledger; the ledger's files go only after the release. So
a crash (or an error, failpoint ``ledger.copy_after_append``) between the two leaves a
partition whose own end is past the ledger's ``start``:
- after a reopen, the ledger opens with the logs' ends (``partition_ends``) and does not
  index the shares wholly below them; a share straddling an own end is refused
  (``CorruptSegmentError``, the open's rule);
- in the same process, the next copy finds the log's end past ``start`` and releases up
  to it by the same rule (``Ledger.skip_copied``) before reading.
Either way no row is appended twice: an append must start exactly at the log's end. The
copy writes whole shares only (whole frames are read, each partition's rows of a frame
are one share), so an own end always falls on a share's edge.

Invariants: a partition's rows reach its log in offset order and at their ledger
offsets; ``release(p, e)`` is called only once offsets below ``e`` are synced in the log.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from storage import failpoints, limits
from storage.errors import CorruptSegmentError
from storage.ledger import Ledger
from storage.partition_log import PartitionLog
from storage.record_batch import WIRE_SCHEMA

# READ_SCHEMA's columns that are WIRE_SCHEMA's (all but ``offset`` and ``written_at``)
_WIRE_FIELDS = tuple(WIRE_SCHEMA.names)


@dataclass(frozen=True, slots=True)
class CopyReport:
    """What one ``copy_ledger`` call did."""

    messages: int  # rows appended to the partitions' logs
    appends: int  # partition appends (one frame and one sync each)
    skipped: int  # offsets found already in a log (an earlier copy's append, not released)
    files_dropped: int


def copy_ledger(ledger: Ledger, logs: Mapping[int, PartitionLog], *,
                max_messages: int = limits.LEDGER_COPY_MESSAGES_MAX) -> CopyReport:  # fmt: skip
    """Copy up to about ``max_messages`` uncopied messages (whole frames: at least one,
    perhaps more than ``max_messages``) from ``ledger`` into ``logs`` (partition ->
    its log; every partition with uncopied offsets must be there), release them and drop
    the ledger files no longer needed. Call again until ``messages`` is 0 to copy all."""
    skipped = 0
    starts: dict[int, int] = {}
    for partition, (start, end) in ledger.pending().items():
        log = logs.get(partition)
        if log is None:
            raise KeyError(f"ledger partition {partition} has no log to copy into")
        own = log.end_offset
        if own < start:
            raise CorruptSegmentError(
                f"partition {partition}: its log ends at {own}, below the ledger's copied "
                f"start {start}", path=log.directory, position=0)  # fmt: skip
        if own > start:  # appended by an earlier copy that did not release
            ledger.skip_copied(partition, own)
            skipped += own - start
            start = own
        if start < end:
            starts[partition] = start
    messages = appends = 0
    if starts:
        table, partitions = ledger.read_many(starts, max_messages, whole_frames=True)
        messages, appends = _append_rows(ledger, logs, table, partitions, starts)
    return CopyReport(messages, appends, skipped, ledger.drop_copied_files())


def _append_rows(ledger: Ledger, logs: Mapping[int, PartitionLog], table: pa.Table,
                 partitions: np.ndarray, starts: dict[int, int]) -> tuple[int, int]:  # fmt: skip
    """Each partition's rows read, appended to its log (synced) and released: one append
    a partition, or a few (``grouped_pieces``)."""
    appends = 0
    for piece in grouped_pieces(table, partitions, starts, logs):
        logs[piece.partition].append_copied(piece.rows, piece.base, piece.written_at_us)
        failpoints.hit("ledger.copy_after_append")
        ledger.release(piece.partition, piece.end)
        appends += 1
    return len(partitions), appends


@dataclass(frozen=True, slots=True)
class Piece:
    """Rows of one partition read from the ledger, whole shares, at offsets ``base`` on."""

    partition: int
    base: int
    rows: pa.RecordBatch  # WIRE_SCHEMA
    written_at_us: int  # the latest written-at of its rows

    @property
    def end(self) -> int:
        return self.base + self.rows.num_rows


def grouped_pieces(table: pa.Table, partitions: np.ndarray, starts: dict[int, int],
                   logs: Mapping[int, PartitionLog]) -> Iterator[Piece]:  # fmt: skip
    """Group the rows of a ``Ledger.read_many`` (frame after frame; ``partitions``: each
    row's partition) by partition: one piece a partition, or a few when its rows are over
    ``limits.LEDGER_COPY_PIECE_BYTES`` or ``limits.BATCH_MESSAGES_MAX`` (cut between shares:
    a log's end must always fall on a share's edge), each partition's in offset order.
    ``starts`` (partition -> the offset its rows must begin at) is advanced past each
    piece as it is yielded; rows that do not continue it are ``CorruptSegmentError``
    (``logs`` names the directory). The rows are gathered (``_gathered``) a group of
    pieces at a time, at most about ``limits.LEDGER_COPY_PIECE_BYTES`` a group, so no
    piece carries buffers over the batch limits."""
    if not len(partitions):
        return
    frames = table.to_batches()  # one a frame, in ledger order
    lengths = np.fromiter((b.num_rows for b in frames), np.int64, len(frames))
    row_bytes = np.concatenate([_row_bytes(b) for b in frames])
    frame_of_row = np.repeat(np.arange(len(frames)), lengths)
    frame_firsts = np.concatenate(([0], np.cumsum(lengths)[:-1]))  # each frame's first row
    order = np.argsort(partitions, kind="stable")  # each partition's rows stay in offset order
    ordered = partitions[order]
    pieces = _pieces(ordered, frame_of_row[order], row_bytes[order])
    offsets = table.column("offset").to_numpy()[order]
    written = table.column("written_at").cast(pa.int64()).to_numpy()[order]
    frames = [frame.select(_WIRE_FIELDS) for frame in frames]
    group_bytes = 0
    group: list[tuple[int, int]] = []
    for index, (first, last, size) in enumerate(pieces):
        group.append((first, last))
        group_bytes += size
        if index + 1 < len(pieces) and group_bytes + pieces[index + 1][2] <= (
                limits.LEDGER_COPY_PIECE_BYTES):  # fmt: skip
            continue
        low = group[0][0]
        rows = _gathered(frames, frame_of_row, frame_firsts, order[low : group[-1][1]])
        for first_row, last_row in group:
            partition = int(ordered[first_row])
            base = int(offsets[first_row])
            count = last_row - first_row
            if base != starts[partition] or int(offsets[last_row - 1]) != base + count - 1:
                raise CorruptSegmentError(
                    f"ledger partition {partition}: rows read for the copy are not its "
                    f"offsets {starts[partition]} on", path=logs[partition].directory,
                    position=0)  # fmt: skip
            starts[partition] = base + count
            yield Piece(partition, base, rows.slice(first_row - low, count),
                        int(written[first_row:last_row].max()))  # fmt: skip
        group, group_bytes = [], 0


def _gathered(frames: Sequence[pa.RecordBatch], frame_of_row: np.ndarray,
              frame_firsts: np.ndarray, rows: np.ndarray) -> pa.RecordBatch:  # fmt: skip
    """``rows`` (indices into ``frames`` laid end to end) as one batch, in that order.

    Taken from the span of each frame the rows fall in, never from the whole read: a
    ``take`` over a table of many chunks first joins all of them, a copy of the whole
    read into fresh memory for every group (docs/scale.md round 36: the copier's CPU at
    1000 partitions fell from 3.7-4.2 to 3.0-3.4 us a message). A group's rows are whole
    pieces of consecutive partitions and a frame's rows are in partition order, so in
    each frame they are one run: the spans joined hold the group's rows and no others.
    (Correct whatever the rows: a span is the lowest to the highest row wanted in its
    frame.) The spans come from one sort of the rows: a read of many small frames (a
    backlog of small statements) costs no pass over the group's rows a frame."""
    ranked = np.sort(rows)  # one run of it a frame (no pass over the rows a frame)
    at = frame_of_row[ranked]
    cut = np.flatnonzero(np.diff(at)) + 1
    heads, tails = np.concatenate(([0], cut)), np.concatenate((cut, [len(ranked)]))
    used, lows, highs = at[heads], ranked[heads], ranked[tails - 1] + 1
    sizes = highs - lows
    shift = np.zeros(len(frames), np.int64)  # a frame's row index -> its index in the spans
    shift[used] = np.cumsum(sizes) - sizes - lows
    spans = [
        frames[frame].slice(low - first, size)
        for frame, first, low, size in zip(used.tolist(), frame_firsts[used].tolist(),
                                           lows.tolist(), sizes.tolist(), strict=True)
    ]  # fmt: skip
    source = spans[0] if len(spans) == 1 else pa.concat_batches(spans)
    taken = source.take(pa.array(rows + shift[frame_of_row[rows]]))
    assert taken.num_rows == len(rows)
    return taken


def _row_bytes(frame: pa.RecordBatch) -> np.ndarray:
    """Each row's bytes, about: its message, plus the frame's other bytes shared out."""
    data = frame.column("data")
    ends = np.frombuffer(data.buffers()[1], np.int32, len(data) + 1, 4 * data.offset)
    sizes = np.diff(ends).astype(np.int64)
    rest = max(frame.get_total_buffer_size() - int(sizes.sum()), 0)
    return sizes + rest // max(len(sizes), 1) + 1


def _pieces(ordered: np.ndarray, frame_of_row: np.ndarray, row_bytes: np.ndarray
            ) -> list[tuple[int, int, int]]:  # fmt: skip
    """``(first, last, bytes)`` of each append, in the sorted rows: a partition's rows,
    cut at share edges (where the frame changes) once over the piece limits.

    A partition whose rows fit the limits is one piece, found with array operations
    (the usual case: a pass of 48 frames over 1000 partitions has ~48,000 shares, and a
    Python step a share cost ~10 % of the copier's CPU, docs/scale.md round 37); only
    a partition over them goes share by share (``_cut_shares``)."""
    cap = limits.LEDGER_COPY_PIECE_BYTES
    count = len(ordered)
    cumulative = np.concatenate(([0], np.cumsum(row_bytes)))
    bounds = np.flatnonzero(np.diff(ordered) != 0) + 1
    firsts = np.concatenate(([0], bounds))
    lasts = np.concatenate((bounds, [count]))
    sizes = cumulative[lasts] - cumulative[firsts]
    fits = (sizes <= cap) & (lasts - firsts <= limits.BATCH_MESSAGES_MAX)
    if fits.all():
        return list(zip(firsts.tolist(), lasts.tolist(), sizes.tolist(), strict=True))
    edges = np.flatnonzero((np.diff(ordered) != 0) | (np.diff(frame_of_row) != 0)) + 1
    share_firsts = np.concatenate(([0], edges))
    pieces: list[tuple[int, int, int]] = []
    for first, last, size, fit in zip(firsts.tolist(), lasts.tolist(), sizes.tolist(),
                                      fits.tolist(), strict=True):  # fmt: skip
        if fit:
            pieces.append((first, last, size))
            continue
        low, high = np.searchsorted(share_firsts, [first, last])
        starts = share_firsts[low:high].tolist()
        pieces.extend(_cut_shares(starts, last, cumulative, cap))
    return pieces


def _cut_shares(starts: list[int], end: int, cumulative: np.ndarray,
                cap: int) -> list[tuple[int, int, int]]:  # fmt: skip
    """One partition's shares (their first rows ``starts``, the last ending at ``end``)
    joined into pieces greedily: a share joins the piece before it while the piece stays
    within ``cap`` bytes and ``limits.BATCH_MESSAGES_MAX`` rows; a share over them alone
    is a piece of its own."""
    pieces: list[tuple[int, int, int]] = []
    for first, last in zip(starts, [*starts[1:], end], strict=True):
        size = int(cumulative[last] - cumulative[first])
        if pieces:
            low, _, held = pieces[-1]
            if held + size <= cap and last - low <= limits.BATCH_MESSAGES_MAX:
                pieces[-1] = (low, last, held + size)
                continue
        pieces.append((first, last, size))
    return pieces
