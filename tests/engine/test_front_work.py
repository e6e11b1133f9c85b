"""A statement's front (round 28, H2; ``planner.front_work``, ``engine.interrupts``): its
text is parsed by sqlglot once however many checks read it, no reader changes the shared
tree, and a cancel ends a long front with 57014 before anything of it ran."""

from __future__ import annotations

import tempfile
import threading
import time
from typing import Any

import pytest

import planner.duckdb_sql as duckdb_sql
from engine.database import Database
from engine.identity import Identity
from planner import front_work
from storage import limits
from storage.errors import QueryCanceledError


def _rows(n: int) -> str:
    return ", ".join(f"({i}, 'v{i}')" for i in range(n))


# Past the text caches' bound, so each reader of the text would parse it again.
_ROWS = 5000
_TERMS = 6000
_SHAPES = {
    "insert values": "INSERT INTO t VALUES " + _rows(_ROWS),
    "insert select": "INSERT INTO t SELECT * FROM (VALUES " + _rows(_ROWS) + ") AS v(a, b)",
    "and chain": "SELECT 1 WHERE " + " AND ".join(f"{i} = {i - 1} + 1" for i in range(_TERMS)),
    "in list": "SELECT count(*) FROM t WHERE a IN (" + ", ".join(map(str, range(4 * _TERMS))) + ")",
    "select list": "SELECT " + ", ".join(f"a + {i} AS c{i}" for i in range(_TERMS)) + " FROM t",
    "update": "UPDATE t SET b = 'x' WHERE a IN (" + ", ".join(map(str, range(4 * _TERMS))) + ")",
    "delete": "DELETE FROM t WHERE a IN (" + ", ".join(map(str, range(4 * _TERMS))) + ")",
}


@pytest.fixture
def db() -> Any:
    database = Database.open(tempfile.mkdtemp(), retention_interval_s=None)
    admin = database.connect()
    admin.execute("CREATE TABLE t (a INTEGER, b VARCHAR)")
    admin.execute("GRANT SELECT, INSERT, UPDATE, DELETE ON t TO alice")
    admin.execute("CREATE TOPIC events")
    admin.execute("GRANT SELECT, INSERT ON TOPIC events TO alice")
    return database


def _session(db: Any, user: str) -> Any:
    return db.connect() if user == "super" else db.connect(Identity("alice", superuser=False))


@pytest.mark.parametrize("user", ["alice", "super"])
@pytest.mark.parametrize("shape", sorted(_SHAPES))
def test_a_long_statement_is_parsed_once(db: Any, monkeypatch: Any, shape: str,
                                         user: str) -> None:  # fmt: skip
    """The sandbox, the privilege checks and the planner read one tree of the text (before:
    2-3 sqlglot parses of it a statement)."""
    sql = _SHAPES[shape]
    assert len(sql) > limits.CACHED_TEXT_CHARS_MAX
    parsed: list[str] = []
    real = duckdb_sql._parse_one

    def counted(text: str) -> Any:
        parsed.append(text)
        return real(text)

    monkeypatch.setattr(duckdb_sql, "_parse_one", counted)
    session = _session(db, user)
    session.execute(sql)
    if shape == "insert values":
        # literal rows: sqlglot parses a one-row skeleton, once (``planner.literal_rows``)
        assert parsed.count(sql) == 0
        assert len([text for text in parsed if text.startswith("INSERT INTO t VALUES")]) == 1
    else:
        assert parsed.count(sql) == 1
    if shape.startswith("insert"):
        assert _count(db) == _ROWS


def _count(db: Any) -> int:
    table = db.connect().execute("SELECT count(*) AS n FROM t")[-1].table
    return int(table.to_pylist()[0]["n"])


_TEMPLATES = [
    # a topic read by its plain name: the planner rewrites the statement's tree
    # (``planner.relations._rewrite``), which must not be the tree the door reads
    "SELECT count(*) + {u} FROM events e WHERE e.partition = 0 AND e.offset <> 2",
    "INSERT INTO t SELECT {u}, CAST(data AS VARCHAR) FROM events",
    "TRUNCATE ONLY t",
    "SELECT {u} AS n, * FROM sys.topics",
    "INSERT INTO t VALUES ({u}, 'u'), " + _rows(3000),
]
_unique = iter(range(10**6))


@pytest.mark.parametrize("template", _TEMPLATES)
@pytest.mark.parametrize("user", ["alice", "super"])
def test_no_reader_changes_a_shared_tree(db: Any, monkeypatch: Any, template: str,
                                         user: str) -> None:  # fmt: skip
    """Every tree handed out in a statement's front prints the same after the statement as
    right after its parse (the invariant that makes sharing it sound). Each text is new
    to the process's text caches."""
    sql = template.format(u=next(_unique))
    if sql.startswith("TRUNCATE"):
        sql = (
            "DELETE FROM t WHERE a = " + str(next(_unique))
            if user == "alice"
            else ("TRUNCATE ONLY t /* " + str(next(_unique)) + " */")
        )
    handed: list[tuple[Any, str]] = []
    real = duckdb_sql._parse_spaced  # what the scope's readers get (a literal INSERT's
    # tree is built over a skeleton's parse before it is handed out: ``literal_rows``)

    def kept(text: str) -> Any:
        tree = real(text)
        if tree is not None:
            handed.append((tree, tree.sql(dialect="duckdb")))
        return tree

    monkeypatch.setattr(duckdb_sql, "_parse_spaced", kept)
    _session(db, user).execute(sql)
    assert handed
    for tree, printed in handed:
        assert tree.sql(dialect="duckdb") == printed


def test_a_cancel_ends_a_long_front_with_57014(db: Any) -> None:
    """A cancel while the front works on a ~1.5 MiB INSERT (tens of seconds of parsing and
    checks) ends it within a moment, nothing inserted; the session goes on."""
    session = _session(db, "alice")
    sql = "INSERT INTO t VALUES " + _rows(80_000)
    timer = threading.Timer(0.5, session.cancel)
    started = time.monotonic()
    timer.start()
    try:
        with pytest.raises(QueryCanceledError):
            session.execute(sql)
    finally:
        timer.cancel()
    assert time.monotonic() - started < 6  # the whole front takes >20 s here
    assert _count(db) == 0
    session.execute("INSERT INTO t VALUES (1, 'one')")
    assert _count(db) == 1


def test_a_stop_inside_sqlglots_tokenizer_comes_out_as_raised() -> None:
    """The scope's ``stop`` raising inside sqlglot's tokenizer (which wraps every error in a
    TokenError) or its parser comes out as itself, and ends the parse."""
    sql = "SELECT " + ", ".join(f"'s{i}'" for i in range(20_000))
    for after in (1, 12):  # the tokenizer's first tick; a parser's (~9 ticks a 40k tokens)
        calls = [0]

        def stop(after: int = after, calls: list[int] = calls) -> None:
            calls[0] += 1
            if calls[0] >= after:
                raise QueryCanceledError("stopped")

        with front_work.statement_front(stop), pytest.raises(QueryCanceledError):
            duckdb_sql.parse_duckdb(sql)
        assert calls[0] == after


def test_outside_a_scope_nothing_is_shared() -> None:
    sql = "SELECT 1 AS a"
    assert duckdb_sql.parse_duckdb(sql) is not duckdb_sql.parse_duckdb(sql)
    with front_work.statement_front():
        assert duckdb_sql.parse_duckdb(sql) is duckdb_sql.parse_duckdb(sql)


def test_the_index_answers_as_find_all() -> None:
    """``front_work.find_all`` on a long text's root gives the nodes ``find_all`` gives, in
    its order, from one walk of the tree; on any other tree it is ``find_all`` itself."""
    from sqlglot import expressions as exp

    sql = (
        "WITH c AS (SELECT a FROM t) SELECT x.a, (SELECT max(b) FROM u) FROM c AS x JOIN "
        "v ON x.a = v.a WHERE x.a IN (SELECT a FROM w) AND "
        + " AND ".join(f"x.a <> {i}" for i in range(3000))
    )
    assert len(sql) >= front_work.INDEXED_TEXT_CHARS_MIN
    kinds = ((exp.Table,), (exp.Column, exp.Literal), (exp.Query,), (exp.Expression,))
    with front_work.statement_front():
        tree = duckdb_sql.parse_duckdb(sql)
        for types in kinds:
            indexed = front_work.find_all(tree, *types)
            assert isinstance(indexed, list)  # from the index
            assert [id(n) for n in indexed] == [id(n) for n in tree.find_all(*types)]
        subtree = tree.find(exp.Where)
        assert not isinstance(front_work.find_all(subtree, exp.Column), list)


def _links(tree: Any) -> list[tuple[int, int, str]]:
    """Each node of ``tree`` below its root: the node, its parent and its argument's name."""
    return [(id(node), id(node.parent), node.arg_key) for node in tree.walk() if node is not tree]


def test_no_reader_moves_a_node_of_a_shared_tree(db: Any, monkeypatch: Any) -> None:
    """A node put in a new expression is moved there by sqlglot (its ``parent`` changes)
    though the tree prints the same: no reader of a shared tree may do that either (the
    privilege check of COMMENT ON COLUMN made a table of the column's own identifiers)."""
    from storage.errors import TopicbaseError

    handed: list[tuple[Any, list[tuple[int, int, str]]]] = []
    real = duckdb_sql._parse_one

    def kept(text: str) -> Any:
        tree = real(text)
        if tree is not None:
            handed.append((tree, _links(tree)))
        return tree

    monkeypatch.setattr(duckdb_sql, "_parse_one", kept)
    sql = f"COMMENT ON COLUMN main.t.b IS 'c{next(_unique)}'"
    with pytest.raises(TopicbaseError):  # alice does not own t
        _session(db, "alice").execute(sql)
    assert handed
    for tree, links in handed:
        assert _links(tree) == links
