"""The columns ``engine.writes`` packs in Python for a few values (``limits.PACKED_VALUES_MAX``: a
plain combiner round's batch) and with numpy for more are the same arrays: the data
column's values and int32 offsets as Arrow builds them, the ``created_at`` column the
clock's one reading for every message, at and around the bound. (A speed-only change:
this pins its output either side of the bound; it passes on the numpy-only code too.)"""

from __future__ import annotations

import pyarrow as pa
import pytest

from engine import writes
from storage import limits
from storage.clock import ManualClock
from storage.record_batch import TIMESTAMP

BOUND = limits.PACKED_VALUES_MAX
COUNTS = [1, 2, 7, BOUND - 1, BOUND, BOUND + 1, 300]


@pytest.mark.parametrize("count", COUNTS)
def test_the_data_column_is_arrows_binary_array(count: int) -> None:
    values = [bytes([i % 251]) * (i * 37 % 1500) for i in range(count)]
    built = writes._binary_array(values)
    assert built is not None
    built.validate(full=True)
    expected = pa.array(values, pa.binary())
    assert built.equals(expected)
    assert built.buffers()[1].to_pybytes() == expected.buffers()[1].to_pybytes()  # offsets


@pytest.mark.parametrize("count", COUNTS)
def test_created_at_is_the_clocks_one_reading(count: int) -> None:
    clock = ManualClock(1_700_000_001_234_567)
    now = clock.now_us()
    column = writes._now(count, clock)
    column.validate(full=True)
    assert column.type == TIMESTAMP and len(column) == count and column.null_count == 0
    assert column.cast(pa.int64()).to_pylist() == [now] * count
