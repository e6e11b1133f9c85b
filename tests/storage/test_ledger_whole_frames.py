"""``Ledger.whole_frames``: the oldest frames a consumer reads whole. Taken in ledger order
while every share starts at the consumer's offset of its partition, within both budgets;
their rows are exactly the ledger's rows of those offsets; frames read already are passed;
a consumer inside or behind a frame, a partition it does not read, or a first frame over
a budget give None (the poll then reads partition by partition)."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from storage import ledger as ledger_module
from storage import limits
from storage.fs import FileSystem
from storage.ledger import Ledger
from storage.record_batch import build_wire_batch


def _batch(tag: str, count: int) -> pa.RecordBatch:
    return build_wire_batch([f"{tag}/{i}".encode() for i in range(count)],
                            producer_id=f"p-{tag}", seq_no=list(range(count)))  # fmt: skip


def _open(tmp_path: Path) -> Ledger:
    return Ledger(FileSystem(), str(tmp_path / "ledger"))


def _fill(ledger: Ledger, statements: int, seed: int = 3) -> list[list[tuple[int, int]]]:
    """Append ``statements`` statements over up to 12 partitions; each one's (partition,
    rows) shares."""
    rng = random.Random(seed)
    written = []
    for k in range(statements):
        chosen = sorted(rng.sample(range(12), rng.randint(1, 12)))
        shares = [(p, _batch(f"{k}.{p}", rng.randint(1, 5))) for p in chosen]
        ledger.append(shares, written_at_us=1_000 + k)
        written.append([(p, batch.num_rows) for p, batch in shares])
    return written


def _rows(whole: ledger_module.LedgerWhole) -> dict[int, list[tuple[int, bytes]]]:
    """Each partition's (offset, data) in the order the whole frames hold them."""
    found: dict[int, list[tuple[int, bytes]]] = {}
    for partitions, batch in whole.read_batches():
        offsets, data = batch.column("offset").to_pylist(), batch.column("data").to_pylist()
        for partition, offset, value in zip(partitions.tolist(), offsets, data, strict=True):
            found.setdefault(partition, []).append((offset, value))
    return found


def _expected(ledger: Ledger, starts: dict[int, int], ends: dict[int, int]) -> dict[int, list]:
    found = {}
    for partition, start in starts.items():
        if ends[partition] > start:
            table = ledger.read(partition, start, ends[partition] - start)
            found[partition] = list(zip(table.column("offset").to_pylist(),
                                        table.column("data").to_pylist(), strict=True))  # fmt: skip
    return found


def test_whole_frames_in_order_within_the_budgets(tmp_path: Path) -> None:
    ledger = _open(tmp_path)
    try:
        written = _fill(ledger, 40)
        starts = dict.fromkeys(range(12), 0)
        sizes = [sum(rows for _, rows in shares) for shares in written]
        taken = 0  # frames read so far
        while taken < len(written):
            budget = sum(sizes[taken : taken + 3]) + 1  # three frames fit, not four
            whole = ledger.whole_frames(starts, budget, 1 << 30)
            assert whole is not None
            frames = min(3, len(written) - taken)
            assert len(whole) == frames
            assert whole.message_count == sum(sizes[taken : taken + frames])
            assert whole.written_ats == [1_000 + taken + k for k in range(frames)]
            ends = dict(starts)
            for shares in written[taken : taken + frames]:
                for partition, rows in shares:
                    ends[partition] += rows
            assert whole.next_offsets == {p: e for p, e in ends.items() if e > starts[p]}
            assert _rows(whole) == _expected(ledger, starts, ends)
            starts.update(whole.next_offsets)
            taken += frames
        assert ledger.whole_frames(starts, 10_000, 1 << 30) is None  # all read
        # the byte budget: the first frame alone over it gives nothing
        zero = dict.fromkeys(range(12), 0)
        first = ledger.whole_frames(zero, 10_000, 1 << 30)
        assert first is not None
        assert ledger.whole_frames(zero, 10_000, first.bodies[0].size - 1) is None
        one = ledger.whole_frames(zero, 10_000, first.bodies[0].size)
        assert one is not None and len(one) == 1 and one.size == first.bodies[0].size
        assert ledger.whole_frames(zero, sizes[0] - 1, 1 << 30) is None
    finally:
        ledger.close()


def test_no_frame_for_a_consumer_inside_or_behind_one_or_a_partition_not_read(
    tmp_path: Path,
) -> None:
    ledger = _open(tmp_path)
    try:
        ledger.append([(0, _batch("a0", 3)), (1, _batch("a1", 2))])
        ledger.append([(0, _batch("b0", 2)), (2, _batch("b2", 4))])
        assert ledger.whole_frames({0: 1, 1: 0, 2: 0}, 100, 1 << 30) is None  # inside
        assert ledger.whole_frames({0: 0, 2: 0}, 100, 1 << 30) is None  # 1 not read
        # past the first frame (read), at the second's edges for 0 and 2
        whole = ledger.whole_frames({0: 3, 1: 2, 2: 0}, 100, 1 << 30)
        assert whole is not None and whole.next_offsets == {0: 5, 2: 4}
        # at the first's edges: both taken; the second needs 0 at 3, which the first leaves
        both = ledger.whole_frames({0: 0, 1: 0, 2: 0}, 100, 1 << 30)
        assert both is not None and both.next_offsets == {0: 5, 1: 2, 2: 4}
        # behind: a partition whose offsets the consumer has not reached in the ledger
        ledger.advance(3, 7)  # partition 3's own log holds 0..6 (written around the ledger)
        ledger.append([(0, _batch("c0", 1)), (3, _batch("c3", 1))])
        assert ledger.whole_frames({0: 5, 1: 2, 2: 4, 3: 0}, 100, 1 << 30) is None
        last = ledger.whole_frames({0: 5, 1: 2, 2: 4, 3: 7}, 100, 1 << 30)
        assert last is not None and last.next_offsets == {0: 6, 3: 8}
    finally:
        ledger.close()


def test_frames_read_already_are_passed_up_to_a_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger = _open(tmp_path)
    try:
        for k in range(6):
            ledger.append([(0, _batch(f"{k}", 1)), (1, _batch(f"{k}", 1))])
        whole = ledger.whole_frames({0: 5, 1: 5}, 100, 1 << 30)
        assert whole is not None and whole.message_count == 2  # the sixth frame
        monkeypatch.setattr(limits, "LEDGER_WHOLE_WALK_MAX", 4)
        assert ledger.whole_frames({0: 5, 1: 5}, 100, 1 << 30) is None  # 5 passed: gave up
        assert ledger.whole_frames({0: 4, 1: 4}, 100, 1 << 30) is not None
        assert np.array_equal(whole.partitions[0], [0, 1])
    finally:
        ledger.close()
