"""Running ``ReadRecords``: topic messages into an Arrow table for one statement.

A peek reads from ``from_offset`` (default: each partition's start) and
commits nothing. A consumer read starts where the transaction's earlier read
of that partition ended, else where this transaction moved the consumer's
offset (``ALTER ... SET OFFSETS``, ``COMMIT OFFSETS``), else at the committed
offset (else the partition start), skips what ``read_from``/``max_lag``
exclude, and records the range read in the transaction. ``wait`` long-polls
when nothing is there yet.

How much one read returns (the rule the README states):

- A **peek without** ``max_messages``/``max_bytes`` is read whole, up to the
  statement's cut, as a plain relation name is (``planner.relations``): up to
  the single-read limit (``limits.READ_MESSAGES_MAX`` messages,
  ``limits.READ_BYTES_MAX`` bytes) and refused with 54000 beyond it, never cut
  short. ``stream_records`` reads a whole cut of any size in bounded batches.
- A **consumer read** is a poll: at most ``max_messages`` and ``max_bytes`` (defaults
  ``limits.POLL_MESSAGES_MAX_DEFAULT`` and ``limits.POLL_BYTES_MAX_DEFAULT``);
  what is left waits for the next read.
- A **consumer poll** is fair across polls, round robin from where that
  consumer's last read stopped (``RoundRobin``, kept in memory per topic and
  consumer): a poll fills its budgets from the partition after the last one the
  previous poll read, partition after partition, so a partition flooded with
  writes cannot starve the others, and a poll reads whole stretches of few
  partitions (a frame is read and checked whole: splitting a small budget over
  every partition would read a frame per partition for a few messages each).
  A member with leases takes its own partitions in the same turn.
- A **bounded peek** (no consumer, so no memory of earlier reads) is fair
  within the read: the message budget is shared max-min fairly among the
  partitions that have data (each gets what it has, up to an equal level; the
  units left over go one each, round robin from partition ``sum(start offsets)
  mod n``), and the byte budget in equal parts of what is left.

Results hold each partition's messages in offset order, partitions in the
order the plan lists them.

Parents before children (autopartitioning): a consumer reads a split partition
to its end before any of its children (``readable_partitions``): a child is
polled only once every ancestor still in the topic is inactive and this
consumer's position in it (this transaction's read or move, else the committed
offset) has reached its end; a member whose lease holds a child waits for
whoever holds the parent. A bounded peek drops what it read of a child whose
ancestor it did not read to the cut, and a whole peek lists parents first (lower
ids), so a producer's messages come out in order there too. The Spark source
applies the same rule to ``PartitionBounds.parent`` in its offsets.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import numpy as np
import pyarrow as pa

from engine.clock import Clock
from engine.topic_relation import SCHEMA, relation_batch
from engine.transaction import Transaction
from planner.operations import ReadRecords
from storage import limits
from storage.bulk_scan import ScannedFrames, scan_many
from storage.codecs import decode_column
from storage.errors import InvalidParameterValueError, LimitExceededError, QueryCanceledError
from storage.frame_read import SMALL_SLICE_ROWS, FrameSlice, decode_small
from storage.ledger import LedgerWhole
from storage.topic_log import TopicLog

CANCEL_CHECK_S = 0.1
# What ``stream_records`` holds at a time: one storage read of one partition.
STREAM_BATCH_MESSAGES = 65_536
STREAM_BATCH_BYTES = 16 * 1024 * 1024
# A consumer poll reads its partitions into one buffer (``storage.bulk_scan``) when it
# takes at most this many messages per partition on average (so its frames are likely
# small: a poll over many partitions holding a few messages each), from at least
# ``SCAN_PARTITIONS_MIN`` partitions.
SCAN_ROWS_PER_PARTITION = 4 * SMALL_SLICE_ROWS
SCAN_PARTITIONS_MIN = 2


@dataclass(frozen=True)
class ReadBounds:
    """How much one read may return, and whether stopping short is an error (54000)."""

    messages: int
    bytes: int
    complete: bool


def read_bounds(operation: ReadRecords) -> ReadBounds:
    """The bounds of ``operation``'s read (see the module docstring for the rule)."""
    options = operation.options
    max_messages, max_bytes = options.get("max_messages"), options.get("max_bytes")
    if operation.consumer is None and max_messages is None and max_bytes is None:
        return ReadBounds(limits.READ_MESSAGES_MAX, limits.READ_BYTES_MAX, complete=True)
    return ReadBounds(
        int(max_messages or limits.POLL_MESSAGES_MAX_DEFAULT),
        int(max_bytes or limits.POLL_BYTES_MAX_DEFAULT),
        complete=bool(options.get("complete")),
    )


@dataclass
class ReadProgress:
    """Messages and bytes the running statement has read from topics so far, for a
    front's progress display. Written by the reading thread, read by any (plain ints)."""

    messages: int = 0
    bytes: int = 0

    def reset(self) -> None:
        self.messages = self.bytes = 0


# The progress of the statement running in this thread (set by the session around it).
CURRENT_PROGRESS: contextvars.ContextVar[ReadProgress | None] = contextvars.ContextVar(
    "topicbase_read_progress", default=None
)


def _count(messages: int, size: int) -> None:
    progress = CURRENT_PROGRESS.get()
    if progress is not None:
        progress.messages += messages
        progress.bytes += size


class RoundRobin:
    """Where each consumer's (or member's) last poll stopped: its next poll starts at the
    partition after that one. Memory only (a restart begins again at the first partition: fairness
    needs no durability). Thread-safe."""

    def __init__(self) -> None:
        self._last: dict[tuple[str, str, str], int] = {}  # (topic id, consumer, member)
        self._lock = threading.Lock()

    def order(self, key: tuple[str, str, str], partitions: list[int]) -> list[int]:
        with self._lock:
            last = self._last.get(key)
        if last is None:
            return partitions
        return [p for p in partitions if p > last] + [p for p in partitions if p <= last]

    def note(self, key: tuple[str, str, str], partition: int) -> None:
        with self._lock:
            self._last.pop(key, None)  # re-inserted last: the dict is in poll order
            self._last[key] = partition
            if len(self._last) > limits.ROUND_ROBIN_POSITIONS_MAX:
                del self._last[next(iter(self._last))]  # the least recently polled


def read_records(
    operation: ReadRecords,
    topic: TopicLog,
    committed: Mapping[int, int | None],
    transaction: Transaction,
    clock: Clock,
    cancelled: Callable[[], bool] = lambda: False,
    publish_gate: AbstractContextManager[Any] | None = None,
    round_robin: RoundRobin | None = None,
    columns: tuple[str, ...] | None = None,
    ranges: list[tuple[int, int, int]] | None = None,
) -> pa.Table:
    """Read the operation's partitions; ``committed`` maps partition -> committed offset.

    A ``wait`` stops early, with 57014, when ``cancelled()`` turns true (checked
    whenever the topic's readers are woken, and at least every 100 ms). ``columns``:
    the relation's columns the caller will use (``SCHEMA``'s names), None for all; the
    table returned may then hold only those (``_relation``). ``ranges``, if given, gets
    the (partition, start, end) offset ranges the table's rows are, in row order, or
    stays empty when the read does not know them (``engine.moved_refs``).
    """
    options = operation.options
    starts = _starts(operation, topic, committed, transaction, clock)
    if operation.consumer is not None:

        def position(partition_id: int) -> int:
            if partition_id in starts:
                return starts[partition_id]
            return _start(operation, topic, partition_id, committed, transaction, clock)

        if topic.has_lineage():  # (else every partition is readable)
            readable = set(readable_partitions(topic, list(starts), position))
            starts = {p: start for p, start in starts.items() if p in readable}
    wait: timedelta = options.get("wait") or timedelta(0)
    gate = publish_gate if publish_gate is not None else contextlib.nullcontext()
    batches = _read_all(operation, topic, starts, gate, round_robin)
    if not batches and wait > timedelta(0):
        deadline = clock.monotonic_s() + wait.total_seconds()
        while not batches:
            if cancelled():
                raise QueryCanceledError("canceling statement due to user request")
            remaining = deadline - clock.monotonic_s()
            if remaining <= 0:
                break
            if topic.wait_for_any(starts, min(remaining, CANCEL_CHECK_S)):
                batches = _read_all(operation, topic, starts, gate, round_robin)
    if operation.consumer is not None:
        _record_ranges(operation, starts, batches, committed, transaction)
    if ranges is not None and isinstance(batches, list):
        ranges.extend((p, piece.first_offset, piece.next_offset) for p, piece in batches)
    return _relation(batches, decode=bool(options.get("decode", True)), columns=columns)


# Relation columns stored as they are in a frame (``WIRE_SCHEMA``): a read that needs only
# these takes them from the frames' wire batches, without building the others.
_STORED_COLUMNS = frozenset(
    {"seq_no", "producer_id", "message_group_id", "created_at", "data", "metadata"}
)


def _relation(
    slices: list[tuple[int, FrameSlice]] | ScannedFrames | LedgerWhole,
    *,
    decode: bool,
    columns: tuple[str, ...] | None = None,
) -> pa.Table:
    """The topic relation of a read's frame slices, in their order.

    The read is decoded here, once for all its partitions: each run of small slices
    (``SMALL_SLICE_ROWS``; a read over many partitions holding a few messages each)
    becomes one relation batch, its partition column repeated per slice, instead of a
    decode, a concatenation and a ``relation_batch`` per partition. A large slice is
    decoded alone, without copying its messages. A read into one buffer
    (``ScannedFrames``, small slices only) is one relation batch.

    With ``columns`` all stored ones (``_STORED_COLUMNS``; e.g. ``data`` alone, a
    consumer's usual projection) and a read into one buffer, the table holds just those
    columns, gathered from the buffer (``_scanned_columns``); with every slice large,
    just those columns, taken zero-copy from each frame's wire batch (``_stored_columns``):
    none of the offsets, partitions, write times and codec labels are built (a fifth
    of the cost of the whole relation for 1000 messages of 1 KiB). Otherwise it is the
    whole relation, whatever ``columns`` says.
    """
    if isinstance(slices, LedgerWhole):
        return _whole_relation(slices, decode=decode, columns=columns)
    if (
        columns is not None
        and _STORED_COLUMNS.issuperset(columns)
        and not isinstance(slices, ScannedFrames)
        and all(piece.header.record_count > SMALL_SLICE_ROWS for _, piece in slices)
    ):
        return _stored_columns(slices, columns, decode=decode)
    if isinstance(slices, ScannedFrames):
        if not len(slices):
            return SCHEMA.empty_table()
        if columns is not None and _STORED_COLUMNS.issuperset(columns):
            return _scanned_columns(slices, columns, decode=decode)
        partitions = np.repeat(slices.partitions, slices.rows)
        batch = relation_batch(0, slices.decode(), decode=decode, partitions=partitions)
        return pa.Table.from_batches([batch], schema=SCHEMA)
    batches: list[pa.RecordBatch] = []
    run: list[tuple[int, FrameSlice]] = []

    def flush() -> None:
        combined = decode_small([piece for _, piece in run])
        partitions = np.repeat(
            np.array([p for p, _ in run], dtype=np.int32),
            np.array([piece.rows for _, piece in run], dtype=np.int64),
        )
        batches.append(relation_batch(0, combined, decode=decode, partitions=partitions))
        run.clear()

    for partition_id, piece in slices:
        if piece.header.record_count <= SMALL_SLICE_ROWS:
            run.append((partition_id, piece))
            continue
        if run:
            flush()
        batches.append(relation_batch(partition_id, piece.decode(), decode=decode))
    if run:
        flush()
    return pa.Table.from_batches(batches, schema=SCHEMA)


def _whole_relation(
    whole: LedgerWhole, *, decode: bool, columns: tuple[str, ...] | None
) -> pa.Table:
    """The relation of whole ledger frames: a batch a frame, zero-copy from its body.
    With ``columns`` all stored ones, just those (``_stored_columns``' way); else the
    whole relation, partitions repeated per share."""
    if columns is not None and _STORED_COLUMNS.issuperset(columns):
        assert len(set(columns)) == len(columns)
        schema = _columns_schema(columns)
        return pa.Table.from_batches(
            [pa.RecordBatch.from_arrays(_wire_arrays(wire, columns, decode=decode), schema=schema)
             for wire in whole.wire_batches()], schema)  # fmt: skip
    batches = [relation_batch(0, batch, decode=decode, partitions=partitions)
               for partitions, batch in whole.read_batches()]  # fmt: skip
    return pa.Table.from_batches(batches, schema=SCHEMA)


def _scanned_columns(
    scanned: ScannedFrames, columns: tuple[str, ...], *, decode: bool
) -> pa.Table:
    """``_stored_columns`` of a read into one buffer: the relation's ``columns`` (stored
    ones, each named once) of all its slices, in ``columns``' order, gathered from the
    buffer; the other columns are not built (a 20,000-message poll of ``data`` over
    1000 partitions: no producer ids, metadata, seq_nos, offsets or partitions)."""
    assert len(set(columns)) == len(columns) and _STORED_COLUMNS.issuperset(columns)
    wanted = columns
    if decode and "data" in columns and "codec" not in columns:
        wanted = (*columns, "codec")
    arrays = _wire_arrays(scanned.decode_stored(wanted), columns, decode=decode)
    schema = _columns_schema(columns)
    return pa.Table.from_batches([pa.RecordBatch.from_arrays(arrays, schema=schema)], schema)


def _stored_columns(
    slices: list[tuple[int, FrameSlice]], columns: tuple[str, ...], *, decode: bool
) -> pa.Table:
    """The relation's ``columns`` (stored ones, each named once) of large slices, in
    ``columns``' order: each a zero-copy column of the slice's wire batch; ``data``
    decoded (``decode_column``: as it is when every message is raw)."""
    assert len(set(columns)) == len(columns) and _STORED_COLUMNS.issuperset(columns)
    schema = _columns_schema(columns)
    batches = []
    for _, piece in slices:
        arrays = _wire_arrays(piece.wire_batch(), columns, decode=decode)
        batches.append(pa.RecordBatch.from_arrays(arrays, schema=schema))
    return pa.Table.from_batches(batches, schema=schema)


@functools.lru_cache(maxsize=64)
def _columns_schema(columns: tuple[str, ...]) -> pa.Schema:
    """The relation's schema of just ``columns``, in that order: made once per column
    tuple (a consumer's projection repeats it every poll; building it costs ~4 us, a
    pa.Schema is immutable, so the one made serves every read and thread)."""
    return pa.schema([SCHEMA.field(name) for name in columns])


def _wire_arrays(wire: Any, columns: tuple[str, ...], *, decode: bool) -> list[Any]:
    """``columns`` of a wire batch (or table), in order; ``data`` decoded by its ``codec``
    column when ``decode``."""
    arrays = []
    for name in columns:
        array = wire.column(name)
        if name == "data" and decode:
            array = decode_column(wire.column("codec"), array)
        arrays.append(array)
    return arrays


def stream_records(
    operation: ReadRecords,
    topic: TopicLog,
    clock: Clock,
    publish_gate: AbstractContextManager[Any] | None = None,
    *,
    batch_messages: int = STREAM_BATCH_MESSAGES,
    batch_bytes: int = STREAM_BATCH_BYTES,
) -> pa.RecordBatchReader:
    """A peek at a whole cut of any size, as a reader of topic-relation batches.

    The cut (every partition's end) is taken now, under ``publish_gate``; batches
    are read lazily, one storage read of at most ``batch_messages`` messages and
    about ``batch_bytes`` bytes at a time, partition after partition. No
    single-read limit applies: this is the door for ``COPY TOPIC t TO STDOUT``
    and for a DuckDB query over a whole topic (DuckDB scans a registered reader
    batch by batch). A peek that names ``max_messages``/``max_bytes`` is bounded
    and fair as ``read_records`` is; a consumer read is a poll, never a stream.
    """
    if operation.consumer is not None:
        raise InvalidParameterValueError(
            "a consumer read is a poll bounded by max_messages/max_bytes; it cannot be streamed"
        )
    decode = bool(operation.options.get("decode", True))
    transaction = Transaction(explicit=False)  # a peek records nothing in it
    starts = {p: _start(operation, topic, p, {}, transaction, clock) for p in operation.partitions}
    gate = publish_gate if publish_gate is not None else contextlib.nullcontext()
    if not read_bounds(operation).complete:
        table = _relation(_read_all(operation, topic, starts, gate), decode=decode)
        return pa.RecordBatchReader.from_batches(SCHEMA, table.to_batches())
    with gate:
        ends = {p: topic.partition(p).end_offset for p in starts}

    def batches() -> Iterator[pa.RecordBatch]:
        for partition_id, start in starts.items():
            position, end = start, ends[partition_id]
            while position < end:
                result = topic.partition(partition_id).read(
                    position, max_messages=min(batch_messages, end - position),
                    max_bytes=batch_bytes,
                )  # fmt: skip
                if not result.batches:
                    break  # retention removed the rest of the range meanwhile
                for batch in result.batches:
                    batch = _within_cut(batch, end)
                    if batch.num_rows == 0:
                        position = end
                        break
                    _count(batch.num_rows, batch.nbytes)
                    yield relation_batch(partition_id, batch, decode=decode)
                    position = batch.column("offset")[-1].as_py() + 1

    return pa.RecordBatchReader.from_batches(SCHEMA, batches())


def _starts(
    operation: ReadRecords,
    topic: TopicLog,
    committed: Mapping[int, int | None],
    transaction: Transaction,
    clock: Clock,
) -> dict[int, int]:
    """``_start`` of every partition of the operation. A consumer read without
    ``read_from``/``max_lag`` (a poll over 1000 partitions) takes the same steps
    inline, without a call and the option lookups per partition."""
    options = operation.options
    consumer = operation.consumer
    if consumer is None or options.get("read_from") is not None or "max_lag" in options:
        return {
            p: _start(operation, topic, p, committed, transaction, clock)
            for p in operation.partitions
        }
    reads, moves, topic_id = transaction.reads, transaction.offset_moves, operation.topic_id
    if not reads and not moves:  # the usual poll: each at its committed offset or the start
        first = topic.start_offsets(operation.partitions)
        get = committed.get
        return {p: at if (at := get(p) or 0) >= start else start for p, start in first.items()}
    starts = {}
    for partition_id in operation.partitions:
        key = (topic_id, consumer, partition_id)
        earlier = reads.get(key)
        if earlier is not None:
            start = earlier.end
        else:
            start = moves.get(key)
            if start is None:
                start = committed.get(partition_id) or 0
        starts[partition_id] = max(start, topic.partition(partition_id).start_offset)
    return starts


def _start(
    operation: ReadRecords,
    topic: TopicLog,
    partition_id: int,
    committed: Mapping[int, int | None],
    transaction: Transaction,
    clock: Clock,
) -> int:
    partition = topic.partition(partition_id)
    options = operation.options
    if operation.consumer is None:
        start = options.get("from_offset")
        start = partition.start_offset if start is None else int(start)
    else:
        key = (operation.topic_id, operation.consumer, partition_id)
        start = transaction.read_position(key)
        if start is None:
            start = transaction.offset_moves.get(key)
        if start is None:
            start = committed.get(partition_id) or 0
    start = max(start, partition.start_offset)
    read_from = options.get("read_from")
    if read_from is not None:
        start = max(start, partition.offset_for_time(_to_us(read_from)))
    max_lag = options.get("max_lag")
    if max_lag is not None:
        horizon = clock.now_us() - int(max_lag.total_seconds() * 1_000_000)
        start = max(start, partition.offset_for_time(horizon))
    return start


def _to_us(value: Any) -> int:
    if isinstance(value, datetime):
        return int(value.timestamp() * 1_000_000)
    if isinstance(value, int):
        return value * 1_000_000
    raise InvalidParameterValueError(f"read_from must be a Timestamp or seconds, not {value!r}")


def _read_all(
    operation: ReadRecords,
    topic: TopicLog,
    starts: dict[int, int],
    publish_gate: AbstractContextManager[Any],
    round_robin: RoundRobin | None = None,
) -> list[tuple[int, FrameSlice]] | ScannedFrames | LedgerWhole:
    """Read the partitions up to one consistent cut of their end offsets, fairly: a
    consumer poll in its turn (``round_robin``), anything else shared within the read.

    A consumer poll standing at the edges of the oldest frames of the topic's ledger
    that it has not read (a consumer keeping up with statements spread over many
    partitions) takes those frames whole, oldest first, within its budgets
    (``TopicLog.whole_frames``): their rows are read as the frames hold them, frame after
    frame (each partition's in offset order, partitions interleaved by frame rather than
    grouped), with no per-partition plan, copy or slice; the round robin is not moved.

    The cut is taken under ``publish_gate``, which transactional publishes
    hold while they append to all their partitions, so a read sees a
    transaction's messages in every partition or in none. A consumer poll over many
    partitions of small frames reads them into one buffer (``_scan_in_turn``): the
    slices ``_read_in_turn`` would read, as arrays.
    """
    bounds = read_bounds(operation)
    catch_up: dict[int, int] | None = None
    if (operation.consumer is not None and round_robin is not None and not bounds.complete
            and limits.LEDGER_WHOLE_FRAMES_READ):  # fmt: skip
        whole = topic.whole_frames(starts, bounds.messages, bounds.bytes)
        if whole is not None:  # (no cut needed: each ledger frame is one statement's, whole)
            _count(whole.message_count, whole.size)
            return whole
        # A consumer behind the frames the ledger still holds reads up to their edges,
        # every partition together, then takes them whole (not the copies to the end).
        catch_up = topic.ledger_catch_up_cut(starts)
    with publish_gate:
        # without the settle of the topic's ledger: a poll into one buffer reads its rows
        # where the ledger holds them (``scan_many``); a partition read settles first
        ends = topic.reader_ends(starts)
    if catch_up is not None:
        for partition_id, edge in catch_up.items():
            ends[partition_id] = min(ends[partition_id], edge)
    positions = dict(starts)
    if operation.consumer is not None and round_robin is not None:
        # per member too: members take their own partitions in their own turn
        key = (operation.topic_id, operation.consumer, str(operation.options.get("member")))
        order = round_robin.order(key, list(starts))
        scanned = _scan_in_turn(topic, order, positions, ends, bounds)
        if scanned is not None:
            round_robin.note(key, int(scanned.partitions[-1]))
            _check_complete(operation, bounds, positions, ends)
            return scanned.in_order(list(starts))
        read = _read_in_turn(topic, order, positions, ends, bounds)
        if read:
            round_robin.note(key, list(read)[-1])
    else:
        read = _read_fair(topic, _rotated(list(starts), starts), positions, ends, bounds)
        if not bounds.complete:
            done = set(readable_partitions(topic, list(read), _peek_position(positions, ends)))
            read = {p: batches for p, batches in read.items() if p in done}
    _check_complete(operation, bounds, positions, ends)
    return [(p, piece) for p in starts for piece in read.get(p, ())]


def _check_complete(
    operation: ReadRecords, bounds: ReadBounds, positions: dict[int, int], ends: dict[int, int]
) -> None:
    """A read that must not stop short (``bounds.complete``) refuses to, with 54000."""
    if bounds.complete and any(positions[p] < ends[p] for p in positions):
        raise LimitExceededError(
            f"topic {operation.topic} holds more than one read may return "
            f"({bounds.messages} messages, {bounds.bytes} bytes); read it in ranges with "
            "FROM TOPIC ... WITH (partition = ..., from_offset = ..., max_messages = ...)"
        )


def readable_partitions(
    topic: TopicLog, partitions: list[int], position: Callable[[int], int]
) -> list[int]:
    """Those of ``partitions`` a reader may read now: every ancestor still in the topic
    is inactive (split) and ``position(ancestor)`` has reached its end. The one rule of
    parent-before-child order for every reader; ``partitions`` keep their order."""
    if not topic.has_lineage():
        return list(partitions)  # no partition has an ancestor: every one is readable
    present = set(topic.partition_ids())
    readable = []
    for partition_id in partitions:
        parent = topic.partition_info(partition_id).parent
        for _ in range(len(present) + 1):
            if parent is None or parent not in present:
                readable.append(partition_id)
                break
            info = topic.partition_info(parent)
            if info.active or position(parent) < topic.partition(parent).end_offset:
                break
            parent = info.parent
    return readable


def _peek_position(positions: dict[int, int], ends: dict[int, int]) -> Callable[[int], int]:
    """A bounded peek's position in an ancestor: where its read stopped when it read
    the ancestor (its end if that reached the cut); an ancestor it did not read counts
    as read (the peek chose its partitions)."""

    def position(partition_id: int) -> int:
        if partition_id not in positions:
            return 2**63 - 1
        if positions[partition_id] >= ends[partition_id]:
            return 2**63 - 1  # read to the cut: later writes cannot reach an inactive one
        return positions[partition_id]

    return position


def _rotated(partitions: list[int], starts: dict[int, int]) -> list[int]:
    """``partitions`` starting at index ``sum(start offsets) mod n``: the round robin."""
    if not partitions:
        return partitions
    first = sum(starts.values()) % len(partitions)
    return partitions[first:] + partitions[:first]


def _scan_in_turn(
    topic: TopicLog,
    order: list[int],
    positions: dict[int, int],
    ends: dict[int, int],
    bounds: ReadBounds,
) -> ScannedFrames | None:
    """``_read_in_turn`` into one buffer (``storage.bulk_scan``), or None when that path
    does not apply (few partitions, many messages each, or anything ``scan_many``
    leaves to the partition reads; then nothing was read and ``positions`` are as
    given). The plan is ``_read_in_turn``'s: partition after partition in ``order``,
    each taking what it holds below the cut, up to what is left of the message budget.
    ``scan_many`` applies only when the byte budget stops no partition, so exactly
    those messages are read, and ``positions`` advance as ``_read_in_turn``'s would."""
    messages = bounds.messages
    if messages <= 0 or bounds.bytes <= 0:
        return None
    plan = []
    for partition_id in order:
        available = ends[partition_id] - positions[partition_id]
        if available > 0:
            wanted = min(messages, available)
            plan.append((partition_id, topic.partition(partition_id), positions[partition_id],
                         wanted))  # fmt: skip
            messages -= wanted
            if messages <= 0:
                break
    taken = bounds.messages - messages
    if len(plan) < SCAN_PARTITIONS_MIN or taken > SCAN_ROWS_PER_PARTITION * len(plan):
        return None
    scanned = scan_many(plan, bounds.bytes)
    if scanned is None:
        return None
    assert scanned.message_count == taken, (scanned.message_count, taken)
    positions.update(scanned.next_offsets)
    _count(scanned.message_count, scanned.size)
    return scanned


def _read_in_turn(
    topic: TopicLog,
    order: list[int],
    positions: dict[int, int],
    ends: dict[int, int],
    bounds: ReadBounds,
) -> dict[int, list[FrameSlice]]:
    """Fill the budgets partition after partition in ``order``; ``positions`` advance.
    The result's keys are in the order read (its last is where this poll stopped)."""
    read: dict[int, list[FrameSlice]] = {}
    messages, budget = bounds.messages, bounds.bytes
    for partition_id in order:
        while messages > 0 and budget > 0 and positions[partition_id] < ends[partition_id]:
            wanted = min(messages, ends[partition_id] - positions[partition_id])
            taken, taken_bytes = _take(topic, partition_id, positions, ends, read, wanted, budget)
            messages, budget = messages - taken, budget - taken_bytes
        if messages <= 0 or budget <= 0:
            break
    return read


def _read_fair(
    topic: TopicLog,
    order: list[int],
    positions: dict[int, int],
    ends: dict[int, int],
    bounds: ReadBounds,
) -> dict[int, list[FrameSlice]]:
    """Read with the budgets shared fairly; ``positions`` advance to where each stopped.

    In rounds: each round shares what is left of both budgets among the partitions
    still below the cut (a partition's byte share grows by what earlier ones in the
    round left unused). Usually one round reads everything it may; a partition its
    byte share stopped early gets another. Every round moves some position forward
    or empties a budget, so the rounds end.
    """
    read: dict[int, list[FrameSlice]] = {}
    messages, budget = bounds.messages, bounds.bytes
    while messages > 0 and budget > 0:
        wanting = [(p, ends[p] - positions[p]) for p in order if positions[p] < ends[p]]
        if not wanting:
            break
        shares = fair_shares(wanting, messages)
        takers = [p for p, _ in wanting if shares[p] > 0]
        for index, partition_id in enumerate(takers):
            if budget <= 0:
                break
            byte_share = max(1, budget // (len(takers) - index))
            taken, taken_bytes = _take(
                topic, partition_id, positions, ends, read, shares[partition_id], byte_share
            )
            messages, budget = messages - taken, budget - taken_bytes
    return read


def _take(
    topic: TopicLog,
    partition_id: int,
    positions: dict[int, int],
    ends: dict[int, int],
    read: dict[int, list[FrameSlice]],
    max_messages: int,
    max_bytes: int,
) -> tuple[int, int]:
    """One storage read of ``partition_id`` from its position, trimmed to the cut, added
    to ``read`` as frame slices (decoded later, with every partition's: ``_relation``);
    the position advances (to the cut when nothing is left below it). Returns the
    messages and bytes taken (bytes: the frames' bytes, prorated for a partial frame)."""
    # No settle when the rows asked for are all in the log's own segments (a consumer
    # catching up): the rows past them stay for the copier.
    result = topic.partition(partition_id).read_frames(
        positions[partition_id], max_messages=max_messages, max_bytes=max_bytes, settle=False
    )
    slices, end = result.slices, ends[partition_id]
    if slices and result.next_offset <= end:
        # The usual case: the read stopped below the cut, so every slice is within it.
        taken, taken_bytes = result.message_count, result.size
        read.setdefault(partition_id, []).extend(slices)
        positions[partition_id] = result.next_offset
        _count(taken, taken_bytes)
        return taken, taken_bytes
    taken = taken_bytes = 0
    if not slices:
        positions[partition_id] = end  # nothing left below the cut
    for piece in slices:
        # Retention may have moved the log start under the read, which then read from the
        # new start: the cut still bounds what this read sees.
        kept = piece.below(end)
        if kept is None:
            positions[partition_id] = end
            break
        read.setdefault(partition_id, []).append(kept)
        positions[partition_id] = kept.next_offset
        taken, taken_bytes = taken + kept.rows, taken_bytes + kept.size
    _count(taken, taken_bytes)
    return taken, taken_bytes


def _within_cut(batch: pa.RecordBatch, end: int) -> pa.RecordBatch:
    """``batch`` without offsets at or past ``end``. A read asks storage for no more
    than the cut holds, but retention may move the log start under it, and storage then
    reads from the new start: the cut still bounds what this read sees."""
    offsets = batch.column("offset")
    if offsets[-1].as_py() < end:
        return batch
    return batch.slice(0, max(0, end - offsets[0].as_py()))


def fair_shares(demands: list[tuple[int, int]], budget: int) -> dict[int, int]:
    """Max-min fair shares of ``budget`` among ``(partition, messages available)``.

    Every partition gets what it has up to a common level; the few units left
    over go one each to the partitions that have more, in the order given (the
    round robin's order). Pure; the shares sum to ``min(budget, total demand)``.
    """
    total = sum(demand for _, demand in demands)
    if total <= budget:
        return dict(demands)
    low, high = 0, max(demand for _, demand in demands)
    while low < high:  # the highest level whose capped demands fit the budget
        middle = (low + high + 1) // 2
        if sum(min(demand, middle) for _, demand in demands) <= budget:
            low = middle
        else:
            high = middle - 1
    shares = {p: min(demand, low) for p, demand in demands}
    left = budget - sum(shares.values())
    for partition_id, demand in demands:
        if left <= 0:
            break
        if demand > low:
            shares[partition_id] += 1
            left -= 1
    return shares


def _record_ranges(
    operation: ReadRecords,
    starts: dict[int, int],
    slices: list[tuple[int, FrameSlice]] | ScannedFrames | LedgerWhole,
    committed: Mapping[int, int | None],
    transaction: Transaction,
) -> None:
    assert operation.consumer is not None
    ends: dict[int, int] = {}  # the partitions read: where each read stopped
    if isinstance(slices, ScannedFrames | LedgerWhole):
        for partition_id, next_offset in slices.next_offsets.items():
            ends[partition_id] = max(starts[partition_id], next_offset)
    else:
        for partition_id, piece in slices:
            ends[partition_id] = max(ends.get(partition_id, starts[partition_id]),
                                     piece.next_offset)  # fmt: skip
    if not transaction.reads and not transaction.offset_moves:
        # The transaction's first read (a poll): a partition moves when it was read or its
        # start is not where it was committed (retention passed it); not the many others.
        get = committed.get
        moved = {p for p, end in ends.items() if end != starts[p]}
        moved.update([p for p, start in starts.items() if start != (get(p) or 0)])
        for partition_id in [p for p in starts if p in moved]:
            key = (operation.topic_id, operation.consumer, partition_id)
            start = starts[partition_id]
            transaction.record_read(key, get(partition_id), start, ends.get(partition_id, start))
        return
    for partition_id, start in starts.items():
        ends.setdefault(partition_id, start)
        key = (operation.topic_id, operation.consumer, partition_id)
        if (
            ends[partition_id] == start
            and transaction.read_position(key) is None
            and key not in transaction.offset_moves
            and (committed.get(partition_id) or 0) == start
        ):
            continue  # nothing read and nothing skipped: no offset to move
        # A read after this transaction moved the offset continues from the move: the
        # range read now carries it (its end is where the offset goes at COMMIT).
        transaction.offset_moves.pop(key, None)
        transaction.record_read(key, committed.get(partition_id), start, ends[partition_id])
