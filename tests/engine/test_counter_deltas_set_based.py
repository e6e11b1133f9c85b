"""Counter deltas applied set-based (``engine.deltas._add_set``): a group's keys of one table
go to DuckDB as one UPDATE joined to the keys (and one INSERT of the keys it did not find),
and the table ends exactly as the DuckDB way's upserts leave it.

What must hold: with the applier held (so several commits meet in one group), keys that
exist and keys that do not, a key added to by several commits, composite keys, several
counter columns of different integer types, negative amounts, and table and column names
that the statement's own aliases (``__t``, ``__v``, ``k0``, ``a0``) could capture, all end
as with ``TOPICBASE_COUNTER_DELTAS=0``; the set-based statement ran for such a group (a
spy), a group of one key runs the per-key UPDATE, and a group that fails set-based is
retried and applied once.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from engine import deltas
from engine.database import Database
from storage import failpoints
from tests.engine.conftest import rows

# Names chosen to meet the statement's aliases: the table is ``__v``, a key ``k0``, a
# counter ``a0``, another ``__t``.
TABLE = ('CREATE TABLE "__v" ("k0" VARCHAR, "__t" INTEGER, "a0" BIGINT NOT NULL, '
         '"z" SMALLINT NOT NULL, PRIMARY KEY ("k0", "__t"))')  # fmt: skip
UPSERT = ('INSERT INTO "__v" VALUES ($1, $2, $3, $4) ON CONFLICT ("k0", "__t") '
          'DO UPDATE SET "a0" = "a0" + EXCLUDED."a0", "z" = "z" + EXCLUDED."z"')  # fmt: skip
SINGLE = "CREATE TABLE c (k INTEGER PRIMARY KEY, n BIGINT NOT NULL)"
SINGLE_UPSERT = "INSERT INTO c VALUES ($1, $2) ON CONFLICT (k) DO UPDATE SET n = n + EXCLUDED.n"


def _workload(seed: int) -> list[list[list]]:
    """Transactions of upserts: keys seeded (existing) or new, some repeated."""
    rng = random.Random(seed)
    keys = [("s", 1), ("s", 2), ("new", 1), ("new", 7), ("é ü", -3), ("", 0)]
    return [[[*rng.choice(keys), rng.randint(-50, 90), rng.randint(-3, 5)]
             for _ in range(rng.randint(1, 4))] for _ in range(12)]  # fmt: skip


def _commit(session, transaction: list[list], upsert: str = UPSERT) -> bool:
    """Run one transaction of upserts; whether it kept them as deltas."""
    session.execute("BEGIN")
    for parameters in transaction:
        session.execute(upsert, parameters)
    kept = bool(session.transaction.deltas)
    session.execute("COMMIT")
    return kept


def _run(path: str, work: list[list[list]], *, hold: bool) -> list[dict]:
    database = Database.open(path, retention_interval_s=None)
    try:
        session = database.connect()
        session.execute(TABLE)
        session.execute("INSERT INTO \"__v\" VALUES ('s', 1, 10, 1), ('s', 2, -4, 2)")
        _commit(session, [["s", 1, 0, 0]])  # the table's bound learned (under the apply lock)
        applier = database.committer.deltas
        if hold:
            applier._apply_lock.acquire()  # every commit below waits in one group
        try:
            for transaction in work:
                assert _commit(session, transaction) == hold
        finally:
            if hold:
                applier._apply_lock.release()
        return rows(session, 'SELECT * FROM "__v" ORDER BY ALL')
    finally:
        database.close()


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_group_of_many_keys_ends_as_the_duckdb_way(tmp_path: Path, monkeypatch, seed) -> None:
    work = _workload(seed)
    calls = []
    original = deltas._add_set

    def spy(cursor, d, keyed):
        calls.append(len(keyed))
        return original(cursor, d, keyed)

    monkeypatch.setattr(deltas, "_add_set", spy)
    kept = _run(str(tmp_path / "kept"), work, hold=True)
    assert calls and max(calls) >= 3  # the held commits met in a group of several keys
    monkeypatch.setenv("TOPICBASE_COUNTER_DELTAS", "0")
    calls.clear()
    assert kept == _run(str(tmp_path / "duckdb"), work, hold=False)
    assert not calls


def test_one_key_runs_the_update_by_key(tmp_path: Path, monkeypatch) -> None:
    calls = []
    monkeypatch.setattr(deltas, "_add_set", lambda *a: calls.append(a))
    database = Database.open(str(tmp_path / "data"), retention_interval_s=None)
    try:
        session = database.connect()
        session.execute(SINGLE)
        for amount in (3, 4):
            assert _commit(session, [[1, amount]], SINGLE_UPSERT)
        assert rows(session, "SELECT k, n FROM c") == [{"k": 1, "n": 7}]
        assert not calls
    finally:
        database.close()


def test_a_set_based_group_that_fails_is_applied_once(tmp_path: Path) -> None:
    """``deltas.before_commit`` fails the first attempt after both statements ran (some
    keys updated, some inserted): the retry applies the group once."""
    database = Database.open(str(tmp_path / "data"), retention_interval_s=None)
    try:
        session = database.connect()
        session.execute(SINGLE)
        session.execute("INSERT INTO c VALUES (1, 100)")
        assert _commit(session, [[1, 0]], SINGLE_UPSERT)  # the bound learned
        applier = database.committer.deltas
        applier._apply_lock.acquire()
        try:
            for key in (1, 2, 3, 1):
                assert _commit(session, [[key, 5]], SINGLE_UPSERT)
            failpoints.activate("deltas.before_commit=error@1")
        finally:
            applier._apply_lock.release()
        try:
            applier.wait_visible()
        finally:
            failpoints.deactivate()
        assert applier.stats.retries >= 1
        assert rows(session, "SELECT k, n FROM c ORDER BY k") == [
            {"k": 1, "n": 110}, {"k": 2, "n": 5}, {"k": 3, "n": 5}]  # fmt: skip
    finally:
        database.close()
