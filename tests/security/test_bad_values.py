"""Values checked at write time (``engine.writes``): a topic write that readers could not
return later is refused with the right SQLSTATE, and the topic stays readable, every
column of it, over the wire, for another client too.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import psycopg
import pytest

from sql import dbapi
from tests.security.resource_servers import BOB, login, running_server

READ_ALL = ("SELECT partition, \"offset\", seq_no, producer_id, message_group_id, created_at, "
            "written_at, codec, data, metadata FROM TOPIC events WITH (partition = 0)")  # fmt: skip

# (statement, parameters, SQLSTATE): literals, parameters and INSERT ... SELECT rows.
BAD_WRITES = [
    ("INSERT INTO TOPIC events (data, created_at) SELECT 'a', TIMESTAMP 'infinity'", None,
     "22008"),
    ("INSERT INTO TOPIC events (data, created_at) SELECT 'a', '-infinity'::TIMESTAMP", None,
     "22008"),
    ("INSERT INTO TOPIC events (data, created_at) SELECT 'a', TIMESTAMP '9999-12-31' + "
     "INTERVAL 1 YEAR", None, "22008"),
    ("INSERT INTO TOPIC events (data, created_at) SELECT 'a', TIMESTAMP '0001-01-01' - "
     "INTERVAL 1000 YEAR", None, "22008"),
    ("INSERT INTO TOPIC events (data, created_at) VALUES ('a', TIMESTAMP 'infinity')", None,
     "22008"),
    ("INSERT INTO TOPIC events (data, created_at) SELECT 'a', 'infinity'::DATE", None, "22008"),
    ("INSERT INTO TOPIC events (data, seq_no, producer_id) SELECT 'a', -1, 'p'", None, "22003"),
    ("INSERT INTO TOPIC events (data, seq_no, producer_id) SELECT 'a', "
     "18446744073709551615::UBIGINT, 'p'", None, "22003"),
    ("INSERT INTO TOPIC events (data, seq_no, producer_id) VALUES ('a', %s, 'p')", [-5],
     "22003"),
    ("INSERT INTO TOPIC events (data, partition) SELECT 'a', -1", None, "22003"),
    ("INSERT INTO TOPIC events (data, metadata) SELECT 'a', MAP {'k': 1}", None, "22023"),
    ("INSERT INTO TOPIC events (data, metadata) SELECT 'a', [1, 2]", None, "22023"),
    ("INSERT INTO TOPIC events (data, metadata) SELECT 'a', {'k': 1}", None, "22023"),
    ("INSERT INTO TOPIC events (data, metadata) VALUES ('a', %s)", ['{"k": 1}'], "22023"),
    ("INSERT INTO TOPIC events (data) SELECT [1, 2]", None, "22023"),
    ("INSERT INTO TOPIC events (data) SELECT {'a': 1}", None, "22023"),
    ("INSERT INTO TOPIC events (data, codec) SELECT 'a', 5", None, "22023"),
    ("INSERT INTO TOPIC events (data, created_at) SELECT 'a', 1.5", None, "22023"),
]  # fmt: skip


@pytest.fixture(scope="module")
def events_server(tmp_path_factory: pytest.TempPathFactory):
    """One server for the bad writes, its topic holding one good message: each case sees
    its write refused and checks that the topic still holds exactly that message."""
    with running_server(tmp_path_factory.mktemp("bad_values"), auth="trust") as server:
        writer = login(server, "alice", "")
        writer.execute("CREATE TOPIC events")
        writer.execute("INSERT INTO TOPIC events (data, metadata, seq_no, producer_id) "
                       "VALUES ('good', '{\"k\": \"v\"}', 7, 'p')")  # fmt: skip
        writer.close()
        yield server


@pytest.fixture
def wire(events_server):
    """A writer's and another client's new connections."""
    writer, reader = login(events_server, "alice", ""), login(events_server, BOB, "")
    yield writer, reader
    writer.close()
    reader.close()


@pytest.mark.parametrize(("statement", "parameters", "sqlstate"), BAD_WRITES)
def test_bad_value_is_refused_and_the_topic_stays_readable(wire, statement, parameters,
                                                           sqlstate) -> None:  # fmt: skip
    writer, reader = wire
    with pytest.raises(psycopg.Error) as caught:
        writer.execute(statement, parameters)
    assert caught.value.sqlstate == sqlstate, caught.value
    for client in (writer, reader):  # every column of every message reads back
        rows = client.execute(READ_ALL).fetchall()
        assert [(row[8], row[2], row[9]) for row in rows] == [(b"good", 7, {"k": "v"})]


def test_edges_of_the_ranges_are_accepted_and_read_back(tmp_path: Path) -> None:
    connection = dbapi.connect(str(tmp_path / "data"), autocommit=True)
    try:
        cursor = connection.cursor()
        cursor.execute("CREATE TOPIC events")
        lowest = dt.datetime(1, 1, 1, tzinfo=dt.UTC)
        highest = dt.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=dt.UTC)
        cursor.execute("INSERT INTO TOPIC events (data, created_at, seq_no, producer_id) "
                       "VALUES ('low', $1, 0, 'p'), ('high', $2, $3, 'p')",
                       [lowest, highest, 2**63 - 1])  # fmt: skip
        cursor.execute("SELECT created_at, seq_no FROM TOPIC events WITH (partition = 0)")
        assert cursor.fetchall() == [(lowest, 0), (highest, 2**63 - 1)]
        with pytest.raises(dbapi.DataError) as caught:
            cursor.execute("INSERT INTO TOPIC events (data, seq_no, producer_id) "
                           "VALUES ('over', $1, 'p')", [2**63])  # fmt: skip
        assert caught.value.sqlstate == "22003"
    finally:
        connection.close()
