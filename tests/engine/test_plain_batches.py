"""``engine.writes.plain_batches``: rows of ``data`` alone (bytes or text, no statement
option) built straight into a wire batch must equal the general way,
``build_batches(table_from_rows(...))``, value for value and buffer for buffer of what
the log frames; every other row shape returns None so the general way decides (and
gives its errors); the message-count limit is the general way's error.
"""

from __future__ import annotations

import pyarrow as pa
import pytest

from engine.database import Database
from engine.writes import build_batches, plain_batches, table_from_rows
from storage import limits
from storage.clock import ManualClock
from storage.errors import LimitExceededError
from storage.record_batch import WIRE_SCHEMA

CLOCK = ManualClock()

PLAIN_ROWS = [
    [(b"x" * 1024,)],
    [(b"",)],
    [("",)],
    [("text",)],
    [("é ü ☃ \U0001f600",)],
    [(b"\x00\xff" * 7,)],
    [(b"a",), (b"",), (b"ccc",)],
    [("mixed",), (b"\x01bytes",), ("",), ("ü",)],
    [(bytes([i % 256]) * i,) for i in range(300)],
]


@pytest.mark.parametrize("rows", PLAIN_ROWS, ids=range(len(PLAIN_ROWS)))
def test_plain_rows_equal_the_general_way(rows: list[tuple]) -> None:
    [(partition, expected)] = build_batches(table_from_rows(("data",), rows), {}, CLOCK)
    got = plain_batches(("data",), rows, CLOCK)
    assert got is not None
    [(plain_partition, batch)] = got
    assert plain_partition is partition is None
    assert batch.schema.equals(WIRE_SCHEMA, check_metadata=True)
    assert batch.equals(expected)
    for name in WIRE_SCHEMA.names:  # nulls, types and values of every column
        assert batch.column(name).to_pylist() == expected.column(name).to_pylist(), name
        assert batch.column(name).null_count == expected.column(name).null_count, name
    assert batch.column("data").offset == 0
    batch.validate(full=True)


NOT_PLAIN = [
    (("data",), [(None,)]),  # NULL data: the general way's 22023
    (("data",), [(b"a",), (None,)]),
    (("data",), [(12,)]),  # other types: the general way converts or refuses them
    (("data",), [(bytearray(b"ab"),)]),
    (("data",), [(memoryview(b"ab"),)]),
    (("data",), [(True,)]),
    (("data",), []),
    (("data", "producer_id"), [(b"a", "p")]),  # other columns
    (("producer_id", "data"), [("p", b"a")]),
    (("metadata",), [("{}",)]),
]


@pytest.mark.parametrize(("columns", "rows"), NOT_PLAIN, ids=range(len(NOT_PLAIN)))
def test_other_rows_go_the_general_way(columns: tuple[str, ...], rows: list[tuple]) -> None:
    assert plain_batches(columns, rows, CLOCK) is None


def test_too_many_messages_is_the_general_ways_error() -> None:
    rows = [(b"m",)] * (limits.BATCH_MESSAGES_MAX + 1)
    with pytest.raises(LimitExceededError) as general:
        build_batches(table_from_rows(("data",), rows), {}, CLOCK)
    with pytest.raises(LimitExceededError) as plain:
        plain_batches(("data",), rows, CLOCK)
    assert str(plain.value) == str(general.value)
    assert plain.value.sqlstate == general.value.sqlstate


def test_statements_write_the_same_messages_either_way(tmp_path: pytest.TempPathFactory) -> None:
    """Through a session: plain statements (parameters and literals, autocommit and in a
    transaction) and statements with an option (the general way) read back alike."""
    database = Database.open(str(tmp_path), retention_interval_s=None)
    try:
        session = database.connect()
        session.execute("CREATE TOPIC t WITH (min_active_partitions = 1)")
        session.execute("INSERT INTO TOPIC t (data) VALUES ($1)", [b"\x00bytes"])
        session.execute("INSERT INTO TOPIC t (data) VALUES ($1), ($2)", ["text é", b""])
        session.execute("INSERT INTO TOPIC t (data) VALUES ('literal')")
        session.execute("INSERT INTO TOPIC t (data) VALUES ($1) WITH (codec = 'raw')", [b"opt"])
        session.execute("BEGIN")
        [result] = session.execute("INSERT INTO TOPIC t (data) VALUES ($1), ($2)", [b"t1", "t2"])
        assert result.tag == "INSERT 0 2"
        session.execute("COMMIT")
        [read] = session.execute("SELECT data, codec, producer_id, seq_no FROM TOPIC t")
        table = read.table
        assert table.column("data").to_pylist() == [
            b"\x00bytes",
            "text é".encode(),
            b"",
            b"literal",
            b"opt",
            b"t1",
            b"t2",
        ]
        assert set(table.column("producer_id").to_pylist()) == {None}
        assert set(table.column("seq_no").to_pylist()) == {None}
        session.close()
    finally:
        database.close()


def test_the_data_column_is_binary() -> None:
    [(_, batch)] = plain_batches(("data",), [("a",), (b"b",)], CLOCK) or [(None, None)]
    assert batch is not None and batch.column("data").type == pa.binary()


@pytest.mark.parametrize(
    ("sql", "params"),
    [
        ("INSERT INTO TOPIC t (data) VALUES (?)", ("a\udc80b",)),  # the plain way
        ("INSERT INTO TOPIC t (data) VALUES (?) WITH (codec = 'raw')", ("a\udc80b",)),
        ("INSERT INTO TOPIC t (data) VALUES (?), (?)", ("ok", "\ud800")),
        ("INSERT INTO TOPIC t (data, producer_id) VALUES (?, ?)", (b"x", "p\udc80")),
    ],
)
def test_a_lone_surrogate_is_22021_not_an_internal_error(
    tmp_path: pytest.TempPathFactory, sql: str, params: tuple
) -> None:
    """A Python ``str`` parameter with a lone surrogate has no UTF-8 bytes: the statement
    is refused with 22021 (character_not_in_repertoire), nothing written, the session
    usable; both the plain way and the general way (``table_from_rows``)."""
    from sql import dbapi

    connection = dbapi.connect(str(tmp_path) + "/data", autocommit=True)
    cursor = connection.cursor()
    cursor.execute("CREATE TOPIC t")
    with pytest.raises(dbapi.DataError) as raised:
        cursor.execute(sql, params)
    assert raised.value.sqlstate == "22021"
    assert "surrogate" in str(raised.value)
    cursor.execute("INSERT INTO TOPIC t (data) VALUES (?)", ("fine",))
    cursor.execute("SELECT data FROM t")
    assert cursor.fetchall() == [(b"fine",)]
    connection.close()
