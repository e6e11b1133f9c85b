"""A producer silent for the expiry is forgotten whole: a restart is a new producer.

Before: an expired entry stayed in the table until ``expire`` ran; a producer
restarting at seq_no 5 after writing 100 was accepted (the decision reads expired
entries as absent), but the write merged into the old entry (last seq_no
max(100, 5) = 100, write time refreshed), so the producer's next messages 6, 7, ...
were dropped as duplicates. Every path that records is covered: the per-share
decision (small, one-producer and general batches), ``decide_shares`` /
``record_share`` (explicit and server-numbered seq_nos), and the replay on open,
from a snapshot holding the old entry and within one replay run.
"""

from __future__ import annotations

import os
from typing import Any

import pyarrow as pa
import pytest

from storage.clock import ManualClock
from storage.config import FsyncPolicy, TopicConfig
from storage.fs import FileSystem
from storage.partition_log import PartitionLog
from storage.producer_state import (
    SMALL_BATCH_ROWS,
    ProducerStateManager,
    decide_shares,
    record_share,
)
from storage.record_batch import build_wire_batch
from tests.storage.producer_helpers import EXPIRY_US, id_batch, new_manager, write_per_share

_manager = new_manager
_batch = id_batch


def _write(manager: ProducerStateManager, batch: pa.RecordBatch, base: int, at: int) -> list[bool]:
    """The per-share path; which messages it found duplicates."""
    return write_per_share(manager, batch, base, at).duplicate.tolist()


@pytest.mark.parametrize(
    "restart",
    [
        [5],  # small batch
        list(range(5, 5 + SMALL_BATCH_ROWS + 10)),  # one producer, large: ``one_producer``
        [5, 5, *range(6, 6 + SMALL_BATCH_ROWS)],  # large with a duplicate: ``record``
    ],
    ids=["small", "one-producer", "general"],
)
def test_a_restart_after_expiry_is_a_new_producer(
    tmp_path: Any, clock: ManualClock, restart: list[int]
) -> None:
    manager = _manager(tmp_path, clock)
    _write(manager, _batch(["p"], [100]), 0, clock.now_us())
    clock.advance(microseconds=EXPIRY_US)  # "p" expired, its entry still stored
    assert manager.entry("p") is None
    duplicates = _write(manager, _batch(["p"] * len(restart), restart), 1, clock.now_us())
    assert duplicates == [i > 0 and restart[i] == restart[i - 1] for i in range(len(restart))]
    assert manager.last_seq_no("p") == max(restart), "the forgotten 100 is gone"
    written = len(restart) - sum(duplicates)
    entry = manager.entry("p")
    assert entry is not None and entry.last_offset == written
    after = max(restart) + 1
    assert _write(manager, _batch(["p"], [after]), 1 + written, clock.now_us()) == [False]
    assert manager.last_seq_no("p") == after


def test_a_live_producer_still_keeps_its_largest_seq_no(tmp_path: Any, clock: ManualClock) -> None:
    manager = _manager(tmp_path, clock)
    _write(manager, _batch(["p"], [100]), 0, clock.now_us())
    clock.advance(microseconds=EXPIRY_US - 1)
    assert _write(manager, _batch(["p"], [5]), 1, clock.now_us()) == [True]
    assert manager.last_seq_no("p") == 100


@pytest.mark.parametrize("server_numbered", [False, True])
def test_decide_shares_replaces_an_expired_entry(
    tmp_path: Any, clock: ManualClock, server_numbered: bool
) -> None:
    first, second = _manager(tmp_path, clock), _manager(tmp_path, clock)
    _write(first, _batch(["p"], [100]), 0, clock.now_us())
    _write(second, _batch(["p", "p"], [200, 201]), 0, clock.now_us())
    clock.advance(microseconds=EXPIRY_US)
    seq_nos: list[int | None] = [None] if server_numbered else [5]
    shares = [
        _batch(["p"], seq_nos),
        _batch(["p", "p"], seq_nos * 2 if server_numbered else [5, 6]),
    ]
    decision = decide_shares([first, second], shares)
    assert decision is not None
    expected = [[0], [0, 1]] if server_numbered else [[5], [5, 6]]
    assert [b.column(0).to_pylist() for b in decision.batches] == expected
    for index, manager in enumerate([first, second]):
        record_share(manager, decision, index, 1 if manager is first else 2, clock.now_us())
    assert first.last_seq_no("p") == expected[0][-1]
    assert second.last_seq_no("p") == expected[1][-1]
    entry = first.entry("p")
    assert entry is not None and entry.last_offset == 1 and len(entry.recent_seq_nos) == 0
    # The producer's next messages are new, by either path.
    following = [expected[0][-1] + 1]
    assert _write(first, _batch(["p"], following), 2, clock.now_us()) == [False]
    decision = decide_shares([second], [_batch(["p"], [expected[1][-1] + 1])])
    assert decision is not None, "not a duplicate of the forgotten 201"


def _open(directory: str, clock: ManualClock) -> PartitionLog:
    config = TopicConfig(
        fsync_policy=FsyncPolicy.ALWAYS,
        retention_ms=None,
        segment_ms=1000 * EXPIRY_US,  # no segment roll (and so no snapshot) in between
    )
    return PartitionLog(FileSystem(), directory, 0, config, clock)


@pytest.mark.parametrize("snapshot", [True, False], ids=["from-snapshot", "one-run"])
def test_a_reopen_replays_the_restart_to_the_same_state(
    tmp_path: Any, clock: ManualClock, snapshot: bool
) -> None:
    """``snapshot``: the old entry (100) is in the snapshot loaded on open, the restart's
    message replayed after it; else both are replayed in one run."""
    directory = os.path.join(str(tmp_path), "p0")
    os.makedirs(directory)
    log = _open(directory, clock)
    log.append(_batch(["p"], [100]))
    if snapshot:
        log.close()  # a clean close writes the producer snapshot (with "p" at 100)
        assert log.producers.snapshot_offsets() == [1]
        log = _open(directory, clock)
    clock.advance(microseconds=EXPIRY_US)
    log.append(_batch(["p"], [5]))
    assert log.last_seq_no("p") == 5
    log.sync()  # and crash: no snapshot of the restart
    reopened = _open(directory, clock)
    assert reopened.producers.snapshot_offsets() == ([1] if snapshot else [])
    assert reopened.last_seq_no("p") == 5, "replay forgot the expired 100 too"
    result = reopened.append(_batch(["p"], [6]))
    assert reopened.last_seq_no("p") == 6, result
    reopened.close()


def test_a_replay_run_spanning_the_expiry_merges_a_key_live_at_its_first_write(
    tmp_path: Any, clock: ManualClock
) -> None:
    """A key that wrote again before its expiry is merged, as the live writes merged it,
    even when the replay run holding its writes ends past that expiry. A message group
    (no producer id) keeps any seq_nos, so the merge shows in its largest one."""
    directory = os.path.join(str(tmp_path), "p0")
    os.makedirs(directory)

    def group_batch(seq_no: int) -> pa.RecordBatch:
        return build_wire_batch([b"x"], seq_no=[seq_no], message_group_id=["g"])

    log = _open(directory, clock)
    log.append(group_batch(50))
    log.close()  # the snapshot holds "g" at 50, written at t0
    log = _open(directory, clock)
    clock.advance(microseconds=EXPIRY_US - 1)
    log.append(group_batch(3))  # live: merged, still 50
    clock.advance(microseconds=6)
    log.append(group_batch(4))  # t0 + expiry + 5: "g" wrote 6 us ago, merged
    assert log.last_seq_no("g") == 50
    log.sync()  # and crash
    reopened = _open(directory, clock)
    assert reopened.last_seq_no("g") == 50
    reopened.close()
