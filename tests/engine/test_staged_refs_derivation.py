"""Recovery derives a record's shares by reference (``engine.staged_refs.Derivation``)
reading and checksumming each staged file once, not once per partition the write spans
(every reference of a write names all of its files); the batches are those each
reference alone derives, and the grouping of rows by partition is a filter's."""

from __future__ import annotations

import collections
import os
import sys
import types
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from engine import staged_refs
from engine.database import Database

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import bulk_commit_child as child  # noqa: E402
from test_bulk_commit_crash import CRASHED, _check_and_retry, _run  # noqa: E402


class _Counting:
    """Counts the files ``staged_refs.read_files`` reads and the checksums it computes."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.reads: collections.Counter[str] = collections.Counter()
        self.checksums = 0
        real_read, real_crc = staged_refs.read_files, staged_refs.crc32c.crc32c

        def read_files(root, files, *, check):
            self.reads.update(relative for relative, _, _ in files)
            return real_read(root, files, check=check)

        def crc(data, *args):
            self.checksums += 1
            return real_crc(data, *args)

        monkeypatch.setattr(staged_refs, "read_files", read_files)
        monkeypatch.setattr(staged_refs, "crc32c", types.SimpleNamespace(crc32c=crc))


def _files_named(data: Path) -> set[str]:
    root = data / "bulk_commits"
    return {os.path.relpath(p, data) for p in root.rglob("*.arrows")}


def test_recovery_reads_and_checks_each_file_of_a_commit_by_reference_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """``child``: 4 writes of 2 files each, every write over all 4 partitions: 16
    references naming 2 files each (per-reference derivation read 32 files, 4 x each)."""
    data = tmp_path / "data"
    assert _run(data, "stage", stage_format="arrows") == 0
    assert _run(data, "commit", "commit.after_commit_point=crash",
                stage_format="arrows") == CRASHED  # fmt: skip
    files = _files_named(data)
    topic_files = {f for f in files if os.sep + child.TABLE_WRITE + os.sep not in f}
    assert len(topic_files) == child.WRITES * 2
    counting = _Counting(monkeypatch)
    database = Database.open(str(data), retention_interval_s=None)  # recovery
    database.close()
    assert set(counting.reads) == topic_files
    assert all(count == 1 for count in counting.reads.values()), counting.reads
    assert counting.checksums == len(topic_files)
    monkeypatch.undo()
    assert _check_and_retry(data) == "all"  # every message once, in its partition


def _write(root: Path, name: str, table: pa.Table) -> list:
    path = root / name
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return staged_refs.file_entry(str(root), str(path))


def test_a_derivation_gives_each_reference_its_own_batch(tmp_path: Path) -> None:
    chooser = np.random.default_rng(7)
    lists = []
    for number in range(2):
        files = []
        for piece in range(3):
            partitions = chooser.integers(0, 5, 400)
            table = pa.table({
                "data": pa.array([b"%d-%d-%d" % (number, piece, i) for i in range(400)]),
                "partition": pa.array(partitions, pa.int32())})  # fmt: skip
            files.append(_write(tmp_path, f"{number}-{piece}.arrows", table))
        lists.append(files)
    references = [{"files": files, "dirs": [], "partition": partition, "at": 1_000 + partition}
                  for partition in range(5) for files in lists]  # fmt: skip
    derivation = staged_refs.Derivation(str(tmp_path))
    for reference in references:
        alone = staged_refs.derive(str(tmp_path), reference)
        assert derivation.derive(reference).equals(alone)
        data = staged_refs.read_files(str(tmp_path), reference["files"], check=True)
        mask = pc.equal(data.column("partition"), reference["partition"])
        rows = data.filter(mask).drop_columns(["partition"])
        assert alone.equals(staged_refs.wire_batch(rows, reference["at"]))
    derivation.clear()


def test_partition_groups_are_a_filter_per_partition_in_ascending_order() -> None:
    chooser = np.random.default_rng(11)
    values = chooser.integers(0, 9, 3000)
    chunks = [pa.table({"v": pa.array(range(a, b)), "partition": pa.array(values[a:b])})
              for a, b in [(0, 1000), (1000, 1001), (1001, 3000)]]  # fmt: skip
    data = pa.concat_tables(chunks)
    found = list(staged_refs.partition_groups(data))
    assert [p for p, _ in found] == sorted(set(values.tolist()))
    for partition, rows in found:
        expected = data.filter(pa.array(values == partition)).drop_columns(["partition"])
        assert rows.equals(expected)
    single = pa.table({"v": [1, 2], "partition": [3, 3]})
    assert [(p, r.column("v").to_pylist()) for p, r in staged_refs.partition_groups(single)] \
        == [(3, [1, 2])]  # fmt: skip
