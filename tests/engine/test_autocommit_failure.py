"""A failed autocommit statement is its own transaction, rolled back: it moves no consumer
offset, publishes nothing and changes no table, even when it failed after reading.

The consumer read happens first (the topic's messages are fetched and the range
recorded), then DuckDB runs the query over them and fails on a bad message: the
statement must end as if it never ran, so the next read sees every message again.
"""

from __future__ import annotations

import pytest

from storage import errors
from tests.engine.conftest import rows

FAILING_READ = (
    "SELECT CAST(CAST(data AS VARCHAR) AS INTEGER) AS n FROM TOPIC t WITH (consumer = 'c')"
)


def _setup(session) -> None:
    session.execute(
        "CREATE TOPIC t (CONSUMER c) WITH (min_active_partitions = 2); CREATE TOPIC out; "
        "CREATE TABLE numbers (n INTEGER)"
    )
    session.execute("INSERT INTO TOPIC t (data) VALUES ('1'), ('2') WITH (partition = 0)")
    session.execute(
        "INSERT INTO TOPIC t (data) VALUES ('3'), ('not a number') WITH (partition = 1)"
    )


def _committed(session) -> dict[int, int | None]:
    found = rows(
        session,
        "SELECT partition, committed_offset FROM sys.consumers "
        "WHERE topic = 't' AND consumer = 'c'",
    )
    return {r["partition"]: r["committed_offset"] for r in found}


def _consume_all(session) -> list[str]:
    got = rows(session, "SELECT CAST(data AS VARCHAR) AS d FROM TOPIC t WITH (consumer = 'c')")
    return sorted(r["d"] for r in got)


def test_failed_autocommit_consumer_read_moves_no_offset(session):
    _setup(session)
    with pytest.raises(errors.TopicbaseError) as caught:
        session.execute(FAILING_READ)
    assert caught.value.sqlstate == "22P02"  # invalid_text_representation, as PostgreSQL
    assert _committed(session) == {0: None, 1: None}
    assert _consume_all(session) == ["1", "2", "3", "not a number"]
    assert _committed(session) == {0: 2, 1: 2}


def test_failed_autocommit_move_publishes_nothing_and_moves_no_offset(session):
    _setup(session)
    with pytest.raises(errors.TopicbaseError):
        session.execute(
            "INSERT INTO TOPIC out (data) SELECT CAST(CAST(CAST(data AS VARCHAR) AS INTEGER) "
            "AS VARCHAR) FROM TOPIC t WITH (consumer = 'c')"
        )
    assert rows(session, "SELECT data FROM TOPIC out") == []
    assert _committed(session) == {0: None, 1: None}
    assert _consume_all(session) == ["1", "2", "3", "not a number"]


def test_failed_autocommit_topic_to_table_writes_no_row_and_moves_no_offset(session):
    _setup(session)
    with pytest.raises(errors.TopicbaseError):
        session.execute(
            "INSERT INTO numbers SELECT CAST(CAST(data AS VARCHAR) AS INTEGER) "
            "FROM TOPIC t WITH (consumer = 'c')"
        )
    assert rows(session, "SELECT count(*) AS n FROM numbers") == [{"n": 0}]
    assert _committed(session) == {0: None, 1: None}
    assert _consume_all(session) == ["1", "2", "3", "not a number"]


def test_session_stays_usable_in_autocommit_after_the_failure(session):
    """No transaction is left open: a BEGIN after the failure starts a fresh one."""
    _setup(session)
    with pytest.raises(errors.TopicbaseError):
        session.execute(FAILING_READ)
    result = session.execute("BEGIN")[-1]
    assert result.notices == ()  # not "already a transaction in progress"
    assert len(_consume_all(session)) == 4
    session.execute("ROLLBACK")
    assert _committed(session) == {0: None, 1: None}
