"""Reopening a partition after a crash replays its frames to producer state in bounded memory.

The replay joined up to ``REPLAY_RUN_ROWS`` messages whole (data included) with
``pa.concat_batches``, keeping every frame's read window alive until then: a reopen
after 300 MB of 1 MiB messages peaked at ~2.3x those bytes, and a run of over 2 GiB
of data raised ``ArrowInvalid: offset overflow``, so the partition could not be opened.
Now a run keeps a copy of the columns the replay reads only, and ends at
``REPLAY_RUN_BYTES`` of them as well as at ``REPLAY_RUN_ROWS`` messages. Memory is
measured with tracemalloc (the read windows are Python bytes) plus Arrow's allocations
at the replay calls (the joined runs), never with RSS or timings.
"""

from __future__ import annotations

import os
import tracemalloc

import pyarrow as pa
import pytest

import storage.partition_log as partition_log
from storage import limits
from storage.clock import ManualClock
from storage.config import FsyncPolicy, TopicConfig
from storage.errors import InvalidParameterValueError
from storage.fs import FileSystem
from storage.partition_log import DUPLICATE, WRITTEN, PartitionLog
from storage.producer_state import ProducerStateManager
from storage.record_batch import build_wire_batch

MIB = 1024 * 1024


def _state(log: PartitionLog, key: str) -> tuple[int | None, int, int] | None:
    """What the replay restores of a key: last seq_no, offset and write time."""
    entry = log.producers.entry(key)
    return (
        None if entry is None else (entry.last_seq_no, entry.last_offset, entry.last_written_at_us)
    )


def _open(directory: str, clock: ManualClock) -> PartitionLog:
    config = TopicConfig(fsync_policy=FsyncPolicy.NEVER, retention_ms=None)
    return PartitionLog(FileSystem(), directory, 0, config, clock)


def _crashed(tmp_path, batches: list[pa.RecordBatch]) -> tuple[str, PartitionLog, ManualClock]:
    """A partition holding ``batches`` (one frame each) as a crash leaves it: written
    and synced, no producer snapshot (a clean close writes one). Never closed."""
    directory = os.path.join(str(tmp_path), "p0")
    os.makedirs(directory)
    clock = ManualClock()
    log = _open(directory, clock)
    for batch in batches:
        clock.advance(microseconds=1000)
        log.append(batch)
    log.sync()
    return directory, log, clock


def _replay_calls(monkeypatch) -> list[pa.RecordBatch]:
    """Record each batch the replay hands to producer state."""
    calls: list[pa.RecordBatch] = []
    original = ProducerStateManager.apply_read_batch

    def recording(self: ProducerStateManager, batch: pa.RecordBatch) -> None:
        calls.append(batch)
        original(self, batch)

    monkeypatch.setattr(ProducerStateManager, "apply_read_batch", recording)
    return calls


def test_a_reopen_after_a_crash_peaks_well_below_the_replayed_bytes(tmp_path, monkeypatch) -> None:
    payload = os.urandom(256 * 1024)
    batches = [
        build_wire_batch([payload], seq_no=[n], producer_id=[f"p{n % 3}"]) for n in range(96)
    ]  # 24 MiB of data, one message a frame, fewer than REPLAY_RUN_ROWS
    directory, crashed, clock = _crashed(tmp_path, batches)
    arrow_at_calls: list[int] = []
    original = ProducerStateManager.apply_read_batch

    def measuring(self: ProducerStateManager, batch: pa.RecordBatch) -> None:
        arrow_at_calls.append(pa.total_allocated_bytes())  # the joined run is alive here
        original(self, batch)

    monkeypatch.setattr(ProducerStateManager, "apply_read_batch", measuring)
    arrow_before = pa.total_allocated_bytes()
    tracemalloc.start()
    try:
        reopened = _open(directory, clock)
        _, python_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    arrow_peak = max(arrow_at_calls) - arrow_before
    # The old replay held every frame's read window (24 MiB of Python bytes) and joined
    # all 96 messages' data into one more copy (24 MiB of Arrow memory): ~48 MiB.
    # Now: one 4 MiB read window at a time and a few KiB of kept columns.
    assert python_peak + arrow_peak < 12 * MIB, (python_peak, arrow_peak)
    for key in ("p0", "p1", "p2"):
        assert _state(reopened, key) == _state(crashed, key)
    reopened.close()


def _mixed_batches() -> list[pa.RecordBatch]:
    """Frames of 1 to 40 messages, producer ids and message group ids (a key each),
    some messages without a key, seq_nos growing per key."""
    batches = []
    seq: dict[str, int] = {}
    for n in range(120):
        count = 1 + (n * 7) % 40
        producer_ids: list[str | None] = []
        group_ids: list[str | None] = []
        seq_nos = []
        for i in range(count):
            key = f"k{(n + i) % 11}"
            if (n + i) % 5 == 0:
                producer_ids.append(None)
                group_ids.append(key)  # keyed by its message group
            elif (n + i) % 13 == 0:
                key = ""
                producer_ids.append(None)
                group_ids.append(None)  # no key: not replayed
            else:
                producer_ids.append(key)
                group_ids.append(None)
            seq[key] = seq.get(key, 0) + 1 + i % 3
            seq_nos.append(seq[key])
        batches.append(
            build_wire_batch(
                [b"m" * (10 + (n * 31 + i) % 900) for i in range(count)],
                seq_no=seq_nos,
                producer_id=producer_ids,  # type: ignore[arg-type]
                message_group_id=group_ids,  # type: ignore[arg-type]
            )
        )
    return batches


@pytest.mark.parametrize("run_bytes", [1, 2048, 64 * 1024, 4 * MIB])
def test_producer_state_after_the_replay_is_the_state_before_the_crash(
    tmp_path, monkeypatch, run_bytes
) -> None:
    batches = _mixed_batches()
    directory, crashed, clock = _crashed(tmp_path, batches)
    keys = [f"k{k}" for k in range(11)]
    before = {key: _state(crashed, key) for key in keys}
    assert all(entry is not None for entry in before.values())
    monkeypatch.setattr(partition_log, "REPLAY_RUN_BYTES", run_bytes, raising=False)
    calls = _replay_calls(monkeypatch)
    reopened = _open(directory, clock)
    assert sum(batch.num_rows for batch in calls) == sum(b.num_rows for b in batches)
    if run_bytes == 1:
        assert len(calls) == len(batches), "a run per frame"
    for key in keys:
        assert _state(reopened, key) == before[key], key
    # Dedup refuses every replayed message with a producer id again (messages keyed by
    # their message group only, or not at all, are never duplicates) ...
    first = reopened.end_offset
    for batch in batches:
        result = reopened.append(batch)
        producer_ids = batch.column("producer_id").to_pylist()
        assert result.status.tolist() == [WRITTEN if p is None else DUPLICATE for p in producer_ids]
    # ... and takes the next ones.
    result = reopened.append(
        build_wire_batch([b"new"], seq_no=[before["k3"][0] + 1], producer_id=["k3"])
    )
    assert result.status.tolist() == [WRITTEN]
    assert reopened.end_offset > first
    reopened.close()


def test_a_run_ends_at_its_byte_cap_and_never_carries_the_messages_data(
    tmp_path, monkeypatch
) -> None:
    """The offset overflow of a run over 2 GiB, made cheap: runs are cut by the bytes of
    the columns they keep, and the data column (the one that reached 2 GiB) is not one."""
    long_ids = [f"{k:04d}" + "i" * (limits.PRODUCER_ID_BYTES_MAX - 4) for k in range(64)]
    batches = [
        build_wire_batch(
            [b"d" * 4096] * 8, seq_no=list(range(8 * n, 8 * n + 8)), producer_id=long_ids[n::8]
        )
        for n in range(8)
    ]  # 8 frames of 8 messages with 2 KiB producer ids: ~16 KiB of kept columns a frame
    directory, crashed, clock = _crashed(tmp_path, batches)
    monkeypatch.setattr(partition_log, "REPLAY_RUN_BYTES", 40 * 1024, raising=False)
    calls = _replay_calls(monkeypatch)
    reopened = _open(directory, clock)
    assert [batch.num_rows for batch in calls] == [24, 24, 16], "cut at 3 frames' kept bytes"
    for batch in calls:
        assert "data" not in batch.schema.names
        assert "metadata" not in batch.schema.names
    for key in long_ids:
        assert _state(reopened, key) == _state(crashed, key)
    reopened.close()


def test_segment_bytes_over_two_gib_is_refused_with_a_clear_error() -> None:
    TopicConfig(segment_bytes=limits.SEGMENT_BYTES_MAX).validate()
    with pytest.raises(InvalidParameterValueError, match="segment_bytes must be at most"):
        TopicConfig(segment_bytes=limits.SEGMENT_BYTES_MAX + 1).validate()
