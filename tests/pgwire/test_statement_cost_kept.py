"""What the server keeps between executions of a prepared statement (docs/statement_cost.md,
round 8) never outlives a check: a prepared ``SELECT 1`` runs in DuckDB once or twice and
then from its kept row, a prepared key lookup from the table's index with its projection
kept, and a REVOKE takes effect on the very next execution of either."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from engine import key_lookup, tables
from sql.pgwire.server import ServerThread
from tests.literal_statements import literal_runs
from tests.pgwire.scram_users import login, scram_server


@pytest.fixture
def wire(tmp_path: Path) -> Iterator[ServerThread]:
    """A server where ``alice`` is a superuser and ``bob`` an ordinary user."""
    with scram_server(tmp_path) as server:
        yield server


@pytest.fixture
def duckdb_literal_runs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Texts run in DuckDB on the literal connection (in the server's threads)."""
    return literal_runs(monkeypatch)


@pytest.fixture
def index_answers(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """One entry per lookup asked of an index, by ``key_lookup.answer`` or by a kept
    plan's ``key_lookup.KeptWay``: whether the index answered (a kept way's None is
    followed by ``answer``'s entry)."""
    answered: list[bool] = []
    original = key_lookup.answer
    kept = key_lookup.KeptWay.answer

    def spying(*arguments: Any, **options: Any) -> Any:
        result = original(*arguments, **options)
        answered.append(result is not None)
        return result

    def spying_kept(*arguments: Any) -> Any:
        result = kept(*arguments)
        if result is not None:
            answered.append(True)
        return result

    monkeypatch.setattr(key_lookup, "answer", spying)
    monkeypatch.setattr(key_lookup.KeptWay, "answer", spying_kept)
    return answered


def test_a_prepared_select_1_runs_in_duckdb_at_most_twice(
    wire: ServerThread, duckdb_literal_runs: list[str]
) -> None:
    with login(wire, "bob") as bob:
        for _ in range(20):
            assert bob.execute("SELECT 1", prepare=True).fetchone() == (1,)
        for binary in (False, True):
            cursor = bob.cursor(binary=binary)
            assert cursor.execute("SELECT 1 AS a, 'x' AS b", prepare=True).fetchone() == (1, "x")
            assert cursor.description is not None
            assert [c.name for c in cursor.description] == ["a", "b"]
    assert 1 <= duckdb_literal_runs.count("SELECT 1") <= 2
    assert 1 <= duckdb_literal_runs.count("SELECT 1 AS a, 'x' AS b") <= 2


def test_a_simple_query_select_1_runs_in_duckdb_at_most_twice(
    wire: ServerThread, monkeypatch: pytest.MonkeyPatch
) -> None:
    started: list[str] = []
    original = tables.batch_reader

    def spying(cursor: Any, sql: str, parameters: Any, batch_rows: int) -> Any:
        if cursor is tables.literal_cursor():
            started.append(sql)
        return original(cursor, sql, parameters, batch_rows)

    monkeypatch.setattr(tables, "batch_reader", spying)
    tables._literal_streamed.clear()
    tables._small_results.clear()
    with login(wire, "bob") as bob:
        for _ in range(10):
            cursor = bob.execute("SELECT 1 AS one, 'x' AS two", prepare=False)
            assert cursor.fetchall() == [(1, "x")]
            assert [c.name for c in cursor.description or []] == ["one", "two"]
    assert 1 <= len(started) <= 2


def test_a_revoke_takes_effect_on_the_next_execution(
    wire: ServerThread, duckdb_literal_runs: list[str], index_answers: list[bool]
) -> None:
    lookup = "SELECT v FROM kv WHERE k = %s"
    with login(wire, "alice") as admin, login(wire, "bob") as bob:
        admin.execute("CREATE TABLE kv (k BIGINT PRIMARY KEY, v VARCHAR NOT NULL)")
        admin.execute("INSERT INTO kv SELECT i, 'value ' || i FROM range(1000) t(i)")
        admin.execute("GRANT SELECT ON kv TO bob")
        for key in range(100):  # the index is built after 64 lookups
            assert bob.execute(lookup, [key], prepare=True).fetchone() == (f"value {key}",)
            assert bob.execute("SELECT 1", prepare=True).fetchone() == (1,)
        assert index_answers[-10:] == [True] * 10  # the kept path, not DuckDB's
        admin.execute("REVOKE SELECT ON kv FROM bob")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            bob.execute(lookup, [7], prepare=True)
        assert bob.execute("SELECT 1", prepare=True).fetchone() == (1,)  # needs nothing
        admin.execute("GRANT SELECT ON kv TO bob")
        assert bob.execute(lookup, [7], prepare=True).fetchone() == ("value 7",)
        # An aborted transaction refuses the kept SELECT 1 as any statement (25P02).
        bob.autocommit = False
        with pytest.raises(psycopg.errors.UndefinedTable):
            bob.execute("SELECT * FROM no_such_table")
        with pytest.raises(psycopg.errors.InFailedSqlTransaction):
            bob.execute("SELECT 1", prepare=True)
        bob.rollback()
    assert duckdb_literal_runs.count("SELECT 1") <= 2


def test_the_result_bound_of_variable_width_rows_is_measured_without_nbytes_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A lookup's row (a VARCHAR) is bounded per result (``connection._bytes_bound``) with
    what depends on the shape kept: the same number as ``Rows.nbytes_bound``, which runs
    once per shape and row count."""
    import random

    import pyarrow as pa

    from engine.api import Rows
    from sql.pgwire.connection import connection as wire_connection

    calls: list[int] = []
    original = Rows.nbytes_bound

    def counting(self: Rows) -> int:
        calls.append(len(self.rows))
        return original(self)

    wire_connection._fixed_bounds.clear()
    schemas = [
        pa.schema([("v", pa.string())]),
        pa.schema([("k", pa.int64()), ("v", pa.string()), ("b", pa.binary()),
                   ("f", pa.bool_()), ("d", pa.float64())]),
        pa.schema([("k", pa.int32())]),
    ]
    pick = random.Random(5)

    def value(kind: pa.DataType) -> Any:
        if pick.random() < 0.2:
            return None
        if kind == pa.string():
            return "".join(pick.choice("aé€\U0001f600") for _ in range(pick.randrange(200)))
        if kind == pa.binary():
            return bytes(pick.randrange(256) for _ in range(pick.randrange(300)))
        if kind == pa.bool_():
            return pick.random() < 0.5
        return pick.randrange(1000) if pa.types.is_integer(kind) else pick.random()

    for _ in range(300):
        schema = pick.choice(schemas)
        count = pick.choice([0, 1, 1, 2, 65])
        rows = Rows([tuple(value(f.type) for f in schema) for _ in range(count)], schema)
        expected = original(rows)
        with monkeypatch.context() as patch:
            patch.setattr(Rows, "nbytes_bound", counting)
            assert wire_connection._bytes_bound(rows) == expected
    assert len(calls) <= len(schemas) * 4  # once per shape and row count, not per result
