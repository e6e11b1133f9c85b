"""Syntax errors carry PostgreSQL's Position field and no caret text of their own, so
clients draw exactly one (psql's "LINE 1: … ^")."""

from __future__ import annotations

import subprocess

import psycopg
import pytest

from sql.pgwire.server import ServerThread

CASES = [
    ("SELEC 1", 1),
    ("SELECT 1 FROM t WHERE a = = 2", 27),
    ("SELECT 1;\nSELECT (1 +", None),  # the second statement; its own position is checked below
    ("CREATE TOPIC t WITH (min_active_partitions = = 1)", None),
]


@pytest.mark.parametrize(("sql", "position"), CASES)
def test_position_and_plain_message(server: ServerThread, sql: str, position: int | None) -> None:
    with psycopg.connect(host="127.0.0.1", port=server.port, user="tester",
                         autocommit=True, connect_timeout=10) as client:  # fmt: skip
        with pytest.raises(psycopg.errors.SyntaxError) as error:
            client.execute(sql)
        diag = error.value.diag
        primary = diag.message_primary or ""
        assert "LINE" not in primary and "^" not in primary
        assert diag.statement_position is not None
        at = int(diag.statement_position)
        if position is not None:
            assert at == position
        assert 1 <= at <= len(sql)


def test_second_statement_position_counts_from_the_start(server: ServerThread) -> None:
    sql = "SELECT 1;\nSELECT (1 +"
    with psycopg.connect(host="127.0.0.1", port=server.port, user="tester",
                         autocommit=True, connect_timeout=10) as client:  # fmt: skip
        with pytest.raises(psycopg.errors.SyntaxError) as error:
            client.execute(sql)
        assert sql[int(error.value.diag.statement_position) - 1] == "+"


def test_psql_draws_one_caret(server: ServerThread) -> None:
    done = subprocess.run(
        ["psql", "-X", "-h", "127.0.0.1", "-p", str(server.port), "-U", "tester", "-d",
         "topicbase", "-c", "SELEC 1"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode != 0
    assert done.stderr.count("LINE 1:") == 1 and done.stderr.count("^") == 1, done.stderr
