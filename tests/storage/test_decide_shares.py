"""``producer_state.decide_shares`` / ``record_share`` (or ``record_shares``, all
shares in one pass) against ``decide`` and ``record_decision`` share by share, on random
inputs.

Two identical sets of partitions' producer states (built by the same earlier writes,
some producers expired, some known only by a message group) get the same shares: one
set through the per-share path, the other through ``decide_shares``. Where
``decide_shares`` decides (no duplicate, every message with a producer, seq_nos all
null or none), the filled seq_nos, and the state after recording (each entry's last
seq_no, offset, time, and the earlier offset a resend of any seq_no would report) must
be the same; where it returns None, the per-share path must find a reason (a duplicate,
a missing producer id, mixed null seq_nos, a negative seq_no).
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from storage import producer_state
from storage.clock import ManualClock
from storage.errors import InvalidParameterValueError
from storage.fs import FileSystem
from storage.producer_state import (
    ProducerStateManager,
    decide_shares,
    record_share,
    record_shares,
)
from storage.record_batch import build_wire_batch
from tests.storage.producer_helpers import DAY_US, EXPIRY_US, write_per_share

KEYS = [f"p{k}" for k in range(12)]


def _managers(tmp_path: Any, clock: ManualClock, count: int) -> list[ProducerStateManager]:
    return [
        ProducerStateManager(FileSystem(), str(tmp_path), clock, EXPIRY_US) for _ in range(count)
    ]


def _batch(
    producers: list[str | None], seq_nos: list[int | None], groups: list[str | None] | None = None
) -> pa.RecordBatch:
    return build_wire_batch(
        [b"x"] * len(producers), seq_no=seq_nos, producer_id=producers, message_group_id=groups
    )


_old_write = write_per_share


def _history(rng: random.Random, managers: list[list[ProducerStateManager]],
             clock: ManualClock) -> list[int]:  # fmt: skip
    """The same earlier writes to each set of managers; returns each partition's end."""
    ends = [0] * len(managers[0])
    for _ in range(rng.randrange(0, 6)):
        for partition in range(len(ends)):
            count = rng.randrange(1, 90)  # both sides of SMALL_BATCH_ROWS
            producers = [rng.choice([*KEYS, None]) for _ in range(count)]
            groups = [rng.choice([None, "g1", KEYS[0]]) for _ in range(count)]
            seq_nos = [rng.choice([None, rng.randrange(0, 40)]) for _ in range(count)]
            batch = _batch(producers, seq_nos, groups)
            for side in managers:
                _old_write(side[partition], batch, ends[partition], clock.now_us())
            ends[partition] += count
        clock.advance(microseconds=rng.choice([1, DAY_US, 10 * DAY_US]))
    return ends


def _shares(rng: random.Random, partitions: int, floor: int) -> list[pa.RecordBatch]:
    shares = []
    null_seq_nos = rng.random() < 0.5
    for _ in range(partitions):
        count = rng.choice([1, 2, 5, rng.randrange(1, 40), rng.randrange(1, 150)])
        producers: list[str | None] = [rng.choice(KEYS[: rng.randrange(1, 13)])
                                       for _ in range(count)]  # fmt: skip
        if rng.random() < 0.02:
            producers[rng.randrange(count)] = None
        seq_nos: list[int | None]
        if null_seq_nos:
            seq_nos = [None] * count
            if rng.random() < 0.02:
                seq_nos[rng.randrange(count)] = 7
        else:
            # mostly past every earlier seq_no; sometimes among them (duplicates)
            start = {key: floor - rng.choice([0, 0, 0, 0, 0, 0, 0, 0, 30]) for key in KEYS}
            steps = [1, 1, 3, 0, -1] if rng.random() < 0.2 else [1, 1, 3]  # 0, -1: duplicates
            seq_nos = []
            for key in producers:
                start[key or ""] = start.get(key or "", 0) + rng.choice(steps)
                seq_nos.append(start[key or ""])
        shares.append(_batch(producers, seq_nos))
    return shares


def _resend_outcomes(manager: ProducerStateManager, keys: list[str]) -> list[Any]:
    """What a resend of every seq_no up to 300 of each key is told (duplicate and the
    earlier offset), read without changing the state."""
    outcomes = []
    for key in keys:
        entry = manager.entry(key)
        if entry is None:
            outcomes.append(None)
            continue
        earlier = [producer_state._earlier_offset(entry, s) for s in range(300)]
        outcomes.append((entry.last_seq_no, entry.last_offset, entry.last_written_at_us, earlier))
    return outcomes


@pytest.mark.parametrize("seed", range(60))
def test_decide_shares_matches_the_per_share_path(
    tmp_path: Any, clock: ManualClock, seed: int
) -> None:
    rng = random.Random(seed)
    partitions = rng.choice([2, 3, 8])
    old, new = _managers(tmp_path, clock, partitions), _managers(tmp_path, clock, partitions)
    ends = _history(rng, [old, new], clock)
    for round_ in range(4):
        shares = _shares(rng, partitions, 1000 * round_ + rng.choice([0, 40]))
        at = clock.now_us()
        decision = decide_shares(new, shares)
        old_decisions = []
        refused = False
        for partition, share in enumerate(shares):
            try:
                old_decisions.append(_old_write(old[partition], share, ends[partition], at))
            except InvalidParameterValueError:
                refused = True  # a negative seq_no: refused share by share too
                break
        if decision is None:
            reasons = (
                refused
                or any(d.duplicate_count for d in old_decisions)
                or any(s.column(1).null_count for s in shares)
                or len({s.column(0).null_count == 0 for s in shares}) > 1
                or any(0 < s.column(0).null_count < s.num_rows for s in shares)
            )
            assert reasons, f"seed {seed}: decide_shares refused a usual case"
            return  # the two sides part here: the caller would take the per-share path
        assert not refused
        assert all(d.duplicate_count == 0 for d in old_decisions)
        together = rng.random() < 0.5  # all shares in one pass, or share by share
        if together:
            record_shares(new, decision, list(ends), at)
        for partition, (share, old_decision) in enumerate(
            zip(decision.batches, old_decisions, strict=True)
        ):
            assert share.column(0).to_pylist() == old_decision.batch.column(0).to_pylist()
            assert share.column(0).null_count == 0
            if not together:
                record_share(new[partition], decision, partition, ends[partition], at)
            ends[partition] += share.num_rows
        for partition in range(partitions):
            assert _resend_outcomes(new[partition], KEYS) == _resend_outcomes(
                old[partition], KEYS
            ), f"seed {seed} partition {partition}"
        clock.advance(microseconds=rng.choice([1, 5, DAY_US]))


def test_server_numbered_shares_continue_each_producer_per_partition(
    tmp_path: Any, clock: ManualClock
) -> None:
    first, second = _managers(tmp_path, clock, 2)
    first.record_decision(first.decide(_batch(["a"], [10])), 0, clock.now_us())
    shares = [_batch(["a", "b", "a"], [None] * 3), _batch(["a", "a"], [None] * 2)]
    decision = decide_shares([first, second], shares)
    assert decision is not None
    assert [b.column(0).to_pylist() for b in decision.batches] == [[11, 0, 12], [0, 1]]
    for index, (manager, base) in enumerate(zip([first, second], [1, 0], strict=True)):
        record_share(manager, decision, index, base, clock.now_us())
    assert first.last_seq_no("a") == 12 and first.entry("a").last_offset == 3  # type: ignore[union-attr]
    assert first.last_seq_no("b") == 0 and second.last_seq_no("a") == 1


def test_a_duplicate_or_a_missing_producer_is_left_to_the_per_share_path(
    tmp_path: Any, clock: ManualClock
) -> None:
    first, second = _managers(tmp_path, clock, 2)
    first.record_decision(first.decide(_batch(["a"], [10])), 0, clock.now_us())
    fresh = _batch(["b"], [1])
    assert decide_shares([first, second], [_batch(["a"], [10]), fresh]) is None
    assert decide_shares([first, second], [_batch(["c", "c"], [3, 3]), fresh]) is None
    assert decide_shares([first, second], [_batch([None], [None]), fresh]) is None
    assert decide_shares([first, second], [_batch(["c"], [None]), fresh]) is None  # mixed
    assert decide_shares([first, second], [_batch(["c"], [-1]), fresh]) is None
    assert decide_shares([first, second], [_batch(["a"], [11]), fresh]) is not None
    assert first.last_seq_no("a") == 10, "deciding changes no state"


def test_decided_state_is_kept_as_numpy_arrays(tmp_path: Any, clock: ManualClock) -> None:
    (manager,) = _managers(tmp_path, clock, 1)
    decision = decide_shares([manager], [_batch(["a", "b", "a"], [1, 4, 2])])
    assert decision is not None
    record_share(manager, decision, 0, 100, clock.now_us())
    entry = manager.entry("a")
    assert entry is not None and entry.recent_seq_nos.dtype == np.int64
    assert entry.recent_seq_nos.tolist() == [1, 2] and entry.recent_offsets.tolist() == [100, 102]
    # its own arrays: an entry never keeps a statement's whole array alive
    assert entry.recent_seq_nos.base is None and entry.recent_offsets.base is None


def test_decided_counts_need_no_batch(tmp_path: Any, clock: ManualClock) -> None:
    """Given the row counts and the table of all shares, the decision reads no share's
    batch (``topic_log.Shares.pieces`` makes one only when it is read)."""
    shares = [_batch(["a", "b", "a"], [None] * 3), _batch(["a"], [None])]
    table = pa.Table.from_batches(shares)

    class Unread(list[pa.RecordBatch]):
        def __getitem__(self, index: Any) -> Any:
            raise AssertionError("a share's batch was read")

        def __iter__(self) -> Any:
            raise AssertionError("the shares' batches were read")

    first, second = _managers(tmp_path, clock, 2)
    decision = decide_shares([first, second], Unread(shares), table, np.array([3, 1]))
    assert decision is not None and decision.seq_nos is not None
    assert decision.seq_nos.tolist() == [0, 0, 1, 0]
    record_shares([first, second], decision, [10, 20], clock.now_us())
    assert first.entry("a").last_offset == 12 and second.entry("a").last_offset == 20  # type: ignore[union-attr]
    assert first.entry("a").recent_offsets.tolist() == [10, 12]  # type: ignore[union-attr]
