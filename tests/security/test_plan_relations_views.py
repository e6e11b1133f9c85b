"""The join bound (``PLAN_RELATIONS_MAX``) with views put in place, and parenthesised
joins (round 27).

DuckDB's binder puts a view's query in place of each read and flattens it into the join
graph it stands in. Round 26's bound counted a view as one relation, so a user granted
CREATE on a schema made views of 60 relations and joined them: 4 of them, 240 relations,
planned for 3.9 s of CPU (DuckDB 2.0.1 embedded), 8 of them 32 s, 12 more than 120 s,
in a 184-character statement. And sqlglot reads ``((t JOIN u) JOIN w)`` as a subquery
in a subquery: its joins were not counted, so a chain of 120 joins written in nested
parentheses (DuckDB's own text of a view of joins) ran, 2 s of planning, and 200 more
than 40 s (``engine.privileges._refuse_large_join_of_views``,
``planner.plan_relations.largest_join_with_views``)."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from engine import sandbox
from engine.database import Database
from engine.identity import Identity
from engine.session import Session
from planner.duckdb_sql import parse_duckdb
from planner.plan_relations import largest_join
from storage.errors import LimitExceededError
from storage.limits import PLAN_RELATIONS_MAX
from tests.security.conftest import WireServer

LIMIT = PLAN_RELATIONS_MAX


def _chain(n: int, select: str = "1") -> str:
    return f"SELECT {select} FROM t t0 " + " ".join(
        f"JOIN t t{i} ON t{i}.a = t{i - 1}.a" for i in range(1, n)
    )


def _parenthesised(n: int) -> str:
    """The chain with each join in parentheses of its own, as DuckDB writes a view's."""
    joins = " ".join(f"JOIN t t{i} ON t{i}.a = t{i - 1}.a)" for i in range(1, n))
    return "SELECT 1 FROM " + "(" * (n - 1) + "t t0 " + joins


def _joined(views: list[str]) -> str:
    return f"SELECT count(*) FROM {views[0]} " + " ".join(
        f"JOIN {v} ON {v}.a = {views[0]}.a" for v in views[1:]
    )


@pytest.mark.parametrize(("sql", "graph"), [
    (_parenthesised(10), 10),
    ("SELECT 1 FROM (((t JOIN u ON true) JOIN w ON true) JOIN z ON true)", 4),
    ("SELECT 1 FROM ((t JOIN u ON true)) x JOIN w ON true", 3),
    ("SELECT 1 FROM ((SELECT 1 FROM a, b, c))", 3),
])  # fmt: skip
def test_joins_in_nested_parentheses_are_counted(sql: str, graph: int) -> None:
    tree = parse_duckdb(sql)
    assert tree is not None
    assert largest_join(tree, sandbox.builtin_macro_relations()) == graph


@pytest.fixture
def sessions(database: Database) -> Iterator[tuple[Session, Session]]:
    admin = database.connect()
    admin.execute("CREATE TABLE t (a INTEGER)")
    admin.execute("INSERT INTO t VALUES (1)")
    admin.execute("GRANT SELECT ON t TO alice")
    admin.execute("GRANT CREATE ON SCHEMA main TO alice")
    alice = database.connect(Identity("alice", superuser=False))
    yield admin, alice
    alice.close()
    admin.close()


def test_a_parenthesised_chain_past_the_limit_is_refused(
    sessions: tuple[Session, Session],
) -> None:
    admin, alice = sessions
    assert alice.execute(_parenthesised(LIMIT // 2))[-1].table.num_rows == 1
    with pytest.raises(LimitExceededError, match="join 65 relations"):
        alice.execute(_parenthesised(LIMIT + 1))
    assert admin.execute(_parenthesised(LIMIT + 1))[-1].table.num_rows == 1  # a superuser


def test_views_count_the_relations_their_queries_join(
    sessions: tuple[Session, Session],
) -> None:
    admin, alice = sessions
    for index in range(4):  # 20 relations each: under the bound alone
        alice.execute(f"CREATE VIEW v{index} AS {_chain(20, 't0.a')}")
    assert alice.execute(_joined(["v0", "v1", "v2"]))[-1].table.to_pylist() == [
        {"count": 1}]  # fmt: skip
    for statement in (
        _joined(["v0", "v1", "v2", "v3"]),  # 80 relations
        _joined(["v0", "v0", "v0", "v0"]),  # one view read 4 times
        f"SELECT * FROM (SELECT 1) x, LATERAL ({_joined(['v0', 'v1', 'v2', 'v3'])}) y",
        "SELECT (SELECT count(*) FROM v0, v1) FROM v2, v3",  # decorrelated: one graph
        f"SELECT 1 FROM v0, v1, v2 WHERE EXISTS (SELECT 1 FROM {_chain(5)})",
        f"EXPLAIN {_joined(['v0', 'v1', 'v2', 'v3'])}",
        f"CREATE TABLE copy AS {_joined(['v0', 'v1', 'v2', 'v3'])}",
    ):
        with pytest.raises(LimitExceededError, match="once its views are put in place"):
            alice.execute(statement)
    # Graphs apart: each side of a UNION, a materialized CTE read twice.
    union = " UNION ALL ".join(f"SELECT a FROM v{index}" for index in range(4))
    assert alice.execute(union)[-1].table.num_rows == 4
    cte = "WITH c AS (SELECT v0.a FROM v0, v1) SELECT count(*) FROM c x, c y"
    assert alice.execute(cte)[-1].table.num_rows == 1
    # Views of views: each counts what it puts in place.
    alice.execute("CREATE VIEW w AS SELECT v0.a FROM v0 JOIN v1 ON v1.a = v0.a")
    assert alice.execute("SELECT count(*) FROM w")[-1].table.num_rows == 1  # 40
    with pytest.raises(LimitExceededError, match="join 80 relations"):
        alice.execute("SELECT count(*) FROM w x JOIN w y ON x.a = y.a")
    assert admin.execute(_joined(["v0", "v1", "v2", "v3"]))[-1].table.num_rows == 1


def test_views_over_the_wire(wire_server: WireServer) -> None:
    admin = wire_server.login("admin")
    admin.execute("CREATE TABLE t (a INTEGER)")
    admin.execute("INSERT INTO t VALUES (1)")
    admin.execute("GRANT SELECT ON t TO alice")
    admin.execute("GRANT CREATE ON SCHEMA main TO alice")
    alice = wire_server.login()
    for index in range(4):
        alice.execute(f"CREATE VIEW v{index} AS {_chain(20, 't0.a')}")
    joined = _joined(["v0", "v1", "v2", "v3"])
    for prepare in (False, True):  # the simple and the extended protocol
        with pytest.raises(psycopg.errors.ProgramLimitExceeded, match="views are put"):
            alice.execute(joined, prepare=prepare)
        assert alice.execute(_joined(["v0", "v1"]), prepare=prepare).fetchall() == [(1,)]
    with pytest.raises(psycopg.errors.ProgramLimitExceeded, match="views are put"):
        alice.execute(f"PREPARE p AS {joined}")
    # A statement prepared while its views were small is judged again at EXECUTE.
    alice.execute("CREATE VIEW grown AS SELECT 1 AS a")
    alice.execute(f"PREPARE q AS {_joined(['grown', 'v0', 'v1', 'v2'])}")
    alice.execute(f"CREATE OR REPLACE VIEW grown AS {_chain(20, 't0.a')}")
    with pytest.raises(psycopg.errors.ProgramLimitExceeded, match="views are put"):
        alice.execute("EXECUTE q")
    with (pytest.raises(psycopg.errors.ProgramLimitExceeded, match="views are put"),
          alice.cursor().copy(f"COPY ({joined}) TO STDOUT") as copy):  # fmt: skip
        list(copy)
    with pytest.raises(psycopg.errors.ProgramLimitExceeded, match="relations"):
        alice.execute(_parenthesised(3 * LIMIT))
