"""A staged table write in mode ``upsert`` keeps the LAST row of a key
(``engine.bulk_publish.table_insert``): the order is the commit's list of write ids, then
each write's staged files in staging order, then their rows in order. Before round 23 the
publish handed DuckDB the batch as it was and the FIRST row of a duplicated key won."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from engine import bulk_write
from engine.database import Database


@pytest.fixture
def database(tmp_path: Path):
    db = Database.open(str(tmp_path / "data"), retention_interval_s=None)
    try:
        yield db
    finally:
        db.close()


def _sql(database: Any, text: str) -> list[dict]:
    session = database.connect()
    try:
        result = session.execute(text)[-1]
        return [] if result.table is None else result.table.to_pylist()
    finally:
        session.close()


def _stage(database: Any, write_id: str, table: str, key: tuple[str, ...],
           appends: list[dict[str, list]], mode: str = "upsert") -> None:  # fmt: skip
    """Stage ``appends`` (one staged file each, in this order) as write ``write_id``."""
    session = database.connect()
    try:
        bulk = bulk_write.for_database(database)
        bulk.start(session, write_id, "table", table, mode=mode, key=key)
        for columns in appends:
            batch = pa.record_batch(columns)
            bulk.append(session, write_id, [batch], batch.schema)
    finally:
        session.close()


def _commit(database: Any, batch_id: int, write_ids: list[str]) -> dict:
    session = database.connect()
    try:
        return bulk_write.for_database(database).commit(session, "s", batch_id, write_ids)
    finally:
        session.close()


def _last_per_key(rows: list[dict], key: tuple[str, ...]) -> dict[tuple, dict]:
    """The model: each key's last row, in the given order."""
    latest: dict[tuple, dict] = {}
    for row in rows:
        latest[tuple(row[k] for k in key)] = row
    return latest


def _table(database: Any, table: str, key: tuple[str, ...]) -> dict[tuple, dict]:
    return {tuple(r[k] for k in key): r for r in _sql(database, f"SELECT * FROM {table}")}


@pytest.mark.parametrize("values", [[2, 1], [5, 7, 6]])
def test_a_key_twice_in_one_write_keeps_its_last_row(database, values: list[int]) -> None:
    _sql(database, "CREATE TABLE t (k VARCHAR PRIMARY KEY, v BIGINT)")
    _sql(database, "INSERT INTO t VALUES ('a', 100)")
    _stage(database, "w1", "t", ("k",), [{"k": ["a"] * len(values), "v": values}])
    assert _commit(database, 1, ["w1"])["rows"] == len(values)
    assert _sql(database, "SELECT k, v FROM t") == [{"k": "a", "v": values[-1]}]


def test_the_last_staged_file_of_a_write_wins(database) -> None:
    """Two appends (two staged files): the second file's rows come after the first's."""
    _sql(database, "CREATE TABLE t (k VARCHAR PRIMARY KEY, v BIGINT)")
    _stage(database, "w1", "t", ("k",), [{"k": ["a", "b", "a"], "v": [1, 2, 3]},
                                         {"k": ["b", "a", "c"], "v": [4, 5, 6]}])  # fmt: skip
    _commit(database, 1, ["w1"])
    assert _sql(database, "SELECT k, v FROM t ORDER BY k") == [
        {"k": "a", "v": 5}, {"k": "b", "v": 4}, {"k": "c", "v": 6}]  # fmt: skip


@pytest.mark.parametrize("order", [["w1", "w2"], ["w2", "w1"]])
def test_across_the_writes_of_a_commit_the_order_it_lists_them_wins(
    database, order: list[str]
) -> None:
    """Both writes hold the key twice; ``w1`` is staged first, the commit's list rules."""
    _sql(database, "CREATE TABLE t (k VARCHAR PRIMARY KEY, v BIGINT)")
    staged = {"w1": {"k": ["a", "a"], "v": [1, 2]}, "w2": {"k": ["a", "a"], "v": [3, 4]}}
    for write_id, columns in staged.items():
        _stage(database, write_id, "t", ("k",), [columns])
    _commit(database, 1, order)
    assert _sql(database, "SELECT v FROM t") == [{"v": staged[order[-1]]["v"][-1]}]


def test_a_key_of_several_columns_and_nulls_in_the_others(database) -> None:
    """Random rows over few keys of two columns, NULLs in both other columns, staged in
    three files and two writes: the table equals the model (each key's last row)."""
    _sql(database, "CREATE TABLE t (k1 VARCHAR, k2 BIGINT, v BIGINT, w VARCHAR, "
                   "PRIMARY KEY (k1, k2))")  # fmt: skip
    _sql(database, "INSERT INTO t VALUES ('a', 1, 100, 'stored'), ('b', 2, 200, 'stored')")
    chance = random.Random(23)
    files = []
    for _ in range(3):
        count = chance.randint(50, 400)
        files.append({
            "k1": [chance.choice("ab") for _ in range(count)],
            "k2": [chance.randint(1, 3) for _ in range(count)],
            "v": [chance.choice([None, *range(9)]) for _ in range(count)],
            "w": [chance.choice([None, "x", "y"]) for _ in range(count)],
        })  # fmt: skip
    for name, tail in {"k1": ["a", "b"], "k2": [1, 2], "v": [None, 7], "w": ["z", None]}.items():
        files[-1][name] += tail  # the last word of two stored keys: a NULL in each column
    _stage(database, "w1", "t", ("k1", "k2"), files[:2])
    _stage(database, "w2", "t", ("k1", "k2"), files[2:])
    key = ("k1", "k2")
    model = _last_per_key(_sql(database, "SELECT * FROM t"), key)
    for columns in files:
        model.update(_last_per_key(pa.table(columns).to_pylist(), key))
    _commit(database, 1, ["w1", "w2"])
    assert _table(database, "t", key) == model
    assert model[("a", 1)]["v"] is None and model[("b", 2)]["w"] is None


def test_a_column_named_as_the_ordinal_is_a_column_like_any_other(database) -> None:
    _sql(database, 'CREATE TABLE t (k BIGINT PRIMARY KEY, "__topicbase_ordinal" BIGINT)')
    _stage(database, "w1", "t", ("k",), [{"k": [1, 1, 1], "__topicbase_ordinal": [9, 3, 5]}])
    _commit(database, 1, ["w1"])
    assert _sql(database, "SELECT * FROM t") == [{"k": 1, "__topicbase_ordinal": 5}]


def test_add_sums_every_row_of_a_key_whatever_their_order(database) -> None:
    """``add`` is order-free: the same rows in two orders give the same totals."""
    chance = random.Random(5)
    rows = [(chance.choice("abc"), chance.randint(-5, 9)) for _ in range(300)]
    totals = []
    for number, ordered in enumerate([rows, rows[::-1]]):
        table = f"t{number}"
        _sql(database, f"CREATE TABLE {table} (k VARCHAR PRIMARY KEY, n BIGINT)")
        _sql(database, f"INSERT INTO {table} VALUES ('a', 1000)")
        columns = {"k": [k for k, _ in ordered], "n": [n for _, n in ordered]}
        _stage(database, f"w{number}", table, ("k",), [columns], mode="add")
        _commit(database, number + 1, [f"w{number}"])
        totals.append(_table(database, table, ("k",)))
    expected = {(k,): {"k": k, "n": (1000 if k == "a" else 0)
                       + sum(n for key, n in rows if key == k)}
                for k in {k for k, _ in rows}}  # fmt: skip
    assert totals[0] == totals[1] == expected


@pytest.mark.parametrize("mode", ["upsert", "add"])
def test_rows_with_a_null_key_are_each_their_own_row(database, mode: str) -> None:
    """A NULL in a nullable UNIQUE key conflicts with nothing (PostgreSQL's and DuckDB's
    ``ON CONFLICT``: NULLs are distinct), so every such row is inserted as it came, in
    both modes; the rows with a whole key are folded as before. Before round 24 the
    ``DISTINCT ON``/``GROUP BY`` of the publish made all NULL-key rows one."""
    _sql(database, "CREATE TABLE t (k1 VARCHAR, k2 BIGINT, v BIGINT, UNIQUE (k1, k2))")
    _sql(database, "INSERT INTO t VALUES ('a', 1, 100), (NULL, 1, 50)")
    columns = {
        "k1": [None, None, "a", "a", "b", None, "b"],
        "k2": [1, 1, 1, 1, None, 2, None],
        "v": [1, 2, 3, 4, 5, 6, 7],
    }
    _stage(database, "w1", "t", ("k1", "k2"), [columns], mode=mode)
    _commit(database, 1, ["w1"])
    rows = sorted(
        (r["k1"] or "", r["k2"] or 0, r["v"]) for r in _sql(database, "SELECT * FROM t")
    )
    stored_a = 4 if mode == "upsert" else 100 + 3 + 4
    assert rows == sorted([
        ("a", 1, stored_a), ("", 1, 50), ("", 1, 1), ("", 1, 2), ("b", 0, 5), ("", 2, 6),
        ("b", 0, 7),
    ])  # fmt: skip
