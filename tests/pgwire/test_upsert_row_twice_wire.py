"""Over the wire, an ``INSERT … ON CONFLICT DO UPDATE`` that proposes one key twice fails
with PostgreSQL's SQLSTATE 21000 and message, in autocommit and in a transaction (which it
aborts), and nothing of it is written (``planner.upsert_check``)."""

from __future__ import annotations

from collections.abc import Callable

import psycopg
import pytest

UPSERT = ("INSERT INTO t VALUES (%s, %s), (%s, %s) ON CONFLICT (k) DO UPDATE "
          "SET v = t.v + EXCLUDED.v")  # fmt: skip


def test_a_key_proposed_twice_fails_with_21000(
    connect: Callable[..., psycopg.Connection],
) -> None:
    connection = connect(autocommit=True)
    connection.execute("CREATE TABLE t (k VARCHAR PRIMARY KEY, v BIGINT)")
    connection.execute("INSERT INTO t VALUES ('a', 100)")
    for prepare in (False, True):  # simple query (literal) and extended ($n parameters)
        with pytest.raises(psycopg.errors.CardinalityViolation) as raised:
            if prepare:
                connection.execute(UPSERT, ("a", 5, "a", 7), prepare=True)
            else:
                connection.execute(
                    "INSERT INTO t VALUES ('a', 5), ('a', 7) ON CONFLICT (k) DO UPDATE "
                    "SET v = t.v + EXCLUDED.v"
                )
        assert raised.value.sqlstate == "21000"
        assert raised.value.diag.message_primary == (
            "ON CONFLICT DO UPDATE command cannot affect row a second time"
        )
        assert raised.value.diag.message_hint == (
            "Ensure that no rows proposed for insertion within the same command have "
            "duplicate constrained values."
        )
    # executemany: a statement per row, each may touch the key
    with connection.cursor() as cursor:
        cursor.executemany(
            "INSERT INTO t VALUES (%s, %s) ON CONFLICT (k) DO UPDATE SET v = t.v + EXCLUDED.v",
            [("a", 1), ("a", 2)],
        )
    assert connection.execute("SELECT v FROM t").fetchall() == [(103,)]

    with connection.transaction():  # an explicit transaction: the error aborts it
        connection.execute("INSERT INTO t VALUES ('b', 1)")
        with pytest.raises(psycopg.errors.CardinalityViolation):
            connection.execute(UPSERT, ("a", 5, "a", 7))
        with pytest.raises(psycopg.errors.InFailedSqlTransaction):
            connection.execute("SELECT 1")
        raise psycopg.Rollback()
    assert connection.execute("SELECT k, v FROM t ORDER BY k").fetchall() == [("a", 103)]
