"""Clients that reflect relations read a topic by its plain name, against a real server.

pg_catalog shows a topic as a foreign table of schema ``main``; SQLAlchemy
(``Table(..., autoload_with=engine)`` then ``select(table)``), pandas and psql users then
write ``SELECT ... FROM name`` without ``TOPIC``. That reads the topic as ``FROM TOPIC
name`` without a consumer does (``planner/relations.py``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator

import asyncpg
import pandas as pd
import psycopg
import pytest
import sqlalchemy as sa

from sql.pgwire.server import ServerThread

Connect = Callable[..., psycopg.Connection]
ROWS_IN_TOPIC_ORDER = [(0, 0, "p", 1, b"a"), (0, 1, "p", 2, b"b"), (1, 0, "q", 1, b"c")]


def _create_events(admin: psycopg.Connection) -> psycopg.Connection:
    """Topic ``events`` (2 partitions, producer p -> partition 0, q -> partition 1) and
    table ``producers``, made through ``admin``."""
    admin.execute("CREATE TOPIC events (CONSUMER reader) WITH (min_active_partitions = 2)")
    admin.execute(
        "INSERT INTO TOPIC events (data, producer_id, seq_no, partition) "
        "VALUES ('a', 'p', 1, 0), ('b', 'p', 2, 0), ('c', 'q', 1, 1)"
    )
    admin.execute("CREATE TABLE producers (id VARCHAR PRIMARY KEY, owner VARCHAR)")
    admin.execute("INSERT INTO producers VALUES ('p', 'ann'), ('q', 'bob')")
    return admin


@pytest.fixture
def events(connect: Connect) -> psycopg.Connection:
    """An autocommit psycopg connection after ``_create_events``."""
    return _create_events(connect(autocommit=True))


def _connect_to(server: ServerThread) -> psycopg.Connection:
    return psycopg.connect(host="127.0.0.1", port=server.port, user="tester",
                           dbname="topicbase", connect_timeout=10,
                           autocommit=True)  # fmt: skip


class Reading:
    """One server, made by ``_create_events``, for the tests that only read ``events``
    and ``producers`` (each on connections of its own), with both reflected once by
    SQLAlchemy (a reflection costs ~1.3 s of server CPU: ten pg_catalog queries; what it
    gives is checked by test_sqlalchemy_reflects_a_topic_and_selects_from_the_table)."""

    def __init__(self, server: ServerThread) -> None:
        self.server = server
        with _connect_to(server) as admin:
            _create_events(admin)
        self.engine = sa.create_engine(
            f"postgresql+psycopg://tester@127.0.0.1:{server.port}/topicbase",
            connect_args={"connect_timeout": 10},
        )
        metadata = sa.MetaData()
        self.events = sa.Table("events", metadata, autoload_with=self.engine)
        self.producers = sa.Table("producers", metadata, autoload_with=self.engine)

    def check_unchanged(self) -> None:
        """Nothing a reading test did changed what another reads."""
        self.engine.dispose()
        with _connect_to(self.server) as admin:
            read = admin.execute('SELECT partition, "offset", producer_id, seq_no, data '
                                 "FROM TOPIC events ORDER BY 1, 2").fetchall()  # fmt: skip
            assert read == ROWS_IN_TOPIC_ORDER
            owners = admin.execute("SELECT id, owner FROM producers ORDER BY id").fetchall()
            assert owners == [("p", "ann"), ("q", "bob")]
            names = admin.execute("SELECT table_name FROM information_schema.tables "
                                  "WHERE table_schema = 'main' ORDER BY 1").fetchall()  # fmt: skip
            assert names == [("events",), ("producers",)]


@pytest.fixture(scope="module")
def reading(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Reading]:
    server = ServerThread(str(tmp_path_factory.mktemp("reading") / "data"), "127.0.0.1", 0)
    try:
        shared = Reading(server)
        yield shared
        shared.check_unchanged()
    finally:
        server.stop()


@pytest.fixture
def reader(reading: Reading) -> Iterator[psycopg.Connection]:
    """A new autocommit connection to ``reading``'s server."""
    with _connect_to(reading.server) as connection:
        yield connection


@pytest.fixture
def engine(server: ServerThread, events: psycopg.Connection) -> Iterator[sa.Engine]:
    created = sa.create_engine(
        f"postgresql+psycopg://tester@127.0.0.1:{server.port}/topicbase",
        connect_args={"connect_timeout": 10},
    )
    yield created
    created.dispose()


def test_sqlalchemy_reflects_a_topic_and_selects_from_the_table(reading: Reading) -> None:
    engine, table = reading.engine, reading.events
    assert [c.name for c in table.columns] == [
        "partition", "offset", "seq_no", "producer_id", "message_group_id",
        "created_at", "written_at", "codec", "data", "metadata",
    ]  # fmt: skip
    with engine.connect() as connection:
        rows = connection.execute(sa.select(table)).all()
        picked = sorted((r.partition, r.offset, r.producer_id, r.seq_no, r.data) for r in rows)
        assert picked == ROWS_IN_TOPIC_ORDER
        assert all(row.codec == "raw" and row.written_at is not None for row in rows)


def test_sqlalchemy_where_order_by_limit_count_and_join(reading: Reading) -> None:
    engine, events, producers = reading.engine, reading.events, reading.producers
    with engine.connect() as connection:
        newest = connection.execute(
            sa.select(events.c.data).where(events.c.producer_id == "p")
            .order_by(events.c.offset.desc()).limit(1)
        ).scalar_one()  # fmt: skip
        assert newest == b"b"
        total = connection.execute(sa.select(sa.func.count()).select_from(events)).scalar_one()
        assert total == 3
        per_owner = connection.execute(
            sa.select(producers.c.owner, sa.func.count())
            .join_from(events, producers, events.c.producer_id == producers.c.id)
            .group_by(producers.c.owner).order_by(producers.c.owner)
        ).all()  # fmt: skip
        assert [tuple(row) for row in per_owner] == [("ann", 2), ("bob", 1)]
        recent = sa.select(events.c.producer_id).where(events.c.seq_no > 1).subquery()
        owners = connection.execute(
            sa.select(producers.c.owner).where(producers.c.id.in_(sa.select(recent)))
        ).scalars().all()  # fmt: skip
        assert owners == ["ann"]


def test_sqlalchemy_select_moves_no_consumer_offset(
    reading: Reading, reader: psycopg.Connection
) -> None:
    with reading.engine.begin() as connection:
        assert len(connection.execute(sa.select(reading.events)).all()) == 3
    consumed = reader.execute(
        "SELECT count(*) FROM TOPIC events WITH (consumer = 'reader')"
    ).fetchone()
    assert consumed == (3,)  # the consumer still starts at offset 0


def test_sqlalchemy_insert_into_the_reflected_topic_appends(
    engine: sa.Engine, events: psycopg.Connection
) -> None:
    table = sa.Table("events", sa.MetaData(), autoload_with=engine)
    with engine.begin() as connection:
        rows = [{"data": b"x1", "producer_id": "w", "seq_no": 1},
                {"data": b"x2", "producer_id": "w", "seq_no": 2}]  # fmt: skip
        connection.execute(table.insert(), rows)
    written = events.execute(
        "SELECT seq_no, data FROM TOPIC events WHERE producer_id = 'w' ORDER BY seq_no"
    ).fetchall()
    assert written == [(1, b"x1"), (2, b"x2")]


def test_pandas_read_sql_of_select_star_and_of_a_reflected_select(reading: Reading) -> None:
    engine, table = reading.engine, reading.events
    frame = pd.read_sql('SELECT * FROM events ORDER BY partition, "offset"', engine)
    assert list(frame.columns)[:4] == ["partition", "offset", "seq_no", "producer_id"]
    assert frame["data"].tolist() == [b"a", b"b", b"c"]
    reflected = pd.read_sql(sa.select(table.c.producer_id, table.c.seq_no)
                            .order_by(table.c.producer_id, table.c.seq_no), engine)  # fmt: skip
    assert list(reflected.itertuples(index=False, name=None)) == [("p", 1), ("p", 2), ("q", 1)]
    counted = pd.read_sql("SELECT count(*) AS n FROM main.events", engine)
    assert counted["n"].tolist() == [3]


def test_pandas_to_sql_appends_to_a_topic(engine: sa.Engine, events: psycopg.Connection) -> None:
    frame = pd.DataFrame({"data": [b"d1", b"d2"], "producer_id": ["pd", "pd"]})
    frame.to_sql("events", engine, if_exists="append", index=False)
    appended = events.execute(
        "SELECT data FROM events WHERE producer_id = 'pd' ORDER BY data"
    ).fetchall()
    assert appended == [(b"d1",), (b"d2",)]


def test_psycopg_plain_names_with_parameters(reader: psycopg.Connection) -> None:
    rows = reader.execute(
        'SELECT "offset", data FROM "events" WHERE producer_id = %s ORDER BY 1', ["p"]
    ).fetchall()
    assert rows == [(0, b"a"), (1, b"b")]
    with reader.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM events WHERE seq_no >= %s", [1], prepare=True)
        assert cursor.fetchone() == (3,)


def test_asyncpg_prepares_a_plain_topic_read(reading: Reading) -> None:
    async def main() -> list[tuple[object, ...]]:
        connection = await asyncpg.connect(
            host="127.0.0.1", port=reading.server.port, user="tester", database="topicbase",
            timeout=10,
        )
        try:
            records = await connection.fetch(
                "SELECT producer_id, count(*) AS n FROM events WHERE seq_no >= $1 "
                "GROUP BY producer_id ORDER BY producer_id", 1
            )  # fmt: skip
            return [tuple(record) for record in records]
        finally:
            await connection.close()

    assert asyncio.run(main()) == [("p", 2), ("q", 1)]


def test_a_table_of_the_same_name_wins(events: psycopg.Connection) -> None:
    events.execute("CREATE TABLE events (n INTEGER)")
    events.execute("INSERT INTO events VALUES (7)")
    assert events.execute("SELECT * FROM events").fetchall() == [(7,)]
    assert events.execute("SELECT count(*) FROM TOPIC events").fetchone() == (3,)
    events.execute("DROP TABLE events")
    assert events.execute("SELECT count(*) FROM events").fetchone() == (3,)


def test_unknown_name_is_still_42p01_and_writes_are_refused(reader: psycopg.Connection) -> None:
    with pytest.raises(psycopg.errors.UndefinedTable):
        reader.execute("SELECT * FROM no_such_relation")
    with pytest.raises(psycopg.errors.FeatureNotSupported, match="append-only"):
        reader.execute("DELETE FROM events")
    assert reader.execute("SELECT count(*) FROM events").fetchone() == (3,)
