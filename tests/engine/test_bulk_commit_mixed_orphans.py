"""A topic whose writes in one bulk commit mix a write that must be decoded (a frames
file after an Arrow file: the order of its files is kept by copying it) with writes
that could go by reference: the topic's shares are copied whole, so none of its writes
is moved to the commit directory; before review12, the by-reference write was moved,
its share copied all the same (a share mixing rows by reference with copied rows
cannot be derived from its record), and its commit directory stayed, charged to the
bulk staging cap, until the next start."""

from __future__ import annotations

import os

from engine import bulk_write
from engine.database import Database
from tests.engine.bulk_helpers import commit_writes
from tests.engine.test_bulk_commit_mixed import _expected, _open, _partitions, _rows, _stage


def test_a_decoded_write_beside_arrow_writes_leaves_no_commit_directory(tmp_path) -> None:
    database = _open(tmp_path)
    try:
        _stage(database, "a", [_rows(0, 10, extra=True)], [_rows(10, 200)])  # Arrow, frames
        _stage(database, "b", [_rows(210, 10, extra=True)])  # Arrow, every row partitioned
        assert commit_writes(database, 1, ["a", "b"]) == {"status": "committed", "rows": 220}
        assert _partitions(database) == _expected((0, 220))
        database.committer.checkpoint()
        bulk = bulk_write.for_database(database)
        assert os.listdir(bulk.root) == [] and os.listdir(bulk.commits_root) == []
        assert bulk.staged_bytes == 0
        assert commit_writes(database, 1, ["a", "b"]) == {"status": "duplicate", "rows": 0}
    finally:
        database.close()
    database = Database.open(str(tmp_path / "data"), retention_interval_s=None)
    try:
        assert _partitions(database) == _expected((0, 220))
    finally:
        database.close()
