"""``INSERT … ON CONFLICT … DO UPDATE`` that proposes one key twice fails as in PostgreSQL
(SQLSTATE 21000, "ON CONFLICT DO UPDATE command cannot affect row a second time"), with
nothing written; DuckDB alone applies one of the rows and drops the others
(``planner.upsert_check``). NULL keys conflict with nothing; DO NOTHING keeps the first
row of a key; separate statements (executemany) may each touch the key."""

from __future__ import annotations

from typing import Any

import pytest

from engine.database import Database
from engine.session import Session
from planner.duckdb_sql import parse_duckdb
from planner.upsert_check import upsert_check
from storage.errors import CardinalityViolationError, InFailedTransactionError

TWICE = "ON CONFLICT DO UPDATE command cannot affect row a second time"


def _table(session: Session, sql: str = "SELECT * FROM t ORDER BY ALL") -> list[tuple[Any, ...]]:
    table = session.execute(sql)[-1].table
    assert table is not None
    return [tuple(row.values()) for row in table.to_pylist()]


@pytest.fixture
def counted(session: Session) -> Session:
    session.execute("CREATE TABLE t (k VARCHAR PRIMARY KEY, v BIGINT)")
    session.execute("INSERT INTO t VALUES ('a', 100)")
    return session


@pytest.mark.parametrize(
    ("sql", "parameters"),
    [
        (
            "INSERT INTO t VALUES ('a', 5), ('a', 7) ON CONFLICT (k) DO UPDATE "
            "SET v = t.v + EXCLUDED.v",
            None,
        ),
        (
            "INSERT INTO t VALUES ('a', 5), ('a', 7) ON CONFLICT (k) DO UPDATE SET v = EXCLUDED.v",
            None,
        ),
        (
            "INSERT INTO t VALUES ('b', 5), ('b', 7) ON CONFLICT (k) DO UPDATE SET v = EXCLUDED.v",
            None,
        ),  # a new key proposed twice
        (
            "INSERT INTO t VALUES ($1, $2), ($3, $4) ON CONFLICT (k) DO UPDATE "
            "SET v = t.v + EXCLUDED.v",
            ["a", 5, "a", 7],
        ),
        (
            "INSERT INTO t VALUES (?, ?), (?, ?), (?, ?) ON CONFLICT (k) DO UPDATE "
            "SET v = t.v + EXCLUDED.v",
            ["c", 1, "a", 5, "c", 7],
        ),
        (
            "INSERT INTO t VALUES ('a', 5), ('a', 7) ON CONFLICT DO UPDATE SET v = EXCLUDED.v",
            None,
        ),  # the target left out: the primary key
        (
            "INSERT INTO t SELECT * FROM (VALUES ('a', 5), ('z', 6), ('a', 7)) "
            "ON CONFLICT (k) DO UPDATE SET v = EXCLUDED.v",
            None,
        ),
        (
            "INSERT INTO t SELECT $1, 5 UNION ALL SELECT $1, 7 "
            "ON CONFLICT (k) DO UPDATE SET v = EXCLUDED.v",
            ["q"],
        ),
        (
            "WITH s (k, v) AS (VALUES ('a', 5), ('a', 7)) INSERT INTO t SELECT * FROM s "
            "ON CONFLICT (k) DO UPDATE SET v = EXCLUDED.v",
            None,
        ),
        (
            "INSERT INTO t VALUES ('a', 5), ('a', 7) ON CONFLICT (k) DO UPDATE "
            "SET v = EXCLUDED.v RETURNING k, v",
            None,
        ),
    ],
)
def test_a_key_proposed_twice_fails_and_writes_nothing(
    counted: Session, sql: str, parameters: list[Any] | None
) -> None:
    with pytest.raises(CardinalityViolationError, match=TWICE) as raised:
        counted.execute(sql, parameters)
    assert raised.value.sqlstate == "21000"
    assert "duplicate constrained values" in raised.value.context["hint"]
    assert _table(counted) == [("a", 100)]


def test_distinct_keys_and_separate_statements_still_upsert(counted: Session) -> None:
    result = counted.execute(
        "INSERT INTO t VALUES ('a', 5), ('b', 7) ON CONFLICT (k) DO UPDATE SET v = t.v + EXCLUDED.v"
    )[-1]
    assert result.tag == "INSERT 0 2"
    # executemany: one statement per parameter set, each may touch the key (PostgreSQL too)
    for parameters in (["a", 1], ["a", 2]):
        counted.execute(
            "INSERT INTO t VALUES (?, ?) ON CONFLICT (k) DO UPDATE SET v = t.v + EXCLUDED.v",
            parameters,
        )
    assert _table(counted) == [("a", 108), ("b", 7)]


def test_a_multi_column_target_and_null_keys(session: Session) -> None:
    session.execute("CREATE TABLE m (a INTEGER, b VARCHAR, u INTEGER UNIQUE, v INTEGER, "
                    "PRIMARY KEY (a, b))")  # fmt: skip
    session.execute("INSERT INTO m VALUES (1, 'x', NULL, 0)")
    upsert = "INSERT INTO m VALUES {} ON CONFLICT (a, b) DO UPDATE SET v = EXCLUDED.v"
    session.execute(upsert.format("(1, 'x', NULL, 1), (1, 'y', NULL, 2), (2, 'x', NULL, 3)"))
    with pytest.raises(CardinalityViolationError):
        session.execute(upsert.format("(1, 'y', NULL, 4), (3, 'z', NULL, 5), (1, 'y', NULL, 6)"))
    # the text '01' and the integer 1 are one key once cast to the column (DuckDB's cast)
    with pytest.raises(CardinalityViolationError):
        session.execute(upsert.format("('01', 'x', NULL, 7), (1, 'x', NULL, 8)"))
    assert _table(session, "SELECT a, b, v FROM m ORDER BY ALL") == [
        (1, "x", 1), (1, "y", 2), (2, "x", 3)]  # fmt: skip
    # NULLs never conflict (a UNIQUE column as the target): both rows are inserted
    result = session.execute("INSERT INTO m VALUES (5, 'n', NULL, 1), (6, 'n', NULL, 2) "
                             "ON CONFLICT (u) DO UPDATE SET v = EXCLUDED.v")[-1]  # fmt: skip
    assert result.tag == "INSERT 0 2"
    assert _table(session, "SELECT count(*) FROM m WHERE u IS NULL") == [(5,)]


def test_do_nothing_keeps_the_first_row_of_a_key(counted: Session) -> None:
    """PostgreSQL's DO NOTHING: the first proposed row of a key is inserted, the rest
    skipped (no error); DuckDB does the same."""
    result = counted.execute("INSERT INTO t VALUES ('b', 5), ('b', 7), ('a', 1) "
                             "ON CONFLICT (k) DO NOTHING")[-1]  # fmt: skip
    assert result.tag == "INSERT 0 1"
    assert _table(counted) == [("a", 100), ("b", 5)]


def test_in_a_transaction_the_error_aborts_it(counted: Session) -> None:
    counted.execute("BEGIN")
    counted.execute("INSERT INTO t VALUES ('b', 1)")
    with pytest.raises(CardinalityViolationError):
        counted.execute("INSERT INTO t VALUES ('a', 5), ('a', 7) ON CONFLICT (k) DO UPDATE "
                        "SET v = EXCLUDED.v")  # fmt: skip
    with pytest.raises(InFailedTransactionError):
        counted.execute("SELECT 1")
    assert counted.execute("COMMIT")[-1].tag == "ROLLBACK"
    assert _table(counted) == [("a", 100)]


def test_only_do_update_without_where_is_checked() -> None:
    def check(sql: str) -> Any:
        tree = parse_duckdb(sql)
        assert tree is not None
        return upsert_check(tree)

    assert check("INSERT INTO t VALUES (1, 2), (3, 4) ON CONFLICT DO UPDATE SET v = 1").rows == 2
    for unchecked in [
        "INSERT INTO t VALUES (1, 2) ON CONFLICT DO UPDATE SET v = 1",  # one row
        "INSERT INTO t VALUES (1, 2), (3, 4) ON CONFLICT DO NOTHING",
        "INSERT INTO t VALUES (1, 2), (3, 4) ON CONFLICT DO UPDATE SET v = 1 WHERE v > 0",
        "INSERT INTO t SELECT ?, 2 ON CONFLICT DO UPDATE SET v = ?",  # a parameter in SET
        "INSERT INTO t VALUES (1, 2), (3, 4)",
    ]:
        assert check(unchecked) is None, unchecked


def test_a_reopened_database_holds_nothing_of_the_failed_statement(tmp_path) -> None:
    path = str(tmp_path / "data")
    database = Database.open(path)
    session = database.connect()
    session.execute("CREATE TABLE t (k VARCHAR PRIMARY KEY, v BIGINT)")
    with pytest.raises(CardinalityViolationError):
        session.execute("INSERT INTO t VALUES ('a', 5), ('a', 7) ON CONFLICT (k) DO UPDATE "
                        "SET v = EXCLUDED.v")  # fmt: skip
    session.close()
    database.close()
    database = Database.open(path)
    try:
        session = database.connect()
        assert _table(session) == []
        session.close()
    finally:
        database.close()
