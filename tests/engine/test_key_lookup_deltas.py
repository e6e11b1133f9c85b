"""Key lookups (``engine.key_lookup``) and counter deltas (``engine.deltas``) together.

What must hold: a counter upsert kept as a delta changes its table when the background
applier commits it in DuckDB, outside any session statement; that commit is bracketed by
``key_lookup.changing_tables`` (closed before waiters are woken), so a lookup after the
transaction's COMMIT returned never gets the row from before the delta: it waits for the
applier (the session's ``cursor``) and then finds the index outdated. A kept delta that
ends up run the DuckDB way (a later statement of its transaction touches DuckDB, or a
DuckDB-way writer began before its COMMIT) invalidates at that COMMIT too. Each test
builds the index first and checks the lookup is of the key path (a spy), so each fails
without the bracket or the noted table.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engine import deltas, key_lookup
from engine.database import Database
from engine.session import Session
from storage import failpoints
from tests.key_lookup_spy import served_lookups

UPSERT = "INSERT INTO counters VALUES (?, ?) ON CONFLICT (k) DO UPDATE SET n = n + EXCLUDED.n"
LOOKUP = "SELECT n FROM counters WHERE k = $1"
WAIT_S = 60  # a bound for a hung test, not a timing the test asserts


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Lookups the key path answered (a spy), with an index built after one lookup."""
    monkeypatch.delenv("TOPICBASE_COUNTER_DELTAS", raising=False)
    return served_lookups(monkeypatch)


@pytest.fixture
def db(tmp_path: Path, served: list[int]) -> Iterator[Database]:
    database = Database.open(str(tmp_path / "data"))
    session = database.connect()
    session.execute("CREATE TABLE counters (k BIGINT PRIMARY KEY, n BIGINT NOT NULL)")
    session.execute("INSERT INTO counters SELECT i, 100 * i FROM range(100) t(i)")
    session.close()
    yield database
    database.close()


def _n(session: Session, key: int) -> Any:
    found = session.execute(LOOKUP, [key])[0].table.to_pylist()
    return found[0]["n"] if found else None


def _indexed(db: Database, reader: Session, served: list[int]) -> None:
    """Build the index of ``counters`` and check the key path answers from it."""
    assert _n(reader, 5) == 500
    served.clear()
    assert _n(reader, 5) == 500
    assert served and key_lookup.indexes_of(db).indexes.get("counters") is not None


def _add_as_delta(writer: Session, key: int, amount: int) -> None:
    writer.execute("BEGIN")
    writer.execute(UPSERT, [key, amount])
    assert writer.transaction is not None and writer.transaction.deltas  # kept as a delta
    writer.execute("COMMIT")


def test_a_lookup_after_commit_sees_the_applied_delta(db: Database, served: list[int]) -> None:
    reader, writer = db.connect(), db.connect()
    _indexed(db, reader, served)
    records = db.committer.deltas.stats.records
    _add_as_delta(writer, 5, 7)
    _add_as_delta(writer, 1000, 3)  # a new row
    assert _n(reader, 5) == 507
    assert _n(reader, 1000) == 3
    assert db.committer.deltas.stats.records == records + 2  # applied by the applier
    served.clear()
    assert _n(reader, 5) == 507  # from an index built again
    assert served


def test_a_lookup_waits_for_a_delta_held_back_by_the_applier(
    db: Database, served: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The applier is held at ``deltas.before_commit`` (its group's DuckDB transaction
    written, not committed): a lookup of the key then waits, and gets the added amount
    once the applier goes on, never the row from before."""
    reader, writer = db.connect(), db.connect()
    _indexed(db, reader, served)
    parked, go_on = threading.Event(), threading.Event()
    original = failpoints.hit

    def hold(name: str) -> None:
        if name == "deltas.before_commit":
            parked.set()
            assert go_on.wait(WAIT_S)
        original(name)

    monkeypatch.setattr(failpoints, "hit", hold)
    applier = db.committer.deltas
    waits = applier.stats.waits
    _add_as_delta(writer, 5, 7)
    assert parked.wait(WAIT_S)
    seen: list[Any] = []
    lookup = threading.Thread(target=lambda: seen.append(_n(reader, 5)))
    lookup.start()
    ends = time.monotonic() + WAIT_S
    while applier.stats.waits == waits:  # until the lookup waits for the applier
        assert time.monotonic() < ends, "the lookup never waited for the applier"
        time.sleep(0.005)
    assert lookup.is_alive() and not seen and applier.pending == 1
    go_on.set()
    lookup.join(WAIT_S)
    assert seen == [507]


def test_deltas_run_the_duckdb_way_by_a_later_statement_invalidate_at_commit(
    db: Database, served: list[int]
) -> None:
    reader, writer = db.connect(), db.connect()
    _indexed(db, reader, served)
    writer.execute("BEGIN")
    writer.execute(UPSERT, [5, 7])  # kept
    writer.execute("SELECT count(*) FROM range(3)")  # touches DuckDB: run the DuckDB way
    writer.execute("COMMIT")
    assert db.committer.deltas.stats.records == 0
    assert _n(reader, 5) == 507


def test_deltas_run_the_duckdb_way_at_commit_after_a_writer_began_invalidate(
    db: Database, served: list[int]
) -> None:
    reader, adder, other = db.connect(), db.connect(), db.connect()
    other.execute("CREATE TABLE elsewhere (x INTEGER)")
    _indexed(db, reader, served)
    adder.execute("BEGIN")
    adder.execute(UPSERT, [5, 7])  # kept
    other.execute("BEGIN")
    other.execute("INSERT INTO elsewhere VALUES (1)")  # a DuckDB-way writer, still open
    adder.execute("COMMIT")  # its delta is outdated: run the DuckDB way
    other.execute("COMMIT")
    assert db.committer.deltas.stats.records == 0
    assert _n(reader, 5) == 507


def test_an_autocommit_counter_upsert_is_no_delta_and_invalidates(
    db: Database, served: list[int]
) -> None:
    reader, writer = db.connect(), db.connect()
    _indexed(db, reader, served)
    writer.execute(UPSERT, [5, 7])
    assert db.committer.deltas.stats.records == 0 and deltas.enabled()
    assert _n(reader, 5) == 507
