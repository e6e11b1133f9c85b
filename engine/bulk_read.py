"""Bulk reads of topics by offset range: the engine side of the Arrow Flight door.

A bulk reader first takes a *cut* of a topic: for every partition, the range of offsets
``[start, end)`` visible at one instant (the end offsets are taken under the database's
publish lock, so a transaction's publish is in the cut whole or not at all), optionally
narrowed by a starting/ending position, and split into ranges of at most ``split_rows``
messages so that each range can be read by a task of its own. Reading a range streams the
stored Arrow frames of the partition as the topic relation's columns (``engine.
topic_relation``), projected to the columns asked for: the frames are never decoded
message by message in Python (compressed ``data`` is decompressed column-wise). A read of
``partition`` and ``offset`` alone reads no frame at all: the range gives them.

Invariants: a range never reaches past the end of the cut it came from, so reading it
later gives exactly the messages of the cut (retention may have removed a prefix: such a
read fails with 22023 rather than returning a shorter range silently). Privileges are
checked on every call (``engine.privileges.require``), since each call may come from a
different request.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from engine import privileges
from engine.packed_read import PackedBatch, packed_slice
from engine.topic_relation import SCHEMA, relation_batch
from storage import limits
from storage.errors import InvalidParameterValueError, UndefinedTopicError
from storage.frame_read import FrameSlice, decode_slices

DEFAULT_SPLIT_ROWS = 1_000_000
READ_CHUNK_MESSAGES = 8192
# Frames read at once (plus at most one larger frame, read whole): the window one pread
# fills. Larger windows cost more CPU per byte (fresh memory for each pread): for 200k
# messages of 1 KiB in frames of 10k, 0.040 s at 4 MiB vs 0.115 s at 16 MiB; in frames of
# 1,024, 0.066 vs 0.119 s (in-process CPU, medians of 5).
READ_CHUNK_BYTES = 4 * 1024 * 1024
TOPIC_COLUMNS = tuple(SCHEMA.names)
# The relation's schema with the codec as plain text: Arrow clients (Spark among them) need
# no dictionary support, and IPC streams need no dictionary batch up front.
BULK_SCHEMA = pa.schema(
    [pa.field("codec", pa.string()) if f.name == "codec" else f for f in SCHEMA]
)


# Columns a range gives by itself: a partition's offsets are dense (every offset in
# [start, end) is a message; a gap is damage that ``topicbase check`` reports), so a read of
# these alone needs no frame (a count, a GROUP BY partition).
RANGE_COLUMNS = frozenset({"partition", "offset"})
RANGE_CHUNK_MESSAGES = 1 << 20


@dataclass(frozen=True)
class OffsetRange:
    """Messages ``[start, end)`` of one partition."""

    partition: int
    start: int
    end: int

    @property
    def count(self) -> int:
        return self.end - self.start

    def to_json(self) -> dict[str, int]:
        return {"partition": self.partition, "start": self.start, "end": self.end}


@dataclass(frozen=True)
class PartitionBounds:
    """A partition as a reader sees it: its offsets, whether it takes writes, its parent."""

    partition: int
    start: int
    end: int
    active: bool
    parent: int | None


def project_schema(columns: Sequence[str] | None) -> pa.Schema:
    """The topic relation's schema narrowed to ``columns`` (all when None), in their order."""
    if not columns:
        return BULK_SCHEMA
    unknown = [c for c in columns if c not in TOPIC_COLUMNS]
    if unknown:
        raise InvalidParameterValueError(
            f'"{unknown[0]}" is not a column of a topic (columns: {", ".join(TOPIC_COLUMNS)})'
        )
    return pa.schema([BULK_SCHEMA.field(c) for c in columns])


def _topic(session: Any, name: str) -> Any:
    entry = session.database.catalog.entry(name)
    if entry is None:
        raise UndefinedTopicError(f'topic "{name}" does not exist')
    return session.database.topic_log(entry.topic_id)


def partition_bounds(session: Any, name: str) -> list[PartitionBounds]:
    """Every partition of topic ``name`` with one consistent cut of its end offsets,
    parents before children (a parent's id is lower than its children's)."""
    privileges.require(session, "topic", name, "SELECT")
    topic = _topic(session, name)
    database = session.database
    active = set(topic.active_partition_ids())
    with database.publish_lock:
        cut = {p: topic.partition(p).end_offset for p in topic.partition_ids()}
    bounds = []
    for partition_id, end in sorted(cut.items()):
        partition = topic.partition(partition_id)
        parent = topic.partition_info(partition_id).parent
        bounds.append(PartitionBounds(partition_id, min(partition.start_offset, end), end,
                                      partition_id in active, parent))  # fmt: skip
    return bounds


def offset_for_time(session: Any, name: str, partition: int, written_at_us: int) -> int:
    """The first offset of ``partition`` written at or after ``written_at_us``."""
    privileges.require(session, "topic", name, "SELECT")
    return _topic(session, name).partition(partition).offset_for_time(written_at_us)


def cut_ranges(
    session: Any,
    name: str,
    starts: dict[int, int] | None = None,
    ends: dict[int, int] | None = None,
    split_rows: int = DEFAULT_SPLIT_ROWS,
) -> list[OffsetRange]:
    """The topic's cut as ranges of at most ``split_rows`` messages, partition by partition.

    ``starts``/``ends`` narrow a partition (default: its start, and the cut's end); a
    start before the partition's start is raised to it, an end past the cut is lowered to
    it. Partitions left with nothing to read give no range.
    """
    if split_rows < 1:
        raise InvalidParameterValueError(f"split_rows must be at least 1, not {split_rows}")
    ranges = []
    for bound in partition_bounds(session, name):
        start = max(bound.start, (starts or {}).get(bound.partition, bound.start))
        end = min(bound.end, (ends or {}).get(bound.partition, bound.end))
        while start < end:
            piece = min(end, start + split_rows)
            ranges.append(OffsetRange(bound.partition, start, piece))
            start = piece
    return ranges


def read_range(
    session: Any,
    name: str,
    offsets: OffsetRange,
    columns: Sequence[str] | None = None,
    *,
    packed: bool = False,
) -> Iterator[pa.RecordBatch | PackedBatch]:
    """The messages of ``offsets`` as record batches of the projected topic schema; with
    ``packed``, each whole column-compressed frame of raw messages as a ``PackedBatch``
    of the same rows instead (``engine.packed_read``: for a reader that decompresses Arrow
    IPC body compression itself), the rest as record batches, in offset order.

    Raises 22023 if retention removed part of the range since it was cut.
    """
    privileges.require(session, "topic", name, "SELECT")
    schema = project_schema(columns)
    partition = _topic(session, name).partition(offsets.partition)
    if offsets.start < partition.start_offset and offsets.count > 0:
        raise InvalidParameterValueError(
            f"offsets {offsets.start}..{partition.start_offset} of partition "
            f"{offsets.partition} of topic {name} were removed by retention"
        )
    if offsets.end > partition.end_offset:
        raise InvalidParameterValueError(
            f"partition {offsets.partition} of topic {name} ends at {partition.end_offset}, "
            f"before the range's end {offsets.end}"
        )
    if set(schema.names) <= RANGE_COLUMNS:
        yield from _range_only(offsets, schema)
        return
    position = offsets.start
    while position < offsets.end:
        # Each stored frame is read (pread, checked) and decoded once, then cut into
        # batches of at most READ_CHUNK_MESSAGES: a read of READ_CHUNK_MESSAGES messages at
        # a time re-read and re-decoded a large frame (a Flight/Spark commit's, up to
        # BATCH_BYTES_MAX) once per chunk. The read stops after READ_CHUNK_BYTES of frames
        # or after one frame larger than that, so at most that much is held at once.
        found = partition.read_frames(
            position,
            max_messages=min(limits.READ_MESSAGES_MAX, offsets.end - position),
            max_bytes=READ_CHUNK_BYTES,
        )
        if not found.slices:
            raise InvalidParameterValueError(
                f"partition {offsets.partition} of topic {name} ends at {position}, "
                f"before the range's end {offsets.end}"
            )
        if found.slices[0].first_offset != position:  # storage clamps to the log start
            raise InvalidParameterValueError(
                f"offsets {position}..{found.slices[0].first_offset} of partition "
                f"{offsets.partition} of topic {name} were removed by retention"
            )
        if packed:
            yield from _packed_or_decoded(offsets.partition, found.slices, schema)
        else:
            yield from _decoded(offsets.partition, found.slices, schema)
        position = found.next_offset


def _decoded(partition: int, slices: Sequence[FrameSlice], schema: pa.Schema
             ) -> Iterator[pa.RecordBatch]:  # fmt: skip
    """``slices`` decoded, as batches of at most ``READ_CHUNK_MESSAGES`` of ``schema``."""
    for batch in decode_slices(slices):
        for start in range(0, batch.num_rows, READ_CHUNK_MESSAGES):
            yield _project(partition, batch.slice(start, READ_CHUNK_MESSAGES), schema)


def _packed_or_decoded(partition: int, slices: Sequence[FrameSlice], schema: pa.Schema
                       ) -> Iterator[pa.RecordBatch | PackedBatch]:  # fmt: skip
    """``slices`` in order: each that ``packed_slice`` takes as it is stored, the runs of
    the others decoded (``_decoded``)."""
    run: list[FrameSlice] = []
    for piece in slices:
        packed = packed_slice(partition, piece, schema, READ_CHUNK_MESSAGES)
        if packed is None:
            run.append(piece)
            continue
        if run:
            yield from _decoded(partition, run, schema)
            run = []
        yield packed
    if run:
        yield from _decoded(partition, run, schema)


def _project(partition: int, batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """A read batch of ``partition`` as the relation's columns of ``schema``."""
    relation = relation_batch(partition, batch).select(schema.names)
    if "codec" in schema.names:
        index = schema.get_field_index("codec")
        relation = relation.set_column(
            index, schema.field(index), relation.column(index).dictionary_decode())
    return relation


def _range_only(offsets: OffsetRange, schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """The range's ``partition``/``offset`` columns, made from its bounds alone."""
    for start in range(offsets.start, offsets.end, RANGE_CHUNK_MESSAGES):
        stop = min(offsets.end, start + RANGE_CHUNK_MESSAGES)
        columns = {
            "partition": pa.array(np.full(stop - start, offsets.partition, dtype=np.int32)),
            "offset": pa.array(np.arange(start, stop, dtype=np.int64)),
        }
        yield pa.RecordBatch.from_arrays([columns[n] for n in schema.names], schema=schema)
