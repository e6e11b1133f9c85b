"""A topic on disk: its partitions, their lineage, and producer routing.

Directory ``<data>/topics/<topic id>/`` holds ``topic.json`` (storage config
and partition list, replaced atomically) and one directory per partition,
``p<partition id>/``. The topic id is assigned by the store, never derived from
a user's name, so no name can reach outside the data directory.

Routing: messages with the same key (producer id, else message group id) go to
one partition. A key is bound round-robin over active partitions on first use;
the binding lives in the partitions' producer state, so it survives restarts
and expires with it (14 days without writes by default).

Partitions have a lineage (parent, children) and may be inactive (read-only
after an autopartitioning split); routing never picks an inactive partition.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from storage import failpoints, file_names, limits
from storage.clock import Clock
from storage.codecs import Codec
from storage.config import FsyncPolicy, TopicConfig
from storage.errors import (
    InvalidParameterValueError,
    LimitExceededError,
    ObjectNotInPrerequisiteStateError,
)
from storage.fs import FileSystem
from storage.partition_log import WRITTEN, AppendResult, PartitionLog, ReadResult

METADATA_FILE = "topic.json"


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    partition_id: int
    active: bool
    parent: int | None
    children: tuple[int, ...]


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
        self, fs: FileSystem, directory: str, topic_id: str, clock: Clock, *, create: bool
    ) -> None:
        self.fs = fs
        self.directory = directory
        self.topic_id = topic_id
        self.clock = clock
        self.data_ready = threading.Condition()
        self._lock = threading.Lock()
        self._round_robin = 0
        self._pending_bindings: dict[str, int] = {}
        self.config = TopicConfig()
        self._partitions: dict[int, PartitionLog] = {}
        self._info: dict[int, PartitionInfo] = {}
        if not create:
            self._load()

    # -- creation and metadata --------------------------------------------------------
    def create(self, config: TopicConfig) -> None:
        config.validate()
        self.fs.make_directory(self.directory)
        self.config = config
        for partition_id in range(config.partition_count):
            self._info[partition_id] = PartitionInfo(partition_id, True, None, ())
        self._save()
        for partition_id in self._info:
            self._open_partition(partition_id)

    def _load(self) -> None:
        # A replace of topic.json cut short (before its rename) leaves the temp file; the
        # old topic.json stands. Recovery deletes the leftover, as partitions do theirs.
        self.fs.remove(os.path.join(self.directory, METADATA_FILE + file_names.TEMP_SUFFIX))
        payload = json.loads(self.fs.read_file(os.path.join(self.directory, METADATA_FILE)))
        self.config = _config_from_json(payload["config"])
        for item in payload["partitions"]:
            info = PartitionInfo(
                item["id"], item["active"], item["parent"], tuple(item["children"])
            )
            self._info[info.partition_id] = info
        for partition_id in self._info:
            self._open_partition(partition_id)

    def _save(self) -> None:
        payload = {
            "id": self.topic_id,
            "config": _config_to_json(self.config),
            "partitions": [
                {
                    "id": i.partition_id,
                    "active": i.active,
                    "parent": i.parent,
                    "children": list(i.children),
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
        self._partitions[partition_id] = partition
        return partition

    def alter(self, config: TopicConfig) -> None:
        """Change storage settings; adding partitions is allowed, removing is not."""
        config.validate()
        with self._lock:
            # Ids handed out so far: retention may have removed some (inactive, expired).
            current = self.config.partition_count
            if config.partition_count < current:
                raise InvalidParameterValueError(
                    f"partitions can be added but not removed (topic has {current})"
                )
            self.config = config
            for partition in self._partitions.values():
                partition.config = config
            for partition_id in range(current, config.partition_count):
                self._info[partition_id] = PartitionInfo(partition_id, True, None, ())
            self._save()
            for partition_id in range(current, config.partition_count):
                self._open_partition(partition_id)

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

    def active_partition_ids(self) -> list[int]:
        return [i for i in sorted(self._info) if self._info[i].active]

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
            for child in children:
                child_info = self._info[child]
                self._info[child] = PartitionInfo(
                    child, child_info.active, partition_id, child_info.children
                )
            self._info[partition_id] = PartitionInfo(partition_id, False, info.parent, children)
            self._partitions[partition_id].active = False
            failpoints.hit("split.before_save")
            self._save()

    def remove_partition(self, partition_id: int) -> None:
        """Delete an inactive partition (all its data expired)."""
        with self._lock:
            if self._info[partition_id].active:
                raise ObjectNotInPrerequisiteStateError("an active partition cannot be removed")
            partition = self._partitions.pop(partition_id)
            del self._info[partition_id]
            self._save()
        partition.delete()

    # -- routing and appends -----------------------------------------------------------
    def partition_for_key(self, key: str) -> int:
        """The partition bound to ``key``; binds it round-robin on first use."""
        with self._lock:
            return self._partition_for_key_locked(key)

    def _partition_for_key_locked(self, key: str) -> int:
        best: tuple[int, int] | None = None
        for partition_id, partition in self._partitions.items():
            entry = partition.producers.entry(key)
            newer = entry is not None and (best is None or entry.last_written_at_us > best[0])
            if newer and partition.active:
                assert entry is not None
                best = (entry.last_written_at_us, partition_id)
        if best is not None:
            return best[1]
        pending = self._pending_bindings.get(key)
        if pending is not None and self._info[pending].active:
            return pending
        partition_id = self._next_round_robin()
        if len(self._pending_bindings) > limits.PRODUCERS_PER_PARTITION_MAX:
            self._pending_bindings.clear()
        self._pending_bindings[key] = partition_id
        return partition_id

    def _next_round_robin(self) -> int:
        active = self.active_partition_ids()
        if not active:
            raise ObjectNotInPrerequisiteStateError("topic has no active partition")
        partition_id = active[self._round_robin % len(active)]
        self._round_robin += 1
        return partition_id

    def last_seq_no(self, producer_id: str) -> int | None:
        """The producer's largest written seq_no, to continue after a restart."""
        partition_id = self.partition_for_key(producer_id)
        return self._partitions[partition_id].last_seq_no(producer_id)

    def append(self, batch: pa.RecordBatch, partition: int | None = None) -> TopicAppendResult:
        """Append a wire batch, routing each message by its key unless ``partition`` is given."""
        if partition is not None:
            result = self.partition(partition).append(batch)
            return _topic_result([(np.arange(batch.num_rows), result)], batch.num_rows)
        targets = self.route(batch)
        pieces = []
        for partition_id in np.unique(targets):
            rows = np.flatnonzero(targets == partition_id)
            piece = batch if len(rows) == batch.num_rows else batch.take(pa.array(rows))
            pieces.append((rows, self._partitions[int(partition_id)].append(piece)))
        return _topic_result(pieces, batch.num_rows)

    def publish_transactional(
        self, batch: pa.RecordBatch, partition: int | None, transaction_id: int
    ) -> TopicAppendResult:
        """Publish a committed transaction's batch (see ``PartitionLog.publish_transactional``)."""
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
            pieces.append((rows, log.publish_transactional([piece], transaction_id)[0]))
        return _topic_result(pieces, batch.num_rows)

    def route(self, batch: pa.RecordBatch) -> np.ndarray:
        """The partition of every message of ``batch`` (binding new keys round-robin)."""
        keys = pc.coalesce(batch.column(1), batch.column(2))
        with self._lock:
            keyless = self._next_round_robin() if keys.null_count else -1
            unique = pc.unique(keys.drop_null())
            bound = [self._partition_for_key_locked(k) for k in unique.to_pylist()]
        if not bound:
            return np.full(batch.num_rows, keyless, dtype=np.int64)
        positions = pc.index_in(keys, value_set=unique).fill_null(len(bound))
        lookup = np.array([*bound, keyless], dtype=np.int64)
        return lookup[positions.to_numpy()]

    # -- reads --------------------------------------------------------------------------
    def read(self, partition_id: int, offset: int, **limits_: int) -> ReadResult:
        return self.partition(partition_id).read(offset, **limits_)

    def wait_for_any(self, positions: dict[int, int], timeout_s: float) -> bool:
        """Block until some partition's end passes its given offset, or timeout."""
        if timeout_s * 1000 > limits.WAIT_MS_MAX:
            raise LimitExceededError(f"wait of {timeout_s}s exceeds {limits.WAIT_MS_MAX} ms")
        deadline = self.clock.monotonic_s() + timeout_s

        def ready() -> bool:
            return any(self.partition(p).end_offset > offset for p, offset in positions.items())

        with self.data_ready:
            while not ready():
                remaining = deadline - self.clock.monotonic_s()
                if remaining <= 0:
                    return False
                self.data_ready.wait(remaining)
        return True

    def close(self) -> None:
        for partition in self._partitions.values():
            partition.close()

    def delete(self) -> None:
        self.close()
        self.fs.remove_tree(self.directory)


def _topic_result(pieces: list[tuple[np.ndarray, AppendResult]], count: int) -> TopicAppendResult:
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
