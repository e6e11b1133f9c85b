"""The move benchmark's count of DuckDB commits on the commit path (issue 14).

A DuckDB COMMIT without changes writes no WAL and makes no fdatasync, so the
COMMIT ending a topic-only transaction's read-only DuckDB transaction (one that read
a table; one that did not has none) is not a sync of the commit path; a COMMIT
with table changes is (one WAL fdatasync).
"""

from __future__ import annotations

from pathlib import Path

from bench.transactions_bench import DuckDBCommitCounter
from engine.database import Database


def test_read_only_commits_are_counted_apart_from_writing_ones(tmp_path: Path) -> None:
    database = Database.open(str(tmp_path / "data"))
    try:
        session = database.connect()
        session.execute("CREATE TOPIC a (CONSUMER c); CREATE TOPIC b; CREATE TABLE n (k INT)")
        session.execute("INSERT INTO TOPIC a (data) VALUES ('x'), ('y')")
        with DuckDBCommitCounter() as counter:
            session.execute("BEGIN")
            session.execute("INSERT INTO TOPIC b (data) SELECT data FROM TOPIC a "
                            "WITH (consumer = 'c', max_messages = 1)")  # fmt: skip
            session.execute("COMMIT")  # topic-only: committed in our log, no DuckDB at all
            topic_only = (counter.count, counter.read_only)
            session.execute("BEGIN")
            session.execute("SELECT count(*) FROM n")  # opens a read-only DuckDB transaction
            session.execute("INSERT INTO TOPIC b (data) SELECT data FROM TOPIC a "
                            "WITH (consumer = 'c', max_messages = 1)")  # fmt: skip
            session.execute("COMMIT")  # in our log; the read-only DuckDB one ends after
            reading = (counter.count, counter.read_only)
            session.execute("BEGIN")
            session.execute("INSERT INTO TOPIC b (data) SELECT data FROM TOPIC a "
                            "WITH (consumer = 'c', max_messages = 1)")  # fmt: skip
            session.execute("INSERT INTO n VALUES (1)")
            session.execute("COMMIT")  # touches a table: DuckDB commits it
            both = (counter.count, counter.read_only)
        assert topic_only == (0, 0)
        assert reading == (0, 1)
        assert both == (1, 1)
        session.close()
    finally:
        database.close()
