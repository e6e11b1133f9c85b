"""A topic on disk: its partitions, their lineage, and producer routing.

Directory ``<data>/topics/<topic id>/`` holds ``topic.json`` (storage config
and partition list, replaced atomically) and one directory per partition,
``p<partition id>/``. The topic id is assigned by the store, never derived from
a user's name, so no name can reach outside the data directory.

Routing: messages with the same key (producer id, else message group id) go to
one partition. Without autopartitioning a key is bound round-robin over active
partitions on first use; the binding lives in the partitions' producer state, so
it survives restarts and expires with it (14 days without writes by default).
With autopartitioning every active partition owns a range of the key hash space
and a key goes to the one whose range holds its hash (``storage.autopartition``,
docs/autopartitioning.md); messages without a key go round-robin.

Partitions have a lineage (parent, children) and may be inactive (read-only
after a split); routing never picks an inactive partition. A split
(``split``) is atomic: the children's directories (empty logs, each seeded with
the parent's producer states of its half, so seq_no dedup follows a producer)
are made and synced first, then one replace of ``topic.json`` makes the parent
inactive and the children active. A crash before that replace leaves directories
that ``topic.json`` does not list: ``_load`` deletes them. A write that meets the
parent already inactive was not written and is routed again; a transactional
publish aimed at an inactive partition goes to the active descendant holding
each message's key (``_publish_to_lineage``), idempotently.

Write speed: each write waits for its partition's token bucket
(``autopartition.WriteSpeed``) outside every lock, then is metered; after a
write the partition splits if the rule holds (``_after_write``).
"""

from __future__ import annotations

import bisect
import itertools
import json
import os
import struct
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, overload

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from storage import failpoints, file_names, limits, staged_frames
from storage.autopartition import (
    THROTTLE_DELAY_S_MAX,
    AutoPartitioning,
    KeyRange,
    WriteSpeed,
    even_ranges,
    key_hash,
)
from storage.clock import Clock
from storage.codecs import Codec
from storage.config import FsyncPolicy, TopicConfig
from storage.errors import (
    InvalidParameterValueError,
    LimitExceededError,
    ObjectNotInPrerequisiteStateError,
    PartitionInactiveError,
    QueryCanceledError,
)
from storage.frame_cuts import PRODUCER_COLUMN
from storage.fs import FileSystem
from storage.group_commit import GroupCommitter, Request
from storage.ledger import LedgerWhole
from storage.ledger_route import Readers, TopicLedger, open_topic_ledger
from storage.partition_log import WRITTEN, AppendResult, PartitionLog, ReadResult
from storage.record_batch import METADATA_TYPE, WIRE_SCHEMA, check_wire_batch
from storage.spread_publish import checked_shares, publish_shares
from storage.staged_frames import StagedFrame

METADATA_FILE = "topic.json"
CANCEL_CHECK_S = 0.1  # how often a throttled write looks at its statement's cancel flag

# Every change of any topic's partitions (all or active: a split, an added or removed
# partition, a topic opened or created) bumps this process-wide counter, after the change:
# a plan kept while it is unchanged still names the partitions there are
# (``engine.kept_plans``). Under its lock, so that no bump is lost.
_layout_lock = threading.Lock()
_layout_generation = 0


def layout_generation() -> int:
    """The partitions' generation (see above): unchanged means no topic's partitions
    changed since it was read."""
    return _layout_generation


def _layout_changed() -> None:
    global _layout_generation
    with _layout_lock:
        _layout_generation += 1


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    partition_id: int
    active: bool
    parent: int | None
    children: tuple[int, ...]
    key_range: KeyRange | None = None  # set on topics with autopartitioning
    split_at_us: int | None = None  # when the partition split (inactive ones)


@dataclass(frozen=True, slots=True)
class TopicAppendResult:
    """Per-message outcome in input order: partition, status and offset arrays."""

    partitions: np.ndarray
    status: np.ndarray
    offsets: np.ndarray

    @property
    def written_count(self) -> int:
        return int(np.count_nonzero(self.status == WRITTEN))

    @property
    def duplicate_count(self) -> int:
        return int(len(self.status) - self.written_count)


class TopicLog:
    def __init__(
        self,
        fs: FileSystem,
        directory: str,
        topic_id: str,
        clock: Clock,
        *,
        create: bool,
        ledger: bool = False,
        readers: Readers | None = None,
    ) -> None:
        """``readers``: the topic's readers' next offsets, for the ledger's kept files
        (``storage.ledger_route.Readers``; the store passes its engine's lookup)."""
        self._readers = readers
        self.fs = fs
        self.directory = directory
        self.topic_id = topic_id
        self.clock = clock
        self.data_ready = threading.Condition()
        self._lock = threading.Lock()
        self._round_robin = 0
        # Keyless batches join the partition of the last keyless batch while its group
        # commit is in progress (``_keyless_partition``); messages sent to it since.
        self._keyless_last: int | None = None
        self._keyless_joined = 0
        # Appends in progress on the topic (``append``, from its routing on when the
        # caller routed first): a hint for joining a running round (``_keyless_partition``).
        self._appending = 0
        self._appending_lock = threading.Lock()
        # Small keyless batches of many sessions combined into one append (``append_keyless``).
        self._combiner = GroupCommitter(self._append_combined)
        # keyless batches routed per active partition (and in all) since the active set
        # last changed: the fair-share guard on joins (``_keyless_partition``)
        self._keyless_sent: dict[int, int] = {}
        self._keyless_total = 0
        self._keyless_active: tuple[int, ...] = ()
        self._pending_bindings: dict[str, int] = {}
        self.config = TopicConfig()
        self.autopartitioning = AutoPartitioning()
        self._partitions: dict[int, PartitionLog] = {}
        # each partition's log start, kept by the partitions (``start_offsets``)
        self._log_starts: dict[int, int] = {}
        self._info: dict[int, PartitionInfo] = {}
        # True once some partition has a parent (a split, or loaded with one); stays True
        # after a split rolled back (only the slow path of ``has_lineage``'s callers).
        self._split_once = False
        self._speeds: dict[int, WriteSpeed] = {}
        # Per inactive partition: where redirected publishes wrote since its last sync.
        self._redirected: dict[int, set[int]] = {}
        self._next_id = 0
        # Active ranges by their low end, for routing: (lows, partition ids), sorted.
        self._range_lows: list[int] = []
        self._range_owners: list[int] = []
        self.sleep: Callable[[float], None] = time.sleep  # tests inject a fake one
        self.splits = 0
        # The topic's ledger (``storage.ledger_route``) when the store's switch is on;
        # opened after the partitions (their ends are its recovery's input).
        self.ledger: TopicLedger | None = None
        self._ledger_on = ledger
        if not create:
            self._load()

    # -- creation and metadata --------------------------------------------------------
    def create(self, config: TopicConfig, autopartitioning: AutoPartitioning | None = None) -> None:
        config.validate()
        self.fs.make_directory(self.directory)
        self.config = config
        self.autopartitioning = (autopartitioning or AutoPartitioning()).validate()
        ranges = even_ranges(config.partition_count) if self.autopartitioning.ranged else None
        for partition_id in range(config.partition_count):
            key_range = None if ranges is None else ranges[partition_id]
            self._info[partition_id] = PartitionInfo(partition_id, True, None, (), key_range)
        self._next_id = config.partition_count
        self._save()
        for partition_id in self._info:
            self._open_partition(partition_id)
        self._index_ranges()
        self.ledger = open_topic_ledger(self.fs, self.directory, self._partitions, self._ledger_on,
                                        self._removed_partitions(), self._readers)

    def _load(self) -> None:
        # A replace of topic.json cut short (before its rename) leaves the temp file; the
        # old topic.json stands. Recovery deletes the leftover, as partitions do theirs.
        self.fs.remove(os.path.join(self.directory, METADATA_FILE + file_names.TEMP_SUFFIX))
        payload = json.loads(self.fs.read_file(os.path.join(self.directory, METADATA_FILE)))
        self.config = _config_from_json(payload["config"])
        self.autopartitioning = AutoPartitioning.from_json(payload.get("autopartitioning"))
        for item in payload["partitions"]:
            info = PartitionInfo(
                item["id"],
                item["active"],
                item["parent"],
                tuple(item["children"]),
                KeyRange.from_json(item.get("range")),
                item.get("split_at_us"),
            )
            self._info[info.partition_id] = info
            self._split_once = self._split_once or info.parent is not None
        next_id = payload.get("next_partition_id")  # (not written before splits existed)
        self._next_id = next_id if isinstance(next_id, int) else self.config.partition_count
        self._remove_unlisted_partitions()
        for partition_id in self._info:
            self._open_partition(partition_id)
        self._index_ranges()
        self.ledger = open_topic_ledger(self.fs, self.directory, self._partitions, self._ledger_on,
                                        self._removed_partitions(), self._readers)

    def _remove_unlisted_partitions(self) -> None:
        """Delete partition directories ``topic.json`` does not list: a split that
        crashed before its commit point (the children), or a removal after it."""
        for name in self.fs.list_directory(self.directory):
            if name.startswith("p") and name[1:].isdigit() and int(name[1:]) not in self._info:
                self.fs.remove_tree(os.path.join(self.directory, name))

    def _save(self) -> None:
        payload = {
            "id": self.topic_id,
            "config": _config_to_json(self.config),
            "autopartitioning": self.autopartitioning.to_json(),
            "next_partition_id": self._next_id,
            "partitions": [
                {
                    "id": i.partition_id,
                    "active": i.active,
                    "parent": i.parent,
                    "children": list(i.children),
                    "range": None if i.key_range is None else i.key_range.to_json(),
                    "split_at_us": i.split_at_us,
                }
                for i in sorted(self._info.values(), key=lambda i: i.partition_id)
            ],
        }
        self.fs.write_file_atomic(
            os.path.join(self.directory, METADATA_FILE), json.dumps(payload, indent=1).encode()
        )

    def _open_partition(self, partition_id: int) -> PartitionLog:
        partition = PartitionLog(
            self.fs,
            os.path.join(self.directory, f"p{partition_id}"),
            partition_id,
            self.config,
            self.clock,
            self.data_ready,
        )
        partition.active = self._info[partition_id].active
        partition.redirect = self._redirect_of(partition_id)
        partition.sync_redirected = self._sync_redirected_of(partition_id)
        # in the start table before it is listed: a poll planned from ``partition_ids``
        # finds its start (a review: the other order refused a poll during a split)
        partition.start_table = self._log_starts
        self._log_starts[partition_id] = partition.start_offset
        self._partitions[partition_id] = partition
        if self.ledger is not None:
            self.ledger.attach(partition)
        self._speeds[partition_id] = WriteSpeed(
            self.autopartitioning.speed, self.autopartitioning.burst, self.clock.now_us()
        )
        return partition

    def _redirect_of(self, partition_id: int) -> Callable[[list[pa.RecordBatch], int], None]:
        def redirect(batches: list[pa.RecordBatch], transaction_id: int) -> None:
            for batch in batches:
                self._publish_to_lineage(partition_id, batch, transaction_id)

        return redirect

    def _sync_redirected_of(self, partition_id: int) -> Callable[[], None]:
        """Sync the partitions that publishes redirected from ``partition_id`` wrote to:
        a checkpoint syncs the partition a transaction was routed to before it deletes
        the commit record, so that sync must cover where the data really went."""

        def sync_redirected() -> None:
            with self._lock:
                targets = self._redirected.pop(partition_id, set())
            try:
                for target in sorted(targets):
                    log = self._partitions.get(target)
                    if log is not None:
                        log.sync()
            except BaseException:
                with self._lock:
                    self._redirected.setdefault(partition_id, set()).update(targets)
                raise

        return sync_redirected

    def _index_ranges(self) -> None:
        """Rebuild the routing index of active ranges (caller holds ``_lock`` or owns us)."""
        owned = sorted(
            (i.key_range.low, i.partition_id)
            for i in self._info.values()
            if i.active and i.key_range is not None
        )
        self._range_lows = [low for low, _ in owned]
        self._range_owners = [partition_id for _, partition_id in owned]
        _layout_changed()  # every change of the partitions ends here (or below)

    def alter(self, config: TopicConfig, autopartitioning: AutoPartitioning | None = None) -> None:
        """Change storage settings; adding partitions is allowed, removing is not.

        On a ranged topic (autopartitioning on) partitions are added by splitting
        the widest active ranges. Turning autopartitioning on gives the active
        partitions even ranges; it cannot be turned off again.
        """
        config.validate()
        auto = (autopartitioning or self.autopartitioning).validate()
        if self.autopartitioning.ranged and not auto.ranged:
            raise ObjectNotInPrerequisiteStateError(
                "auto-partitioning, once enabled, cannot be disabled; pause it instead"
            )
        with self._lock:
            current = self._next_id  # ids handed out so far (splits included)
            added = config.partition_count - self.config.partition_count
            if added < 0:
                raise InvalidParameterValueError(
                    f"partitions can be added but not removed (topic has "
                    f"{self.config.partition_count})"
                )
            by_splits = self.autopartitioning.ranged  # ranged already: adds are splits
            new_ids = [] if by_splits else list(range(current, current + added))
            self.config = replace(
                config, partition_count=self.config.partition_count + len(new_ids)
            )
            for partition in self._partitions.values():
                partition.config = self.config
            for partition_id in new_ids:
                self._info[partition_id] = PartitionInfo(partition_id, True, None, ())
            self._next_id = current + len(new_ids)
            if auto.ranged and not self.autopartitioning.ranged:
                active = self.active_partition_ids()
                for partition_id, key_range in zip(active, even_ranges(len(active)), strict=True):
                    self._info[partition_id] = replace(
                        self._info[partition_id], key_range=key_range
                    )
            self.autopartitioning = auto
            for speed in self._speeds.values():
                speed.configure(auto.speed, auto.burst)
            self._save()
            for partition_id in new_ids:
                self._open_partition(partition_id)
            self._index_ranges()
        for _ in range(added if by_splits else 0):
            if self.split(self._widest_active(), force=True) is None:
                break

    def _widest_active(self) -> int:
        def width(partition_id: int) -> int:
            key_range = self._info[partition_id].key_range
            assert key_range is not None
            return key_range.high - key_range.low

        return max(self.active_partition_ids(), key=width)

    # -- partitions ---------------------------------------------------------------------
    def partition(self, partition_id: int) -> PartitionLog:
        try:
            return self._partitions[partition_id]
        except KeyError:
            raise InvalidParameterValueError(
                f"topic has no partition {partition_id}", partition=partition_id
            ) from None

    def partition_ids(self) -> list[int]:
        return sorted(self._partitions)

    def partition_info(self, partition_id: int) -> PartitionInfo:
        return self._info[partition_id]

    def has_lineage(self) -> bool:
        """Whether some partition may have a parent (the topic split at least once): a
        flag, set before any parent is, never cleared; O(1) for a poll."""
        return self._split_once

    def active_partition_ids(self) -> list[int]:
        return [i for i in sorted(self._info) if self._info[i].active]

    @property
    def next_partition_id(self) -> int:
        """The id the next new partition gets (a split's children take it and the next)."""
        return self._next_id

    def write_speed(self, partition_id: int) -> WriteSpeed:
        """The partition's token bucket and meter (memory only; restarts begin anew)."""
        return self._speeds[partition_id]

    def mark_inactive(self, partition_id: int, children: tuple[int, ...]) -> None:
        """Make a partition read-only with the given children (autopartitioning).

        Each child records ``partition_id`` as its parent in the same save, so the
        lineage is whole on disk or not there at all. A child must be another
        existing partition with no parent yet; a partition has one parent.
        """
        with self._lock:
            info = self._info.get(partition_id)
            if info is None:
                raise InvalidParameterValueError(
                    f"topic has no partition {partition_id}", partition=partition_id
                )
            for child in children:
                child_info = self._info.get(child)
                if child == partition_id or child_info is None:
                    raise InvalidParameterValueError(
                        f"partition {child} cannot be a child of partition {partition_id}",
                        partition=partition_id,
                    )
                if child_info.parent not in (None, partition_id):
                    raise ObjectNotInPrerequisiteStateError(
                        f"partition {child} already has parent {child_info.parent}"
                    )
            self._split_once = self._split_once or bool(children)
            for child in children:
                child_info = self._info[child]
                self._info[child] = replace(child_info, parent=partition_id)
            self._info[partition_id] = replace(
                info, active=False, children=children, split_at_us=self.clock.now_us()
            )
            self._partitions[partition_id].active = False
            failpoints.hit("split.before_save")
            self._save()
            self._index_ranges()

    def split(self, partition_id: int, *, force: bool = False) -> tuple[int, int] | None:
        """Split an active ranged partition at the middle of its range; the children's ids.

        None when it cannot (inactive, unranged, a one-hash range, or at the
        limit of active partitions unless ``force``, which ALTER's adds use).
        Atomic: see the module docstring. Writes to the parent wait for its write
        lock meanwhile and then find it inactive.
        """
        with self._lock:
            info = self._info.get(partition_id)
            if info is None or not info.active or info.key_range is None:
                return None
            if info.key_range.high - info.key_range.low < 2:
                return None
            active = len(self.active_partition_ids())
            if not force and active >= self._max_active():
                return None
            if active + 1 > limits.PARTITIONS_PER_TOPIC_MAX:
                return None
            parent = self._partitions[partition_id]
            with parent.writes_paused():
                return self._split_locked(info, parent)

    def _max_active(self) -> int:
        limit = self.autopartitioning.max_active
        return (
            min(limit, limits.PARTITIONS_PER_TOPIC_MAX)
            if limit
            else limits.PARTITIONS_PER_TOPIC_MAX
        )

    def _split_locked(self, info: PartitionInfo, parent: PartitionLog) -> tuple[int, int]:
        assert info.key_range is not None and info.active
        halves = info.key_range.halves()
        child_ids = (self._next_id, self._next_id + 1)
        states = {key: parent.producers.entry(key) for key in parent.producers.live_keys()}
        for child_id, half in zip(child_ids, halves, strict=True):
            directory = os.path.join(self.directory, f"p{child_id}")
            self.fs.remove_tree(directory)  # a crashed split's leftover, if any
            self.fs.make_directory(directory)
            mine = {k: e for k, e in states.items() if e is not None and half.contains(key_hash(k))}
            _write_seed_snapshot(self.fs, directory, mine)
            failpoints.hit("split.after_child")
        self.fs.sync_directory(self.directory)
        saved = dict(self._info), self._next_id, self.config
        now_us = self.clock.now_us()
        self._info[info.partition_id] = replace(
            info, active=False, children=child_ids, split_at_us=now_us
        )
        self._split_once = True  # before the children: a reader never misses a parent
        for child_id, half in zip(child_ids, halves, strict=True):
            self._info[child_id] = PartitionInfo(child_id, True, info.partition_id, (), half)
        self._next_id += 2
        self.config = replace(self.config, partition_count=self.config.partition_count + 2)
        try:
            failpoints.hit("split.before_save")
            self._save()  # the commit point
        except BaseException:
            self._info, self._next_id, self.config = saved[0], saved[1], saved[2]
            _layout_changed()  # planners may have seen the children meanwhile
            for child_id in child_ids:
                self.fs.remove_tree(os.path.join(self.directory, f"p{child_id}"))
            raise
        try:  # past the commit point: the split is on disk, memory follows
            failpoints.hit("split.after_save")
            parent.active = False
            for partition in self._partitions.values():
                partition.config = self.config
            for child_id in child_ids:
                self._open_partition(child_id)
            self._index_ranges()
        except BaseException as error:  # (a MemoryError under the process memory cap)
            # Fail-stop: routing may still send the children's keys to the parent, whose
            # writes would land after the split the files record (the children's
            # producer states, seeded above, would not know them: a resend accepted
            # twice). The parent refuses writes until reopen, which reads the split whole.
            parent.active = False
            parent.fence_for(error)
            raise
        self.splits += 1
        return child_ids

    def _removed_partitions(self) -> frozenset[int]:
        """The ids handed out that the topic no longer lists: partitions removed (inactive,
        every row expired). Their rows left in the ledger's kept files count as copied."""
        return frozenset(range(self._next_id)) - self._info.keys()

    def remove_partition(self, partition_id: int) -> None:
        """Delete an inactive partition (all its data expired). Refused (55000, nothing
        changed; a later retention pass tries again) while it has redirected publishes
        not synced or ledger rows not copied: an inactive partition takes no new rows,
        so the copy made first, outside the topic's lock (its syncs take that lock:
        ``sync_redirected``), leaves none but in a race with a split's last publish."""
        if not self._info[partition_id].active and self.ledger is not None:
            self.ledger.copy_all()  # its ledger rows synced in its log and released
        with self._lock:
            if self._info[partition_id].active:
                raise ObjectNotInPrerequisiteStateError("an active partition cannot be removed")
            if self._redirected.get(partition_id):
                raise ObjectNotInPrerequisiteStateError(
                    f"partition {partition_id} has redirected publishes not synced yet"
                )
            if self.ledger is not None and partition_id in self.ledger.ledger.pending():
                raise ObjectNotInPrerequisiteStateError(
                    f"partition {partition_id} has ledger rows not copied yet"
                )
            partition = self._partitions.pop(partition_id)
            partition.start_table = None
            self._log_starts.pop(partition_id, None)
            del self._info[partition_id]
            _layout_changed()
            self._speeds.pop(partition_id, None)
            self._save()
        partition.delete()

    # -- routing and appends -----------------------------------------------------------
    def partition_for_key(self, key: str) -> int:
        """The partition of ``key``: its range's (ranged topics), else its binding."""
        with self._lock:
            return self._partition_for_key_locked(key)

    def _partition_for_key_locked(self, key: str) -> int:
        return self._partitions_for_keys_locked([key])[0]

    def _partitions_for_keys_locked(self, keys: list[str]) -> list[int]:
        """The partition of each of ``keys`` (distinct): its range's (ranged topics), else
        the active partition holding the key's newest live producer entry (the first such
        in partition order on a tie), else its pending binding, else the next partition
        round-robin, bound in the order of ``keys``.

        One pass over the partitions, each intersecting ``keys`` with its producer table,
        rather than one pass per key: the cost grows with partitions + keys, not their
        product.
        """
        if self.autopartitioning.ranged:
            return [self._partition_for_hash(key_hash(key)) for key in keys]
        wanted = set(keys)
        assert len(wanted) == len(keys), "keys are distinct"
        best: dict[str, tuple[int, int]] = {}
        for partition_id, partition in self._partitions.items():
            if not partition.active:
                continue
            for key, entry in partition.producers.live_entries(wanted).items():
                held = best.get(key)
                if held is None or entry.last_written_at_us > held[0]:
                    best[key] = (entry.last_written_at_us, partition_id)
        chosen = []
        active: list[int] | None = None  # the active ids, once a key needs the round robin
        for key in keys:
            held = best.get(key)
            if held is not None:
                chosen.append(held[1])
                continue
            pending = self._pending_bindings.get(key)
            if pending is not None and self._info[pending].active:
                chosen.append(pending)
                continue
            if active is None:  # (a first statement of 2,000 new producers over 1000
                active = self.active_partition_ids()  # partitions: 140 ms once a key)
            partition_id = self._next_round_robin(active)
            if len(self._pending_bindings) > limits.PRODUCERS_PER_PARTITION_MAX:
                self._pending_bindings.clear()
            self._pending_bindings[key] = partition_id
            chosen.append(partition_id)
        return chosen

    def _partition_for_hash(self, value: int) -> int:
        index = bisect.bisect_right(self._range_lows, value) - 1
        assert index >= 0, "the active ranges cover the hash space"
        partition_id = self._range_owners[index]
        key_range = self._info[partition_id].key_range
        assert key_range is not None and key_range.contains(value)
        return partition_id

    def _next_round_robin(self, active: list[int] | None = None) -> int:
        """The next active partition in turn (``active``: the active ids, if the caller
        has them already)."""
        active = self.active_partition_ids() if active is None else active
        if not active:
            raise ObjectNotInPrerequisiteStateError("topic has no active partition")
        partition_id = active[self._round_robin % len(active)]
        self._round_robin += 1
        return partition_id

    def _keyless_partition(self, messages: int) -> int:
        """The partition of a keyless batch (caller holds the lock): the last keyless
        batch's partition while appends there already wait for its next group-commit
        round and fewer than ``limits.KEYLESS_JOIN_MESSAGES_MAX`` messages have joined
        it; else the next one round-robin.

        Joining shares a sync that is coming anyway: 16 concurrent one-message
        statements over 4 partitions made ~2.1 messages per fsync round-robin, ~2.9
        joining, with ~16 % less server CPU a message (Kafka's sticky partitioner makes
        the same trade for its batches). Only a round that already has company is
        joined: with a lone round (few clients) the batch would wait for the running
        sync and then sync alone, twice the latency of leading a round on another
        partition (joining any running round: 2 clients 0.6x msgs/s; 16 clients 6.8
        messages per fsync but no more msgs/s than this rule).
        A running round with nobody waiting yet is joined too while at least
        ``limits.KEYLESS_JOIN_BUSY_APPENDS`` other appends of the topic are in progress
        (``_appending``): the next round is bound to have company then. 16 clients over
        the wire: 2.8 -> 5.7 messages per fsync, ~8-10 % less server CPU a message; 2 and
        4 clients never meet the bound (unchanged: docs/durable_produce.md, round 4).
        Statements one after another never find waiting appends, so they go round-robin.
        A partition joins only while it has taken fewer keyless batches than the average
        of the active partitions plus the cap: a partition kept busy by keyed writers
        (always with appends waiting) would otherwise draw most keyless traffic; with the
        guard no partition runs ahead of the average by more than one run of the cap.
        Moving on is plain round robin (shared with new producers' bindings).
        """
        last = self._keyless_last
        info = None if last is None else self._info.get(last)
        log = None if last is None else self._partitions.get(last)
        share = max(1, len(self._keyless_active))
        if (
            last is not None
            and self._keyless_joined < limits.KEYLESS_JOIN_MESSAGES_MAX
            and info is not None
            and info.active
            and log is not None
            and (
                log.sync_waiters > 0
                or (log.sync_running and self._appending >= limits.KEYLESS_JOIN_BUSY_APPENDS)
            )
            and self._keyless_sent.get(last, 0) * share
            < self._keyless_total + limits.KEYLESS_JOIN_MESSAGES_MAX * share
        ):
            self._keyless_joined += messages
            self._count_keyless(last)
            return last
        active = self.active_partition_ids()
        partition_id = self._next_round_robin(active)
        if tuple(active) != self._keyless_active:  # a split or ALTER: a fresh tally
            self._keyless_active = tuple(active)
            self._keyless_sent, self._keyless_total = {}, 0
        self._count_keyless(partition_id)
        self._keyless_last, self._keyless_joined = partition_id, messages
        return partition_id

    def _count_keyless(self, partition_id: int) -> None:
        self._keyless_sent[partition_id] = self._keyless_sent.get(partition_id, 0) + 1
        self._keyless_total += 1

    def last_seq_no(self, producer_id: str) -> int | None:
        """The producer's largest written seq_no, to continue after a restart."""
        partition_id = self.partition_for_key(producer_id)
        return self._partitions[partition_id].last_seq_no(producer_id)

    def append(
        self,
        batch: pa.RecordBatch,
        partition: int | None = None,
        *,
        max_delay_s: float = THROTTLE_DELAY_S_MAX,
        cancelled: Callable[[], bool] | None = None,
        targets: np.ndarray | None = None,
    ) -> TopicAppendResult:
        """Append a wire batch, routing each message by its key unless ``partition`` is given
        (``targets``: the batch's ``route``, if the caller routed it already).

        Each partition's share first waits for that partition's write speed (at most
        ``max_delay_s``, else 53000 and that share not written; ``cancelled`` turning
        true during the wait ends it with 57014, the share not written). Shares of other
        partitions appended before it stay written: like any failure of a write that
        spreads over partitions, it is atomic per partition, not across them (a
        transaction is). A share that meets its partition inactive (a split meanwhile:
        nothing was written) is routed again.
        """
        with self._appending_lock:
            self._appending += 1
        try:
            return self._append(batch, partition, max_delay_s, cancelled, targets)
        finally:
            with self._appending_lock:
                self._appending -= 1

    def append_keyless(self, batch: pa.RecordBatch) -> TopicAppendResult:
        """``append(batch)`` for a keyless batch (no producer id, no message group), which
        while the topic is busy is combined with other sessions' into one append.

        Combined: a batch of at most ``limits.COMBINE_MESSAGES_MAX`` messages and
        ``limits.COMBINE_BYTES_MAX`` bytes (all its buffers, metadata too: what
        ``check_wire_batch`` counts against ``BATCH_BYTES_MAX``), while at least
        ``limits.KEYLESS_JOIN_BUSY_APPENDS`` other appends of the topic are in progress,
        is first checked as ``append`` would check the batch itself (schema, limits,
        codecs: the topic's settings, the same for every partition), then queued; one
        thread at a time takes everything queued, appends it as one batch (routed once,
        one frame in its partition's group commit) and hands each batch its own slice of
        the outcome. A batch is acknowledged only once that append returned, i.e. after
        its sync; a failing append fails exactly the batches that were in it. Keyless
        messages have no producer state to deduplicate against and no key to keep
        together, so the combined append stores each as its own append would have (only
        the partition and the frame are shared); a partition's state (fenced, inactive)
        is the combined append's to meet, as it is ``append``'s. Otherwise: ``append``.
        """
        count = batch.num_rows
        assert batch.column(1).null_count == count and batch.column(2).null_count == count
        if (
            self._appending < limits.KEYLESS_JOIN_BUSY_APPENDS
            or count > limits.COMBINE_MESSAGES_MAX
            or batch.get_total_buffer_size() > limits.COMBINE_BYTES_MAX
        ):
            return self.append(batch)
        active = self.active_partition_ids()
        if active:  # none: ``append`` gives the error (the partitions' state is its too)
            self._partitions[active[0]].check_batch(batch)
        with self._appending_lock:
            self._appending += 1
        try:
            return self._combiner.submit(batch)
        finally:
            with self._appending_lock:
                self._appending -= 1

    def _append_combined(self, requests: list[Request]) -> None:
        """The combiner's round: every queued batch in one ``append``, chunked at
        ``limits.COMBINED_MESSAGES_MAX`` messages and ``limits.COMBINED_BYTES_MAX`` bytes
        (the batches' total buffer sizes), each request's result its rows' slice; a
        failing append sets its error on the requests it held (the others stand).

        A chunk whose joined batch the topic refuses before anything is written (a size
        limit, an Arrow error joining it) is appended one request at a time, so each
        session meets only its own batch's outcome, never a limit of a batch it did not
        send.
        """
        start = 0
        while start < len(requests):
            end, messages, size = start, 0, 0
            while end < len(requests):
                payload = requests[end].payload
                grown = size + payload.get_total_buffer_size()
                if end > start and (
                    messages + payload.num_rows > limits.COMBINED_MESSAGES_MAX
                    or grown > limits.COMBINED_BYTES_MAX
                ):
                    break
                messages, size = messages + payload.num_rows, grown
                end += 1
            assert end > start, "every chunk holds at least one request"
            chunk = requests[start:end]
            batches = [request.payload for request in chunk]
            if len(batches) == 1:
                self._append_requests(chunk, batches[0])
            else:
                try:  # nothing is written yet: a refusal here is the joined batch's
                    combined = pa.concat_batches(batches)
                    check_wire_batch(combined)
                except (LimitExceededError, pa.ArrowInvalid):
                    for request in chunk:
                        self._append_requests([request], request.payload)
                except Exception as error:  # this chunk's statements fail, alone: earlier
                    for request in chunk:  # chunks are written and keep their results
                        request.error = error
                else:
                    self._append_requests(chunk, combined)
            start = end

    def _append_requests(self, chunk: list[Request], combined: pa.RecordBatch) -> None:
        """Append ``combined`` (the chunk's batches in order) and give each request its
        rows' slice of the outcome, or the append's error."""
        try:
            result = self.append(combined)
        except Exception as error:  # the chunk's statements fail with it, alone
            for request in chunk:
                request.error = error
            return
        row = 0
        for request in chunk:
            rows = slice(row, row + request.payload.num_rows)
            request.result = TopicAppendResult(
                result.partitions[rows], result.status[rows], result.offsets[rows]
            )
            row = rows.stop
        assert row == combined.num_rows

    def _append(
        self,
        batch: pa.RecordBatch,
        partition: int | None,
        max_delay_s: float,
        cancelled: Callable[[], bool] | None,
        targets: np.ndarray | None,
    ) -> TopicAppendResult:
        """``append``'s work (counted in ``_appending`` by it)."""
        if partition is not None:
            log = self.partition(partition)
            size = _payload_bytes(batch)
            self._throttle(partition, size, max_delay_s, cancelled)
            result = log.append(batch)
            self._after_write(partition, size)
            return _topic_result([(np.arange(batch.num_rows), result)], batch.num_rows)
        pieces: list[tuple[np.ndarray, AppendResult]] = []
        pending = [(np.arange(batch.num_rows), batch)]
        for _ in range(limits.PARTITIONS_PER_TOPIC_MAX):
            if not pending:
                break
            rows, part = pending.pop()
            routed = self.route(part) if targets is None else targets
            targets = None  # a retry (after a split) routes again
            shares = _shares(part, routed)
            if self._in_parallel(len(shares)):
                outcomes = _append_in_parallel(
                    [(self._partitions[partition_id], piece) for partition_id, _, piece in shares]
                )
            else:
                outcomes = None
            failure: BaseException | None = None
            for index, (partition_id, chosen, piece) in enumerate(shares):
                size = _payload_bytes(piece)
                if outcomes is None:
                    self._throttle(partition_id, size, max_delay_s, cancelled)
                    try:
                        result = self._partitions[partition_id].append(piece)
                    except PartitionInactiveError:
                        pending.append((rows[chosen], piece))
                        continue
                else:
                    outcome = outcomes[index]
                    if isinstance(outcome, PartitionInactiveError):
                        pending.append((rows[chosen], piece))
                        continue
                    if isinstance(outcome, BaseException):
                        failure = failure or outcome
                        continue
                    result = outcome
                pieces.append((rows[chosen], result))
                self._after_write(partition_id, size)
            if failure is not None:  # the other shares were written and metered
                raise failure
        assert not pending, "routing settles: each retry follows a split that happened"
        return _topic_result(pieces, batch.num_rows)

    def spread_commit_allowed(self) -> bool:
        """Whether a write spreading over many partitions may be made durable by one sync
        elsewhere (a caller's durable record of all its shares, which recovery replays
        into the partitions) and then written to each partition without its own sync:
        on synced topics whose writes are neither throttled nor metered for splits
        (``publish_transactional`` waits for no write speed)."""
        return (
            self.config.fsync_policy is not FsyncPolicy.NEVER
            and not self.autopartitioning.throttled
            and not self.autopartitioning.splits
        )

    def shares(self, batch: pa.RecordBatch, targets: np.ndarray) -> Shares:
        """``batch`` split by ``targets`` (its ``route``): (partition id, its rows in
        ``batch`` in order, those rows as a batch), lowest partition first.

        One take of the whole batch in partition order, then zero-copy slices of it,
        each made when first read (``Shares``: the ledger path reads none; a take per
        share costs ~35 us, 1000 of them per statement over 1000 partitions). A
        slice's ``get_total_buffer_size`` is its parent's, so the caller checks the
        whole batch against the limits (``check_wire_batch``). The metadata column must
        be all null (then each slice gets a null column of its length): IPC writes a
        sliced map column's child offsets whole; with metadata, a take per share as
        before."""
        if len(targets) and (targets == targets[0]).all():
            return _one_share(batch, int(targets[0]))
        if batch.column(METADATA_COLUMN).null_count != batch.num_rows:
            return _shares(batch, targets)  # a sliced map column would be written whole
        order, ordered, bounds = _share_order(targets)
        whole = batch.take(pa.array(order))
        field = whole.schema.field(METADATA_COLUMN)
        whole = whole.set_column(METADATA_COLUMN, field, _null_metadata(len(order)))
        ids = ordered[bounds[:-1]].tolist()
        return Shares(ids, order, bounds, whole=whole)

    def _in_parallel(self, shares: int) -> bool:
        """Whether a statement's shares are appended concurrently (``_append_in_parallel``):
        when there are many, each waits for a sync, and none waits for a write speed or
        may split (unthrottled topics only: their writes are neither metered nor split)."""
        return (
            shares >= PARALLEL_SHARES_MIN
            and not self.autopartitioning.throttled
            and not self.autopartitioning.splits
            and self.config.fsync_policy is not FsyncPolicy.NEVER
        )

    def _throttle(
        self,
        partition_id: int,
        size: int,
        max_delay_s: float,
        cancelled: Callable[[], bool] | None,
    ) -> None:
        """Wait for ``size`` bytes of the partition's write speed (see ``append``)."""
        if not self.autopartitioning.throttled:
            return
        speed = self._speeds[partition_id]
        delay_s = speed.reserve(size, self.clock.now_us(), max_delay_s)
        if delay_s <= 0:
            return
        if cancelled is None:
            self.sleep(delay_s)
            return
        left = delay_s
        while left > 1e-9:  # in slices, so that a cancel (statement_timeout) ends the wait
            if cancelled():
                speed.refund(size, left)
                raise QueryCanceledError(
                    "canceling statement due to user request (while waiting for the "
                    "partition's write speed)"
                )
            step = min(left, CANCEL_CHECK_S)
            self.sleep(step)
            left -= step

    def _after_write(self, partition_id: int, size: int) -> None:
        """Meter the write; split the partition if the rule now holds."""
        speed = self._speeds.get(partition_id)
        if speed is None:
            return
        now_us = self.clock.now_us()
        speed.record(size, now_us)
        auto = self.autopartitioning
        if not auto.splits or not self._info[partition_id].active:
            return
        threshold = auto.speed * auto.up_percent / 100
        if speed.above_for(threshold, auto.window_seconds, now_us):
            self.split(partition_id)

    def publish_staged(self, frames: list[StagedFrame], partition: int, transaction_id: int,
                       then: pa.RecordBatch | None = None) -> None:  # fmt: skip
        """Publish a committed share staged as frames (``storage.staged_frames``) to
        ``partition`` (``PartitionLog.publish_staged``: no re-encoding, the bodies copied
        in the kernel), then ``then``, the share's rows that are not frames (a bulk
        commit's topic staged both ways: ``engine.commit``), as ``publish_transactional``.
        A partition that split since sends the share to its descendants as
        ``publish_transactional`` would (``_publish_staged_to_lineage``), also frame by
        frame: a share of any size (a framed share is not held to one transaction's
        per-partition limits) is never decoded whole. The frames are all published (here
        or below) before any row of ``then``: the lineage's counts rely on it."""
        if frames:
            size = sum(frame.body_bytes for frame in frames)
            published = False
            if self._info[partition].active:
                try:
                    self.partition(partition).publish_staged(frames, transaction_id)
                except PartitionInactiveError:
                    pass  # split since the check: to the lineage, below
                else:
                    self._after_write(partition, size)
                    published = True
            if not published:
                self._publish_staged_to_lineage(partition, frames, transaction_id, then)
                return
        if then is not None and then.num_rows:
            failpoints.hit("publish.frames_then_rows")
            self.publish_transactional(then, partition, transaction_id)

    def _publish_staged_to_lineage(self, partition_id: int, frames: list[StagedFrame],
                                   transaction_id: int,
                                   then: pa.RecordBatch | None = None) -> None:  # fmt: skip
        """``_publish_to_lineage`` of a framed share: no message of a frame has a key
        (no producer id, no message group), so all of them go to the one descendant
        keyless messages go to (``_descendant_for(partition_id, None)``), copied as
        staged. Idempotent: the share's frames already held along the keyless chain
        below ``partition_id`` (``_keyless_chain``: a publish there, cut short or whole,
        before that descendant split in turn) are a prefix of whole frames of the
        share, skipped (``staged_frames.skip_rows``); only the rest goes to the chain's
        active end. ``then`` (the share's rows after its frames) follows, to their keys'
        descendants, counted after the frames (``_publish_to_lineage``'s ``framed``):
        since every frame was published before any of those rows, each partition of the
        keyless chain holds the frames routed through it first."""
        since = (self._info[partition_id].split_at_us or 0) - 60 * 1_000_000
        framed = sum(frame.record_count for frame in frames)
        while True:
            with self._lock:
                chain = self._keyless_chain(partition_id)
            target = chain[-1]
            log = self._partitions[target]
            present = 0
            for node in chain:  # the frames first in each (see above)
                present += min(framed - present,
                               self._partitions[node].transaction_rows(transaction_id, since))
            rest = staged_frames.skip_rows(frames, present)
            if rest:
                try:
                    log.publish_staged(rest, transaction_id)
                except PartitionInactiveError:
                    continue  # the descendant split meanwhile: to its own
                self._after_write(target, sum(frame.body_bytes for frame in rest))
            with self._lock:  # recorded once the share is in ``target`` (see above)
                self._redirected.setdefault(partition_id, set()).add(target)
            break
        if then is not None and then.num_rows:
            failpoints.hit("publish.frames_then_rows")
            self._publish_to_lineage(partition_id, then, transaction_id, framed)

    def publish_transactional_many(
        self,
        shares: Sequence[tuple[int, pa.RecordBatch, pa.Buffer | None]],
        transaction_id: int,
    ) -> list[TopicAppendResult]:
        """``publish_transactional`` of each (partition, batch, body) in turn, one result
        each. Shares to distinct active partitions, ascending, are published together
        (``storage.spread_publish``: one producer-state pass over all of them) when the
        usual case holds; otherwise, or when a share fails its checks, one by one."""
        if len(shares) > 1 and self._spread_publishable(shares):
            logs = [self.partition(partition) for partition, _, _ in shares]
            batches = [batch for _, batch, _ in shares]
            checked = checked_shares(batches, self.config)
            bodies = [body for _, _, body in shares]
            published = (
                None if checked is None
                else publish_shares(logs, batches, bodies, checked[0], transaction_id, checked[1])
            )  # fmt: skip
            if published is not None:
                assert checked is not None
                return self._published_shares(shares, published, checked[0])
        return [
            self.publish_transactional(batch, partition, transaction_id, body)
            for partition, batch, body in shares
        ]

    def _published_shares(
        self,
        shares: Sequence[tuple[int, pa.RecordBatch, pa.Buffer | None]],
        bases: list[int],
        data_bytes: list[int],
    ) -> list[TopicAppendResult]:
        """Meter each share published whole at its base offset, and its result: views of
        three arrays for all shares (no arrays made per share)."""
        counts = np.fromiter((batch.num_rows for _, batch, _ in shares), np.int64, len(shares))
        ends = np.cumsum(counts)
        starts = ends - counts
        partitions = np.repeat(np.array([p for p, _, _ in shares], np.int64), counts)
        status = np.zeros(int(ends[-1]), np.uint8)  # WRITTEN
        offsets = np.arange(int(ends[-1]), dtype=np.int64)
        offsets += np.repeat(np.array(bases, np.int64) - starts, counts)
        results = []
        # Metered at one time (``_after_write`` without a clock read a share); a topic
        # that splits meters and checks each share as ``_after_write`` does.
        splits = self.autopartitioning.splits
        now_us = self.clock.now_us()
        speeds = self._speeds
        for (partition, _, _), size, start, end in zip(
            shares, data_bytes, starts.tolist(), ends.tolist(), strict=True
        ):
            if splits:
                self._after_write(partition, size)
            else:
                speed = speeds.get(partition)
                if speed is not None:
                    speed.record(size, now_us)
            results.append(
                TopicAppendResult(partitions[start:end], status[start:end], offsets[start:end])
            )
        return results

    def _spread_publishable(
        self, shares: Sequence[tuple[int, pa.RecordBatch, pa.Buffer | None]]
    ) -> bool:
        """Distinct active partitions, ascending, of a topic that does not split (shares
        to split partitions follow their redirects, share by share)."""
        if self.autopartitioning.splits:
            return False
        previous = -1
        for partition, _, _ in shares:
            if partition <= previous or not self._info[partition].active:
                return False
            previous = partition
        return True

    def publish_transactional(
        self,
        batch: pa.RecordBatch,
        partition: int | None,
        transaction_id: int,
        body: pa.Buffer | None = None,
    ) -> TopicAppendResult:
        """Publish a committed transaction's batch (see ``PartitionLog.publish_transactional``;
        ``body``: the batch's encoded body, reused when the batch goes whole to one partition).

        Aimed at an inactive partition (it split after the commit routed the batch),
        each message goes to the active descendant holding its key instead.
        """
        if partition is not None and self._info[partition].active:
            # the usual case (a commit routed the batch to an active partition): one
            # publish, none of the per-message routing below (it costs ~20 us a share)
            log = self.partition(partition)
            result = log.publish_transactional(
                [batch], transaction_id, None if body is None else [body]
            )[0]
            self._after_write(partition, _payload_bytes(batch))
            count = batch.num_rows
            return TopicAppendResult(
                np.full(count, partition, dtype=np.int64), result.status, result.offsets
            )
        targets = (
            np.full(batch.num_rows, partition, dtype=np.int64)
            if partition is not None
            else self.route(batch)
        )
        pieces = []
        for partition_id in np.unique(targets):
            rows = np.flatnonzero(targets == partition_id)
            piece = batch if len(rows) == batch.num_rows else batch.take(pa.array(rows))
            log = self.partition(int(partition_id))
            bodies = [body] if body is not None and piece is batch else None
            try:
                pieces.append(
                    (rows, log.publish_transactional([piece], transaction_id, bodies)[0])
                )
            except PartitionInactiveError:
                pieces.extend(
                    (rows[inner], result)
                    for inner, result in self._publish_to_lineage(
                        int(partition_id), piece, transaction_id
                    )
                )
            self._after_write(int(partition_id), _payload_bytes(piece))
        return _topic_result(pieces, batch.num_rows)

    def _publish_to_lineage(
        self, partition_id: int, batch: pa.RecordBatch, transaction_id: int, framed: int = 0
    ) -> list[tuple[np.ndarray, AppendResult]]:
        """Publish ``batch`` of a transaction to the active descendants of an inactive
        partition by key hash; messages without a key go to the lowest range's.

        Idempotent: messages of the transaction held already anywhere along their key's
        chain below ``partition_id`` (a publish cut short, or whole, then retried or
        recovered, also after the descendant it went to split in turn) are not published
        again (``_held_rows``). Routing is deterministic, so each descendant's share is
        the same every time. ``framed``: the batch follows that many messages of its
        share staged as frames, all published before it along the keyless chain
        (``_publish_staged_to_lineage``), which the counts take first.
        """
        keys = pc.coalesce(batch.column(1), batch.column(2)).to_pylist()
        with self._lock:
            known: dict[str | None, list[int]] = {None: self._keyless_chain(partition_id)}
            chains = [known.get(key) or known.setdefault(key, self._chain_for(partition_id, key))
                      for key in keys]  # fmt: skip
        targets = np.array([chain[-1] for chain in chains], dtype=np.int64)
        since = (self._info[partition_id].split_at_us or 0) - 60 * 1_000_000
        held = self._held_rows(batch, chains, transaction_id, since, framed, known[None])
        results = []
        for target in np.unique(targets):
            rows = np.flatnonzero((targets == target) & ~held)
            log = self._partitions[int(target)]
            missing = len(rows) > 0
            if missing:
                piece = batch if len(rows) == batch.num_rows else batch.take(pa.array(rows))
                results.append((rows, log.publish_transactional([piece], transaction_id)[0]))
            # Recorded only once the share is in ``target`` (published now or before): a
            # checkpoint's ``sync_redirected`` pops the set, so a target recorded before
            # its write could be synced (and forgotten) ahead of the frame it must cover.
            with self._lock:
                self._redirected.setdefault(partition_id, set()).add(int(target))
            if missing:
                failpoints.hit("split.mid_redirect")  # one child has its share, others not yet
        return results

    def _held_rows(self, batch: pa.RecordBatch, chains: list[list[int]], transaction_id: int,
                   since_us: int, framed: int = 0,
                   keyless: list[int] | None = None) -> np.ndarray:  # fmt: skip
        """Which messages of ``batch`` (each routed along its chain) the lineage holds
        already. A publish to a descendant wrote, in order, the messages routed through it
        that its ancestors in the chain did not hold, and a crash keeps a prefix of them
        (``published_prefix``); so, ancestors first, each partition holds the first of
        the messages routed through it not held above it: as many as its frames of the
        transaction count (all or none for a share that is not ``cuttable``). ``framed``
        messages of the share staged as frames came before ``batch`` along the
        ``keyless`` chain: each partition of it counts those routed through it first."""
        held = np.zeros(batch.num_rows, dtype=bool)
        framed_at: dict[int, int] = {}  # the frames' messages each partition holds
        if framed:
            assert keyless is not None
            left = framed
            for node in keyless:  # frames first in each partition of their chain
                count = self._partitions[node].transaction_rows(transaction_id, since_us)
                framed_at[node] = min(left, count)
                left -= framed_at[node]
            if left:  # the frames are published whole before the batch: none of it yet
                return held
        # rows a cuttable share may not hold (``frame_cuts.cuttable``): such a share is one
        # frame, there whole or not at all
        uncut = (batch.column(PRODUCER_COLUMN).is_valid().to_numpy(zero_copy_only=False)
                 | batch.column(METADATA_COLUMN).is_valid().to_numpy(zero_copy_only=False))
        for depth in range(max(len(chain) for chain in chains)):
            at = np.array([chain[depth] if depth < len(chain) else -1 for chain in chains],
                          dtype=np.int64)  # fmt: skip
            for node in np.unique(at[at >= 0]):
                rows = np.flatnonzero((at == node) & ~held)
                if not len(rows):
                    continue
                log = self._partitions[int(node)]
                if framed_at.get(int(node)):  # less the frames' messages there (above)
                    count = log.transaction_rows(transaction_id, since_us) - framed_at[int(node)]
                    count = (len(rows) if count else 0) if uncut[rows].any() else min(
                        len(rows), count)  # fmt: skip
                elif uncut[rows].any():
                    count = len(rows) if log.contains_transaction(transaction_id, since_us) else 0
                else:
                    count = min(len(rows), log.transaction_rows(transaction_id, since_us))
                held[rows[:count]] = True
        return held

    def _keyless_chain(self, partition_id: int) -> list[int]:
        """``_chain_for`` a message without a key (the caller holds ``_lock``)."""
        return self._chain_for(partition_id, None)

    def _chain_for(self, partition_id: int, key: str | None) -> list[int]:
        """The partitions below ``partition_id`` that a message with ``key`` goes through,
        in lineage order, the active one that holds it last (``_descendant_for``'s path;
        the caller holds ``_lock``)."""
        chain: list[int] = []
        current = self._info[partition_id]
        value = None if key is None else key_hash(key)
        for _ in range(HASH_BITS_DEPTH):
            if current.active:
                assert chain, "called for an inactive partition"
                return chain
            children = [self._info[c] for c in current.children if c in self._info]
            if not children:
                raise ObjectNotInPrerequisiteStateError(
                    f"partition {current.partition_id} is inactive and has no children"
                )
            chosen = children[0]  # where a message without a key goes
            for child in children:
                if (
                    value is not None
                    and child.key_range is not None
                    and child.key_range.contains(value)
                ):
                    chosen = child
            current = chosen
            chain.append(current.partition_id)
        raise ObjectNotInPrerequisiteStateError("partition lineage is too deep")

    def _descendant_for(self, partition_id: int, key: str | None) -> int:
        """The active partition below ``partition_id`` in the lineage that holds ``key``
        (``partition_id`` itself while it is active; the caller holds ``_lock``)."""
        if self._info[partition_id].active:
            return partition_id
        return self._chain_for(partition_id, key)[-1]

    def keyless_target(self, batch: pa.RecordBatch) -> int | None:
        """``route`` of a keyless batch (no producer id, no message group: every message
        goes to the one partition ``_keyless_partition`` picks), as that one partition;
        None, and nothing picked, for a batch with keys (``route`` it). No array is made
        for the usual transactional share (a move's)."""
        count = batch.num_rows
        if batch.column(1).null_count == batch.column(2).null_count == count:
            with self._lock:
                return self._keyless_partition(count)
        return None

    def route(self, batch: pa.RecordBatch) -> np.ndarray:
        """The partition of every message of ``batch`` (binding new keys round-robin)."""
        producer_ids, groups = batch.column(1), batch.column(2)
        if producer_ids.null_count == groups.null_count == batch.num_rows:
            with self._lock:  # keyless: no Arrow call
                return np.full(batch.num_rows, self._keyless_partition(batch.num_rows),
                               dtype=np.int64)  # fmt: skip
        # Arrow calls release the GIL: made outside the lock, or every concurrent
        # statement queues on it behind one waiting to get the GIL back (a convoy).
        keys = pc.coalesce(producer_ids, groups)
        unique = pc.unique(keys.drop_null())
        names = unique.to_pylist()
        with self._lock:
            keyless = self._next_round_robin() if keys.null_count else -1
            bound = self._partitions_for_keys_locked(names)
        if not bound:
            return np.full(batch.num_rows, keyless, dtype=np.int64)
        positions = pc.index_in(keys, value_set=unique).fill_null(len(bound))
        lookup = np.array([*bound, keyless], dtype=np.int64)
        return lookup[positions.to_numpy()]

    def routing(self) -> list[tuple[int, KeyRange]]:
        """The active partitions' key ranges, lowest first (empty when unranged)."""
        with self._lock:
            return [
                (p, self._info[p].key_range)  # type: ignore[misc]
                for p in self._range_owners
            ]

    # -- reads --------------------------------------------------------------------------
    def start_offsets(self, partition_ids: Iterable[int]) -> dict[int, int]:
        """Each partition's ``start_offset``, in the order given (a poll's, over many):
        from the table the partitions keep at each publish (``PartitionLog.start_table``),
        not from each log (a poll of 1000 partitions spent ~5 % of its time in the logs'
        segment lists, cache-cold; docs/scale.md round 38)."""
        starts = self._log_starts
        try:
            return {p: starts[p] for p in partition_ids}
        except KeyError as missing:
            self.partition(missing.args[0])  # raises: the topic has no such partition
            raise

    def reader_ends(self, partition_ids: Iterable[int]) -> dict[int, int]:
        """Each partition's ``reader_end`` (its end, the rows its ledger holds past its
        segments counted, nothing settled), the ledger's ends taken once for all."""
        partitions = self._partitions
        try:
            logs = [(p, partitions[p]) for p in partition_ids]
        except KeyError as missing:
            self.partition(missing.args[0])  # raises: the topic has no such partition
            raise
        across = [p for p, log in logs if log.reads_across]
        if self.ledger is None or not across:
            return {p: log.own_end for p, log in logs}  # (``reader_end`` here)
        ledger_ends = self.ledger.ledger.ends()  # after the flags: at least as new
        ends = {p: log.own_end for p, log in logs}
        for p in across:
            ends[p] = max(ends[p], ledger_ends.get(p, 0))
        return ends

    def ledger_catch_up_cut(self, starts: Mapping[int, int]) -> dict[int, int] | None:
        """``Ledger.cut_at_first_shares`` of the topic's ledger; None without a ledger."""
        if self.ledger is None:
            return None
        return self.ledger.ledger.cut_at_first_shares(starts)

    def whole_frames(self, starts: Mapping[int, int], max_messages: int,
                     max_bytes: int) -> LedgerWhole | None:  # fmt: skip
        """``Ledger.whole_frames`` of the topic's ledger for a consumer at ``starts``; None
        without a ledger."""
        if self.ledger is None:
            return None
        return self.ledger.ledger.whole_frames(starts, max_messages, max_bytes)

    def read(self, partition_id: int, offset: int, **limits_: int) -> ReadResult:
        return self.partition(partition_id).read(offset, **limits_)

    def wait_for_any(self, positions: dict[int, int], timeout_s: float) -> bool:
        """Block until some partition's end passes its given offset, or timeout."""
        if timeout_s * 1000 > limits.WAIT_MS_MAX:
            raise LimitExceededError(f"wait of {timeout_s}s exceeds {limits.WAIT_MS_MAX} ms")
        deadline = self.clock.monotonic_s() + timeout_s

        def ready() -> bool:  # under ``data_ready``: no settle there (a write holds its
            # lock, then takes ``data_ready``); a partition with ledger rows is ready (a
            # fenced one's only with rows past the position: ``has_rows_past``)
            return any(self.partition(p).has_rows_past(offset)
                       for p, offset in positions.items())  # fmt: skip

        with self.data_ready:
            while not ready():
                remaining = deadline - self.clock.monotonic_s()
                if remaining <= 0:
                    return False
                self.data_ready.wait(remaining)
        return True

    def append_ledger(self, shares: Sequence[tuple[int, np.ndarray, pa.RecordBatch]],
                      cancelled: Callable[[], bool] | None = None) -> list[int] | None:  # fmt: skip
        """Write a statement's shares (``shares``' output) as one ledger frame
        (``TopicLedger.append_shares``); each share's base offset, or None (nothing written:
        no ledger, a share not small, the frame too large, or a case the ledger does not
        decide) when the caller must go the usual way. ``cancelled``: asked just before the
        frame's round (``QueryCanceledError``, nothing written)."""
        ledger = self.ledger
        if ledger is None:
            return None
        if isinstance(shares, Shares) and shares.whole is not None:  # no batch a share
            ids, counts, batches = shares.partition_ids, shares.counts, shares.pieces
            checked = checked_shares(batches, self.config, shares.whole, counts)
        else:
            ids = [partition_id for partition_id, _, _ in shares]
            batches = [piece for _, _, piece in shares]
            counts = np.fromiter((b.num_rows for b in batches), np.int64, len(batches))
            checked = checked_shares(batches, self.config, None, counts)
        if checked is None:
            return None
        data_bytes, table = checked
        if (max(data_bytes) > limits.LEDGER_SHARE_BYTES_MAX
                or table.get_total_buffer_size() > limits.LEDGER_FRAME_BYTES_MAX // 2):  # fmt: skip
            return None
        logs = [self.partition(partition_id) for partition_id in ids]
        return ledger.append_shares(logs, batches, table, self.clock.now_us(), cancelled, counts)

    def close(self) -> None:
        if self.ledger is not None:  # its copier stopped before the logs close
            self.ledger.close()
        for partition in self._partitions.values():
            partition.close()

    def delete(self) -> None:
        self.close()
        self.fs.remove_tree(self.directory)


# A statement spreading over at least this many partitions appends to them concurrently.
PARALLEL_SHARES_MIN = 4
# Threads that append a statement's shares: each mostly waits in its partition's
# fdatasync (the GIL released), and the kernel merges concurrent syncs' journal commits.
APPEND_THREADS = 16
APPEND_TASKS_PER_THREAD = 4  # ``_append_in_parallel``: runs of shares per thread
_append_pool: ThreadPoolExecutor | None = None
_append_pool_lock = threading.Lock()


def _forget_append_pool() -> None:
    """In a forked child: the parent's pool threads do not exist there (a pool that
    believes they do would never run a task), nor does whoever held the lock."""
    global _append_pool, _append_pool_lock
    _append_pool = None
    _append_pool_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_append_pool)


_INT32 = struct.Struct("<i")
METADATA_COLUMN = 6  # of ``WIRE_SCHEMA``
assert WIRE_SCHEMA.field(METADATA_COLUMN).type == METADATA_TYPE
_NULL_METADATA: dict[int, pa.Array] = {}
_NULL_METADATA_MAX = 256


class Shares(Sequence[tuple[int, np.ndarray, pa.RecordBatch]]):
    """``TopicLog.shares``' answer: (partition id, its rows in the batch, those rows as a
    batch) a share, lowest partition first.

    Kept as ``partition_ids``, ``order`` (the batch's rows, share after share) and
    ``bounds`` (share ``i``'s rows are ``order[bounds[i]:bounds[i + 1]]``). ``whole``, when
    set: the one batch the shares' batches are the consecutive slices of, in this order
    (their rows, an all-null metadata column). Then a share's batch is made only when
    asked for (``piece``, an item): the ledger's checks, producer decision and frame
    body read ``whole`` as one chunk and need only the shares' row counts, so a
    statement over 1000 partitions makes no 1000 batches (~1.5 us each: docs/scale.md
    rounds 35 and 37). Without ``whole`` every batch is given (``pieces``)."""

    def __init__(self, partition_ids: list[int], order: np.ndarray, bounds: list[int],
                 pieces: list[pa.RecordBatch] | None = None,
                 whole: pa.RecordBatch | None = None) -> None:  # fmt: skip
        assert len(bounds) == len(partition_ids) + 1 and bounds[-1] == len(order)
        assert (pieces is None) != (whole is None), "the batches, or the one to slice"
        assert whole is None or whole.num_rows == len(order)
        self.partition_ids = partition_ids
        self.order = order
        self.bounds = bounds
        self.whole = whole
        self._pieces: list[pa.RecordBatch | None] = (
            [None] * len(partition_ids) if pieces is None else list(pieces)
        )
        assert len(self._pieces) == len(partition_ids)

    @property
    def counts(self) -> np.ndarray:
        """Each share's row count."""
        return np.diff(np.asarray(self.bounds, np.int64))

    def rows(self, index: int) -> np.ndarray:
        """Share ``index``'s rows in the batch, ascending."""
        return self.order[self.bounds[index] : self.bounds[index + 1]]

    def piece(self, index: int) -> pa.RecordBatch:
        """Share ``index``'s rows as a batch (made from ``whole`` at the first ask)."""
        piece = self._pieces[index]
        if piece is None:
            assert self.whole is not None
            start, end = self.bounds[index], self.bounds[index + 1]
            piece = self.whole.slice(start, end - start)
            # The slice's own all-null column: a slice of the whole one would encode
            # (IPC) with the whole column's child offsets.
            field = self.whole.schema.field(METADATA_COLUMN)
            piece = piece.set_column(METADATA_COLUMN, field, _null_metadata(end - start))
            self._pieces[index] = piece
        return piece

    @property
    def pieces(self) -> Sequence[pa.RecordBatch]:
        """Every share's batch, each made at its first ask (``piece``)."""
        return _Pieces(self)

    def __len__(self) -> int:
        return len(self.partition_ids)

    @overload
    def __getitem__(self, index: int) -> tuple[int, np.ndarray, pa.RecordBatch]: ...
    @overload
    def __getitem__(self, index: slice) -> list[tuple[int, np.ndarray, pa.RecordBatch]]: ...
    def __getitem__(self, index: int | slice) -> Any:
        return _items(index, len(self), self._share)

    def _share(self, index: int) -> tuple[int, np.ndarray, pa.RecordBatch]:
        return self.partition_ids[index], self.rows(index), self.piece(index)


class _Pieces(Sequence[pa.RecordBatch]):
    """``Shares.pieces``: the shares' batches as a sequence, each made when read."""

    def __init__(self, shares: Shares) -> None:
        self._shares = shares

    def __len__(self) -> int:
        return len(self._shares)

    @overload
    def __getitem__(self, index: int) -> pa.RecordBatch: ...
    @overload
    def __getitem__(self, index: slice) -> list[pa.RecordBatch]: ...
    def __getitem__(self, index: int | slice) -> Any:
        return _items(index, len(self), self._shares.piece)


def _items(index: int | slice, length: int, item: Callable[[int], Any]) -> Any:
    """A sequence's ``__getitem__`` over ``item(i)``, ``0 <= i < length``: negative
    indexes count from the end, a slice gives a list, others raise ``IndexError``."""
    if isinstance(index, slice):
        return [item(i) for i in range(length)[index]]
    position = index + length if index < 0 else index
    if not 0 <= position < length:
        raise IndexError(index)
    return item(position)


def _null_metadata(count: int) -> pa.Array:
    """An all-null metadata column of ``count`` rows (cached by length: immutable)."""
    cached = _NULL_METADATA.get(count)
    if cached is None:
        if len(_NULL_METADATA) >= _NULL_METADATA_MAX:
            _NULL_METADATA.clear()
        cached = _NULL_METADATA[count] = pa.nulls(count, METADATA_TYPE)
    return cached


def _shares(batch: pa.RecordBatch, targets: np.ndarray) -> Shares:
    """``batch`` split by target partition: (partition id, its rows in ``batch`` in order,
    those rows as a batch), lowest partition first. One stable sort, not a pass over the
    batch per partition; a take per share."""
    if len(targets) and (targets == targets[0]).all():
        return _one_share(batch, int(targets[0]))
    order, ordered, bounds = _share_order(targets)
    pieces = [batch.take(pa.array(order[start:end])) for start, end in itertools.pairwise(bounds)]
    return Shares([int(ordered[start]) for start in bounds[:-1]], order, bounds, pieces=pieces)


def _one_share(batch: pa.RecordBatch, partition_id: int) -> Shares:
    """The whole of ``batch`` as one share, to ``partition_id``."""
    count = batch.num_rows
    return Shares([partition_id], np.arange(count), [0, count], pieces=[batch])


def _share_order(targets: np.ndarray) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """The rows in share order (a stable sort by target), their targets in that order,
    and the shares' bounds in it."""
    order = np.argsort(targets, kind="stable")
    ordered = targets[order]
    bounds = [0, *(np.flatnonzero(np.diff(ordered)) + 1).tolist(), len(ordered)]
    return order, ordered, bounds


def _append_in_parallel(
    appends: list[tuple[PartitionLog, pa.RecordBatch]],
) -> list[AppendResult | BaseException]:
    """``log.append(piece)`` for each pair, concurrently; each one's result or error, in
    order. Every append has ended when this returns (none is left running), so the
    caller's view of what was written is complete. Each append is the partition's own
    (its group commit, its sync before its publish): only their overlap is new, as if
    that many sessions had written one share each."""
    global _append_pool
    with _append_pool_lock:
        if _append_pool is None:
            _append_pool = ThreadPoolExecutor(APPEND_THREADS, thread_name_prefix="topic-append")
        pool = _append_pool

    def run(chunk: list[tuple[PartitionLog, pa.RecordBatch]]) -> list[AppendResult | BaseException]:
        outcomes: list[AppendResult | BaseException] = []
        for log, piece in chunk:
            try:
                outcomes.append(log.append(piece))
            except Exception as error:  # handed to the caller, who raises the first
                outcomes.append(error)
        return outcomes

    # A few tasks per thread, each a run of shares, not one task per share: submitting a
    # task costs ~20-60 us, 1000 of them per statement over 1000 partitions; a thread
    # runs its tasks' appends one after another either way.
    step = -(-len(appends) // (APPEND_THREADS * APPEND_TASKS_PER_THREAD))
    chunks = [appends[start : start + step] for start in range(0, len(appends), step)]
    return [outcome for outcomes in pool.map(run, chunks) for outcome in outcomes]


# A lineage is at most this deep: each split halves a range of a 64-bit space.
HASH_BITS_DEPTH = 65


def _write_seed_snapshot(fs: FileSystem, directory: str, entries: dict) -> None:
    """A child's first producer snapshot, ``0.snapshot``: each key's last seq_no and write
    time at offset -1 (none of the child's own), in ``ProducerStateManager``'s snapshot
    format, synced. Opening the child loads it as the state at its offset 0."""
    payload = {
        "offset": 0,
        "producers": {
            key: [entry.last_seq_no, -1, entry.last_written_at_us] for key, entry in entries.items()
        },
    }
    path = os.path.join(directory, file_names.snapshot_file(0))
    fs.write_file_atomic(path, json.dumps(payload).encode(), durable=True)


def _payload_bytes(batch: pa.RecordBatch) -> int:
    """The bytes a write counts against its partition's speed: the messages' data."""
    data = batch.column(5)
    count = len(data)
    if not count:
        return 0
    offsets = data.buffers()[1]  # int32 value offsets of a binary array
    first = data.offset
    return _INT32.unpack_from(offsets, 4 * (first + count))[0] - _INT32.unpack_from(
        offsets, 4 * first
    )[0]  # two reads, not an ndarray: this runs for every share of every write


def _topic_result(pieces: list[tuple[np.ndarray, AppendResult]], count: int) -> TopicAppendResult:
    if len(pieces) == 1 and len(pieces[0][0]) == count:  # one share: the rows in order
        rows, result = pieces[0]
        assert count == 0 or (rows[0] == 0 and rows[-1] == count - 1)
        return TopicAppendResult(
            np.full(count, result.partition, dtype=np.int64), result.status, result.offsets
        )
    partitions = np.empty(count, dtype=np.int64)
    status = np.empty(count, dtype=np.uint8)
    offsets = np.empty(count, dtype=np.int64)
    for rows, result in pieces:
        partitions[rows] = result.partition
        status[rows] = result.status
        offsets[rows] = result.offsets
    return TopicAppendResult(partitions, status, offsets)


def _config_to_json(config: TopicConfig) -> dict:
    return {
        "partition_count": config.partition_count,
        "supported_codecs": sorted(c.label for c in config.supported_codecs),
        "fsync_policy": config.fsync_policy.value,
        "segment_bytes": config.segment_bytes,
        "segment_ms": config.segment_ms,
        "retention_ms": config.retention_ms,
        "retention_bytes": config.retention_bytes,
        "producer_expiry_ms": config.producer_expiry_ms,
        "group_commit_window_us": config.group_commit_window_us,
    }


def _config_from_json(payload: dict) -> TopicConfig:
    return TopicConfig(
        partition_count=payload["partition_count"],
        supported_codecs=frozenset(Codec[name.upper()] for name in payload["supported_codecs"]),
        fsync_policy=FsyncPolicy(payload["fsync_policy"]),
        segment_bytes=payload["segment_bytes"],
        segment_ms=payload["segment_ms"],
        retention_ms=payload["retention_ms"],
        retention_bytes=payload["retention_bytes"],
        producer_expiry_ms=payload["producer_expiry_ms"],
        group_commit_window_us=payload["group_commit_window_us"],
    )
