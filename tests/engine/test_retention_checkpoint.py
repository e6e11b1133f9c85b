"""Retention never deletes frames of a transaction whose commit record is not checkpointed.

Recovery counts a transaction's rows still in a partition and takes them as the
share's leading rows; had retention deleted the segment holding the first frames
(or the whole share), a crash before the checkpoint would make recovery publish
rows again. Each case: one transaction of 350 messages cut into frames of 100, each
frame in its own segment; a retention pass that may delete some of them; a crash
(a copy of the data directory taken while the database is open, as a SIGKILL leaves
it); the copy opened: its partition holds exactly what the original held.
"""

from __future__ import annotations

import dataclasses
import shutil

import pytest

from engine.clock import ManualClock
from engine.database import Database
from storage import limits
from tests.engine.conftest import rows

START_US = 1_700_000_000_000_000
MESSAGES = 350
MESSAGE_BYTES = 4096  # 350 of them: ~1.4 MB, over a 1 MB storage budget


def _data(session) -> list[str]:
    return [
        r["d"][-4:]  # the message number
        for r in rows(
            session,
            "SELECT CAST(data AS VARCHAR) AS d FROM TOPIC t WITH (partition = 0, from_offset = 0)",
        )
    ]


@pytest.mark.parametrize(
    ("settings", "advance_s"),
    [
        ("retention_storage_mb = 1", 0),  # size: the oldest segment goes, the rest stay
        ("retention_period = Interval('PT1H')", 2 * 3600),  # time: the whole share expires
    ],
    ids=["size", "time"],
)
def test_a_retention_pass_then_a_crash_before_the_checkpoint_publishes_nothing_again(
    tmp_path, monkeypatch, settings: str, advance_s: int
) -> None:
    monkeypatch.setattr(limits, "FRAME_TARGET_MESSAGES", 100)
    clock = ManualClock(START_US)
    data = tmp_path / "data"
    database = Database.open(str(data), clock=clock, retention_interval_s=None)
    try:
        session = database.connect()
        session.execute(f"CREATE TOPIC t WITH ({settings})")
        entry = database.catalog.entry("t")
        partition = database.topic_log(entry.topic_id).partition(0)
        # every frame (100 messages, ~400 KB) rolls a segment
        partition.config = dataclasses.replace(
            partition.config, segment_bytes=limits.SEGMENT_BYTES_MIN
        )
        session.execute("BEGIN")  # a transaction: published after its commit record
        session.execute(
            f"INSERT INTO TOPIC t (data) SELECT repeat('x', {MESSAGE_BYTES - 4}) || "
            f"lpad(CAST(i AS VARCHAR), 4, '0') FROM range({MESSAGES}) r(i)"
        )
        session.execute("COMMIT")
        assert len(partition.segments) == 4 and database.committer.backlog == 1
        clock.advance(seconds=advance_s)
        database.run_retention()
        assert partition.start_offset > 0  # retention did delete frames of the share
        before = _data(session)
        shutil.copytree(data, tmp_path / "crashed")  # the crash: no close, no checkpoint
        session.close()
    finally:
        database.close()
    reopened = Database.open(str(tmp_path / "crashed"), clock=clock, retention_interval_s=None)
    try:
        session = reopened.connect()
        after = _data(session)
        session.close()
    finally:
        reopened.close()
    assert len(after) == len(set(after)), "recovery published rows that were there"
    assert after == before
