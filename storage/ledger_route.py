"""A topic's ledger wired to its partition logs: appends, settles and the copier (issue 14).

``TopicLedger`` owns a topic's ``storage.ledger.Ledger`` (``<topic>/ledger/``) when the
store's ledger switch is on (``storage.config.ledger_enabled``), and sits between it and
the topic's ``PartitionLog``s (docs/scale.md, "Round 28 (H1)"):

- ``append_shares``: a statement's small shares, one to each of many partitions, written
  as ONE ledger frame. Under every share's partition write lock (ascending ids, as
  ``storage.spread_publish``): each log must be publishable; a log with nothing uncopied
  in the ledger gives the ledger its end (``Ledger.advance``: writes that did not go
  through the ledger moved it); producer dedup is decided for all shares against the
  logs' producer state (``producer_state.decide_shares``; anything unusual, a duplicate
  among them, returns None before anything is written: the caller goes the usual way);
  the frame is appended and synced (the commit point); then each share's producer state
  is recorded with its ledger offsets and the log is marked ``ledger_unsettled``. A
  failed ledger append fences every log of the statement (its frame may be on disk:
  nothing may take those offsets before a reopen settles the ledger).
- ``copy_locked`` (a log's ``_settle_locked``, write lock held): the ledger's rows of
  the partition past the log's end written into the log as frames at the same offsets,
  cut only at share edges, published, NOT synced and NOT released: the ledger keeps
  them durable. Every write to the log and every read of its end settles first, so the
  log's offsets have one writer at a time and readers see every acknowledged row.
- The copier thread: once enough is pending (``limits.LEDGER_COPY_FRAMES_MIN`` frames,
  or ``limits.LEDGER_COPY_WAIT_S`` after the oldest), settles every pending partition
  from ONE ``Ledger.read_many`` (grouped by partition, ``ledger_copy.grouped_pieces``;
  no partition lock held while reading), writing under each partition's lock only what
  is still past its log's end then (a settle meanwhile is neither repeated nor jumped),
  syncs the logs that have unsynced rows (one ``syncfs`` of their file system for them
  all where it is offered, else each one's ``PartitionLog.sync``: ``storage.log_sync``),
  releases up to what is synced (``Ledger.skip_copied``: only at share edges, under
  the lock, from the current start) and drops the ledger files nothing needs. Its CPU
  time is counted (``copier_cpu_s``).
- Open: the logs recovered first give their ends; the ledger recovers with them; then
  everything it holds is copied with ``storage.ledger_copy.copy_ledger`` (synced,
  producer state recorded by ``append_copied``), so producer state after a crash is
  whole before any append, and staging recovery (after the store opens) meets logs
  that hold every committed ledger row.

Lock order: a partition's write lock, then the ledger's internal lock (a leaf); the
ledger append holds several partition locks (ascending) and never a ``data_ready``.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import pyarrow as pa

from storage import limits
from storage.config import ledger_shares_min
from storage.errors import (
    CorruptSegmentError,
    PartitionFencedError,
    QueryCanceledError,
    StorageIOError,
)
from storage.fs import FileSystem
from storage.ledger import Ledger, LedgerSpans
from storage.ledger_copy import Piece, copy_ledger, grouped_pieces
from storage.log_sync import FileSystemSync
from storage.partition_log import PartitionLog
from storage.producer_state import SEQ_NO_COLUMN, decide_shares, record_shares
from storage.record_batch import WIRE_SCHEMA

_WIRE_FIELDS = tuple(WIRE_SCHEMA.names)
DIRECTORY = "ledger"  # under the topic's directory
logger = logging.getLogger(__name__)

# The topic's readers' next offsets (one mapping partition -> offset a reader, 0 where a
# partition is absent), or None for no reader: the engine's consumers, asked by the
# copier (``TopicLedger.drop_kept_files``) from its own thread. Storage knows no consumer.
Readers = Callable[[], Sequence[Mapping[int, int]] | None]


def open_topic_ledger(fs: FileSystem, topic_directory: str, logs: dict[int, PartitionLog],
                      on: bool, removed: frozenset[int] = frozenset(),
                      readers: Readers | None = None) -> TopicLedger | None:  # fmt: skip
    """The topic's ledger, opened after its partitions: with the switch ``on``, a
    ``TopicLedger`` (copier running); off, None, after copying into the logs whatever a
    ledger left by an earlier run holds (its rows were acknowledged), so that turning the
    switch off never loses a row. ``removed``: partition ids the topic handed out and no
    longer lists (``Ledger``); ``readers``: see ``TopicLedger``."""
    directory = os.path.join(topic_directory, DIRECTORY)
    if on:
        return TopicLedger(fs, directory, logs, removed=removed, readers=readers)
    if DIRECTORY in fs.list_directory(topic_directory):
        left = TopicLedger(fs, directory, logs, copier=False,  # copies everything at open
                           removed=removed)  # fmt: skip
        left.ledger.drop_copied_files()
        left.close()
        for log in logs.values():
            log.ledger_tail = None
    return None


class TopicLedger:
    def __init__(self, fs: FileSystem, directory: str, logs: dict[int, PartitionLog], *,
                 copier: bool = True, removed: frozenset[int] = frozenset(),
                 readers: Readers | None = None) -> None:  # fmt: skip
        """Open (recover) the ledger in ``directory`` over ``logs`` (the topic's
        partitions, recovered: their ends are the ledger's ``partition_ends``; the dict is
        the topic's own, so partitions added later are seen) and copy everything it holds
        into them. ``copier``: run the background copier thread (started at the first
        frame appended: a topic that never spreads a statement has none). ``readers``:
        asked, when the copied files are past their byte budget, for each reader's next
        offsets (``drop_kept_files``); None, or a call answering None, keeps no more."""
        self._readers = readers
        # A statement spread over fewer partitions goes the usual way (``engine.
        # spread_append``): ``limits.LEDGER_SHARES_MIN`` or the test lane's override.
        self.shares_min = ledger_shares_min()
        self._logs = logs
        # the topic's clock (its logs'), which its ledger frames are stamped by
        self._clock = next(iter(logs.values())).clock if logs else None
        ends = {p: log.own_end for p, log in logs.items()}
        self.ledger = Ledger(fs, directory, partition_ends=ends, removed=removed,
                             file_bytes_max=limits.LEDGER_FILE_BYTES_MAX)  # fmt: skip
        try:
            while copy_ledger(self.ledger, logs).messages:
                pass
        except BaseException:
            self.ledger.close()
            raise
        for log in logs.values():
            self.attach(log)
        # the copier's syncs of its logs, one of the file system a pass (``storage.log_sync``):
        # its handle opened before the first ledger frame (``_file_system_sync``)
        self._fs = fs
        self._topic_directory = os.path.dirname(directory)
        self._syncs: FileSystemSync | None = None
        self.copier_cpu_s = 0.0  # CPU time of the copier thread (tests, the bench)
        self.copies = 0  # copier passes that copied something
        self.copier_passes = 0  # the copier thread's passes (tests: it sleeps when idle)
        self.copier_error: BaseException | None = None
        self._wake = threading.Condition()
        self._stopping = False
        self._oldest_pending: float | None = None
        self._frames_since = 0  # ledger frames appended since the copier's last pass
        self._thread: threading.Thread | None = None
        self._copier_wanted = copier

    def attach(self, log: PartitionLog) -> None:
        """Make ``log`` settle from this ledger (a partition opened or added)."""
        log.ledger_tail = self

    def end_of(self, partition: int) -> int:
        """The ledger's end of ``partition`` (a log's ``reader_end``)."""
        return self.ledger.end_offset(partition)

    def spans_many(self, wanted: Mapping[int, tuple[int, int]]) -> LedgerSpans | None:
        """``Ledger.spans_many``: a read across (``storage.bulk_scan``)."""
        return self.ledger.spans_many(wanted)

    # -- appends -------------------------------------------------------------------------
    def append_shares(self, logs: Sequence[PartitionLog], batches: Sequence[pa.RecordBatch],
                      table: pa.Table | None, written_at_us: int,
                      cancelled: Callable[[], bool] | None = None,
                      counts: np.ndarray | None = None) -> list[int] | None:  # fmt: skip
        """Write ``batches[i]`` to ``logs[i]``'s partition (distinct, ascending ids) as one
        ledger frame; returns each share's base offset once durable, or None (nothing
        written) when the usual case does not hold (see the module doc). ``cancelled``:
        asked once every lock is held, just before the frame's round (the commit point):
        True refuses the statement with ``QueryCanceledError``, nothing written (the wait
        for the partitions' locks is where a statement may spend its time here).
        ``counts``: the batches' row counts, if known; with ``table`` (all batches' rows,
        in order) no batch is read (``topic_log.Shares.pieces`` makes each when read)."""
        assert len(logs) == len(batches) and len(logs) > 0
        if counts is None:
            counts = np.fromiter((batch.num_rows for batch in batches), np.int64, len(batches))
        if self._syncs is None:
            self._file_system_sync()  # before any row it is to cover is written
        taken: list[PartitionLog] = []
        bases: list[int] | None = None
        try:
            for log in logs:
                log.write_lock.acquire()
                taken.append(log)
            if not all(log.publishable_locked() for log in logs):
                return None
            if not all(self._follow_locked(log) for log in logs):
                return None
            decision = decide_shares([log.producers for log in logs], batches, table, counts)
            if decision is None:
                return None
            if cancelled is not None and cancelled():
                raise QueryCanceledError("canceling statement due to user request")
            partitions = np.fromiter((log.partition_id for log in logs), np.int64, len(logs))
            whole = _whole(batches, table, decision.seq_nos, counts)
            try:
                bases = self.ledger.append_whole(partitions, counts, whole,
                                                 written_at_us=written_at_us)  # fmt: skip
            except BaseException as error:
                if isinstance(error, (StorageIOError, OSError)):
                    for log in logs:  # the frame may be on disk: nobody takes its offsets
                        log.fence_for(error)
                raise
            for log in logs:  # the frame holds their rows past their ends from here on
                log.ledger_unsettled = True
            record_shares([log.producers for log in logs], decision, bases, written_at_us)
        finally:
            for log in taken:
                log.write_lock.release()
            if bases is not None:
                self._wake_readers(logs)
        self._note_pending()
        return bases

    def _follow_locked(self, log: PartitionLog) -> bool:
        """Make the ledger's next share of ``log``'s partition start at the log's end
        (a write that did not go through the ledger may have moved it); False when it
        cannot now (copied rows not synced under the topic's policy): the statement then
        goes the usual way. Caller holds the log's write lock."""
        if log.ledger_unsettled:
            return True  # the log ends inside the ledger's offsets: nothing moved it
        partition = log.partition_id
        own, end = log.own_end, self.ledger.end_offset(partition)
        if own <= end:
            return True
        if self.ledger.start_offset(partition) < end:  # copied in, not yet released
            log.sync_locked()
            if log.durable_end < end:
                return False
            self.ledger.skip_copied(partition, end)
        self.ledger.advance(partition, own)
        return True

    @staticmethod
    def _wake_readers(logs: Sequence[PartitionLog]) -> None:
        for log in {id(log.data_ready): log for log in logs}.values():
            log.notify_readers()

    # -- the copy into a log (its settle) ------------------------------------------------
    def copy_locked(self, log: PartitionLog) -> None:
        """The ledger's rows of ``log`` past its end, written into it at their offsets
        (frames cut at share edges, at most ``limits.LEDGER_COPY_PIECE_BYTES`` and
        ``limits.BATCH_MESSAGES_MAX`` each), published, not synced. Caller holds the
        log's write lock."""
        partition = log.partition_id
        own = log.own_end
        end = self.ledger.end_offset(partition)
        if own < end:
            start = self.ledger.start_offset(partition)
            if own < start:
                raise CorruptSegmentError(
                    f"partition {partition}: its log ends at {own}, below the ledger's "
                    f"copied start {start}", path=log.directory, position=0)  # fmt: skip
            rows = self.ledger.read(partition, own, end - own)
            at = own
            for cut in self._cuts(partition, own, end, rows):
                piece = rows.slice(at - own, cut - at)
                written = int(piece.column("written_at").cast(pa.int64()).to_numpy().max())
                log.write_copied_locked(piece.select(_WIRE_FIELDS), at, written)
                at = cut
        log.ledger_unsettled = False

    def _cuts(self, partition: int, own: int, end: int, rows: pa.RecordBatch) -> list[int]:
        """Where the copy's frames end: the last share edge before a frame would pass
        the limits (a share is small: one always fits), and ``end``."""
        if (rows.num_rows <= limits.BATCH_MESSAGES_MAX
                and rows.get_total_buffer_size() <= limits.LEDGER_COPY_PIECE_BYTES):  # fmt: skip
            return [end]
        data = rows.column("data")
        ends = np.frombuffer(data.buffers()[1], np.int32, len(data) + 1, 4 * data.offset)
        sizes = np.concatenate(([0], np.cumsum(np.diff(ends).astype(np.int64))))
        cuts: list[int] = []
        low = previous = own
        for edge in self.ledger.share_edges(partition, own, end):
            if (edge - low > limits.BATCH_MESSAGES_MAX // 2
                    or sizes[edge - own] - sizes[low - own] > limits.LEDGER_COPY_PIECE_BYTES // 2
                    ) and previous > low:  # fmt: skip
                cuts.append(previous)
                low = previous
            previous = edge
        cuts.append(end)
        return cuts

    # -- the background copier -----------------------------------------------------------
    def _note_pending(self, frames: int = 1) -> None:
        with self._wake:
            self._frames_since += frames
            if self._oldest_pending is None:
                self._oldest_pending = time.monotonic()
            if self._thread is None and self._copier_wanted and not self._stopping:
                self._thread = threading.Thread(target=self._copier, name="ledger-copier",
                                                daemon=True)  # fmt: skip
                self._thread.start()
            self._wake.notify()

    def _due(self) -> bool:
        if self._oldest_pending is None:
            return False
        if time.monotonic() - self._oldest_pending >= limits.LEDGER_COPY_WAIT_S:
            return True
        return self._frames_since >= limits.LEDGER_COPY_FRAMES_MIN

    def _copier(self) -> None:
        while True:
            with self._wake:
                while not self._stopping and not self._due():
                    # nothing pending: asleep until an append (``_note_pending``) wakes it
                    idle = self._oldest_pending is None
                    self._wake.wait(None if idle else limits.LEDGER_COPY_WAIT_S / 4)
                if self._stopping:
                    return
                self._oldest_pending = None
                self._frames_since = 0
            began = time.thread_time()
            self.copier_passes += 1
            try:
                self.copy_all()
            except Exception as error:  # a fenced log, say: retried at the next pass; the
                self.copier_error = error  # rows stay in the ledger, readers settle them
            finally:
                self.copier_cpu_s += time.thread_time() - began
            if any(self._copyable(p) for p in self.ledger.pending()):
                self._note_pending(0)  # (a fenced or removed partition's rows wait for
                # the reopen: not a pass a second for them, only for a new frame)

    def _copyable(self, partition: int) -> bool:
        """Whether a pass may copy ``partition``'s pending rows: its log is here and not
        fenced (a fenced log takes no copy until the reopen)."""
        log = self._logs.get(partition)
        return log is not None and not log.fenced

    def _now_us(self) -> int:
        """Now, by the topic's clock (the one ``append_shares``' callers stamp its frames by)."""
        return self._clock.now_us() if self._clock is not None else time.time_ns() // 1000

    def drop_kept_files(
        self, now_us: int, retention_ms: int | None = None, retention_bytes: int | None = None
    ) -> int:
        """Delete the copied ledger files the copier no longer keeps for whole-frame
        reads: past ``limits.LEDGER_KEEP_COPIED_BYTES`` (newest kept first), or past the
        topic's ``retention_bytes`` times its partitions when that is less (a kept copy
        never takes more disk than the partitions may hold), or whose last frame is older
        than ``limits.LEDGER_KEEP_COPIED_S``, or than the topic's ``retention_ms`` (a
        kept copy never outlives the partitions' retention of its rows by more than a
        pass). The retention pass gives the topic's settings; the copier's pass takes
        them from its partitions' (``_kept_files_limits``). Returns how many files went."""
        horizon = now_us - int(limits.LEDGER_KEEP_COPIED_S * 1_000_000)
        if retention_ms is not None:
            horizon = max(horizon, now_us - retention_ms * 1000)
        keep_bytes = limits.LEDGER_KEEP_COPIED_BYTES
        keep_unread_bytes = limits.LEDGER_KEEP_UNREAD_BYTES
        if retention_bytes is not None:
            most = retention_bytes * max(1, len(self._logs))
            keep_bytes, keep_unread_bytes = min(keep_bytes, most), min(keep_unread_bytes, most)
        unread = None  # the readers are asked only when the budget would drop a file
        if self._readers is not None and self.ledger.copied_file_bytes() > keep_bytes:
            unread = self._unread_now()
        return self.ledger.drop_copied_files(keep_bytes, horizon, unread=unread,
                                             keep_unread_bytes=keep_unread_bytes)  # fmt: skip

    def _unread_now(self) -> Mapping[int, int] | None:
        """The readers' lowest next offsets now (``lowest_offsets``), or None (no readers,
        or their lookup failed: the kept files then keep to their byte budget, never
        more; the failure is logged). Taken with no lock held."""
        assert self._readers is not None
        try:
            readers = self._readers()
        except Exception:  # (a hint for keeping files: never a reason to keep them all)
            logger.exception("ledger: looking up the readers' offsets failed")
            return None
        return None if not readers else lowest_offsets(readers)

    def _kept_files_limits(self) -> tuple[int | None, int | None]:
        """The topic's ``retention_ms`` and ``retention_bytes``, as its partitions have
        them (every partition's config is the topic's); none without partitions."""
        log = next(iter(list(self._logs.values())), None)
        if log is None:
            return None, None
        return log.config.retention_ms, log.config.retention_bytes

    def copy_all(self) -> int:
        """Settle every partition with uncopied ledger rows, sync its log, release what
        is synced and drop the ledger files no longer needed; returns the messages
        released. (The copier's pass; tests and close call it too.)

        The rows come from ``Ledger.read_many`` (one read for all partitions, or a few
        of ``limits.LEDGER_COPY_MESSAGES_MAX``), read with no partition lock held, grouped
        by partition (``ledger_copy.grouped_pieces``); each partition's are then written
        under its lock from its own end at that moment (``_write_piece_locked``), so a
        settle by a reader or writer in between is neither written twice nor jumped.
        The logs are then synced together (``storage.log_sync``: one ``syncfs`` of their
        file system where it is offered). A fenced partition, or one whose sync failed,
        is passed over (its rows stay in the ledger until the reopen); its error is
        raised once the others are done."""
        pending = self.ledger.pending()
        if not pending:
            return 0
        syncs = self._file_system_sync()  # (open before the settle's writes it covers)
        failed: dict[int, BaseException] = {}
        self._settle_from_ledger(pending, failed)
        # (a removed partition is passed over: left, see docs/scale.md round 28)
        here = [(p, log) for p in sorted(pending)
                if (log := self._logs.get(p)) is not None and p not in failed]  # fmt: skip
        unsynced = [log for p, log in here
                    if log.durable_end < min(log.own_end, self.ledger.end_offset(p))]  # fmt: skip
        if unsynced:  # one sync of them all, mostly
            failed.update(syncs.sync_logs(unsynced))
        released = 0
        for partition, log in here:
            if partition in failed:
                continue
            try:
                released += self._sync_and_release(partition, log)
            except PartitionFencedError as error:
                failed[partition] = error
        if released:
            self.copies += 1
            self.drop_kept_files(self._now_us(), *self._kept_files_limits())
        if failed:
            raise failed[min(failed)]
        return released

    def settle_all(self) -> None:
        """Write into the partitions' logs every row the ledger holds past their ends: a
        copier's pass without its syncs and releases (the rows stay in the ledger, which
        keeps them durable, until a pass syncs the logs). A fenced partition is passed
        over; its error is raised once the others are written."""
        failed: dict[int, BaseException] = {}
        self._settle_from_ledger(self.ledger.pending(), failed)
        if failed:
            raise failed[min(failed)]

    def _settle_from_ledger(self, pending: Mapping[int, tuple[int, int]],
                            failed: dict[int, BaseException]) -> None:  # fmt: skip
        """Write into the logs the ledger rows ``pending`` names past their ends (no lock
        held while reading the ledger)."""
        ends = {p: end for p, (_, end) in pending.items()}
        while True:
            starts: dict[int, int] = {}
            for partition, (start, _) in pending.items():
                log = self._logs.get(partition)
                if log is None or partition in failed:
                    continue
                own = log.own_end  # a hint: the write below checks it under the lock
                if own < ends[partition]:  # (own < start is damage: the write raises)
                    starts[partition] = max(own, start)
            if not starts:
                return
            limit = limits.LEDGER_COPY_MESSAGES_MAX
            table, partitions = self.ledger.read_many(starts, limit, whole_frames=True)
            if not len(partitions):
                return
            for piece in grouped_pieces(table, partitions, dict(starts), self._logs):
                if piece.partition in failed:
                    continue
                log = self._logs.get(piece.partition)
                if log is None:
                    continue  # removed since (its rows were copied first)
                try:
                    with log.write_lock:
                        self._write_piece_locked(log, piece)
                except PartitionFencedError as error:
                    failed[piece.partition] = error
            if len(partitions) < limit:
                return  # everything pending read; else read on from the new ends

    def _write_piece_locked(self, log: PartitionLog, piece: Piece) -> None:
        """Write what of ``piece`` is still past ``log``'s end (a reader or writer may
        have settled some or all of it since the read), at its offsets; clear
        ``ledger_unsettled`` when the log then ends at the ledger's end. Caller holds the
        log's write lock."""
        own = log.own_end
        if own >= piece.end:
            return  # settled meanwhile
        if own < piece.base:
            start = self.ledger.start_offset(piece.partition)
            raise CorruptSegmentError(
                f"partition {piece.partition}: its log ends at {own}, below the rows read "
                f"from the ledger at {piece.base} (ledger start {start})",
                path=log.directory, position=0)  # fmt: skip
        rows = piece.rows.slice(own - piece.base) if own > piece.base else piece.rows
        log.write_copied_locked(rows, own, piece.written_at_us)
        if log.own_end >= self.ledger.end_offset(piece.partition):
            log.ledger_unsettled = False

    def _file_system_sync(self) -> FileSystemSync:
        """The copier's handle for syncing its logs together, opened at the first need:
        ``append_shares`` asks before its first frame, so before any row the handle is to
        cover reaches a log (a topic that never spreads a statement holds none)."""
        with self._wake:
            if self._syncs is None:
                self._syncs = FileSystemSync(self._fs, self._topic_directory)
            return self._syncs

    def _sync_and_release(self, partition: int, log: PartitionLog) -> int:
        """Sync ``log`` (unless what the ledger holds of it is synced already) and release
        in the ledger what is synced, under the log's lock with the current start (only
        at share edges: ``Ledger.skip_copied``); returns the messages released."""
        end = self.ledger.end_offset(partition)
        if log.durable_end < min(log.own_end, end):
            log.sync()
        if self.ledger.start_offset(partition) >= min(log.durable_end, end):
            return 0  # a hint: nothing to release (another release may be past)
        with log.write_lock:  # every release of a partition under its lock
            start = self.ledger.start_offset(partition)  # another release may be past
            copied = min(log.durable_end, self.ledger.end_offset(partition))
            if copied > start:
                self.ledger.skip_copied(partition, copied)
                return copied - start
        return 0

    def close(self) -> None:
        """Stop the copier (its pass in progress ends first) and close the ledger; what
        it holds uncopied is copied at the next open."""
        with self._wake:
            self._stopping = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join()
        if self._syncs is not None:
            self._syncs.close()
        self.ledger.close()


def lowest_offsets(readers: Sequence[Mapping[int, int]]) -> Mapping[int, int]:
    """Each partition's lowest next offset over ``readers`` (a partition absent from a
    reader counts 0 for it, and is left out, meaning 0, when absent from them all)."""
    assert readers
    if len(readers) == 1:
        return readers[0]
    partitions = set().union(*readers)
    return {p: min(reader.get(p, 0) for reader in readers) for p in partitions}


def _whole(batches: Sequence[pa.RecordBatch], table: pa.Table | None,
           seq_nos: np.ndarray | None, counts: np.ndarray) -> pa.RecordBatch:  # fmt: skip
    """A statement's shares as written, as one batch (the frame's body): ``batches`` one
    after another (``table``, if the caller made it, is theirs; ``counts``, their row
    counts), their seq_nos those the decision numbered (``SpreadDecision.seq_nos``, in
    the same order), or as given (None). No batch is made a share
    (``SpreadDecision.batch``: ~8 us each, 1000 a statement)."""
    if table is None:
        table = pa.Table.from_batches(batches)
    whole = table.combine_chunks().to_batches()[0]
    assert whole.num_rows == int(counts.sum())
    if seq_nos is None:
        return whole
    assert len(seq_nos) == whole.num_rows
    field = whole.schema.field(SEQ_NO_COLUMN)
    return whole.set_column(SEQ_NO_COLUMN, field, pa.array(seq_nos, pa.int64()))


def attach_all(ledger: TopicLedger | None, logs: Mapping[int, PartitionLog]) -> None:
    """``attach`` every log (after partitions were added), if there is a ledger."""
    if ledger is not None:
        for log in logs.values():
            ledger.attach(log)
