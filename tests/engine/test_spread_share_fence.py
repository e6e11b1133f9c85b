"""Round 24 (H8): a spread publish whose share raised past its frame fences that partition.

A statement spread over a topic's partitions (``engine.spread_append``) publishes its
shares together (``storage.spread_publish``), past its commit point. If an unexpected
exception (a ``MemoryError`` under the process memory cap, here ``nomem`` at
``partition.after_write``) comes after the k-th share's frame is written but before it
is published, the frame lies past the partition's published end, its producer state not
recorded, and the transaction is kept for ``Committer._finish_unfinished``. The next
write there retries the share first: ``published_prefix`` does not see the unpublished
frame, so without the fence the share is written a second time and that write's publish
makes both frames visible (each message of the share twice). With the fence
(``PartitionLog.fence_if_unpublished`` around ``write_share_locked``) the frame is cut,
writes there are refused until reopen, and the reopen's recovery publishes the share once.
Every spread share's position is tried, the first and the last included; no thread, no
timing. The staging path's publish: the ledger off whatever the lane (a statement that goes
to the ledger publishes no shares; a fenced partition's ledger rows:
tests/storage/test_ledger_fenced_reads.py).
"""

from __future__ import annotations

import contextlib
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from engine.database import Database
from storage import failpoints
from storage.errors import TopicbaseError
from storage.partition_log import PartitionLog

PARTITIONS = 6
ROWS = 60  # 10 a partition: every partition gets a share
# The committer publishes a transaction's first share alone (``_publish_in_turn``), then
# the other partitions' shares together: those are the spread publish's.
SPREAD = PARTITIONS - 1


def _spread(session, statement: int) -> None:
    session.execute(
        "INSERT INTO TOPIC c (data, producer_id) "
        f"SELECT 'c:{statement}:' || i, 'p' || i FROM range({ROWS}) t(i)"
    )


def _messages(database: Database) -> Counter[str]:
    """How many times each message of topic c is there (read from every partition)."""
    entry = database.catalog.entry("c")
    assert entry is not None
    topic = database.topic_log(entry.topic_id)
    found: Counter[str] = Counter()
    for partition_id in topic.partition_ids():
        log = topic.partition(partition_id)
        offset = log.start_offset
        while offset < log.end_offset:
            result = log.read(offset, max_messages=10_000)
            for batch in result.batches:
                found.update(bytes(v).decode() for v in batch.column("data").to_pylist())
            offset = result.next_offset
    return found


@pytest.mark.parametrize("share", range(SPREAD))
def test_a_share_cut_after_its_frame_is_published_once(
        tmp_path: Path, share: int, monkeypatch: pytest.MonkeyPatch,
        ledger_off: None) -> None:  # fmt: skip
    shares: list[tuple[int, str]] = []  # (partition, outcome) of each spread share written
    write_share = PartitionLog.write_share_locked

    def recorded(self: PartitionLog, *args: Any) -> int:
        try:
            base = write_share(self, *args)
        except BaseException as error:
            shares.append((self.partition_id, type(error).__name__))
            raise
        shares.append((self.partition_id, "published"))
        return base

    monkeypatch.setattr(PartitionLog, "write_share_locked", recorded)
    data = str(tmp_path / "data")
    database = Database.open(data, retention_interval_s=None)
    try:
        session = database.connect()
        session.execute(f"CREATE TOPIC c WITH (min_active_partitions = {PARTITIONS})")
        _spread(session, 0)
        assert [outcome for _, outcome in shares] == ["published"] * SPREAD
        shares.clear()
        # the first share's write is the first pass, the spread shares' the next ones
        failpoints.activate(f"partition.after_write=nomem@{share + 2}")
        with pytest.raises(Exception) as caught:
            _spread(session, 1)  # committed; its share ``share`` written, not published
        failpoints.deactivate()
        assert "partition.after_write" in str(caught.value) or isinstance(
            caught.value.__cause__, MemoryError
        ), caught.value
        # the k-th share of the spread publish is the one cut, the ones before published
        assert [o for _, o in shares] == ["published"] * share + ["MemoryError"], shares
        # Another write to every partition, that one included: its commit first retries
        # the cut share (``_finish_unfinished``); refused there while it is fenced.
        with contextlib.suppress(TopicbaseError):
            _spread(session, 2)
        session.close()
    finally:
        failpoints.deactivate()
        with contextlib.suppress(TopicbaseError):
            database.close()
    reopened = Database.open(data, retention_interval_s=None)
    try:
        found = _messages(reopened)
        twice = sorted(m for m, n in found.items() if n > 1)
        assert not twice, f"share {share}: {len(twice)} messages twice, e.g. {twice[:3]}"
        for statement in (0, 1):  # the committed statements, each message once
            assert all(found[f"c:{statement}:{i}"] == 1 for i in range(ROWS)), statement
        session = reopened.connect()
        _spread(session, 3)  # writes again after the reopen
        assert all(_messages(reopened)[f"c:3:{i}"] == 1 for i in range(ROWS))
        session.close()
    finally:
        reopened.close()
