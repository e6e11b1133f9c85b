"""Deep nesting is 54001 ("statement too complex"), never a RecursionError or a crash;
ordinary depth (100 nested parentheses, as PostgreSQL runs) works.

Every place that recurses is tried: Topicbase's pre-scan (``grammar.split``), the Lark
grammar (topic statements), sqlglot (the planner), DuckDB's parser and binder (its fixed
``max_expression_depth``) and Arrow (deeply nested result types); engine-level and over
the wire, where the issue saw the server crash.
"""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from engine.database import Database
from engine.session import Session
from grammar.split import check_complexity, split_statements
from storage import limits
from storage.errors import StatementTooComplexError, TopicbaseError
from tests.security.conftest import ADMIN, WireServer

DEPTH = limits.NESTING_DEPTH_MAX


def parens(depth: int) -> str:
    return "(" * depth + "1" + ")" * depth


@pytest.fixture(scope="module")
def database(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Database]:
    """One database for the module's sessions (each test has a session of its own): the
    tests only read or see statements refused; at the end ``t`` and ``ev`` are unchanged
    and no topic was added."""
    opened = Database.open(str(tmp_path_factory.mktemp("nesting") / "data"),
                           retention_interval_s=None)  # fmt: skip
    admin = opened.connect()
    admin.execute("CREATE TOPIC ev; CREATE TABLE t (a INT); INSERT INTO t VALUES (1)")
    admin.close()
    yield opened
    admin = opened.connect()
    assert admin.execute("SELECT a FROM t")[-1].table.to_pylist() == [{"a": 1}]
    assert admin.execute("SELECT count(*) AS n FROM TOPIC ev")[-1].table.to_pylist() == [
        {"n": 0}
    ]
    assert admin.execute("SELECT name FROM sys.topics")[-1].table.to_pylist() == [
        {"name": "ev"}
    ]
    admin.close()
    opened.close()


@pytest.fixture
def session(database: Database) -> Iterator[Session]:
    opened = database.connect()
    yield opened
    opened.close()


# Statements of ordinary depth, with the single value each returns.
ORDINARY = [
    (f"SELECT {parens(100)}", 1),
    (f"SELECT {parens(DEPTH)}", 1),
    ("SELECT * FROM " + "(SELECT * FROM " * 100 + "t" + ") x" * 100, 1),
    ("SELECT " + "CASE WHEN a > 0 THEN " * 100 + "1" + " END" * 100 + " FROM t", 1),
    ("SELECT " + "NOT " * 500 + "true", True),
    ("SELECT count(*) FROM t WHERE " + " AND ".join(["a > 0"] * 2000), 1),
    (" UNION ALL ".join(["SELECT 1"] * 300) + " ORDER BY 1 LIMIT 1", 1),
    ("SELECT '" + "(" * 5000 + "' IS NOT NULL", True),  # inside a string: no nesting
    ("SELECT 1 -- " + "(" * 5000, 1),  # inside a comment
]
# Too deep for one of the parsers, each 54001.
TOO_DEEP = [
    f"SELECT {parens(DEPTH + 1)}",
    f"SELECT {parens(100_000)}",
    "SELECT " + "[" * 300 + "1" + "]" * 300,
    "SELECT " + "{'a': " * 300 + "1" + "}" * 300,
    "SELECT " + "CASE WHEN true THEN " * 300 + "1" + " END" * 300,
    "SELECT * FROM " + "(SELECT * FROM " * 300 + "t" + ") x" * 300,
    "SELECT " + "NOT " * 5000 + "true",  # no brackets: sqlglot's recursion, caught
    "SELECT " + "- " * 5000 + "1",
    "SELECT " + "1+" * 5000 + "1",  # DuckDB's own expression depth
    "SELECT 1" + "::INT" * 3000,
    " UNION ALL ".join(["SELECT 1"] * (limits.SET_OPERATIONS_MAX + 2)),
    "SELECT " + "[" * 150 + "1" + "]" * 150,  # fine to parse; Arrow cannot hold the type
    f"INSERT INTO TOPIC ev (data) SELECT CAST({parens(5000)} AS VARCHAR)",
    f"SELECT {parens(300)} FROM TOPIC ev",
    f"CREATE TOPIC deep WITH (min_active_partitions = {parens(300)})",
    f"EXPLAIN SELECT {parens(300)}",
    f"SELECT {parens(300)}; SELECT 1",
]


@pytest.mark.parametrize(("sql", "value"), ORDINARY, ids=[s[:40] for s, _ in ORDINARY])
def test_ordinary_depth_works(session: Session, sql: str, value: object) -> None:
    result = session.execute(sql)[-1]
    assert result.table is not None
    assert result.table.column(0)[0].as_py() == value


@pytest.mark.parametrize("sql", TOO_DEEP, ids=[s[:40] for s in TOO_DEEP])
def test_too_deep_is_54001_and_the_session_goes_on(session: Session, sql: str) -> None:
    with pytest.raises(StatementTooComplexError) as caught:
        session.execute(sql)
    assert caught.value.sqlstate == "54001"
    assert "statement too complex" in caught.value.message
    assert session.execute("SELECT 41 + 1")[0].table.column(0)[0].as_py() == 42


def test_too_deep_inside_a_transaction_fails_it_like_any_error(session: Session) -> None:
    session.execute("BEGIN")
    with pytest.raises(StatementTooComplexError):
        session.execute(f"SELECT {parens(DEPTH + 1)}")
    with pytest.raises(TopicbaseError) as caught:
        session.execute("SELECT 1")
    assert caught.value.sqlstate == "25P02"
    session.execute("ROLLBACK")


def test_the_prescan_names_the_place() -> None:
    sql = "SELECT 1;\nSELECT " + parens(DEPTH + 1)
    with pytest.raises(StatementTooComplexError) as caught:
        split_statements(sql)
    assert caught.value.context["line"] == 2
    assert f"more than {DEPTH} nested levels" in caught.value.message


def test_the_prescan_skips_strings_identifiers_comments_and_dollar_quotes() -> None:
    from grammar.split import SourceText

    deep = "(" * (DEPTH + 50)
    hidden = (f"SELECT '{deep}'", f'SELECT 1 AS "{deep}"', f"SELECT 1 /* {deep} */",
              f"SELECT $${deep}$$", f"SELECT $tag${deep}$tag$", f"SELECT e'\\'{deep}'")
    for sql in hidden:
        check_complexity(SourceText(sql), 0, len(sql))  # no error


# Ways to hide depth from a scan that does not read strings, identifiers and comments
# as the parsers do; each is still too deep.
EVASIONS = {
    "closers in strings": "SELECT " + "(')' " * 300 + "1" + ")" * 300,
    "closers in identifiers": "SELECT " + '(")" ' * 300 + "1" + ")" * 300,
    "closers in comments": "SELECT " + "(-- )\n" * 300 + "1" + ")" * 300,
    "closers in block comments": "SELECT " + "(/* ) */ " * 300 + "1" + ")" * 300,
    "stray closers first": "SELECT " + ")" * 500 + "(" * 300 + "1" + ")" * 300,
    "END in strings": "SELECT " + "CASE WHEN 'end' = 'x' THEN " * 300 + "1" + " END" * 300,
    "mixed brackets": "SELECT " + "[{(" * 70 + "1" + ")}]" * 70,
}


@pytest.mark.parametrize("sql", EVASIONS.values(), ids=EVASIONS.keys())
def test_hidden_depth_is_still_found(sql: str) -> None:
    from grammar.split import SourceText

    with pytest.raises(StatementTooComplexError):
        check_complexity(SourceText(sql), 0, len(sql))


def test_long_values_lists_are_not_too_complex() -> None:
    from grammar.split import SourceText

    rows = ", ".join(f"('message ({index}', {index})" for index in range(20_000))
    sql = f"INSERT INTO TOPIC ev (data, seq_no) VALUES {rows}"
    check_complexity(SourceText(sql), 0, len(sql))
    words = " UNION ALL ".join(["SELECT 'union except intersect'"] * 500)
    check_complexity(SourceText(words), 0, len(words))


def test_raising_duckdb_expression_depth_is_refused_so_deep_expressions_cannot_crash(
    session: Session,
) -> None:
    # The crash: SET max_expression_depth huge, then a deep expression.
    with pytest.raises(TopicbaseError) as caught:
        session.execute("SET max_expression_depth = 1000000")
    assert caught.value.sqlstate == "42501"
    with pytest.raises(StatementTooComplexError):
        session.execute("SELECT " + "1+" * 20_000 + "1")
    assert session.execute("SELECT 1")[0].table is not None


def test_deep_nesting_over_the_wire_is_54001_and_the_server_keeps_serving(
    wire_server: WireServer,
) -> None:
    attacker = wire_server.login()
    bystander = wire_server.login(ADMIN)
    for sql in (f"SELECT {parens(100_000)}", "SELECT " + "NOT " * 5000 + "true",
                "SELECT " + "1+" * 20_000 + "1", f"SELECT {parens(300)} WHERE %s = 1"):  # fmt: skip
        with pytest.raises(psycopg.Error) as caught:
            if "%s" in sql:
                attacker.execute(sql, (1,))  # extended protocol: Parse of a deep statement
            else:
                attacker.execute(sql)
        assert caught.value.sqlstate == "54001", caught.value
        assert bystander.execute("SELECT 1").fetchone() == (1,)
    assert attacker.execute(f"SELECT {parens(100)}").fetchone() == (1,)
    assert attacker.execute(f"SELECT {parens(100)} + %s", (1,)).fetchone() == (2,)
    wire_server.stop()
    report = wire_server.check()
    assert report.ok, report.lines()
