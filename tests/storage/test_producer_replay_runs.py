"""Opening a partition replays the frames after its last producer snapshot in runs.

A partition written by statements spread over 1000 partitions holds one frame of a few
messages per statement; after a crash (no snapshot since) opening it replayed each
frame with its own ``apply_read_batch`` (~1.5 ms each: 100 statements took ~2.5 minutes
to reopen over 1000 partitions). Runs of frames are replayed together, to the same
producer state. Also ``transaction_rows_since``: one scan for what recovery asked of
``contains_transaction`` once per commit record.
"""

from __future__ import annotations

import os

from storage.clock import ManualClock
from storage.config import FsyncPolicy, TopicConfig
from storage.fs import FileSystem
from storage.partition_log import PartitionLog
from storage.producer_state import ProducerStateManager
from storage.record_batch import build_wire_batch


def _open(directory: str, clock: ManualClock) -> PartitionLog:
    config = TopicConfig(fsync_policy=FsyncPolicy.ALWAYS, retention_ms=None)
    return PartitionLog(FileSystem(), directory, 0, config, clock)


def _write(log: PartitionLog, frames: int) -> None:
    for n in range(frames):
        producers = [f"p{(n + i) % 7}" for i in range(3)]
        batch = build_wire_batch(
            [f"{n}.{i}".encode() for i in range(3)],
            seq_no=[10 * n + i for i in range(3)],
            producer_id=producers,  # type: ignore[arg-type]
        )
        log.publish_transactional([batch], 1000 + n) if n % 2 else log.append(batch)


def test_a_reopen_replays_many_small_frames_in_one_call_to_the_same_state(
    tmp_path, monkeypatch
) -> None:
    directory = os.path.join(str(tmp_path), "p0")
    os.makedirs(directory)
    clock = ManualClock()
    log = _write_and_crash(directory, clock, frames=60)
    calls = []
    original = ProducerStateManager.apply_read_batch
    monkeypatch.setattr(
        ProducerStateManager,
        "apply_read_batch",
        lambda self, batch: (calls.append(batch.num_rows), original(self, batch))[1],
    )
    reopened = _open(directory, clock)
    assert calls == [180], "one run of the 60 frames' 180 messages"
    for key in (f"p{k}" for k in range(7)):
        assert reopened.last_seq_no(key) == log.last_seq_no(key)
        assert reopened.producers.entry(key).last_offset == log.producers.entry(key).last_offset
    reopened.close()


def test_transaction_rows_since_counts_each_transactions_messages(tmp_path) -> None:
    directory = os.path.join(str(tmp_path), "p0")
    os.makedirs(directory)
    log = _open(directory, ManualClock())
    _write(log, 10)
    found = log.transaction_rows_since(0)
    assert found == {1000 + n: 3 for n in range(1, 10, 2)}
    assert all(log.contains_transaction(t, 0) for t in found)
    log.close()


def _write_and_crash(directory: str, clock: ManualClock, frames: int) -> PartitionLog:
    """Write ``frames`` small frames and leave them as a crash would: synced, no producer
    snapshot (a clean close would write one). The log stays open (never closed)."""
    log = _open(directory, clock)
    _write(log, frames)
    log.sync()
    return log
