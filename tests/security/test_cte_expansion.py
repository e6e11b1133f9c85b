"""A chain of NOT MATERIALIZED common table expressions, each joining the one before twice,
is 2^n for DuckDB's binder (round 26, H3): DuckDB inlines such a CTE at every reference, so
``WITH a0 AS NOT MATERIALIZED (SELECT 1 AS x), a1 AS NOT MATERIALIZED (SELECT a.x FROM a0
a, a0 b), ...`` of 16 levels (928 characters, no privilege needed) took 15 s of CPU and
~0.5 GiB to bind through the server. Each copy bound of a NOT MATERIALIZED CTE now counts
as a relation read in ``limits.VIEW_EXPANDED_RELATIONS_MAX`` (54000 past it), with the
views it reads. A default CTE read twice is materialized by DuckDB (bound once): the same
chain without NOT MATERIALIZED stays allowed."""

from __future__ import annotations

import time
from collections.abc import Iterator

import psycopg
import pytest

from engine.database import Database
from engine.identity import Identity
from engine.session import Session
from storage import limits
from storage.errors import LimitExceededError
from tests.security.conftest import WireServer

REFUSED = r"common table expressions|too complex to plan"


def _chain(levels: int, materialized: str = "NOT MATERIALIZED") -> str:
    parts = [f"a0 AS {materialized} (SELECT 1 AS x)"] + [
        f"a{i} AS {materialized} (SELECT a.x + b.x AS x FROM a{i - 1} a, a{i - 1} b)"
        for i in range(1, levels + 1)
    ]
    return "WITH " + ", ".join(parts) + f" SELECT x FROM a{levels}"


def _nested(levels: int) -> str:
    query = "SELECT 1 AS x"
    for _ in range(levels):
        query = f"WITH c AS NOT MATERIALIZED ({query}) SELECT a.x + b.x AS x FROM c a, c b"
    return query


@pytest.fixture
def alice(database: Database) -> Iterator[Session]:
    session = database.connect(Identity("alice", superuser=False))
    yield session
    session.close()


def test_a_doubling_not_materialized_chain_is_refused_before_duckdb_binds_it(
    alice: Session,
) -> None:
    # (64 relations at most in one join since round 26's PLAN_RELATIONS_MAX, which refuses
    # such chains first when written out; inside a view only this count sees them, below.)
    assert alice.execute(_chain(6))[-1].table.to_pylist() == [{"x": 64}]
    for query in (_chain(10), _chain(16), _nested(16)):
        started = time.process_time()
        with pytest.raises(LimitExceededError, match=REFUSED) as caught:
            alice.execute(query)
        assert caught.value.sqlstate == "54000"
        assert time.process_time() - started < 1.0  # 16 levels: ~13 s of bind on main
    # the default (materialized when read twice) and MATERIALIZED chains bind once
    assert alice.execute(_chain(16, ""))[-1].table.to_pylist() == [{"x": 65536}]
    assert alice.execute(_chain(16, "MATERIALIZED"))[-1].table.to_pylist() == [{"x": 65536}]


def test_reads_inside_a_not_materialized_cte_count_once_per_copy(database: Database) -> None:
    admin = database.connect()
    admin.execute("CREATE TABLE t AS SELECT 1 AS x")
    admin.execute("GRANT SELECT ON t TO alice")
    alice = database.connect(Identity("alice", superuser=False))
    # 513 references of a CTE reading t: 513 copies and 513 reads of t, 1,026 in all
    half = limits.VIEW_EXPANDED_RELATIONS_MAX // 2
    joins = ", ".join(f"c c{i}" for i in range(half + 1))
    query = f"WITH c AS NOT MATERIALIZED (SELECT x FROM t) SELECT count(*) AS n FROM {joins}"
    with pytest.raises(LimitExceededError):
        alice.execute(query)
    few = "WITH c AS NOT MATERIALIZED (SELECT x FROM t) SELECT count(*) AS n FROM c a, c b"
    assert alice.execute(few)[-1].table.to_pylist() == [{"n": 1}]
    assert admin.execute(_chain(11))[-1].table.to_pylist() == [{"x": 2048}]  # superuser
    # In a view the statement names one relation: only the expanded count sees the copies.
    admin.execute(f"CREATE VIEW chain AS {_chain(11)}")
    admin.execute("GRANT SELECT ON chain TO alice")
    with pytest.raises(LimitExceededError, match=r"common table expressions|views are expanded"):
        alice.execute("SELECT x FROM chain")
    alice.close()
    admin.close()


def test_the_chain_is_refused_over_the_wire(wire_server: WireServer) -> None:
    alice = wire_server.login("alice")
    started = time.monotonic()
    with pytest.raises(psycopg.errors.ProgramLimitExceeded, match=REFUSED):
        alice.execute(_chain(16))
    assert time.monotonic() - started < 5.0
    assert alice.execute(_chain(6)).fetchall() == [(64,)]
