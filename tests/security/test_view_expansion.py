"""A chain of views, each joining the one before twice, is 2^n relations for DuckDB's binder
(round 25): DuckDB copies a view's query wherever the view is read, so 14 small views took
3.6 s to read and each more doubles it. An ordinary user's statement reading more than
``limits.VIEW_EXPANDED_RELATIONS_MAX`` relations once its views are expanded is refused
(54000) before DuckDB sees it."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from engine.database import Database
from engine.identity import Identity
from engine.session import Session
from storage import limits
from storage.errors import LimitExceededError


@pytest.fixture
def alice(database: Database) -> Iterator[Session]:
    admin = database.connect()
    admin.execute("GRANT CREATE ON SCHEMA main TO alice")
    session = database.connect(Identity("alice", superuser=False))
    yield session
    session.close()
    admin.close()


def _chain(session: Session, levels: int) -> None:
    """Views each reading the one before twice: 2^n reads to bind. Through a UNION ALL,
    not a join (as round 25 had it): a joined chain is refused from 7 levels on by the
    join bound too (128 relations in one graph: round 27, ``test_plan_relations_views``),
    and these tests are about what the binder copies."""
    session.execute("CREATE VIEW v0 AS SELECT 1 AS x")
    for level in range(1, levels + 1):
        before = f"v{level - 1}"
        session.execute(f"CREATE VIEW v{level} AS SELECT sum(x) AS x FROM "
                        f"(SELECT x FROM {before} UNION ALL SELECT x FROM {before})")  # fmt: skip


def test_a_doubling_view_chain_is_refused_before_duckdb_binds_it(alice: Session) -> None:
    _chain(alice, 15)  # created: PostgreSQL checks a view when it is used (16 views deep at most)
    assert alice.execute("SELECT x FROM v10")[-1].table.to_pylist() == [{"x": 1024}]
    for view in ("v11", "v15"):
        started = time.process_time()
        with pytest.raises(LimitExceededError, match="views are expanded") as caught:
            alice.execute(f"SELECT x FROM {view}")
        assert caught.value.sqlstate == "54000"
        assert time.process_time() - started < 0.5  # v15: ~7 s of bind on main (2^15 reads)
    with pytest.raises(LimitExceededError):  # a view read twice counts twice
        alice.execute("SELECT a.x FROM v10 a, v10 b")


def test_a_superusers_chain_read_by_a_granted_user_is_refused_too(database: Database) -> None:
    admin = database.connect()
    _chain(admin, 12)
    admin.execute("GRANT SELECT ON v12 TO alice")
    admin.execute("GRANT SELECT ON v8 TO alice")
    alice = database.connect(Identity("alice", superuser=False))
    assert alice.execute("SELECT x FROM v8")[-1].table.to_pylist() == [{"x": 256}]
    with pytest.raises(LimitExceededError):
        alice.execute("SELECT x FROM v12")
    assert admin.execute("SELECT x FROM v12")[-1].table.to_pylist() == [{"x": 4096}]  # owner


def test_the_bound_is_the_limit(alice: Session, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "VIEW_EXPANDED_RELATIONS_MAX", 4)
    _chain(alice, 3)
    assert alice.execute("SELECT x FROM v2")[-1].table.to_pylist() == [{"x": 4}]
    with pytest.raises(LimitExceededError, match="reads 8 relations"):
        alice.execute("SELECT x FROM v3")
