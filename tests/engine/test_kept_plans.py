"""A session's kept plans (``engine.kept_plans``): a repeated statement is planned once,
and planned again whenever what its plan was made from changed: a partition split (no
DDL: the partitions' generation), a consumer dropped or a topic created (the catalog's
entries), a table that wins over a topic of its name (never kept)."""

from __future__ import annotations

import dataclasses

import pytest

from engine import kept_plans
from engine.database import Database
from engine.session import Session
from storage import errors
from storage.limits import CACHED_TEXT_CHARS_MAX, KEPT_PLANS_MAX
from tests.planner_spy import planned_statements

READ = "SELECT CAST(data AS VARCHAR) AS d FROM TOPIC t WITH (consumer = 'c')"
MOVE = "INSERT INTO TOPIC b (data) SELECT data FROM TOPIC t WITH (consumer = 'c', max_messages = 1)"


@pytest.fixture
def plans(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The text of every statement the planner plans from now on."""
    return planned_statements(monkeypatch, "text")


def _data(session: Session, sql: str) -> list[str]:
    return sorted(session.execute(sql)[-1].table.column("d").to_pylist())


def test_a_repeated_move_transaction_is_planned_once(session: Session, plans: list[str]) -> None:
    session.execute("CREATE TOPIC t (CONSUMER c); CREATE TOPIC b")
    session.execute("INSERT INTO TOPIC t (data) VALUES ('x'), ('y'), ('z')")
    plans.clear()
    for _ in range(3):
        session.execute("BEGIN")
        session.execute(MOVE)
        session.execute("COMMIT")
    assert plans == ["BEGIN", MOVE, "COMMIT"]
    moved = session.execute("SELECT CAST(data AS VARCHAR) AS d FROM TOPIC b")[-1].table
    assert sorted(moved.column("d").to_pylist()) == ["x", "y", "z"]


def test_a_split_between_two_runs_of_one_text_reads_the_new_partitions(
    database: Database, session: Session, plans: list[str]
) -> None:
    session.execute("CREATE TOPIC t (CONSUMER c) WITH (auto_partitioning_strategy = 'paused')")
    topic = database.topic_log(database.catalog.entry("t").topic_id)
    assert topic.partition_ids() == [0]
    session.execute("INSERT INTO TOPIC t (data) VALUES ('a')")
    assert _data(session, READ) == ["a"]
    assert _data(session, READ) == []  # kept: read once more without planning it again
    assert plans.count(READ) == 1
    children = topic.split(0, force=True)  # no DDL: only the partitions changed
    assert children is not None and topic.active_partition_ids() == list(children)
    session.execute("INSERT INTO TOPIC t (data) VALUES ('b'), ('c')")
    # A plan kept from before the split reads partition 0 alone, which no longer gets writes.
    assert _data(session, READ) == ["b", "c"]
    assert plans.count(READ) == 2


def test_a_dropped_consumer_is_refused_by_a_text_kept_from_before(
    session: Session, plans: list[str]
) -> None:
    session.execute("CREATE TOPIC t (CONSUMER c, CONSUMER other)")
    session.execute("INSERT INTO TOPIC t (data) VALUES ('a')")
    assert _data(session, READ) == ["a"]
    assert _data(session, READ) == []
    session.execute("ALTER TOPIC t DROP CONSUMER c")
    with pytest.raises(errors.UndefinedObjectError):
        session.execute(READ)
    assert plans.count(READ) == 2


def test_a_table_that_wins_over_a_topic_of_its_name_is_read_once_created(
    session: Session, plans: list[str]
) -> None:
    plain = "SELECT CAST(data AS VARCHAR) AS d FROM t"
    session.execute("CREATE TOPIC t")
    session.execute("INSERT INTO TOPIC t (data) VALUES ('topic')")
    assert _data(session, plain) == ["topic"]
    session.execute("CREATE TABLE t (data VARCHAR)")  # no topic changed: a table wins now
    session.execute("INSERT INTO t VALUES ('table')")
    assert _data(session, plain) == ["table"]
    assert plans.count(plain) == 2  # asked DuckDB: never kept


def test_a_topic_created_under_a_name_a_kept_text_reads_is_read(
    session: Session, plans: list[str]
) -> None:
    session.execute("CREATE TABLE u (data VARCHAR)")
    session.execute("INSERT INTO u VALUES ('table')")
    plain = "SELECT CAST(data AS VARCHAR) AS d FROM u"
    assert _data(session, plain) == ["table"]
    assert _data(session, plain) == ["table"]
    assert plans.count(plain) == 1  # names no topic: kept
    session.execute("CREATE TOPIC u")  # planned again; the table still wins
    assert _data(session, plain) == ["table"]
    assert plans.count(plain) == 2


def test_kept_plans_are_bounded(database: Database, session: Session) -> None:
    session.execute("CREATE TOPIC t (CONSUMER c)")
    for number in range(KEPT_PLANS_MAX + 20):
        session.execute(f"SELECT {number} AS n")
    assert len(session._kept_plans) == KEPT_PLANS_MAX
    assert kept_plans.generation(database) == kept_plans.generation(database)


def test_a_change_of_the_catalog_alone_plans_again(
    database: Database, session: Session, plans: list[str]
) -> None:
    """ALTER TOPIC changes the entry, then the storage's settings (which bumps the
    partitions' generation too): the entry's change alone is enough."""
    session.execute("CREATE TOPIC t (CONSUMER c, CONSUMER other)")
    assert _data(session, READ) == []
    entry = database.catalog.entry("t")
    assert entry is not None
    database.catalog.update_topic(
        dataclasses.replace(entry, consumers={"other": entry.consumers["other"]})
    )
    with pytest.raises(errors.UndefinedObjectError):
        session.execute(READ)
    assert plans.count(READ) == 2


def test_a_text_the_parse_cache_does_not_keep_keeps_no_plan(session: Session) -> None:
    """A statement longer than the parse cache keeps is a new object on every run: its
    plan would never be found again, so none is kept (review R2 round 17, R2-17-4)."""
    session.execute("CREATE TOPIC long_values")
    sql = "INSERT INTO TOPIC long_values (data) VALUES " + ", ".join(
        f"('{i:06d}{'x' * 32}')" for i in range(4000))  # fmt: skip
    assert len(sql) > CACHED_TEXT_CHARS_MAX
    for _ in range(3):
        session.execute(sql)
    assert len(session._kept_plans) == 0
    counted = session.execute("SELECT count(*) AS n FROM TOPIC long_values")[-1].table
    assert counted.column("n").to_pylist() == [12000]
