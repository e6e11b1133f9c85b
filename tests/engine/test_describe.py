"""``Session.describe``: parameter types and result columns without running anything."""

from __future__ import annotations

import datetime

import pyarrow as pa
import pytest

from engine.session import Session
from engine.transaction import SessionState
from grammar.parse import parse
from storage import errors
from tests.engine.conftest import rows


def describe(session: Session, sql: str):
    return session.describe(parse(sql)[0])


def columns(description) -> list[tuple[str, str]]:
    return [(c.name, c.sql_type) for c in description.columns]


@pytest.fixture
def shop(session: Session) -> Session:
    session.execute(
        "CREATE TABLE orders (id INTEGER PRIMARY KEY, who VARCHAR, total DECIMAL(10, 2), "
        "placed TIMESTAMPTZ, ref UUID, doc JSON)"
    )
    session.execute("CREATE TOPIC events (CONSUMER c)")
    session.execute("INSERT INTO TOPIC events (data) VALUES ('a'), ('b')")
    return session


def test_query_parameters_and_columns(shop: Session) -> None:
    d = describe(shop, "SELECT id, who, total * 2 AS doubled FROM orders "
                       "WHERE who = $1 AND placed < $2 LIMIT $3")  # fmt: skip
    assert d.parameter_types == ("VARCHAR", "TIMESTAMP WITH TIME ZONE", "BIGINT")
    assert columns(d) == [("id", "INTEGER"), ("who", "VARCHAR"), ("doubled", "DECIMAL(18,2)")]
    # The description is what an execution produces.
    result = shop.execute_statement(
        parse("SELECT id, who, total * 2 AS doubled FROM orders "
              "WHERE who = $1 AND placed < $2 LIMIT $3")[0],
        ["ann", datetime.datetime(2030, 1, 1, tzinfo=datetime.UTC), 5],
    )  # fmt: skip
    assert result.table is not None
    assert [c.arrow_type for c in d.columns] == [f.type for f in result.table.schema]
    assert [c.name for c in d.columns] == result.table.column_names


def test_untyped_parameters_are_unknown_or_taken_from_context(shop: Session) -> None:
    assert describe(shop, "SELECT $1").parameter_types == (None,)
    assert columns(describe(shop, "SELECT $1 AS echoed")) == [("echoed", "VARCHAR")]
    assert describe(shop, "SELECT $1 + 1").parameter_types == ("INTEGER",)
    d = describe(shop, "SELECT $1::INTEGER + $2 AS n")
    assert d.parameter_types == ("INTEGER", "INTEGER") and columns(d) == [("n", "INTEGER")]


def test_dml_is_described_without_running(shop: Session) -> None:
    d = describe(shop, "INSERT INTO orders VALUES ($1, $2, $3, $4, $5, $6)")
    assert d.parameter_types == ("INTEGER", "VARCHAR", "DECIMAL(10,2)",
                                 "TIMESTAMP WITH TIME ZONE", "UUID", "JSON")  # fmt: skip
    assert d.columns is None
    d = describe(shop, "INSERT INTO orders (id, who) VALUES ($1, $2) RETURNING id, ref")
    assert columns(d) == [("id", "INTEGER"), ("ref", "UUID")]
    assert describe(shop, "DELETE FROM orders WHERE id = $1").parameter_types == ("INTEGER",)
    assert describe(shop, "UPDATE orders SET total = $1").parameter_types == ("DECIMAL(10,2)",)
    assert rows(shop, "SELECT count(*) AS n FROM orders") == [{"n": 0}]


def test_topic_statements(shop: Session) -> None:
    d = describe(
        shop,
        "INSERT INTO TOPIC events (data, producer_id, seq_no) VALUES ($1, $2, $3) "
        'WITH (codec = $4) RETURNING "offset", status',
    )
    assert d.parameter_types == ("BLOB", "VARCHAR", "BIGINT", "VARCHAR")
    assert columns(d) == [("offset", "BIGINT"), ("status", "VARCHAR")]
    d = describe(shop, "SELECT \"offset\", data FROM TOPIC events "
                       "WITH (consumer = 'c', max_messages = $1, wait = $2)")  # fmt: skip
    assert d.parameter_types == ("BIGINT", "INTERVAL")
    assert [c.arrow_type for c in d.columns] == [pa.int64(), pa.binary()]
    d = describe(shop, "SELECT count(*) AS n FROM TOPIC events WITH (consumer = 'c') "
                       "WHERE producer_id = $1")  # fmt: skip
    assert d.parameter_types == ("VARCHAR",) and columns(d) == [("n", "BIGINT")]
    # Nothing was read for the consumer: both messages are still there.
    assert len(rows(shop, "SELECT data FROM TOPIC events WITH (consumer = 'c')")) == 2
    # The stand-in relation is gone.
    with pytest.raises(errors.TopicbaseError):
        shop.execute("SELECT * FROM __topic_scan_1")


def test_statements_without_rows_and_others(shop: Session) -> None:
    for sql in ("BEGIN", "CREATE TABLE x (a INTEGER)", "CREATE TOPIC other", "DROP TOPIC events"):
        assert describe(shop, sql).columns is None, sql
    assert rows(shop, "SHOW TOPICS")[0]["name"] == "events"  # nothing ran
    assert describe(shop, "SHOW TOPICS").columns[0].name == "name"
    assert columns(describe(shop, "SELECT * FROM sys.partitions WHERE partition = $1"))[1] == (
        "partition", "INTEGER"
    )  # fmt: skip


def test_sequences_do_not_advance(shop: Session) -> None:
    shop.execute("CREATE SEQUENCE s")
    assert columns(describe(shop, "SELECT nextval('s') AS n")) == [("n", "BIGINT")]
    assert rows(shop, "SELECT nextval('s') AS n") == [{"n": 1}]


def test_errors_and_transaction_state(shop: Session) -> None:
    with pytest.raises(errors.UndefinedTopicError):
        describe(shop, "SELECT * FROM no_such_table")
    shop.execute("BEGIN")
    with pytest.raises(errors.TopicbaseError):
        describe(shop, "SELECT nope FROM orders")
    assert shop.state is SessionState.IN_TRANSACTION  # a description changes nothing
    shop.execute("INSERT INTO orders (id) VALUES (1)")
    with pytest.raises(errors.TopicbaseError):
        shop.execute("SELECT nope FROM orders")
    assert shop.state is SessionState.FAILED
    with pytest.raises(errors.InFailedTransactionError):
        describe(shop, "SELECT 1")
    assert describe(shop, "ROLLBACK").columns is None
    shop.execute("ROLLBACK")
    assert rows(shop, "SELECT count(*) AS n FROM orders") == [{"n": 0}]


def test_descriptions_follow_schema_changes(database, shop: Session) -> None:
    shop.execute("CREATE TABLE m (x UUID)")
    first = describe(shop, "SELECT x FROM m")
    assert columns(first) == [("x", "UUID")]
    assert describe(shop, "SELECT x FROM m") is first  # kept while the catalog stands still
    shop.execute("DROP TABLE m")
    shop.execute("CREATE TABLE m (x VARCHAR)")
    assert columns(describe(shop, "SELECT x FROM m")) == [("x", "VARCHAR")]
    # Another session's uncommitted table is not visible to this session's description.
    other = database.connect()
    try:
        other.execute("BEGIN")
        other.execute("CREATE TABLE only_there (y INTEGER)")
        assert columns(describe(other, "SELECT y FROM only_there")) == [("y", "INTEGER")]
        with pytest.raises(errors.UndefinedTopicError):
            describe(shop, "SELECT y FROM only_there")
        other.execute("ROLLBACK")
    finally:
        other.close()
