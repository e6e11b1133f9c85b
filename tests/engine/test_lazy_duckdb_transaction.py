"""BEGIN opens no DuckDB transaction; the first statement that needs DuckDB does.

What must hold (``engine.session``: ``Session.cursor``, ``_open_duckdb_transaction``):

- a transaction whose statements never need DuckDB (topic moves, offset commands)
  runs no DuckDB statement at all, BEGIN, COMMIT and ROLLBACK included, and leaves the
  session's connection outside any DuckDB transaction;
- table reads see one snapshot, taken at the transaction's first table statement
  (a PostgreSQL REPEATABLE READ snapshot also starts at the first statement after
  BEGIN), also when topic statements ran before it;
- a table write after topic statements commits with them atomically through DuckDB
  (a record row), and a rollback undoes both; recovery after a crash finds both;
- privileges: a non-superuser's topic-only transaction reads owners and grants once
  (then the cache answers and no DuckDB statement runs), and a REVOKE committed after
  BEGIN counts for the statements after it;
- the counter-upsert shortcut takes the schema of the snapshot its transaction
  actually has: a table re-created between BEGIN and the upsert is seen as it now is.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from engine import commit, tables
from engine.catalog import SCHEMA
from engine.database import Database
from engine.identity import Identity
from engine.session import parse_statements
from storage.errors import InsufficientPrivilegeError, SerializationFailure, TopicbaseError

ALICE = Identity("alice", superuser=False)
MOVE = (
    "INSERT INTO TOPIC b (data) SELECT data FROM TOPIC a WITH (consumer = 'c', max_messages = {k})"
)
UPSERT = "INSERT INTO counters VALUES (?, ?) ON CONFLICT (k) DO UPDATE SET n = n + EXCLUDED.n"


@pytest.fixture
def database(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(commit, "CHECKPOINT_TRANSACTIONS", 10**9)  # records stay: counted
    database = _setup(tmp_path / "data")
    yield database
    database.close()


def _setup(path: Path) -> Database:
    database = Database.open(str(path))
    session = database.connect()
    session.execute(
        "CREATE TOPIC a (CONSUMER c) WITH (min_active_partitions = 2); "
        "CREATE TOPIC b WITH (min_active_partitions = 2); "
        "CREATE TABLE t (v INTEGER); "
        "CREATE TABLE counters (k VARCHAR PRIMARY KEY, n BIGINT NOT NULL)"
    )
    values = ", ".join(f"('m{i}', {i % 2})" for i in range(100))
    session.execute(f"INSERT INTO TOPIC a (data, partition) VALUES {values}")
    session.close()
    return database


def _spy(monkeypatch) -> list[str]:
    """Every SQL text sessions send to DuckDB through ``engine.tables`` from now on."""
    statements: list[str] = []
    for name in ("run", "query_arrow", "execute_count", "fetch_rows"):
        original = getattr(tables, name)

        def spy(cursor, sql, *args, _original=original, **kwargs):
            statements.append(sql)
            return _original(cursor, sql, *args, **kwargs)

        monkeypatch.setattr(tables, name, spy)
    return statements


def _count(session, sql: str) -> int:
    result = session.execute(sql)[-1]
    assert result.table is not None
    return int(result.table.column(0)[0].as_py())


def _moved(session) -> int:
    return _count(session, "SELECT count(*) FROM TOPIC b WITH (max_messages = 100000)")


def _records(database: Database) -> int:
    cursor = database.root.cursor()
    try:
        row = cursor.execute(f"SELECT count(*) FROM {SCHEMA}.transactions").fetchone()
    finally:
        cursor.close()
    assert row is not None
    return int(row[0])


def test_a_topic_only_transaction_sends_nothing_to_duckdb_commit_or_rollback(database, monkeypatch):
    session = database.connect()
    statements = _spy(monkeypatch)
    before = database.commit_counters()
    session.execute("BEGIN")
    session.execute(MOVE.format(k=4))
    session.execute("COMMIT")
    session.execute("BEGIN")
    session.execute(MOVE.format(k=3))
    session.execute("ROLLBACK")
    assert statements == []
    after = database.commit_counters()
    assert after["log_commits"] == before["log_commits"] + 1
    assert after["table_commits"] == before["table_commits"]
    assert _moved(session) == 4
    session.close()


def test_no_duckdb_transaction_is_left_open_after_a_topic_only_transaction(database):
    """The session's connection is back in autocommit: its next table write is visible
    to others at once (a DuckDB transaction left open would hide it)."""
    session, other = database.connect(), database.connect()
    session.execute("BEGIN")
    session.execute(MOVE.format(k=2))
    session.execute("COMMIT")
    session.execute("INSERT INTO t VALUES (1)")
    assert _count(other, "SELECT count(*) FROM t") == 1
    session.execute("BEGIN")
    session.execute("SELECT count(*) FROM t")  # opens a read-only DuckDB transaction
    session.execute(MOVE.format(k=2))
    session.execute("COMMIT")  # in the log; the DuckDB one ends after
    session.execute("INSERT INTO t VALUES (2)")
    assert _count(other, "SELECT count(*) FROM t") == 2
    session.close()
    other.close()


def test_the_snapshot_starts_at_the_first_table_statement_and_then_holds(database):
    reader, writer = database.connect(), database.connect()
    reader.execute("BEGIN")
    reader.execute(MOVE.format(k=2))  # a topic statement: no snapshot of the tables yet
    writer.execute("INSERT INTO t VALUES (1)")
    assert _count(reader, "SELECT count(*) FROM t") == 1  # taken here, as PostgreSQL would
    writer.execute("INSERT INTO t VALUES (2)")
    reader.execute(MOVE.format(k=2))
    assert _count(reader, "SELECT count(*) FROM t") == 1  # repeatable: the same snapshot
    reader.execute("COMMIT")
    assert _count(reader, "SELECT count(*) FROM t") == 2
    assert _moved(reader) == 4
    reader.close()
    writer.close()


def test_concurrent_updates_of_one_row_still_conflict_after_topic_statements(database):
    first, second = database.connect(), database.connect()
    first.execute("INSERT INTO counters VALUES ('x', 0)")
    first.execute("BEGIN")
    first.execute(MOVE.format(k=1))
    second.execute("BEGIN")
    second.execute("UPDATE counters SET n = n + 1 WHERE k = 'x'")
    with pytest.raises(SerializationFailure):  # its DuckDB transaction is open: it conflicts
        first.execute("UPDATE counters SET n = n + 10 WHERE k = 'x'")
    first.execute("ROLLBACK")
    second.execute("COMMIT")
    assert _count(first, "SELECT n FROM counters WHERE k = 'x'") == 1
    assert _moved(first) == 0  # the failed transaction's move is gone with it
    first.close()
    second.close()


def test_a_table_write_after_topic_statements_commits_with_them_or_not_at_all(database):
    session = database.connect()
    before = database.commit_counters()
    session.execute("BEGIN")
    session.execute(MOVE.format(k=5))
    session.execute("INSERT INTO t VALUES (7)")
    session.execute("ROLLBACK")
    assert _moved(session) == 0
    assert _count(session, "SELECT count(*) FROM t") == 0
    session.execute("BEGIN")
    session.execute(MOVE.format(k=5))
    session.execute("INSERT INTO t VALUES (7)")
    session.execute("COMMIT")
    after = database.commit_counters()
    assert after["table_commits"] == before["table_commits"] + 1
    assert after["log_commits"] == before["log_commits"]
    assert _records(database) == 1  # the record row, in the table write's transaction
    assert _moved(session) == 5
    assert _count(session, "SELECT count(*) FROM t") == 1
    session.close()


def test_recovery_finds_a_transaction_whose_duckdb_part_opened_late(tmp_path: Path, monkeypatch):
    """Committed, then a crash before any checkpoint (closed without it): the reopened
    database has the table row, the moved messages and the consumer's offsets."""
    monkeypatch.setattr(commit, "CHECKPOINT_TRANSACTIONS", 10**9)
    path = tmp_path / "data"
    database = _setup(path)
    session = database.connect()
    session.execute("BEGIN")
    session.execute(MOVE.format(k=6))
    session.execute("INSERT INTO t VALUES (1)")
    session.execute("COMMIT")
    session.execute("BEGIN")
    session.execute(MOVE.format(k=4))  # topic-only: its commit record is in the log
    session.execute("COMMIT")
    session.close()
    monkeypatch.setattr(database.committer, "checkpoint", lambda: None)
    database.close()
    reopened = Database.open(str(path))
    try:
        session = reopened.connect()
        assert _count(session, "SELECT count(*) FROM t") == 1
        assert _moved(session) == 10
        left = _count(
            session, "SELECT count(*) FROM TOPIC a WITH (consumer = 'c', max_messages = 1000)"
        )
        assert left == 90  # the 10 moved are not read again
        session.close()
    finally:
        reopened.close()


def test_a_non_superusers_topic_transaction_reads_privileges_once(database, monkeypatch):
    admin = database.connect()
    admin.execute("GRANT SELECT ON TOPIC a TO alice; GRANT INSERT ON TOPIC b TO alice")
    alice = database.connect(ALICE)
    statements = _spy(monkeypatch)
    alice.execute("BEGIN")
    alice.execute(MOVE.format(k=2))  # owners and grants read in a DuckDB transaction
    alice.execute("COMMIT")
    assert statements and statements[0] == "BEGIN TRANSACTION"
    statements.clear()
    alice.execute("BEGIN")
    alice.execute(MOVE.format(k=2))  # from the cache: nothing reaches DuckDB
    alice.execute("COMMIT")
    assert statements == []
    assert _moved(admin) == 4
    alice.close()
    admin.close()


def test_a_revoke_committed_after_begin_counts_for_later_statements(database):
    admin = database.connect()
    admin.execute("GRANT SELECT ON TOPIC a TO alice; GRANT INSERT ON TOPIC b TO alice")
    alice = database.connect(ALICE)
    alice.execute("BEGIN")
    alice.execute(MOVE.format(k=2))
    alice.execute("COMMIT")  # the grants are cached now
    alice.execute("BEGIN")
    admin.execute("REVOKE INSERT ON TOPIC b FROM alice")
    with pytest.raises(InsufficientPrivilegeError):
        alice.execute(MOVE.format(k=2))
    alice.execute("ROLLBACK")
    assert _moved(admin) == 2
    alice.close()
    admin.close()


def test_the_upsert_shortcut_sees_a_table_recreated_after_begin(database):
    """A counters table re-created without its key between BEGIN and the upsert: the
    statement is judged on the table it now finds (no conflict target: refused), not
    run as the UPDATE worked out for the old table."""
    session, other = database.connect(), database.connect()
    for n in (1, 2):  # the shortcut is worked out and used
        session.execute("BEGIN")
        session.execute(UPSERT, ["w", n])
        session.execute("COMMIT")
    assert _count(session, "SELECT n FROM counters WHERE k = 'w'") == 3
    session.execute("BEGIN")
    other.execute(
        "CREATE TABLE keyless AS SELECT * FROM counters; DROP TABLE counters; "
        "ALTER TABLE keyless RENAME TO counters"
    )
    with pytest.raises(TopicbaseError):
        session.execute(UPSERT, ["w", 10])  # ON CONFLICT (k) needs a unique k
    session.execute("ROLLBACK")
    assert _count(session, "SELECT n FROM counters WHERE k = 'w'") == 3
    session.close()
    other.close()


def test_describing_a_topic_move_opens_no_duckdb_transaction(database):
    """A front's Describe (the wire's extended protocol) of a statement that reads no
    table leaves the transaction without DuckDB; one that reads a table opens it."""
    session = database.connect()
    session.execute("BEGIN")
    (move,) = parse_statements(MOVE.format(k=2))
    assert session.describe(move).columns is None  # no RETURNING: no rows
    assert session.transaction is not None and not session.transaction.duckdb_open
    session.execute(MOVE.format(k=2))
    (query,) = parse_statements("SELECT count(*) AS n FROM t")
    assert session.describe(query).columns is not None
    assert session.transaction.duckdb_open  # its binding sees the transaction's tables
    session.execute("COMMIT")
    assert _moved(session) == 2
    session.close()


def test_an_autocommit_consumer_read_into_a_table_refused_at_commit_writes_no_row(
    database, monkeypatch
):
    """``INSERT INTO t SELECT … FROM TOPIC a WITH (consumer = 'c')`` in autocommit: its
    table rows and its offset move are one transaction. Another session commits a read of
    the same consumer while the statement runs: the statement fails 40001 and ``t`` holds
    none of its rows (before, DuckDB had committed them on its own)."""
    first, other = database.connect(), database.connect()
    other.execute("BEGIN")
    other.execute("SELECT data FROM TOPIC a WITH (consumer = 'c')")
    original, fired = tables.execute_count, []

    def commit_the_other_meanwhile(cursor, sql, *args, **kwargs):
        out = original(cursor, sql, *args, **kwargs)
        if sql.lstrip().upper().startswith("INSERT INTO T") and not fired:
            fired.append(sql)
            other.execute("COMMIT")
        return out

    monkeypatch.setattr(tables, "execute_count", commit_the_other_meanwhile)
    with pytest.raises(SerializationFailure):
        first.execute(
            "INSERT INTO t SELECT CAST(octet_length(data) AS INTEGER) FROM TOPIC a "
            "WITH (consumer = 'c')"
        )
    monkeypatch.setattr(tables, "execute_count", original)
    assert fired, "the table write did not go through execute_count: the test proves nothing"
    assert _count(first, "SELECT count(*) FROM t") == 0
    first.close()
    other.close()
