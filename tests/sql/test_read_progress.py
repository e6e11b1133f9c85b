"""The console's progress line tells how many topic messages and bytes a statement has read."""

from __future__ import annotations

from pathlib import Path

from engine.database import Database
from sql.console import progress_text


def test_session_counts_what_a_statement_reads(tmp_path: Path) -> None:
    database = Database.open(str(tmp_path / "data"))
    session = database.connect()
    try:
        session.execute("CREATE TOPIC t WITH (min_active_partitions = 2)")
        session.execute("INSERT INTO TOPIC t (data) SELECT repeat('x', 100) FROM range(5000)")
        assert session.read_progress.messages == 0  # a write reads nothing
        session.execute("SELECT count(*) FROM TOPIC t")
        assert session.read_progress.messages == 5000
        assert session.read_progress.bytes >= 5000 * 100
        session.execute("SELECT 1")
        assert session.read_progress.messages == 0  # each statement counts afresh
    finally:
        session.close()
        database.close()


def test_progress_text() -> None:
    class Counts:
        messages = 0
        bytes = 0

    counts = Counts()
    assert progress_text(counts) == "running... (Ctrl-C cancels)"
    counts.messages, counts.bytes = 120_000, 118_000_000
    assert progress_text(counts) == "running... 120,000 messages, 118.0 MB read (Ctrl-C cancels)"
