"""DuckDB's predicate rewrites take time quadratic in a statement's predicates and no
interrupt stops them (round 26-27: ``(a = i AND b = i) OR …`` of 2,000 disjuncts 7.5 s,
8,000 169 s; ``a <> i AND …`` of 2,000 3.3 s). An ordinary user's statement past
``PREDICATE_DISJUNCT_TERMS_MAX`` (the terms of the conjunctions one OR joins) or
``PREDICATE_FILTER_CONJUNCTS_MAX`` (filter conjuncts that are not plain comparisons) is
refused (54000) before DuckDB plans it (``planner.predicate_rewrites``,
``engine.sandbox.refuse_costly_predicates``); the cheap shapes ORMs send still run at any
size."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import psycopg
import pytest

from engine import tables
from engine.database import Database
from engine.identity import Identity
from engine.session import Session
from planner.duckdb_sql import parse_duckdb
from planner.predicate_rewrites import predicate_bound, predicate_work
from storage.errors import LimitExceededError
from storage.limits import PREDICATE_DISJUNCT_TERMS_MAX, PREDICATE_FILTER_CONJUNCTS_MAX
from tests.security.conftest import WireServer

TERMS = PREDICATE_DISJUNCT_TERMS_MAX
CONJUNCTS = PREDICATE_FILTER_CONJUNCTS_MAX


def _ors(pairs: int, columns: str = "ab") -> str:
    return " OR ".join(
        "(" + " AND ".join(f"{column} = {i}" for column in columns) + ")" for i in range(pairs)
    )


def _where(conjunct: Callable[[int], str], n: int) -> str:
    return "SELECT a FROM t WHERE " + " AND ".join(conjunct(i) for i in range(n))


# Shapes of the OR'd conjunctions, each by its count of terms.
def _or_of_pairs(terms: int) -> str:
    return f"SELECT a FROM t WHERE {_ors(terms // 2)}"


def _or_of_triples(terms: int) -> str:
    return f"SELECT a FROM t WHERE {_ors(terms // 3, 'abc')}"


def _nested(terms: int) -> str:
    groups = [_ors(10)] * (terms // 20)  # parentheses do not part one OR
    return "SELECT a FROM t WHERE " + " OR ".join(f"({group})" for group in groups)


def _having(terms: int) -> str:
    return f"SELECT a, b FROM t GROUP BY a, b HAVING {_ors(terms // 2)}"


def _join_on(terms: int) -> str:
    ors = _ors(terms // 2).replace("a =", "t.a =").replace("b =", "t.b =")
    return f"SELECT t.a FROM t JOIN t u ON u.a = t.a AND ({ors})"


def _in_subquery(terms: int) -> str:
    return f"SELECT a FROM t WHERE a IN (SELECT a FROM t WHERE {_ors(terms // 2)})"


def _items(terms: int) -> str:
    # Boolean SELECT items DuckDB puts in place of the columns the OR names.
    items = ", ".join(f"(a = {i} AND b = {i}) AS c{i}" for i in range(terms // 2))
    ors = " OR ".join(f"c{i}" for i in range(terms // 2))
    return f"SELECT a FROM (SELECT a, {items} FROM t) s WHERE {ors}"


# Shapes of the filter conjuncts, each by its count.
def _unequal(n: int) -> str:
    return _where(lambda i: f"a <> {i + 5}", n)  # (t's row has a = 1)


def _not_equal(n: int) -> str:
    return _where(lambda i: f"NOT (a = {i})", n)


def _distinct(n: int) -> str:
    return _where(lambda i: f"a IS DISTINCT FROM {i}", n)


def _not_in_pairs(n: int) -> str:
    return _where(lambda i: f"a NOT IN ({2 * i}, {2 * i + 1})", n)


def _not_between(n: int) -> str:
    return _where(lambda i: f"a NOT BETWEEN {2 * i} AND {2 * i}", n // 2)


def _not_like(n: int) -> str:
    return _where(lambda i: f"s NOT LIKE 'x{i}%'", n)


def _in_lists(n: int) -> str:
    return _where(lambda i: f"a IN ({i}, {i + 1})", n)


def _calls(n: int) -> str:
    return _where(lambda i: f"starts_with(s, 'x{i}')", n)


def _or_conjuncts(n: int) -> str:
    return _where(lambda i: f"(a = {i} OR b = {i})", n)


def _not_of_or(n: int) -> str:  # DuckDB's DeMorgan: a conjunct per disjunct
    return "SELECT a FROM t WHERE NOT (" + " OR ".join(f"a = {i}" for i in range(n)) + ")"


def _cte_chain(n: int) -> str:  # one WHERE each, pushed into one scan
    ctes = ", ".join(f"c{i} AS (SELECT * FROM c{i - 1} WHERE a <> {i})" for i in range(1, n))
    return f"WITH c0 AS (SELECT * FROM t WHERE a <> 0), {ctes} SELECT a FROM c{n - 1}"


def _in_projection(n: int) -> str:
    items = ", ".join(f"a <> {i} AS c{i}" for i in range(n))
    ands = " AND ".join(f"c{i}" for i in range(n))
    return f"SELECT a FROM (SELECT a, {items} FROM t) s WHERE {ands}"


OR_SHAPES = [_or_of_pairs, _or_of_triples, _nested, _having, _join_on, _in_subquery, _items]
FILTER_SHAPES = [
    _unequal, _not_equal, _distinct, _not_in_pairs, _not_between, _not_like, _in_lists,
    _calls, _or_conjuncts, _not_of_or, _cte_chain, _in_projection,
]  # fmt: skip

# What an ORM sends, cheap to plan at any size (round 27: 10,000 ``a = i OR …`` 0.1 s,
# an IN list of 10,000 0.07 s).
ORM_SHAPES = [
    "SELECT a FROM t WHERE " + " OR ".join(f"a = {i}" for i in range(10_000)),
    "SELECT a FROM t WHERE a IN (" + ", ".join(str(i) for i in range(10_000)) + ")",
    "SELECT a FROM t WHERE a NOT IN (" + ", ".join(str(i + 5) for i in range(10_000)) + ")",
    f"SELECT a FROM t WHERE {_ors(40)}",
    "SELECT a FROM t WHERE (" + " OR ".join(f"a = {i}" for i in range(5_000)) + ") AND b = 1",
    "SELECT a FROM t WHERE " + " AND ".join(f"a < {i + 100} AND a > {-i}" for i in range(500)),
    "SELECT a FROM t WHERE " + " AND ".join(f"a + {i} >= 0" for i in range(1_000)),
    "SELECT a FROM t WHERE " + " AND ".join(f"s IS NOT NULL AND b = {i % 3 + 1}" for i in range(3)),
]


def _work(sql: str) -> tuple[int, int]:
    tree = parse_duckdb(sql)
    assert tree is not None
    counted = predicate_work(tree)
    bound = predicate_bound(tables.sql_tokens(sql))
    assert bound.disjunct_terms >= counted.disjunct_terms
    assert bound.filter_conjuncts >= counted.filter_conjuncts
    return counted.disjunct_terms, counted.filter_conjuncts


@pytest.mark.parametrize("make", OR_SHAPES)
def test_the_terms_of_ored_conjunctions_are_counted(make: Callable[[int], str]) -> None:
    assert _work(make(120))[0] == 120


@pytest.mark.parametrize("make", FILTER_SHAPES)
def test_the_conjuncts_of_filters_are_counted(make: Callable[[int], str]) -> None:
    assert _work(make(60))[1] in (60, 61)  # (a subquery's own WHERE, a CTE's chain: +1)


@pytest.mark.parametrize("sql", ORM_SHAPES)
def test_cheap_predicates_count_little_and_mostly_end_at_the_tokens(sql: str) -> None:
    terms, conjuncts = _work(sql)
    assert terms <= 80 and conjuncts <= 1
    bound = predicate_bound(tables.sql_tokens(sql))
    long_and = sql.count(" AND ") > CONJUNCTS // 2
    assert long_and or (bound.disjunct_terms <= TERMS and bound.filter_conjuncts <= CONJUNCTS)


@pytest.fixture
def sessions(database: Database) -> Iterator[tuple[Session, Session]]:
    admin = database.connect()
    admin.execute("CREATE TABLE t (a INTEGER, b INTEGER, c INTEGER, s VARCHAR)")
    admin.execute("INSERT INTO t VALUES (1, 1, 1, 'y1')")
    admin.execute("GRANT SELECT ON t TO alice")
    admin.execute("GRANT CREATE ON SCHEMA main TO alice")
    alice = database.connect(Identity("alice", superuser=False))
    yield admin, alice
    alice.close()
    admin.close()


def _refused(session: Session, sql: str) -> None:
    with pytest.raises(LimitExceededError, match="too complex to plan") as caught:
        session.execute(sql)
    assert caught.value.sqlstate == "54000"


@pytest.mark.parametrize("make", OR_SHAPES)
def test_an_ordinary_users_large_or_of_conjunctions_is_refused(
    sessions: tuple[Session, Session], make: Callable[[int], str]
) -> None:
    _, alice = sessions
    alice.execute(make(TERMS // 2))  # runs
    _refused(alice, make(TERMS + 20))


@pytest.mark.parametrize("make", FILTER_SHAPES)
def test_an_ordinary_users_many_filter_conjuncts_are_refused(
    sessions: tuple[Session, Session], make: Callable[[int], str]
) -> None:
    _, alice = sessions
    alice.execute(make(CONJUNCTS // 2))  # runs
    _refused(alice, make(CONJUNCTS + 2))


def test_several_ors_count_together(sessions: tuple[Session, Session]) -> None:
    # Each OR's rewrite is quadratic in its terms: k ORs of n terms count as one of
    # n * sqrt(k), which takes as long as all of them.
    _, alice = sessions
    three_quarters = _ors(TERMS * 3 // 8)  # 3/4 of the limit in terms
    union = f"SELECT a FROM t WHERE {_ors(30)} UNION SELECT a FROM t WHERE {_ors(40)}"
    assert _work(union)[0] == 100  # sqrt(60^2 + 80^2)
    alice.execute(f"SELECT a FROM t WHERE {three_quarters}")
    _refused(alice, f"SELECT a FROM t WHERE ({three_quarters}) AND ({three_quarters})")


def test_what_an_orm_sends_still_runs(sessions: tuple[Session, Session]) -> None:
    _, alice = sessions
    for sql in ORM_SHAPES:
        assert alice.execute(sql)[-1].table.num_rows <= 1


def test_views_prepared_statements_and_topics_are_counted(
    sessions: tuple[Session, Session],
) -> None:
    admin, alice = sessions
    # A view's query is judged when it is created; a PREPARE's statement in it.
    _refused(alice, f"CREATE VIEW v AS {_unequal(CONJUNCTS + 2)}")
    _refused(alice, f"PREPARE p AS {_or_of_pairs(TERMS + 20)}")
    alice.execute(f"PREPARE q AS {_unequal(CONJUNCTS // 2)} AND b <> ?")
    assert alice.execute("EXECUTE q(2)")[-1].table.num_rows == 1
    # A topic read is DuckDB SQL over the topic's scan, the user's predicates in it.
    admin.execute("CREATE TOPIC events")
    admin.execute("INSERT INTO TOPIC events (data) VALUES ('m')")
    admin.execute("GRANT SELECT ON TOPIC events TO alice")
    unequal = " AND ".join(f"data <> 'x{i}'" for i in range(CONJUNCTS + 2))
    _refused(alice, f"SELECT data FROM events WHERE {unequal}")
    half = " AND ".join(f"data <> 'x{i}'" for i in range(CONJUNCTS // 2))
    assert alice.execute(f"SELECT data FROM events WHERE {half}")[-1].table.num_rows == 1


def test_the_filters_of_the_views_read_are_counted_with_the_statements(
    sessions: tuple[Session, Session],
) -> None:
    # DuckDB pushes a view's filters down with the statement's and combines them: 16 views
    # each adding 256 ``<>`` (each allowed alone) took 13.9 s (round 27).
    admin, alice = sessions
    third = CONJUNCTS // 3 + 1

    def unequal(source: str, first: int) -> str:
        ands = " AND ".join(f"a <> {first + i}" for i in range(third))
        return f"SELECT * FROM {source} WHERE {ands}"

    alice.execute(f"CREATE VIEW v0 AS {unequal('t', 10)}")
    alice.execute(f"CREATE VIEW v1 AS {unequal('v0', 1_000)}")  # 2 thirds
    assert alice.execute("SELECT a FROM v1")[-1].table.num_rows == 1
    _refused(alice, unequal("v1", 2_000))
    alice.execute(f"CREATE VIEW v2 AS {unequal('v1', 2_000)}")  # bound, not planned
    _refused(alice, "SELECT a FROM v2")
    _refused(alice, "SELECT x.a FROM v1 x JOIN v1 y ON x.a = y.a")  # a view read twice
    admin.execute(f"CREATE VIEW w2 AS {unequal('v1', 2_000)}")
    admin.execute("GRANT SELECT ON w2 TO alice")
    assert admin.execute("SELECT a FROM w2")[-1].table.num_rows == 1
    _refused(alice, "SELECT a FROM w2")


def test_a_superuser_is_trusted_with_the_planners_time(
    sessions: tuple[Session, Session],
) -> None:
    admin, _ = sessions
    assert admin.execute(_or_of_pairs(TERMS + 20))[-1].table.num_rows == 1
    assert admin.execute(_unequal(CONJUNCTS + 2))[-1].table.num_rows == 1


def test_over_the_wire(wire_server: WireServer) -> None:
    admin = wire_server.login("admin")
    admin.execute("CREATE TABLE t (a INTEGER, b INTEGER)")
    admin.execute("INSERT INTO t VALUES (1, 1)")
    admin.execute("GRANT SELECT ON t TO alice")
    alice = wire_server.login()
    for prepare in (False, True):  # the simple and the extended protocol
        for sql in (_or_of_pairs(TERMS + 20), _unequal(CONJUNCTS + 2)):
            with pytest.raises(psycopg.errors.ProgramLimitExceeded, match="too complex"):
                alice.execute(sql, prepare=prepare)
        assert alice.execute(_unequal(CONJUNCTS // 2), prepare=prepare).fetchall() == [(1,)]
        assert alice.execute("SELECT a FROM t", prepare=prepare).fetchall() == [(1,)]
