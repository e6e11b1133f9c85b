"""Stars over a relation joined with itself double the columns DuckDB's binder makes at each
level (round 26, H3): ``SELECT *, * FROM (SELECT *, * FROM (... SELECT 1 AS x))`` of 16
levels (317 characters, no privilege needed) took 4 s of bind for 65,536 columns, and the
server then failed with an internal error (XX000) writing their RowDescription; a chain of
CTEs ``a1 AS (FROM a0 x, a0 y), ...`` (FROM-first is ``SELECT *``) of 16 levels took more
than 20 s; naming a FROM item's whole row twice (``SELECT t AS a, t AS b FROM (...) t``, a
struct of all its columns) 20 levels, 5 s and 1.2 GiB, and so did a constructor naming a
column twice (``{'a': x, 'b': x}``, ``row(x, x)``, ``map([x], [x])``: 18 levels 1.2-2.9 s,
0.3-0.4 GiB). An ordinary user's statement whose stars, whole rows and constructors make
more than ``limits.BIND_EXPANSION_NODES_MAX`` type nodes, each
relation's column counted as one, is refused (54000) before DuckDB binds it."""

from __future__ import annotations

import time
from collections.abc import Iterator

import psycopg
import pytest

from engine.database import Database
from engine.identity import Identity
from engine.session import Session
from planner.access import relation_access
from storage.errors import LimitExceededError
from tests.security.conftest import WireServer


def _stars(levels: int, item: str = "*") -> str:
    query = "SELECT 1 AS x"
    for _ in range(levels):
        query = f"SELECT {item}, {item} FROM ({query})"
    return query


def _whole_rows(levels: int) -> str:
    query = "SELECT 1 AS x"
    for _ in range(levels):
        query = f"SELECT t AS a, t AS b FROM ({query}) t"
    return query


def _built(levels: int, constructor: str) -> str:
    query = "SELECT 1 AS x"
    for _ in range(levels):
        query = f"SELECT {constructor} AS x FROM ({query})"
    return query


def _cte_chain(levels: int, body: str = "FROM a{p} x, a{p} y") -> str:
    parts = ["a0 AS (SELECT 1 AS x)"] + [
        f"a{i} AS ({body.format(p=i - 1)})" for i in range(1, levels + 1)
    ]
    return "WITH " + ", ".join(parts) + f" SELECT count(*) AS n FROM a{levels}"


@pytest.fixture
def alice(database: Database) -> Iterator[Session]:
    session = database.connect(Identity("alice", superuser=False))
    yield session
    session.close()


@pytest.mark.parametrize("query", [
    _stars(16), _stars(16, "COLUMNS(*)"), _stars(13, "t.*").replace(")", ") t"),
    _cte_chain(16), _cte_chain(16, "SELECT * FROM a{p} x, a{p} y"),
    f"SELECT count(*) AS n FROM ({_stars(16)})",
    f"SELECT count(*) AS n FROM ({_whole_rows(19)})",  # 18: 1 s, 0.35 GiB; 20: 5 s, 1.2 GiB
    _built(19, "{'a': x, 'b': x}"), _built(19, "row(x, x)"),  # 18: 1.2 s, 0.3 GiB
    _built(18, "map([x], [x])"), _built(18, "list_zip([x], [x])"),
])  # fmt: skip
def test_doubling_stars_are_refused_before_duckdb_binds_them(alice: Session, query: str) -> None:
    started = time.process_time()
    with pytest.raises(LimitExceededError, match="stars are expanded") as caught:
        alice.execute(query)
    assert caught.value.sqlstate == "54000"
    assert time.process_time() - started < 1.0  # 16 levels: 4 s to more than 20 s on main


def test_stars_within_the_bound_still_run(alice: Session) -> None:
    row = alice.execute(f"SELECT count(*) AS n FROM ({_stars(10)})")[-1].table.to_pylist()
    assert row == [{"n": 1}]
    assert alice.execute(_cte_chain(10))[-1].table.to_pylist() == [{"n": 1}]
    rows = alice.execute(f"SELECT count(*) AS n FROM ({_whole_rows(6)})")[-1].table
    assert rows.to_pylist() == [{"n": 1}]
    row = alice.execute("SELECT t AS r FROM (SELECT 1 AS x, 2 AS y) t")[-1].table.to_pylist()
    assert row == [{"r": {"x": 1, "y": 2}}]
    built = alice.execute(f"SELECT count(*) AS n FROM ({_built(6, 'row(x, x)')})")[-1].table
    assert built.to_pylist() == [{"n": 1}]
    # a list of the same column twice does not grow the type: not counted
    assert alice.execute(f"SELECT count(*) AS n FROM ({_built(30, '[x, x]')})")[-1].table.num_rows
    assert relation_access(_built(30, "x + x")).star_columns == 0
    # a wide relation counts as one column: its width was paid for when it was written
    wide = ", ".join(f"{i} AS c{i}" for i in range(3000))
    result = alice.execute(f"SELECT *, * FROM (SELECT {wide})")[-1].table
    assert result.num_columns == 6000


def test_the_count_follows_ctes_unions_and_values() -> None:
    assert relation_access("SELECT * FROM t a JOIN u b ON a.x = b.x").star_columns == 2
    doubled = "WITH c AS (SELECT *, * FROM t) SELECT * FROM c, c d"
    assert relation_access(doubled).star_columns == 2 + 4
    by_name = "SELECT * FROM (SELECT * FROM t UNION BY NAME SELECT * FROM t, t u)"
    assert relation_access(by_name).star_columns == 1 + 2 + 3  # the outer star: both sides
    assert relation_access("SELECT * FROM (VALUES (1, 2, 3)) v(a, b, c)").star_columns == 3


def test_the_stars_are_refused_over_the_wire(wire_server: WireServer) -> None:
    alice = wire_server.login("alice")
    with pytest.raises(psycopg.errors.ProgramLimitExceeded, match="stars are expanded"):
        alice.execute(_stars(16))
    assert len(alice.execute(_stars(8)).fetchone() or ()) == 256


def test_a_result_wider_than_the_protocol_holds_is_a_clean_error(wire_server: WireServer) -> None:
    """Found with the stars: a result of 65,536 columns made the server fail writing its
    RowDescription (struct.error, XX000). Now 54011 before anything of it is sent, in
    both protocols and for COPY TO STDOUT, and the connection goes on (a superuser, whom
    the stars' bound does not stop)."""
    admin = wire_server.login("admin")
    wide = _stars(15)  # 32,768 columns
    with pytest.raises(psycopg.errors.TooManyColumns, match="32767"):
        admin.execute(wide)
    with pytest.raises(psycopg.errors.TooManyColumns):
        admin.execute(wide, prepare=True)
    with (
        pytest.raises(psycopg.errors.TooManyColumns),
        admin.cursor().copy(f"COPY ({wide}) TO STDOUT") as copy,
    ):
        for _ in copy:
            pass
    assert len(admin.execute(_stars(14)).fetchone() or ()) == 16384
