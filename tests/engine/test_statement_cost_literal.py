"""A SELECT of literals and parameters alone runs on the thread's empty DuckDB database
without a worker thread (``tables.literal_cursor``, ``Session._query_cursor``): the same
results, errors and SQLSTATEs as on the session's own connection; statements that call a
function or an operator (a user's macro can shadow both) keep the session's connection."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from sqlglot import expressions as exp

from engine import tables
from engine.database import Database
from engine.session import Session, SessionState
from planner.duckdb_sql import parse_duckdb
from planner.literal_select import is_literal_select
from storage import limits
from storage.errors import TopicbaseError
from tests.literal_statements import positional, streamed

LITERAL_TEXTS: list[tuple[str, Any]] = [
    ("SELECT 1", None),
    ("select 1 AS ok", None),
    ("SELECT -1 AS x, 'a' b, NULL, TRUE, false", None),
    ('SELECT 0.1, 1e3, -2.5e-3 AS "Mixed Case", 9223372036854775808', None),
    ("SELECT 99999999999999999999999999999999999999999, 1e400", None),
    ("SELECT '' AS empty, 'it''s', 'ü €', 'a\nb', '\x00'", None),
    ("SELECT $1, $2 AS two, $1", [7, "x"]),
    ("SELECT ?, ?", [b"\x00\xff", 2.5]),
    ("SELECT $1", [None]),
    ("SELECT $1 AS big", [2**70]),
    ("SELECT 1 -- a comment\n, /* another */ 2", None),
]
ERROR_TEXTS: list[tuple[str, Any]] = [
    ("SELECT $1", None),
    ("SELECT $2", [1]),
    ("SELECT $1", [1, 2]),
    ("SELECT ?", {"a": 1}),
]


@pytest.fixture
def literal_runs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The texts run on ``tables.literal_cursor``'s connection, in order."""
    taken: list[str] = []
    original = Session._query_cursor

    def spying(self: Session, operation: Any) -> Any:
        cursor = original(self, operation)
        if cursor is tables.literal_cursor():
            taken.append(operation.sql)
        return cursor

    monkeypatch.setattr(Session, "_query_cursor", spying)
    original_stream = Session._literal_stream

    def spying_stream(self: Session, plan: Any, operation: Any, parameters: Any) -> Any:
        taken.append(operation.sql)
        return original_stream(self, plan, operation, parameters)

    monkeypatch.setattr(Session, "_literal_stream", spying_stream)
    original_result = tables.literal_result

    def spying_result(sql: str, parameters: Any, *, line_offset: int = 0) -> Any:
        taken.append(sql)
        return original_result(sql, parameters, line_offset=line_offset)

    monkeypatch.setattr(tables, "literal_result", spying_result)
    # Every run runs in DuckDB: its ways are what these tests compare (the results kept
    # by text are tests/engine/test_literal_results_kept.py's).
    monkeypatch.setattr(limits, "LITERAL_RESULT_TEXT_CHARS_MAX", 0)
    return taken


@pytest.fixture(scope="module")
def literal_database(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Database]:
    """One database for the cases below that only run literal SELECTs (on sessions of
    their own, a new one for each way): they create nothing in it, and what a session
    keeps (plans, learnt shapes) is its own or emptied by ``_three_runs``."""
    opened = Database.open(str(tmp_path_factory.mktemp("literal") / "data"))
    yield opened
    opened.close()


def _outcome(session: Session, sql: str, parameters: Any) -> Any:
    try:
        result = session.execute(sql, parameters)[-1]
    except TopicbaseError as error:
        return ("error", type(error).__name__, error.sqlstate, error.message)
    table = result.table
    assert table is not None
    return (result.tag, table.schema, table.schema.metadata, positional([table]))


def _three_runs(session: Session, run: Any, sql: str, rows_way: list[str]) -> list[Any]:
    """Three runs of ``sql`` by ``run`` with nothing learnt of it before: the first takes
    DuckDB's relation; the next two the rows' way (the third from a kept plan when it has
    no parameters) if the result's types are all plain, else the relation again."""
    tables._small_results.clear()
    rows_way.clear()
    outcomes = [run(session)]
    assert rows_way == []
    outcomes += [run(session), run(session)]
    assert rows_way in ([], [sql, sql])
    return outcomes


def _on_the_session_s_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tables, "literal_tokens", lambda sql: False)


@pytest.mark.parametrize(("sql", "parameters"), LITERAL_TEXTS + ERROR_TEXTS)
def test_literal_selects_give_what_the_session_s_connection_gives(
    literal_database: Database, literal_runs: list[str], rows_way: list[str], sql: str,
    parameters: Any,
) -> None:
    def run(session: Session) -> Any:
        return _outcome(session, sql, parameters)

    mine = _three_runs(literal_database.connect(), run, sql, rows_way)
    assert literal_runs == [sql] * 3
    with pytest.MonkeyPatch.context() as patch:
        _on_the_session_s_connection(patch)
        theirs = _three_runs(literal_database.connect(), run, sql, rows_way)
    assert mine == theirs
    assert literal_runs == [sql] * 3  # the other session ran none there


@pytest.mark.parametrize("whole", [True, False])
@pytest.mark.parametrize(("sql", "parameters"), LITERAL_TEXTS + ERROR_TEXTS)
def test_literal_selects_stream_as_on_the_session_s_connection(
    literal_database: Database, literal_runs: list[str], rows_way: list[str], sql: str,
    parameters: Any, whole: bool,
) -> None:
    def run(session: Session) -> Any:
        return streamed(session, sql, parameters, whole)

    session = literal_database.connect()
    mine = _three_runs(session, run, sql, rows_way)
    assert literal_runs == [sql] * 3
    with pytest.MonkeyPatch.context() as patch:
        _on_the_session_s_connection(patch)
        theirs = _three_runs(literal_database.connect(), run, sql, rows_way)
    assert mine == theirs
    session.execute("BEGIN")  # an error in a transaction fails it, as a stream's does
    session.execute("SELECT 1")  # opens its DuckDB transaction
    outcome = streamed(session, sql, parameters, whole)
    assert (session.state is SessionState.FAILED) == (outcome[0] == "error")


@pytest.mark.parametrize("sql", ["SELECT 1", "SELECT 'a' AS x, 2, TRUE", "SELECT -5 n"])
def test_plain_literal_selects_take_the_rows_way_after_their_first_run(
    literal_database: Database, literal_runs: list[str], rows_way: list[str], sql: str
) -> None:
    for literal in (True, False):
        with pytest.MonkeyPatch.context() as patch:
            if not literal:
                _on_the_session_s_connection(patch)
            _three_runs(literal_database.connect(), lambda s: _outcome(s, sql, None), sql, rows_way)
        assert rows_way == [sql, sql]
    assert literal_runs == [sql] * 3


def test_the_session_s_connection_keeps_no_plan_and_its_catalog_version(
    session: Session, literal_runs: list[str]
) -> None:
    version = session.catalog_version()
    for _ in range(5):
        assert session.execute("SELECT 42 AS answer")[0].table.to_pylist() == [{"answer": 42}]
    assert literal_runs == ["SELECT 42 AS answer"] * 5
    assert tables._plans_of(session._cursor).name("SELECT 42 AS answer") is None
    assert tables._plans_of(tables.literal_cursor()).name("SELECT 42 AS answer") is not None
    assert session.catalog_version() == version


def test_macros_that_shadow_operators_and_functions_still_apply(
    session: Session, literal_runs: list[str]
) -> None:
    """``+``, a unary ``-`` and functions are looked up in the catalog: a user's macro of
    that name wins over the built-in one, so such statements stay on the session's
    connection. A minus sign before a number is folded into the constant by DuckDB."""
    session.execute('CREATE MACRO "+"(a, b) AS 42')
    session.execute('CREATE MACRO "-"(a) AS 99')
    session.execute("CREATE MACRO abs(a) AS 7")
    session.execute("CREATE TYPE mood AS ENUM ('sad', 'ok')")
    for _ in range(3):
        assert session.execute("SELECT 1 + 1 AS v")[0].table.to_pylist() == [{"v": 42}]
        assert session.execute("SELECT -$1 AS v", [5])[0].table.to_pylist() == [{"v": 99}]
        assert session.execute("SELECT abs(-1) AS v")[0].table.to_pylist() == [{"v": 7}]
        mood = session.execute("SELECT 'ok'::mood AS v")[0].table
        assert mood.to_pylist() == [{"v": "ok"}]
        assert session.execute("SELECT -1 AS v")[0].table.to_pylist() == [{"v": -1}]
    assert literal_runs == ["SELECT -1 AS v"] * 3


def test_an_explicit_transaction_s_first_statement_opens_its_duckdb_transaction(
    session: Session, literal_runs: list[str]
) -> None:
    session.execute("BEGIN")
    session.execute("SELECT 1")
    assert session.transaction is not None and session.transaction.duckdb_open
    assert literal_runs == []
    session.execute("SELECT 1")  # its DuckDB transaction is open: nothing to take
    assert literal_runs == ["SELECT 1"]
    session.execute("COMMIT")
    session.execute("SELECT 1")
    assert literal_runs == ["SELECT 1"] * 2


def test_an_error_fails_the_transaction_as_on_the_session_s_connection(
    session: Session, literal_runs: list[str]
) -> None:
    session.execute("CREATE TABLE t (k INTEGER)")
    session.execute("BEGIN")
    session.execute("INSERT INTO t VALUES (1)")
    with pytest.raises(TopicbaseError) as raised:
        session.execute("SELECT $1")
    assert raised.value.sqlstate == "22P02"
    assert literal_runs == ["SELECT $1"]
    with pytest.raises(TopicbaseError) as refused:
        session.execute("SELECT 1")
    assert refused.value.sqlstate == "25P02"
    session.execute("COMMIT")  # rolls the failed transaction back
    assert session.execute("SELECT count(*) AS n FROM t")[0].table.to_pylist() == [{"n": 0}]


@pytest.mark.parametrize(
    "sql",
    ["SELECT 1", "SELECT -1 AS x, 'a' b", "SELECT $1, ?", "SELECT NULL, TRUE, FALSE",
     'SELECT 1 AS "select"'],
)  # fmt: skip
def test_literal_texts(sql: str) -> None:
    tree = parse_duckdb(sql)
    assert tree is not None and is_literal_select(tree)
    assert tables.literal_tokens(sql)


@pytest.mark.parametrize(
    "sql",
    ["SELECT 1 + 1", "SELECT -$1", "SELECT abs(1)", "SELECT 1::INTEGER", "SELECT CAST(1 AS INT)",
     "SELECT (1)", "SELECT 'a' || 'b'", "SELECT 1 = 1", "SELECT 1 FROM t", "SELECT 1 WHERE true",
     "SELECT DISTINCT 1", "SELECT 1 LIMIT 1", "SELECT 1 ORDER BY 1", "SELECT x",
     "SELECT 1 UNION SELECT 2", "WITH a AS (SELECT 1) SELECT 1", "SELECT *", "SELECT -'1'",
     "SELECT DATE '2020-01-01'", "SELECT INTERVAL 1 DAY", "SELECT t.x", "SELECT [1]",
     "SELECT {'a': 1}", "SELECT current_date", "SELECT 1 AS a, a", "VALUES (1)"],
)  # fmt: skip
def test_texts_that_are_not_literal_selects(sql: str) -> None:
    tree = parse_duckdb(sql)
    assert tree is None or not is_literal_select(tree) or not tables.literal_tokens(sql)


@pytest.mark.parametrize(
    "sql",
    ["SELECT 1;", "SELECT $x", "SELECT - $1", "SELECT 1::int", "SELECT current_date",
     "SELECT 1 FROM t", "VALUES (1)", "SELECT a.b", "SELECT 1 + 1", "SELECT -", "SELECT $",
     "SELECT x", "SELECT x AS y", "SELECT 1 AS", "SELECT 1 a b", "SELECT 1 AS x AS y",
     "SELECT , 1", "SELECT 1,", "SELECT AS x", "SELECT", "SELECT 1 2", "SELECT $1 $2"],
)  # fmt: skip
def test_duckdb_s_tokens_refuse_anything_but_literals(sql: str) -> None:
    assert not tables.literal_tokens(sql)


def test_duckdb_s_tokens_of_literal_selects() -> None:
    for sql in ["SELECT 1 a, 2 AS b, -3", "SELECT $12 AS p, ?, NULL n, TRUE, FALSE AS f",
                "select 'x' \"quoted name\", 1e3 -- c"]:  # fmt: skip
        assert tables.literal_tokens(sql), sql


def test_the_planner_marks_only_literal_selects() -> None:
    assert is_literal_select(exp.select("1"))
    assert not is_literal_select(exp.select("1").from_("t"))
    assert not is_literal_select(exp.select("f(1)"))


def test_threads_share_one_literal_database() -> None:
    """Each thread gets a cursor of one process-wide database, not a database of its own
    (with DuckDB's native threads each: review R5-2)."""
    import os
    import threading

    def native_threads() -> int:
        return len(os.listdir("/proc/self/task"))

    tables.query_rows(tables.literal_cursor(), "SELECT 1")
    before = native_threads()
    release = threading.Event()
    answers: list[Any] = []

    def client() -> None:
        answers.append(tables.query_rows(tables.literal_cursor(), "SELECT 7 AS seven"))
        release.wait()

    clients = [threading.Thread(target=client) for _ in range(20)]
    for thread in clients:
        thread.start()
    while len(answers) < len(clients):
        threading.Event().wait(0.01)
    grown = native_threads() - before
    release.set()
    for thread in clients:
        thread.join()
    assert grown <= len(clients) + 2  # the client threads themselves
    assert all(table.num_rows == 1 for table in answers)
