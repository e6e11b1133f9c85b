"""Statements without rows answer with a command tag alone, as PostgreSQL's do.

psql prints no result set for them, and the PostgreSQL JDBC driver (Spark's JDBC writer)
fails with "A result was returned when none was expected" if rows come back.
"""

from __future__ import annotations

import subprocess

import psycopg
import pytest

from sql.pgwire.server import ServerThread

NO_ROWS = [
    ("CREATE TABLE t (a INTEGER)", "CREATE TABLE"),
    ("ALTER TABLE t ADD COLUMN b INTEGER", "ALTER TABLE"),
    ("CREATE VIEW v AS SELECT a FROM t", "CREATE VIEW"),
    ("ALTER VIEW v RENAME TO w", "ALTER VIEW"),
    ("DROP VIEW w", "DROP VIEW"),
    ("TRUNCATE t", "TRUNCATE TABLE"),
    ("TRUNCATE TABLE ONLY t", "TRUNCATE TABLE"),
    ("DROP TABLE t", "DROP TABLE"),
]


@pytest.mark.parametrize("prepare", [False, True], ids=["simple", "extended"])
def test_statements_without_rows_send_only_a_tag(server: ServerThread, prepare: bool) -> None:
    with psycopg.connect(host="127.0.0.1", port=server.port, user="tester",
                         autocommit=True, connect_timeout=10) as client:  # fmt: skip
        for sql, tag in NO_ROWS:
            cursor = client.execute(sql, prepare=prepare)
            assert cursor.description is None, sql  # NoData / no RowDescription
            assert cursor.statusmessage == tag, sql


def test_truncate_only_empties_the_table(server: ServerThread) -> None:
    with psycopg.connect(host="127.0.0.1", port=server.port, user="tester",
                         autocommit=True, connect_timeout=10) as client:  # fmt: skip
        client.execute("CREATE TABLE t (a INTEGER)")
        client.execute("INSERT INTO t VALUES (1), (2)")
        client.execute("TRUNCATE TABLE ONLY t")
        assert client.execute("SELECT count(*) FROM t").fetchone() == (0,)


def test_psql_prints_no_result_set_for_drop(server: ServerThread) -> None:
    script = "CREATE TABLE t (a INTEGER);\nDROP TABLE t;\n"
    done = subprocess.run(
        ["psql", "-X", "-h", "127.0.0.1", "-p", str(server.port), "-U", "tester", "-d",
         "topicbase", "-v", "ON_ERROR_STOP=1", "-c", script],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    # psql 15 prints each statement's outcome: tags only, no "Success" result set.
    assert done.stdout.split() == ["CREATE", "TABLE", "DROP", "TABLE"], done.stdout


def test_jsonb_is_accepted_as_a_type_name(server: ServerThread) -> None:
    with psycopg.connect(host="127.0.0.1", port=server.port, user="tester",
                         autocommit=True, connect_timeout=10) as client:  # fmt: skip
        client.execute("CREATE TABLE docs (id INTEGER, body jsonb)")
        client.execute("""INSERT INTO docs VALUES (1, '{"a": 1}'::jsonb)""")
        row = client.execute("SELECT body->>'a', CAST(body AS JSONB) FROM docs").fetchone()
        assert row is not None and row[0] == "1" and row[1] == {"a": 1}


def test_returning_gives_every_column_the_grammar_admits(server: ServerThread) -> None:
    with psycopg.connect(host="127.0.0.1", port=server.port, user="tester",
                         autocommit=True, connect_timeout=10) as client:  # fmt: skip
        client.execute("CREATE TOPIC r")
        cursor = client.execute(
            "INSERT INTO TOPIC r (data, producer_id, seq_no, message_group_id) "
            "VALUES ('a', 'p', 1, 'g') RETURNING *"
        )
        names = [c.name for c in cursor.description or ()]
        assert names == ["partition", "offset", "status", "seq_no", "producer_id",
                         "message_group_id", "created_at"]  # fmt: skip
        row = cursor.fetchone()
        assert row is not None and row[2:6] == ("written", 1, "p", "g")
        with pytest.raises(psycopg.errors.UndefinedColumn):
            client.execute("INSERT INTO TOPIC r (data) VALUES ('b') RETURNING written_at")


@pytest.mark.parametrize("prepare", [False, True], ids=["simple", "extended"])
def test_a_write_with_returning_counts_its_rows_in_the_tag(server: ServerThread,
                                                           prepare: bool) -> None:  # fmt: skip
    """PostgreSQL's CommandComplete of INSERT/UPDATE/DELETE … RETURNING counts the rows
    written (``INSERT 0 2``): psycopg's ``rowcount`` reads it."""
    with psycopg.connect(host="127.0.0.1", port=server.port, user="tester",
                         autocommit=True, connect_timeout=10) as client:  # fmt: skip
        t = "ret_x" if prepare else "ret_y"
        client.execute(f"CREATE TABLE {t} (a INTEGER); CREATE TOPIC {t}_topic")
        cursor = client.cursor()
        for sql, tag in ((f"INSERT INTO {t} VALUES (1), (2), (3) RETURNING a", "INSERT 0 3"),
                         (f"UPDATE {t} SET a = a + 1 WHERE a > 1 RETURNING a", "UPDATE 2"),
                         (f"DELETE FROM {t} WHERE a = 1 RETURNING a", "DELETE 1"),
                         (f"INSERT INTO TOPIC {t}_topic (data) VALUES ('a'), ('b') "
                          "RETURNING offset", "INSERT 0 2")):  # fmt: skip
            cursor.execute(sql, prepare=prepare)
            assert cursor.statusmessage == tag, sql
            assert cursor.rowcount == int(tag.split()[-1]) == len(cursor.fetchall())
