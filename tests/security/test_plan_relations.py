"""DuckDB's join-order optimizer takes ~n^3-n^4 in the relations of one join graph, and an
interrupt does not stop it (round 26: a chain of 300 equi-joins of one table, 9 KB of
text, 288 s of one core; 300 EXISTS 18.6 s; 400 calls of the macro ``pg_get_viewdef``
82 s). An ordinary user's statement whose largest join graph has more than
``PLAN_RELATIONS_MAX`` relations is refused (54000) before DuckDB plans it
(``planner.plan_relations``, ``engine.sandbox.refuse_large_join``); statements with many
relations that are not joined (a UNION of many SELECTs) still run."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from engine import sandbox, tables
from engine.database import Database
from engine.identity import Identity
from engine.session import Session
from planner.duckdb_sql import parse_duckdb
from planner.plan_relations import NO_MACROS, inlines_ctes, largest_join, relation_bound
from storage.errors import LimitExceededError
from storage.limits import PLAN_RELATIONS_MAX
from tests.security.conftest import WireServer

LIMIT = PLAN_RELATIONS_MAX


def _chain(n: int) -> str:
    return "SELECT 1 FROM t t0 " + " ".join(
        f"JOIN t t{i} ON t{i}.a = t{i - 1}.a" for i in range(1, n)
    )


def _commas(n: int) -> str:
    tables_ = ", ".join(f"t t{i}" for i in range(n))
    return f"SELECT 1 FROM {tables_} WHERE " + " AND ".join(
        f"t{i}.a = t{i - 1}.a" for i in range(1, n)
    )


def _subqueries(n: int) -> str:
    items = ", ".join("(SELECT a FROM t u WHERE u.a = t.a)" for _ in range(n))
    return f"SELECT {items} FROM t"


def _exists(n: int) -> str:
    return "SELECT 1 FROM t WHERE " + " AND ".join(
        "EXISTS (SELECT 1 FROM t u WHERE u.a = t.a)" for _ in range(n)
    )


def _derived(n: int) -> str:
    return "SELECT 1 FROM (SELECT a FROM t) s0 " + " ".join(
        f"JOIN (SELECT a FROM t) s{i} ON s{i}.a = s{i - 1}.a" for i in range(1, n)
    )


def _not_materialized(levels: int) -> str:
    ctes = ", ".join(
        f"a{i} AS NOT MATERIALIZED (SELECT x.a FROM a{i - 1} x, a{i - 1} y)"
        for i in range(1, levels + 1)
    )
    return f"WITH a0 AS NOT MATERIALIZED (SELECT a FROM t), {ctes} SELECT * FROM a{levels}"


def _viewdefs(n: int) -> str:
    return "SELECT " + ", ".join("pg_get_viewdef(a)" for _ in range(n)) + " FROM t"


def _counts(sql: str) -> tuple[int, int]:
    macros = sandbox.builtin_macro_relations()
    tree = parse_duckdb(sql)
    assert tree is not None
    return relation_bound(tables.sql_tokens(sql), macros), largest_join(tree, macros)


@pytest.mark.parametrize(("sql", "graph"), [
    (_chain(10), 10),
    (_commas(10), 10),
    (_subqueries(10), 11),  # each decorrelated into a join with the outer block
    (_exists(10), 11),
    (_derived(10), 10),  # derived tables are flattened into the block
    (_viewdefs(10), 11),  # the macro's body is a subquery each
    ("SELECT 1 FROM (t a JOIN t b ON true) JOIN (t c JOIN t d ON true) ON true", 4),
    ("UPDATE t SET a = u.a FROM t u, t w WHERE t.a = u.a", 2),
    ("DELETE FROM t USING t u, t w WHERE t.a = u.a", 2),
    ("INSERT INTO t SELECT u.a FROM t u, t w, t x", 3),
    ("INSERT INTO t VALUES (1), (2), (3)", 0),
    (" UNION ALL ".join(f"SELECT a FROM t WHERE a = {i}" for i in range(100)), 1),
    ("WITH c AS (SELECT * FROM t a, t b) SELECT * FROM c x, c y", 2),  # materialized: a scan
    ("WITH c AS (SELECT * FROM t a, t b) SELECT * FROM c", 2),  # inlined where read once
    (_not_materialized(4), 2**4),  # inlined at each reference: doubles a level
])  # fmt: skip
def test_the_largest_join_graph_and_the_tokens_bound(sql: str, graph: int) -> None:
    bound, counted = _counts(sql)
    assert counted == graph
    assert bound >= counted or inlines_ctes(tables.sql_tokens(sql))


def test_a_table_macro_and_an_aggregate_of_the_same_name_are_told_apart() -> None:
    # DuckDB's table macro ``histogram`` calls the aggregate ``histogram``: counted apart,
    # or the table macro's count would feed itself.
    macros = sandbox.builtin_macro_relations()
    assert 1 < macros.table["histogram"] < LIMIT
    assert "histogram" not in macros.scalar
    sql = "SELECT 1 FROM histogram(t, a) h0 JOIN main.histogram(t, a) h1 ON true"
    assert _counts(sql)[1] == 2 * macros.table["histogram"]
    assert relation_bound(tables.sql_tokens(sql), NO_MACROS) == 3


@pytest.fixture
def sessions(database: Database) -> Iterator[tuple[Session, Session]]:
    admin = database.connect()
    admin.execute("CREATE TABLE t (a INTEGER)")
    admin.execute("INSERT INTO t VALUES (1)")
    admin.execute("GRANT SELECT, INSERT, UPDATE, DELETE ON t TO alice")
    alice = database.connect(Identity("alice", superuser=False))
    yield admin, alice
    alice.close()
    admin.close()


@pytest.mark.parametrize("make", [_chain, _commas, _subqueries, _exists, _derived, _viewdefs])
def test_an_ordinary_users_large_join_is_refused(
    sessions: tuple[Session, Session], make: object
) -> None:
    _, alice = sessions
    assert callable(make)
    small = make(LIMIT // 2 - 1)  # each shape's largest count at the limit's half
    assert alice.execute(small)[-1].table.num_rows == 1
    with pytest.raises(LimitExceededError, match="too complex to plan") as caught:
        alice.execute(make(LIMIT + 1))
    assert caught.value.sqlstate == "54000"


def test_inlined_ctes_and_writes_are_counted_too(sessions: tuple[Session, Session]) -> None:
    _, alice = sessions
    assert alice.execute(_not_materialized(5))[-1].table.num_rows == 1  # 32 relations
    with pytest.raises(LimitExceededError, match="too complex to plan"):
        alice.execute(_not_materialized(7))  # 128: 2 levels more
    sources = ", ".join(f"t u{i}" for i in range(LIMIT + 1))
    with pytest.raises(LimitExceededError, match="too complex to plan"):
        alice.execute(f"UPDATE t SET a = 2 FROM {sources} WHERE t.a = u0.a")
    assert alice.execute("SELECT a FROM t")[-1].table.to_pylist() == [{"a": 1}]  # unchanged


def test_what_is_not_one_join_still_runs(sessions: tuple[Session, Session]) -> None:
    admin, alice = sessions
    union = " UNION ALL ".join(f"SELECT a + {i} AS a FROM t" for i in range(300))
    assert alice.execute(union)[-1].table.num_rows == 300
    ctes = ", ".join(f"c{i} AS (SELECT a FROM t)" for i in range(100))
    reads = " UNION ALL ".join(f"SELECT a FROM c{i}" for i in range(100))
    assert alice.execute(f"WITH {ctes} {reads}")[-1].table.num_rows == 100
    # A superuser is trusted with the planner's time (as with DuckDB's settings).
    assert admin.execute(_chain(LIMIT + 1))[-1].table.num_rows == 1


def test_over_the_wire(wire_server: WireServer) -> None:
    admin = wire_server.login("admin")
    admin.execute("CREATE TABLE t (a INTEGER)")
    admin.execute("INSERT INTO t VALUES (1)")
    admin.execute("GRANT SELECT ON t TO alice")
    alice = wire_server.login()
    for prepare in (False, True):  # the simple and the extended protocol
        with pytest.raises(psycopg.errors.ProgramLimitExceeded, match="too complex"):
            alice.execute(_chain(3 * LIMIT), prepare=prepare)
        assert alice.execute("SELECT a FROM t", prepare=prepare).fetchall() == [(1,)]
