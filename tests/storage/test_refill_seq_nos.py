"""Staged share bodies with their seq_nos filled in (``wire_columns.refill_seq_nos``;
issue 14, produce at 1000 partitions).

A spread statement's shares are staged with null seq_nos and numbered at publish; the
publish's frame bodies are the staged ones refilled, without an Arrow serialize per
share. For random shares (nulls in every other nullable column, maps with and without
entries, slices of a larger batch, 1 to 70 rows) the refilled body is byte for byte
what ``serialize_body_buffer`` gives the numbered batch; a body that is not of that
shape (a seq_no not null, another layout, a wrong count) is refused (None), so the
publish serializes it.
"""

from __future__ import annotations

import os
import random
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from storage import spread_publish
from storage.clock import ManualClock
from storage.partition_log import PartitionLog
from storage.producer_state import SpreadDecision
from storage.record_batch import WIRE_SCHEMA, serialize_body_buffer
from storage.wire_columns import refill_seq_nos
from tests.storage.test_spread_publish import PARTITIONS, _topic
from tests.storage.test_spread_publish import _shares as _statement_shares
from tests.storage.test_wire_columns import _compressed_body, _random_batch

SEQ_NO = WIRE_SCHEMA.field(0)


def _with_null_seq_nos(batch: pa.RecordBatch) -> pa.RecordBatch:
    return batch.set_column(0, SEQ_NO, pa.nulls(batch.num_rows, pa.int64()))


def _shares(rng: random.Random) -> list[pa.RecordBatch]:
    """Shares as a spread statement has them: slices of one batch, seq_nos all null."""
    counts = [
        rng.choice([1, 2, 5, 7, 8, 9, 16, 17, 63, 64, 70]) for _ in range(rng.randrange(1, 12))
    ]
    whole = _with_null_seq_nos(_random_batch(rng, sum(counts) + rng.randrange(3)))
    shares, start = [], rng.randrange(2)
    for count in counts:
        if start + count > whole.num_rows:
            break
        shares.append(whole.slice(start, count))
        start += count
    return shares or [whole]


def _numbered(shares: list[pa.RecordBatch], seq_nos: np.ndarray) -> list[pa.RecordBatch]:
    """What ``producer_state.decide_shares`` makes of them: one array, sliced per share."""
    filled = pa.array(seq_nos, pa.int64())
    out, start = [], 0
    for share in shares:
        out.append(share.set_column(0, SEQ_NO, filled.slice(start, share.num_rows)))
        start += share.num_rows
    return out


@pytest.mark.parametrize("seed", range(40))
def test_refilled_bodies_are_the_serialized_numbered_shares(seed: int) -> None:
    rng = random.Random(seed)
    shares = _shares(rng)
    counts = np.array([share.num_rows for share in shares], np.int64)
    seq_nos = np.array([rng.randrange(2**62) for _ in range(int(counts.sum()))], np.int64)
    refilled = refill_seq_nos([serialize_body_buffer(s) for s in shares], counts, seq_nos)
    assert refilled is not None
    for body, numbered in zip(refilled, _numbered(shares, seq_nos), strict=True):
        assert body.to_pybytes() == serialize_body_buffer(numbered).to_pybytes()
        read = pa.ipc.read_record_batch(body, WIRE_SCHEMA)
        assert read.equals(numbered)


def test_a_body_whose_seq_nos_are_not_all_null_is_refused() -> None:
    rng = random.Random(7)
    shares = _shares(rng)
    counts = np.array([share.num_rows for share in shares], np.int64)
    seq_nos = np.arange(int(counts.sum()), dtype=np.int64)
    numbered = _numbered(shares, seq_nos)
    bodies = [serialize_body_buffer(s) for s in shares]
    bodies[-1] = serialize_body_buffer(numbered[-1])  # already numbered: no bitmap
    assert refill_seq_nos(bodies, counts, seq_nos) is None
    # some null, some not: the bitmap is there but the null count is not the count
    half = shares[0].set_column(
        0, SEQ_NO, pa.array([None if i % 2 else i for i in range(shares[0].num_rows)],
                            pa.int64()))  # fmt: skip
    if half.column(0).null_count < half.num_rows:
        bodies = [serialize_body_buffer(half), *[serialize_body_buffer(s) for s in shares[1:]]]
        assert refill_seq_nos(bodies, counts, seq_nos) is None


def test_another_layout_or_a_wrong_count_is_refused() -> None:
    rng = random.Random(11)
    shares = [_with_null_seq_nos(_random_batch(rng, n)) for n in (5, 6, 7)]
    counts = np.array([5, 6, 7], np.int64)
    seq_nos = np.arange(18, dtype=np.int64)
    bodies = [serialize_body_buffer(s) for s in shares]
    assert refill_seq_nos(bodies, counts, seq_nos) is not None
    assert refill_seq_nos([*bodies[:2], _compressed_body(shares[2])], counts, seq_nos) is None
    wrong = np.array([5, 7, 6], np.int64)  # same total, not the bodies' counts
    assert refill_seq_nos(bodies, wrong, seq_nos) is None


def test_a_spread_publish_writes_refilled_bodies(
    tmp_path: Any, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Shares given with their staged bodies and numbered at publish are written from
    those bodies (no serialize per share), and the partitions' files are byte for byte
    those of publishing the shares one by one."""
    together, alone = _topic(tmp_path, clock, "a"), _topic(tmp_path, clock, "b")
    for statement in range(3):
        shares = [
            (p, b, serialize_body_buffer(b)) for p, b, _ in _statement_shares(statement, False)
        ]
        for partition, batch, _ in shares:
            alone.publish_transactional(batch, partition, 100 + statement)
        with monkeypatch.context() as patched:
            patched.setattr(spread_publish, "serialize_body_buffer", _not_serialized)
            # nor is a numbered batch built per share: the refill takes the decided numbers
            patched.setattr(SpreadDecision, "batch", _not_built)
            together.publish_transactional_many(shares, 100 + statement)
    for partition in range(PARTITIONS):
        a, b = together.partition(partition), alone.partition(partition)
        a.sync()
        b.sync()
        assert _log_bytes(a) == _log_bytes(b)
    together.close()
    alone.close()


def _not_serialized(batch: pa.RecordBatch) -> pa.Buffer:
    raise AssertionError("a share was serialized, not refilled")


def _not_built(self: SpreadDecision, index: int) -> pa.RecordBatch:
    raise AssertionError("a numbered batch was built for a share")


def _log_bytes(log: PartitionLog) -> bytes:
    names = sorted(n for n in os.listdir(log.directory) if n.endswith(".log"))
    assert names
    return b"".join(open(os.path.join(log.directory, n), "rb").read() for n in names)
