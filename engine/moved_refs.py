"""Topic writes committed by reference to the topic ranges they were read from.

A move (``INSERT INTO TOPIC b SELECT data FROM TOPIC a ...`` in an explicit transaction)
writes to ``b`` messages whose only given column is the data of a range of ``a``'s
messages. Its share of ``b`` is a pure function of those ranges and one timestamp:
``moved_batch`` (``engine.writes.build_batches`` of the data alone, with a clock stopped
at ``at``: every other column is its default). A topic-only commit
(``Committer.commit_in_log``) then stages no copy of the data in the staging log: its
commit record names the ranges and ``at`` (``MovedSource.to_json``), and recovery derives
the same batch again (``derive``) from ``a``'s partitions. The data goes to the disk once
(``b``'s partition) instead of twice (the staging log, then the partition).

What makes it sound (each checked by ``usable`` under the commit lock, right before the
record is appended, or the share is staged as a copy as before):

- every range is *durable* in its partition before the commit point: below the
  partition's ``durable_end`` (synced since the partition was opened; ``make_durable``
  syncs a partition that is not, before the commit lock, unless its fsync policy is
  ``never``); a partition log is append-only and a sync covers the whole of it, so those
  offsets survive any crash;
- every range is still *present* (not below the partition's start), and stays so until
  the checkpoint that synced ``b``'s partitions passes the record: the committer pins
  the ranges' starts (``Committer.moved_floor``), which retention respects (its guard
  reads them under the commit lock, where the pins are taken), and topic DDL that could
  drop a pinned topic checkpoints whole first (or fails);
- a partition's offsets, once written, never change: the data read back is the data
  moved (codec-decoded as the move's read decoded it).

A record naming ranges (``[topic, partition, {"moved": [...], "at": us}]`` in the commit
record's ``moved`` list) is not understood by a Topicbase from before this change (no
downgrade with such records unpublished).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from engine.writes import build_batches, raw_data_batch
from storage import limits
from storage.clock import ManualClock
from storage.codecs import decode_column
from storage.config import FsyncPolicy
from storage.errors import CorruptSegmentError, TopicbaseError


@dataclass(frozen=True, slots=True)
class MovedRange:
    """Offsets ``[start, end)`` of one partition of a topic, read whole, in order."""

    topic_id: str
    partition: int
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class MovedSource:
    """Where a write's messages came from: its data is the ranges' data, in order, and
    ``at_us`` its ``created_at``. ``moved_batch(data of ranges, at_us)`` is the write."""

    ranges: tuple[MovedRange, ...]
    at_us: int

    @property
    def rows(self) -> int:
        return sum(r.end - r.start for r in self.ranges)

    def to_json(self) -> dict[str, Any]:
        return {"moved": [[r.topic_id, r.partition, r.start, r.end] for r in self.ranges],
                "at": self.at_us}  # fmt: skip

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> MovedSource:
        ranges = tuple(MovedRange(str(t), int(p), int(s), int(e)) for t, p, s, e in value["moved"])
        return cls(ranges, int(value["at"]))


def moved_batch(data: pa.Array | pa.ChunkedArray, at_us: int) -> pa.RecordBatch:
    """The wire batch of messages with this data and ``created_at`` = ``at_us``, every
    other column its default: exactly what ``INSERT INTO TOPIC t (data) SELECT ...``
    stages (``build_batches``), computed the same way at commit and at recovery."""
    if isinstance(data, pa.ChunkedArray):
        data = data.chunk(0) if data.num_chunks == 1 else data.combine_chunks()
    if (
        data.type == pa.binary()
        and not data.null_count
        and 0 < len(data) <= limits.BATCH_MESSAGES_MAX
    ):
        return raw_data_batch(data, at_us)  # the same batch, built directly
    table = pa.Table.from_arrays([data], names=["data"])
    ((partition, batch),) = build_batches(table, {}, ManualClock(at_us))
    assert partition is None
    return batch


def usable(database: Any, source: MovedSource) -> bool:
    """Whether ``source``'s ranges may be referenced now: every one present and durable.
    Called under the commit lock (retention deletes only under it)."""
    for moved in source.ranges:
        try:
            partition = database.topic_log(moved.topic_id).partition(moved.partition)
        except TopicbaseError:
            return False
        if partition.start_offset > moved.start or partition.durable_end < moved.end:
            return False
    return True


def make_durable(database: Any, source: MovedSource) -> bool:
    """Before the commit lock: sync the source partitions whose ranges are not known
    durable yet (what a reopen or a transactional publish left unsynced; a partition
    whose fsync policy is ``never`` is not synced: its moves stage copies). Then
    ``usable``. One sync per partition makes its whole log durable, for later moves too;
    the staged copy it saves would have cost as many bytes synced."""
    for moved in source.ranges:
        try:
            partition = database.topic_log(moved.topic_id).partition(moved.partition)
        except TopicbaseError:
            return False
        if partition.durable_end >= moved.end:
            continue
        if partition.config.fsync_policy is FsyncPolicy.NEVER:
            return False
        try:
            partition.make_durable()
        except TopicbaseError:  # fenced, closed: staged as a copy, as before
            return False
    return usable(database, source)


def derive(database: Any, source: MovedSource) -> pa.RecordBatch:
    """Recovery: the batch the write staged, from its ranges (``moved_batch``). A range
    that is gone (which the pins rule out) stops recovery with ``CorruptSegmentError``
    rather than publishing other rows."""
    pieces: list[pa.Array] = []
    for moved in source.ranges:
        try:
            partition = database.topic_log(moved.topic_id).partition(moved.partition)
        except TopicbaseError as error:
            raise CorruptSegmentError(
                f"a committed move's source is gone (topic {moved.topic_id}, partition "
                f"{moved.partition}): {error}", path=database.path, position=moved.start) from None
        position = moved.start
        while position < moved.end:
            read = partition.read_frames(
                position, max_messages=min(moved.end - position, limits.READ_MESSAGES_MAX),
                max_bytes=limits.READ_BYTES_MAX,
            )  # fmt: skip
            if not read.slices or read.slices[0].first_offset != position:
                raise CorruptSegmentError(
                    f"a committed move's source range is gone (topic {moved.topic_id}, "
                    f"partition {moved.partition}, offset {position})", path=database.path,
                    position=position)
            for piece in read.slices:
                rows = min(piece.rows, moved.end - position)
                wire = piece.wire_batch().slice(0, rows)
                pieces.append(decode_column(wire.column("codec"), wire.column("data")))
                position += rows
                if position >= moved.end:
                    break
    data = pa.chunked_array(pieces, pa.binary()) if pieces else pa.array([], pa.binary())
    return moved_batch(data, source.at_us)
