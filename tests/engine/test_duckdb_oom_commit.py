"""Round 24 (H1): DuckDB's own out-of-memory error at a table transaction's COMMIT (DuckDB
under ``topicbase serve``'s process memory cap) is 53200, and nothing of the transaction
commits: its staged topic writes are not published, its consumer offsets do not move,
its table rows are not there; the session and others commit again, and the reopened store
passes ``txn_worker.check_moved`` and ``topicbase check``. A passing regression test: the
engine already rolled such a COMMIT back (``Session._commit_held``: ``leave``, ``abandon``,
``_rollback``); the injection stands for DuckDB refusing the COMMIT's memory."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import duckdb
import pytest

from engine import tables
from engine.check import check_database
from engine.database import Database
from storage.errors import OutOfMemoryError

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import txn_worker as tw  # noqa: E402

BOTH = (tw.MOVE, tw.MOVE_TO_TABLE)  # staged topic writes and table rows, one commit


def test_duckdb_out_of_memory_at_commit_commits_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    refuse = threading.local()
    execute = tables._execute

    def out_of_memory_at_commit(cursor, sql, parameters=None):
        if sql == "COMMIT" and getattr(refuse, "on", False):
            refuse.on = False
            raise duckdb.OutOfMemoryException("could not allocate block (injected)")
        return execute(cursor, sql, parameters)

    monkeypatch.setattr(tables, "_execute", out_of_memory_at_commit)
    data = str(tmp_path / "data")
    database = Database.open(data, retention_interval_s=None)
    try:
        session, other = database.connect(), database.connect()
        tw.create(session)
        tw.produce(session, 1, 40)
        before = tw.committed_offsets(session, "mover")
        session.execute("BEGIN")
        for sql in BOTH:
            session.execute(sql.format(k=15))
        refuse.on = True
        with pytest.raises(OutOfMemoryError) as caught:
            session.execute("COMMIT")
        assert caught.value.sqlstate == "53200"
        assert tw.committed_offsets(other, "mover") == before
        assert tw.topic_rows(other, "b") == []
        assert other.execute("SELECT count(*) AS n FROM moved")[-1].table.to_pylist() == [
            {"n": 0}]
        for committing in (session, other):  # both commit again
            committing.execute("BEGIN")
            for sql in BOTH:
                committing.execute(sql.format(k=10))
            committing.execute("COMMIT")
        tw.check_moved(other, table=True)
        session.close()
        other.close()
    finally:
        database.close()
    reopened = Database.open(data, retention_interval_s=None)
    try:
        session = reopened.connect()
        found = tw.check_moved(session, table=True)
        assert found.consumed == 40  # two transactions of 10 + 10 messages
        session.close()
    finally:
        reopened.close()
    report = check_database(data)
    assert report.ok, report.lines()


def test_an_error_after_duckdb_committed_is_a_commit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """R1 F2: the COMMIT ran in DuckDB, then a MemoryError came back instead of its answer.
    The transaction is committed (its record row is there): it must be finished (offsets
    moved in the mirror, published), not abandoned and rolled back. On main the mirror kept
    the old offset and the range was counted a second time."""
    failing = threading.local()
    execute = tables._execute

    def error_after_commit(cursor, sql, parameters=None):
        done = execute(cursor, sql, parameters)
        if sql == "COMMIT" and getattr(failing, "on", False):
            failing.on = False
            raise MemoryError("the COMMIT's answer could not be allocated (injected)")
        return done

    monkeypatch.setattr(tables, "_execute", error_after_commit)
    data = str(tmp_path / "data")
    database = Database.open(data, retention_interval_s=None)
    try:
        session = database.connect()
        tw.create(session)
        tw.produce(session, 1, 20)
        session.execute("BEGIN")
        session.execute(tw.COUNT.format(k=7))
        failing.on = True
        with pytest.raises(MemoryError):
            session.execute("COMMIT")
        for _ in range(2):  # the session counts on from where the committed one ended
            session.execute("BEGIN")
            session.execute(tw.COUNT.format(k=7))
            session.execute("COMMIT")
        assert tw.check_counted(session) == 21
        session.close()
    finally:
        database.close()
    reopened = Database.open(data, retention_interval_s=None)
    try:
        session = reopened.connect()
        assert tw.check_counted(session) == 21
        session.close()
    finally:
        reopened.close()
