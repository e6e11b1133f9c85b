"""Alias chains refused before DuckDB binds them (review R2 F8, round 24 H6)."""

from __future__ import annotations

import time

import pytest

from engine.database import Database
from engine.identity import Identity
from storage.errors import LimitExceededError


@pytest.fixture
def alice(tmp_path):
    database = Database.open(str(tmp_path / "data"), retention_interval_s=None)
    session = database.connect(Identity("alice", superuser=False))
    session.database = database
    yield session
    database.close()


def _chain(levels: int) -> str:
    items = ["'x' AS a0"] + [f"a{j} || a{j} AS a{j + 1}" for j in range(levels)]
    return "SELECT " + ", ".join(items) + f", length(a{levels}) AS n"


@pytest.mark.parametrize("levels", [20, 40])
def test_a_long_alias_chain_is_refused_quickly(alice, levels):
    started = time.process_time()
    with pytest.raises(LimitExceededError, match="aliases are expanded"):
        alice.execute(_chain(levels))
    assert time.process_time() - started < 0.5


def test_ordinary_alias_reuse_still_runs(alice):
    assert alice.execute(_chain(4))[-1].table.column("n").to_pylist() == [16]
    rows = alice.execute("SELECT 2 AS a, a + 1 AS b, b * b AS c")[-1].table.to_pylist()
    assert rows == [{"a": 2, "b": 3, "c": 9}]
    admin = alice.database.connect(Identity("admin", superuser=True))
    admin.execute("CREATE TABLE t (a INT, g INT)")
    admin.execute("INSERT INTO t VALUES (1, 1), (2, 1), (5, 2)")
    grouped = admin.execute("SELECT g % 2 AS k, sum(a) AS s FROM t GROUP BY k ORDER BY s")[
        -1
    ].table.to_pylist()
    assert [(row["k"], int(row["s"])) for row in grouped] == [(1, 3), (0, 5)]
    same_name = admin.execute("SELECT a AS a, a + 1 AS b FROM t ORDER BY a")[-1].table
    assert same_name.column("b").to_pylist() == [2, 3, 6]
