"""An autocommit topic write that spreads over many partitions: one sync, not one each.

A statement such as ``INSERT INTO TOPIC t SELECT ...`` of 5,000 messages from 2,000
producers lands in every partition of a 1000-partition topic. Appended share by share,
each partition runs its own group commit and ``fdatasync`` before it acknowledges: 1000
syncs per statement. Here such a statement commits the way a topic-only transaction
does (``engine.commit.Committer.commit_in_log``): its shares, each encoded as a frame,
and a commit record naming their partitions go to the staging log in one append, made
durable by the staging log's group-committed sync (the commit point); then each
partition gets its share as one frame tagged with the statement's transaction id,
without a sync. Recovery republishes from the staging log every share whose frame is
not in its partition, and the checkpoint syncs the partitions before it lets the
staging go (engine.commit). So the per-partition guarantees hold as for a plain append:

- dedup by producer id and seq_no is decided at publish time, under the partition's
  write lock, against its producer state, as a plain append decides it (a republish
  decides again against the state recovered from the partition, so a message is
  written once);
- the messages of one share stay in order in one frame; publishes are in commit order;
- after a crash the statement is wholly there (its record was synced: recovery
  publishes what is missing) or absent (no whole record: nothing was published,
  since publishing starts after the sync), never in some partitions only.

Used when the topic allows it (``TopicLog.spread_commit_allowed``: synced, neither
throttled nor splitting), no partition is given, and the write spreads over at least
``SPREAD_SHARES_MIN`` partitions with small shares (``SPREAD_SHARE_BYTES_MAX``);
otherwise the plain ``TopicLog.append``. Unlike a plain
append the whole statement is refused (nothing written) when one share cannot be
written (a fenced partition), because every share is checked before the commit point.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from engine.clock import Clock
from engine.commit import PastCommitPoint, PublishItem
from engine.interrupts import sigint_deferred
from engine.writes import plain_batch, plain_values
from storage import limits
from storage.errors import (
    LimitExceededError,
    QueryCanceledError,
    StorageIOError,
    TopicbaseError,
    UndefinedTopicError,
)
from storage.group_commit import GroupCommitter, Request
from storage.limits import SPREAD_SHARE_BYTES_MAX
from storage.record_batch import check_wire_batch
from storage.topic_log import Shares, TopicAppendResult, TopicLog

# A write over at least this many partitions commits through the staging log. The log
# costs one extra write of the data and one sync; the plain path one sync per partition
# (concurrent on ``storage.topic_log.APPEND_THREADS`` threads).
SPREAD_SHARES_MIN = 4
# ... if its shares average at most ``limits.SPREAD_SHARE_BYTES_MAX`` of message data.


def append_now(
    database: Any,
    topic_id: str,
    batch: pa.RecordBatch,
    partition: int | None,
    cancelled: Callable[[], bool] | None,
) -> TopicAppendResult:
    """Append an autocommit statement's batch to the topic (see the module doc)."""
    topic = database.topic_log(topic_id)
    if partition is not None or not topic.spread_commit_allowed():
        return topic.append(batch, partition, cancelled=cancelled)
    count = batch.num_rows
    if batch.column(1).null_count == count and batch.column(2).null_count == count:
        return topic.append_keyless(batch)  # keyless: combined with others' while busy
    targets = topic.route(batch)
    first = targets[0] if len(targets) else 0
    if len(targets) <= 1 or (targets == first).all() or not _spreads(batch, targets):
        return topic.append(batch, None, cancelled=cancelled, targets=targets)
    try:
        check_wire_batch(batch)  # every share is a part of it: none is over a limit
    except LimitExceededError:
        return topic.append(batch, None, cancelled=cancelled, targets=targets)
    shares = topic.shares(batch, targets)
    # Checked now, not at the publish (past the commit point it would fail for ever):
    # the whole batch once (schema, limits, codecs: each share is a part of it, and the
    # partitions share the topic's settings), and each partition's state.
    topic.partition(shares.partition_ids[0]).check_append(batch)
    for partition_id in shares.partition_ids:
        if not topic.partition_info(partition_id).active:  # split since: route again
            return topic.append(batch, None, cancelled=cancelled)
        topic.partition(partition_id).check_writable()
    if topic.ledger is not None and len(shares) >= topic.ledger.shares_min:
        if cancelled is not None and cancelled():  # before the commit point, as below
            raise QueryCanceledError("canceling statement due to user request")
        with sigint_deferred():  # the frame appended and its offsets reported, whole
            try:
                bases = topic.append_ledger(shares, cancelled)
            except StorageIOError:
                _check_topic_exists(database, topic_id)  # a DROP closed its ledger under it
                raise
        if bases is not None:
            return _ledger_result(shares, bases, batch.num_rows)
    return _commit_in_log(database, topic_id, shares, batch.num_rows, cancelled)


def _check_topic_exists(database: Any, topic_id: str) -> None:
    """Refuse with 42P01, as the staging path's commit does (``Committer``), a statement
    whose topic was dropped while it wrote: its ledger, closed by the DROP, refused the
    frame (nothing written)."""
    try:
        database.topic_log(topic_id)
    except UndefinedTopicError:
        raise UndefinedTopicError(
            f"topic {topic_id} was dropped while this statement wrote to it; nothing was "
            "committed"
        ) from None


def _ledger_result(shares: Shares, bases: list[int], count: int) -> TopicAppendResult:
    """Every message written by a ledger frame (the ledger path writes a statement only
    when no message is a duplicate): each message's partition and offset in the batch's
    order (a share's ``k``-th row at its base + ``k``)."""
    rows = shares.order  # the shares' rows, one share after another
    sizes = shares.counts
    firsts = np.cumsum(sizes) - sizes
    partitions = np.empty(count, dtype=np.int64)
    offsets = np.empty(count, dtype=np.int64)
    partitions[rows] = np.repeat(shares.partition_ids, sizes)
    offsets[rows] = np.repeat(np.asarray(bases, np.int64) - firsts, sizes) + np.arange(count)
    return TopicAppendResult(partitions, np.zeros(count, dtype=np.uint8), offsets)


def _spreads(batch: pa.RecordBatch, targets: np.ndarray) -> bool:
    """Whether the write reaches ``SPREAD_SHARES_MIN`` partitions or more with shares of
    at most ``SPREAD_SHARE_BYTES_MAX`` of data on average."""
    if len(targets) < SPREAD_SHARES_MIN:
        return False
    shares = len(np.unique(targets))
    data = batch.column(5)  # binary: its value offsets give the data's size
    offsets = np.frombuffer(data.buffers()[1], np.int32, len(data) + 1, data.offset * 4)
    data_bytes = int(offsets[-1] - offsets[0])
    return shares >= SPREAD_SHARES_MIN and data_bytes <= SPREAD_SHARE_BYTES_MAX * shares


def _commit_in_log(
    database: Any,
    topic_id: str,
    shares: Shares,
    count: int,
    cancelled: Callable[[], bool] | None,
) -> TopicAppendResult:
    """Commit the shares by one record in the staging log, publish them, and return each
    message's outcome in the batch's order. A cancel (or statement_timeout) requested
    before the commit point refuses the statement (57014), nothing written."""
    committer = database.committer
    transaction_id = committer.next_transaction_id()
    items = [PublishItem(topic_id, partition_id, piece) for partition_id, _, piece in shares]

    def validate() -> None:  # under the commit lock, just before the record's append
        if cancelled is not None and cancelled():
            raise QueryCanceledError("canceling statement due to user request")

    with sigint_deferred():  # from the commit point to the turn's end, whole
        slot, staged = committer.commit_in_log(transaction_id, items, {}, validate)
        results = committer.finish(slot, transaction_id, {}, staged)
    if any(r is None for r in results):  # finished after a refused allocation (``_finish_now``)
        raise PastCommitPoint(
            f"transaction {transaction_id} is committed and published, but its offsets "
            "could not be reported (an allocation was refused under the memory cap)"
        )
    # The shares' rows, one after another, are a permutation of the batch's rows.
    rows = shares.order
    partitions = np.empty(count, dtype=np.int64)
    status = np.empty(count, dtype=np.uint8)
    offsets = np.empty(count, dtype=np.int64)
    partitions[rows] = np.concatenate([r.partitions for r in results])  # type: ignore[union-attr]
    status[rows] = np.concatenate([r.status for r in results])  # type: ignore[union-attr]
    offsets[rows] = np.concatenate([r.offsets for r in results])  # type: ignore[union-attr]
    committer.catch_up()
    return TopicAppendResult(partitions, status, offsets)


# -- plain rows of many sessions' statements, one append ---------------------------------


def append_plain(database: Any, topic_id: str, columns: Sequence[str],
                 rows: Sequence[Sequence[Any]]) -> int | None:  # fmt: skip
    """Append an autocommit statement's plain rows (``data`` alone, every value bytes or
    text, no option, no RETURNING: the caller checked the statement) and return how many
    were written; None when they are not such rows or not for this way (the caller goes
    the usual way, ``writes.plain_batches`` then ``append_now``, which gives their errors).

    While the topic is busy, plain rows of many sessions' statements are combined into
    one batch and one append (``PlainCombiner``), so a statement skips its own batch, its
    own checks and its own turn in the storage's combiner (~35 % of a one-message
    statement's CPU over the wire at 16 clients). Only for a synced topic that is neither
    throttled nor split by autopartitioning (``spread_commit_allowed``: where a keyless
    batch goes to ``TopicLog.append_keyless`` anyway) and for at most
    ``limits.COMBINE_MESSAGES_MAX`` rows and ``limits.COMBINE_BYTES_MAX`` bytes of data."""
    if tuple(columns) != ("data",) or not rows or len(rows) > limits.COMBINE_MESSAGES_MAX:
        return None
    topic = database.topic_log(topic_id)
    if not topic.spread_commit_allowed():
        return None
    values = plain_values(rows)  # a lone surrogate is this statement's 22021, raised here
    if values is None or sum(map(len, values)) > limits.COMBINE_BYTES_MAX:
        return None
    with _COMBINERS_LOCK:
        combiner = _COMBINERS.get(topic)
        if combiner is None:
            combiner = _COMBINERS[topic] = PlainCombiner()
    return combiner.append(topic, values, database.clock)


# One combiner per open topic log (a dropped or closed topic's goes with it).
_COMBINERS: weakref.WeakKeyDictionary[TopicLog, PlainCombiner] = weakref.WeakKeyDictionary()
_COMBINERS_LOCK = threading.Lock()


class PlainCombiner:
    """Plain messages of concurrent autocommit statements appended to one topic together.

    A statement that finds at least ``limits.KEYLESS_JOIN_BUSY_APPENDS`` other statements
    of the topic in here queues its values (``storage.group_commit``: one thread at a time
    leads a round with everything queued); otherwise it appends alone, exactly as the
    usual way does (``TopicLog.append_keyless`` of its own plain batch), so a quiet topic
    (1, 2, 4 producers) is served as before. A round builds one plain batch of its
    statements' values in queue order (chunked at ``limits.COMBINED_MESSAGES_MAX``
    messages and ``limits.COMBINED_BYTES_MAX`` bytes), checks it as an append would
    (``PartitionLog.check_batch``) and appends it with ``TopicLog.append`` (routed once:
    keyless, so one partition and one frame). Each statement gets the count of its own
    rows written. Invariants: a statement returns only after the append that carried its
    rows returned, i.e. after their sync; a refused batch (a check before anything is
    written) is appended statement by statement, so each meets only its own outcome; a
    failing append fails exactly the statements whose rows were in it. Keyless messages
    have no producer state and no key, so each is stored as its own statement would have
    stored it; a session has one statement in flight, so its order holds."""

    def __init__(self) -> None:
        self._group = GroupCommitter(self._round)
        self._lock = threading.Lock()
        self._inside = 0  # statements in ``append`` now (alone or queued)
        self.rounds = 0  # combined rounds run (tests)

    def append(self, topic: TopicLog, values: list[bytes], clock: Clock) -> int:
        with self._lock:
            self._inside += 1
            busy = self._inside > limits.KEYLESS_JOIN_BUSY_APPENDS
        try:
            if busy:
                written: int = self._group.submit((topic, values, clock))
                return written
            return _alone(topic, values, clock)
        finally:
            with self._lock:
                self._inside -= 1

    def _round(self, requests: list[Request]) -> None:
        self.rounds += 1
        start = 0
        while start < len(requests):
            end, messages, size = start, 0, 0
            while end < len(requests):
                values = requests[end].payload[1]
                grown = size + sum(map(len, values))
                if end > start and (
                    messages + len(values) > limits.COMBINED_MESSAGES_MAX
                    or grown > limits.COMBINED_BYTES_MAX
                ):
                    break
                messages, size = messages + len(values), grown
                end += 1
            assert end > start, "every chunk holds at least one request"
            _append_chunk(requests[start:end])
            start = end


def _alone(topic: TopicLog, values: list[bytes], clock: Clock) -> int:
    """One statement's values appended as the usual way appends them."""
    batch = plain_batch(values, clock)
    assert batch is not None, "COMBINE_BYTES_MAX is far under PLAIN_DATA_BYTES_MAX"
    return topic.append_keyless(batch).written_count


def _append_chunk(chunk: list[Request]) -> None:
    """Append the chunk's values as one batch; each request's result its rows' count
    written, or the append's error. A batch refused before anything is written goes
    request by request (each request's own outcome)."""
    topic, _, clock = chunk[0].payload
    values = [value for request in chunk for value in request.payload[1]]
    try:  # nothing is written yet: a refusal here is the joined batch's
        batch = plain_batch(values, clock)
        assert batch is not None, "COMBINED_BYTES_MAX is far under PLAIN_DATA_BYTES_MAX"
        active = topic.active_partition_ids()
        if active:  # none: the append gives the error (the partitions' state is its)
            topic.partition(active[0]).check_batch(batch)
    except (TopicbaseError, pa.ArrowInvalid):
        for request in chunk:
            try:
                request.result = _alone(topic, request.payload[1], clock)
            except Exception as error:  # this statement's own outcome
                request.error = error
        return
    try:
        outcome = topic.append(batch)
    except Exception as error:  # the chunk's statements fail with it, alone
        for request in chunk:
            request.error = error
        return
    written = outcome.status == 0
    row = 0
    for request in chunk:
        count = len(request.payload[1])
        request.result = int(np.count_nonzero(written[row : row + count]))
        row += count
    assert row == batch.num_rows
