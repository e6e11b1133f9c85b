"""``staged_refs.PartitionGroups``: the groups of a staged table of many chunks are taken
from one joined copy of it, made once (a ``take`` over a table of many chunks joins all of
them first: before, a copy of the whole table for every partition)."""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pytest

from engine import staged_refs
from tests.take_spy import spy_takes


def _table(rng: random.Random) -> pa.Table:
    """A table of several chunks of different lengths (an empty one among them), with a
    binary, a string and a nullable int column, as a staged file's map gives it."""
    batches = []
    for chunk in range(rng.randint(1, 7)):
        count = rng.choice([0, 1, 3, 17, 40])
        batches.append(pa.record_batch({
            "data": pa.array([bytes([chunk]) * rng.randint(0, 30) for _ in range(count)],
                             pa.binary()),
            "key": pa.array([f"k{chunk}.{i}" for i in range(count)], pa.string()),
            "seq": pa.array([None if i % 5 == 0 else i for i in range(count)], pa.int64()),
        }))  # fmt: skip
    return pa.Table.from_batches(batches, schema=batches[0].schema)


def test_groups_are_a_filters_rows_in_one_chunk() -> None:
    rng = random.Random(36)
    for _ in range(200):
        table = _table(rng)
        if not table.num_rows:
            continue
        values = np.array([rng.randrange(4) for _ in range(table.num_rows)], np.int64)
        groups = staged_refs.PartitionGroups(table, values)
        for partition in groups.partitions.tolist():
            rows = groups.rows_of(partition)
            assert rows is not None
            assert rows.equals(table.filter(pa.array(values == partition)).combine_chunks())
            if len(groups.partitions) > 1:  # (one partition: ``rows`` itself, no copy)
                assert all(column.num_chunks == 1 for column in rows.columns)
        assert groups.rows_of(99) is None


def test_groups_never_take_from_many_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every ``take`` a group makes is over one chunk, and the join is made once, however
    many groups are taken."""
    rng = random.Random(7)
    table = pa.concat_tables([_table(rng) for _ in range(4)])
    assert table.column(0).num_chunks > 1
    values = np.array([rng.randrange(5) for _ in range(table.num_rows)], np.int64)
    seen = spy_takes(monkeypatch)
    groups = staged_refs.PartitionGroups(table, values)
    joined = []
    for partition in groups.partitions.tolist():
        assert groups.rows_of(partition) is not None
        joined.append(id(groups._joined))
    assert len(seen) == len(groups.partitions) > 1 and max(seen) == 1
    assert len(set(joined)) == 1
