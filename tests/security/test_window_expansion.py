"""A named window is copied into each of its uses by DuckDB's binder (round 26, H3): 300
uses of ``OVER w`` with ``WINDOW w AS (PARTITION BY i + i + ...)`` of 300 terms (5.7 KB, no
privilege needed) took 7.5 s of CPU and ~200 MiB to bind through the server, and the cost
is n x m, so a statement of the wire's size is unbounded. Each use now costs the
definition's nodes in ``BIND_EXPANSION_NODES_MAX`` (``planner.alias_expansion``), 54000
past it, before DuckDB binds the statement."""

from __future__ import annotations

import time
from collections.abc import Iterator

import psycopg
import pytest

from engine.database import Database
from engine.identity import Identity
from engine.session import Session
from storage.errors import LimitExceededError
from tests.security.conftest import WireServer


def _windows(uses: int, terms: int, use: str = "OVER w") -> str:
    definition = " + ".join(["i"] * terms)
    items = ", ".join(f"sum(i) {use} AS s{n}" for n in range(uses))
    return f"SELECT {items} FROM range(3) t(i) WINDOW w AS (PARTITION BY {definition})"


@pytest.fixture
def alice(database: Database) -> Iterator[Session]:
    session = database.connect(Identity("alice", superuser=False))
    yield session
    session.close()


@pytest.mark.parametrize("use", ["OVER w", "OVER (w ORDER BY i)"])
def test_many_uses_of_a_large_window_are_refused(alice: Session, use: str) -> None:
    started = time.process_time()
    with pytest.raises(LimitExceededError, match="expression nodes") as caught:
        alice.execute(_windows(300, 300, use))
    assert caught.value.sqlstate == "54000"
    assert time.process_time() - started < 1.0  # ~7 s of bind on main


def test_windows_within_the_bound_still_run(alice: Session) -> None:
    rows = alice.execute(_windows(20, 20))[-1].table.to_pylist()
    assert len(rows) == 3 and all(len(row) == 20 for row in rows)
    inherited = ("SELECT sum(i) OVER w2 AS s FROM range(3) t(i) "
                 "WINDOW w1 AS (PARTITION BY i), w2 AS (w1 ORDER BY i) ORDER BY s")  # fmt: skip
    assert alice.execute(inherited)[-1].table.to_pylist() == [{"s": 0}, {"s": 1}, {"s": 2}]


def test_the_windows_are_refused_over_the_wire(wire_server: WireServer) -> None:
    alice = wire_server.login("alice")
    with pytest.raises(psycopg.errors.ProgramLimitExceeded, match="expression nodes"):
        alice.execute(_windows(300, 300))
    assert len(alice.execute(_windows(10, 10)).fetchall()) == 3
