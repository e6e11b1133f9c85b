"""Per-partition producer state: last seq_no per producer id, for exactly-once publish.

For each *key* (the producer id, or the message group id of messages without
one) the partition remembers the largest seq_no written, the offset of its last
message and when it last wrote. A message of a producer whose ``seq_no`` is not
above that largest one is a duplicate: skipped and reported, never written.
Keys that have not written for ``expiry_us`` are forgotten (YDB: 14 days).

Persistence: a JSON snapshot ``<offset>.snapshot`` taken at segment roll and
clean close records the state as of ``offset``; on open the newest snapshot not
past the log end is loaded and the log from its offset on is replayed
(``apply_read_batch``), vectorised per batch. The two newest snapshots are kept.

Thread-safety: only the partition's writer (under its lock) calls the
mutating methods; ``last_seq_no`` may be read from any thread.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from storage import file_names, limits
from storage.clock import Clock
from storage.errors import InvalidParameterValueError, LimitExceededError
from storage.fs import FileSystem

SNAPSHOTS_KEPT = 2
# Below this many rows, grouping in plain Python beats any Arrow compute call.
SMALL_BATCH_ROWS = 64
SEQ_NO_COLUMN = 0
PRODUCER_COLUMN = 1
GROUP_COLUMN = 2


@dataclass(slots=True)
class ProducerEntry:
    last_seq_no: int | None
    last_offset: int
    last_written_at_us: int
    # seq_nos and offsets of this producer's messages in its last batch, so a
    # resend of that batch can report each duplicate's earlier offset.
    recent_seq_nos: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    recent_offsets: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))


@dataclass(frozen=True, slots=True)
class DedupDecision:
    """The writer's verdict on a wire batch, per message, in batch order."""

    batch: pa.RecordBatch  # the input, with seq_nos filled in where they were null
    duplicate: np.ndarray  # bool per message
    earlier_offsets: np.ndarray  # int64 per message; -1 where unknown or not a duplicate
    # The producer groups of ``batch`` (as ``group_rows`` gives them), for ``record``.
    producer_groups: list[tuple[str, np.ndarray]] | None = None

    @property
    def written_count(self) -> int:
        return int(len(self.duplicate) - np.count_nonzero(self.duplicate))


class ProducerStateManager:
    def __init__(self, fs: FileSystem, directory: str, clock: Clock, expiry_us: int) -> None:
        assert expiry_us > 0
        self._fs = fs
        self._directory = directory
        self._clock = clock
        self._expiry_us = expiry_us
        self._entries: dict[str, ProducerEntry] = {}

    # -- queries ----------------------------------------------------------------------
    def entry(self, key: str) -> ProducerEntry | None:
        """The live entry of ``key``; expired entries read as absent."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        if entry.last_written_at_us + self._expiry_us <= self._clock.now_us():
            return None
        return entry

    def last_seq_no(self, key: str) -> int | None:
        entry = self.entry(key)
        return None if entry is None else entry.last_seq_no

    def live_keys(self) -> dict[str, int]:
        """Every unexpired key with the time of its last write."""
        now = self._clock.now_us()
        return {
            key: entry.last_written_at_us
            for key, entry in self._entries.items()
            if entry.last_written_at_us + self._expiry_us > now
        }

    # -- the write path ---------------------------------------------------------------
    def decide(self, batch: pa.RecordBatch) -> DedupDecision:
        """Mark duplicates in ``batch`` and fill missing seq_nos of producers.

        A message with a producer id is a duplicate when its seq_no is not
        above the largest seq_no of that producer so far, counting earlier
        messages of the same batch. Messages without a producer id are never
        duplicates (the no-dedup path).
        """
        count = batch.num_rows
        duplicate = np.zeros(count, dtype=bool)
        earlier = np.full(count, -1, dtype=np.int64)
        producers = batch.column(PRODUCER_COLUMN)
        if producers.null_count == count:
            return DedupDecision(batch, duplicate, earlier)
        seq_nos, seq_known = _int64_with_mask(batch.column(SEQ_NO_COLUMN))
        if np.any(seq_known & (seq_nos < 0)):
            raise InvalidParameterValueError("seq_no must not be negative")
        filled = False
        # Rows holding a seq_no after the fill; the nulls of rows without a
        # producer stay null (they are not ours to number).
        has_seq_no = seq_known.copy()
        groups = group_rows(producers)
        for key, rows in groups:
            entry = self.entry(key)
            last = -1 if entry is None or entry.last_seq_no is None else entry.last_seq_no
            if not np.all(seq_known[rows]):
                filled = True
                last_assigned = last
                for row in rows:  # rare path: the producer left seq_no to us
                    if not seq_known[row]:
                        seq_nos[row] = last_assigned + 1
                        has_seq_no[row] = True
                    last_assigned = max(last_assigned, seq_nos[row])
            ours = seq_nos[rows]
            running = np.maximum.accumulate(np.concatenate(([last], ours)))[:-1]
            is_duplicate = ours <= running
            duplicate[rows] = is_duplicate
            if entry is not None and np.any(is_duplicate):
                earlier[rows[is_duplicate]] = _earlier_offsets(entry, ours[is_duplicate])
        if filled:
            batch = batch.set_column(
                SEQ_NO_COLUMN,
                batch.schema.field(SEQ_NO_COLUMN),
                pa.array(seq_nos, pa.int64(), mask=~has_seq_no),
            )
        return DedupDecision(batch, duplicate, earlier, groups)

    def record(
        self,
        written: pa.RecordBatch,
        base_offset: int,
        written_at_us: int,
        producer_groups: list[tuple[str, np.ndarray]] | None = None,
    ) -> None:
        """Update entries after ``written`` (only non-duplicates) went to ``base_offset``."""
        keys = written.column(PRODUCER_COLUMN)
        groups = written.column(GROUP_COLUMN)
        if groups.null_count != len(groups):
            keys = pc.coalesce(keys, groups)
        if keys.null_count == len(keys):
            return
        all_seq_nos, known = _int64_with_mask(written.column(SEQ_NO_COLUMN))
        all_seq_nos = np.where(known, all_seq_nos, -1)
        reuse = producer_groups is not None and groups.null_count == len(groups)
        for key, rows in producer_groups if reuse else group_rows(keys):
            offsets = rows.astype(np.int64) + base_offset
            seqs = all_seq_nos[rows]
            has_seq = bool(np.any(seqs >= 0))
            self._put(
                key,
                int(seqs.max()) if has_seq else None,
                int(offsets[-1]),
                written_at_us,
                seqs.astype(np.int64) if has_seq else np.empty(0, np.int64),
                offsets if has_seq else np.empty(0, np.int64),
            )

    def _put(
        self,
        key: str,
        seq_no: int | None,
        offset: int,
        written_at_us: int,
        recent_seq_nos: np.ndarray,
        recent_offsets: np.ndarray,
    ) -> None:
        entry = self._entries.get(key)
        if entry is None:
            if len(self._entries) >= limits.PRODUCERS_PER_PARTITION_MAX:
                self.expire()
                if len(self._entries) >= limits.PRODUCERS_PER_PARTITION_MAX:
                    raise LimitExceededError(
                        f"too many live producers in one partition "
                        f"(limit {limits.PRODUCERS_PER_PARTITION_MAX})"
                    )
            self._entries[key] = ProducerEntry(
                seq_no, offset, written_at_us, recent_seq_nos, recent_offsets
            )
            return
        if seq_no is not None:
            previous = entry.last_seq_no
            entry.last_seq_no = seq_no if previous is None else max(previous, seq_no)
            entry.recent_seq_nos, entry.recent_offsets = recent_seq_nos, recent_offsets
        entry.last_offset = max(entry.last_offset, offset)
        entry.last_written_at_us = max(entry.last_written_at_us, written_at_us)

    def apply_read_batch(self, batch: pa.RecordBatch) -> None:
        """Replay one read batch (``READ_SCHEMA``) during recovery, vectorised."""
        table = pa.table(
            {
                "key": pc.coalesce(batch.column("producer_id"), batch.column("message_group_id")),
                "seq_no": batch.column("seq_no"),
                "offset": batch.column("offset"),
                "written_at": batch.column("written_at").cast(pa.int64()),
            }
        ).filter(pc.is_valid(pc.field("key")))
        if table.num_rows == 0:
            return
        grouped = table.group_by("key").aggregate(
            [("seq_no", "max"), ("offset", "max"), ("written_at", "max")]
        )
        for key, seq_no, offset, written_at in zip(
            *(
                grouped.column(name).to_pylist()
                for name in ("key", "seq_no_max", "offset_max", "written_at_max")
            ),
            strict=True,
        ):
            self._put(key, seq_no, offset, written_at, np.empty(0, np.int64), np.empty(0, np.int64))

    def expire(self) -> int:
        """Forget keys silent for longer than the expiry; returns how many."""
        now = self._clock.now_us()
        expired = [
            k for k, e in self._entries.items() if e.last_written_at_us + self._expiry_us <= now
        ]
        for key in expired:
            del self._entries[key]
        return len(expired)

    def truncate_after(self, next_offset: int) -> None:
        """Drop knowledge of offsets >= ``next_offset`` (the log was cut); rebuild after."""
        self._entries = {k: e for k, e in self._entries.items() if e.last_offset < next_offset}

    def clear(self) -> None:
        self._entries.clear()

    # -- snapshots ----------------------------------------------------------------------
    def write_snapshot(self, offset: int, *, durable: bool) -> None:
        """Record the state as of ``offset`` (all messages below it applied)."""
        self.expire()
        payload = {
            "offset": offset,
            "producers": {
                key: [e.last_seq_no, e.last_offset, e.last_written_at_us]
                for key, e in self._entries.items()
            },
        }
        path = os.path.join(self._directory, file_names.snapshot_file(offset))
        self._fs.write_file_atomic(path, json.dumps(payload).encode(), durable=durable)
        for old in self.snapshot_offsets()[:-SNAPSHOTS_KEPT]:
            self._fs.remove(os.path.join(self._directory, file_names.snapshot_file(old)))

    def snapshot_offsets(self) -> list[int]:
        names = self._fs.list_directory(self._directory)
        found = (file_names.parse_offset(n, file_names.SNAPSHOT_SUFFIX) for n in names)
        return sorted(o for o in found if o is not None)

    def load_snapshot(self, log_end_offset: int) -> int:
        """Load the newest readable snapshot at or below ``log_end_offset``.

        Returns the offset to replay from (0 when no snapshot fits). Snapshots
        past the log end (the log was cut) or unreadable ones are deleted.
        """
        self._entries.clear()
        for offset in reversed(self.snapshot_offsets()):
            path = os.path.join(self._directory, file_names.snapshot_file(offset))
            if offset > log_end_offset:
                self._fs.remove(path)
                continue
            try:
                payload = json.loads(self._fs.read_file(path))
                assert payload["offset"] == offset
                for key, (seq_no, last_offset, written_at) in payload["producers"].items():
                    self._entries[key] = ProducerEntry(seq_no, last_offset, written_at)
            except (
                ValueError,
                KeyError,
                TypeError,
                AttributeError,
                AssertionError,
                FileNotFoundError,
            ):
                self._entries.clear()
                self._fs.remove(path)
                continue
            return offset
        return 0


def _earlier_offsets(entry: ProducerEntry, seq_nos: np.ndarray) -> np.ndarray:
    """Offsets of earlier copies of ``seq_nos`` where the entry still knows them."""
    result = np.full(len(seq_nos), -1, dtype=np.int64)
    if len(entry.recent_seq_nos):
        positions = np.searchsorted(entry.recent_seq_nos, seq_nos)
        positions = np.clip(positions, 0, len(entry.recent_seq_nos) - 1)
        found = entry.recent_seq_nos[positions] == seq_nos
        result[found] = entry.recent_offsets[positions[found]]
    if entry.last_seq_no is not None:
        result[seq_nos == entry.last_seq_no] = entry.last_offset
    return result


def group_rows(column: pa.Array) -> list[tuple[str, np.ndarray]]:
    """Each distinct non-null value of ``column`` with its row numbers, ascending.

    One dictionary encoding per batch, then numpy: no compute call per key,
    and a batch of one producer (the common case) costs almost nothing.
    """
    count = len(column)
    if column.null_count == count:
        return []
    if count <= SMALL_BATCH_ROWS:
        rows_of: dict[str, list[int]] = {}
        for row, value in enumerate(column.to_pylist()):
            if value is not None:
                rows_of.setdefault(value, []).append(row)
        return [(key, np.array(rows, dtype=np.int64)) for key, rows in rows_of.items()]
    single = _single_value(column)
    if single is not None:
        return [(single, np.arange(count))]
    encoded = column.dictionary_encode()
    keys = encoded.dictionary.to_pylist()
    if len(keys) == 1 and column.null_count == 0:
        return [(keys[0], np.arange(count))]
    indices = encoded.indices
    if indices.null_count:
        indices = indices.fill_null(-1)
    numbers = indices.to_numpy(zero_copy_only=False)
    order = np.argsort(numbers, kind="stable")
    sorted_numbers = numbers[order]
    starts = np.flatnonzero(np.diff(sorted_numbers)) + 1
    groups = []
    for rows in np.split(order, starts):
        number = int(numbers[rows[0]])
        if number >= 0:
            groups.append((keys[number], rows))
    return groups


def _single_value(column: pa.Array) -> str | None:
    """The value of a string column whose rows are all the same (no nulls), else None.

    Compares the raw buffers with numpy: a batch from one producer is recognised
    without hashing a single string.
    """
    if column.null_count or not pa.types.is_string(column.type):
        return None
    offsets = np.frombuffer(column.buffers()[1], dtype=np.int32)[
        column.offset : column.offset + len(column) + 1
    ]
    lengths = np.diff(offsets)
    width = int(lengths[0])
    if width == 0 or not np.all(lengths == width):
        return None
    data = np.frombuffer(column.buffers()[2], dtype=np.uint8)[offsets[0] : offsets[-1]]
    rows = data.reshape(len(column), width)
    if not np.all(rows == rows[0]):
        return None
    return bytes(rows[0]).decode()


def _int64_with_mask(column: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Values as int64 (nulls as -1) and a mask of the non-null rows."""
    if column.null_count == 0:
        return column.to_numpy(zero_copy_only=False).astype(np.int64), np.ones(len(column), bool)
    if column.null_count == len(column):
        return np.full(len(column), -1, np.int64), np.zeros(len(column), bool)
    values = column.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
    valid = column.is_valid().to_numpy(zero_copy_only=False)
    return values, valid
