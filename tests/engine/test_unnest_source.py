"""``engine.unnest_source``: a SELECT of unnested list parameters built without DuckDB gives
DuckDB's own table (names, types, values, row order), or is left to DuckDB."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pytest

from engine import tables, unnest_source
from sql import dbapi


def _duckdb(sql: str, parameters: Any) -> pa.Table:
    connection = duckdb.connect()
    try:
        return connection.sql(sql, params=parameters).to_arrow_table()
    finally:
        connection.close()


def _items(rng: random.Random, kind: type, length: int) -> list[Any]:
    items: list[Any] = []
    for _ in range(length):
        if rng.random() < 0.1:
            items.append(None)
        elif kind is bytes:
            items.append(rng.randbytes(rng.choice([0, 1, 7, 300])))
        else:
            items.append(
                "".join(rng.choice("aZ09 é€\U0001f600\x00,'\"") for _ in range(rng.randrange(6)))
            )
    if all(item is None for item in items):
        items[0] = b"x" if kind is bytes else "x"
    return items


@pytest.mark.parametrize("seed", range(40))
def test_the_built_table_is_duckdbs(seed: int) -> None:
    rng = random.Random(seed)
    columns = rng.randint(1, 4)
    length = rng.randint(1, 50)
    dollar = rng.random() < 0.5
    order = list(range(columns))
    rng.shuffle(order)
    markers = [f"${n + 1}" for n in order] if dollar else ["?"] * columns
    spaces = [rng.choice(["", " ", "\n  "]) for _ in range(4)]
    sql = rng.choice(["SELECT", "select", "Select"]) + " " + ",".join(
        f"{spaces[0]}{rng.choice(['unnest', 'UNNEST'])}{spaces[1]}({spaces[2]}{m}{spaces[3]})"
        for m in markers)  # fmt: skip
    parameters = [_items(rng, rng.choice([bytes, str]), length) for _ in range(columns)]
    built = unnest_source.unnested(sql, parameters)
    assert built is not None, sql
    expected = _duckdb(sql, parameters)
    assert built.schema == expected.schema
    assert built.to_pylist() == expected.to_pylist()


@pytest.mark.parametrize(("sql", "parameters"), [
    ("SELECT unnest(?), unnest(?)", [[b"a", b"b"], ["x"]]),  # lengths differ: DuckDB pads
    ("SELECT unnest(?)", [[]]),  # no row: DuckDB's type NULL
    ("SELECT unnest(?)", [[None, None]]),  # NULLs only: type NULL
    ("SELECT unnest(?)", [None]),
    ("SELECT unnest(?)", [[b"a", "b"]]),  # mixed kinds
    ("SELECT unnest(?)", [[1, 2]]),  # numbers: DuckDB's types
    ("SELECT unnest(?)", [[bytearray(b"a")]]),
    ("SELECT unnest(?)", [(b"a",)]),  # a tuple: not a list
    ("SELECT unnest(?)", [["\udc80"]]),  # not UTF-8: DuckDB's error
    ("SELECT unnest(?) AS d", [[b"a"]]),  # an alias
    ("SELECT unnest(?) d", [[b"a"]]),
    ("SELECT unnest(?) FROM t", [[b"a"]]),
    ("SELECT unnest(?);", [[b"a"]]),
    ("SELECT unnest(?), unnest($2)", [[b"a"], [b"b"]]),  # ? and $n mixed
    ("SELECT unnest($1), unnest($1)", [[b"a"], [b"b"]]),  # one twice
    ("SELECT unnest($2)", [[b"a"], [b"b"]]),  # $1 not used
    ("SELECT unnest(?)", [[b"a"], [b"b"]]),  # more parameters than markers
    ("SELECT unnest(?), unnest(?)", [[b"a"]]),
    ("SELECT unnest(unnest(?))", [[[b"a"]]]),
    ("SELECT unnest(?)", {"x": [b"a"]}),
    ("SELECTunnest(?)", [[b"a"]]),
    ("WITH x AS (SELECT 1) SELECT unnest(?)", [[b"a"]]),
])  # fmt: skip
def test_other_shapes_are_left_to_duckdb(sql: str, parameters: Any) -> None:
    assert unnest_source.unnested(sql, parameters) is None


def _duckdb_refuses(sql: str, parameters: Any) -> bool:
    try:
        _duckdb(sql, parameters)
    except duckdb.Error:
        return True
    return False


@pytest.mark.parametrize("sql", [
    "\u017felect unnest(?)",  # U+017F folds to "s" under Python's case-insensitive match
    "SELECT unne\u017ft(?)",
    "SELECT\x1cunnest(?)",  # blanks to Python's Unicode \s, not to DuckDB
    "SELECT\x1funnest(?)",
    "SELECT\x85unnest(?)",
    "SELECT\u1680unnest(?)",
    "SELECT\u2028unnest(?)",
    "SELECT unnest\u2029(?)",
    "SELECT unnest(\x1e?)",
])  # fmt: skip
def test_a_text_duckdb_refuses_is_left_to_it(sql: str) -> None:
    """Found by a review of round 35: these texts were built, so statements that fail in
    DuckDB succeeded."""
    assert _duckdb_refuses(sql, [[b"a"]])
    assert unnest_source.unnested(sql, [[b"a"]]) is None


def test_the_dbapi_refuses_such_a_text_as_duckdb_does(tmp_path: Path) -> None:
    connection = dbapi.connect(str(tmp_path / "db"), autocommit=True)
    try:
        cursor = connection.cursor()
        cursor.execute("CREATE TOPIC t (CONSUMER c)")
        with pytest.raises(dbapi.Error) as refused:
            cursor.execute("INSERT INTO TOPIC t (data) SELECT unne\u017ft(?)", [[b"a"]])
        assert refused.value.sqlstate == "42883"
        with pytest.raises(dbapi.Error) as refused:
            cursor.execute("INSERT INTO TOPIC t (data) SELECT\x1cunnest(?)", [[b"a"]])
        assert refused.value.sqlstate == "42601"
    finally:
        connection.close()


def test_an_insert_into_a_topic_stores_the_same_messages_either_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The DB-API's batch INSERT through the built table and through DuckDB: the same
    messages at the same offsets, and a NULL message refused the same way."""
    data = [f"m{i}".encode() for i in range(300)]
    ids = [f"p{i % 7}" for i in range(300)]
    found = {}
    built: list[int] = []
    real = unnest_source.unnested

    def counted(sql: str, parameters: Any) -> Any:
        table = real(sql, parameters)
        if table is not None:
            built.append(table.num_rows)
        return table

    for way in ("built", "duckdb"):
        if way == "built":
            monkeypatch.setattr(unnest_source, "unnested", counted)
        else:
            monkeypatch.setattr(unnest_source, "unnested", lambda sql, parameters: None)
        connection = dbapi.connect(str(tmp_path / way), autocommit=True)
        try:
            cursor = connection.cursor()
            cursor.execute("CREATE TOPIC t (CONSUMER c) WITH (min_active_partitions = 20)")
            cursor.execute("INSERT INTO TOPIC t (data, producer_id) SELECT unnest(?), unnest(?)",
                           [data, ids])  # fmt: skip
            with pytest.raises(dbapi.Error) as refused:
                cursor.execute("INSERT INTO TOPIC t (data) SELECT unnest(?)", [[b"a", None]])
            cursor.execute("SELECT partition, offset, data, producer_id, seq_no FROM TOPIC t "
                           "WITH (consumer = 'c', max_messages = 1000)")  # fmt: skip
            found[way] = (sorted(cursor.fetchall()), refused.value.sqlstate)
        finally:
            connection.close()
    assert built == [300, 2]  # the fast way ran for both statements
    assert found["built"] == found["duckdb"]
    assert len(found["built"][0]) == 300


def test_query_arrow_builds_it_without_duckdb() -> None:
    connection = duckdb.connect()
    try:
        table = tables.query_arrow(connection, "SELECT unnest(?)", [[b"a", None]])
        assert table is not None and table.to_pylist() == [{"unnest($1)": b"a"},
                                                            {"unnest($1)": None}]  # fmt: skip
    finally:
        connection.close()
