"""``staged_refs.rows_at``: a partition's rows of a staged table of many chunks, taken
chunk by chunk (a ``take`` over a table of many chunks joins all of them first)."""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from engine import staged_refs


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
    return pa.Table.from_batches(batches)


def test_rows_at_gives_the_rows_a_take_gives_as_one_chunk() -> None:
    rng = random.Random(36)
    for _ in range(300):
        table = _table(rng)
        if not table.num_rows:
            continue
        chosen = rng.sample(range(table.num_rows), rng.randint(1, table.num_rows))
        positions = np.array(sorted(chosen), np.int64)
        got = staged_refs.rows_at(table, positions)
        assert got.equals(table.take(pa.array(positions)).combine_chunks())
        assert all(column.num_chunks == 1 for column in got.columns)


def test_partition_groups_never_take_from_many_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every ``take`` a group makes is over one chunk (the old one joined the whole
    table first, for every partition), and the groups are the rows a filter gives."""
    rng = random.Random(7)
    table = pa.concat_tables([_table(rng) for _ in range(4)])
    values = np.array([rng.randrange(5) for _ in range(table.num_rows)], np.int64)
    seen: list[int] = []
    take = pc.take

    def counting(data, *args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(data.num_chunks if isinstance(data, pa.Table) else 1)
        return take(data, *args, **kwargs)

    monkeypatch.setattr(pc, "take", counting)
    groups = staged_refs.PartitionGroups(table, values)
    for partition in groups.partitions.tolist():
        rows = groups.rows_of(partition)
        assert rows is not None
        expected = table.filter(pa.array(values == partition)).combine_chunks()
        assert rows.equals(expected)
    assert seen and max(seen) == 1
