"""Primary-key lookups answered from an index beside DuckDB (``engine.key_lookup``).

Every answer is compared with DuckDB's own for the same statement (the path turned off
with ``TOPICBASE_KEY_INDEX_BYTES=0``), and each test checks the index answered (a spy on
``key_lookup._result``), so each fails without the feature or with a wrong answer.
"""

from __future__ import annotations

import random
import threading
from typing import Any

import pyarrow as pa
import pytest

from engine import key_lookup
from engine.database import Database
from engine.identity import Identity
from engine.result import Result
from engine.session import Session
from planner.key_lookup import lookup_shape
from storage.errors import TopicbaseError
from tests.key_lookup_spy import served_lookups

ALICE = Identity("alice", superuser=False)


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Lookups the index answered (appended to by a spy), with builds after 1 lookup
    (and every build counted as paid for: the threshold stays 1)."""
    return served_lookups(monkeypatch)


def _outcome(session: Session, sql: str, parameters: Any = None) -> tuple[Any, ...]:
    """What a client can see of a statement: tag, schema with metadata, values (NaN and
    -0.0 told apart by repr), or the error's class, SQLSTATE and message."""
    try:
        result: Result = session.execute(sql, parameters)[-1]
    except TopicbaseError as error:
        return ("error", type(error).__name__, error.sqlstate, str(error))
    table = result.table
    assert table is not None
    return (result.tag, table.schema, _Values(table))


_BITS = {pa.float32(): pa.int32(), pa.float64(): pa.int64(), pa.date32(): pa.int32()}


class _Values:
    """A table's values compared exactly: floats and dates by their bits (NaN and -0.0
    told apart, DuckDB's infinite dates past Python's), everything else by Arrow."""

    def __init__(self, table: pa.Table) -> None:
        columns = []
        for column in table.columns:
            array = column.combine_chunks()
            kind = _BITS.get(array.type)
            if kind is None and (pa.types.is_timestamp(array.type)
                                 or pa.types.is_time64(array.type)):  # fmt: skip
                kind = pa.int64()
            columns.append(array.view(kind) if kind is not None else array)
        self.table = pa.table(columns, names=[f"c{i}" for i in range(len(columns))])

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Values) and self.table.equals(other.table)

    def __repr__(self) -> str:
        return repr(self.table.to_pydict())


def _both(
    session: Session, monkeypatch: pytest.MonkeyPatch, sql: str, parameters: Any = None
) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    monkeypatch.setenv(key_lookup.BYTES_VARIABLE, "0")
    duckdb_way = _outcome(session, sql, parameters)
    monkeypatch.delenv(key_lookup.BYTES_VARIABLE)
    return duckdb_way, _outcome(session, sql, parameters)


# -- the shape ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "sql",
    [
        "SELECT v FROM kv WHERE k = $1",
        "select * from kv where k = ?",
        "SELECT kv.v AS x, k FROM kv WHERE 'a' = k",
        "SELECT t.v FROM kv t WHERE t.k = -5 AND t.j = $1",
    ],
)
def test_lookup_shapes_are_recognised(sql: str) -> None:
    assert lookup_shape(sql) is not None


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT v FROM main.kv WHERE k = 1",
        "SELECT v FROM kv WHERE k = 1 LIMIT 1",
        "SELECT v FROM kv WHERE k = 1 ORDER BY v",
        "SELECT DISTINCT v FROM kv WHERE k = 1",
        "SELECT v FROM kv WHERE k = 1 OR k = 2",
        "SELECT v FROM kv WHERE k = 1.5",
        "SELECT v FROM kv WHERE k = 1e3",
        "SELECT v FROM kv WHERE k = 007",
        "SELECT v FROM kv WHERE k = CAST($1 AS INTEGER)",
        "SELECT v FROM kv WHERE k = $1::INTEGER",
        "SELECT upper(v) FROM kv WHERE k = 1",
        "SELECT v + 1 FROM kv WHERE k = 1",
        "SELECT v FROM kv, other WHERE k = 1",
        "SELECT v FROM kv JOIN other USING (k) WHERE k = 1",
        "SELECT v FROM kv WHERE k = ? AND j = $1",
        "SELECT v FROM kv WHERE k = $2",
        "SELECT v FROM kv WHERE k IN (1, 2)",
        "SELECT v FROM kv WHERE k > 1",
        "SELECT * EXCLUDE (v) FROM kv WHERE k = 1",
        "SELECT count(*) FROM kv WHERE k = 1",
        "WITH x AS (SELECT 1) SELECT v FROM kv WHERE k = 1",
        "SELECT v FROM kv",
        "SELECT v FROM kv WHERE k = 'a\\b'",
        "SELECT v FROM other_alias.kv WHERE kv.k = 1",
        "SELECT v FROM kv WHERE other.k = 1",
        "SELECT v FROM read_csv('x') WHERE k = 1",
    ],
)
def test_other_statements_have_no_lookup_shape(sql: str) -> None:
    assert lookup_shape(sql) is None


# -- the same answers as DuckDB -----------------------------------------------------------------
TYPED_COLUMNS = {
    "b": ("BOOLEAN", lambda r: r.choice([True, False, None])),
    "i1": ("TINYINT", lambda r: r.choice([-128, 127, 0, None])),
    "u8": ("UBIGINT", lambda r: r.choice([0, 2**64 - 1, None])),
    "hi": ("HUGEINT", lambda r: r.choice([-(2**100), 2**100, None])),
    "f": ("FLOAT", lambda r: r.choice(["'nan'", "'-0.0'", "'inf'", 1.5, None])),
    "d": ("DOUBLE", lambda r: r.choice(["'nan'", "'-0.0'", "'-inf'", 1e300, None])),
    "dec": ("DECIMAL(18,3)", lambda r: r.choice(["'-12345.678'", 0, None])),
    "dec38": ("DECIMAL(38,10)", lambda r: r.choice(["'1234567890123.0000000001'", None])),
    "s": ("VARCHAR", lambda r: r.choice(["''", "'é✓ ''q'''", "'x'", None])),
    "bl": ("BLOB", lambda r: r.choice(["'\\x00\\xFF'::BLOB", "''::BLOB", None])),
    "dt": ("DATE", lambda r: r.choice(["'infinity'", "'2024-02-29'", "'0001-01-01'", None])),
    "tm": ("TIME", lambda r: r.choice(["'23:59:59.999999'", None])),
    "ts": ("TIMESTAMP", lambda r: r.choice(["'2024-01-01 01:02:03.456789'", "'-infinity'", None])),
    "tz": ("TIMESTAMPTZ", lambda r: r.choice(["'2024-01-01 01:02:03+05'", None])),
    "iv": ("INTERVAL", lambda r: r.choice(["INTERVAL 3 DAY", None])),
    "u": ("UUID", lambda r: r.choice(["'8d2f4b1e-0000-4000-8000-000000000001'", None])),
    "j": ("JSON", lambda r: r.choice(["'{\"a\": [1, 2]}'", None])),
    "li": ("INTEGER[]", lambda r: r.choice(["[1, NULL, 3]", "[]", None])),
    "st": ("STRUCT(a INTEGER, b VARCHAR)", lambda r: r.choice(["{'a': 1, 'b': 'x'}", None])),
    "mp": ("MAP(VARCHAR, INTEGER)", lambda r: r.choice(["MAP {'k': 1}", None])),
    "en": ("ENUM('x', 'y')", lambda r: r.choice(["'y'", "'x'", None])),
    "ar": ("VARCHAR[2]", lambda r: r.choice(["['a', NULL]", None])),
}


def _fill(session: Session, table: str, key_sql: str, keys: list[str], seed: int) -> None:
    rng = random.Random(seed)
    columns = ", ".join(f"{name} {kind}" for name, (kind, _) in TYPED_COLUMNS.items())
    session.execute(f"CREATE TABLE {table} ({key_sql}, {columns})")
    rows = []
    for key in keys:
        values = ["NULL" if (v := make(rng)) is None else str(v)
                  for _, make in TYPED_COLUMNS.values()]  # fmt: skip
        rows.append(f"({key}, {', '.join(values)})")
    session.execute(f"INSERT INTO {table} VALUES {', '.join(rows)}")


def test_every_type_comes_back_as_duckdb_gives_it(
    session: Session, served: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    keys = list(range(-20, 20))
    _fill(session, "wide", "k BIGINT PRIMARY KEY", [str(k) for k in keys], seed=5)
    queries = [
        "SELECT * FROM wide WHERE k = $1",
        "SELECT s, b, f, d, bl FROM wide WHERE k = $1",  # plain types: rows
        "SELECT dec AS money, ts, tz, li, st, mp, u, j, hi FROM wide WHERE k = $1",
        "SELECT wide.S, wide.dt FROM wide WHERE k = $1",
        "SELECT f, f AS g FROM wide WHERE k = $1",
        "SELECT en, ar, k FROM wide WHERE k = $1",
    ]
    for sql in queries:
        for key in [*keys, 99, -21]:
            duckdb_way, index_way = _both(session, monkeypatch, sql, [key])
            assert index_way == duckdb_way, (sql, key)
    assert len(served) >= len(queries) * 40


def test_literal_keys_varchar_and_composite_keys(
    session: Session, served: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    session.execute("CREATE TABLE names (n VARCHAR PRIMARY KEY, v INTEGER)")
    session.execute("INSERT INTO names VALUES ('a', 1), ('A', 2), ('', 3), ('é', 4), ('1', 5)")
    session.execute(
        "CREATE TABLE pairs (a INTEGER, b VARCHAR, c SMALLINT, v DOUBLE, PRIMARY KEY (b, a, c))"
    )
    # hash(-1) == hash(-2) in Python: keys ('x', -1, 7) and ('x', -2, 7) hash alike.
    session.execute(
        "INSERT INTO pairs VALUES (1, 'x', 7, 0.5), (1, 'y', 7, -0.0), (2, 'x', 7, 2), "
        "(-1, 'x', 7, -1), (-2, 'x', 7, -2)"
    )
    cases = [
        ("SELECT v FROM names WHERE n = 'a'", None),
        ("SELECT v FROM names WHERE n = 'A'", None),
        ("SELECT * FROM names WHERE n = $1", [""]),
        ("SELECT * FROM names WHERE n = $1", ["é"]),
        ("SELECT * FROM names WHERE n = $1", ["b"]),
        ("SELECT * FROM pairs WHERE a = 1 AND b = 'y' AND c = 7", None),
        ("SELECT v FROM pairs WHERE c = $3 AND b = $2 AND a = $1", [2, "x", 7]),
        ("SELECT v FROM pairs WHERE a = ? AND b = ? AND c = ?", [1, "x", 7]),
        ("SELECT v FROM pairs WHERE a = ? AND b = ? AND c = ?", [1, "z", 7]),
        ("SELECT v FROM pairs WHERE a = ? AND b = ? AND c = ?", [-1, "x", 7]),
        ("SELECT v FROM pairs WHERE a = ? AND b = ? AND c = ?", [-2, "x", 7]),
        ("SELECT v FROM pairs WHERE a = -1 AND b = 'y' AND c = 7", None),
    ]
    before = 0
    for sql, parameters in cases:
        duckdb_way, index_way = _both(session, monkeypatch, sql, parameters)
        assert index_way == duckdb_way, (sql, parameters)
        assert len(served) > before, sql  # answered from the index
        before = len(served)


def test_values_of_other_types_and_partial_keys_are_duckdbs_to_judge(
    session: Session, served: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A parameter of another type (text against an integer key, an int against a
    VARCHAR key, NULL, bool, float, out of range), a partial or doubled key, an unknown
    column: the answer (or error) is DuckDB's, whichever way it was taken."""
    session.execute("CREATE TABLE small (k INTEGER PRIMARY KEY, j INTEGER, v VARCHAR)")
    session.execute("INSERT INTO small VALUES (1, 1, 'one'), (0, 2, 'zero'), (-3, 3, 'neg')")
    session.execute("CREATE TABLE names (n VARCHAR PRIMARY KEY, v INTEGER)")
    session.execute("INSERT INTO names VALUES ('1', 1), ('a', 2)")
    cases: list[tuple[str, Any]] = [
        ("SELECT v FROM small WHERE k = $1", [v])
        for v in ["1", "01", " 1", "-3", "+1", "1.0", "x", "", True, 1.0, 1.5, None, 2**31,
                  -(2**31) - 1, 2**70, 0, -0]
    ]  # fmt: skip
    cases += [
        ("SELECT v FROM names WHERE n = $1", [1]),
        ("SELECT v FROM names WHERE n = $1", ["1"]),
        ("SELECT v FROM names WHERE n = $1", ["a\x00"]),
        ("SELECT v FROM names WHERE n = $1", ["\ud800"]),
        ("SELECT v FROM names WHERE n = $1", ["A"]),
        ("SELECT v FROM names WHERE n = 1", None),
        ("SELECT v FROM small WHERE k = '1'", None),
        ("SELECT v FROM small WHERE k = '01'", None),
        ("SELECT v FROM small WHERE k = 99999999999", None),
        ("SELECT v FROM small WHERE j = 1", None),
        ("SELECT v FROM small WHERE k = 1 AND k = 1", None),
        ("SELECT v FROM small WHERE k = 1 AND j = 1", None),
        ("SELECT nope FROM small WHERE k = 1", None),
        ("SELECT v FROM small WHERE k = $1", []),
        ("SELECT v FROM small WHERE k = $1", [1, 2]),
    ]
    for sql, parameters in cases:
        duckdb_way, index_way = _both(session, monkeypatch, sql, parameters)
        assert index_way == duckdb_way, (sql, parameters)
    assert served  # the canonical ones ("1", "-3", 0 ...) were answered from the index


# -- writes -------------------------------------------------------------------------------------
@pytest.fixture
def kv(session: Session) -> Session:
    session.execute("CREATE TABLE kv (k BIGINT PRIMARY KEY, v VARCHAR)")
    session.execute("INSERT INTO kv SELECT i, 'v' || i FROM range(1000) t(i)")
    return session


def _value(session: Session, key: int) -> Any:
    rows = session.execute("SELECT v FROM kv WHERE k = $1", [key])[0].table.to_pylist()
    return rows[0]["v"] if rows else None


def _index(session: Session) -> Any:
    return key_lookup.indexes_of(session.database).indexes.get("kv")


@pytest.mark.parametrize(
    ("write", "key", "expected"),
    [
        ("UPDATE kv SET v = 'new' WHERE k = 5", 5, "new"),
        ("DELETE FROM kv WHERE k = 5", 5, None),
        ("INSERT INTO kv VALUES (5000, 'new')", 5000, "new"),
        ("INSERT INTO kv VALUES (5, 'new') ON CONFLICT (k) DO UPDATE SET v = EXCLUDED.v", 5, "new"),
        ("INSERT OR REPLACE INTO kv VALUES (5, 'new')", 5, "new"),
        ("TRUNCATE kv", 5, None),
        ("ALTER TABLE kv ALTER v SET DEFAULT 'd'; INSERT INTO kv (k) VALUES (7000)", 7000, "d"),
        (
            "CREATE OR REPLACE TABLE kv (k BIGINT PRIMARY KEY, v VARCHAR); "
            "INSERT INTO kv VALUES (5, 'new')",
            5,
            "new",
        ),
        ("INSERT INTO kv SELECT 9000, 'new' FROM (SELECT 1) t", 9000, "new"),
        ("UPDATE kv SET v = 'new' FROM (SELECT 5 AS x) s WHERE kv.k = s.x", 5, "new"),
        ("BEGIN; UPDATE kv SET v = 'new' WHERE k = 5; COMMIT", 5, "new"),
        ("BEGIN; DELETE FROM kv WHERE k = 5; INSERT INTO kv VALUES (5, 'new'); COMMIT", 5, "new"),
    ],
)
def test_every_kind_of_write_is_seen_by_the_next_lookup(
    kv: Session, served: list[int], database: Database, write: str, key: int, expected: Any
) -> None:
    assert _value(kv, key) == ("v5" if key == 5 else None)
    assert _index(kv) is not None and served
    writer = database.connect()
    try:
        writer.execute(write)
    finally:
        writer.close()
    served.clear()
    assert _value(kv, key) == expected
    assert _value(kv, key) == expected
    assert served  # the second from a new index


def test_a_rolled_back_write_is_never_served_and_does_not_drop_the_index(
    kv: Session, served: list[int], database: Database
) -> None:
    assert _value(kv, 5) == "v5"
    index = _index(kv)
    writer = database.connect()
    try:
        writer.execute("BEGIN")
        writer.execute("UPDATE kv SET v = 'uncommitted' WHERE k = 5")
        writer.execute("INSERT INTO kv VALUES (-1, 'uncommitted')")
        assert _value(writer, 5) == "uncommitted"  # its own transaction: DuckDB's way
        served.clear()
        assert _value(kv, 5) == "v5" and _value(kv, -1) is None
        assert len(served) == 2 and _index(kv) is index
        writer.execute("ROLLBACK")
    finally:
        writer.close()
    served.clear()
    assert _value(kv, 5) == "v5" and _value(kv, -1) is None
    assert len(served) == 2 and _index(kv) is index


def test_a_failed_transaction_commit_changes_nothing(
    kv: Session, served: list[int], database: Database
) -> None:
    assert _value(kv, 5) == "v5"
    writer = database.connect()
    try:
        writer.execute("BEGIN")
        writer.execute("UPDATE kv SET v = 'lost' WHERE k = 5")
        with pytest.raises(TopicbaseError):
            writer.execute("SELECT 1/0")
        assert writer.execute("COMMIT")[0].tag == "ROLLBACK"
    finally:
        writer.close()
    assert _value(kv, 5) == "v5"


def test_lookups_inside_a_transaction_take_duckdbs_way(
    kv: Session, served: list[int], database: Database
) -> None:
    """A transaction's snapshot is its own: its lookups never come from the index."""
    assert _value(kv, 5) == "v5"
    served.clear()
    kv.execute("BEGIN")
    assert _value(kv, 5) == "v5"
    writer = database.connect()
    try:
        writer.execute("UPDATE kv SET v = 'later' WHERE k = 5")
    finally:
        writer.close()
    assert _value(kv, 5) == "v5"  # its snapshot
    kv.execute("COMMIT")
    assert not served
    assert _value(kv, 5) == "later"


def test_search_path_and_temporary_tables_are_respected(
    kv: Session, served: list[int], database: Database
) -> None:
    assert _value(kv, 5) == "v5"
    shadowing = database.connect()
    try:
        shadowing.execute("CREATE TEMP TABLE kv (k BIGINT PRIMARY KEY, v VARCHAR)")
        shadowing.execute("INSERT INTO kv VALUES (5, 'temporary')")
        served.clear()
        assert _value(shadowing, 5) == "temporary"
        assert not served
    finally:
        shadowing.close()
    other = database.connect()
    try:
        other.execute("CREATE SCHEMA s2")
        other.execute("CREATE TABLE s2.kv (k BIGINT PRIMARY KEY, v VARCHAR)")
        other.execute("INSERT INTO s2.kv VALUES (5, 'schema two')")
        other.execute("SET search_path = 's2'")
        served.clear()
        assert _value(other, 5) == "schema two"
        assert not served
    finally:
        other.close()
    served.clear()
    assert _value(kv, 5) == "v5"
    assert not served  # two tables named kv now: not indexed


def test_a_writer_committing_while_lookups_run_is_never_seen_stale(
    kv: Session, served: list[int], database: Database
) -> None:
    """Readers note the last value whose commit returned, then look it up: what they get
    is never older. Writers alternate autocommit and explicit transactions."""
    committed = [0]
    kv.execute("UPDATE kv SET v = '0' WHERE k = 1")
    stop = threading.Event()
    failures: list[str] = []

    def write() -> None:
        writer = database.connect()
        try:
            for n in range(1, 120):
                if n % 2:
                    writer.execute(f"UPDATE kv SET v = '{n}' WHERE k = 1")
                else:
                    writer.execute(f"BEGIN; UPDATE kv SET v = '{n}' WHERE k = 1; COMMIT")
                committed[0] = n
                if n % 10 == 0:
                    for _ in range(3):  # a few lookups to build an index again
                        _value(writer, 2)
        finally:
            stop.set()
            writer.close()

    def read() -> None:
        reader = database.connect()
        try:
            while not stop.is_set():
                floor = committed[0]
                seen = int(_value(reader, 1))
                if seen < floor:
                    failures.append(f"read {seen} after {floor} committed")
        finally:
            reader.close()

    threads = [threading.Thread(target=read) for _ in range(2)] + [threading.Thread(target=write)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not failures
    assert served


# -- the door -----------------------------------------------------------------------------------
def test_a_user_without_select_is_refused_even_with_an_index(
    kv: Session, served: list[int], database: Database
) -> None:
    assert _value(kv, 5) == "v5"
    assert _index(kv) is not None
    alice = database.connect(ALICE)
    try:
        with pytest.raises(TopicbaseError) as refused:
            _value(alice, 5)
        assert refused.value.sqlstate == "42501"
        kv.execute("GRANT SELECT ON kv TO alice")
        served.clear()
        assert _value(alice, 5) == "v5"
        assert served
        kv.execute("REVOKE SELECT ON kv FROM alice")
        with pytest.raises(TopicbaseError) as again:
            _value(alice, 5)
        assert again.value.sqlstate == "42501"
    finally:
        alice.close()


# -- when and how much --------------------------------------------------------------------------
def test_indexes_are_built_after_enough_lookups_and_held_under_the_cap(
    session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(key_lookup, "FIRST_BUILD_LOOKUPS", 3)
    registry = key_lookup.indexes_of(session.database)
    for name in ("t1", "t2"):
        session.execute(f"CREATE TABLE {name} (k INTEGER PRIMARY KEY, v VARCHAR)")
        session.execute(f"INSERT INTO {name} SELECT i, repeat('x', 50) FROM range(2000) t(i)")
    session.execute("SELECT v FROM t1 WHERE k = 1")
    session.execute("SELECT v FROM t1 WHERE k = 1")
    assert "t1" not in registry.indexes
    session.execute("SELECT v FROM t1 WHERE k = 1")
    assert "t1" in registry.indexes
    one = registry.indexes["t1"].nbytes
    monkeypatch.setenv(key_lookup.BYTES_VARIABLE, str(one + one // 2))  # room for one
    for _ in range(3):
        assert session.execute("SELECT v FROM t2 WHERE k = 7")[0].table.num_rows == 1
    assert list(registry.indexes) == ["t2"] and registry.nbytes <= one + one // 2
    monkeypatch.setenv(key_lookup.BYTES_VARIABLE, str(one // 4))  # too small for any
    session.execute("INSERT INTO t1 VALUES (-1, 'new')")  # t1 changed: counted again
    for _ in range(4):
        assert session.execute("SELECT v FROM t1 WHERE k = -1")[0].table.to_pylist() == [
            {"v": "new"}
        ]
    assert "t1" not in registry.indexes


def _builds(monkeypatch: pytest.MonkeyPatch, *, first: int) -> list[str]:
    """The tables the index was built for, in order (a spy on ``key_lookup._build``),
    with the first build after ``first`` lookups."""
    monkeypatch.setattr(key_lookup, "FIRST_BUILD_LOOKUPS", first)
    built: list[str] = []
    build = key_lookup._build
    monkeypatch.setattr(key_lookup, "_build", lambda d, n, *a: built.append(n) or build(d, n, *a))
    return built


def test_a_table_written_between_few_lookups_is_never_indexed(
    session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    built = _builds(monkeypatch, first=4)
    session.execute("CREATE TABLE hot (k INTEGER PRIMARY KEY, n INTEGER)")
    session.execute("INSERT INTO hot VALUES (1, 0)")
    for _round in range(20):
        for _ in range(3):
            session.execute("SELECT n FROM hot WHERE k = 1")
        session.execute("UPDATE hot SET n = n + 1 WHERE k = 1")
    assert built == []
    assert session.execute("SELECT n FROM hot WHERE k = 1")[0].table.to_pylist() == [{"n": 20}]


def test_an_index_dropped_before_it_paid_raises_the_threshold(
    session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(key_lookup, "FIRST_BUILD_LOOKUPS", 2)
    monkeypatch.setattr(key_lookup, "SAVING_PER_LOOKUP_S", 1e-12)  # no build ever pays
    registry = key_lookup.indexes_of(session.database)
    session.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, n INTEGER)")
    session.execute("INSERT INTO t VALUES (1, 0)")
    for _ in range(2):
        session.execute("SELECT n FROM t WHERE k = 1")
    assert "t" in registry.indexes
    session.execute("UPDATE t SET n = 1 WHERE k = 1")
    session.execute("SELECT n FROM t WHERE k = 1")  # finds the index stale: dropped
    assert "t" not in registry.indexes and registry.stats["t"].threshold == 8


def test_a_bad_byte_cap_is_refused(session: Session, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(key_lookup.BYTES_VARIABLE, "lots")
    with pytest.raises(TopicbaseError) as refused:
        key_lookup.bytes_max()
    assert refused.value.sqlstate == "22023"


def test_a_build_that_fails_leaves_the_lookup_to_duckdb(
    kv: Session, served: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    def failing(*arguments: Any) -> None:
        raise pa.ArrowNotImplementedError("no Arrow for this type")

    monkeypatch.setattr(key_lookup, "_read_table", failing)
    assert _value(kv, 5) == "v5"
    assert _value(kv, 5) == "v5"
    assert not served and _index(kv) is None


def test_a_table_looked_up_by_other_columns_is_indexed_once_at_most(
    session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first build learns the key; lookups by other columns no longer count."""
    built = _builds(monkeypatch, first=3)
    session.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, j INTEGER)")
    session.execute("INSERT INTO t SELECT i, i % 10 FROM range(100) r(i)")
    for round_ in range(5):
        for _ in range(20):  # counted, the threshold (3, then 12, 48) would be met twice
            assert session.execute("SELECT k FROM t WHERE j = 3")[0].table.num_rows == 10
        session.execute(f"UPDATE t SET j = j WHERE k = {round_}")
    assert built == ["t"]
    threshold = key_lookup.indexes_of(session.database).stats["t"].threshold  # 12: unpaid
    for _ in range(threshold):
        assert session.execute("SELECT j FROM t WHERE k = 42")[0].table.to_pylist() == [{"j": 2}]
    assert built == ["t", "t"]
