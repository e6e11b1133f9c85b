"""A statement's shares handed to the ledger as one batch (``Ledger.append_whole``,
``ledger_format.encode_whole``): the same frame as the shares given one by one, and the
checks of a frame's shares still made."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from storage import ledger_format as fmt
from storage.fs import FileSystem
from storage.ledger import Ledger
from storage.record_batch import build_wire_batch

Shares = list[tuple[int, pa.RecordBatch]]


def _shares() -> Shares:
    return [(p, build_wire_batch([f"{p}/{i}".encode() for i in range(p % 3 + 1)],
                                 producer_id=f"w{p}", seq_no=list(range(p % 3 + 1))))
            for p in (1, 4, 5, 9)]  # fmt: skip


def _whole(shares: Shares) -> tuple[np.ndarray, np.ndarray, pa.RecordBatch]:
    partitions = np.array([p for p, _ in shares], np.int64)
    counts = np.array([b.num_rows for _, b in shares], np.int64)
    return partitions, counts, pa.concat_batches([b for _, b in shares])


def test_one_batch_encodes_as_the_shares_do() -> None:
    shares = _shares()
    one, each = fmt.encode_whole(*_whole(shares)), fmt.encode_body(shares)
    assert one.body.equals(each.body) and one.body_crc == each.body_crc
    assert np.array_equal(one.partitions, each.partitions)
    assert np.array_equal(one.counts, each.counts)


def test_the_shares_checks_hold_for_one_batch() -> None:
    partitions, counts, whole = _whole(_shares())
    with pytest.raises(ValueError, match="add up"):
        fmt.encode_whole(partitions, counts + 1, whole)
    with pytest.raises(ValueError, match="increasing"):
        fmt.encode_whole(partitions[::-1].copy(), counts, whole)
    with pytest.raises(ValueError, match="at least one"):
        fmt.encode_whole(partitions, np.zeros_like(counts), whole.slice(0, 0))
    with pytest.raises(ValueError, match="wire batch"):
        fmt.encode_whole(partitions, counts, whole.drop_columns(["metadata"]))


def test_a_frame_appended_whole_reads_back_as_the_shares(tmp_path: Path) -> None:
    shares = _shares()
    ledger = Ledger(FileSystem(), str(tmp_path / "ledger"))
    try:
        bases = ledger.append_whole(*_whole(shares), written_at_us=7)
        again = ledger.append(shares, written_at_us=8)
        for (partition, batch), base, later in zip(shares, bases, again, strict=True):
            assert (base, later) == (0, batch.num_rows)
            rows = ledger.read(partition, 0)
            assert rows.column("data").to_pylist() == batch.column("data").to_pylist() * 2
    finally:
        ledger.close()
