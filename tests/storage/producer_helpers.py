"""What the producer-state tests share: a manager with the 14-day expiry, wire batches of
producer ids and seq_nos, and the partition writer's per-share write path."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from storage.clock import ManualClock
from storage.fs import FileSystem
from storage.producer_state import ProducerStateManager
from storage.record_batch import build_wire_batch

DAY_US = 24 * 3600 * 1_000_000
EXPIRY_US = 14 * DAY_US


def new_manager(tmp_path: Any, clock: ManualClock) -> ProducerStateManager:
    return ProducerStateManager(FileSystem(), str(tmp_path), clock, EXPIRY_US)


def id_batch(producers: list[str | None], seq_nos: list[int | None]) -> pa.RecordBatch:
    return build_wire_batch([b"x"] * len(seq_nos), seq_no=seq_nos, producer_id=producers)


def write_per_share(manager: ProducerStateManager, batch: pa.RecordBatch, base: int,
                    at: int) -> Any:  # fmt: skip
    """The partition writer's per-share path (``PartitionLog._write_decision``): decide,
    then record what is not a duplicate. Returns the decision."""
    decision = manager.decide(batch)
    if decision.duplicate_count == 0:
        manager.record_decision(decision, base, at)
    else:
        written = decision.batch.filter(pa.array(~decision.duplicate))
        if written.num_rows:
            manager.record(written, base, at)
    return decision
