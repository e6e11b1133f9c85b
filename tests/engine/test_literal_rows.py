"""An INSERT of literal rows is read without sqlglot's parse of its rows (round 29, H4;
``planner.literal_rows``): the tree it gets is sqlglot's own, node for node, over many
generated statements; the engine's answers and refusals (SQLSTATE) are those of the full
parse; and the text is no longer parsed by sqlglot in full."""

from __future__ import annotations

import random
import tempfile
from typing import Any

import pytest
import sqlglot

import planner.duckdb_sql as duckdb_sql
from engine.database import Database
from engine.identity import Identity
from planner import literal_rows

# Values the fast path reads, and values that send the statement to sqlglot.
_PLAIN = [
    "0", "1", "-1", "42", "-7", "99999999999999999999999999999",
    "-170141183460469231731687303715884105728",
    "1.5", "-0.25", "3.14159265358979323846", "1e10", "1E-3", "-2.5e+7", "007",
    "'a'", "''", "'it''s'", "''''", "'NULL'", "'é中😀'", "'two\nlines'", "'tab\there'",
    "'  spaced  '", "'--not a comment'", "'/* nor this */'", "'$$'", "'\"'", "'x'' || ''y'",
    "NULL", "null", "TRUE", "false", "True",
]  # fmt: skip
_ODD = [
    "E'x\\ny'", "X'ab'", "$$dollar$$", "'back\\slash'", "U&'d\\0061t'", ".5", "1_000", "0x10",
    "+1", "- 1", "1.", "CAST(1 AS INTEGER)", "1::BIGINT", "1 + 1", "-(1)", "'a' 'b'",
    "'a' -- c\n", "/* c */ 1", "?", "$1", "DATE '2020-01-01'", "INTERVAL 1 DAY", "NULLX", "1e",
    "[1, 2]", "{'a': 1}", "(1)", "current_date", "DEFAULT", "--1",
    # not ASCII: sqlglot reads a name (a column), where Python's \\d and a case-blind match
    # would read a number or FALSE (round 29 lead's review)
    "\u0663", "\uff11", "1\u0663", "FAL\u017fE", "-\u0663",
]  # fmt: skip
_HEADS = [
    "INSERT INTO t VALUES", "insert into t values", "INSERT INTO main.t VALUES",
    "INSERT INTO t (a, b) VALUES", "INSERT\n  INTO t(a,b)\nVALUES",
    "INSERT OR REPLACE INTO t VALUES",
    "INSERT INTO t BY NAME VALUES", "INSERT INTO \"t\" VALUES", "VALUES", "  VALUES",
    "INSERT INTO t SELECT * FROM (VALUES", "WITH x AS (SELECT 1) INSERT INTO t VALUES",
]  # fmt: skip
_TAILS = [
    "", ";", " ;  ", "\n", " RETURNING a", " RETURNING *, 'x''y' AS z", " ON CONFLICT DO NOTHING",
    "\n-- the end", " /* c */", ") AS v(a, b)", " UNION ALL SELECT 1, 'x'", "; DROP TABLE t",
    " RETURNING\n  a,\n  b", " AS v(a, b)",
]  # fmt: skip
_GAPS = ["", " ", "  ", "\n", "\t", " \n  "]


def _full(sql: str) -> Any:
    return duckdb_sql._parse_one(sql)


def _statement(rng: random.Random, odd: bool) -> str:
    width = rng.randint(1, 4)
    rows = []
    for _ in range(rng.randint(2, 12)):
        values = [rng.choice(_PLAIN) for _ in range(width)]
        if odd and rng.random() < 0.3:
            values[rng.randrange(width)] = rng.choice(_ODD)
        gap = rng.choice(_GAPS)
        rows.append("(" + gap + ("," + rng.choice(_GAPS)).join(values) + rng.choice(_GAPS) + ")")
    return (
        rng.choice(_HEADS)
        + rng.choice(_GAPS)
        + ("," + rng.choice(_GAPS)).join(rows)
        + rng.choice(_TAILS)
    )


@pytest.fixture
def any_length(monkeypatch: Any) -> None:
    monkeypatch.setattr(literal_rows, "LITERAL_ROWS_CHARS_MIN", 0)


@pytest.mark.parametrize("odd", [False, True])
def test_the_built_tree_is_sqlglots(any_length: None, odd: bool) -> None:
    """Over generated statements (heads, tails, gaps, literals of every kind, and values
    the path must leave to sqlglot): wherever ``insert_tree`` answers, sqlglot's parse of
    the whole text gives the same tree — same nodes, keys, positions, same SQL."""
    rng = random.Random(29 + odd)
    built_count = 0
    for _ in range(1500):
        sql = _statement(rng, odd)
        built = literal_rows.insert_tree(sql, _full)
        if built is None:
            continue
        built_count += 1
        reference = _full(sql)  # a statement built must parse
        assert literal_rows.dump(built) == literal_rows.dump(reference), sql
        assert built.sql("duckdb") == reference.sql("duckdb"), sql
        assert built == reference, sql
    # the path is taken for a good share of them (plain rows, a head and tail sqlglot reads)
    assert built_count > (50 if odd else 300)


def test_plain_rows_take_the_path_and_odd_values_do_not(any_length: None) -> None:
    """Every plain literal of ``_PLAIN`` is read by the path; a row with any value of
    ``_ODD`` sends the statement to sqlglot (or sqlglot's tree is the same anyway)."""
    for value in _PLAIN:
        sql = f"INSERT INTO t VALUES ({value}, 1), (2, {value})"
        built = literal_rows.insert_tree(sql, _full)
        assert built is not None, value
        assert literal_rows.same_tree(built, _full(sql)), value
    for value in _ODD:
        sql = f"INSERT INTO t VALUES (1, 2), (2, {value})"
        built = literal_rows.insert_tree(sql, _full)
        assert built is None, value


def test_a_carriage_return_or_one_row_or_a_short_text_goes_to_sqlglot() -> None:
    rows = ", ".join(f"({i}, 'v{i}')" for i in range(200))
    assert literal_rows.insert_tree(f"INSERT INTO t VALUES {rows}", _full) is not None
    assert literal_rows.insert_tree(f"INSERT INTO t VALUES\r\n{rows}", _full) is None
    assert literal_rows.insert_tree("INSERT INTO t VALUES (1, 'a'), (2, 'b')", _full) is None
    one = "INSERT INTO t VALUES (1, '" + "x" * 2000 + "')"
    assert literal_rows.insert_tree(one, _full) is None


# -- through the engine --------------------------------------------------------------------

_COLUMNS = "a INTEGER, b VARCHAR, c BIGINT, d DOUBLE, e DECIMAL(38, 10), f BOOLEAN, g HUGEINT"


def _engine_rows(n: int) -> str:
    rng = random.Random(n)
    strings = ["'it''s'", "'é中😀'", "'two\nlines'", "''", "NULL", "'--x'", "'NULL'"]
    rows = []
    for i in range(n):
        rows.append(
            f"({i if i % 7 else 'NULL'}, {rng.choice(strings)}, {-i * 1000003}, "
            f"{rng.choice(['1.5', '-2.5e-3', '1e300', 'NULL', '0'])}, "
            f"{rng.choice(['123456789012345678.0123456789', '-1', 'NULL', '7.25'])}, "
            f"{rng.choice(['TRUE', 'false', 'NULL'])}, "
            f"{rng.choice(['170141183460469231731687303715884105727', '-3', 'NULL'])})"
        )
    return ",\n ".join(rows)


@pytest.fixture
def db() -> Any:
    database = Database.open(tempfile.mkdtemp(), retention_interval_s=None)
    admin = database.connect()
    for name in ("fast", "slow"):
        admin.execute(f"CREATE TABLE {name} ({_COLUMNS})")
        admin.execute(f"GRANT SELECT, INSERT ON {name} TO alice")
        admin.execute(f"CREATE TOPIC ev_{name}")
        admin.execute(f"GRANT SELECT, INSERT ON TOPIC ev_{name} TO alice")
    admin.execute(f"CREATE TABLE u ({_COLUMNS})")
    admin.execute("CREATE TOPIC ev_closed")
    return database


class _Spy:
    """Counts the trees ``insert_tree`` built, and the full sqlglot parses of each text."""

    def __init__(self, monkeypatch: Any) -> None:
        self.built = 0
        self.parsed: list[str] = []
        real_tree = duckdb_sql.insert_tree
        real_parse = duckdb_sql._parse_one

        def tree(sql: str, parse: Any) -> Any:
            built = real_tree(sql, parse)
            self.built += built is not None
            return built

        def parse(sql: str) -> Any:
            self.parsed.append(sql)
            return real_parse(sql)

        monkeypatch.setattr(duckdb_sql, "insert_tree", tree)
        monkeypatch.setattr(duckdb_sql, "_parse_one", parse)


def _session(db: Any, user: str) -> Any:
    return db.connect() if user == "super" else db.connect(Identity("alice", superuser=False))


def _off(monkeypatch: Any) -> None:
    monkeypatch.setattr(literal_rows, "LITERAL_ROWS_CHARS_MIN", 1 << 60)


def _table(db: Any, sql: str) -> list[dict[str, Any]]:
    return db.connect().execute(sql)[-1].table.to_pylist()  # type: ignore[no-any-return]


@pytest.mark.parametrize("user", ["alice", "super"])
def test_a_long_literal_insert_is_not_parsed_in_full_and_stores_the_same_rows(
    db: Any, monkeypatch: Any, user: str
) -> None:
    """Into a table: the fast path's rows (types, NULLs, quotes, unicode, big numbers) are
    those of the full parse, and sqlglot never parses the whole text (on main it did)."""
    rows = _engine_rows(3000)
    session = _session(db, user)
    spy = _Spy(monkeypatch)
    fast_sql = f"INSERT INTO fast VALUES {rows} RETURNING a, b"
    fast = session.execute(fast_sql)[-1]
    assert spy.built == 1
    assert fast_sql not in spy.parsed
    _off(monkeypatch)
    slow = session.execute(f"INSERT INTO slow VALUES {rows} RETURNING a, b")[-1]
    assert spy.built == 1
    assert fast.table.to_pylist() == slow.table.to_pylist()
    assert fast.table.schema == slow.table.schema
    fast_rows = _table(db, "SELECT * FROM fast ORDER BY c, a")
    assert len(fast_rows) == 3000
    assert fast_rows == _table(db, "SELECT * FROM slow ORDER BY c, a")


@pytest.mark.parametrize("user", ["alice", "super"])
def test_a_topic_named_plainly_gets_the_same_messages(db: Any, monkeypatch: Any, user: str) -> None:
    rows = ",\n".join(f"('g{i % 5}', 'it''s é {i}')" for i in range(2000))
    session = _session(db, user)
    spy = _Spy(monkeypatch)
    session.execute(f"INSERT INTO ev_fast (message_group_id, data) VALUES {rows}")
    assert spy.built >= 1
    _off(monkeypatch)
    session.execute(f"INSERT INTO ev_slow (message_group_id, data) VALUES {rows}")
    read = "SELECT CAST(data AS VARCHAR) AS d, message_group_id AS g FROM TOPIC {} ORDER BY 1"
    fast = _table(db, read.format("ev_fast"))
    assert len(fast) == 2000
    assert fast == _table(db, read.format("ev_slow"))


_REFUSED = [
    ("alice", "INSERT INTO u VALUES {rows}"),  # no INSERT on u: 42501
    ("alice", "INSERT INTO ev_closed (data, message_group_id) VALUES {rows2}"),  # 42501
    ("alice", "INSERT INTO nope VALUES {rows}"),  # 42P01
    ("super", "INSERT INTO nope VALUES {rows}"),
    ("alice", "INSERT INTO sys.topics VALUES {rows}"),
    ("alice", "INSERT INTO information_schema.tables VALUES {rows}"),
    ("super", "INSERT INTO pg_catalog.pg_class VALUES {rows}"),
    ("alice", "INSERT INTO fast VALUES {rows} RETURNING read_text('/etc/passwd')"),
    ("alice", "INSERT INTO fast VALUES {rows} RETURNING (SELECT count(*) FROM u)"),
    ("alice", "INSERT INTO fast VALUES {rows} RETURNING current_setting('threads')"),
    ("alice", "INSERT INTO fast VALUES {rows}; DROP TABLE u"),
    ("alice", "INSERT INTO fast (a, zz) VALUES {rows2}"),
    ("alice", "INSERT INTO fast VALUES {rows2}"),  # too few values for the columns
]


@pytest.mark.parametrize(("user", "shape"), _REFUSED)
def test_what_the_full_path_refuses_stays_refused_with_the_same_sqlstate(
    db: Any, monkeypatch: Any, user: str, shape: str
) -> None:
    rows = ", ".join(f"({i}, 'v{i}', {i}, 1.5, 2.5, TRUE, {i})" for i in range(400))
    rows2 = ", ".join(f"('v{i}', 'g{i}')" for i in range(400))
    sql = shape.format(rows=rows, rows2=rows2)
    session = _session(db, user)
    spy = _Spy(monkeypatch)
    with pytest.raises(Exception) as fast:
        session.execute(sql)
    written = _table(db, "SELECT count(*) AS n FROM fast")[0]["n"]
    fast_parsed = list(spy.parsed)
    _off(monkeypatch)
    with pytest.raises(Exception) as slow:
        _session(db, user).execute(sql)
    fast_state = getattr(fast.value, "sqlstate", None)
    assert fast_state is not None
    assert fast_state == getattr(slow.value, "sqlstate", None)
    assert type(fast.value) is type(slow.value)
    # the fast side never had sqlglot parse a long text in full (the refusal came on the
    # built tree, or before any tree was needed)
    assert not [text for text in fast_parsed if len(text) > 10_000]
    if "nope" not in sql and "DROP" not in sql:
        assert spy.built >= 1
    assert _table(db, "SELECT count(*) AS n FROM u") == [{"n": 0}]
    # what each path wrote before its refusal (the INSERT before "; DROP": both ran it)
    assert _table(db, "SELECT count(*) AS n FROM fast") == [{"n": 2 * written}]


def test_sqlglot_still_refuses_what_it_cannot_parse(any_length: None) -> None:
    with pytest.raises(sqlglot.errors.ParseError):
        duckdb_sql.parse_duckdb("INSERT INTO t VALUES (1, 'a'), (2, 'b') RETURNING (")


def test_a_stop_inside_the_scan_of_rows_comes_out_as_raised(monkeypatch: Any) -> None:
    """The scan of the rows ticks the front's ``stop`` (a cancel, ``statement_timeout``):
    what it raises ends the parse, before sqlglot parsed the whole text."""
    from planner import front_work
    from storage.errors import QueryCanceledError

    sql = "INSERT INTO t VALUES " + ", ".join(f"({i}, 'v{i}')" for i in range(20_000))
    parsed: list[str] = []
    real = duckdb_sql._parse_one
    monkeypatch.setattr(duckdb_sql, "_parse_one", lambda text: parsed.append(text) or real(text))

    def stop() -> None:
        raise QueryCanceledError("canceling statement due to user request")

    with front_work.statement_front(stop), pytest.raises(QueryCanceledError):
        duckdb_sql.parse_duckdb(sql)
    assert sql not in parsed
    with front_work.statement_front(None):  # nothing stops it: the tree is sqlglot's
        assert duckdb_sql.parse_duckdb(sql) == real(sql)


@pytest.mark.parametrize("user", ["alice", "super"])
def test_a_long_literal_insert_is_walked_once(db: Any, monkeypatch: Any, user: str) -> None:
    """Its tree is walked once in full (the front's index, ``front_work.find_all``): the
    walks from its root visit about one tree's nodes, not two
    (``star_expansion.star_columns`` walked it on its own before)."""
    from sqlglot import expressions as exp

    visited = [0]
    real = {name: getattr(exp.Expression, name) for name in ("bfs", "dfs")}

    def counting(name: str) -> Any:
        def walk(self: Any, *args: Any, **kwargs: Any) -> Any:
            for node in real[name](self, *args, **kwargs):
                if isinstance(self, exp.Insert):
                    visited[0] += 1
                yield node

        return walk

    for name in real:
        monkeypatch.setattr(exp.Expression, name, counting(name))
    rows = ", ".join(f"({i}, 'v{i}', {i}, 1.5, 2.5, TRUE, {i})" for i in range(3000))
    _session(db, user).execute(f"INSERT INTO fast VALUES {rows}")
    nodes = 3000 * 8 + 3  # the rows' tuples and values, the Insert, Values and Table
    assert nodes <= visited[0] < 1.5 * nodes
    assert _table(db, "SELECT count(*) AS n FROM fast") == [{"n": 3000}]
