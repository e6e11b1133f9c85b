"""The atomic commit of a transaction across topics, offsets and tables.

Two kinds of commit (docs/DESIGN.md §5, YDB's "stage, then publish"); the session
picks one (``Transaction.touches_tables``, set conservatively per statement):

**Topic-only** (no statement may have changed a table: topic->topic moves, consumer
reads with topic writes, offset commits) — ``commit_in_log``; no DuckDB statement
before the commit point:

1. *append*: the transaction's batches, routed to their partitions and encoded
   outside any lock, and after them a checksummed *commit record*
   (``storage.commit_log``: transaction id, commit time, its consumer offset moves,
   the partitions of the batches just before it) go to the staging log in ONE
   ``pwritev``, under the commit lock, right after validation and the claim of the
   offsets moved, in the same critical section as the turn taken: the log's order
   of records is the validation order and the publish order. A share that is the
   ``data`` of topic ranges the transaction read (a move) is not staged: the record
   names the ranges, which are durable and pinned against retention until the
   checkpoint, and recovery derives the share from them (``engine.moved_refs``).
2. *commit point*: the staging syncer's fdatasync covering the record returns (fsync
   1, shared by every append made meanwhile: group commit; the only fsync of the
   commit path). A failed (or interrupted) sync leaves the record on disk or not:
   the commit is reported in doubt and the committer refuses every later commit
   until the database is reopened, when recovery decides it.

**Table-touching** — ``stage``, ``write_record``, ``enter``, DuckDB COMMIT:

1. *stage*: the topic writes are appended to the staging log; the syncer
   fdatasyncs them (fsync 1, shared) while the session writes the record row
   below, and the session waits for that sync before step 2's COMMIT.
2. *commit point*: one DuckDB transaction holds the session's table changes and one
   record row (id, time, its consumer offset moves, where its staged batches lie),
   and commits (fsync 2: DuckDB's WAL). The offset ranges read are validated (and
   claimed) under the commit lock just before the COMMIT.

Both kinds then:

3. *publish*: each partition gets the transaction's batches as one frame tagged
   with the transaction id, without a sync, in turn (commit) order; readers see
   it whole.
4. *checkpoint* (in a background thread once ``CHECKPOINT_TRANSACTIONS`` commits
   are published, and at DDL and close): sync the partitions published to, then in
   one DuckDB transaction write the current committed offsets of every consumer
   moved into the offsets table, delete the record rows of those transactions and
   move the commit log's *watermark* (``commit_log_watermark``: the end of the last
   checkpointed commit record) past their commit records; then release their
   staging (files no transaction needs are deleted: that releases the log).
   Between checkpoints the records are the durable home of offset moves. Nothing
   depends on a checkpoint having run: a record stops counting only after the data
   it describes is synced in its partitions and its offsets are in the table.
   A partition fenced by an I/O failure cannot be synced until reopen: the
   checkpoint stops before the first transaction that published to it and keeps that
   one and every later one (records, staging) for the next open's recovery.

Recovery (``recover``) reads the record rows and the commit records past the
watermark (a torn or corrupt record, necessarily at the unsynced tail of a file, is
"not committed"; ``storage.commit_log.scan``), merges them by transaction id,
replays their offset moves in that order over the offsets table and re-publishes,
for every one, the batches whose tagged frame is not in its partition: idempotent,
so a crash during recovery is harmless. Staging that no record needs is deleted; new
staging files are numbered past the watermark's. Ids order conflicting reads as
commits did: a transaction that read offsets another moved took its id (at COMMIT)
after that one's commit. Two concurrent transactions that move one consumer
partition by ``COMMIT OFFSETS`` alone, without reading it, are not ordered so:
recovery may replay them in the other order (a known limit).

Concurrency (``engine.commit_order``): validation and the claim of the
offsets a transaction moves (and, topic-only, the append of its record) happen
under ``database.commit_lock``; the sync wait, the DuckDB COMMIT, the mirror
update and the publish happen outside it, so sessions commit concurrently (and
their syncs are shared), while claims keep validation exact and publish turns
keep each partition in commit order. Locks are taken in this order:
``database.commit_lock``, the commit order's lock, the staging log's lock,
``_checkpoint_lock``, ``_lock`` (this object's lists, held briefly). A checkpoint takes the commit
lock only to finish failed publishes, and never while it holds
``_checkpoint_lock``; no session waits for a checkpoint while it is in a slot.
Why a checkpoint may run beside commits: it reads the catalog's mirror of
committed offsets (only ever moved after a commit point, forward) and deletes
(or passes with the watermark) only records of transactions counted before its
snapshot, which are counted in turn order, the log's order for commit records;
a transaction that depends on another (the same consumer partition, or rows it
saw) took a later turn, so no record left behind holds an
offset older than one the checkpoint writes. A checkpoint waits while a failed
publish is unfinished, for the same reason.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import gc
import itertools
import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from engine import moved_refs, staged_refs, tables
from engine.catalog import SCHEMA
from engine.commit_order import CommitOrder, CommitSlot
from engine.deltas import Delta, DeltaApplier, Reservation
from storage import commit_log, failpoints, limits
from storage.errors import (
    LimitExceededError,
    PartitionFencedError,
    PartitionInactiveError,
    StorageIOError,
    TopicbaseError,
    UndefinedTopicError,
)
from storage.frame_cuts import cuttable
from storage.record_batch import check_wire_batch, data_bytes
from storage.staged_frames import StagedFrame, skip_rows
from storage.staging import StagedBatch, StagingLog, StagingTicket, encode_batches
from storage.topic_log import TopicAppendResult

log = logging.getLogger(__name__)

CHECKPOINT_TRANSACTIONS = 256
# Past this many published-but-not-checkpointed transactions (the background
# checkpoint fell behind), a committing session runs the checkpoint itself.
CHECKPOINT_BACKLOG_FACTOR = 4
# A checkpoint is also due once log commits staged this many bytes since the last one:
# it is what releases their staging (autocommit writes spread over 1000 partitions
# stage ~5 MB each, so 256 of them held ~1.3 GB).
CHECKPOINT_STAGED_BYTES = 256 * 1024 * 1024
# Published frames are searched from this long before the commit time, in
# case the wall clock stepped back a little between commit and publish.
CLOCK_SLACK_US = 60 * 1_000_000
# ``_consumed_floor`` of a topic no consumer reads: every offset may leave the page cache.
EVERY_OFFSET = 2**63 - 1
# Shares staged as frames published at once by a commit (``Committer._publish_framed``).
FRAMED_PUBLISH_THREADS = 4
# The commit record's payload encoder: compact JSON, the bytes ``json.dumps(payload,
# separators=(",", ":"))`` gives. Made once: ``json.dumps`` with any argument builds a
# ``JSONEncoder`` per call (~5-8 us of a ~15 us encode of a move's record). ``encode``
# keeps no state between calls, so the one encoder serves every thread.
RECORD_JSON = json.JSONEncoder(separators=(",", ":"))

RECORDS_DDL = f"""
CREATE TABLE IF NOT EXISTS {SCHEMA}.transactions (
    transaction_id BIGINT NOT NULL, committed_at_us BIGINT NOT NULL, items VARCHAR NOT NULL,
    offsets VARCHAR NOT NULL);
"""
# No primary key: ids are unique by construction (``next_transaction_id``), and an
# index costs ~0.3 ms per commit (DuckDB 2.0, this machine); a checkpoint's delete
# scans at most a few hundred rows. Tables created by earlier versions keep theirs.
RECORD_INSERT = f"INSERT INTO {SCHEMA}.transactions VALUES (?, ?, ?, ?)"
# The commit log's checkpoint watermark: every commit record in the staging log up to
# (file_number, position) has its offsets in the offsets table (one row at most).
WATERMARK_DDL = f"""
CREATE TABLE IF NOT EXISTS {SCHEMA}.commit_log_watermark (
    file_number BIGINT NOT NULL, position BIGINT NOT NULL);
"""
LogPosition = tuple[int, int]  # (staging file number, position just past a commit record)
# A published transaction, counted for the checkpoint: id, the partitions it published
# to, and for a transaction committed in the log, where its commit record ends.
Published = tuple[int, list[tuple[str, int]], LogPosition | None]


@dataclass(frozen=True, slots=True)
class PublishItem:
    """One partition's share of a transaction: a batch and where it is staged; ``body``
    is the batch encoded as its staging frame holds it (``serialize_body_buffer``),
    which the publish reuses for the partition's frame (the same body bytes)."""

    topic_id: str
    partition: int
    batch: pa.RecordBatch | None  # None for a share of ``frames``
    staged: StagedBatch | None = None
    body: pa.Buffer | None = None
    # The share is committed by reference (``engine.staged_refs``): not staged; the
    # record names these references, from which recovery derives the same batch.
    references: tuple[staged_refs.Reference, ...] | None = None
    # The share was staged as frames (``storage.staged_frames``; its references name
    # their files): published by copying them, in order, and derived again by recovery.
    frames: tuple[StagedFrame, ...] | None = None
    # The share is ``moved_refs.moved_batch`` of these ranges' data: a topic-only commit
    # may name them in its record instead of staging a copy (``engine.moved_refs``).
    moved: moved_refs.MovedSource | None = None


def route_writes(database, writes) -> list[PublishItem]:
    """Split pending writes by target partition; one batch per partition, in write order.

    Every target is active when routing ends, so a transaction never has two shares
    that land in one partition: a partition split later sends its share to children
    that did not exist when the others were routed, and the publish's per-partition
    "holds this transaction already" check (``TopicLog._publish_to_lineage``, recovery)
    stays exact. A split during routing routes again; an explicit ``partition`` that
    is inactive is refused (55000), as an autocommit write to it is.
    """
    while True:
        items = _route_once(database, writes)
        if all(
            database.topic_log(item.topic_id).partition_info(item.partition).active
            for item in items
        ):
            break
    for item in items:
        _check_publishable(database, item)
    return items


def _route_once(database, writes) -> list[PublishItem]:
    grouped: dict[tuple[str, int], list[pa.RecordBatch]] = {}
    # The references of each share's writes by reference (each gives the share one batch):
    # a share is committed by reference when every batch of it came from one.
    references: dict[tuple[str, int], list[staged_refs.Reference]] = {}
    framed: dict[tuple[str, int], list] = {}  # shares staged as frames: their writes
    moved: dict[tuple[str, int], list] = {}  # each share's batches' sources (None: not moved)
    for write in writes:
        if getattr(write, "frames", None) is not None:
            _check_partition(database, write.topic_id, write.partition)
            framed.setdefault((write.topic_id, write.partition), []).append(write)
            continue
        reference = getattr(write, "reference", None)
        if reference is not None:
            assert write.partition is not None, "a write by reference names its partition"
            references.setdefault((write.topic_id, write.partition), []).append(reference)
        topic = database.topic_log(write.topic_id)
        if write.partition is not None:
            _check_partition(database, write.topic_id, write.partition)
            grouped.setdefault((write.topic_id, write.partition), []).append(write.batch)
            continue
        targets = None
        first = topic.keyless_target(write.batch)  # a keyless share: one partition
        if first is None:
            targets = topic.route(write.batch)
            first = targets[0]
        if targets is None or (targets == first).all():
            # the usual case: one partition, no copy
            grouped.setdefault((write.topic_id, int(first)), []).append(write.batch)
            moved.setdefault((write.topic_id, int(first)), []).append(
                getattr(write, "moved", None))
            continue
        for partition in np.unique(targets):
            rows = np.flatnonzero(targets == partition)
            grouped.setdefault((write.topic_id, int(partition)), []).append(
                write.batch.take(pa.array(rows))
            )
    mixed: dict[tuple[str, int], list] = {}  # frames followed by rows by reference
    for key, framed_writes in framed.items():
        if key in grouped and _references_of(references.get(key, []), grouped[key]):
            mixed[key] = framed_writes  # a bulk commit's frames and Arrow rows: one share
        elif key in grouped:  # mixed with rows of another kind (not a bulk commit's): decoded
            grouped[key].extend(write.batch for write in framed_writes)
            references.pop(key, None)
    items = []
    for (topic_id, partition), batches in grouped.items():
        batch = batches[0] if len(batches) == 1 else pa.concat_batches(batches)
        framed_writes = mixed.get((topic_id, partition))
        if framed_writes is None:
            items.append(PublishItem(
                topic_id, partition, batch,
                references=_references_of(references.get((topic_id, partition), []), batches),
                moved=_moved_of(moved.get((topic_id, partition), []), batches)))
        else:  # its frames, then its rows: the references in that order (``recover``)
            items.append(PublishItem(
                topic_id, partition, batch,
                references=(*(write.reference for write in framed_writes),
                            *references[(topic_id, partition)]),
                frames=tuple(frame for write in framed_writes for frame in write.frames)))
    items.extend(
        PublishItem(topic_id, partition, None,
                    references=tuple(write.reference for write in found),
                    frames=tuple(frame for write in found for frame in write.frames))
        for (topic_id, partition), found in framed.items()
        if (topic_id, partition) not in grouped
    )  # fmt: skip
    return items


def framed_rest(frames: list[StagedFrame], batch: pa.RecordBatch | None, present: int
                ) -> tuple[list[StagedFrame], pa.RecordBatch | None]:  # fmt: skip
    """What a partition lacks of a share staged as ``frames`` followed by ``batch`` (rows
    by reference, or None), given the ``present`` rows of the transaction it holds: the
    frames are published first, whole (``skip_rows``), then the batch, cut into frames
    if ``cuttable`` (a crash keeps a prefix of them), else one frame there whole or not."""
    framed = sum(frame.record_count for frame in frames)
    if batch is None or present <= framed:
        return skip_rows(frames, present), batch
    if not cuttable(batch):
        return [], batch.slice(batch.num_rows)  # there (duplicates may have dropped rows)
    return [], batch.slice(min(present - framed, batch.num_rows))


def _check_partition(database, topic_id: str, partition: int) -> None:
    """Refuse a write to an unknown (22023) or inactive (55000) partition now."""
    topic = database.topic_log(topic_id)
    topic.partition(partition)
    if not topic.partition_info(partition).active:
        raise PartitionInactiveError(
            f"partition {partition} is inactive (read-only after a split)"
        )


def _references_of(found: list[staged_refs.Reference], batches: list) -> tuple | None:
    """The share's references if all of its batches came from writes by reference."""
    return tuple(found) if found and len(found) == len(batches) else None


def _moved_of(found: list, batches: list) -> moved_refs.MovedSource | None:
    """The share's source if it is one moved write's batch alone (``engine.moved_refs``)."""
    return found[0] if len(batches) == 1 and len(found) == 1 else None


def _check_publishable(database, item: PublishItem) -> None:
    """Refuse (54000), before anything is staged or committed, a partition's share that one
    publish could not write (over ``BATCH_BYTES_MAX`` or ``BATCH_MESSAGES_MAX``): past the
    commit point the publish would fail, and be retried, for ever.

    A share staged as frames has no such limit: each of its frames was checked against
    them when staged, it is on disk already (bounded by the bulk staging cap, charged to
    it until the checkpoint deletes the files: ``BulkWrites._hold``), and every path
    that publishes it goes frame by frame (``PartitionLog.publish_staged``, a split
    partition's ``TopicLog.publish_staged``, recovery): nothing holds the share whole. A
    share of frames followed by rows (a bulk commit's topic with both) holds its rows to
    them."""
    if item.frames is not None and item.batch is None:
        return
    try:
        check_wire_batch(item.batch)
    except LimitExceededError as error:
        names = [e.name for e in database.catalog.entries() if e.topic_id == item.topic_id]
        name = names[0] if names else item.topic_id
        raise LimitExceededError(
            f"a transaction may write at most {limits.BATCH_BYTES_MAX} bytes and "
            f"{limits.BATCH_MESSAGES_MAX} messages to one partition (topic {name}, partition "
            f"{item.partition}): {error}; commit in smaller transactions"
        ) from None


@dataclass(slots=True)
class _LogAppend:
    """A topic-only commit's append (``Committer.commit_in_log``): the shares staged as
    copies (in order, one frame each in ``parts``), those named by reference to their
    source ranges, and the commit record."""

    copied: list[PublishItem]
    moved: list[PublishItem]
    parts: list
    lengths: list[int]
    record: bytes


class PastCommitPoint(StorageIOError):
    """A transaction's commit point passed (its record is durable: it is committed), then
    something no step expected failed (a ``MemoryError`` under the process memory cap,
    say) before the committer's state caught up with it: the committer stopped
    (``Committer._stop``); recovery, at the next open, publishes it."""


class CheckpointSetAside(PartitionFencedError):
    """A checkpoint that had to be whole (``Committer.checkpoint_whole``) kept the
    transactions from the first one that wrote to a partition fenced by an I/O failure
    (to be recovered at the next open) and checkpointed only the rest."""


class Committer:
    """Stages, records, publishes and checkpoints transactions (see the module doc).

    Thread-safety: session threads call ``stage``, ``write_record``,
    ``wait_staged``, ``enter`` and then ``finish`` or ``leave`` (concurrently:
    ``engine.commit_order`` orders them); ``checkpoint`` runs in the background
    thread and from any thread that does not hold ``_checkpoint_lock`` (DDL calls
    it under the commit lock, after ``quiesce``).
    """

    def __init__(self, database, staging: StagingLog) -> None:
        self._database = database
        self.staging = staging
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)  # the background checkpointer's
        self._checkpoint_lock = threading.Lock()
        self._cursor = database.root.cursor()
        tables.run(self._cursor, RECORDS_DDL)
        tables.run(self._cursor, WATERMARK_DDL)
        # Counter deltas committed in the log, applied to DuckDB in the background
        # (``engine.deltas``); the checkpoint passes a record only once they are applied.
        self.deltas = DeltaApplier(database)
        self._last_id = 0
        self._published: list[Published] = []
        self._unfinished: list[tuple[int, list[PublishItem], LogPosition | None]] = []
        self._watermark: LogPosition = (0, 0)  # the commit log's, as in DuckDB
        # Set when a commit record's sync failed or was interrupted: that transaction's
        # outcome is unknown until recovery reads the log, so no commit may follow.
        self._failure: BaseException | None = None
        # Set when something failed past a commit point where no step expected it (its
        # state half updated: ``_stop``): no commit and no checkpoint until reopen.
        self._stopped: BaseException | None = None
        # freed when an allocation past a commit point is refused (``_past_point``)
        self._reserve: bytearray | None = bytearray(limits.COMMIT_RESERVE_BYTES)
        self._order = CommitOrder(database.commit_lock)  # claims and publish turns
        # Offset moves committed since the last checkpoint (their keys).
        self._moved: dict[tuple[str, str, int], int] = {}
        # The background checkpointer: started at the first due checkpoint.
        self._checkpointer: threading.Thread | None = None
        # Commit record ends of log-committed transactions between commit point and publish.
        self._log_ends: dict[int, LogPosition] = {}
        # Files of transactions committed by reference (``engine.staged_refs``), from the
        # record row's writing to the checkpoint that releases them (or ``abandon``).
        self._references: dict[int, list[staged_refs.Reference]] = {}
        # Source ranges (topic id, partition, start) of moves committed by reference
        # (``engine.moved_refs``), from the append of the record to the checkpoint that
        # passes it: retention keeps them (``moved_floor``).
        self._pins: dict[int, list[tuple[str, int, int]]] = {}
        self._closing = False
        # Published count that wakes the checkpointer after a failed checkpoint (None:
        # ``CHECKPOINT_TRANSACTIONS``, read when used so that tests may lower it).
        self._retry_due: int | None = None
        self._staged_bytes = 0  # staged by log commits since the last checkpoint began
        self._consumers: dict[str, tuple[str, ...]] = {}  # the checkpoint's, by topic id
        # Counters for benchmarks and tests.
        self.checkpoints = 0  # checkpoints that deleted records or wrote offsets
        self.log_commits = 0  # transactions committed by a commit record in the log
        self.table_commits = 0  # transactions committed by a DuckDB record row and COMMIT
        self.moved_shares = 0  # shares committed by reference to their source (moved_refs)
        self.checkpoint_syncs = 0  # partition syncs made by checkpoints
        self.background_failures = 0

    def next_transaction_id(self) -> int:
        """Unique and increasing across restarts: microseconds of wall time, bumped."""
        with self._lock:
            self._last_id = max(self._last_id + 1, self._database.clock.now_us())
            return self._last_id

    # -- steps 1 and 2 (session threads) -------------------------------------------------
    def stage(
        self, transaction_id: int, items: list[PublishItem]
    ) -> tuple[list[PublishItem], StagingTicket | None]:
        """Append the items to staging (synced in the background: see ``wait_staged``);
        the items come back with their staged places and encoded bodies. Items committed
        by reference are not staged (their files are durable already: the record names
        them); the ticket is None when no item was staged."""
        copied = [item for item in items if item.references is None]
        if not copied:
            return list(items), None
        parts, lengths = encode_batches(transaction_id, [item.batch for item in copied])
        ticket = self.staging.append(transaction_id, parts, lengths)
        bodies = iter(parts[1::2])  # encode_batches: each frame's header, then its body
        placed = iter(ticket.placed)
        staged = [
            i if i.references is not None
            else PublishItem(i.topic_id, i.partition, i.batch, next(placed), next(bodies))
            for i in items
        ]  # fmt: skip
        return staged, ticket

    def wait_staged(self, ticket: StagingTicket) -> None:
        """Block until the staged frames are durable; call before the commit point."""
        self.staging.wait_durable(ticket)
        failpoints.hit("commit.after_stage")

    def write_record(
        self,
        cursor,
        transaction_id: int,
        items: list[PublishItem],
        moves: dict[tuple[str, str, int], int],
    ) -> None:
        """Insert the commit record through the session's cursor (inside its transaction)."""
        payload = [
            [i.topic_id, i.partition, i.staged.file_number, i.staged.position, i.staged.frame_bytes]
            if i.references is None
            else [i.topic_id, i.partition, {"references": list(i.references)}]
            for i in items
            if i.staged is not None or i.references is not None
        ]
        offsets = [[t, c, p, o] for (t, c, p), o in moves.items()]
        self._keep_references(transaction_id, items)  # ``abandon`` forgets them
        self.table_commits += 1  # attempts; a COMMIT that fails is rare
        tables.run(
            cursor,
            RECORD_INSERT,
            [
                transaction_id,
                self._database.clock.now_us(),
                json.dumps(payload),
                json.dumps(offsets),
            ],
        )

    # -- the commit point and after (see engine.commit_order) --------------------------
    def enter(
        self, keys: set[tuple[str, str, int]], validate: Callable[[], None], *, recorded: bool
    ) -> CommitSlot:
        """Validate and claim ``keys`` just before the DuckDB COMMIT (``CommitOrder.enter``);
        end the slot with ``finish`` (committed) or ``leave`` (not)."""

        def checked() -> None:
            self._check_usable()
            validate()

        return self._order.enter(keys, checked, recorded=recorded)

    def _stop(self, error: BaseException) -> None:
        """Fail-stop: something failed past a commit point where no step expected it (a
        ``MemoryError``, say), so what this object holds (the offsets' mirror, the lists
        the checkpoint counts, the publish turns) may not describe the committed
        transactions. Every later commit is refused (``_check_usable``) and every
        checkpoint too (one could pass a record whose transaction is not published), until
        the database is reopened: recovery rebuilds all of it from the records."""
        with self._lock:
            if self._stopped is None:
                self._stopped = error
            if self._failure is None:
                self._failure = error
        log.error("the committer stopped until reopen after an unexpected %s past a commit "
                  "point: %s", type(error).__name__, error)  # fmt: skip

    def _check_usable(self) -> None:
        if self._stopped is not None:
            raise StorageIOError(
                "the committer stopped after an unexpected error past a commit point "
                f"({self._stopped}); reopen the database (recovery publishes what it left)")
        if self._failure is not None:
            raise StorageIOError(
                "a commit record's sync failed earlier, so a commit's outcome is unknown "
                f"until the database is reopened (recovery decides it): {self._failure}"
            )

    # -- the topic-only commit: one append to the log -------------------------------------
    def commit_in_log(
        self,
        transaction_id: int,
        items: list[PublishItem],
        moves: dict[tuple[str, str, int], int],
        validate: Callable[[], None],
        deltas: list[Delta] | None = None,
        reservations: list[Reservation] | None = None,
    ) -> tuple[CommitSlot, list[PublishItem]]:
        """Commit a transaction that touches no table: its batches and its commit record
        (``storage.commit_log``), encoded here, are appended in one write under the commit
        lock right after ``validate`` (so log order is validation and turn order), then
        made durable by the staging log's group-committed sync: the commit point. Returns
        the slot and the items with their staged places; the caller ends the slot with
        ``finish``. A failed validation or append commits nothing; a failed or
        interrupted sync leaves the outcome unknown (the record may or may not be on
        disk), so the committer refuses every later commit (``_check_usable``).

        ``deltas`` (``engine.deltas``: counter upserts kept by the transaction) go into the
        record and are registered with the applier under the commit lock right after the
        append (log order), once ``DeltaApplier.check_commit`` found their reservations
        still valid (else 40001); the applier applies them once the record is durable."""
        assert all(i.references is None for i in items), "references need a record row"
        deltas = deltas or []
        reservations = reservations if reservations is not None else []
        at_us = self._database.clock.now_us()

        def encode(referenced: set[int]) -> _LogAppend:
            """The append: copied shares' frames, then the record, which names the sources
            of the shares in ``referenced`` (their ids; ``engine.moved_refs``)."""
            moved = [i for i in items if id(i) in referenced]
            copied = [i for i in items if id(i) not in referenced]
            parts, lengths = (
                encode_batches(transaction_id, [i.batch for i in copied]) if copied else ([], [])
            )
            payload = RECORD_JSON.encode(
                {
                    "at": at_us,
                    "items": [[i.topic_id, i.partition] for i in copied],
                    **({"moved": [[i.topic_id, i.partition, i.moved.to_json()] for i in moved
                                  if i.moved is not None]} if moved else {}),
                    "offsets": [[t, c, p, o] for (t, c, p), o in moves.items()],
                    **({"deltas": [d.to_json() for d in deltas]} if deltas else {}),
                }
            ).encode()  # fmt: skip
            record = commit_log.encode_record(transaction_id, len(copied), payload)
            return _LogAppend(copied, moved, parts, lengths, record)

        # Sources made durable now stay so (``durable_end`` only grows); that they are
        # still present is checked again under the commit lock, where retention deletes.
        encoded = [encode({id(i) for i in items if i.moved is not None
                           and moved_refs.make_durable(self._database, i.moved)})]  # fmt: skip
        # Filled by item assignment right after the append (no allocation once the record
        # is in the log): whether a failure that follows leaves the commit in doubt.
        appended: list[StagingTicket | None] = [None]
        registered = []

        def validate_and_append() -> None:
            self._check_usable()
            self._check_topics_exist(items)
            validate()
            if deltas:
                self.deltas.check_commit(reservations, deltas)
            failpoints.hit("commit.before_log_append")
            if encoded[0].moved and not all(
                i.moved is not None and moved_refs.usable(self._database, i.moved)
                for i in encoded[0].moved
            ):
                encoded[0] = encode(set())  # a source went meanwhile (rare): copies, as before
            append = encoded[0]
            if append.moved:  # kept by retention until the checkpoint passes the record;
                self._pin_sources(transaction_id, append.moved)  # pinned before the append
            try:
                ticket = self.staging.append(transaction_id, append.parts, append.lengths,
                                             append.record)  # fmt: skip
            except BaseException:
                self._unpin(transaction_id)
                raise
            appended[0] = ticket
            try:  # the record is in the log: a failure now leaves the commit in doubt
                failpoints.hit("commit.log_appended")
                if deltas:
                    end = (ticket.file_number, ticket.end)
                    registered.append(self.deltas.register(deltas, reservations, end))
            except BaseException as error:  # no later commit validates before reopen
                with self._lock:
                    if self._failure is None:
                        self._failure = error
                raise

        try:
            slot = self._order.enter(set(moves), validate_and_append, recorded=True)
        except BaseException as error:
            if appended[0] is None:
                raise  # nothing appended: nothing committed
            if not isinstance(error, Exception):
                raise  # an interrupt stays one (the committer is stopped all the same)
            raise StorageIOError(
                f"the commit of transaction {transaction_id} is in doubt (its commit record "
                f"was appended, then {type(error).__name__}: {error}); reopen the database "
                "to resolve it"
            ) from error
        ticket = appended[0]
        try:
            failpoints.hit("commit.after_log_append")
            self.staging.wait_durable(ticket)
        except BaseException as error:
            if registered:
                self.deltas.in_doubt(registered[0], error)
            with self._lock:
                if self._failure is None:
                    self._failure = error
            self.leave(slot)
            if not isinstance(error, Exception):
                raise  # an interrupt stays one (the committer is stopped all the same)
            raise StorageIOError(
                f"the commit of transaction {transaction_id} is in doubt (its commit record "
                f"may or may not be durable): {error}; reopen the database to resolve it"
            ) from error
        try:
            return self._logged(slot, transaction_id, items, encoded[0], ticket, registered)
        except BaseException as error:
            if registered and not registered[0].durable:
                self.deltas.in_doubt(registered[0], error)  # recovery applies them
            self._stop(error)
            self._log_ends.pop(transaction_id, None)
            self.leave(slot)  # its turn passes: nothing of it is published before reopen
            raise PastCommitPoint(
                f"transaction {transaction_id} is committed (its commit record is durable) "
                f"but an unexpected {type(error).__name__} followed ({error}): no commit is "
                "accepted until the database is reopened, which publishes it"
            ) from error

    def _logged(self, slot: CommitSlot, transaction_id: int, items: list[PublishItem],
                append: _LogAppend, ticket: StagingTicket, registered: list
                ) -> tuple[CommitSlot, list[PublishItem]]:  # fmt: skip
        """``commit_in_log`` past its commit point: the applier told, the counters, the
        staged places of the shares copied (see there)."""
        if registered:
            self.deltas.durable(registered[0])
        failpoints.hit("commit.log_durable")
        self.log_commits += 1
        self.moved_shares += len(append.moved)
        # A moved share counts as staged although it is not: its frames in ``b`` are
        # unsynced and its ranges pinned until a checkpoint, which these bytes bring on.
        # Its messages' bytes (the data column) stand for it: the batch's ``nbytes``
        # walks every column's buffers (~15-45 us a share, under the GIL), for a few
        # hundred bytes more of the other columns' defaults; the column's own ``nbytes``
        # ~14-24 us a share just read, ``data_bytes`` (the same count) ~1 us.
        moved_bytes = sum(data_bytes(i.batch) for i in append.moved if i.batch is not None)
        with self._lock:
            self._staged_bytes += sum(append.lengths) + len(append.record) + moved_bytes
        bodies = append.parts[1::2]  # encode_batches: each frame's header, then its body
        placed = {
            id(i): PublishItem(i.topic_id, i.partition, i.batch, s, body)
            for i, s, body in zip(append.copied, ticket.placed, bodies, strict=True)
        }
        # Moved shares are published from their batches (encoded by the publish).
        staged = [placed.get(id(i), i) for i in items]
        self._log_ends[transaction_id] = (ticket.file_number, ticket.end)
        return slot, staged

    def _pin_sources(self, transaction_id: int, moved: list[PublishItem]) -> None:
        """Keep the moved shares' source ranges from retention (``moved_floor``) until
        the checkpoint that passes the transaction's record (``_release_references``)."""
        pins = [(r.topic_id, r.partition, r.start)
                for i in moved if i.moved is not None for r in i.moved.ranges]  # fmt: skip
        with self._lock:
            self._pins.setdefault(transaction_id, []).extend(pins)

    def _unpin(self, transaction_id: int) -> None:
        """The record naming the pinned sources was not appended: they are free again."""
        with self._lock:
            self._pins.pop(transaction_id, None)

    def moved_floor(self, topic_id: str, partition: int) -> int | None:
        """The lowest offset of the partition that a committed move's record, not yet
        checkpointed, names as its source (``engine.moved_refs``); retention keeps it."""
        with self._lock:
            starts = [start for pins in self._pins.values()
                      for t, p, start in pins if t == topic_id and p == partition]  # fmt: skip
        return min(starts, default=None)

    def pins_topic(self, topic_id: str) -> bool:
        """Whether a record not yet checkpointed names a range of the topic as a source."""
        with self._lock:
            return any(t == topic_id for pins in self._pins.values() for t, _, _ in pins)

    def _check_topics_exist(self, items: list[PublishItem]) -> None:
        """Refuse (42P01), under the commit lock and before the record is appended, a
        commit to a topic dropped since its writes were routed: past the commit point its
        record would name a topic that is gone. DDL takes the commit lock and waits for
        every slot to end (``quiesce``), so a topic found here outlives the publish; a
        topic re-created under the same name has another id, so it does not count."""
        for topic_id in sorted({item.topic_id for item in items}):
            try:
                self._database.topic_log(topic_id)
            except UndefinedTopicError:
                raise UndefinedTopicError(
                    f"topic {topic_id} was dropped while this statement or transaction "
                    "wrote to it; nothing was committed"
                ) from None

    def recorded(self, transaction_id: int) -> bool:
        """Whether DuckDB holds the transaction's record row (committed), read through a
        cursor of its own: a table commit's COMMIT that raised may still have committed."""
        cursor = self._database.root.cursor()
        try:
            found = tables.query_arrow(
                cursor, f"SELECT count(*) AS n FROM {SCHEMA}.transactions "
                "WHERE transaction_id = ?", [transaction_id])  # fmt: skip
        finally:
            cursor.close()
        return found is not None and found.column(0)[0].as_py() > 0

    def in_doubt(self, slot: CommitSlot, error: BaseException) -> None:
        """A table commit's outcome is unknown (its COMMIT raised, and whether DuckDB
        committed could not be read): stop (``_stop``), end the slot; recovery decides."""
        self._stop(error)
        self.leave(slot)

    def leave(self, slot: CommitSlot) -> None:
        """The slot's COMMIT failed or never ran: release its claims and its turn."""
        self._order.release(slot)
        interrupted = self._order.wait_turn(slot)
        self._order.done(slot)
        if interrupted is not None:
            raise interrupted

    def finish(
        self,
        slot: CommitSlot,
        transaction_id: int | None,
        moves: dict[tuple[str, str, int], int],
        items: list[PublishItem],
    ) -> list[TopicAppendResult | None]:
        """After the commit point: move the offsets in the catalog's mirror, release the
        claims, then, in turn, publish (step 3) and count the transaction for the
        checkpoint. Publishing outside the commit lock lets the next transaction's
        COMMIT overlap this publish; turns keep publishes in commit order. A publish
        that fails is finished by the next publish or checkpoint, exactly as recovery
        would after a crash; its error is raised. Returns each item's publish outcome
        (an autocommit write reports them, ``engine.spread_append``)."""
        failure: BaseException | None = None
        results: list[TopicAppendResult | None] = []
        try:
            self._past_point(lambda: failpoints.hit("commit.after_commit_point"))
        except BaseException as raised:  # committed all the same: publish later
            failure = raised
        try:
            self._past_point(lambda: self._move_mirror(moves))
        except BaseException as error:  # the mirror half moved: fail-stop (``_stop``)
            self._stop(error)
            failure = error
        self._order.release(slot)
        failure = self._order.wait_turn(slot) or failure
        try:
            if transaction_id is not None:
                log_end = self._log_ends.pop(transaction_id, None)
                if self._stopped is not None:  # left to recovery, as every record past
                    failure = failure or PastCommitPoint(  # the watermark
                        f"transaction {transaction_id} is committed, but the committer "
                        f"stopped ({self._stopped}): reopen the database to publish it")
                elif failure is not None:
                    with self._lock:
                        self._unfinished.append((transaction_id, items, log_end))
                else:
                    results = self._publish_in_turn(transaction_id, items, log_end)
        finally:
            self._order.done(slot)
        if failure is not None:
            raise failure
        return results

    def quiesce(self) -> None:
        """Wait until no transaction is between ``enter`` and its end (the caller holds
        the commit lock, so none can enter): DDL then sees every committed offset move."""
        self._order.quiesce()

    def _publish_in_turn(
        self, transaction_id: int, items: list[PublishItem], log_end: LogPosition | None
    ) -> list[TopicAppendResult | None]:
        """Step 3 (caller has the turn): one tagged frame per partition, no sync."""
        results = []
        try:
            if self._unfinished:
                with self._lock:
                    self._finish_unfinished()
            with self._database.publish_lock:
                if self._framed_at_once(items):  # every share at once, the first too
                    results.extend(self._publish_framed(transaction_id, items, point=True))
                else:
                    if items:
                        results.append(self._publish_item(transaction_id, items[0]))
                    if len(items) > 1:
                        failpoints.hit("commit.mid_publish")
                        results.extend(self._publish_items(transaction_id, items[1:]))
        except BaseException as error:
            try:
                with self._lock:
                    self._unfinished.append((transaction_id, items, log_end))
            except BaseException as unexpected:  # not kept for the checkpoint: fail-stop
                self._stop(unexpected)
                raise unexpected from error
            if isinstance(error, MemoryError) and self._finish_now():
                return [None] * len(items)  # published and counted; offsets not known
            raise
        try:
            self._past_point(lambda: self._note_done_once(transaction_id, items, log_end))
        except BaseException as error:  # published, not counted: a checkpoint must not
            self._stop(error)  # pass its record (its partitions unsynced): fail-stop
            raise
        return results

    def _move_mirror(self, moves: dict[tuple[str, str, int], int]) -> None:
        """Move the offsets' mirror: idempotent (``apply_offsets`` is all or nothing and the
        moves are absolute offsets), so ``_past_point`` may run it again."""
        failpoints.hit("commit.before_mirror")
        self._database.catalog.apply_offsets(moves)
        with self._lock:
            self._moved.update(moves)

    def _note_done_once(
        self, transaction_id: int, items: list[PublishItem], log_end: LogPosition | None
    ) -> None:
        """``_note_done`` after its failpoint: it raises only before it counted the
        transaction (``_note_done``), so a retry does not count it twice."""
        failpoints.hit("commit.before_note_done")
        self._note_done(transaction_id, [(i.topic_id, i.partition) for i in items], log_end)

    def _finish_now(self) -> bool:
        """After a publish refused an allocation (caller has the turn): free the reserve,
        collect garbage and finish what is unfinished now, as the next publish or recovery
        would (idempotent, ``check``). Whether it is all published and counted; if not it
        stays for the next publish or checkpoint, as before round 25."""
        self._reserve = None
        gc.collect()
        try:
            with self._lock:  # as at the start of ``_publish_in_turn``
                self._finish_unfinished()
        except Exception as error:
            log.warning("a publish refused memory; finishing it now failed too (left for "
                        "the next publish): %s", error)  # fmt: skip
            return False
        finally:
            try:
                self._reserve = bytearray(limits.COMMIT_RESERVE_BYTES)
            except MemoryError:
                self._reserve = None
        return True

    def _past_point(self, step: Callable[[], None]) -> None:
        """Run an idempotent step past a commit point. An allocation refused there (the
        process memory cap is process-wide: another session's statement may have taken
        the room) frees the reserve (``_reserve``), collects garbage and runs the step
        once more; only a second failure escapes (the caller then stops the committer, as
        before round 25). The reserve is taken again after, if it can be."""
        try:
            step()
            return
        except MemoryError as error:
            refused = error
        self._reserve = None
        try:
            gc.collect()
            step()
        except BaseException as again:  # the caller stops the committer: name the first
            raise again from refused
        finally:
            try:
                self._reserve = bytearray(limits.COMMIT_RESERVE_BYTES)
            except MemoryError:  # tried again at the next failure's retry: no reserve now
                self._reserve = None

    def _note_done(
        self, transaction_id: int, targets: list[tuple[str, int]], log_end: LogPosition | None
    ) -> None:
        """Count a finished transaction for the checkpoint; wake the checkpointer if due.
        Raises only before the transaction is counted (a retry, ``_past_point``, counts it
        once): waking or starting the checkpointer after that is tried again at the next
        commit if it fails (no thread, or no memory: the state is right either way)."""
        with self._wake:
            self._published.append((transaction_id, targets, log_end))
            try:
                if not self._checkpoint_wanted():
                    return
                if self._checkpointer is None and not self._closing:
                    checkpointer = threading.Thread(
                        target=self._checkpoint_loop, name="topicbase-checkpoint", daemon=True
                    )
                    checkpointer.start()
                    self._checkpointer = checkpointer
                self._wake.notify_all()
            except (RuntimeError, MemoryError) as error:  # the memory cap counts stacks too
                with contextlib.suppress(MemoryError):
                    log.warning("checkpoint thread not started or woken (tried again at the "
                                "next commit): %s", error)  # fmt: skip

    @property
    def backlog(self) -> int:
        """Published transactions not yet checkpointed."""
        return len(self._published)

    def _checkpoint_wanted(self) -> bool:
        """Whether the background checkpoint is due (caller holds ``_lock``): enough
        transactions published, or enough bytes staged by log commits."""
        return (
            len(self._published) >= self._due()
            or (bool(self._published) and self._staged_bytes >= CHECKPOINT_STAGED_BYTES)
        )

    def _due(self) -> int:
        return CHECKPOINT_TRANSACTIONS if self._retry_due is None else self._retry_due

    def catch_up(self) -> None:
        """Called by a session after its commit, outside the commit lock: if the
        background checkpoint fell far behind, run one here (a bound on the backlog
        of records and staging). A failure is logged, not raised: the commit stands."""
        backlog_max = CHECKPOINT_BACKLOG_FACTOR * self._due()
        if len(self._published) < backlog_max:
            return
        try:
            self.checkpoint()  # what it sets aside stays until reopen (``_checkpoint_locked``)
        except Exception as error:
            log.warning("checkpoint after a commit failed (kept for the next): %s", error)

    def _publish_item(
        self, transaction_id: int, item: PublishItem, *, check: bool = False
    ) -> TopicAppendResult | None:
        """Publish one partition's batch; with ``check``, only if it is not there yet (then
        None: its outcome was reported, or lost with a crash). A topic dropped since (a
        table-touching commit routed its writes before a DROP took the commit lock) gets
        nothing, and None: as after a commit followed by the drop, as ``recover`` and the
        checkpoint treat it; else its record would fail to publish for ever."""
        try:
            topic = self._database.topic_log(item.topic_id)
        except UndefinedTopicError:
            return None
        if item.frames is not None:  # staged as frames: copied as they are
            frames, batch = list(item.frames), item.batch
            if check:  # a partition holds whole frames of the share, then its rows: skip
                since = transaction_id - CLOCK_SLACK_US
                present = topic.partition(item.partition).transaction_rows(transaction_id, since)
                frames, batch = framed_rest(frames, batch, present)
            topic.publish_staged(frames, item.partition, transaction_id, batch)
            return None
        if check:
            since = transaction_id - CLOCK_SLACK_US  # ids are commit-time microseconds
            log_ = topic.partition(item.partition)
            present = log_.published_prefix(item.batch, transaction_id, since)
            if present == item.batch.num_rows:
                return None
            if present:  # a share cut into frames lost its tail: publish the rest
                topic.publish_transactional(item.batch.slice(present), item.partition,
                                            transaction_id)  # fmt: skip
                return None
        log_ = topic.partition(item.partition)
        if log_.drop_floor is None:  # first publish here: its writes may drop behind them
            log_.drop_floor = self._current_floor(item.topic_id, item.partition)
        return topic.publish_transactional(item.batch, item.partition, transaction_id, item.body)

    def _publish_items(
        self, transaction_id: int, items: list[PublishItem]
    ) -> list[TopicAppendResult | None]:
        """``_publish_item`` of each item, in order; each run of one topic's items goes to
        the topic in one call (``TopicLog.publish_transactional_many``: a statement spread
        over many partitions publishes its shares together)."""
        if any(item.frames is not None for item in items):  # shares staged as frames
            return self._publish_framed(transaction_id, items)
        results: list[TopicAppendResult | None] = []
        for topic_id, run in itertools.groupby(items, key=lambda item: item.topic_id):
            shares = [(item.partition, item.batch, item.body) for item in run]
            try:
                topic = self._database.topic_log(topic_id)
            except UndefinedTopicError:  # dropped since: nothing to publish (``_publish_item``)
                results.extend([None] * len(shares))
                continue
            results.extend(topic.publish_transactional_many(shares, transaction_id))
        return results

    @staticmethod
    def _framed_at_once(items: list[PublishItem]) -> bool:
        """Whether ``_publish_framed`` publishes ``items`` on threads, all at once: more
        than one, some staged as frames, each of its own partition."""
        targets = {(item.topic_id, item.partition) for item in items}
        return (len(items) > 1 and len(targets) == len(items)
                and any(item.frames is not None for item in items))  # fmt: skip

    def _publish_framed(
        self, transaction_id: int, items: list[PublishItem], *, point: bool = False
    ) -> list[TopicAppendResult | None]:
        """``_publish_item`` of each item, shares of distinct partitions at once, a thread
        each (at most ``FRAMED_PUBLISH_THREADS``): a share staged as frames is copied file
        to file in the kernel, or adopted, without the GIL, while the client waits for its
        commit. Each partition's frames still go in order under its write lock; which
        partitions a crash or an error leaves published is any subset, which recovery and
        ``_finish_unfinished`` handle per partition (``check``) as they do a prefix. With
        ``point`` (the whole transaction: its first share no longer goes alone before the
        others, round 16), ``commit.mid_publish`` is hit once a share is published, the
        others in flight or done. Raises the first error once all ended."""
        if not self._framed_at_once(items):
            return [self._publish_item(transaction_id, item) for item in items]
        workers = min(len(items), FRAMED_PUBLISH_THREADS)
        with concurrent.futures.ThreadPoolExecutor(workers, "topicbase-publish") as pool:
            futures = [pool.submit(self._publish_item, transaction_id, item) for item in items]
            if point:
                pending = set(futures)
                while pending:
                    done, pending = concurrent.futures.wait(
                        pending, return_when=concurrent.futures.FIRST_COMPLETED)
                    if any(future.exception() is None for future in done):
                        failpoints.hit("commit.mid_publish")  # the pool's exit waits for the rest
                        break
        return [future.result() for future in futures]

    def _finish_unfinished(self) -> None:
        """Publish what failed publishes left out (caller holds the commit lock and ``_lock``)."""
        while self._unfinished:
            transaction_id, items, log_end = self._unfinished[0]
            for item in items:
                self._publish_item(transaction_id, item, check=True)
            self._unfinished.pop(0)  # only once all of it is published
            targets = [(i.topic_id, i.partition) for i in items]
            self._published.append((transaction_id, targets, log_end))

    def _keep_references(self, transaction_id: int, items: list[PublishItem]) -> None:
        """Keep the transaction's references until its checkpoint releases them; their
        files' bytes count toward a checkpoint being due (``CHECKPOINT_STAGED_BYTES``), as
        log commits' staged bytes do: the files stay on disk until then."""
        found = [r for i in items if i.references is not None for r in i.references]
        if found:
            named = {tuple(e) for r in found for e in r.get("frames", r.get("files", []))}
            with self._lock:
                self._references.setdefault(transaction_id, []).extend(found)
                self._staged_bytes += sum(size for _, size, _ in named)

    def _release_references(self, transaction_ids: set[int]) -> None:
        """Delete the files of released transactions committed by reference (after their
        partitions were synced and their record rows deleted: nothing needs them)."""
        with self._lock:
            found = [r for t in transaction_ids for r in self._references.pop(t, [])]
            for transaction_id in transaction_ids:
                self._pins.pop(transaction_id, None)
        if found:
            staged_refs.release(self._database.path, found)

    def abandon(self, transaction_id: int) -> None:
        """The transaction will never commit: its staging may go (files it referenced
        belong to their writer again: they stay)."""
        self.staging.release({transaction_id})
        with self._lock:
            self._references.pop(transaction_id, None)
            self._pins.pop(transaction_id, None)

    # -- step 4: checkpoints -------------------------------------------------------------
    def _checkpoint_loop(self) -> None:
        """The background checkpointer: one checkpoint each time enough are published.

        A failed checkpoint keeps everything for the next one, which is tried
        after another ``CHECKPOINT_TRANSACTIONS`` commits (no busy retry).
        """
        while True:
            with self._wake:
                while not self._closing and not self._checkpoint_wanted():
                    self._wake.wait()
                if self._closing:
                    return
            try:
                self.checkpoint()  # one that sets some aside sets ``_retry_due`` itself
            except Exception as error:  # kept for the next one; recovery needs none
                self.background_failures += 1
                log.warning("background checkpoint failed (kept for the next): %s", error)
                with self._wake:
                    self._retry_due = len(self._published) + CHECKPOINT_TRANSACTIONS
            else:
                with self._wake:
                    self._retry_due = None

    def checkpoint_whole(self) -> None:
        """``checkpoint``, for a caller that relies on a whole one (a retention pass
        deletes below the ends it saw before it; DDL that drops a consumer): raises
        ``CheckpointSetAside`` if transactions were set aside."""
        kept = self.checkpoint()
        if kept:
            raise CheckpointSetAside(
                f"{kept} transactions wrote to a partition fenced by an I/O failure: they "
                "stay to be checkpointed after the database is reopened"
            )

    def checkpoint(self) -> int:
        """Sync published partitions, write moved offsets, delete their records, release
        their staging. Runs beside commits; see the module doc for why that is safe.

        Transactions behind a fenced partition (``_checkpoint_locked``) are kept for the
        next open and the rest checkpointed all the same. Returns how many were kept
        (0: a whole checkpoint); ``checkpoint_whole`` refuses a partial one."""
        if self._stopped is not None:
            raise StorageIOError(
                f"no checkpoint after the committer stopped ({self._stopped}): the records "
                "stay for the recovery at the next open")
        if self._unfinished:
            with self._database.commit_lock, self._lock:
                self._finish_unfinished()
        with self._checkpoint_lock:
            with self._lock:
                if self._unfinished:
                    # A publish failed since: a record left behind could hold an older
                    # offset than the ones this checkpoint would write. Next time.
                    raise StorageIOError("a failed publish is not finished yet; checkpoint later")
                published, self._published = self._published, []
                moved, self._moved = self._moved, {}
                self._staged_bytes = 0
            if not published and not moved:
                return 0
            try:
                # No record may be passed while its deltas are unapplied (engine.deltas).
                self.deltas.drain()
                kept = self._checkpoint_locked(published, moved)
            except BaseException:
                with self._lock:  # not durable, or not recorded: keep them
                    self._published = published + self._published
                    self._moved = {**moved, **self._moved}
                raise
            if kept:
                with self._lock:  # set aside behind a fenced partition: for the next open
                    self._published = kept + self._published
                    # tried again after as many more commits, not at every one
                    self._retry_due = len(self._published) + CHECKPOINT_TRANSACTIONS
            return len(kept)

    def _checkpoint_locked(
        self, published: list[Published], moved: dict[tuple[str, str, int], int]
    ) -> list[Published]:
        """Checkpoint ``published`` up to its first transaction that touched a partition
        fenced by an I/O failure (its frames there may never reach the disk; only a
        reopen, whose recovery republishes them from the staging log, can make them
        durable); return that one and all after it, kept with their records and staging.
        Keeping a suffix, never a transaction here and there, keeps what a checkpoint
        relies on: the watermark passes only records before every kept one, and a record
        kept replays, in order, no older offset than the ones written now (as for the
        transactions published after the snapshot). Without it one fenced partition
        made every checkpoint, and so all topic DDL and close, fail until reopen."""
        partitions = {p for _, targets, _ in published for p in targets}
        # each topic's consumer names, for the page-cache floors (``_consumed_floor``)
        self._consumers = {e.topic_id: tuple(e.consumers) for e in self._database.catalog.entries()}
        fenced: set[tuple[str, int]] = set()
        for topic_id, partition in sorted(partitions):
            try:
                topic = self._database.topic_log(topic_id)
            except UndefinedTopicError:
                continue  # dropped since: nothing to sync
            try:
                # ``make_durable``, not ``sync``: after a reopen the log of a partition
                # this process has not written is not open for writing, and ``sync``
                # would sync nothing although a killed process's frames may be in the
                # page cache only (the records passed below are their last copy).
                floor = self._consumed_floor(topic_id, partition)
                log_ = topic.partition(partition)
                log_.make_durable(drop_below=floor)
                log_.drop_floor = floor  # what its writes drop behind them till the next
            except PartitionFencedError as error:
                fenced.add((topic_id, partition))
                log.warning("checkpoint sets aside the transactions from the first one "
                            "that wrote to a fenced partition until reopen: %s", error)  # fmt: skip
                continue
            self.checkpoint_syncs += 1
        kept: list[Published] = []
        if fenced:
            cut = next(i for i, (_, targets, _) in enumerate(published) if fenced & set(targets))
            published, kept = published[:cut], published[cut:]
        ids = [transaction_id for transaction_id, _, log_end in published if log_end is None]
        ends = [log_end for _, _, log_end in published if log_end is not None]
        watermark = max([self._watermark, *ends])
        failpoints.hit("commit.checkpoint_before_delete")
        catalog = self._database.catalog
        current = {key: catalog.committed(*key) for key in moved}
        offsets = {
            key: offset
            for key, offset in current.items()
            if offset is not None and catalog.has_consumer(key[0], key[1])
        }
        tables.run(self._cursor, "BEGIN TRANSACTION")
        try:
            catalog.write_offsets(self._cursor, offsets)
            if ids:
                tables.run(
                    self._cursor,
                    f"DELETE FROM {SCHEMA}.transactions WHERE transaction_id IN "
                    f"(SELECT unnest(?::BIGINT[]))",
                    [ids],
                )
            if watermark != self._watermark:
                tables.run(self._cursor, f"DELETE FROM {SCHEMA}.commit_log_watermark")
                tables.run(
                    self._cursor,
                    f"INSERT INTO {SCHEMA}.commit_log_watermark VALUES (?, ?)",
                    list(watermark),
                )
            tables.run(self._cursor, "COMMIT")
        except BaseException:
            tables.run(self._cursor, "ROLLBACK")
            raise
        self._watermark = watermark
        self.checkpoints += 1
        failpoints.hit("commit.checkpoint_before_release")
        released = {transaction_id for transaction_id, _, _ in published}
        self.staging.release(released)
        self._release_references(released)
        self._drop_consumed(moved, partitions)
        return kept

    def _drop_consumed(
        self, moved: dict[tuple[str, str, int], int], synced: set[tuple[str, int]]
    ) -> None:
        """The partitions whose consumer offsets moved since the last checkpoint (the
        ones not synced and dropped above): their bytes below the consumers' floor leave
        the page cache (``PartitionLog.drop_consumed``, a hint). A source topic that the
        process fills and moves from then keeps a flat page-cache footprint."""
        for topic_id, partition in sorted({(t, p) for t, _, p in moved} - synced):
            try:
                log_ = self._database.topic_log(topic_id).partition(partition)
            except TopicbaseError:
                continue  # dropped since, or the partition is gone
            log_.drop_consumed(self._consumed_floor(topic_id, partition))

    def _current_floor(self, topic_id: str, partition: int) -> int:
        """``_consumed_floor`` from the catalog as it is now (the first publish to a
        partition, before any checkpoint gave it a floor: ``PartitionLog.drop_floor``)."""
        catalog = self._database.catalog
        names = [n for e in catalog.entries() if e.topic_id == topic_id for n in e.consumers]
        if not names:
            return EVERY_OFFSET
        return min(catalog.committed(topic_id, name, partition) or 0 for name in names)

    def _consumed_floor(self, topic_id: str, partition: int) -> int:
        """The offset of ``partition`` below which every consumer of the topic has
        committed (the whole log for a topic without consumers): the checkpoint's sync
        may drop those bytes from the page cache (``storage.page_cache``), so appends
        reuse its pages, while what a consumer reads next stays cached. The topics'
        consumers are looked up once per checkpoint (``_consumers``)."""
        catalog = self._database.catalog
        consumers = self._consumers.get(topic_id, ())
        if not consumers:
            return EVERY_OFFSET
        return min(catalog.committed(topic_id, name, partition) or 0 for name in consumers)

    def recover(self) -> int:
        """Re-publish what committed transactions left unpublished. Returns how many.

        Committed transactions are those with a DuckDB record row and those with a
        whole commit record in the staging log past the watermark; they are replayed
        together in transaction id order (``_committed_rows``)."""
        republished = 0
        rows = self._committed_rows()
        # Counter deltas of records past the applied-through position, applied first (in
        # one DuckDB transaction with the position): tables then hold every committed one.
        self.deltas.recover(
            [(row["log_end"], row["deltas"]) for row in rows if row.get("deltas")])
        # The transactions each partition holds frames of, from one scan of its headers
        # since the oldest record (a scan per record and partition took minutes after a
        # crash among many writes spread over 1000 partitions: engine.spread_append).
        earliest = min((row["committed_at_us"] for row in rows), default=0) - CLOCK_SLACK_US
        present: dict[tuple[str, int], dict[int, int]] = {}
        # A record's shares by reference: each of its file lists read and checked once.
        derivation = staged_refs.Derivation(self._database.path)
        checked: dict[tuple, dict] = {}  # a record's frames files, checked and indexed once
        for row in rows:
            derivation.clear()  # the previous record's files
            checked.clear()
            transaction_id = row["transaction_id"]
            self._last_id = max(self._last_id, transaction_id)
            catalog = self._database.catalog
            moves = {
                (t, c, p): o
                for t, c, p, o in json.loads(row["offsets"])
                if catalog.has_consumer(t, c)
            }
            catalog.apply_offsets(moves)
            self._moved.update(moves)
            targets = []
            for entry in json.loads(row["items"]):
                moved = None
                if len(entry) == 3 and "moved" in entry[2]:  # by reference to topic ranges
                    topic_id, partition, source = entry
                    moved = moved_refs.MovedSource.from_json(source)
                    self._pins.setdefault(transaction_id, []).extend(
                        (r.topic_id, r.partition, r.start) for r in moved.ranges)
                    staged, references = None, None
                elif len(entry) == 3:  # committed by reference: [topic, partition, {...}]
                    topic_id, partition, by_reference = entry
                    references = by_reference["references"]
                    with self._lock:
                        self._references.setdefault(transaction_id, []).extend(references)
                    staged = None
                else:
                    topic_id, partition, number, position, length = entry
                    staged, references = StagedBatch(number, position, length), None
                    self.staging.keep(transaction_id, [staged])
                try:
                    topic = self._database.topic_log(topic_id)
                except UndefinedTopicError:
                    continue  # the topic was dropped since
                log_ = topic.partition(partition)
                found = present.get((topic_id, partition))
                if found is None:
                    found = present[(topic_id, partition)] = log_.transaction_rows_since(earliest)
                if references is not None and "frames" in references[0]:
                    # Staged as frames (then rows by reference, if any): what the partition
                    # lacks (whole frames of the share, then the rows' tail).
                    frames = staged_refs.framed_reference_frames(
                        self._database.path, self._database.store.fs,
                        [r for r in references if "frames" in r], checked)  # fmt: skip
                    rows = [r for r in references if "frames" not in r]
                    batch = derivation.derive_all(rows) if rows else None
                    frames, batch = framed_rest(frames, batch, found.get(transaction_id, 0))
                    if frames or (batch is not None and batch.num_rows):
                        topic.publish_staged(frames, partition, transaction_id, batch)
                        found[transaction_id] = found.get(transaction_id, 0) + sum(
                            frame.record_count for frame in frames) + (
                            0 if batch is None else batch.num_rows)  # fmt: skip
                        republished += 1
                        failpoints.hit("recovery.after_republish")
                    targets.append((topic_id, partition))
                    continue
                if transaction_id in found:
                    # Whole, or a share cut into frames that lost its tail in the crash.
                    batch = self._recovered_batch(staged, references, derivation, moved)
                    # ``published_prefix``, from the one scan (it covers the record's time)
                    done = found[transaction_id] if cuttable(batch) else batch.num_rows
                    batch = batch.slice(min(batch.num_rows, done))
                else:
                    batch = self._recovered_batch(staged, references, derivation, moved)
                if batch.num_rows:
                    log_.publish_transactional([batch], transaction_id)
                    found[transaction_id] = found.get(transaction_id, 0) + batch.num_rows
                    republished += 1
                    failpoints.hit("recovery.after_republish")
                targets.append((topic_id, partition))
            log_end = row.get("log_end")
            if log_end is not None:
                self.staging.keep(transaction_id, [StagedBatch(log_end[0], 0, 0)])
            self._published.append((transaction_id, targets, log_end))
        derivation.clear()
        self.staging.release(set())  # files no record needs: aborted or undecided staging
        self.checkpoint()
        return republished

    def _recovered_batch(self, staged: StagedBatch | None, references: list | None,
                         derivation: staged_refs.Derivation,
                         moved: moved_refs.MovedSource | None = None):  # fmt: skip
        """A committed share read back: from the staging log or derived by reference (to
        staged files, or to the topic ranges it was moved from)."""
        if moved is not None:
            return moved_refs.derive(self._database, moved)
        if staged is None:
            assert references is not None
            return derivation.derive_all(references)
        return self.staging.read(staged)

    def _committed_rows(self) -> list[dict]:
        """Every committed transaction not checkpointed yet, in transaction id order:
        DuckDB's record rows and the staging log's commit records past the watermark
        (``storage.commit_log.scan``: a torn or damaged tail is not committed)."""
        result = tables.query_arrow(
            self._cursor,
            f"SELECT transaction_id, committed_at_us, items, offsets FROM {SCHEMA}.transactions "
            "ORDER BY transaction_id",
        )
        assert result is not None
        rows = result.to_pylist()
        mark = tables.query_arrow(
            self._cursor, f"SELECT file_number, position FROM {SCHEMA}.commit_log_watermark"
        )
        assert mark is not None
        marks = [(r["file_number"], r["position"]) for r in mark.to_pylist()]
        self._watermark = max([(0, 0), *marks])
        self.staging.start_after(self._watermark[0])
        # never a file number at or below the applied-through position's again
        self.staging.start_after(self.deltas.read_applied_through()[0])
        for number in self.staging.file_numbers():
            if number < self._watermark[0]:
                continue
            for found in commit_log.scan(self.staging.read_file(number)):
                if (number, found.end) <= self._watermark:
                    continue
                payload = json.loads(found.payload)
                assert len(payload["items"]) == len(found.batches), payload
                items = [
                    [topic_id, partition, number, position, length]
                    for (topic_id, partition), (position, length) in zip(
                        payload["items"], found.batches, strict=True
                    )
                ]
                items += payload.get("moved", [])  # [topic, partition, {"moved": ...}]
                rows.append(
                    {
                        "transaction_id": found.transaction_id,
                        "committed_at_us": payload["at"],
                        "items": json.dumps(items),
                        "offsets": json.dumps(payload["offsets"]),
                        "log_end": (number, found.end),
                        "deltas": payload.get("deltas"),
                    }
                )
        rows.sort(key=lambda row: row["transaction_id"])
        return rows

    def close_unrecovered(self) -> None:
        """The database's open failed (in ``recover``): close what is open, write nothing
        (no checkpoint: the staging log stays as it is for the next open)."""
        with contextlib.suppress(Exception):
            self.deltas.close()
        with contextlib.suppress(Exception):
            self.staging.close()
        with contextlib.suppress(Exception):
            self._cursor.close()

    def close(self) -> None:
        """Stop the checkpointer, run a last checkpoint, close staging and the cursor."""
        with self._wake:
            self._closing = True
            self._wake.notify_all()
            checkpointer = self._checkpointer
        if checkpointer is not None:
            checkpointer.join()
        self.deltas.close()  # applies what is durable (one in doubt stays for recovery)
        try:
            if self.deltas.pending:  # not applied: records and staging stay for recovery
                log.warning("%d commits' counter deltas are left to recovery", self.deltas.pending)
            else:
                self.checkpoint()  # the next open's recovery publishes what it keeps
        finally:
            self.staging.close()
            self._cursor.close()
