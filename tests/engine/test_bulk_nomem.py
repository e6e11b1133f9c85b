"""Round 24 (H8): a ``MemoryError`` in a bulk commit (``engine.bulk_write``, by reference:
``engine.staged_refs``), the process going on.

``bulk_commit_child.stage`` stages 2,000 messages over four write ids and one table row;
the commit as ``(sink, 1)`` meets ``nomem`` (an allocation refused under the process memory
cap) at ``bulk.mid_move`` / ``bulk.before_commit`` (before its commit point: an error, the
writes staged again), ``commit.mid_publish`` (its record committed, the publish cut: the
answer is ``committed``, as for an error of ours there; the committer finishes the
publish) or ``sink.after_commit`` (committed and published, the answer not sent: an
error). Then, in the same process, the client's retry with the same ids answers
``committed`` (nothing was committed) or ``duplicate`` (the record is there), a
checkpoint runs, and every message is in its partition once, the table row once, nothing
left staged — and so again after a close and reopen. In both stage formats: frames
(copied) and Arrow files with a codec column (committed by reference). Before round 24
(H8) the ``commit.mid_publish`` case answered the ``MemoryError`` for a committed batch.
codec column (committed by reference)."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine import bulk_write
from engine.database import Database
from storage import failpoints

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import bulk_commit_child as child  # noqa: E402
from test_bulk_commit_crash import _published, _totals  # noqa: E402


@pytest.fixture(params=["frames", "arrows"])
def stage_format(request: pytest.FixtureRequest) -> Iterator[str]:
    before = os.environ.get("BULK_STAGE_FORMAT")
    os.environ["BULK_STAGE_FORMAT"] = request.param
    yield request.param
    if before is None:
        del os.environ["BULK_STAGE_FORMAT"]
    else:
        os.environ["BULK_STAGE_FORMAT"] = before


def _commit(database: Database) -> dict:
    session = database.connect()
    try:
        return bulk_write.for_database(database).commit(
            session, child.SINK, child.BATCH, child.write_ids()
        )
    finally:
        session.close()


def _check(database: Database) -> None:
    bulk = bulk_write.for_database(database)
    assert _published(database) == child.expected()  # each once (``_published`` asserts)
    assert _totals(database) == [{"k": "a", "n": 1}]
    assert os.listdir(bulk.root) == [] and os.listdir(bulk.commits_root) == []


@pytest.mark.parametrize(("point", "first", "retry"), [
    ("bulk.mid_move", "error", "committed"), ("bulk.before_commit", "error", "committed"),
    ("commit.mid_publish", "committed", "duplicate"), ("sink.after_commit", "error", "duplicate"),
])  # fmt: skip
def test_a_memory_error_in_a_bulk_commit_is_whole_or_nothing_and_a_retry_tells(
        tmp_path: Path, point: str, first: str, retry: str, stage_format: str) -> None:  # fmt: skip
    data = str(tmp_path / "data")
    database = Database.open(data, retention_interval_s=None)
    try:
        child.stage(database)
        failpoints.activate(f"{point}=nomem")
        if first == "error":
            with pytest.raises(MemoryError, match=point):
                _commit(database)
        else:
            assert _commit(database) == {"status": "committed", "rows": child.ROWS + 1}
        failpoints.deactivate()
        outcome = _commit(database)  # the client's retry, same ids
        assert outcome["status"] == retry, outcome
        database.committer.checkpoint()
        _check(database)
    finally:
        failpoints.deactivate()
        with contextlib.suppress(Exception):
            database.close()
    reopened = Database.open(data, retention_interval_s=None)
    try:
        _check(reopened)
    finally:
        reopened.close()
