"""Result columns are named as PostgreSQL names them, never by Topicbase's rewrites."""

from __future__ import annotations

import psycopg
import pytest

from sql.pgwire.server import ServerThread

CASES = [
    ("SELECT count(*) FROM t", ["count"]),
    ("SELECT count(*) AS n, sum(a) FROM t", ["n", "sum"]),
    ("SELECT a, CAST(a AS TEXT), a::bigint FROM t", ["a", "a", "a"]),
    ("SELECT 1", ["?column?"]),
    ("SELECT '7'::int", ["int4"]),
    ("SELECT version()", ["version"]),
    ("SELECT lower('X'), coalesce(NULL, 1)", ["lower", "coalesce"]),
    ("SELECT (SELECT max(a) FROM t)", ["max"]),
    ('SELECT a AS "Mixed Case" FROM t', ["Mixed Case"]),
    ("SELECT * FROM t", ["a"]),
]


@pytest.mark.parametrize("prepare", [False, True], ids=["simple", "extended"])
def test_names_of_expressions(server: ServerThread, prepare: bool) -> None:
    with psycopg.connect(host="127.0.0.1", port=server.port, user="tester",
                         autocommit=True, connect_timeout=10) as client:  # fmt: skip
        client.execute("CREATE TABLE IF NOT EXISTS t (a INTEGER)")
        client.execute("INSERT INTO t VALUES (1)")
        for sql, names in CASES:
            cursor = client.execute(sql, prepare=prepare)
            assert cursor.description is not None, sql
            assert [c.name for c in cursor.description] == names, sql


def test_topic_reads_keep_the_written_names(server: ServerThread) -> None:
    with psycopg.connect(host="127.0.0.1", port=server.port, user="tester",
                         autocommit=True, connect_timeout=10) as client:  # fmt: skip
        client.execute("CREATE TOPIC ev")
        client.execute("INSERT INTO TOPIC ev (data) VALUES ('{\"u\": 1}')")
        cursor = client.execute(
            "SELECT CAST(data AS VARCHAR), count(*) FROM TOPIC ev GROUP BY 1"
        )
        assert [c.name for c in cursor.description or ()] == ["data", "count"]
        assert cursor.fetchall() == [('{"u": 1}', 1)]
