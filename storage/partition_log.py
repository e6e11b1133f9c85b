"""A partition: an append-only log of segments with exactly-once publish.

Owns the partition directory (``<base>.log/.index/.timeindex`` segments and
``<offset>.snapshot`` producer snapshots). Offsets are dense and strictly
increasing from the log start offset.

Concurrency: one writer at a time (``_write_lock``); readers take no lock.
Readers see a published ``Visible`` tuple (end offset, segment list, byte
limit of the last segment) that the writer replaces only after an append met
its fsync policy, so a reader never sees unacknowledged or half-written data
and never waits for a writer.

After a failed write or fsync the partition is *fenced*: it refuses writes
until reopened, because the kernel may have dropped the dirty pages it failed
to write (PostgreSQL's fsyncgate lesson). Recovery on reopen trusts only what
is on disk.
"""

from __future__ import annotations

import bisect
import contextlib
import itertools
import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

import numpy as np
import pyarrow as pa

from storage import failpoints, limits, log_loader, page_cache, staged_frames
from storage.clock import Clock
from storage.codecs import Codec, uniform_codec
from storage.column_codec import unpacked_bytes
from storage.config import FsyncPolicy, TopicConfig
from storage.errors import (
    CorruptSegmentError,
    InvalidParameterValueError,
    LimitExceededError,
    PartitionFencedError,
    PartitionInactiveError,
    StorageIOError,
    UnsupportedCodecError,
)
from storage.frame_cuts import cuttable, frame_slices
from storage.frame_read import (
    FRAME_CACHE,
    SMALL_SLICE_ROWS,
    CachedFrame,
    FrameCache,
    FrameRead,
    FrameSlice,
    decode_slices,
)
from storage.fs import FileSystem
from storage.group_commit import GroupCommitter, Request
from storage.log_loader import RecoveryReport, load_segments
from storage.producer_state import (
    SMALL_BATCH_ROWS,
    DedupDecision,
    ProducerStateManager,
    SpreadDecision,
    record_share,
)
from storage.record_batch import (
    HEADER_BYTES,
    WIRE_SCHEMA,
    FrameEncoder,
    FrameHeader,
    check_wire_batch,
)
from storage.segment import Frame, LogSegment
from storage.staged_frames import StagedFrame, own_file, publish_header, whole_own_file

if TYPE_CHECKING:
    from storage.ledger import LedgerSpans

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SyncTicket:
    """A sync of a log begun (``PartitionLog.begin_sync``): its last segment with the
    writer's descriptor held for the sync, and what the sync covers."""

    segment: LogSegment
    held: Any  # the segment's held descriptor (``LogSegment.flush_for_sync``)
    covered: int  # the log's end offset when it began: durable once it ends
    segments: list[LogSegment]
    synced_bytes: int  # the last segment's size when it began

# Frames of at most this many messages are decoded in runs on a read (``decode_slices``):
# their fixed cost dominates, and copying their few messages once is cheap.
SMALL_FRAME_ROWS = SMALL_SLICE_ROWS
REPLAY_RUN_ROWS = 16_384  # messages per producer-state replay call on open
REPLAY_RUN_BYTES = 4 * 1024 * 1024  # ... or this many bytes of its kept columns (_ReplayRun)
# The columns of a frame the producer-state replay reads (besides offsets and times,
# which come from the frame's header).
REPLAY_COLUMNS = ("seq_no", "producer_id", "message_group_id")
WRITTEN = 0
DUPLICATE = 1
assert (WRITTEN, DUPLICATE) == (False, True)  # a status array is the duplicate mask as uint8


class LedgerTail(Protocol):
    """The topic's ledger as a partition sees it (``storage.ledger_route.TopicLedger``)."""

    def copy_locked(self, log: PartitionLog) -> None:
        """Copy the ledger's rows of ``log`` past its end into it (write lock held)."""

    def end_of(self, partition: int) -> int:
        """The ledger's end of ``partition``: past the last row it holds of it."""

    def spans_many(self, wanted: Mapping[int, tuple[int, int]]) -> LedgerSpans | None:
        """Where the ledger holds ``partition -> [low, high)`` (``Ledger.spans_many``)."""


@dataclass(frozen=True, slots=True)
class AppendResult:
    """Per-message outcome of one appended batch, in the batch's order.

    ``status[i]`` is ``WRITTEN`` or ``DUPLICATE``; ``offsets[i]`` is the new
    offset of a written message, or the earlier offset of a duplicate (-1
    when no longer known).
    """

    partition: int
    status: np.ndarray
    offsets: np.ndarray

    @property
    def written_count(self) -> int:
        return int(np.count_nonzero(self.status == WRITTEN))

    @property
    def duplicate_count(self) -> int:
        return int(np.count_nonzero(self.status == DUPLICATE))


@dataclass(frozen=True, slots=True)
class Visible:
    end_offset: int
    segments: tuple[LogSegment, ...]
    last_segment_bytes: int


@dataclass(frozen=True, slots=True)
class ReadResult:
    batches: list[pa.RecordBatch]
    next_offset: int  # where the next read should start
    start_offset: int  # the log start offset when read
    end_offset: int  # the visible end offset when read

    @property
    def message_count(self) -> int:
        return sum(b.num_rows for b in self.batches)


class PartitionLog:
    def __init__(
        self,
        fs: FileSystem,
        directory: str,
        partition_id: int,
        config: TopicConfig,
        clock: Clock,
        data_ready: threading.Condition | None = None,
    ) -> None:
        self.fs = fs
        self.directory = directory
        self.partition_id = partition_id
        self.config = config
        self.clock = clock
        self.active = True
        # Where a transactional publish to this partition goes once it is inactive
        # (its topic sets it: the active descendants by key); None: refused.
        self.redirect: Callable[[list[pa.RecordBatch], int], None] | None = None
        # Syncs the partitions ``redirect`` wrote to since the last call (set with it).
        self.sync_redirected: Callable[[], None] | None = None
        # The topic's table of its partitions' log starts (``TopicLog.start_offsets``), or
        # None: kept equal to ``start_offset`` at every publish (``_set_visible``), so that
        # a poll of 1000 partitions reads one dict instead of 1000 logs' segment lists.
        self.start_table: dict[int, int] | None = None
        self.data_ready = data_ready or threading.Condition()
        self.recovery = RecoveryReport()
        self._write_lock = threading.Lock()
        self._frame_encoder = FrameEncoder()  # used under ``_write_lock`` only
        # Where the large frame the last read stopped inside is kept (None: nowhere).
        self._frame_cache: FrameCache | None = FRAME_CACHE
        self._fenced: StorageIOError | None = None
        # The segment adopted last by a publish not yet visible, its size and end: what a
        # fence must not cut (``_adopt_locked``); None once published.
        self._adopted: tuple[LogSegment, int, int] | None = None
        self._closed = False
        # The topic's ledger (``storage.ledger_route``), when its switch is on: rows of
        # this partition it holds past this log's end are copied in (``_settle_locked``)
        # before any write here and before any read that needs the log's end.
        # ``ledger_unsettled``: the ledger may hold such rows (set under the write lock by
        # a ledger append, cleared by the copy; a reader seeing it False after a ledger
        # append's lock was released sees the copied rows).
        self.ledger_tail: LedgerTail | None = None
        self.ledger_unsettled = False
        # The offset below which the engine says every reader that matters is past (its
        # consumers' floor; ``EVERY_OFFSET``-like for a topic no consumer reads), or None:
        # writes then drop what was written back behind them (``page_cache.drop_behind``).
        self.drop_floor: int | None = None
        # Every offset below this is known synced by this process (the open syncs what it
        # loads, below; before that nothing is known on disk). Only grows, by syncs that
        # covered the whole log (older segments are synced when sealed).
        self._durable_end = 0
        self.producers = ProducerStateManager(
            fs, directory, clock, config.producer_expiry_ms * 1000
        )
        segments = load_segments(fs, directory, self.recovery)
        # A tuple, replaced (never changed in place) on roll and retention, so that
        # publishing hands it to readers as it is.
        self._segments: tuple[LogSegment, ...] = tuple(segments)
        for loaded in segments:  # only bytes this process writes are ever dropped
            loaded.dropped_to = loaded.size_bytes  # (review R2-F5 of round 13)
        self._last_written_at_us = max((s.last_written_at_us or 0 for s in segments), default=0)
        self._set_visible(Visible(segments[-1].next_offset, tuple(segments),
                                  segments[-1].size_bytes))  # fmt: skip
        self._restore_producers()
        self._committer = GroupCommitter(self._flush_group, config.group_commit_window_us)
        # A killed process's last frames may be in the page cache only (written, never
        # synced nor acknowledged) yet read back whole by the load: sync them before any
        # reader sees them, as Kafka flushes what its recovery kept, or a consumer could
        # commit offsets past what a later power cut leaves (R2-3). A log this process
        # opens with nothing in it needs no sync.
        if segments[-1].size_bytes:
            self.make_durable()

    # -- state -------------------------------------------------------------------------
    @property
    def config(self) -> TopicConfig:
        return self._config

    @config.setter
    def config(self, config: TopicConfig) -> None:
        """Replace the settings (ALTER TOPIC); the codec check follows at once."""
        self._config = config
        self._codec_ids = frozenset(int(codec) for codec in config.supported_codecs)

    @property
    def start_offset(self) -> int:
        return self._visible.segments[0].base_offset

    @property
    def end_offset(self) -> int:
        """Past the last acknowledged row: the ledger's rows of this partition copied in
        first (``settle``); a fenced log, which takes no copy, counts them where the
        ledger holds them (``reader_end``: its reads take them from there)."""
        if self.ledger_unsettled:
            self.settle()
            if self._fenced is not None:
                return self.reader_end
        return self._visible.end_offset

    @property
    def reader_end(self) -> int:
        """``end_offset`` without the settle: the end a reader sees, the ledger's end of
        this partition while it holds rows past this log's (a read of many partitions
        reads them there, ``storage.bulk_scan``); as ``end_offset`` in every other case
        (no ledger, nothing unsettled, a closed log). A fenced log counts its ledger rows
        too, though it does not settle: its reads take them from the ledger."""
        tail = self.ledger_tail
        if self.reads_across and tail is not None:
            return max(self._visible.end_offset, tail.end_of(self.partition_id))
        return self._visible.end_offset

    @property
    def fenced(self) -> bool:
        """Whether writes are refused until the reopen (an I/O error, ``_fence``)."""
        return self._fenced is not None

    @property
    def reads_across(self) -> bool:
        """Whether rows past this log's own end may be read in the topic's ledger now
        (``reader_end`` is the ledger's): unsettled and not closed. A fenced log reads
        across too: its acknowledged ledger rows stay there, durable, until the reopen
        copies them (it takes no copy, and no release passes its own end), so a read of
        it finds them there (``read_frames``, ``storage.bulk_scan``)."""
        return self.ledger_unsettled and self.ledger_tail is not None and not self._closed

    def has_rows_past(self, offset: int) -> bool:
        """Whether a reader at ``offset`` has rows to read now, without a settle (for a
        wait under ``data_ready``): the log's own end is past it, or the ledger holds rows
        of it (a settle brings them; a fenced log's, past ``offset``, are read there)."""
        if self._visible.end_offset > offset:
            return True
        if not self.ledger_unsettled:
            return False
        return self._fenced is None or self.reader_end > offset

    @property
    def own_end(self) -> int:
        """The end of this log's own segments, whatever the ledger holds past it (no
        settle: for the ledger's code, which may hold the write lock)."""
        return self._visible.end_offset

    @property
    def durable_end(self) -> int:
        """Offsets below this are durable (synced since open); a lower bound."""
        return self._durable_end

    @property
    def size_bytes(self) -> int:
        if self.ledger_unsettled:
            self.settle()
        visible = self._visible
        return sum(s.size_bytes for s in visible.segments[:-1]) + visible.last_segment_bytes

    @property
    def segments(self) -> tuple[LogSegment, ...]:
        if self.ledger_unsettled:
            self.settle()
        return self._visible.segments

    def last_seq_no(self, producer_id: str) -> int | None:
        return self.producers.last_seq_no(producer_id)

    @property
    def sync_waiters(self) -> int:
        """Appends waiting for the next group-commit round (``GroupCommitter.waiting``:
        a hint)."""
        return self._committer.waiting

    @property
    def sync_running(self) -> bool:
        """Whether a group-commit round runs now (``GroupCommitter.running``: a hint)."""
        return self._committer.running

    # -- appends -----------------------------------------------------------------------
    def append(self, batch: pa.RecordBatch) -> AppendResult:
        """Append one wire batch; returns once it meets the fsync policy.

        ``append_many([batch])[0]``, minus the list handling: this is the hot path.
        """
        check_wire_batch(batch)
        self._check_codecs(batch)
        self._check_writable()
        policy = self.config.fsync_policy
        if policy is FsyncPolicy.GROUP:
            return self._committer.submit([batch])[0]
        with self._writing():
            self._check_writable()
            result = self._write_decision(self.producers.decide(batch))
            if policy is FsyncPolicy.ALWAYS:
                self._sync_locked()
            self._publish()
        return result

    def check_append(self, batch: pa.RecordBatch) -> None:
        """Raise what ``append(batch)`` would raise before writing anything: a bad schema,
        a limit, a codec the topic refuses, a closed, fenced or inactive partition."""
        check_wire_batch(batch)
        self._check_codecs(batch)
        self._check_writable()

    def check_batch(self, batch: pa.RecordBatch) -> None:
        """Raise what ``append(batch)`` would raise for the batch itself, whatever the
        partition's state: a bad schema, a limit, a codec the topic refuses."""
        check_wire_batch(batch)
        self._check_codecs(batch)

    def check_writable(self) -> None:
        """Raise what an append would raise for the partition's state alone: closed,
        fenced (after an I/O failure) or inactive (after a split)."""
        self._check_writable()

    def append_many(self, batches: list[pa.RecordBatch]) -> list[AppendResult]:
        """Append batches together: one write, one sync, visible to readers at once."""
        for batch in batches:
            check_wire_batch(batch)
            self._check_codecs(batch)
        self._check_writable()
        if self.config.fsync_policy is FsyncPolicy.GROUP:
            return self._committer.submit(batches)
        with self._writing():
            self._check_writable()
            results = self._write_locked(batches)
            if self.config.fsync_policy is FsyncPolicy.ALWAYS:
                self._sync_locked()
            self._publish()
        return results

    def publish_transactional(
        self,
        batches: list[pa.RecordBatch],
        transaction_id: int,
        bodies: list[pa.Buffer] | None = None,
    ) -> list[AppendResult]:
        """Append a committed transaction's batches, tagged with its id, without a sync.

        The transaction's data is already durable in staging and its commit
        record in DuckDB, so this write need not be synced now: recovery finds
        the tagged frames (``contains_transaction``) or publishes them again.
        The batches become visible to readers together. ``bodies``, if given, are
        the batches' encoded bodies (``serialize_body_buffer``, as staged): reused.
        A batch over the frame target is written as several frames, in row order
        (``storage.frame_cuts``; its body is not reused then): a crash keeps a prefix of
        them, which ``published_prefix`` counts. One result per batch, as given.
        """
        assert bodies is None or len(bodies) == len(batches)
        assert transaction_id > 0
        for batch in batches:
            check_wire_batch(batch)
            self._check_codecs(batch)
        if not self.active and self.redirect is not None:
            return self._redirected(batches, transaction_id)
        frames = [(index, piece, bodies[index] if bodies is not None and piece is batch else None)
                  for index, batch in enumerate(batches)
                  for piece in frame_slices(batch)]  # fmt: skip
        with self._writing():
            if not self.active and self.redirect is not None and not self._closed:
                redirect = True
            else:
                redirect = False
                self._check_writable()
                written = []
                for number, (index, piece, body) in enumerate(frames):
                    if number:  # between two frames of one publish (a cut share's)
                        failpoints.hit("publish.mid_share")
                    decision = self.producers.decide(piece)
                    # decide() may rewrite the batch (server-assigned seq_nos): the staged
                    # body is the batch as staged, reusable only if unchanged
                    reused = None if decision.batch is not piece else body
                    written.append((index, self._write_decision(decision, transaction_id, reused)))
                self._publish()
        if redirect:
            return self._redirected(batches, transaction_id)
        return _joined(written, len(batches), self.partition_id)

    def publish_staged(self, frames: list[StagedFrame], transaction_id: int) -> int:
        """``publish_transactional`` of a share staged as frames (``storage.staged_frames``):
        each frame's header written and its body copied in the kernel from the staged
        file, in order, visible together; returns the messages written. The frames of a
        whole own file of ``ADOPT_BYTES_MIN`` to ``ADOPT_BYTES_MAX`` bytes are not copied:
        the file is adopted as a segment (``_adopt_locked``). No frame holds a producer
        id, a message group or metadata, so none is a duplicate and the producer state
        has nothing to record; they are raw (codec 0) or zstd messages (codec 4, checked
        when staged against the codecs the topic accepted then), so the topic must accept
        one of the two. An
        inactive partition raises ``PartitionInactiveError`` (the caller publishes the
        decoded rows by key instead). A frame of an own file that recovery found gone
        (adopted, ``staged_refs``: a placeholder, ``body_position`` -1) that this
        partition lacks is ``CorruptSegmentError``: the committed rows are lost."""
        assert transaction_id > 0
        self._check_staged_codecs()
        for frame in frames:
            if frame.body_position < 0:
                raise CorruptSegmentError(
                    "a committed bulk write's frames file is gone (adopted as a segment) "
                    f"but partition {self.partition_id} lacks its rows", path=frame.path,
                    position=0)  # fmt: skip
        written = 0
        adopted = False
        with self._writing():
            self._check_writable()
            sources: dict[str, int] = {}
            try:
                number = 0
                for adoptable, files in _adoption_groups(frames, self._adoptable):
                    if adoptable:  # consecutive whole own files: adopted together
                        if number:
                            failpoints.hit("publish.mid_share")
                        self._adopt_locked(files, transaction_id)
                        adopted = True
                        written += sum(f.record_count for run, _ in files for f in run)
                        number += sum(len(run) for run, _ in files)
                        continue
                    ((run, _),) = files
                    path = run[0].path
                    for frame in run:
                        if number:  # between two frames of one publish (a cut share's)
                            failpoints.hit("publish.mid_share")
                        number += 1
                        source = sources.get(path)
                        if source is None:
                            source = sources[path] = self.fs.open_read(path)
                        now_us = self.clock.now_us()
                        segment = self._segment_for_append(now_us)
                        written_at_us = max(now_us, self._last_written_at_us)
                        header_bytes, header = publish_header(
                            frame, segment.next_offset, written_at_us, transaction_id)
                        try:
                            segment.append_frame_copy(header_bytes, header, source,
                                                      frame.body_position)  # fmt: skip
                        except StorageIOError as error:
                            self._fence(error)
                            raise
                        self._last_written_at_us = written_at_us
                        written += frame.record_count
            finally:
                for source in sources.values():
                    self.fs.close(source)
            self._publish()
        if adopted:
            failpoints.hit("adopt.after_visible")
        return written

    def _adoptable(self, run: list[StagedFrame]) -> int:
        """The size of the own file whose frames ``run`` is, whole and in order, if it may
        be adopted (``limits.ADOPT_BYTES_MIN`` to ``ADOPT_BYTES_MAX``, and no larger than
        the topic's segments: a segment stays within ``segment_bytes``); else 0."""
        if own_file(run[0].path) is None:
            return 0
        size = self.fs.path_size(run[0].path)
        largest = min(limits.ADOPT_BYTES_MAX, self.config.segment_bytes)
        if not limits.ADOPT_BYTES_MIN <= size <= largest:
            return 0
        return size if whole_own_file(run, size) else 0

    def _adopt_locked(self, files: list[tuple[list[StagedFrame], int]],
                      transaction_id: int) -> None:  # fmt: skip
        """Adopt the own files ``files`` (each all its frames and its size; consecutive in
        the share) as the segments after the log's end, in order, not yet published (the
        caller publishes). Under the write lock, each step with its failpoint, hit per
        file (the n-th file of a publish is ``@n``):

        1. the active segment sealed (synced: recovery trusts sealed segments), or, empty,
           closed: the first adopted file will replace its (empty) log under the same
           name, so the log's end stays named on disk throughout
           (``adopt.before_patch``, before each file's patch);
        2. every file's staged headers overwritten with the segment's (offsets from the
           log's end on, one time, the transaction; ``staged_frames.patch_headers``,
           ``adopt.mid_patch`` halfway through a file) and its writeback started; then
           each fdatasynced (their writes in flight together: one wait, not one per file;
           ``adopt.before_sync``: every file patched, none synced; a single file is
           synced as it is patched);
        3. each file in turn (``adopt.before_rename``: every file patched and synced, the
           earlier ones renamed) renamed into the partition as ``<base offset>.log``
           (``adopt.before_dir_sync``: renamed, the directory not synced), its indexes
           written from the headers, the segment before it sealed as a roll seals it, the
           directory synced, so that a file is renamed on disk only after the one before
           it; after the last, the producer snapshot at its base, written as a roll
           writes it, syncs the directory (under fsync policy ``never`` the directory
           is synced here: the staged copy is gone once the checkpoint releases the
           commit directory) (``adopt.before_visible``, after each file).

        One snapshot and one sync per file of patched headers plus one directory sync
        per file, where adopting the files one by one took a roll, a snapshot (file and
        directory synced) and the patched file's sync each (round 15). The snapshot of
        the last base is what a replay from there needs: adopted frames carry no
        producer, so the state at every base of the run is the same.

        A crash before a file's rename leaves it in the commit directory, its headers
        staged, patched, a mix or torn: recovery rebuilds its staged bytes and checks them
        against the record's CRC-32C (``staged_frames.check_own_file``) and publishes it
        again (adopting it again from the log's end, after the files renamed before it).
        After the rename the segment is the partition's (a reopen loads it; the commit
        directory no longer names the file: recovery finds its rows by transaction id).
        An I/O error before the first rename fences the partition as a write's does (the
        unpublished tail cut); after it, fences without a cut: the adopted logs were
        synced before their renames, and a cut of the active segment would now cut an
        adopted file."""
        assert files
        now_us = self.clock.now_us()
        written_at_us = max(now_us, self._last_written_at_us)
        old = self._segments[-1]
        durable = self.config.fsync_policy is not FsyncPolicy.NEVER
        replaced = old.size_bytes == 0
        patched: list[list[tuple[int, FrameHeader]]] = []
        segments: list[LogSegment] = []
        try:
            offset = old.next_offset
            for number, (run, _) in enumerate(files):
                failpoints.hit("adopt.before_patch")
                if not number:
                    if replaced:
                        old.close()
                    else:
                        old.seal(durable=durable)
                fd = self.fs.open_write(run[0].path)
                try:
                    headers = staged_frames.patch_headers(
                        self.fs, fd, run, offset, written_at_us, transaction_id)
                    if len(files) > 1:  # the patched pages on their way while others patch
                        with contextlib.suppress(StorageIOError):  # the sync below tells
                            self.fs.start_writeback(fd, 0, headers[-1][0] + HEADER_BYTES)
                    else:
                        self.fs.sync(fd)
                finally:
                    self.fs.close(fd)
                patched.append(headers)
                offset = headers[-1][1].next_offset
            if len(files) > 1:
                failpoints.hit("adopt.before_sync")
                for run, _ in files:
                    fd = self.fs.open_write(run[0].path)
                    try:
                        self.fs.sync(fd)
                    finally:
                        self.fs.close(fd)
            for number, ((run, size), headers) in enumerate(zip(files, patched, strict=True)):
                failpoints.hit("adopt.before_rename")
                segment = LogSegment(self.fs, self.directory, headers[0][1].base_offset)
                self.fs.rename(run[0].path, segment.log_path)
                segments.append(segment)
                failpoints.hit("adopt.before_dir_sync")
                log_loader.adopt_segment(segment, headers, size)
                if number:
                    segments[-2].seal(durable=durable)
                if number < len(files) - 1:
                    self.fs.sync_directory(self.directory)
                else:
                    self.producers.write_snapshot(segment.base_offset, durable=durable)
                    if not durable:  # a durable snapshot synced the directory
                        self.fs.sync_directory(self.directory)
                failpoints.hit("adopt.before_visible")
        except BaseException as raised:  # an I/O error, or one nothing expected (MemoryError):
            error = raised if isinstance(raised, StorageIOError) else StorageIOError(
                f"an unexpected {type(raised).__name__} during an adoption: {raised}")
            if segments:  # files renamed into the partition that it does not list yet
                self._fenced = error  # no cut: see above
                self._forget_frame()
            else:
                self._fence(error)
            raise
        kept = self._segments[:-1] if replaced else self._segments
        self._segments = (*kept, *segments)
        last = segments[-1]
        self._adopted = (last, last.size_bytes, last.next_offset)
        self._last_written_at_us = written_at_us
        self._durable_end = max(self._durable_end, last.next_offset)

    def check_staged(self) -> None:
        """Raise what ``publish_staged`` would raise before writing anything: a topic that
        refuses raw and zstd messages, a closed or fenced partition (an inactive one is
        published by key, ``TopicLog.publish_staged``)."""
        self._check_staged_codecs()
        if self._closed or self._fenced is not None:
            self._check_writable()

    def _check_staged_codecs(self) -> None:
        """Staged frames hold raw or zstd messages (which ones was checked when they were
        staged: a topic ALTERed since takes them as they are)."""
        if int(Codec.RAW) not in self._codec_ids and int(Codec.ZSTD) not in self._codec_ids:
            raise UnsupportedCodecError("codecs raw and zstd are not supported by this topic")

    def _redirected(self, batches: list[pa.RecordBatch], transaction_id: int) -> list[AppendResult]:
        """Hand a transactional publish to ``redirect`` (this partition split); the
        results say nothing was written here."""
        assert self.redirect is not None
        self.redirect(batches, transaction_id)
        return [
            AppendResult(self.partition_id, np.full(b.num_rows, WRITTEN, np.uint8),
                         np.full(b.num_rows, -1, np.int64))
            for b in batches
        ]  # fmt: skip

    @property
    def write_lock(self) -> threading.Lock:
        """The lock every write holds (``writes_paused`` holds it as a context); a publish
        over many partitions (``storage.spread_publish``) takes theirs in ascending order."""
        return self._write_lock

    @contextlib.contextmanager
    def writes_paused(self) -> Iterator[None]:
        """Hold the write lock: no write is in flight while the caller runs (a split);
        the ledger's rows of this partition are copied in first."""
        with self._write_lock:
            self._settle_locked()
            yield

    # -- the topic's ledger (``storage.ledger_route``) -----------------------------------
    def settle(self) -> None:
        """Copy in the rows the topic's ledger holds past this log's end, if any (not
        synced here: the ledger keeps them durable until its copier syncs and releases)."""
        if self.ledger_unsettled:
            with self._write_lock:
                self._settle_locked()

    def settle_locked(self) -> None:
        """``settle`` for a caller holding the write lock (``storage.spread_publish``)."""
        assert self._write_lock.locked()
        self._settle_locked()

    def _settle_locked(self) -> None:
        # A fenced log takes no write: its ledger rows stay in the ledger (durable) until
        # the reopen copies them; readers see the log as the fence left it.
        if (self.ledger_unsettled and self.ledger_tail is not None and not self._closed
                and self._fenced is None):  # fmt: skip
            self.ledger_tail.copy_locked(self)

    def _check_copy_continues(self, base_offset: int) -> None:
        """``CorruptSegmentError`` unless the log ends at ``base_offset``: a copy from the
        ledger must continue the partition's offsets exactly (write lock held)."""
        end = self._segments[-1].next_offset
        if end != base_offset:
            raise CorruptSegmentError(
                f"partition {self.partition_id}: a copy from the ledger at offset "
                f"{base_offset}, but the log ends at {end}",
                path=self.directory, position=self._segments[-1].size_bytes,
            )  # fmt: skip

    def write_copied_locked(self, batch: pa.RecordBatch, base_offset: int,
                            written_at_us: int) -> None:  # fmt: skip
        """``append_copied`` for rows whose producer state is recorded already (at their
        ledger append) and with no sync (the ledger holds them durably until its copier
        syncs this log and releases them): one frame at exactly ``base_offset``, published.
        Caller holds the write lock (``storage.ledger_route``)."""
        assert self._write_lock.locked()
        if self._fenced is not None:
            raise self._fenced_error()
        self._check_copy_continues(base_offset)
        try:
            self._write_frame(batch, 0, None, written_at_us)
            failpoints.hit("partition.after_write")
        except BaseException as error:
            self.fence_if_unpublished(error)
            raise
        self._publish()

    def published_prefix(self, batch: pa.RecordBatch, transaction_id: int, since_us: int) -> int:
        """How many leading rows of ``batch``, the transaction's share of this partition, are
        published here already: a share cut into frames (``storage.frame_cuts``) may have
        lost its tail in a crash; one that stays one frame is there whole or not at all.

        Counts the transaction's rows still here as the leading ones, so it is exact only
        while none of its frames was deleted by retention: the caller keeps retention
        below such frames until the transaction's commit record is gone
        (``engine.retention``: a pass checkpoints first and deletes only below the end
        offsets as of that checkpoint)."""
        if not cuttable(batch):
            return batch.num_rows if self.contains_transaction(transaction_id, since_us) else 0
        return min(batch.num_rows, self.transaction_rows(transaction_id, since_us))

    def transaction_rows(self, transaction_id: int, since_us: int) -> int:
        """Messages in the frames of ``transaction_id`` written at or after ``since_us``."""
        return sum(
            header.record_count
            for header in self._frame_headers_since(since_us)
            if header.transaction_id == transaction_id
        )

    def contains_transaction(self, transaction_id: int, since_us: int) -> bool:
        """True if a frame of ``transaction_id`` was written at or after ``since_us``.

        Scans frame headers only, from the time index's position for
        ``since_us`` to the end.
        """
        return any(
            header.transaction_id == transaction_id
            for header in self._frame_headers_since(since_us)
        )

    def transaction_rows_since(self, since_us: int) -> dict[int, int]:
        """For every transaction with a frame written at or after ``since_us``, the messages
        of its frames there: ``contains_transaction`` and ``transaction_rows`` for many ids
        at the price of one scan of frame headers (recovery asks once per partition, not
        once per commit record)."""
        found: dict[int, int] = {}
        for header in self._frame_headers_since(since_us):
            if header.transaction_id:
                found[header.transaction_id] = found.get(header.transaction_id, 0) + (
                    header.record_count
                )
        return found

    def _frame_headers_since(self, since_us: int) -> Iterator[FrameHeader]:
        """The headers of the visible frames from the time index's position for
        ``since_us`` to the end (nothing if nothing was written since: the log file may
        not even exist). Reads headers in 1 MiB windows; bodies are not checked."""
        visible = self._visible
        start = self.offset_for_time(since_us)
        if start >= visible.end_offset:
            return
        index = _segment_index(visible.segments, start)
        while index is not None and index < len(visible.segments):
            segment = visible.segments[index]
            last = index == len(visible.segments) - 1
            limit = visible.last_segment_bytes if last else segment.size_bytes
            for frame in segment.scan(start, limit, 1024 * 1024):
                yield frame.header
            index += 1

    def sync(self, *, drop_below: int | None = None) -> None:
        """Make everything written so far durable (checkpoints of published data),
        including what publishes to this partition were redirected to (``redirect``).
        With ``drop_below`` (an offset every reader that matters is past: the engine's
        checkpoint passes its consumers' floor), synced bytes below it then leave the
        page cache (``storage.page_cache``: a hint, it never fails the sync).

        The ``fdatasync`` runs outside the write lock (``LogSegment.sync_published``):
        a checkpoint syncs every partition a transaction wrote, one after another, and a
        spread publish that takes every partition's lock in turn waited behind each of
        those syncs (a 1000-partition statement stalled ~0.8 s behind a checkpoint). A
        sync that fails fences the partition, as under the lock; until the fence, every
        other sync of that log fails too (``LogSegment._sync_log``), so no write is
        acknowledged as synced after the failure.

        A fence in that gap (a write that failed meanwhile) makes this sync raise
        ``PartitionFencedError`` even when its ``fdatasync`` succeeded: the fence's cut
        of the log may have been the sync the kernel reported a lost writeback to, so
        success here does not prove the bytes are on disk, and a checkpoint must set the
        partition's transactions aside (``engine.commit``) rather than delete their
        commit records."""
        with self._write_lock:
            if self._closed:
                return
            ticket = self._begin_sync_locked()
        if ticket is not None:
            try:
                ticket.segment.sync_published(ticket.held)
            except StorageIOError as error:
                self._raise_sync_failure(error)
            self._end_sync(ticket, drop_below)
        if self.sync_redirected is not None:
            self.sync_redirected()

    def begin_sync(self) -> SyncTicket | None:
        """``sync``'s first part, for a sync of many logs at once (``storage.log_sync``):
        the indexes flushed and the writer's descriptor held, as ``sync`` does under the
        write lock; None when the log is closed or has nothing open for writing. Raises
        ``PartitionFencedError`` when fenced (``StorageIOError`` when the flush fails: it
        fences). The caller must end a ticket with ``end_sync``, whatever happens (it lets
        the held descriptor go)."""
        with self._write_lock:
            if self._closed:
                return None
            return self._begin_sync_locked()

    def end_sync(self, ticket: SyncTicket, *, synced: bool) -> None:
        """End a ``begin_sync``: ``synced``, one sync of the whole file system covered the
        log since (``FileSystem.sync_file_system``: the log's own sync is not made, but an
        earlier failed one still refuses it, ``LogSegment.synced_together``); else the
        log's own sync is made now, as ``sync`` makes it. Then what the ticket covers is
        durable (``durable_end``), or the error is raised and the log fenced, as ``sync``;
        what publishes were redirected to is not synced here (``sync_redirected``)."""
        try:
            if synced:
                ticket.segment.synced_together(ticket.held)
            else:
                ticket.segment.sync_published(ticket.held)
        except StorageIOError as error:
            self._raise_sync_failure(error)
        self._end_sync(ticket, None)

    def _begin_sync_locked(self) -> SyncTicket | None:
        assert self._write_lock.locked()
        if self._fenced is not None:
            raise self._fenced_error()
        segment = self._segments[-1]
        covered = segment.next_offset  # everything written so far
        synced_bytes = segment.size_bytes  # what the sync covers
        try:
            held = segment.flush_for_sync()
        except StorageIOError as error:
            self._fence(error)
            raise
        if held is None:
            return None
        return SyncTicket(segment, held, covered, self._segments, synced_bytes)

    def _raise_sync_failure(self, error: StorageIOError) -> NoReturn:
        """A sync outside the write lock failed: fence (unless fenced in the gap, then
        that fence's error is raised) and raise."""
        with self._write_lock:
            if self._fenced is None and not self._closed:
                self._fence(error)
                raise error
            fenced = self._fenced
        if fenced is not None and fenced is not error:
            raise self._fenced_error() from error
        raise error

    def _end_sync(self, ticket: SyncTicket, drop_below: int | None) -> None:
        """What the ticket covers made durable (``durable_end``), unless fenced in the gap."""
        with self._write_lock:
            if self._fenced is not None:  # fenced in the gap (checked None at the start)
                raise self._fenced_error()
            self._durable_end = max(self._durable_end, ticket.covered)
        if page_cache.ENABLED and drop_below is not None:
            # a hint: it never fails the sync (review R2-F3 of round 13)
            with contextlib.suppress(StorageIOError, OSError):
                page_cache.drop_synced(ticket.segments, ticket.synced_bytes, drop_below)

    def drop_consumed(self, below_offset: int) -> None:
        """Drop from the page cache the durable log bytes below ``below_offset``, which
        every consumer of the topic committed past (the engine's checkpoint passes that
        floor for the partitions its transactions read), but the kept tail
        (``storage.page_cache``): a topic that is written and then consumed gives its
        read pages back, and later appends reuse them. Only bytes below
        ``durable_end`` (synced: a drop never loses a byte, whatever the page cache
        did) and written by this process (``dropped_to``). A hint: it never fails."""
        if not page_cache.ENABLED:
            return
        with self._write_lock:
            if self._closed or self._fenced is not None:
                return
            segments = self._segments
            written_bytes = segments[-1].size_bytes
            floor = min(below_offset, self._durable_end)  # durable bytes only
        with contextlib.suppress(StorageIOError, OSError):
            page_cache.drop_synced(segments, written_bytes, floor)

    def make_durable(self, *, drop_below: int | None = None) -> None:
        """``sync`` whatever an earlier process wrote too: after a reopen the active
        segment's log is not open for writing (nothing written since), so ``sync`` alone
        would sync nothing, and what a killed process wrote may still be in the page
        cache only. Such a log is synced through a descriptor of its own, closed at once
        (``LogSegment.sync_file``: no descriptor is kept per partition, R2-6), under the
        write lock (once per partition after an open); ``durable_end`` then covers the
        whole log. ``drop_below`` goes to ``sync`` (a log synced the other way drops
        nothing: bytes loaded at the open stay cached)."""
        with self._write_lock:
            if self._closed:
                return
            if self._fenced is not None:
                raise self._fenced_error()
            segment = self._segments[-1]
            transient = not segment.writing
            if transient:
                covered = segment.next_offset  # older segments were synced at their seal
                try:
                    if segment.size_bytes:
                        segment.sync_file()
                except StorageIOError as error:
                    self._fence(error)
                    raise
                self._durable_end = max(self._durable_end, covered)
        if not transient:
            self.sync(drop_below=drop_below)
        elif self.sync_redirected is not None:
            self.sync_redirected()

    def _flush_group(self, requests: list[Request]) -> None:
        """Group-commit leader: write every request, sync once, publish."""
        with self._writing():
            self._check_writable()
            if not self._write_coalesced(requests):
                for request in requests:
                    mark = self._write_mark()
                    try:
                        request.result = self._write_locked(request.payload)
                    except StorageIOError:
                        raise
                    except Exception as error:
                        if self._write_mark() != mark:
                            raise  # it wrote part of itself: fail-stop (``_writing``)
                        request.error = error  # a bad request fails alone
            self._sync_locked()
            self._publish()

    def _write_coalesced(self, requests: list[Request]) -> bool:
        """Write many single-batch requests as one frame (the group-append buffer).

        Small concurrent appends cost one dedup pass, one frame and one write
        together instead of one each. Returns False (nothing written) when the
        requests do not fit one batch or dedup refuses the combination, so the
        caller falls back to writing them one by one and a bad one fails alone.
        """
        if len(requests) < 2 or any(len(r.payload) != 1 for r in requests):
            return False
        batches = [r.payload[0] for r in requests]
        if sum(b.num_rows for b in batches) > limits.BATCH_MESSAGES_MAX:
            return False
        combined = pa.concat_batches(batches)
        try:
            decision = self.producers.decide(combined)
        except InvalidParameterValueError:
            return False
        result = self._write_decision(decision)
        start = 0
        for request, batch in zip(requests, batches, strict=True):
            end = start + batch.num_rows
            request.result = [
                AppendResult(self.partition_id, result.status[start:end], result.offsets[start:end])
            ]
            start = end
        return True

    def _check_writable(self) -> None:
        if self._closed:
            raise StorageIOError(f"partition {self.partition_id} is closed")
        if self._fenced is not None:
            raise PartitionFencedError(
                f"partition {self.partition_id} refuses writes after an I/O failure "
                f"({self._fenced}); reopen the store to recover",
            )
        if not self.active:
            raise PartitionInactiveError(
                f"partition {self.partition_id} is inactive (read-only after a split)"
            )

    def _check_codecs(self, batch: pa.RecordBatch) -> None:
        column = batch.column(4)
        if column.null_count:
            raise UnsupportedCodecError("every message needs a codec (the codec column has nulls)")
        count = len(column)
        uniform = uniform_codec(column)  # the usual batch: one codec for every message
        if uniform is not None:
            used = {uniform}
        elif count <= SMALL_BATCH_ROWS:
            used = set(column.to_pylist())
        else:
            codec_ids = np.frombuffer(column.buffers()[1], np.uint8, count, column.offset)
            first = int(codec_ids[0])
            used = {first} if (codec_ids == first).all() else set(np.unique(codec_ids).tolist())
        if used <= self._codec_ids:
            return
        for value in sorted(used):
            try:
                codec = Codec(value)
            except ValueError:
                raise UnsupportedCodecError(f"unknown codec id {value}") from None
            if codec not in self.config.supported_codecs:
                accepted = ",".join(sorted(c.label for c in self.config.supported_codecs))
                raise UnsupportedCodecError(
                    f"codec {codec.label} is not supported by this topic (accepted: {accepted})"
                )

    def _write_locked(self, batches: list[pa.RecordBatch]) -> list[AppendResult]:
        """Dedup, frame and write ``batches`` at the log end. Caller holds the lock."""
        results = []
        for batch in batches:
            decision = self.producers.decide(batch)
            results.append(self._write_decision(decision))
        return results

    def _write_decision(
        self, decision: DedupDecision, transaction_id: int = 0, body: pa.Buffer | None = None
    ) -> AppendResult:
        batch = decision.batch
        count = batch.num_rows
        written_count = count - decision.duplicate_count
        if written_count == 0:
            status = np.full(count, DUPLICATE, dtype=np.uint8)
            return AppendResult(self.partition_id, status, decision.earlier_offsets)
        if written_count < count:
            batch = batch.filter(pa.array(~decision.duplicate))
            body = None  # encoded for the whole batch
        base_offset, written_at_us = self._write_frame(batch, transaction_id, body)
        failpoints.hit("partition.after_write")
        if written_count == count:
            self.producers.record_decision(decision, base_offset, written_at_us)
            status = np.zeros(count, dtype=np.uint8)  # WRITTEN
            offsets = np.arange(base_offset, base_offset + count, dtype=np.int64)
            return AppendResult(self.partition_id, status, offsets)
        self.producers.record(batch, base_offset, written_at_us)
        status = decision.duplicate.astype(np.uint8)  # DUPLICATE == 1, WRITTEN == 0
        offsets = decision.earlier_offsets
        offsets[~decision.duplicate] = np.arange(base_offset, base_offset + written_count)
        return AppendResult(self.partition_id, status, offsets)

    def _write_frame(
        self,
        batch: pa.RecordBatch,
        transaction_id: int,
        body: pa.Buffer | None,
        written_at_us: int | None = None,
    ) -> tuple[int, int]:
        """Write ``batch`` (decided: no duplicate in it) as one frame at the log end, not
        yet published; returns its base offset and written-at time (``written_at_us``, or
        now, never below the last frame's). Caller holds the lock. An I/O error fences
        the partition and is raised."""
        now_us = self.clock.now_us()
        segment = self._segment_for_append(now_us)
        base_offset = segment.next_offset
        written_at_us = max(now_us if written_at_us is None else written_at_us,
                            self._last_written_at_us)  # fmt: skip
        try:
            if body is not None:  # an encoded body framed as it is (a spread publish)
                written = segment.append_body(body, batch.num_rows, written_at_us, transaction_id)
                assert written == base_offset, (written, base_offset)
            else:  # header, IPC metadata and the batch's own buffers (no copy)
                parts, header = self._frame_encoder.encode(
                    batch, base_offset=base_offset, written_at_us=written_at_us,
                    transaction_id=transaction_id,
                )  # fmt: skip
                segment.append_frame_parts(parts, header)
        except StorageIOError as error:
            self._fence(error)
            raise
        self._last_written_at_us = written_at_us
        floor = self.drop_floor
        if floor is not None and page_cache.ENABLED:
            # a hint: it never fails the write (as the synced drop never fails a sync)
            with contextlib.suppress(StorageIOError, OSError):
                page_cache.drop_behind(self._segments, floor)
        return base_offset, written_at_us

    # -- rows copied from the topic's ledger (``storage.ledger_copy``) ------------------
    def append_copied(self, batch: pa.RecordBatch, base_offset: int, written_at_us: int) -> None:
        """Append ``batch``, rows the topic's ledger holds at offsets ``base_offset`` on,
        as one frame at exactly those offsets, and sync it whatever the fsync policy (the
        ledger may delete its copy once this returns). No dedup: the rows were committed
        by the ledger's frame; their producer state is recorded here, so later appends to
        this partition are checked against their seq_nos. The frame's written-at time is
        ``written_at_us`` (the caller passes the latest of its rows' ledger times: a
        lookup by time then never skips one of them), never below the last frame's.

        Raises ``CorruptSegmentError`` (nothing written) when the log does not end at
        ``base_offset``: the copy must continue the partition's offsets exactly."""
        check_wire_batch(batch)
        with self._writing():
            self._check_writable()
            self._check_copy_continues(base_offset)
            base, written_at = self._write_frame(batch, 0, None, written_at_us)
            failpoints.hit("partition.after_write")
            self.producers.record(batch, base, written_at)
            try:
                if self._segments[-1].sync():
                    self._durable_end = self._segments[-1].next_offset
            except StorageIOError as error:
                self._fence(error)
                raise
            self._publish()

    # -- one share of a publish over many partitions (``storage.spread_publish``) --------
    def publishable_locked(self) -> bool:
        """Whether a transactional publish may write here now (caller holds the lock,
        ``writes_paused``): open, not fenced, active."""
        assert self._write_lock.locked()
        return not self._closed and self._fenced is None and self.active

    def write_share_locked(
        self,
        batch: pa.RecordBatch,
        transaction_id: int,
        body: pa.Buffer | None,
        decision: SpreadDecision,
        index: int,
    ) -> int:
        """Write a decided share (``producer_state.decide_shares``: no duplicate) as one
        frame tagged with ``transaction_id``, record its producer state (share ``index``
        of ``decision``: ``record_share``), then publish it; returns the base offset.
        Caller holds the lock (``writes_paused``) and checked ``publishable_locked``.
        ``body``: the batch's encoded body, if at hand. Readers waiting for data are not woken here:
        the caller calls ``notify_readers`` once it has published its shares."""
        assert self._write_lock.locked() and transaction_id > 0
        base_offset, written_at_us = self._write_frame(batch, transaction_id, body)
        failpoints.hit("partition.after_write")
        record_share(self.producers, decision, index, base_offset, written_at_us)
        segment = self._segments[-1]  # ``_publish`` without a wake-up
        self._set_visible(Visible(segment.next_offset, self._segments, segment.size_bytes))
        return base_offset

    def notify_readers(self) -> None:
        """Wake the readers waiting for data (``data_ready``, the topic's: once for many
        partitions' publishes)."""
        with self.data_ready:
            self.data_ready.notify_all()

    def _segment_for_append(self, now_us: int) -> LogSegment:
        """The active segment, rolled first if it is full or too old."""
        segment = self._segments[-1]
        if segment.size_bytes == 0:
            return segment
        if segment.size_bytes >= self.config.segment_bytes:
            return self._roll_locked()
        first = segment.first_written_at_us
        if first is not None and now_us - first >= self.config.segment_ms * 1000:
            return self._roll_locked()
        return segment

    def _roll_locked(self) -> LogSegment:
        old = self._segments[-1]
        durable = self.config.fsync_policy is not FsyncPolicy.NEVER
        segment = LogSegment(self.fs, self.directory, old.next_offset)
        try:
            old.seal(durable=durable)
            failpoints.hit("segment.roll_after_seal")
            # Create the new (empty) log file before the snapshot's directory sync:
            # once retention deletes every older segment, its name is what tells a
            # reopen where the log ends.
            segment.create_file()
            failpoints.hit("segment.roll_before_snapshot")
            self.producers.write_snapshot(old.next_offset, durable=durable)
        except StorageIOError as error:
            self._fence(error)
            raise
        self._segments = (*self._segments, segment)
        return segment

    def roll(self) -> None:
        """Start a new segment now (tests and retention use it)."""
        with self._write_lock:
            if self._segments[-1].size_bytes:
                self._roll_locked()
                self._publish()

    def sync_locked(self) -> None:
        """Sync what this process wrote (the fsync policy permitting; ``durable_end``
        tells what is synced). Caller holds the write lock (``storage.ledger_route``)."""
        assert self._write_lock.locked()
        if self._fenced is not None:
            raise self._fenced_error()
        self._sync_locked()

    def _sync_locked(self) -> None:
        if self.config.fsync_policy is FsyncPolicy.NEVER:
            return
        try:
            synced = self._segments[-1].sync()
        except StorageIOError as error:
            self._fence(error)
            raise
        if synced:  # not a log left unopened since the open: that sync synced nothing
            self._durable_end = self._segments[-1].next_offset  # older ones synced at seal

    def _fenced_error(self) -> PartitionFencedError:
        """The error a sync of this fenced partition raises."""
        return PartitionFencedError(
            f"partition {self.partition_id} cannot be synced after an I/O failure "
            f"({self._fenced}); reopen the store to recover"
        )

    def _fence(self, error: StorageIOError) -> None:
        """Refuse writes until reopen, and cut everything not acknowledged from the files.

        The page cache may still hold the failed pages (a reopen would read them
        back as if they were on disk) while the disk never gets them: cut the
        log back to the published end, so no reopen trusts them.
        """
        self._fenced = error
        self._forget_frame()
        visible = self._visible
        adopted = self._adopted
        try:
            if adopted is not None and adopted[0] in self._segments:
                # Not yet published, but durable up to the end of the last adoption (the
                # segments before it synced at its roll, it synced before its rename): a
                # cut below would lose the adopted file, whose staged copy is gone.
                segment, size, end = adopted
                for later in self._segments[self._segments.index(segment) + 1 :]:
                    later.truncate_to(0, later.base_offset)
                segment.truncate_to(size, end)
                return
            for segment in self._segments[len(visible.segments) :]:
                segment.truncate_to(0, segment.base_offset)
            last = visible.segments[-1]
            last.truncate_to(visible.last_segment_bytes, visible.end_offset)
        except StorageIOError as cut_error:
            log.error("could not cut the unacknowledged tail: %s", cut_error)

    def fence_if_unpublished(self, error: BaseException) -> None:
        """A write failed with ``error`` that no handler of its own expected (a
        ``MemoryError`` under the process memory cap, say) while the caller holds the
        write lock: if it left bytes written past the published end (a frame, or part of
        one, whose producer state may not be recorded, whose caller is told it failed),
        fence the partition (``_fence`` cuts them; writes are refused until reopen,
        whose recovery decides from the logs). Left in place they would be published by
        the next write's publish, and a retry of the failed publish would write them a
        second time. Nothing written past the published end: nothing to undo (a dedup
        decision changes no state; the producer state is recorded after the write)."""
        assert self._write_lock.locked()
        if self._fenced is not None or self._closed or not self._unpublished_bytes():
            return
        log.error("partition %s fenced: %s left a write unpublished: %s",
                  self.partition_id, type(error).__name__, error)  # fmt: skip
        self._fence(StorageIOError(
            f"an unexpected {type(error).__name__} left a write unpublished: {error}"))

    def fence_for(self, error: BaseException) -> None:
        """Fence the partition for a caller's unexpected ``error`` past a commit point of
        its own (a split saved, its memory not caught up): writes refused until reopen,
        whose recovery reads the committed state. Caller holds the write lock."""
        assert self._write_lock.locked()
        if self._fenced is not None or self._closed:
            return
        log.error("partition %s fenced: %s", self.partition_id, error)
        self._fence(StorageIOError(f"an unexpected {type(error).__name__}: {error}"))

    def _unpublished_bytes(self) -> bool:
        """Whether the log holds bytes past its published end (caller holds the lock)."""
        visible = self._visible
        return (self._adopted is not None
                or len(self._segments) != len(visible.segments)
                or self._segments[-1].size_bytes != visible.last_segment_bytes)  # fmt: skip

    def _write_mark(self) -> tuple[int, int]:
        """Where the log ends now (segments, bytes of the last): a write moved it if the
        mark differs afterwards (caller holds the lock)."""
        return len(self._segments), self._segments[-1].size_bytes

    @contextlib.contextmanager
    def _writing(self) -> Iterator[None]:
        """The write lock, held for a write that ends in ``_publish``: any exception
        escaping it goes through ``fence_if_unpublished`` (fail-stop for what a write
        left half done; an ``StorageIOError`` of a write has fenced already)."""
        with self._write_lock:
            try:
                self._settle_locked()
                yield
            except BaseException as error:
                self.fence_if_unpublished(error)
                raise

    def _forget_frame(self) -> None:
        """Drop the frame kept for the next read (its segment may be going away)."""
        if self._frame_cache is not None:
            self._frame_cache.discard(self)

    def _set_visible(self, visible: Visible) -> None:
        """What readers see from now on; the topic's start table follows (the one place
        ``_visible`` is set, so the table never differs from ``start_offset`` but for a
        reader between the two stores, which sees the start before this publish: the same
        as a reader just before it)."""
        self._visible = visible
        table = self.start_table
        if table is not None:
            table[self.partition_id] = visible.segments[0].base_offset

    def _publish(self, *, notify: bool = True) -> None:
        self._adopted = None
        segment = self._segments[-1]
        self._set_visible(Visible(segment.next_offset, self._segments, segment.size_bytes))
        if notify:
            with self.data_ready:
                self.data_ready.notify_all()

    # -- reads -------------------------------------------------------------------------
    def read(
        self,
        start_offset: int,
        *,
        max_messages: int = 1000,
        max_bytes: int = 8 * 1024 * 1024,
    ) -> ReadResult:
        """Read from ``start_offset`` (clamped to the log start) into read batches.

        Stops after ``max_messages`` messages or once ``max_bytes`` of frames were
        read (always at least one batch, as Kafka does); batches are sliced so
        that the first starts at ``start_offset`` and the total respects
        ``max_messages``.
        """
        found = self.read_frames(start_offset, max_messages=max_messages, max_bytes=max_bytes)
        # Consecutive small frames are decoded together: one batch for the run.
        batches = decode_slices(found.slices) if found.slices else []
        return ReadResult(batches, found.next_offset, found.start_offset, found.end_offset)

    def read_frames(
        self,
        start_offset: int,
        *,
        max_messages: int = 1000,
        max_bytes: int = 8 * 1024 * 1024,
        settle: bool = True,
    ) -> FrameRead:
        """``read``, left undecoded: the frame slices it would decode (``storage.frame_read``),
        so that a reader of many partitions decodes them all at once.

        ``settle=False``: settle only when the read may need a row past this log's own end
        (``start_offset + max_messages`` past ``own_end``); a read wholly below it takes the
        rows from the segments as they are, and its ``end_offset`` is then the own end, not
        the ledger's. A settle copies the ledger's rows of the partition in the reader's
        thread: a consumer catching up over 1000 partitions paid 0.6-0.8 s for them in one
        read (docs/scale.md round 38)."""
        _check_read_limits(max_messages, max_bytes)
        if self.ledger_unsettled and (
                settle or start_offset + max_messages > self._visible.end_offset):  # fmt: skip
            self.settle()
        for _ in range(3):  # retention may delete a segment under us: retry
            visible = self._visible
            try:
                found = self._scan_visible(visible, start_offset, max_messages, max_bytes)
            except FileNotFoundError:
                continue
            if self._fenced is not None and self.reads_across:
                return self._read_fenced_tail(found, max_messages, max_bytes)
            return found
        raise StorageIOError(f"partition {self.partition_id}: segments vanished during a read")

    def _read_fenced_tail(self, found: FrameRead, max_messages: int, max_bytes: int) -> FrameRead:
        """``found`` (a read of this fenced log's own segments) continued into the rows the
        topic's ledger holds past them, within what is left of the budgets. A fenced log
        does not settle (it takes no write), yet those rows were acknowledged: the ledger
        synced them, and no copier pass releases a row of a fenced log past its own end
        (the copy to it is refused; a release stops at what the log holds synced), so they
        stay in the ledger until the reopen copies them; a read gives them from there
        (``reader_end`` counts them). The slices are the ledger frames' (one per share)."""
        tail = self.ledger_tail
        own = self._visible.end_offset
        if tail is None or found.next_offset < own:
            return found  # stopped inside the log by a budget (or no ledger)
        messages = max_messages - found.message_count
        budget = max_bytes - found.size
        low = found.next_offset
        ledger_end = tail.end_of(self.partition_id)
        high = min(ledger_end, low + messages)
        if messages <= 0 or budget <= 0 or high <= low:
            return found
        spans = tail.spans_many({self.partition_id: (low, high)})
        if spans is None:  # (not expected: see above) the log's own rows only
            return found
        slices = list(found.slices)
        offset = low
        for body_index, first, row, rows in zip(spans.frames.tolist(), spans.firsts.tolist(),
                                                spans.rows.tolist(), spans.counts.tolist(),
                                                strict=True):  # fmt: skip
            assert first == offset, (first, offset)  # a partition's rows, in offset order
            body = spans.bodies[body_index]
            count = int(spans.frame_rows[body_index])
            header = FrameHeader(0, first - row, int(spans.written_ats[body_index]), count,
                                 body.size, 0)  # fmt: skip
            piece = FrameSlice(header, body, row, rows, None, unpacked_bytes(body, messages=True))
            slices.append(piece)
            offset += rows
            budget -= piece.size
            if budget <= 0:
                break
        return FrameRead(slices, offset, found.start_offset, max(found.end_offset, ledger_end))

    def frame_window(
        self, start_offset: int, count: int, window_max: int, *, settle: bool = True
    ) -> tuple[LogSegment, int, int] | None:
        """Where a read of ``count`` messages from ``start_offset`` finds its frames: the
        segment and the byte range ``[from, to)`` of it holding them (from the indexed
        frame at or before ``start_offset`` to the first indexed frame starting at or past
        ``start_offset + count``, or the published end of the segment), for a read of many
        partitions into one buffer (``storage.bulk_scan``). (To the segment's end, a
        consumer catching up over 1000 partitions asked ~10x the bytes it read and went
        over the read's budget, docs/scale.md round 38.) None when the
        messages are not all published in one segment, start below the log start, or
        the range is over ``window_max`` bytes (``read_frames`` handles those).
        ``settle=False``: the log's own frames only, the ledger's rows left where they
        are (a read across, ``storage.bulk_scan``: the messages must lie below
        ``own_end``)."""
        if settle and self.ledger_unsettled:
            self.settle()
        visible = self._visible
        segments = visible.segments
        if count <= 0 or start_offset < segments[0].base_offset:
            return None
        index = _segment_index(segments, start_offset)
        assert index is not None
        segment = segments[index]
        last = index == len(segments) - 1
        if start_offset + count > (visible.end_offset if last else segment.next_offset):
            return None
        limit = visible.last_segment_bytes if last else segment.size_bytes
        index_file = segment.offset_index
        position = index_file.lookup(start_offset) if start_offset > segment.base_offset else 0
        # An indexed frame starts there, so the frames before it hold every offset asked.
        # Only below ``limit``: an entry may name a frame not published yet (appended,
        # not yet visible) or one a fence's cut removed (``LogSegment.truncate_to``).
        past = index_file.ceiling_value_of_key(start_offset + count - segment.base_offset)
        if past is not None and position < past < limit:
            limit = past
        if limit - position > window_max:
            return None
        return segment, position, limit

    def _scan_visible(
        self, visible: Visible, start_offset: int, max_messages: int, max_bytes: int
    ) -> FrameRead:
        log_start = visible.segments[0].base_offset
        offset = max(start_offset, log_start)
        slices: list[FrameSlice] = []
        remaining, budget = max_messages, max_bytes
        index = _segment_index(visible.segments, offset)
        kept = self._frame_cache.get(self) if self._frame_cache is not None else None
        while offset < visible.end_offset and remaining > 0 and budget > 0 and index is not None:
            segment = visible.segments[index]
            last = index == len(visible.segments) - 1
            limit = visible.last_segment_bytes if last else segment.size_bytes
            position = None
            if kept is not None and kept.holds(segment, offset):
                # The large frame the last read stopped inside: no pread, check or decode.
                header = kept.header
                skip = offset - header.base_offset
                rows = min(header.record_count - skip, remaining)
                unpacked = segment.unpacked_at(kept.position, header.frame_bytes, kept.body)
                slices.append(FrameSlice(header, kept.body, skip, rows, kept, unpacked))
                offset += rows
                remaining -= rows
                budget -= header.frame_bytes + unpacked
                if remaining <= 0 or budget <= 0:
                    break
                position = kept.position + header.frame_bytes  # the scan goes on from there
            window = _window_bytes(segment, offset, remaining, budget)
            # Published bytes never change again (a fence cuts only unpublished ones):
            # they are read through the segment's map, the active segment's map made
            # as large as the segment will grow (a full segment's frames may run a
            # little past ``segment_bytes``: it is mapped again, twice as large).
            frames = segment.scan(
                offset,
                limit,
                window,
                position=position,
                mapped=True,
                map_bytes=self.config.segment_bytes if last else limit,
            )
            for frame in frames if position is None or position < limit else ():
                header = frame.header
                skip = offset - header.base_offset
                assert 0 <= skip < header.record_count, (offset, header.base_offset)
                rows = min(header.record_count - skip, remaining)
                cached = None
                if rows < header.record_count - skip and header.record_count > SMALL_FRAME_ROWS:
                    # Stopped inside a large frame: the next read starts there.
                    cached = self._keep(segment, frame)
                # A frame whose data column is compressed whole, or of zstd messages, is
                # charged what it decodes to (a stored frame of ~1 KB may hold 16 MiB).
                unpacked = segment.unpacked_at(frame.position, header.frame_bytes, frame.body)
                slices.append(FrameSlice(header, frame.body, skip, rows, cached, unpacked))
                offset += rows
                remaining -= rows
                budget -= header.frame_bytes + unpacked
                if remaining <= 0 or budget <= 0:
                    break
            if remaining <= 0 or budget <= 0:
                break  # stopped inside this segment: ``offset`` is where to resume
            index = index + 1 if index + 1 < len(visible.segments) else None
            if index is not None:
                offset = max(offset, visible.segments[index].base_offset)
        return FrameRead(slices, offset, log_start, visible.end_offset)

    def _keep(self, segment: LogSegment, frame: Frame) -> CachedFrame | None:
        """Keep ``frame`` (large, a read stopped inside it) for the next read."""
        if self._frame_cache is None:
            return None
        body = frame.body
        parent = body.parent
        # Keep only this frame, not the whole read window it came in (a view of the
        # segment's map holds no heap memory: kept as it is).
        if not frame.mapped and parent is not None and parent.size > 2 * frame.header.frame_bytes:
            body = pa.py_buffer(body.to_pybytes())
        cached = CachedFrame(segment, frame.position, frame.header, body, mapped=frame.mapped)
        self._frame_cache.put(self, cached)
        return cached

    def offset_for_time(self, written_at_us: int) -> int:
        """The first offset whose ``written_at`` is at or after the given time (or the end)."""
        if self.ledger_unsettled:
            self.settle()
        visible = self._visible
        for index, segment in enumerate(visible.segments):
            last = index == len(visible.segments) - 1
            if segment.last_written_at_us is None or segment.last_written_at_us < written_at_us:
                continue
            start = segment.time_index.lookup(written_at_us)
            limit = visible.last_segment_bytes if last else segment.size_bytes
            for frame in segment.scan(start, limit, 64 * 1024):
                if frame.header.written_at_us >= written_at_us:
                    return frame.header.base_offset
        return visible.end_offset

    def wait_for_data(self, offset: int, timeout_s: float) -> bool:
        """Block until the end offset passes ``offset`` or the timeout ends; no polling."""
        if timeout_s * 1000 > limits.WAIT_MS_MAX:
            raise LimitExceededError(f"wait of {timeout_s}s exceeds {limits.WAIT_MS_MAX} ms")
        deadline = self.clock.monotonic_s() + timeout_s
        while True:
            # the ledger's rows copied in outside ``data_ready`` (a write holds its lock,
            # then takes ``data_ready`` to publish)
            self.settle()
            with self.data_ready:
                if self._visible.end_offset > offset:
                    return True
                if self.ledger_unsettled:
                    if self._fenced is None:  # a ledger append since the settle: again
                        continue
                    # fenced: no settle and no more ledger appends; its ledger rows are
                    # read from the ledger (``reader_end``), and that end moves no more
                    if self.reader_end > offset:
                        return True
                remaining = deadline - self.clock.monotonic_s()
                if remaining <= 0 or self._closed:
                    return False
                self.data_ready.wait(remaining)

    # -- retention and lifecycle ------------------------------------------------------------
    def roll_expired(self, horizon_us: int) -> bool:
        """Seal the active segment if every message in it was written before ``horizon_us``.

        Kafka's rule for idle partitions: retention deletes only sealed segments,
        and only an append rolls one, so without this the expired data of a topic
        that stopped receiving writes would live forever. The new empty active
        segment starts at the end offset; once the old one is deleted, its file
        name is what tells a reopen where the log starts, so the directory is
        synced here whatever the fsync policy (``_roll_locked`` syncs it only when
        the policy is durable). Returns True if it rolled. A fenced or closed
        partition never rolls: its files are not to be trusted with more writes.
        """
        with self._write_lock:
            if self._closed or self._fenced is not None:
                return False
            segment = self._segments[-1]
            last = segment.last_written_at_us
            if segment.size_bytes == 0 or last is None or last >= horizon_us:
                return False
            failpoints.hit("retention.before_roll")
            self._roll_locked()
            if self.config.fsync_policy is FsyncPolicy.NEVER:
                try:
                    self.fs.sync_directory(self.directory)
                except StorageIOError as error:
                    self._fence(error)
                    raise
            self._publish()
        failpoints.hit("retention.after_roll")
        return True

    def delete_segments_before(self, offset: int) -> int:
        """Delete whole sealed segments whose messages all lie below ``offset``."""
        with self._write_lock:
            doomed = [s for s in self._segments[:-1] if s.next_offset <= offset]
            if not doomed:
                return 0
            self._segments = self._segments[len(doomed) :]
            self._publish()
            self._forget_frame()
            # The new log start must survive a crash (it never moves back): rename the
            # doomed log files, oldest first, and sync the directory before any removal.
            # A crash among the renames leaves a renamed prefix, so a start in between.
            for segment in doomed:
                segment.mark_deleted()
            self.fs.sync_directory(self.directory)
        failpoints.hit("retention.before_delete")
        for segment in doomed:
            segment.delete_files()
        return len(doomed)

    def close(self) -> None:
        """Flush, snapshot producers (a clean shutdown) and release files."""
        with self._write_lock:
            if self._closed:
                return
            self._closed = True
            self._forget_frame()
            if self._fenced is None:
                durable = self.config.fsync_policy is not FsyncPolicy.NEVER
                self._segments[-1].sync() if durable else None
                self.producers.write_snapshot(self._segments[-1].next_offset, durable=durable)
            for segment in self._segments:
                segment.close()
        with self.data_ready:
            self.data_ready.notify_all()

    def delete(self) -> None:
        self.close()
        self.fs.remove_tree(self.directory)

    def _restore_producers(self) -> None:
        """Load the newest producer snapshot and replay the log after it."""
        end = self._visible.end_offset
        replay_from = max(self.producers.load_snapshot(end), self.start_offset)
        offset = replay_from
        run = _ReplayRun()
        for segment in self._visible.segments:
            if segment.next_offset <= offset:
                continue
            limit = segment.size_bytes
            for frame in segment.scan(offset, limit, 4 * 1024 * 1024, skip_corrupt=True):
                if run.add(frame.header, frame.body):
                    self.producers.apply_read_batch(run.take())
        if run.rows:
            self.producers.apply_read_batch(run.take())
        self.producers.expire()


class _ReplayRun:
    """The frames of one producer-state replay call, reduced to what the replay reads.

    Frames are replayed in runs, one ``apply_read_batch`` each (it keeps per key the
    largest seq_no, offset and time, so a run gives what its frames one by one would):
    ~1.5 ms per call, and a partition written by statements spread over 1000
    partitions holds one frame of a few messages per statement.

    Invariants: a run holds no frame's body, only a copy of its ``REPLAY_COLUMNS``
    (so the read windows are released as the scan moves on, and the messages' data is
    never copied); it ends at ``REPLAY_RUN_ROWS`` messages or ``REPLAY_RUN_BYTES`` of
    kept columns, whichever comes first (so its memory is bounded whatever the
    messages' sizes, and no joined column can pass Arrow's 2 GiB offset limit).
    """

    __slots__ = ("_bases", "_batches", "_counts", "_written_ats", "nbytes", "rows")

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._batches: list[pa.RecordBatch] = []
        self._bases: list[int] = []
        self._counts: list[int] = []
        self._written_ats: list[int] = []
        self.rows = 0
        self.nbytes = 0

    def add(self, header: FrameHeader, body: pa.Buffer) -> bool:
        """Keep a copy of the frame's replayed columns; True when the run is full."""
        wire = pa.ipc.read_record_batch(body, WIRE_SCHEMA)
        assert wire.num_rows == header.record_count, (wire.num_rows, header.record_count)
        kept = pa.concat_batches([wire.select(REPLAY_COLUMNS)])  # a copy: ``body`` goes
        self._batches.append(kept)
        self._bases.append(header.base_offset)
        self._counts.append(header.record_count)
        self._written_ats.append(header.written_at_us)
        self.rows += header.record_count
        self.nbytes += kept.nbytes
        return self.rows >= REPLAY_RUN_ROWS or self.nbytes >= REPLAY_RUN_BYTES

    def take(self) -> pa.RecordBatch:
        """The run as one batch of the columns ``apply_read_batch`` reads; empties it."""
        assert self.rows > 0
        counts = np.array(self._counts, dtype=np.int64)
        starts = np.cumsum(counts) - counts  # each frame's first row in the run
        bases = np.array(self._bases, dtype=np.int64)
        offsets = np.repeat(bases - starts, counts) + np.arange(self.rows, dtype=np.int64)
        written_at = np.repeat(np.array(self._written_ats, dtype=np.int64), counts)
        kept = pa.concat_batches(self._batches)
        batch = pa.RecordBatch.from_arrays(
            [*kept.columns, pa.array(offsets), pa.array(written_at)],
            names=[*REPLAY_COLUMNS, "offset", "written_at"],
        )
        self._reset()
        return batch


def _adoption_groups(frames: list[StagedFrame], adoptable: Callable[[list[StagedFrame]], int]
                     ) -> Iterator[tuple[bool, list[tuple[list[StagedFrame], int]]]]:  # fmt: skip
    """A share's frames in order as (adoptable, files): each run of consecutive frames of
    one file with its size (``adoptable(run)``: the own file's size, or 0 to copy it);
    consecutive adoptable files together (``PartitionLog._adopt_locked`` adopts them at
    once), every other file alone."""
    group: list[tuple[list[StagedFrame], int]] = []
    for _, grouped in itertools.groupby(frames, key=lambda frame: frame.path):
        run = list(grouped)
        size = adoptable(run)
        if size:
            group.append((run, size))
            continue
        if group:
            yield True, group
            group = []
        yield False, [(run, 0)]
    if group:
        yield True, group


def _joined(
    written: list[tuple[int, AppendResult]], count: int, partition: int
) -> list[AppendResult]:
    """One result per published batch from its frames' results (in row order)."""
    parts: list[list[AppendResult]] = [[] for _ in range(count)]
    for index, result in written:
        parts[index].append(result)
    return [
        found[0] if len(found) == 1 else AppendResult(
            partition,
            np.concatenate([r.status for r in found]),
            np.concatenate([r.offsets for r in found]),
        )
        for found in parts
    ]  # fmt: skip


def _segment_index(segments: tuple[LogSegment, ...], offset: int) -> int | None:
    """Index of the segment holding ``offset`` (bases are sorted)."""
    # bisect, not numpy: a read of a partition of a few segments pays ~1 us, not ~10
    position = bisect.bisect_right(segments, offset, key=lambda s: s.base_offset) - 1
    return None if position < 0 else position


def _check_read_limits(max_messages: int, max_bytes: int) -> None:
    if not 0 < max_messages <= limits.READ_MESSAGES_MAX:
        raise LimitExceededError(f"max_messages must be between 1 and {limits.READ_MESSAGES_MAX}")
    if not 0 < max_bytes <= limits.READ_BYTES_MAX:
        raise LimitExceededError(f"max_bytes must be between 1 and {limits.READ_BYTES_MAX}")


def _window_bytes(segment: LogSegment, offset: int, remaining: int, budget: int) -> int:
    """Bytes worth reading at once for ``remaining`` messages from ``offset``.

    The offset index gives the start of the frame holding ``offset + remaining``,
    so the window covers the wanted frames, not the whole byte budget (8 MiB by
    default: reading 1000 messages of 1 KiB pread 8 MiB). A short estimate only
    costs another ``pread``: the scan reads on.
    """
    end = offset + remaining
    if end >= segment.next_offset:
        return budget
    start = segment.offset_index.lookup(offset) if offset > segment.base_offset else 0
    return max(1, min(budget, segment.offset_index.lookup(end) - start))
