"""Fixes of ``engine.key_lookup`` after its review: integer keys past 2**53, a build bounded
by the byte cap as it reads, statements that change no table keeping every index, names
folded as DuckDB folds them, a cancelled build, a malformed cap. Each test failed before
its fix; answers are compared with DuckDB's own (``_both``) as in ``test_key_lookup``.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from engine import key_lookup
from engine.database import Database
from engine.session import Session
from grammar.parse import parse_one
from storage.errors import TopicbaseError
from tests.engine.test_key_lookup import _both
from tests.engine.test_key_lookup import served as served  # a fixture


def _rows(session: Session, sql: str, parameters: Any = None) -> list[dict[str, Any]]:
    return session.execute(sql, parameters)[-1].table.to_pylist()


# -- integer keys compared in their own type ----------------------------------------------------
@pytest.mark.parametrize(
    ("kind", "keys"),
    [
        ("UBIGINT", [0, 1, 2**53, 2**53 + 1, 2**53 + 2, 2**62 + 1, 2**62 + 3, 2**63, 2**64 - 1]),
        ("BIGINT", [-(2**63), -(2**53) - 1, 2**53, 2**53 + 1, 2**62 + 3, 2**63 - 1]),
    ],
)
def test_integer_keys_past_2_to_the_53_are_found(
    session: Session,
    served: list[int],
    monkeypatch: pytest.MonkeyPatch,
    kind: str,
    keys: list[int],
) -> None:
    session.execute(f"CREATE TABLE big (k {kind} PRIMARY KEY, v VARCHAR)")
    session.execute("INSERT INTO big VALUES " + ", ".join(f"({k}, 'v{k}')" for k in keys))
    for key in [*keys, 2**53 + 3, 2**62 + 2]:
        for sql, parameters in [("SELECT v FROM big WHERE k = $1", [key]),
                                (f"SELECT v FROM big WHERE k = {key}", None)]:  # fmt: skip
            duckdb_way, index_way = _both(session, monkeypatch, sql, parameters)
            assert index_way == duckdb_way, (sql, parameters)
        served.clear()
        expected = [{"v": f"v{key}"}] if key in keys else []
        assert _rows(session, "SELECT v FROM big WHERE k = $1", [key]) == expected
        assert served  # from the index


# -- the byte cap bounds what a build reads -----------------------------------------------------
@pytest.fixture
def read_bytes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The bytes of each batch a build took from DuckDB's reader."""
    seen: list[int] = []
    original = key_lookup._read_batches

    def counted(reader: Any, *arguments: Any) -> Any:
        def batches() -> Any:
            for batch in reader:
                seen.append(batch.nbytes)
                yield batch

        return original(batches(), *arguments)

    monkeypatch.setattr(key_lookup, "_read_batches", counted)
    return seen


def test_a_build_stops_reading_once_it_passes_the_cap(
    session: Session, served: list[int], monkeypatch: pytest.MonkeyPatch, read_bytes: list[int]
) -> None:
    """Narrow rows first (DuckDB's estimate sees a small table), then 40 MB of documents:
    the scan of the rows' bytes finds the table past the 4 MiB cap and nothing is read;
    and were that sum wrong (``_row_bytes`` saying 1 byte a row), the build still stops
    one batch past the cap instead of reading it all."""
    cap = 4 << 20
    session.execute("CREATE TABLE docs (k BIGINT PRIMARY KEY, body VARCHAR)")
    session.execute("INSERT INTO docs SELECT i, 'x' FROM range(5000) t(i)")
    session.execute("INSERT INTO docs SELECT i, repeat('y', 2000) FROM range(5000, 25000) t(i)")
    monkeypatch.setenv(key_lookup.BYTES_VARIABLE, str(cap))
    for _ in range(3):
        assert _rows(session, "SELECT length(body) AS n FROM docs WHERE k = 1") == [{"n": 1}]
    assert not served and read_bytes == []
    session.execute("INSERT INTO docs VALUES (-1, 'z')")  # a change: the table is tried again
    monkeypatch.setattr(key_lookup, "_row_bytes", lambda columns: "1")
    for _ in range(3):
        assert _rows(session, "SELECT length(body) AS n FROM docs WHERE k = 1") == [{"n": 1}]
        assert _rows(session, "SELECT k FROM docs WHERE k = 24999") == [{"k": 24999}]
    assert not served and key_lookup.indexes_of(session.database).indexes.get("docs") is None
    assert read_bytes, "a build was started"
    assert sum(read_bytes) <= cap + max(read_bytes)  # one batch past the cap, once
    assert sum(read_bytes) < 40_000_000 // 4


def test_a_table_whose_sample_says_it_is_past_the_cap_is_not_read(
    session: Session, served: list[int], monkeypatch: pytest.MonkeyPatch, read_bytes: list[int]
) -> None:
    session.execute("CREATE TABLE docs (k BIGINT PRIMARY KEY, body VARCHAR)")
    session.execute("INSERT INTO docs SELECT i, repeat('x', 100000) FROM range(400) t(i)")
    monkeypatch.setenv(key_lookup.BYTES_VARIABLE, str(4 << 20))
    for _ in range(3):
        assert _rows(session, "SELECT k FROM docs WHERE k = 7") == [{"k": 7}]
    assert not served and read_bytes == []


def test_an_index_in_many_chunks_answers_every_row(
    session: Session, served: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An index read in batches of 16 rows (a chunk each): rows on the chunks' edges, of
    the rows' way and of DuckDB's Arrow (a LIST column), integer and hashed keys."""
    monkeypatch.setattr(key_lookup, "READ_ROWS", 16)
    session.execute("CREATE TABLE n (k INTEGER PRIMARY KEY, v VARCHAR, l INTEGER[])")
    session.execute("INSERT INTO n SELECT 1000 - i, 'v' || i, [i] FROM range(500) t(i)")
    session.execute("CREATE TABLE s (k VARCHAR PRIMARY KEY, v INTEGER)")
    session.execute("INSERT INTO s SELECT 'k' || i, i FROM range(500) t(i)")
    _rows(session, "SELECT v FROM n WHERE k = 1")
    assert key_lookup.indexes_of(session.database).indexes["n"].table.column(0).num_chunks > 5
    for key in [501, 502, 515, 516, 517, 1000, 999, 985, 984, 500, 0, 2000]:
        for sql in ["SELECT v FROM n WHERE k = $1", "SELECT l, v FROM n WHERE k = $1"]:
            duckdb_way, index_way = _both(session, monkeypatch, sql, [key])
            assert index_way == duckdb_way, (sql, key)
        duckdb_way, index_way = _both(session, monkeypatch, "SELECT v FROM s WHERE k = $1",
                                      [f"k{key % 600}"])  # fmt: skip
        assert index_way == duckdb_way, key
    assert len(served) >= 30


# -- statements that change no table ------------------------------------------------------------
@pytest.fixture
def changes(monkeypatch: pytest.MonkeyPatch) -> list[frozenset[str] | None]:
    """The names of every change bracketed from now on (None: any table). Tested by name:
    names share ``TableChanges``' buckets, so a version may move for another table."""
    seen: list[frozenset[str] | None] = []
    changing = key_lookup.TABLE_CHANGES.changing

    def spy(names: frozenset[str] | None) -> None:
        seen.append(names)
        changing(names)

    monkeypatch.setattr(key_lookup.TABLE_CHANGES, "changing", spy)
    return seen


@pytest.fixture
def builds(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    built: list[str] = []
    build = key_lookup._build
    monkeypatch.setattr(key_lookup, "_build", lambda d, n, *a: built.append(n) or build(d, n, *a))
    return built


@pytest.mark.parametrize(
    "other",
    [
        "SHOW TABLES",
        "SHOW ALL TABLES",
        "DESCRIBE kv",
        "SUMMARIZE kv",
        "CHECKPOINT",
        "-- ping",
        "EXPLAIN SELECT v FROM kv WHERE k = 1",
        "EXPLAIN UPDATE kv SET v = 'x' WHERE k = 1",
        "PRAGMA version",
        "PRAGMA table_info('kv')",
        "CREATE TABLE unrelated (a INTEGER)",
        "CREATE VIEW unrelated AS SELECT 1 AS a",
        "CREATE INDEX unrelated_a ON other (a)",
        "ALTER TABLE other ADD COLUMN b INTEGER",
        "DROP TABLE other",
        "TRUNCATE other",
    ],
)
def test_statements_that_change_no_indexed_table_keep_its_index(
    session: Session,
    database: Database,
    served: list[int],
    changes: list[frozenset[str] | None],
    other: str,
) -> None:
    session.execute("CREATE TABLE kv (k BIGINT PRIMARY KEY, v VARCHAR)")
    session.execute("CREATE TABLE other (a INTEGER)")
    session.execute("INSERT INTO kv VALUES (1, 'a')")
    assert _rows(session, "SELECT v FROM kv WHERE k = 1") == [{"v": "a"}]
    changes.clear()
    writer = database.connect()
    try:
        writer.execute(other)
    finally:
        writer.close()
    assert None not in changes and not any("kv" in names for names in changes if names)
    served.clear()
    assert _rows(session, "SELECT v FROM kv WHERE k = 1") == [{"v": "a"}]
    assert served


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ("TRUNCATE kv; INSERT INTO kv VALUES (1, 'b')", "b"),
        (
            "ALTER TABLE kv RENAME TO kv_old; CREATE TABLE kv AS SELECT 1::BIGINT AS k, 'c' AS v",
            None,
        ),
        ("CREATE INDEX kv_v ON kv (v); UPDATE kv SET v = 'd' WHERE k = 1", "d"),
    ],
)
def test_statements_that_do_change_it_are_still_seen(
    session: Session, database: Database, served: list[int], change: str, expected: str | None
) -> None:
    session.execute("CREATE TABLE kv (k BIGINT PRIMARY KEY, v VARCHAR)")
    session.execute("INSERT INTO kv VALUES (1, 'a')")
    assert _rows(session, "SELECT v FROM kv WHERE k = 1") == [{"v": "a"}]
    assert served
    writer = database.connect()
    try:
        writer.execute(change)
    finally:
        writer.close()
    if expected is None:  # kv is a table without a key now: DuckDB's way
        assert _rows(session, "SELECT v FROM kv WHERE k = 1") == [{"v": "c"}]
        return
    served.clear()
    assert _rows(session, "SELECT v FROM kv WHERE k = 1") == [{"v": expected}]
    assert _rows(session, "SELECT v FROM kv WHERE k = 1") == [{"v": expected}]
    assert served


def test_a_client_listing_tables_now_and_then_does_not_turn_the_path_off(
    database: Database, monkeypatch: pytest.MonkeyPatch, builds: list[str]
) -> None:
    monkeypatch.setattr(key_lookup, "FIRST_BUILD_LOOKUPS", 4)
    monkeypatch.setattr(key_lookup, "SAVING_PER_LOOKUP_S", 1e-12)  # no build ever pays
    monkeypatch.delenv(key_lookup.BYTES_VARIABLE, raising=False)
    looking, listing = database.connect(), database.connect()
    try:
        looking.execute("CREATE TABLE kv (k BIGINT PRIMARY KEY, v VARCHAR)")
        looking.execute("INSERT INTO kv SELECT i, 'v' || i FROM range(100) t(i)")
        for _cycle in range(6):
            for key in range(10):
                assert _rows(looking, "SELECT v FROM kv WHERE k = $1", [key]) == [{"v": f"v{key}"}]
            listing.execute("SHOW TABLES")
            listing.execute("DESCRIBE kv")
        assert builds == ["kv"]
        assert key_lookup.indexes_of(database).stats["kv"].threshold == 4
    finally:
        looking.close()
        listing.close()


def test_a_change_that_may_be_of_any_table_does_not_raise_the_threshold(
    session: Session, database: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(key_lookup, "FIRST_BUILD_LOOKUPS", 2)
    monkeypatch.setattr(key_lookup, "SAVING_PER_LOOKUP_S", 1e-12)  # no build ever pays
    registry = key_lookup.indexes_of(database)
    session.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, n INTEGER)")
    session.execute("INSERT INTO t VALUES (1, 0)")
    for _ in range(2):
        session.execute("SELECT n FROM t WHERE k = 1")
    assert "t" in registry.indexes
    session.execute("CREATE SCHEMA elsewhere")  # not known to spare t: every index is stale
    session.execute("SELECT n FROM t WHERE k = 1")
    assert "t" not in registry.indexes and registry.stats["t"].threshold == 2
    session.execute("SELECT n FROM t WHERE k = 1")
    assert "t" in registry.indexes
    session.execute("UPDATE t SET n = 1 WHERE k = 1")  # t itself: the threshold grows
    session.execute("SELECT n FROM t WHERE k = 1")
    assert "t" not in registry.indexes and registry.stats["t"].threshold == 8


@pytest.mark.parametrize("target", ["other", "kv"])
def test_a_bulk_table_write_names_its_table(
    session: Session,
    database: Database,
    served: list[int],
    changes: list[frozenset[str] | None],
    target: str,
) -> None:
    session.execute("CREATE TABLE kv (k BIGINT PRIMARY KEY, v BIGINT)")
    session.execute("CREATE TABLE other (k BIGINT PRIMARY KEY, v BIGINT)")
    session.execute("INSERT INTO kv VALUES (1, 10)")
    assert _rows(session, "SELECT v FROM kv WHERE k = 1") == [{"v": 10}]
    changes.clear()
    writer = database.connect()
    try:
        writes = writer.bulk_writes()
        writes.start(writer, "w1", "table", target, mode="upsert", key=("k",))
        batch = pa.record_batch([pa.array([1], pa.int64()), pa.array([5], pa.int64())],
                                names=["k", "v"])  # fmt: skip
        writes.append(writer, "w1", [batch], batch.schema)
        writes.commit(writer, "sink1", 1, ["w1"])
    finally:
        writer.close()
    served.clear()
    assert _rows(session, "SELECT v FROM kv WHERE k = 1") == [{"v": 5 if target == "kv" else 10}]
    assert _rows(session, "SELECT v FROM kv WHERE k = 1") == [{"v": 5 if target == "kv" else 10}]
    assert served
    assert None not in changes
    assert any(target in names for names in changes if names)
    assert any("kv" in names for names in changes if names) == (target == "kv")


# -- names folded as DuckDB folds them (ASCII only) ---------------------------------------------
KELVIN = "\u212a"  # K: Python lower-cases it to "k", DuckDB keeps it a name of its own


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT v FROM ä WHERE k = 1",
        'SELECT "ö" FROM "Ä" WHERE k = 1',
        'SELECT v FROM "Ä" WHERE "K" = 1',
        "SELECT v FROM kv WHERE k = 1",
        "SELECT v FROM kk WHERE k = 1",
        "SELECT k FROM kk WHERE id = 1",
        "SELECT v FROM kk WHERE id = 1",
        "SELECT ä.v FROM kk Ä WHERE ä.id = 1",
        "SELECT Ä.v FROM kk Ä WHERE Ä.id = 1",
    ],
)
def test_names_fold_in_ascii_only_as_duckdbs_do(
    session: Session, served: list[int], monkeypatch: pytest.MonkeyPatch, sql: str
) -> None:
    session.execute('CREATE TABLE "Ä" (k INTEGER PRIMARY KEY, v VARCHAR, "ö" INTEGER)')
    session.execute("INSERT INTO \"Ä\" VALUES (1, 'x', 7)")
    session.execute(f'CREATE TABLE "{KELVIN}v" (k INTEGER PRIMARY KEY, v VARCHAR)')
    session.execute(f"INSERT INTO \"{KELVIN}v\" VALUES (1, 'kelvin')")
    session.execute(f'CREATE TABLE kk (id INTEGER PRIMARY KEY, "{KELVIN}" INTEGER, v VARCHAR)')
    session.execute("INSERT INTO kk VALUES (1, 2, 'kk')")
    for _ in range(2):
        duckdb_way, index_way = _both(session, monkeypatch, sql)
        assert index_way == duckdb_way
    if sql == "SELECT v FROM kk WHERE id = 1":
        assert served  # a table with a non-ASCII column is still answered for its others


# -- cancel, timeout, a malformed cap, names kept -----------------------------------------------
@pytest.fixture
def small_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(key_lookup, "READ_ROWS", 16)
    monkeypatch.setattr(key_lookup, "_MIN_READ_ROWS", 16)


def test_a_cancel_ends_a_build_at_its_next_batch(
    session: Session,
    served: list[int],
    monkeypatch: pytest.MonkeyPatch,
    read_bytes: list[int],
    small_batches: None,
) -> None:
    session.execute("CREATE TABLE kv (k BIGINT PRIMARY KEY, v VARCHAR)")
    session.execute("INSERT INTO kv SELECT i, 'v' || i FROM range(2000) t(i)")
    keys = key_lookup._keys_of

    def cancel_after_one(*arguments: Any) -> Any:
        session.cancel()  # as a client's CancelRequest would, from another thread
        return keys(*arguments)

    monkeypatch.setattr(key_lookup, "_keys_of", cancel_after_one)
    with pytest.raises(TopicbaseError) as cancelled:
        session.execute("SELECT v FROM kv WHERE k = 5")
    assert cancelled.value.sqlstate == "57014"
    assert len(read_bytes) == 2  # stopped at the batch after the cancel, of 125
    assert not served and key_lookup.indexes_of(session.database).indexes.get("kv") is None
    monkeypatch.setattr(key_lookup, "_keys_of", keys)
    assert _rows(session, "SELECT v FROM kv WHERE k = 5") == [{"v": "v5"}]
    assert served  # the next statement built it


def test_a_statement_timeout_ends_a_build_of_a_streamed_lookup(
    session: Session, served: list[int], read_bytes: list[int], small_batches: None
) -> None:
    session.execute("CREATE TABLE kv (k BIGINT PRIMARY KEY, v VARCHAR)")
    session.execute("INSERT INTO kv SELECT i, 'v' || i FROM range(2000) t(i)")
    statement = parse_one("SELECT v FROM kv WHERE k = 5")
    with pytest.raises(TopicbaseError) as timed_out:  # a timeout already past: no timing
        session.open_stream(statement, None, no_rows=None, timeout_s=1e-9)
    assert timed_out.value.sqlstate == "57014" and "timeout" in str(timed_out.value)
    assert len(read_bytes) <= 1 and not served
    stream = session.open_stream(statement, None, no_rows=None)
    assert stream is not None
    try:
        assert stream.next_batch().to_pylist() == [{"v": "v5"}]
    finally:
        stream.close()
    assert served


def test_a_malformed_byte_cap_turns_the_path_off_without_failing_lookups(
    session: Session, served: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    session.execute("CREATE TABLE kv (k BIGINT PRIMARY KEY, v VARCHAR)")
    session.execute("INSERT INTO kv VALUES (5, 'v5')")
    monkeypatch.setenv(key_lookup.BYTES_VARIABLE, "lots")
    for _ in range(3):
        assert _rows(session, "SELECT v FROM kv WHERE k = 5") == [{"v": "v5"}]
    assert not served


def test_a_statement_merely_mentioning_temp_keeps_the_sessions_lookups(
    session: Session, served: list[int]
) -> None:
    session.execute("CREATE TABLE kv (k BIGINT PRIMARY KEY, v VARCHAR)")
    session.execute("INSERT INTO kv VALUES (5, 'temp')")
    session.execute("SELECT 'temporary' AS temp")
    session.execute("UPDATE kv SET v = 'temp' WHERE k IN (SELECT 5 AS temp)")
    assert _rows(session, "SELECT v FROM kv WHERE k = 5") == [{"v": "temp"}]
    assert served
    session.execute("CREATE TEMP TABLE scratch (a INTEGER)")  # a temporary relation: off
    served.clear()
    assert _rows(session, "SELECT v FROM kv WHERE k = 5") == [{"v": "temp"}]
    assert not served


def test_a_new_key_after_ddl_that_names_the_table_is_learned_again(
    session: Session, monkeypatch: pytest.MonkeyPatch, builds: list[str]
) -> None:
    """DDL now moves only its tables' versions: the key a build learned is forgotten at a
    schema change all the same (``tables.SCHEMA_GENERATIONS``), so lookups by the new
    key count towards a build again."""
    monkeypatch.setattr(key_lookup, "FIRST_BUILD_LOOKUPS", 3)
    monkeypatch.setattr(key_lookup, "SAVING_PER_LOOKUP_S", 1.0)  # the threshold stays 3
    monkeypatch.delenv(key_lookup.BYTES_VARIABLE, raising=False)
    session.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, j INTEGER)")
    session.execute("INSERT INTO t SELECT i, i + 100 FROM range(10) r(i)")
    for _ in range(3):
        assert _rows(session, "SELECT j FROM t WHERE k = 1") == [{"j": 101}]
    assert builds == ["t"]
    session.execute("CREATE OR REPLACE TABLE t (k INTEGER, j INTEGER PRIMARY KEY)")
    session.execute("INSERT INTO t SELECT i, i + 100 FROM range(10) r(i)")
    for _ in range(3):
        assert _rows(session, "SELECT k FROM t WHERE j = 101") == [{"k": 1}]
    assert builds == ["t", "t"]
    assert key_lookup.indexes_of(session.database).indexes["t"].key_columns == (1,)
