"""Fixes of ``engine.key_lookup`` after its second review (R5): a build's batches sized by
the widest row and a table past the cap not read (B), versions by exact table name (D),
settings that change no table and a session's names found plain again (C). Each test
failed before its fix.
"""

from __future__ import annotations

from typing import Any

import pytest

from engine import key_lookup
from engine.database import Database
from engine.session import Session
from tests.engine.test_key_lookup import served as served  # a fixture
from tests.engine.test_key_lookup_review import read_bytes as read_bytes  # a fixture


def _rows(session: Session, sql: str, parameters: Any = None) -> list[dict[str, Any]]:
    return session.execute(sql, parameters)[-1].table.to_pylist()


def _skewed_docs(session: Session) -> None:
    """16 narrow rows first (all a sample of the first rows would see), then 2032 rows of
    20 kB: ~40 MB."""
    session.execute("CREATE TABLE docs (k BIGINT PRIMARY KEY, body VARCHAR)")
    session.execute("INSERT INTO docs SELECT i, 'x' FROM range(16) t(i)")
    session.execute("INSERT INTO docs SELECT i, repeat('y', 20000) FROM range(16, 2048) t(i)")


# -- B: batches by the widest row; a table past the cap is not read ------------------------------
def test_skewed_rows_are_read_in_batches_of_about_a_mebibyte(
    session: Session, served: list[int], monkeypatch: pytest.MonkeyPatch, read_bytes: list[int]
) -> None:
    """Before: the batch size came from the first 16 rows (1 byte each): one 2048-row
    batch of ~40 MB, 39x the batch size (and, under a small cap, 39x the cap)."""
    _skewed_docs(session)
    monkeypatch.setenv(key_lookup.BYTES_VARIABLE, str(64 << 20))
    for _ in range(2):
        assert _rows(session, "SELECT body FROM docs WHERE k = 2047") == [{"body": "y" * 20000}]
    assert served, "the index answered"
    assert sum(read_bytes) > 40_000_000  # the whole table was read...
    assert max(read_bytes) <= 2 * key_lookup._BATCH_BYTES  # ...in batches of ~1 MiB


def test_a_table_whose_rows_pass_the_cap_is_not_read(
    session: Session, served: list[int], monkeypatch: pytest.MonkeyPatch, read_bytes: list[int]
) -> None:
    """DuckDB's row count and the first rows say 2048 small rows; the sum of the rows'
    bytes says 40 MB, past the 1 MiB cap: no batch is read at all (before: one of 40 MB)."""
    _skewed_docs(session)
    monkeypatch.setenv(key_lookup.BYTES_VARIABLE, str(1 << 20))
    for _ in range(3):
        assert _rows(session, "SELECT k FROM docs WHERE k = 2047") == [{"k": 2047}]
    assert not served and read_bytes == []


# -- D: versions by exact name ------------------------------------------------------------------
def test_a_change_of_other_tables_never_moves_a_tables_version() -> None:
    """Before: names hashed into 1024 buckets; thousands of other names share some."""
    changes = key_lookup.TableChanges()
    before = changes.basis("kv")
    for i in range(5000):
        names = frozenset({f"t{i}"})
        changes.changing(names)
        assert changes.basis("kv") == before
        changes.changed(names)
    assert changes.basis("kv") == before
    changes.changing(frozenset({"kv"}))
    assert changes.basis("kv") is None
    changes.changed(frozenset({"kv"}))
    assert changes.basis("kv") not in (None, before)


def test_forgotten_names_only_ever_move_forwards(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past ``_NAMES_MAX`` names the oldest are forgotten (none under way): a version
    never comes back to an earlier value and a change always moves it."""
    monkeypatch.setattr(key_lookup, "_NAMES_MAX", 4)
    changes = key_lookup.TableChanges()
    seen: dict[str, list[tuple[int, int]]] = {}
    held = frozenset({"held"})
    changes.changing(held)  # under way all along: never forgotten
    for step in range(200):
        name = f"t{step % 13}"
        before = changes.basis(name)
        changes.changing(frozenset({name}))
        changes.changed(frozenset({name}))
        after = changes.basis(name)
        assert after is not None and after != before
        for other in ("t0", "t5", "never"):
            basis = changes.basis(other)
            assert basis is not None
            history = seen.setdefault(other, [])
            assert not history or basis >= history[-1]
            history.append(basis)
        assert changes.basis("held") is None
        assert len(changes._versions) <= 4 + 1
    changes.changed(held)
    assert changes.basis("held") is not None


def test_writes_to_a_neighbour_do_not_raise_this_tables_threshold(
    database: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R5's probe: a table whose name hashed into ``kv``'s old bucket is written between
    bursts of lookups of ``kv`` (whose index never pays, so each change of kv itself would
    raise its threshold 4-fold). Before: kv's threshold grew 2 -> 8 -> 32 -> 128 -> 512."""
    monkeypatch.setattr(key_lookup, "FIRST_BUILD_LOOKUPS", 2)
    monkeypatch.setattr(key_lookup, "SAVING_PER_LOOKUP_S", 1e-12)  # an index never "pays"
    monkeypatch.delenv(key_lookup.BYTES_VARIABLE, raising=False)
    neighbour = next(f"t{i}" for i in range(100000) if hash(f"t{i}") % 1024 == hash("kv") % 1024)
    reader, writer = database.connect(), database.connect()
    try:
        reader.execute("CREATE TABLE kv (k BIGINT PRIMARY KEY, v VARCHAR)")
        reader.execute("INSERT INTO kv VALUES (1, 'a')")
        reader.execute(f"CREATE TABLE {neighbour} (x INT)")
        stats = key_lookup.indexes_of(database).stats
        for _ in range(4):
            for _ in range(3):
                assert _rows(reader, "SELECT v FROM kv WHERE k = 1") == [{"v": "a"}]
            writer.execute(f"INSERT INTO {neighbour} VALUES (1)")
            assert _rows(reader, "SELECT v FROM kv WHERE k = 1") == [{"v": "a"}]
            assert stats["kv"].threshold == 2
        assert "kv" in key_lookup.indexes_of(database).indexes
    finally:
        reader.close()
        writer.close()


# -- C: settings and statistics change no table; a session's names found plain again ------------
@pytest.mark.parametrize(
    "other",
    [
        "SET search_path = 'main'",
        "SET search_path TO main",
        "SET schema = 'main'",
        "ANALYZE",
        "ANALYZE kv",
        "VACUUM",
        "COMMENT ON TABLE kv IS 'x'",
        "COMMENT ON COLUMN kv.v IS 'x'",
    ],
)
def test_a_setting_or_statistics_elsewhere_keeps_every_index(
    database: Database, served: list[int], other: str
) -> None:
    """Before: another session's SET search_path (what the wire sends at RESET ALL and
    DISCARD ALL), ANALYZE, VACUUM or COMMENT counted as a change of any table."""
    reader, writer = database.connect(), database.connect()
    try:
        reader.execute("CREATE TABLE kv (k BIGINT PRIMARY KEY, v VARCHAR)")
        reader.execute("INSERT INTO kv VALUES (1, 'a')")
        assert _rows(reader, "SELECT v FROM kv WHERE k = 1") == [{"v": "a"}]
        index = key_lookup.indexes_of(database).indexes["kv"]
        basis = key_lookup.TABLE_CHANGES.basis("kv")
        writer.execute(other)
        assert key_lookup.TABLE_CHANGES.basis("kv") == basis
        served.clear()
        assert _rows(reader, "SELECT v FROM kv WHERE k = 1") == [{"v": "a"}]
        assert served and key_lookup.indexes_of(database).indexes["kv"] is index
    finally:
        reader.close()
        writer.close()


def test_set_search_path_back_to_main_brings_lookups_back(
    session: Session, served: list[int]
) -> None:
    """Before: any SET ended the session's lookups for good (a pooled connection after
    RESET ALL / DISCARD ALL, which send SET search_path = 'main', never had them again).
    Elsewhere (search path s, a temporary table kv) DuckDB answers, by its own names."""
    session.execute("CREATE TABLE kv (k BIGINT PRIMARY KEY, v VARCHAR)")
    session.execute("INSERT INTO kv VALUES (1, 'main')")
    session.execute("CREATE SCHEMA s")
    lookup = "SELECT v FROM kv WHERE k = 1"
    assert _rows(session, lookup) == [{"v": "main"}] and served
    for setting, expected, from_index in [
        ("SET search_path = 's'", "main", False),
        ("SET search_path = 'main'", "main", True),
        ("SET schema = 's'", "main", False),
        ("SET schema = 'main'", "main", True),
        ("CREATE TEMP TABLE kv (k BIGINT PRIMARY KEY, v VARCHAR)", None, False),
        ("INSERT INTO temp.kv VALUES (1, 'temp')", "temp", False),
        ("DROP TABLE temp.kv", "main", True),
    ]:
        session.execute(setting)
        if expected is None:
            continue
        for _ in range(3):
            served.clear()
            assert _rows(session, lookup) == [{"v": expected}], setting
            assert bool(served) == from_index, setting


def test_a_names_query_only_after_a_change_of_names(
    session: Session, served: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The session asks DuckDB how its names resolve once after a SET (at its next
    lookup), not at every statement; while they are not plain it does not ask again
    until a SET, DROP or ALTER."""
    session.execute("CREATE TABLE kv (k BIGINT PRIMARY KEY, v VARCHAR)")
    session.execute("INSERT INTO kv VALUES (1, 'a')")
    asked: list[bool | None] = []
    names_plain = key_lookup.names_plain
    monkeypatch.setattr(key_lookup, "names_plain",
                        lambda cursor: asked.append(names_plain(cursor)) or asked[-1])  # fmt: skip
    lookup = "SELECT v FROM kv WHERE k = 1"
    for _ in range(3):
        _rows(session, lookup)
    assert asked == []
    session.execute("SET search_path = 'main'")
    session.execute("INSERT INTO kv VALUES (2, 'b')")  # no lookup: not asked
    for _ in range(3):
        _rows(session, lookup)
    assert asked == [True]
    session.execute("CREATE TEMP TABLE t (x INT)")
    for _ in range(3):
        _rows(session, lookup)
    session.execute("INSERT INTO kv VALUES (3, 'c')")
    _rows(session, lookup)
    assert asked == [True, False]
    session.execute("DROP TABLE t")
    for _ in range(3):
        _rows(session, lookup)
    assert asked == [True, False, True]


# -- R1-2 of round 14: one wide value no longer makes batches of one row ------------------------
def test_one_wide_value_does_not_make_the_index_a_batch_a_row(
    session: Session, served: list[int], read_bytes: list[int]
) -> None:
    """3000 narrow rows of 12 columns and one of 1 MB. Sized by the widest row alone the
    build read 3001 batches of one row, whose arrays cost ~1.2-1.4 KiB a column each
    (~50 MB here for ~0.3 MB of rows) and were not counted. Now a batch holds ~1 MiB on
    average and at most 16 MiB, and the index counts its batches' arrays."""
    columns = ", ".join(f"c{i} BIGINT" for i in range(10))
    session.execute(f"CREATE TABLE w (k BIGINT PRIMARY KEY, s VARCHAR, {columns})")
    values = ", ".join("i" for _ in range(10))
    session.execute(f"INSERT INTO w SELECT i, NULL, {values} FROM range(3000) t(i)")
    session.execute("INSERT INTO w (k, s) VALUES (-1, repeat('x', 1000000))")
    for _ in range(2):
        assert _rows(session, "SELECT c3 FROM w WHERE k = 2999") == [{"c3": 2999}]
    assert served, "the index answered"
    assert len(read_bytes) <= 200  # batches of 16 rows at the least, not 3001 of one
    index = key_lookup.indexes_of(session.database).indexes["w"]
    assert index.nbytes >= len(read_bytes) * 12 * key_lookup._BATCH_COLUMN_BYTES
