"""The counter-delta applier gathers groups (``engine.deltas.GATHER_S``): with nobody waiting
for the deltas it waits for more committed records before it applies a group, and anyone
who needs them (a read, a DuckDB-way writer, the checkpoint, close) makes it apply at once.

What must hold, with the gathering window made far longer than any test (60 s): commits in a
row become one group; a read after them returns at once with every delta applied, in
autocommit and in an explicit transaction; a DDL (a writer), the checkpoint and close do
not wait out the window either. Each wait below runs in a thread joined with a bound far
under the window, so a wait that sits out the window fails the test instead of hanging.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from engine import deltas
from engine.database import Database
from tests.engine.conftest import rows

TABLE = "CREATE TABLE c (k INTEGER PRIMARY KEY, n BIGINT NOT NULL)"
UPSERT = "INSERT INTO c VALUES ($1, $2) ON CONFLICT (k) DO UPDATE SET n = n + EXCLUDED.n"
WINDOW_S = 60.0
PROMPT_S = 20.0  # far under the window: a wait that sat it out fails


@pytest.fixture
def db(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(deltas, "GATHER_S", WINDOW_S)
    database = Database.open(str(tmp_path / "data"), retention_interval_s=None)
    session = database.connect()
    session.execute(TABLE)
    _commit(session, 1, 0)  # the table's bound learned; the applier started
    session.close()
    yield database
    _promptly(database.close)


def _commit(session, key: int, amount: int) -> None:
    session.execute("BEGIN")
    session.execute(UPSERT, [key, amount])
    assert session.transaction.deltas
    session.execute("COMMIT")


def _promptly(call):
    """``call()`` in a thread; its result, or a failure if it did not end in ``PROMPT_S``."""
    result: list = []
    failure: list = []

    def run() -> None:
        try:
            result.append(call())
        except BaseException as error:  # handed to the test
            failure.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(PROMPT_S)
    assert not thread.is_alive(), "waited out the applier's gathering window"
    if failure:
        raise failure[0]
    return result[0]


def _three_commits(db) -> tuple[object, int]:
    session = db.connect()
    applier = db.committer.deltas
    _promptly(applier.wait_visible)
    groups = applier.stats.groups
    for key, amount in ((1, 5), (2, 7), (1, 3)):
        _commit(session, key, amount)
    return session, groups


def test_commits_in_a_row_become_one_group_a_read_applies(db) -> None:
    session, groups = _three_commits(db)
    found = _promptly(lambda: rows(session, "SELECT k, n FROM c ORDER BY k"))
    assert found == [{"k": 1, "n": 8}, {"k": 2, "n": 7}]
    assert db.committer.deltas.stats.groups == groups + 1


def test_a_transaction_snapshot_waits_for_them_at_once(db) -> None:
    session, _ = _three_commits(db)
    session.execute("BEGIN")
    found = _promptly(lambda: rows(session, "SELECT sum(n) AS total FROM c"))
    session.execute("COMMIT")
    assert found == [{"total": 15}]


def test_a_writer_does_not_wait_out_the_window(db) -> None:
    session, _ = _three_commits(db)
    _promptly(lambda: session.execute("ALTER TABLE c RENAME TO d"))
    assert rows(session, "SELECT k, n FROM d ORDER BY k") == [{"k": 1, "n": 8}, {"k": 2, "n": 7}]


def test_the_checkpoint_does_not_wait_out_the_window(db) -> None:
    _three_commits(db)
    _promptly(db.committer.checkpoint)
    assert db.committer.deltas.pending == 0


def test_close_applies_at_once(tmp_path: Path, db) -> None:
    _three_commits(db)
    applier = db.committer.deltas
    _promptly(applier.close)
    assert applier.pending == 0


def test_a_backlog_at_half_its_bound_is_applied_without_a_reader(db, monkeypatch) -> None:
    """Past its bound commits would run their deltas the DuckDB way: at half of it the
    applier gathers no longer (nobody reads here). A bound of 2 records: one is half."""
    session = db.connect()
    _commit(session, 2, 1)  # the session's plan worked out (its catalog reads wait)
    applier = db.committer.deltas
    _promptly(applier.wait_visible)
    monkeypatch.setattr(deltas, "PENDING_RECORDS_MAX", 2)
    waits = applier.stats.waits
    _commit(session, 1, 1)
    pause = threading.Event()  # never set: a bounded poll, not a timing assertion
    for _ in range(int(PROMPT_S * 100)):
        if applier.pending == 0:
            break
        pause.wait(0.01)
    assert applier.pending == 0
    assert applier.stats.waits == waits  # no statement waited for the deltas
