"""Counter upserts kept as deltas (``engine.deltas``): same results as the DuckDB way.

What must hold: a blind counter upsert in a transaction that has not touched DuckDB is
kept as a delta and commits in the log (no DuckDB statement on its path); the totals equal
what the statements give when run the DuckDB way, for mixes of keys, amounts, sessions and
rollbacks; a read after the commit sees the delta (even while the applier lags); the
transaction's own deltas run before a later statement of it that touches DuckDB; a
rollback discards them; a delta that could overflow is not kept (the statement runs and
fails as before); DDL and any DuckDB-way writer drain the applier first, and a delta kept
before such a writer began runs the DuckDB way at COMMIT; two sessions adding to one key
no longer conflict. Crash tests: ``test_counter_deltas_crash.py``.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from engine import deltas
from engine.database import Database
from storage.errors import SerializationFailure, TopicbaseError
from tests.engine.conftest import rows

UPSERT = "INSERT INTO counters VALUES (?, ?) ON CONFLICT (k) DO UPDATE SET n = n + EXCLUDED.n"
UPSERT2 = ("INSERT INTO pairs VALUES (?, ?, ?) ON CONFLICT (k) DO UPDATE "
           "SET a = a + EXCLUDED.a, b = EXCLUDED.b + b")  # fmt: skip
TABLES = ("CREATE TABLE counters (k VARCHAR PRIMARY KEY, n BIGINT NOT NULL); "
          "CREATE TABLE pairs (k INTEGER PRIMARY KEY, a INTEGER NOT NULL, b SMALLINT)")  # fmt: skip


def _in_threads(run: Callable[[int], None], count: int) -> None:
    """``run(0)`` .. ``run(count - 1)`` at once on threads of their own, all joined."""
    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


@pytest.fixture
def db(tmp_path: Path):
    database = Database.open(str(tmp_path / "data"))
    database.connect().execute(TABLES)
    yield database
    database.close()


def _counters(session, table: str = "counters") -> dict:
    return {r["k"]: {k: v for k, v in r.items() if k != "k"}
            for r in rows(session, f"SELECT * FROM {table} ORDER BY k")}  # fmt: skip


@pytest.fixture
def slow_applier(monkeypatch):
    """Every applier group waits 0.2 s before it starts: reads must wait for it."""
    original = deltas.DeltaApplier._apply

    def slow(self, *args, **kwargs):
        time.sleep(0.2)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(deltas.DeltaApplier, "_apply", slow)


def _workload(database: Database, seed: int) -> None:
    """4 sessions, 40 transactions each: 1-3 upserts over few keys (negative amounts too),
    a rollback now and then, a read inside the transaction now and then."""

    def run(index: int) -> None:
        rng = random.Random(seed * 100 + index)
        session = database.connect()
        for _ in range(40):
            try:
                session.execute("BEGIN")
                for _ in range(rng.randint(1, 3)):
                    if rng.random() < 0.5:
                        session.execute(UPSERT, [f"k{rng.randrange(4)}", rng.randint(-50, 100)])
                    else:
                        session.execute(UPSERT2, [rng.randrange(3), rng.randint(-9, 9),
                                                  rng.randint(-3, 3)])  # fmt: skip
                if rng.random() < 0.15:
                    session.execute("SELECT count(*) FROM counters")
                session.execute("ROLLBACK" if rng.random() < 0.2 else "COMMIT")
            except SerializationFailure:
                session.execute("ROLLBACK")
        session.close()

    _in_threads(run, 4)


def test_results_equal_the_duckdb_way_for_mixes_of_keys_amounts_and_sessions(
    tmp_path: Path, monkeypatch
) -> None:
    """The same seeded workload, serial per session, gives the same tables with deltas on
    and off; with them on most transactions committed in the log."""
    found = []
    for on in (True, False):
        monkeypatch.setenv("TOPICBASE_COUNTER_DELTAS", "1" if on else "0")
        database = Database.open(str(tmp_path / f"data-{on}"))
        session = database.connect()
        session.execute(TABLES)
        # one session at a time, so that the DuckDB way's conflicts do not differ
        for seed in range(3):
            _workload_serial(database, seed)
        found.append((_counters(session), _counters(session, "pairs")))
        if on:
            assert database.committer.log_commits > 50
            assert database.committer.deltas.stats.records > 50
        else:
            assert database.committer.log_commits == 0
        session.close()
        database.close()
    assert found[0] == found[1]


def _workload_serial(database: Database, seed: int) -> None:
    rng = random.Random(seed)
    session = database.connect()
    for _ in range(60):
        session.execute("BEGIN")
        for _ in range(rng.randint(1, 3)):
            if rng.random() < 0.5:
                session.execute(UPSERT, [f"k{rng.randrange(4)}", rng.randint(-50, 100)])
            else:
                session.execute(UPSERT2, [rng.randrange(3), rng.randint(-9, 9), rng.randint(-3, 3)])
        if rng.random() < 0.15:
            session.execute("SELECT count(*) FROM counters")
        session.execute("ROLLBACK" if rng.random() < 0.2 else "COMMIT")
    session.close()


def test_concurrent_sessions_add_up_exactly(db: Database) -> None:
    """4 sessions at once: the totals equal the sum of what committed (counted apart)."""
    committed: dict = {}
    lock = threading.Lock()

    def run(index: int) -> None:
        rng = random.Random(index)
        session = db.connect()
        for _ in range(50):
            key, amount = f"k{rng.randrange(3)}", rng.randint(-20, 50)
            session.execute("BEGIN")
            session.execute(UPSERT, [key, amount])
            if rng.random() < 0.2:
                session.execute("ROLLBACK")
                continue
            session.execute("COMMIT")
            with lock:
                committed[key] = committed.get(key, 0) + amount
        session.close()

    _in_threads(run, 4)
    session = db.connect()
    assert {k: v["n"] for k, v in _counters(session).items()} == committed
    assert db.committer.table_commits == 0  # every one committed in the log
    assert set(db.committer.deltas._reserved.values()) == {0}


def test_a_read_after_commit_sees_the_delta_while_the_applier_lags(db, slow_applier) -> None:
    writer, reader = db.connect(), db.connect()
    total = 0
    for amount in (5, 7):
        total += amount
        writer.execute("BEGIN")
        writer.execute(UPSERT, ["a", amount])
        writer.execute("COMMIT")
        assert db.committer.deltas.pending >= 1  # not applied yet: the read must wait
        assert rows(reader, "SELECT n FROM counters WHERE k = 'a'") == [{"n": total}]
    reader.execute("BEGIN")  # an explicit transaction waits when its snapshot starts
    writer.execute("BEGIN")
    writer.execute(UPSERT, ["a", 1])
    writer.execute("COMMIT")
    assert rows(reader, "SELECT n FROM counters") == [{"n": 13}]
    reader.execute("COMMIT")


def test_own_deltas_run_before_a_later_statement_that_touches_duckdb(db) -> None:
    session, other = db.connect(), db.connect()
    session.execute("BEGIN")
    session.execute(UPSERT, ["a", 5])
    session.execute(UPSERT, ["a", 2])
    assert db.committer.table_commits == 0
    assert rows(session, "SELECT n FROM counters") == [{"n": 7}]  # its own deltas, run first
    assert rows(other, "SELECT count(*) AS c FROM counters") == [{"c": 0}]  # not committed
    session.execute("COMMIT")  # the DuckDB way now
    assert db.committer.log_commits == 0 and db.committer.deltas.stats.records == 0
    assert rows(other, "SELECT n FROM counters") == [{"n": 7}]


def test_rollback_discards_the_deltas(db) -> None:
    session = db.connect()
    session.execute("BEGIN")
    session.execute(UPSERT, ["a", 5])
    session.execute("ROLLBACK")
    session.execute("BEGIN")
    session.execute(UPSERT, ["b", 1])
    session.close()  # an open transaction rolled back by close
    other = db.connect()
    assert rows(other, "SELECT count(*) AS c FROM counters") == [{"c": 0}]
    assert db.committer.log_commits == 0
    assert set(db.committer.deltas._reserved.values()) == {0}


@pytest.mark.parametrize(("table", "start", "limit"), [
    ("counters", 2**63 - 10, 2**63 - 1), ("ints", 2**31 - 10, 2**31 - 1)])
def test_a_delta_that_could_overflow_runs_the_duckdb_way_and_fails_at_its_statement(
    db, table: str, start: int, limit: int
) -> None:
    session = db.connect()
    if table == "counters":
        session.execute("INSERT INTO counters VALUES ('a', ?)", [start])
        upsert, values = UPSERT, lambda amount: ["a", amount]
    else:
        session.execute("CREATE TABLE ints (k INTEGER PRIMARY KEY, a INTEGER NOT NULL)")
        session.execute("INSERT INTO ints VALUES (1, ?)", [start])
        upsert = "INSERT INTO ints VALUES (?, ?) ON CONFLICT (k) DO UPDATE SET a = a + EXCLUDED.a"
        values = lambda amount: [1, amount]  # noqa: E731
    session.execute("BEGIN")
    session.execute(upsert, values(5))  # |value| <= start + 5 <= limit: kept
    session.execute("COMMIT")
    assert db.committer.log_commits == 1
    session.execute("BEGIN")
    with pytest.raises(TopicbaseError, match=r"(?i)out of range|overflow"):
        session.execute(upsert, values(5))  # start + 10 > limit: the statement's own error
    session.execute("ROLLBACK")
    column = "n" if table == "counters" else "a"
    assert rows(session, f"SELECT {column} AS v FROM {table}") == [{"v": start + 5}]
    assert db.committer.deltas.stats.retries == 0
    assert start + 5 <= limit


def test_ddl_drains_the_applier_first(db, slow_applier) -> None:
    session, other = db.connect(), db.connect()
    for amount in (1, 2, 3):
        session.execute("BEGIN")
        session.execute(UPSERT, ["a", amount])
        session.execute("COMMIT")
    assert db.committer.deltas.pending >= 1
    other.execute("ALTER TABLE counters RENAME TO renamed")
    assert db.committer.deltas.pending == 0
    assert rows(other, "SELECT n FROM renamed") == [{"n": 6}]
    assert db.committer.deltas.stats.retries == 0


def test_a_delta_kept_before_another_writer_began_runs_the_duckdb_way_at_commit(db) -> None:
    """The writer sets the counter to its maximum after the delta was kept: the delta may
    no longer be applied blindly (it would overflow in the applier), so its COMMIT runs it
    the DuckDB way and fails there; nothing is lost or left to fail later."""
    adder, setter = db.connect(), db.connect()
    setter.execute("INSERT INTO counters VALUES ('a', 0)")
    adder.execute("BEGIN")
    adder.execute(UPSERT, ["a", 5])  # kept
    setter.execute("UPDATE counters SET n = ? WHERE k = 'a'", [2**63 - 1])
    with pytest.raises(TopicbaseError, match=r"(?i)out of range|overflow"):
        adder.execute("COMMIT")
    assert rows(setter, "SELECT n FROM counters") == [{"n": 2**63 - 1}]
    assert db.committer.deltas.stats.retries == 0 and db.committer.log_commits == 0


def test_two_sessions_adding_to_one_key_do_not_conflict(db) -> None:
    """The DuckDB way: the second UPDATE of an uncommitted row is a write-write conflict;
    as deltas both commit (blind increments commute)."""
    first, second = db.connect(), db.connect()
    first.execute("INSERT INTO counters VALUES ('a', 0)")
    first.execute("BEGIN")
    first.execute(UPSERT, ["a", 1])
    second.execute("BEGIN")
    second.execute(UPSERT, ["a", 2])
    second.execute("COMMIT")
    first.execute("COMMIT")
    assert rows(first, "SELECT n FROM counters") == [{"n": 3}]


def test_deltas_survive_a_reopen_before_they_were_applied(tmp_path: Path, monkeypatch) -> None:
    """Committed deltas the applier never applied (it fails here) are applied by recovery."""
    path = str(tmp_path / "data")
    database = Database.open(path)
    session = database.connect()
    session.execute(TABLES)

    def failing(self, *args, **kwargs):
        raise OSError("the applier cannot write")

    with monkeypatch.context() as patch:
        patch.setattr(deltas.DeltaApplier, "_add", staticmethod(failing))
        session.execute("BEGIN")
        for amount in (4, 6):  # one record: a failing applier keeps no further delta
            session.execute(UPSERT, ["a", amount])
        session.execute("COMMIT")
        assert database.committer.deltas.pending == 1
        with pytest.raises(TopicbaseError):
            database.committer.checkpoint()  # may not pass records whose deltas wait
        session.close()
        database.close()  # the applier gives up at close: the position did not move
    database = Database.open(path)
    assert rows(database.connect(), "SELECT n FROM counters") == [{"n": 10}]
    database.close()


def test_statements_that_are_not_blind_counter_upserts_run_the_duckdb_way(db) -> None:
    session = db.connect()
    session.execute("CREATE TABLE floats (k VARCHAR PRIMARY KEY, n DOUBLE)")
    cases = [
        ("INSERT INTO counters VALUES (?, ?) ON CONFLICT (k) DO UPDATE SET n = n + 2 * EXCLUDED.n",
         ["a", 1]),
        ("INSERT INTO counters VALUES (?, ?) ON CONFLICT (k) DO UPDATE SET n = EXCLUDED.n",
         ["a", 1]),
        ("INSERT INTO counters VALUES ('a', ?) ON CONFLICT (k) DO UPDATE SET n = n + EXCLUDED.n",
         [1]),
        (UPSERT, ["a", "1"]),  # text to cast
        (UPSERT, ["a", True]),
        ("INSERT INTO floats VALUES (?, ?) ON CONFLICT (k) DO UPDATE SET n = n + EXCLUDED.n",
         ["a", 1.5]),
    ]
    for sql, parameters in cases:
        session.execute("BEGIN")
        session.execute(sql, parameters)
        session.execute("COMMIT")
    assert db.committer.log_commits == 0 and db.committer.deltas.stats.records == 0
    assert rows(session, "SELECT n FROM counters") == [{"n": 4}]
