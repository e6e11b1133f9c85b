"""Counter deltas (``engine.deltas``) where the review found them unsound: each case must
do what the DuckDB way does (or refuse), never write another table, and never commit a
delta the applier cannot apply.

What must hold: a delta is kept only for the table DuckDB resolves the unqualified name
to (the current schema; never the internal schema, never a table the search path does not
reach), and a changed search path is seen; a key DuckDB would refuse (a lone surrogate) is
not kept; a DDL that lands between a statement's delta plan and its reservation makes the
statement run the DuckDB way; while the applier fails no delta is kept; a kept statement
whose table was renamed, dropped or re-created before it runs the DuckDB way at COMMIT is
refused (40001), never re-targeted; an applier attempt that committed and then failed is
not applied twice; a read waits through a failure the next attempt fixes.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

import engine.session as session_module
from engine import bulk_write, deltas
from engine.database import Database
from engine.identity import Identity
from storage import failpoints
from storage.errors import SerializationFailure, StorageIOError, TopicbaseError
from tests.engine.conftest import rows

UPSERT = "INSERT INTO c VALUES ($1, $2) ON CONFLICT (k) DO UPDATE SET n = n + EXCLUDED.n"
ALICE = Identity("alice", superuser=False)


@pytest.fixture
def db(tmp_path: Path):
    database = Database.open(str(tmp_path / "data"), retention_interval_s=None)
    yield database
    database.close()


def _kept(session, sql: str, parameters) -> bool:
    """Run ``sql`` in a transaction of its own; whether it was kept as a delta."""
    session.execute("BEGIN")
    session.execute(sql, parameters)
    kept = bool(session.transaction.deltas)
    session.execute("COMMIT")
    return kept


def _begin_kept(session, parameters) -> None:
    """Begin a transaction left open holding one ``UPSERT`` kept as a delta."""
    session.execute("BEGIN")
    session.execute(UPSERT, parameters)
    assert session.transaction.deltas


@pytest.mark.parametrize("superuser", [True, False])
def test_a_delta_never_writes_the_internal_schema(db, superuser: bool) -> None:
    """``sink_batches`` lives in ``__topicbase``: the DuckDB way cannot resolve the bare
    name, so neither may a delta (a forged row would drop a victim's sink batch)."""
    bulk_write.for_database(db)
    session = db.connect() if superuser else db.connect(ALICE)
    sql = ("INSERT INTO sink_batches VALUES ($1, $2, $3, $4) ON CONFLICT (sink_id, batch_id) "
           "DO UPDATE SET rows = rows + EXCLUDED.rows, "
           "committed_at_us = committed_at_us + EXCLUDED.committed_at_us")  # fmt: skip
    for _ in range(3):  # the second and third with the privilege cache warm
        session.execute("BEGIN")
        with pytest.raises(TopicbaseError):
            session.execute(sql, ["victim_sink", 7, 1, 1])
        session.execute("ROLLBACK")
    db.committer.deltas.wait_visible()
    internal = db.root.cursor().execute("SELECT * FROM __topicbase.sink_batches").fetchall()
    assert internal == []


def test_a_delta_follows_the_search_path_as_duckdb_does(db) -> None:
    session = db.connect()
    session.execute("CREATE SCHEMA s")
    session.execute("CREATE TABLE s.c (k INTEGER PRIMARY KEY, n BIGINT)")
    session.execute("BEGIN")
    with pytest.raises(TopicbaseError, match="does not exist"):  # not on the search path
        session.execute(UPSERT, [1, 1])
    session.execute("ROLLBACK")
    session.execute("SET search_path = 's'")
    assert _kept(session, UPSERT, [1, 2])  # now it is DuckDB's c
    session.execute("SET search_path = 'main'")
    session.execute("BEGIN")
    with pytest.raises(TopicbaseError, match="does not exist"):  # the kept plan is not reused
        session.execute(UPSERT, [1, 4])
    session.execute("ROLLBACK")
    assert rows(session, "SELECT k, n FROM s.c") == [{"k": 1, "n": 2}]


def test_a_key_duckdb_refuses_is_not_kept(tmp_path: Path) -> None:
    """A lone surrogate does not encode as UTF-8: DuckDB refuses it at the statement; kept,
    the applier could never apply it and every later read and open would fail."""
    path = str(tmp_path / "data")
    database = Database.open(path, retention_interval_s=None)
    session = database.connect()
    session.execute("CREATE TABLE c (k VARCHAR PRIMARY KEY, n BIGINT)")
    session.execute("BEGIN")
    with pytest.raises(Exception):  # noqa: B017 - whatever the DuckDB way raises
        session.execute(UPSERT, ["bad\ud800", 1])
    assert not session.transaction or not session.transaction.deltas
    session.execute("ROLLBACK")
    assert _kept(session, UPSERT, ["good", 1])
    assert rows(session, "SELECT k, n FROM c") == [{"k": "good", "n": 1}]
    session.close()
    database.close()
    database = Database.open(path, retention_interval_s=None)
    assert rows(database.connect(), "SELECT k, n FROM c") == [{"k": "good", "n": 1}]
    database.close()


def test_ddl_between_the_plan_and_the_reservation_makes_the_statement_run_the_duckdb_way(
    db, monkeypatch
) -> None:
    session, other = db.connect(), db.connect()
    session.execute("CREATE TABLE c (k INTEGER PRIMARY KEY, n BIGINT)")
    assert _kept(session, UPSERT, [1, 1])  # the plan is known at this schema generation
    original = session_module.Session._delta_plan

    def plan_then_ddl(self, operation):
        plan = original(self, operation)
        if self is session:  # another session's DDL lands right after the plan was checked
            other.execute("DROP TABLE c")
            other.execute("CREATE TABLE c (k INTEGER PRIMARY KEY, n INTEGER CHECK (n < 10))")
        return plan

    monkeypatch.setattr(session_module.Session, "_delta_plan", plan_then_ddl)
    session.execute("BEGIN")
    with pytest.raises(TopicbaseError, match=r"(?i)check"):  # as the DuckDB way fails
        session.execute(UPSERT, [1, 50])
    session.execute("ROLLBACK")
    monkeypatch.setattr(session_module.Session, "_delta_plan", original)
    assert rows(other, "SELECT * FROM c") == []
    assert db.committer.deltas.pending == 0


def test_no_delta_is_kept_while_the_applier_fails(db, monkeypatch) -> None:
    session = db.connect()
    session.execute("CREATE TABLE c (k INTEGER PRIMARY KEY, n BIGINT)")
    applier = db.committer.deltas

    def failing(*args, **kwargs):
        raise OSError("the applier cannot write")

    monkeypatch.setattr(deltas.DeltaApplier, "_add", staticmethod(failing))
    assert _kept(session, UPSERT, [1, 1])
    for _ in range(500):
        if applier.stats.retries >= 1:
            break
        time.sleep(0.01)
    assert applier.stats.retries >= 1
    session.execute("BEGIN")
    with pytest.raises(TopicbaseError):  # run the DuckDB way, it waits behind the applier
        session.execute(UPSERT, [2, 1])
    session.execute("ROLLBACK")
    assert applier.pending == 1  # nothing more was committed as a delta
    monkeypatch.undo()
    for _ in range(500):  # the applier retries with the real _add and catches up
        if applier.pending == 0:
            break
        time.sleep(0.01)
    assert rows(session, "SELECT k, n FROM c") == [{"k": 1, "n": 1}]


def test_a_read_waits_through_a_failure_the_next_attempt_fixes(db, monkeypatch) -> None:
    session = db.connect()
    session.execute("CREATE TABLE c (k INTEGER PRIMARY KEY, n BIGINT)")
    original = deltas.DeltaApplier._add
    release = threading.Event()
    calls = []

    def flaky(cursor, d, keyed):
        calls.append(1)
        if len(calls) == 1:
            raise OSError("a transient error")
        release.wait(10)
        return original(cursor, d, keyed)

    monkeypatch.setattr(deltas.DeltaApplier, "_add", staticmethod(flaky))
    assert _kept(session, UPSERT, [1, 3])
    for _ in range(500):
        if db.committer.deltas.stats.retries >= 1:
            break
        time.sleep(0.01)
    threading.Timer(0.3, release.set).start()
    assert rows(session, "SELECT k, n FROM c") == [{"k": 1, "n": 3}]  # waits, no 58030


def test_an_attempt_that_committed_and_then_failed_is_not_applied_twice(db) -> None:
    session = db.connect()
    session.execute("CREATE TABLE c (k INTEGER PRIMARY KEY, n BIGINT)")
    failpoints.activate("deltas.after_commit=error@1")
    try:
        assert _kept(session, UPSERT, [1, 5])
        db.committer.deltas.wait_visible()
    finally:
        failpoints.deactivate()
    assert db.committer.deltas.stats.retries >= 1
    assert rows(session, "SELECT k, n FROM c") == [{"k": 1, "n": 5}]


@pytest.mark.parametrize("change", ["rename", "drop", "add column"])
def test_a_kept_statement_is_never_re_targeted_at_commit(db, change: str) -> None:
    session, other = db.connect(), db.connect()
    session.execute("CREATE TABLE c (k INTEGER PRIMARY KEY, n BIGINT)")
    session.execute("INSERT INTO c VALUES (1, 100)")
    _begin_kept(session, [1, 1])
    if change == "rename":
        other.execute("ALTER TABLE c RENAME TO d")
        other.execute("CREATE TABLE c (k INTEGER PRIMARY KEY, n BIGINT)")
    elif change == "drop":
        other.execute("DROP TABLE c")
        other.execute("CREATE TABLE c (k INTEGER PRIMARY KEY, n BIGINT)")
    else:
        other.execute("ALTER TABLE c ADD COLUMN z INTEGER DEFAULT 0")
    with pytest.raises(SerializationFailure):
        session.execute("COMMIT")
    expected = [] if change != "add column" else [{"k": 1, "n": 100, "z": 0}]
    assert rows(other, "SELECT * FROM c") == expected
    if change == "rename":
        assert rows(other, "SELECT * FROM d") == [{"k": 1, "n": 100}]


def test_a_kept_statement_never_writes_a_re_created_table_it_has_no_privilege_on(db) -> None:
    root, alice = db.connect(), db.connect(ALICE)
    root.execute("CREATE TABLE c (k INTEGER PRIMARY KEY, n BIGINT)")
    root.execute("GRANT INSERT, UPDATE, SELECT ON c TO alice")
    _kept(alice, UPSERT, [1, 1])  # warms alice's privilege cache
    _begin_kept(alice, [2, 1])
    root.execute("DROP TABLE c")
    root.execute("CREATE TABLE c (k INTEGER PRIMARY KEY, n BIGINT)")  # no grant to alice
    with pytest.raises(SerializationFailure):
        alice.execute("COMMIT")
    assert rows(root, "SELECT * FROM c") == []


def test_a_writer_that_begins_during_the_commit_makes_it_commit_the_duckdb_way(
    db, monkeypatch
) -> None:
    """A DuckDB-way write to another table landing between COMMIT's check of the deltas and
    the commit record: the deltas run the DuckDB way and the COMMIT succeeds (no 40001)."""
    session, other = db.connect(), db.connect()
    session.execute("CREATE TABLE c (k INTEGER PRIMARY KEY, n BIGINT)")
    session.execute("CREATE TABLE unrelated (x INTEGER)")
    _begin_kept(session, [1, 1])
    original = deltas.DeltaApplier.still_valid
    fired = []

    def still_valid(self, reservations):
        valid = original(self, reservations)
        if not fired:  # an autocommit INSERT elsewhere lands right after COMMIT's check
            fired.append(1)
            other.execute("INSERT INTO unrelated VALUES (1)")
        return valid

    monkeypatch.setattr(deltas.DeltaApplier, "still_valid", still_valid)
    session.execute("COMMIT")
    monkeypatch.undo()
    assert fired
    assert rows(other, "SELECT k, n FROM c") == [{"k": 1, "n": 1}]
    assert rows(other, "SELECT x FROM unrelated") == [{"x": 1}]


def test_a_transaction_s_kept_deltas_stay_far_below_the_record_cap(db) -> None:
    """Keys whose JSON escapes take 6 bytes a character: 70 of them would make a 84 MiB
    record (over the 64 MiB cap); past ``RECORD_BYTES_MAX`` the upserts run the DuckDB way."""
    session = db.connect()
    session.execute("CREATE TABLE c (k VARCHAR PRIMARY KEY, n BIGINT)")
    session.execute("BEGIN")
    keys = [f"{i:02d}" + "\x01" * (200 << 10) for i in range(70)]
    for key in keys:
        session.execute(UPSERT, [key, 1])
    session.execute("COMMIT")
    got = rows(session, "SELECT left(k, 2) AS p, n, length(k) AS l FROM c ORDER BY k")
    assert got == [{"p": key[:2], "n": 1, "l": len(key)} for key in keys]


def test_deltas_recovery_cannot_apply_fail_the_open_and_are_kept(tmp_path: Path, monkeypatch):
    """Recovery never drops a committed delta: an open that cannot apply them fails with
    58030 naming the cause; a later open that can applies them."""
    path = str(tmp_path / "data")
    database = Database.open(path, retention_interval_s=None)
    session = database.connect()
    session.execute("CREATE TABLE c (k INTEGER PRIMARY KEY, n BIGINT)")

    def failing(*args, **kwargs):
        raise OSError("the table cannot be written")

    with monkeypatch.context() as patch:
        patch.setattr(deltas.DeltaApplier, "_add", staticmethod(failing))
        assert _kept(session, UPSERT, [1, 7])
        session.close()
        database.close()  # unapplied: left to recovery
        with pytest.raises(StorageIOError, match="cannot be written") as refused:
            Database.open(path, retention_interval_s=None)
        assert refused.value.sqlstate == "58030"
    database = Database.open(path, retention_interval_s=None)
    assert rows(database.connect(), "SELECT k, n FROM c") == [{"k": 1, "n": 7}]
    database.close()


def test_kept_deltas_count_in_the_staged_memory_budget(db) -> None:
    session = db.connect()
    session.execute("CREATE TABLE c (k VARCHAR PRIMARY KEY, n BIGINT)")
    staged = db.staged_writes
    _begin_kept(session, ["x" * 1000, 1])
    assert staged.memory_bytes >= 1000  # held while the transaction is open
    session.execute("COMMIT")
    assert staged.memory_bytes == 0
    staged.memory_bytes_max = staged.memory_bytes + 500  # nearly full: nothing more kept
    session.execute("BEGIN")
    session.execute(UPSERT, ["x" * 1000, 2])
    assert not session.transaction.deltas  # ran the DuckDB way
    session.execute("COMMIT")
    assert rows(session, "SELECT n FROM c") == [{"n": 3}]


# -- review R4: backpressure, cancellable waits, a same-named table elsewhere --------------
def _until(predicate, what: str) -> None:
    """Wait (bounded) for an expected event of another thread."""
    for _ in range(1000):
        if predicate():
            return
        time.sleep(0.01)
    raise AssertionError(f"never happened: {what}")


def _in_thread(work) -> tuple[threading.Thread, list]:
    out: list = []

    def run() -> None:
        try:
            out.append(work())
        except TopicbaseError as error:
            out.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


@pytest.fixture
def held(db):
    """A database whose applier cannot apply a group (``_apply_lock`` held) until released;
    a table ``c`` with one applied delta (its bound learned)."""
    session = db.connect()
    session.execute("CREATE TABLE c (k INTEGER PRIMARY KEY, n BIGINT)")
    assert _kept(session, UPSERT, [1, 1])
    rows(session, "SELECT * FROM c")
    applier = db.committer.deltas
    applier._apply_lock.acquire()
    released = []

    def release() -> None:
        if not released:
            released.append(True)
            applier._apply_lock.release()

    yield session, applier, release
    release()


def test_a_read_waiting_for_the_applier_ends_at_a_cancel(db, held) -> None:
    session, applier, release = held
    assert _kept(session, UPSERT, [1, 1])  # committed, not applied
    reader = db.connect()
    waits = applier.stats.waits
    thread, out = _in_thread(lambda: rows(reader, "SELECT * FROM c"))
    _until(lambda: applier.stats.waits > waits, "the read waits for the applier")
    reader.cancel()
    thread.join(10)
    assert out and isinstance(out[0], TopicbaseError) and out[0].sqlstate == "57014"
    release()
    assert rows(reader, "SELECT * FROM c") == [{"k": 1, "n": 2}]


def test_learning_a_bound_ends_at_a_cancel(db, held) -> None:
    session, applier, release = held
    session.execute("CREATE TABLE d (k INTEGER PRIMARY KEY, n BIGINT)")  # bound not known
    writer = db.connect()
    writer.execute("BEGIN")
    thread, out = _in_thread(lambda: writer.execute(UPSERT.replace(" c ", " d "), [1, 1]))
    _until(lambda: not thread.is_alive() or applier._apply_lock.locked(), "the statement runs")
    writer.cancel()  # waits in ``_learn`` for the apply lock until then
    thread.join(10)
    assert out and isinstance(out[0], TopicbaseError) and out[0].sqlstate == "57014"
    writer.execute("ROLLBACK")
    release()


def test_topic_ddl_waits_for_the_applier_outside_the_commit_lock_and_ends_at_a_cancel(
        db, held) -> None:  # fmt: skip
    session, applier, release = held
    assert _kept(session, UPSERT, [1, 1])  # committed, not applied
    ddl = db.connect()
    waits = applier.stats.waits
    thread, out = _in_thread(lambda: ddl.execute("CREATE TOPIC t WITH (min_active_partitions = 1)"))
    _until(lambda: applier.stats.waits > waits, "the DDL waits for the applier")
    assert db.commit_lock.acquire(timeout=10), "the DDL waits under the commit lock"
    db.commit_lock.release()
    ddl.cancel()
    thread.join(10)
    assert out and isinstance(out[0], TopicbaseError) and out[0].sqlstate == "57014"
    release()
    ddl.execute("CREATE TOPIC t WITH (min_active_partitions = 1)")
    assert rows(session, "SELECT k, n FROM c") == [{"k": 1, "n": 2}]


def test_committed_unapplied_deltas_are_bounded(db, held, monkeypatch) -> None:
    """Past the database-wide bound no delta is kept: the upsert runs the DuckDB way
    (which waits for the queue), so the queue never grows past it."""
    session, applier, release = held
    monkeypatch.setattr(deltas, "PENDING_RECORDS_MAX", 2)
    assert _kept(session, UPSERT, [1, 1]) and _kept(session, UPSERT, [1, 1])
    assert applier.pending == 2
    thread, out = _in_thread(lambda: _kept(session, UPSERT, [1, 1]))
    _until(lambda: applier.stats.refused.get("backlog", 0) >= 1, "the third is refused")
    assert applier.pending == 2
    release()
    thread.join(10)
    assert out == [False]  # ran the DuckDB way
    assert rows(session, "SELECT n FROM c") == [{"n": 4}]


def test_a_commit_past_the_bound_runs_its_deltas_the_duckdb_way(db, held, monkeypatch) -> None:
    session, applier, release = held
    monkeypatch.setattr(deltas, "PENDING_RECORDS_MAX", 1)
    other = db.connect()
    session.execute("BEGIN")
    session.execute(UPSERT, [1, 1])
    other.execute("BEGIN")
    other.execute(UPSERT, [1, 1])
    assert session.transaction.deltas and other.transaction.deltas
    session.execute("COMMIT")  # the queue is full now
    assert applier.pending == 1
    thread, out = _in_thread(lambda: other.execute("COMMIT"))
    _until(lambda: applier.stats.refused.get("backlog", 0) >= 1, "the commit is refused")
    assert applier.pending == 1
    release()
    thread.join(10)
    assert out and not isinstance(out[0], TopicbaseError)
    assert rows(session, "SELECT n FROM c") == [{"n": 3}]


def test_a_same_named_table_in_another_schema_does_not_refuse_commit(db) -> None:
    """A kept statement run the DuckDB way (a DDL came in between) still writes its table
    when another user created a table of its name in another schema: DuckDB resolves the
    bare name through the search path to the same table, as the DuckDB way would."""
    session, other = db.connect(), db.connect()
    session.execute("CREATE TABLE c (k INTEGER PRIMARY KEY, n BIGINT)")
    _begin_kept(session, [1, 1])
    other.execute("CREATE SCHEMA s2")
    other.execute("CREATE TABLE s2.c (x INTEGER)")
    session.execute("COMMIT")
    assert rows(other, "SELECT k, n FROM main.c") == [{"k": 1, "n": 1}]
    assert rows(other, "SELECT * FROM s2.c") == []
