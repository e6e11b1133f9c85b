"""pandas against the real server through SQLAlchemy (``postgresql+psycopg``):
``read_sql`` of queries, tables and topics, and ``DataFrame.to_sql``."""

from __future__ import annotations

from collections.abc import Iterator

import pandas as pd
import pytest
import sqlalchemy as sa

from sql.pgwire.server import ServerThread


@pytest.fixture
def engine(server: ServerThread) -> Iterator[sa.Engine]:
    created = sa.create_engine(
        f"postgresql+psycopg://tester@127.0.0.1:{server.port}/topicbase",
        connect_args={"connect_timeout": 10},
    )
    with created.begin() as connection:
        connection.exec_driver_sql("CREATE TABLE cities (id INTEGER PRIMARY KEY, name VARCHAR, "
                                   "population BIGINT)")  # fmt: skip
        connection.exec_driver_sql("INSERT INTO cities VALUES (1, 'Oslo', 709000), "
                                   "(2, 'Bergen', 291000), (3, 'Tromsø', NULL)")  # fmt: skip
    yield created
    created.dispose()


def test_read_sql_of_a_query_string(engine: sa.Engine) -> None:
    frame = pd.read_sql("SELECT id, name, population FROM cities ORDER BY id", engine)
    assert list(frame.columns) == ["id", "name", "population"]
    assert frame["name"].tolist() == ["Oslo", "Bergen", "Tromsø"]
    assert frame["population"].iloc[0] == 709000 and pd.isna(frame["population"].iloc[2])


def test_read_sql_with_parameters(engine: sa.Engine) -> None:
    frame = pd.read_sql(sa.text("SELECT name FROM cities WHERE population > :n ORDER BY id"),
                        engine, params={"n": 300000})  # fmt: skip
    assert frame["name"].tolist() == ["Oslo"]


def test_read_sql_of_a_table_name(engine: sa.Engine) -> None:
    frame = pd.read_sql("cities", engine)  # reflects the table: has_table, get_columns …
    assert list(frame.columns) == ["id", "name", "population"]
    assert sorted(frame["id"].tolist()) == [1, 2, 3]


def test_read_sql_of_an_unknown_table_fails_clearly(engine: sa.Engine) -> None:
    with pytest.raises(Exception) as failed:
        pd.read_sql("no_such_table", engine)
    assert "no_such_table" in str(failed.value)


def test_read_sql_of_a_topic(engine: sa.Engine) -> None:
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        connection.exec_driver_sql("CREATE TOPIC readings (CONSUMER loader)")
        connection.exec_driver_sql(
            "INSERT INTO TOPIC readings (data, producer_id, seq_no) "
            "VALUES ('{\"t\": 1}', 'probe', 1), ('{\"t\": 2}', 'probe', 2)"
        )
    query = ("SELECT \"offset\", producer_id, seq_no, CAST(data AS VARCHAR) AS body "
             "FROM TOPIC readings WITH (consumer = 'loader') ORDER BY \"offset\"")  # fmt: skip
    with engine.connect() as connection:
        frame = pd.read_sql(sa.text(query), connection)
        connection.commit()  # the consumer's offsets move at COMMIT
        assert frame["body"].tolist() == ['{"t": 1}', '{"t": 2}']
        assert frame["seq_no"].tolist() == [1, 2]
        assert pd.read_sql(sa.text(query), connection).empty  # all consumed


def test_to_sql_creates_appends_and_refuses_an_existing_table(engine: sa.Engine) -> None:
    frame = pd.DataFrame({
        "sensor": ["a", "b"], "value": [1.5, None], "count": [3, 4], "ok": [True, False],
        "taken_at": pd.to_datetime(["2024-01-01 10:00", "2024-01-02 11:30"]),
    })  # fmt: skip
    frame.to_sql("measurements", engine, index=False)
    frame.to_sql("measurements", engine, index=False, if_exists="append")
    with pytest.raises(ValueError, match="already exists"):
        frame.to_sql("measurements", engine, index=False)  # needs has_table
    back = pd.read_sql("SELECT * FROM measurements ORDER BY taken_at, sensor", engine)
    assert back["sensor"].tolist() == ["a", "a", "b", "b"]
    assert back["count"].tolist() == [3, 3, 4, 4]
    assert back["ok"].tolist() == [True, True, False, False]
    assert back["taken_at"].iloc[0] == pd.Timestamp("2024-01-01 10:00")
    assert pd.isna(back["value"].iloc[2])
    frame.to_sql("measurements", engine, index=False, if_exists="replace")
    assert pd.read_sql("SELECT count(*) AS n FROM measurements", engine)["n"].tolist() == [2]
