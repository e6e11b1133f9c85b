"""Per-partition producer state: last seq_no per producer id, for exactly-once publish.

For each *key* (the producer id, or the message group id of messages without
one) the partition remembers the largest seq_no written, the offset of its last
message and when it last wrote. A message of a producer whose ``seq_no`` is not
above that largest one is a duplicate: skipped and reported, never written.
Keys that have not written for ``expiry_us`` are forgotten (YDB: 14 days).

Expiry is forgetting, whole: an entry whose key has been silent for ``expiry_us``
reads as absent to every decision (``entry``, ``live_entries``, ``decide_shares``) and,
when the key writes again, is *replaced* by a new entry, never merged into
(``_put``): its old last seq_no, offsets and recent seq_nos are gone. So a producer
that restarts after its expiry at a low seq_no (5 after 100) is a new producer, and its
next messages (6, 7, ...) are not taken for duplicates of the forgotten 100. That is the
rule of the systems this model follows: Kafka's partition leader expires a producer id
after ``producer.id.expiration.ms`` without a write, and once its state is removed the
producer is unknown (``UnknownProducerIdException``: the producer's metadata is removed
and it starts over); YDB keeps a source's seq_no for dedup only while it writes within
the retention of that state. The write time decides (``written_at_us`` of the write,
the frames' times in replay), so live writes and recovery agree.

Persistence: a JSON snapshot ``<offset>.snapshot`` taken at segment roll and
clean close records the state as of ``offset``; on open the newest snapshot not
past the log end is loaded and the log from its offset on is replayed
(``apply_read_batch``), vectorised per batch. The two newest snapshots are kept.

Thread-safety: only the partition's writer (under its lock) calls the
mutating methods; ``last_seq_no`` may be read from any thread.
"""

from __future__ import annotations

import functools
import itertools
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from storage import file_names, limits
from storage.clock import Clock
from storage.errors import InvalidParameterValueError, LimitExceededError
from storage.fs import FileSystem

SNAPSHOTS_KEPT = 2
_EMPTY = np.empty(0, np.int64)
_EMPTY.flags.writeable = False  # shared by entries that keep no recent seq_nos
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
    duplicate_count: int  # == count_nonzero(duplicate), counted once by ``decide``
    # The producer groups of ``batch`` (as ``group_rows`` gives them), for ``record``.
    producer_groups: list[tuple[str, np.ndarray]] | None = None
    # Small batches (``SMALL_BATCH_ROWS``): the producer ids and seq_nos of ``batch``
    # as Python lists, so that ``record_decision`` need not read the columns again.
    producer_ids: list[str | None] | None = None
    seq_nos: list[int | None] | None = None
    # A large batch of one producer whose seq_nos all lie past its last, the usual
    # case (``_decide_one_producer``): its key and seq_nos, so that ``record_decision``
    # updates one entry without grouping again.
    one_producer: tuple[str, np.ndarray] | None = None

    @property
    def written_count(self) -> int:
        return len(self.duplicate) - self.duplicate_count


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

    def live_entries(self, keys: set[str]) -> dict[str, ProducerEntry]:
        """The live entries of those of ``keys`` this partition knows.

        One C-level intersection with the entry table (no Python loop over ``keys``),
        so a topic can look many keys up in many partitions cheaply; expired entries
        read as absent, as in ``entry``.
        """
        known = self._entries.keys() & keys
        if not known:
            return {}
        now = self._clock.now_us()
        found = {}
        for key in known:
            entry = self._entries.get(key)
            if entry is not None and entry.last_written_at_us + self._expiry_us > now:
                found[key] = entry
        return found

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
        producers = batch.column(PRODUCER_COLUMN)
        if producers.null_count == count:
            duplicate = np.zeros(count, dtype=bool)
            return DedupDecision(batch, duplicate, np.full(count, -1, dtype=np.int64), 0)
        if count <= SMALL_BATCH_ROWS:
            return self._decide_small(batch, producers.to_pylist())
        fast = self._decide_one_producer(batch, producers)
        if fast is not None:
            return fast
        duplicate = np.zeros(count, dtype=bool)
        earlier = np.full(count, -1, dtype=np.int64)
        seq_nos, seq_known = _int64_with_mask(batch.column(SEQ_NO_COLUMN))
        if (seq_known & (seq_nos < 0)).any():
            raise InvalidParameterValueError("seq_no must not be negative")
        filled = False
        # Rows holding a seq_no after the fill; the nulls of rows without a
        # producer stay null (they are not ours to number).
        has_seq_no = seq_known.copy()
        groups = group_rows(producers)
        for key, rows in groups:
            whole = len(rows) == count  # one producer: no fancy indexing
            entry = self.entry(key)
            last = -1 if entry is None or entry.last_seq_no is None else entry.last_seq_no
            if not (seq_known if whole else seq_known[rows]).all():
                filled = True
                last_assigned = last
                for row in rows:  # rare path: the producer left seq_no to us
                    if not seq_known[row]:
                        seq_nos[row] = last_assigned + 1
                        has_seq_no[row] = True
                    last_assigned = max(last_assigned, seq_nos[row])
            ours = seq_nos if whole else seq_nos[rows]
            if ours[0] > last and (ours[1:] > ours[:-1]).all():
                continue  # strictly increasing past the last: no duplicate (the usual case)
            running = np.maximum.accumulate(np.concatenate(([last], ours)))[:-1]
            is_duplicate = ours <= running
            duplicate[rows] = is_duplicate
            if entry is not None and is_duplicate.any():
                earlier[rows[is_duplicate]] = _earlier_offsets(entry, ours[is_duplicate])
        if filled:
            batch = batch.set_column(
                SEQ_NO_COLUMN,
                batch.schema.field(SEQ_NO_COLUMN),
                pa.array(seq_nos, pa.int64(), mask=~has_seq_no),
            )
        return DedupDecision(batch, duplicate, earlier, int(np.count_nonzero(duplicate)), groups)

    def _decide_one_producer(
        self, batch: pa.RecordBatch, producers: pa.Array
    ) -> DedupDecision | None:
        """The decision for a batch of one producer with every seq_no given and strictly
        increasing past the producer's last: nothing is a duplicate. None for any other
        batch (``decide`` then takes the general path). A handful of vectorised calls."""
        key = _single_value(producers)
        seq_column = batch.column(SEQ_NO_COLUMN)
        if key is None or seq_column.null_count:
            return None
        seq_nos = seq_column.to_numpy()
        entry = self.entry(key)
        last = -1 if entry is None or entry.last_seq_no is None else entry.last_seq_no
        if not (seq_nos[0] > last and (seq_nos[1:] > seq_nos[:-1]).all()):
            return None  # duplicates, or a negative seq_no (refused by the general path)
        count = len(seq_nos)
        return DedupDecision(
            batch, _no_duplicates(count), _no_earlier_offsets(count), 0, one_producer=(key, seq_nos)
        )

    def _decide_small(self, batch: pa.RecordBatch, keys: list[str | None]) -> DedupDecision:
        """``decide`` for a few rows, in plain Python: no numpy call per row or per key.

        Same rules as the vectorised path: a producer's message is a duplicate
        when its seq_no is not above the running maximum (the producer's last
        seq_no, then earlier rows of the batch); a missing seq_no becomes that
        maximum + 1; rows without a producer are never duplicates.
        """
        count = len(keys)
        column = batch.column(SEQ_NO_COLUMN)
        seq_nos: list[int | None]
        if column.null_count == count:  # every seq_no left to us: no conversion
            seq_nos = [None] * count
        else:
            seq_nos = column.to_pylist()
            for seq_no in seq_nos:
                if seq_no is not None and seq_no < 0:
                    raise InvalidParameterValueError("seq_no must not be negative")
        running: dict[str, int] = {}  # key -> largest seq_no so far
        duplicate_rows: list[tuple[int, str, int]] = []
        entries: dict[str, ProducerEntry | None] = {}
        filled = False
        for row, key in enumerate(keys):
            if key is None:
                continue
            last = running.get(key)
            if last is None:
                entry = entries[key] = self.entry(key)
                last = -1 if entry is None or entry.last_seq_no is None else entry.last_seq_no
            seq_no = seq_nos[row]
            if seq_no is None:  # rare: the producer left seq_no to us
                seq_no = seq_nos[row] = last + 1
                filled = True
            if seq_no <= last:
                duplicate_rows.append((row, key, seq_no))
                running[key] = last
            else:
                running[key] = seq_no
        duplicate = np.zeros(count, dtype=bool)
        earlier = np.full(count, -1, dtype=np.int64)
        for row, key, seq_no in duplicate_rows:
            duplicate[row] = True
            entry = entries[key]
            if entry is not None:
                earlier[row] = _earlier_offset(entry, seq_no)
        if filled:
            batch = batch.set_column(
                SEQ_NO_COLUMN, batch.schema.field(SEQ_NO_COLUMN), _int64_array(seq_nos)
            )
        return DedupDecision(batch, duplicate, earlier, len(duplicate_rows), None, keys, seq_nos)

    def record(
        self,
        written: pa.RecordBatch,
        base_offset: int,
        written_at_us: int,
        producer_groups: list[tuple[str, np.ndarray]] | None = None,
    ) -> None:
        """Update entries after ``written`` (only non-duplicates) went to ``base_offset``."""
        if written.num_rows <= SMALL_BATCH_ROWS:
            self._record_small(written, base_offset, written_at_us)
            return
        keys = written.column(PRODUCER_COLUMN)
        groups = written.column(GROUP_COLUMN)
        if groups.null_count != len(groups):
            keys = pc.coalesce(keys, groups)
        if keys.null_count == len(keys):
            return
        all_seq_nos, known = _int64_with_mask(written.column(SEQ_NO_COLUMN))
        if not known.all():
            all_seq_nos = np.where(known, all_seq_nos, -1)
        reuse = producer_groups is not None and groups.null_count == len(groups)
        for key, rows in producer_groups if reuse else group_rows(keys):
            offsets = rows + base_offset  # a new int64 array
            seqs = all_seq_nos if len(rows) == len(all_seq_nos) else all_seq_nos[rows]
            has_seq = bool((seqs >= 0).any())
            self._put(
                key,
                int(seqs.max()) if has_seq else None,
                int(offsets[-1]),
                written_at_us,
                seqs.astype(np.int64) if has_seq else np.empty(0, np.int64),
                offsets if has_seq else np.empty(0, np.int64),
            )

    def record_decision(
        self, decision: DedupDecision, base_offset: int, written_at_us: int
    ) -> None:
        """``record`` for a decision whose every message was written (no duplicates)."""
        assert decision.duplicate_count == 0
        if decision.one_producer is not None:
            key, seq_nos = decision.one_producer
            count = len(seq_nos)
            offsets = np.arange(base_offset, base_offset + count, dtype=np.int64)
            last_offset = base_offset + count - 1
            self._put(key, int(seq_nos[-1]), last_offset, written_at_us, seq_nos, offsets)
            return
        if decision.producer_ids is None or decision.seq_nos is None:
            self.record(decision.batch, base_offset, written_at_us, decision.producer_groups)
            return
        self._record_small(
            decision.batch, base_offset, written_at_us, decision.producer_ids, decision.seq_nos
        )

    def _record_small(
        self,
        written: pa.RecordBatch,
        base_offset: int,
        written_at_us: int,
        producer_ids: list[str | None] | None = None,
        seq_nos: list[int | None] | None = None,
    ) -> None:
        """``record`` for a few rows, in plain Python (same entries as the vectorised path).

        ``producer_ids`` and ``seq_nos``, when given, are the columns of ``written``
        as lists (``decide`` read them already).
        """
        keys = written.column(PRODUCER_COLUMN).to_pylist() if producer_ids is None else producer_ids
        if None in keys:
            groups = written.column(GROUP_COLUMN)
            if groups.null_count != len(groups):
                keys = [
                    k if k is not None else g for k, g in zip(keys, groups.to_pylist(), strict=True)
                ]
        if seq_nos is None:
            seq_nos = written.column(SEQ_NO_COLUMN).to_pylist()
        rows_of: dict[str, list[int]] = {}
        for row, key in enumerate(keys):
            if key is not None:
                rows_of.setdefault(key, []).append(row)
        for key, rows in rows_of.items():
            seqs = [-1 if seq_nos[row] is None else seq_nos[row] for row in rows]
            largest = max(seqs)
            offset = base_offset + rows[-1]
            if largest < 0:
                self._put(key, None, offset, written_at_us, _EMPTY, _EMPTY)
                continue
            entry = self._entries.get(key)
            if entry is not None and entry.last_written_at_us + self._expiry_us <= written_at_us:
                entry = None  # expired: ``_put`` replaces it
            if len(rows) == 1 and (
                entry is None or entry.last_seq_no is None or largest >= entry.last_seq_no
            ):
                # One message that becomes the entry's last: ``_earlier_offset`` finds it
                # through ``last_seq_no`` alone, so no per-message arrays are kept.
                self._put(key, largest, offset, written_at_us, _EMPTY, _EMPTY)
                continue
            recent_offsets = np.array(rows, dtype=np.int64)
            recent_offsets += base_offset
            self._put(
                key, largest, offset, written_at_us, np.array(seqs, dtype=np.int64), recent_offsets
            )

    def _put(
        self,
        key: str,
        seq_no: int | None,
        offset: int,
        written_at_us: int,
        recent_seq_nos: np.ndarray,
        recent_offsets: np.ndarray,
        first_written_at_us: int | None = None,
    ) -> None:
        """Merge a write of ``key`` into its entry, or make a new one.

        An entry already expired when this write came (``first_written_at_us``, the
        time of the key's first message in it; ``written_at_us`` unless a replay run
        aggregated several writes) is replaced wholesale, not merged (the module doc):
        its key is a new producer. It does not count against the producer limit (it
        held its place until ``expire`` ran).
        """
        entry = self._entries.get(key)
        came_at = written_at_us if first_written_at_us is None else first_written_at_us
        if entry is not None and entry.last_written_at_us + self._expiry_us <= came_at:
            self._entries[key] = ProducerEntry(
                seq_no, offset, written_at_us, recent_seq_nos, recent_offsets
            )
            return
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
        times = table.column("written_at")
        if pc.max(times).as_py() - pc.min(times).as_py() >= self._expiry_us:
            table = self._after_last_expiry(table)  # a key may have expired inside the run
        grouped = table.group_by("key").aggregate(
            [("seq_no", "max"), ("offset", "max"), ("written_at", "max"), ("written_at", "min")]
        )
        for key, seq_no, offset, written_at, first_at in zip(
            *(
                grouped.column(name).to_pylist()
                for name in ("key", "seq_no_max", "offset_max", "written_at_max", "written_at_min")
            ),
            strict=True,
        ):
            self._put(key, seq_no, offset, written_at, _EMPTY, _EMPTY, first_written_at_us=first_at)

    def _after_last_expiry(self, table: pa.Table) -> pa.Table:
        """The rows of ``table`` (a replay run: key, seq_no, offset, written_at) written
        after each key's last silence of ``expiry_us`` or more inside the run: the key
        expired there, so its earlier rows are forgotten (``_put`` forgets an entry
        expired before a write in the same way)."""
        keys = table.column("key").combine_chunks().dictionary_encode().indices
        numbers = keys.to_numpy(zero_copy_only=False).astype(np.int64)
        offsets = table.column("offset").to_numpy().astype(np.int64)
        times = table.column("written_at").to_numpy().astype(np.int64)
        order = np.lexsort((offsets, numbers))  # by key, then offset (write order)
        sorted_keys, sorted_times = numbers[order], times[order]
        new_key = np.ones(len(order), dtype=bool)
        new_key[1:] = sorted_keys[1:] != sorted_keys[:-1]
        silence = np.zeros(len(order), dtype=bool)
        silence[1:] = sorted_times[1:] - sorted_times[:-1] >= self._expiry_us
        stretch = np.cumsum(new_key | silence)  # a key's run of writes without expiry
        key_index = np.cumsum(new_key) - 1
        key_ends = np.append(np.flatnonzero(new_key)[1:] - 1, len(order) - 1)
        keep = np.empty(len(order), dtype=bool)
        keep[order] = stretch == stretch[key_ends][key_index]
        return table.filter(pa.array(keep))

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


def _earlier_offset(entry: ProducerEntry, seq_no: int) -> int:
    """``_earlier_offsets`` for one seq_no."""
    if entry.last_seq_no is not None and seq_no == entry.last_seq_no:
        return entry.last_offset
    recent = entry.recent_seq_nos
    if len(recent):
        position = int(np.searchsorted(recent, seq_no))
        if position < len(recent) and recent[position] == seq_no:
            return int(entry.recent_offsets[position])
    return -1


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


def _int64_array(values: list[int | None]) -> pa.Array:
    """``values`` as an int64 array: through numpy when none is null (a few us, against
    ~14 us for ``pa.array`` of a Python list)."""
    if None in values:
        return pa.array(values, pa.int64())
    return pa.array(np.array(values, dtype=np.int64))


@functools.lru_cache(maxsize=8)
def _no_duplicates(count: int) -> np.ndarray:
    """``count`` False flags, shared and read-only (a decision with no duplicate)."""
    flags = np.zeros(count, dtype=bool)
    flags.flags.writeable = False
    return flags


@functools.lru_cache(maxsize=8)
def _no_earlier_offsets(count: int) -> np.ndarray:
    """``count`` times -1, shared and read-only (a decision with no duplicate)."""
    offsets = np.full(count, -1, dtype=np.int64)
    offsets.flags.writeable = False
    return offsets


def _single_value(column: pa.Array) -> str | None:
    """The value of a string column whose rows are all the same (no nulls), else None.

    Read from the buffers, without hashing: every row is as long as the first
    (evenly spaced value offsets) and the values' bytes are the first one's
    repeated. A batch from one producer, the common case, is recognised without a
    Python loop or a dictionary encoding.
    """
    count = len(column)
    if column.null_count or not count or not pa.types.is_string(column.type):
        return None
    _, offsets_buffer, data_buffer = column.buffers()
    offsets = np.frombuffer(offsets_buffer, np.int32, count + 1, column.offset * 4)
    start = int(offsets[0])
    width = int(offsets[1]) - start
    if int(offsets[-1]) - start != width * count:
        return None
    if width and not (np.diff(offsets) == width).all():
        return None
    values = memoryview(data_buffer)[start : start + width * count]
    first = bytes(values[:width])
    if width and bytes(values) != first * count:
        return None
    return first.decode()


def _int64_with_mask(column: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Values as int64 (nulls as -1) and a mask of the non-null rows."""
    if column.null_count == 0:
        return column.to_numpy(zero_copy_only=False).astype(np.int64), np.ones(len(column), bool)
    if column.null_count == len(column):
        return np.full(len(column), -1, np.int64), np.zeros(len(column), bool)
    values = column.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
    valid = column.is_valid().to_numpy(zero_copy_only=False)
    return values, valid


# -- many partitions' shares at once (a statement spread over a topic's partitions) -----


@dataclass(frozen=True, slots=True)
class SpreadDecision:
    """``decide_shares``' verdict: no share holds a duplicate.

    What ``record_share``/``record_shares`` put in the partitions' producer state once
    the shares are written is kept flat, one entry per (share, producer) *group*, groups
    in share order and, within a share, in key order: ``keys``, ``largest`` (the group's
    largest seq_no), ``last_rows`` (the row, in its share, of the group's last message)
    and ``group_starts``/``group_ends`` (the group's span of ``sorted_seq_nos`` and
    ``sorted_rows``: every message's seq_no and row in its share, sorted by share, key,
    row). Share ``i``'s groups are ``share_bounds[i]`` to ``share_bounds[i + 1]``. No
    object is made per share: a statement over 1000 partitions has 1000 shares
    (docs/scale.md round 37).

    ``seq_nos``: the seq_nos the writer numbered, all shares' one after another (share
    ``i``'s from ``starts[i]``), or None when the producers gave them (every share is
    written as it came). A share as written (``batch``, ``batches``) is built only when
    asked for: a spread publish of 1000 shares needs the numbers, not 1000 batches
    (``storage.spread_publish``)."""

    originals: Sequence[pa.RecordBatch]
    seq_nos: np.ndarray | None
    starts: list[int]
    keys: list[str]
    largest: list[int]
    last_rows: list[int]
    group_starts: list[int]
    group_ends: list[int]
    sorted_seq_nos: np.ndarray
    sorted_rows: np.ndarray
    share_bounds: list[int]

    def __post_init__(self) -> None:
        groups = len(self.keys)
        assert len(self.largest) == len(self.last_rows) == groups
        assert len(self.group_starts) == len(self.group_ends) == groups
        assert len(self.share_bounds) == len(self.originals) + 1
        assert self.share_bounds[0] == 0 and self.share_bounds[-1] == groups

    def batch(self, index: int) -> pa.RecordBatch:
        """Share ``index`` as written: its seq_nos filled in where the writer numbers them."""
        original = self.originals[index]
        if self.seq_nos is None:
            return original
        start = self.starts[index]
        filled = pa.array(self.seq_nos[start : start + original.num_rows], pa.int64())
        return original.set_column(SEQ_NO_COLUMN, original.schema.field(SEQ_NO_COLUMN), filled)

    @property
    def batches(self) -> list[pa.RecordBatch]:
        """Every share as written (``batch``)."""
        return [self.batch(index) for index in range(len(self.originals))]


def decide_shares(
    managers: list[ProducerStateManager],
    batches: Sequence[pa.RecordBatch],
    table: pa.Table | None = None,
    counts: np.ndarray | None = None,
) -> SpreadDecision | None:
    """``decide`` for many partitions' shares at once (share ``i`` goes to the partition
    of ``managers[i]``, all different): one dictionary encoding and a few numpy passes
    over all rows, and one Python step per (partition, producer) pair, instead of the
    per-share calls of ``decide`` and ``record_decision``.

    Only the usual case is decided here, with the result ``decide`` would give: every
    message has a producer id; either every seq_no is null (the writer numbers each
    producer's messages on from its last seq_no) or none is and each producer's seq_nos
    rise strictly past its last (then nothing is a duplicate). Anything else (a message
    without a producer, mixed nulls, a duplicate, a negative seq_no, a partition that
    would pass ``limits.PRODUCERS_PER_PARTITION_MAX``) returns None: the caller decides
    share by share with ``decide``. Pure: no state changes (``record_share`` does that).
    The caller holds every partition's write lock from here to the last ``record_share``.
    ``table``: ``pa.Table.from_batches(batches)``, if the caller made it already (a
    table of 1000 batches costs ~2 ms). ``counts``: the batches' row counts, if the
    caller has them (then, with ``table``, no batch is read: ``SpreadDecision.originals``
    keeps ``batches`` as given, for ``batch`` to read when asked).
    """
    assert len(managers) == len(batches) and len(batches)
    assert len(set(map(id, managers))) == len(managers), "one share per partition"
    if counts is None:
        counts = np.fromiter((b.num_rows for b in batches), np.int64, len(batches))
    assert len(counts) == len(batches)
    total = int(counts.sum())
    # The columns of all shares at once (a column of each share costs a few us).
    if table is None:
        table = pa.Table.from_batches(batches)
    assert table.num_rows == total
    seq_column = table.column(SEQ_NO_COLUMN)
    null_seq_nos = seq_column.null_count
    if null_seq_nos not in (0, total):
        return None
    producers = table.column(PRODUCER_COLUMN).combine_chunks()
    if producers.null_count or not pa.types.is_string(producers.type):
        return None
    encoded = producers.dictionary_encode()
    keys = encoded.dictionary.to_pylist()
    key_numbers = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    share_of_row = np.repeat(np.arange(len(batches), dtype=np.int64), counts)
    share_starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    pairs = share_of_row * len(keys) + key_numbers
    order = np.argsort(pairs, kind="stable")  # by share, then key, then row
    sorted_pairs = pairs[order]
    group_starts = np.concatenate(([0], np.flatnonzero(np.diff(sorted_pairs)) + 1))
    group_ends = np.append(group_starts[1:], total)
    group_pairs = sorted_pairs[group_starts]
    group_share_numbers = group_pairs // len(keys)
    group_shares = group_share_numbers.tolist()
    group_keys = [keys[k] for k in (group_pairs % len(keys)).tolist()]
    # The producers' last seq_nos (as ``entry``: expired entries read as absent), and
    # how many keys each partition would learn.
    lasts = np.empty(len(group_starts), np.int64)
    new_keys = [0] * len(batches)
    now = managers[0]._clock.now_us()
    for group, (share, key) in enumerate(zip(group_shares, group_keys, strict=True)):
        manager = managers[share]
        entry = manager._entries.get(key)
        if entry is None:
            new_keys[share] += 1
            lasts[group] = -1
            continue
        # An expired entry is absent (and ``_put`` replaces it: it adds no key).
        live = entry.last_written_at_us + manager._expiry_us > now
        lasts[group] = -1 if not live or entry.last_seq_no is None else entry.last_seq_no
    for manager, adding in zip(managers, new_keys, strict=True):
        if adding and len(manager._entries) + adding > limits.PRODUCERS_PER_PARTITION_MAX:
            return None  # ``_put`` would expire, then maybe refuse: the per-share path
    sizes = group_ends - group_starts
    rank = np.arange(total, dtype=np.int64) - np.repeat(group_starts, sizes)
    if null_seq_nos:
        sorted_seq_nos = np.repeat(lasts, sizes) + 1 + rank
        seq_nos = np.empty(total, np.int64)
        seq_nos[order] = sorted_seq_nos
    else:
        seq_nos = seq_column.to_numpy().astype(np.int64, copy=False)
        sorted_seq_nos = seq_nos[order]
        if (sorted_seq_nos[group_starts] <= lasts).any():  # a negative one too: last >= -1
            return None
        rising = np.diff(sorted_seq_nos) > 0
        rising[group_starts[1:] - 1] = True  # across two groups: no order needed
        if not rising.all():
            return None
    largest = sorted_seq_nos[group_ends - 1].tolist()
    sorted_rows = order - share_starts[share_of_row[order]]
    last_rows = sorted_rows[group_ends - 1].tolist()
    share_bounds = np.searchsorted(group_share_numbers,
                                   np.arange(len(batches) + 1)).tolist()  # fmt: skip
    numbered = seq_nos if null_seq_nos else None
    return SpreadDecision(batches, numbered, share_starts.tolist(), group_keys, largest,
                          last_rows, group_starts.tolist(), group_ends.tolist(),
                          sorted_seq_nos, sorted_rows, share_bounds)  # fmt: skip


def record_share(manager: ProducerStateManager, decision: SpreadDecision, index: int,
                 base_offset: int, written_at_us: int) -> None:  # fmt: skip
    """Update ``manager`` after share ``index`` of ``decision`` was written at
    ``base_offset``: the entries ``record_decision`` would make for that share."""
    low, high = decision.share_bounds[index], decision.share_bounds[index + 1]
    _record_groups(decision, [manager._put] * (high - low), [base_offset] * (high - low),
                   low, high, written_at_us)  # fmt: skip


def record_shares(managers: list[ProducerStateManager], decision: SpreadDecision,
                  base_offsets: list[int], written_at_us: int) -> None:  # fmt: skip
    """``record_share`` of every share (share ``i`` written to ``managers[i]`` at
    ``base_offsets[i]``), in one pass over the groups."""
    bounds = decision.share_bounds
    assert len(managers) == len(base_offsets) == len(bounds) - 1
    sizes = [high - low for low, high in itertools.pairwise(bounds)]
    puts = list(itertools.chain.from_iterable(
        itertools.repeat(manager._put, size) for manager, size in zip(managers, sizes, strict=True)
    ))  # fmt: skip
    bases = list(itertools.chain.from_iterable(
        itertools.repeat(base, size) for base, size in zip(base_offsets, sizes, strict=True)
    ))  # fmt: skip
    _record_groups(decision, puts, bases, 0, bounds[-1], written_at_us)


def _record_groups(decision: SpreadDecision, puts: list[Callable[..., None]], bases: list[int],
                   low: int, high: int, written_at_us: int) -> None:  # fmt: skip
    """Put groups ``low`` to ``high`` of ``decision``: group ``low + k`` through
    ``puts[k]`` (its manager's ``_put``), its share written at ``bases[k]``. A group of
    one message keeps no arrays (``_record_small``: its last seq_no alone finds it); a
    larger one keeps its seq_nos and offsets (copies: an entry never holds a statement's
    arrays alive)."""
    seq_nos, rows = decision.sorted_seq_nos, decision.sorted_rows
    for put, base, key, largest, last_row, start, end in zip(
        puts, bases,
        decision.keys[low:high], decision.largest[low:high], decision.last_rows[low:high],
        decision.group_starts[low:high], decision.group_ends[low:high], strict=True,
    ):  # fmt: skip
        if end - start == 1:
            put(key, largest, base + last_row, written_at_us, _EMPTY, _EMPTY)
        else:
            put(key, largest, base + last_row, written_at_us,
                seq_nos[start:end].copy(), rows[start:end] + base)  # fmt: skip
