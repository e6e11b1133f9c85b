"""The counter upsert's shortcut (``INSERT … ON CONFLICT (k) DO UPDATE SET n = n +
EXCLUDED.n`` run as ``UPDATE … WHERE k = ?`` and, when that changed no row, the statement
itself): it runs where it is sound, and every script gives the same tags, the same
SQLSTATEs and the same table with the shortcut as without it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from typing import Any

import pytest

from engine import tables
from engine.database import Database
from engine.session import Session
from planner.duckdb_sql import counter_update, parse_duckdb, upsert_shape
from storage.errors import TopicbaseError

UPSERT = "INSERT INTO counters VALUES (?, ?) ON CONFLICT (k) DO UPDATE SET n = n + EXCLUDED.n"
COUNTERS = "CREATE TABLE counters (k VARCHAR PRIMARY KEY, n BIGINT NOT NULL)"

Step = tuple[int, str, Sequence[Any] | None]  # (session, sql, parameters)


@pytest.fixture(autouse=True)
def _without_counter_deltas(monkeypatch: pytest.MonkeyPatch) -> None:
    """The shortcut is the DuckDB way's: counter deltas (``engine.deltas``, which keep
    such upserts of a transaction that has not touched DuckDB) are off here."""
    monkeypatch.setenv("TOPICBASE_COUNTER_DELTAS", "0")


# -- the shape (pure) ----------------------------------------------------------------------
@pytest.mark.parametrize(
    "sql",
    [
        UPSERT,
        "INSERT INTO counters (n, k) VALUES ($2, $1) ON CONFLICT (k) DO UPDATE "
        "SET n = counters.n + excluded.n * 2",
        "INSERT INTO counters VALUES ('a', -3) ON CONFLICT (k) DO UPDATE SET n = EXCLUDED.n",
    ],
)
def test_counter_upserts_have_a_shape(sql: str) -> None:
    tree = parse_duckdb(sql)
    assert tree is not None
    assert upsert_shape(tree) is not None


@pytest.mark.parametrize(
    "sql",
    [
        UPSERT + " RETURNING n",
        UPSERT + " WHERE n > 0",
        "INSERT INTO counters VALUES (?, ?), (?, ?) ON CONFLICT (k) DO UPDATE "
        "SET n = n + EXCLUDED.n",
        "INSERT INTO counters VALUES (?, ?) ON CONFLICT DO NOTHING",
        "INSERT INTO counters VALUES (?, ?) ON CONFLICT (k) DO NOTHING",
        "INSERT INTO main.counters VALUES (?, ?) ON CONFLICT (k) DO UPDATE SET n = 1",
        "INSERT INTO counters AS c VALUES (?, ?) ON CONFLICT (k) DO UPDATE SET n = 1",
        "INSERT INTO counters VALUES (?, ?) ON CONFLICT (k) DO UPDATE SET n = abs(EXCLUDED.n)",
        "INSERT INTO counters VALUES (?, ?) ON CONFLICT (k) DO UPDATE SET n = n + ?",
        "INSERT INTO counters VALUES (?, ?) ON CONFLICT (k) DO UPDATE SET k = EXCLUDED.k",
        "INSERT INTO counters VALUES (?, NULL) ON CONFLICT (k) DO UPDATE SET n = 1",
        "INSERT INTO counters SELECT 'a', 1 ON CONFLICT (k) DO UPDATE SET n = 1",
        "INSERT INTO counters VALUES (?, (SELECT 1)) ON CONFLICT (k) DO UPDATE SET n = 1",
        "INSERT INTO counters VALUES ($a, $b) ON CONFLICT (k) DO UPDATE SET n = 1",
        "INSERT INTO counters VALUES (?, ?)",
    ],
)
def test_other_statements_have_no_shape(sql: str) -> None:
    tree = parse_duckdb(sql)
    assert tree is not None
    assert upsert_shape(tree) is None


def test_the_update_casts_each_value_to_its_column_and_numbers_parameters() -> None:
    tree = parse_duckdb(UPSERT)
    assert tree is not None
    shape = upsert_shape(tree)
    assert shape is not None
    update = counter_update(shape, (("k", "VARCHAR"), ("n", "BIGINT")))
    assert update == (
        "UPDATE counters SET n = n + CAST($1 AS BIGINT) WHERE k = CAST($2 AS TEXT)",
        (1, 0),
    )
    # A value no SET reads would never be cast (nor its conversion error raised).
    assert counter_update(shape, (("k", "VARCHAR"), ("n", "BIGINT"), ("m", "INTEGER"))) is None
    unread = parse_duckdb(
        "INSERT INTO counters VALUES (?, ?) ON CONFLICT (k) DO UPDATE SET n = n + 1"
    )
    assert unread is not None
    unread_shape = upsert_shape(unread)
    assert unread_shape is not None
    assert counter_update(unread_shape, (("k", "VARCHAR"), ("n", "BIGINT"))) is None


# -- the engine: where the shortcut runs ---------------------------------------------------
@pytest.fixture
def statements(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every DML text the engine hands DuckDB through ``tables.execute_count``."""
    seen: list[str] = []
    original = tables.execute_count

    def recording(cursor: Any, sql: str, parameters: Any = None, **kwargs: Any) -> int | None:
        seen.append(sql)
        return original(cursor, sql, parameters, **kwargs)

    monkeypatch.setattr(tables, "execute_count", recording)
    return seen


def _updates(seen: list[str]) -> int:
    return sum(1 for sql in seen if sql.startswith("UPDATE counters"))


def test_an_existing_row_is_updated_without_the_merge(
    session: Session, statements: list[str]
) -> None:
    session.execute(COUNTERS)
    session.execute("INSERT INTO counters VALUES ('w1', 5)")
    session.execute("BEGIN")
    assert session.execute(UPSERT, ["w1", 3])[0].tag == "INSERT 0 1"
    assert session.execute(UPSERT, ["w2", 4])[0].tag == "INSERT 0 1"  # a new row: the INSERT
    session.execute("COMMIT")
    assert _updates(statements) == 2
    assert statements.count(UPSERT) == 1
    table = session.execute("SELECT k, n FROM counters ORDER BY k")[0].table
    assert table is not None and table.to_pylist() == [
        {"k": "w1", "n": 8},
        {"k": "w2", "n": 4},
    ]


def test_autocommit_runs_the_statement_itself(session: Session, statements: list[str]) -> None:
    session.execute(COUNTERS)
    session.execute("INSERT INTO counters VALUES ('w1', 5)")
    session.execute(UPSERT, ["w1", 3])
    assert _updates(statements) == 0


@pytest.mark.parametrize(
    "table",
    [
        "CREATE TABLE counters (k VARCHAR PRIMARY KEY, n BIGINT NOT NULL, u INTEGER UNIQUE)",
        "CREATE TABLE counters (k VARCHAR PRIMARY KEY, n BIGINT NOT NULL CHECK (n < 100))",
        "CREATE TABLE counters (k VARCHAR COLLATE NOCASE PRIMARY KEY, n BIGINT)",
        "CREATE TABLE counters (k DOUBLE PRIMARY KEY, n BIGINT)",
        "CREATE TABLE counters (k VARCHAR, n BIGINT, UNIQUE (k, n))",
    ],
)
def test_tables_it_is_not_known_sound_on_run_the_statement(
    session: Session, statements: list[str], table: str
) -> None:
    session.execute(table)
    session.execute("INSERT INTO counters (k, n) VALUES ('1', 5)")
    session.execute("BEGIN")
    with contextlib.suppress(TopicbaseError):  # ON CONFLICT (k) names no key of (k, n)
        session.execute(UPSERT, ["1", 3])
    session.execute("ROLLBACK")
    assert _updates(statements) == 0


def test_a_name_two_schemas_hold_runs_the_statement(
    session: Session, statements: list[str]
) -> None:
    session.execute(COUNTERS)
    session.execute("INSERT INTO counters VALUES ('w1', 5)")
    session.execute("CREATE TEMP TABLE counters (k VARCHAR PRIMARY KEY, n BIGINT NOT NULL)")
    session.execute("BEGIN")
    session.execute(UPSERT, ["w1", 3])
    session.execute("COMMIT")
    assert _updates(statements) == 0


def test_ddl_in_the_transaction_or_another_session_is_seen(
    database: Database, session: Session, statements: list[str]
) -> None:
    other = database.connect()
    try:
        session.execute(COUNTERS)
        session.execute("INSERT INTO counters VALUES ('w1', 5)")
        session.execute("BEGIN")
        session.execute(UPSERT, ["w1", 1])
        session.execute("COMMIT")
        assert _updates(statements) == 1
        # Another session adds a column: the cached UPDATE is no longer the statement's
        # equal (it now names two of three columns), so the statement runs and refuses.
        other.execute("ALTER TABLE counters ADD COLUMN m INTEGER DEFAULT 0")
        session.execute("BEGIN")
        with pytest.raises(TopicbaseError):
            session.execute(UPSERT, ["w1", 1])
        session.execute("ROLLBACK")
        assert _updates(statements) == 1
        other.execute("ALTER TABLE counters DROP COLUMN m")
        # DDL of the transaction itself: the statement runs.
        session.execute("BEGIN")
        session.execute("CREATE TABLE other_table (x INTEGER)")
        session.execute(UPSERT, ["w1", 1])
        session.execute("COMMIT")
        assert _updates(statements) == 1
        session.execute("BEGIN")
        session.execute(UPSERT, ["w1", 1])
        session.execute("COMMIT")
        assert _updates(statements) == 2
    finally:
        other.close()


# -- equivalence: the same script with and without the shortcut ----------------------------
def _outcomes(path: str, steps: Sequence[Step]) -> tuple[list[str], list[Any]]:
    """Each step's tag or SQLSTATE, and the table's rows at the end."""
    database = Database.open(path)
    sessions = [database.connect() for _ in range(2)]
    outcomes: list[str] = []
    try:
        sessions[0].execute(COUNTERS)
        sessions[0].execute("INSERT INTO counters VALUES ('old', 10)")
        for index, sql, parameters in steps:
            try:
                outcomes.append(sessions[index].execute(sql, parameters)[-1].tag)
            except TopicbaseError as error:
                outcomes.append(error.sqlstate)
        table = sessions[0].execute("SELECT k, n FROM counters ORDER BY k")[0].table
        assert table is not None
        return outcomes, table.to_pylist()
    finally:
        for session in sessions:
            session.close()
        database.close()


def _same_both_ways(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, steps: Sequence[Step]
) -> tuple[list[str], list[Any], list[str]]:
    seen: list[str] = []
    original = tables.execute_count

    def recording(cursor: Any, sql: str, parameters: Any = None, **kwargs: Any) -> int | None:
        seen.append(sql)
        return original(cursor, sql, parameters, **kwargs)

    monkeypatch.setattr(tables, "execute_count", recording)
    with_shortcut = _outcomes(os.path.join(tmp_path, "with"), steps)
    monkeypatch.setattr(Session, "_upsert_by_update", lambda self, operation, bound: None)
    without = _outcomes(os.path.join(tmp_path, "without"), steps)
    assert with_shortcut == without
    return (*with_shortcut, seen)


def _script(*steps: Step) -> list[Step]:
    return list(steps)


SCRIPTS: dict[str, list[Step]] = {
    "existing and new rows, several in one transaction": _script(
        (0, "BEGIN", None),
        (0, UPSERT, ["old", 1]),
        (0, UPSERT, ["new", 2]),
        (0, UPSERT, ["new", 3]),
        (0, UPSERT, ["old", -4]),
        (0, "COMMIT", None),
    ),
    "literals and a column list in another order": _script(
        (0, "BEGIN", None),
        (0, "INSERT INTO counters (n, k) VALUES (7, 'old') ON CONFLICT (k) DO UPDATE "
            "SET n = counters.n * excluded.n", None),
        (0, "INSERT INTO counters (n, k) VALUES ($2, $1) ON CONFLICT (k) DO UPDATE "
            "SET n = n - EXCLUDED.n", ["old", 3]),
        (0, "COMMIT", None),
    ),
    "a NULL count fails the transaction": _script(
        (0, "BEGIN", None),
        (0, UPSERT, ["old", None]),
        (0, "COMMIT", None),
    ),
    "a NULL key fails the transaction": _script(
        (0, "BEGIN", None),
        (0, UPSERT, [None, 1]),
        (0, "COMMIT", None),
    ),
    "a value that is no number": _script(
        (0, "BEGIN", None),
        (0, UPSERT, ["old", "many"]),
        (0, "ROLLBACK", None),
    ),
    "an overflow": _script(
        (0, "BEGIN", None),
        (0, UPSERT, ["old", 2**63 - 5]),
        (0, "ROLLBACK", None),
    ),
    "a key given as a number": _script(
        (0, "BEGIN", None),
        (0, "INSERT INTO counters VALUES (12, 1) ON CONFLICT (k) DO UPDATE "
            "SET n = n + EXCLUDED.n", None),
        (0, UPSERT, [12, 1]),
        (0, "COMMIT", None),
    ),
    "too few and too many parameters": _script(
        (0, "BEGIN", None),
        (0, UPSERT, ["old"]),
        (0, "ROLLBACK", None),
        (0, "BEGIN", None),
        (0, UPSERT, ["old", 1, 2]),
        (0, "ROLLBACK", None),
    ),
    "two sessions upsert an existing row": _script(
        (0, "BEGIN", None),
        (1, "BEGIN", None),
        (0, UPSERT, ["old", 1]),
        (1, UPSERT, ["old", 2]),
        (1, "ROLLBACK", None),
        (0, "COMMIT", None),
    ),
    "an update committed after the snapshot": _script(
        (1, "BEGIN", None),
        (1, "SELECT count(*) FROM counters", None),
        (0, "BEGIN", None),
        (0, UPSERT, ["old", 1]),
        (0, "COMMIT", None),
        (1, UPSERT, ["old", 2]),
        (1, "COMMIT", None),
    ),
    "two sessions insert one new key": _script(
        (0, "BEGIN", None),
        (1, "BEGIN", None),
        (0, UPSERT, ["new", 1]),
        (1, UPSERT, ["new", 2]),
        (1, "COMMIT", None),
        (0, "COMMIT", None),
    ),
    "a key inserted and committed after the snapshot": _script(
        (1, "BEGIN", None),
        (1, "SELECT count(*) FROM counters", None),
        (0, UPSERT, ["new", 1]),
        (1, UPSERT, ["new", 2]),
        (1, "COMMIT", None),
    ),
    "a row deleted by another session": _script(
        (1, "BEGIN", None),
        (1, "SELECT count(*) FROM counters", None),
        (0, "DELETE FROM counters WHERE k = 'old'", None),
        (1, UPSERT, ["old", 2]),
        (1, "COMMIT", None),
    ),
}


# Each script's outcomes and the statements seen (both ways), by name, once it ran and
# gave the same both ways: the scripts are deterministic (one thread plays every
# session's steps in order), so the test that they are not vacuous reads these instead
# of running each again (it runs a script that did not run here, e.g. selected alone).
_RUN_SCRIPTS: dict[str, tuple[list[str], list[str]]] = {}


@pytest.mark.parametrize("name", list(SCRIPTS))
def test_a_script_gives_the_same_outcomes_with_and_without_the_shortcut(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    outcomes, table, seen = _same_both_ways(tmp_path, monkeypatch, SCRIPTS[name])
    assert outcomes and table is not None
    _RUN_SCRIPTS[name] = (outcomes, seen)


def test_the_equivalence_scripts_exercise_the_shortcut(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scripts above are not vacuous: the shortcut's UPDATE runs in them and the
    outcomes include the conflicts (40001, 23505) and value errors they are about."""
    seen_all: list[str] = []
    outcomes_all: list[str] = []
    for index, name in enumerate(SCRIPTS):
        if name in _RUN_SCRIPTS:
            outcomes, seen = _RUN_SCRIPTS[name]
        else:
            outcomes, _, seen = _same_both_ways(tmp_path / str(index), monkeypatch, SCRIPTS[name])
            monkeypatch.undo()
        seen_all += seen
        outcomes_all += outcomes
    assert _updates(seen_all) >= 8
    for sqlstate in ("40001", "23505", "23502", "22P02", "22003"):
        assert sqlstate in outcomes_all, sqlstate



def test_an_upsert_s_conversion_error_is_not_a_serialization_failure(session: Session) -> None:
    """DuckDB quotes the statement in its message; its ``ON CONFLICT`` is not a conflict
    (this was 40001, and a client would have retried a statement that can never run)."""
    session.execute(COUNTERS)
    with pytest.raises(TopicbaseError) as failure:
        session.execute(UPSERT, ["old", "many"])
    assert failure.value.sqlstate == "22P02"
