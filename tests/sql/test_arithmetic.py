"""PostgreSQL's arithmetic in every front: integer ``/`` truncates, division by zero is 22012."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from engine.database import Database
from sql import dbapi
from sql.pgwire.server import ServerThread
from storage.errors import TopicbaseError

CASES = [("SELECT 5 / 2", 2), ("SELECT -7 / 2", -3), ("SELECT 5.0 / 2", 2.5), ("SELECT 7 % 3", 1)]
ZERO = ["SELECT 1 / 0", "SELECT 1.0 / 0", "SELECT CAST(1 AS DOUBLE) / 0", "SELECT 7 % 0"]


def test_engine_session(tmp_path: Path) -> None:
    database = Database.open(str(tmp_path / "data"))
    session = database.connect()
    try:
        for sql, expected in CASES:
            table = session.execute(sql)[0].table
            assert table is not None and table.column(0)[0].as_py() == expected, sql
        for sql in ZERO:
            with pytest.raises(TopicbaseError) as error:
                session.execute(sql)
            assert error.value.sqlstate == "22012" and error.value.message == "division by zero"
    finally:
        session.close()
        database.close()


def test_dbapi(tmp_path: Path) -> None:
    connection = dbapi.connect(str(tmp_path / "data"))
    try:
        cursor = connection.cursor()
        for sql, expected in CASES:
            cursor.execute(sql)
            assert cursor.fetchone() == (expected,), sql
        for sql in ZERO:
            with pytest.raises(dbapi.DataError) as error:
                cursor.execute(sql)
            assert error.value.sqlstate == "22012"
            connection.rollback()
    finally:
        connection.close()


def test_wire(tmp_path: Path) -> None:
    server = ServerThread(str(tmp_path / "data"), "127.0.0.1", 0)
    try:
        with psycopg.connect(host="127.0.0.1", port=server.port, user="tester",
                             autocommit=True, connect_timeout=10) as client:  # fmt: skip
            for sql, expected in CASES:
                assert client.execute(sql).fetchone() == (expected,), sql
            for sql in ZERO:
                with pytest.raises(psycopg.errors.DivisionByZero):
                    client.execute(sql)
    finally:
        server.stop()
