"""ALTER TOPIC t ALTER CONSUMER c SET OFFSETS TO ... [FORCE] (engine.offset_reset)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from engine.clock import ManualClock
from engine.database import Database
from grammar.parse import parse_one
from storage.errors import (
    InsufficientPrivilegeError,
    InvalidParameterValueError,
    ObjectInUseError,
    SerializationFailure,
    SqlSyntaxError,
    UndefinedObjectError,
)
from tests.engine.conftest import rows

START_US = 1_700_000_000_000_000
SET = "ALTER TOPIC t ALTER CONSUMER c SET OFFSETS TO "
CONSUME = "SELECT partition, \"offset\" FROM TOPIC t WITH (consumer = 'c'{})"


def _committed(session) -> dict[int, int | None]:
    found = rows(
        session,
        "SELECT partition, committed_offset FROM sys.consumers "
        "WHERE topic = 't' AND consumer = 'c' ORDER BY partition",
    )
    return {r["partition"]: r["committed_offset"] for r in found}


def _consume(session, extra: str = "") -> list[tuple[int, int]]:
    return [(r["partition"], r["offset"]) for r in rows(session, CONSUME.format(extra))]


@pytest.fixture
def two(session):
    """Topic t, two partitions of 5 messages each, consumer c has read everything."""
    session.execute("CREATE TOPIC t (CONSUMER c) WITH (min_active_partitions = 2)")
    for partition in (0, 1):
        session.execute(
            f"INSERT INTO TOPIC t (data, partition) SELECT 'm', {partition} FROM range(5)"
        )
    assert len(_consume(session)) == 10
    return session


def test_earliest_rewinds_every_partition(two) -> None:
    two.execute(SET + "EARLIEST")
    assert _committed(two) == {0: 0, 1: 0}
    assert len(_consume(two)) == 10


def test_latest_skips_everything_not_yet_read(two) -> None:
    two.execute(SET + "EARLIEST")
    two.execute("INSERT INTO TOPIC t (data, partition) VALUES ('x', 1)")
    two.execute(SET + "LATEST")
    assert _committed(two) == {0: 5, 1: 6}
    assert _consume(two) == []
    two.execute("INSERT INTO TOPIC t (data, partition) VALUES ('y', 0)")
    assert _consume(two) == [(0, 5)]


def test_explicit_offsets_move_only_the_partitions_listed(two) -> None:
    two.execute(SET + "(PARTITION 1 OFFSET 3)")
    assert _committed(two) == {0: 5, 1: 3}
    assert _consume(two) == [(1, 3), (1, 4)]
    two.execute(SET + "(PARTITION 0 OFFSET 1, PARTITION 1 OFFSET 5)")
    assert _committed(two) == {0: 1, 1: 5}


def test_an_offset_past_the_end_or_a_missing_partition_is_refused(two) -> None:
    with pytest.raises(InvalidParameterValueError, match="past its end"):
        two.execute(SET + "(PARTITION 0 OFFSET 6)")
    two.execute(SET + "(PARTITION 0 OFFSET 5)")  # the end itself: nothing left to read
    with pytest.raises(UndefinedObjectError, match="no partition 7"):
        two.execute(SET + "(PARTITION 7 OFFSET 0)")
    with pytest.raises(UndefinedObjectError, match='consumer "nobody"'):
        two.execute("ALTER TOPIC t ALTER CONSUMER nobody SET OFFSETS TO EARLIEST")
    assert _committed(two) == {0: 5, 1: 5}


def test_if_exists_skips_a_missing_topic(session) -> None:
    result = session.execute("ALTER TOPIC IF EXISTS gone ALTER CONSUMER c SET OFFSETS TO LATEST")
    assert result[0].tag == "ALTER TOPIC" and "does not exist" in result[0].notices[0]


def test_timestamp_moves_to_the_first_message_written_at_or_after_it(tmp_path) -> None:
    clock = ManualClock(START_US)
    database = Database.open(str(tmp_path / "data"), clock=clock)
    session = database.connect()
    try:
        session.execute("CREATE TOPIC t (CONSUMER c)")
        session.execute("INSERT INTO TOPIC t (data) VALUES ('early1'), ('early2')")
        clock.advance(seconds=3600)
        session.execute("INSERT INTO TOPIC t (data) VALUES ('late')")
        _consume(session)
        middle = datetime.fromtimestamp(START_US / 1e6 + 1800, tz=UTC).isoformat()
        session.execute(SET + f"TIMESTAMP '{middle}'")
        assert _committed(session) == {0: 2}
        session.execute(SET + f"Timestamp('{datetime.fromtimestamp(0, tz=UTC).isoformat()}')")
        assert _committed(session) == {0: 0}
        session.execute(SET + "TIMESTAMP '2100-01-01T00:00:00Z'")  # after everything: the end
        assert _committed(session) == {0: 3}
    finally:
        session.close()
        database.close()


def test_inside_a_transaction_it_commits_or_rolls_back_with_it(two, database) -> None:
    other = database.connect()
    try:
        two.execute("BEGIN")
        two.execute(SET + "EARLIEST")
        assert _committed(other) == {0: 5, 1: 5}, "invisible before COMMIT"
        two.execute("ROLLBACK")
        assert _committed(two) == {0: 5, 1: 5}
        two.execute("BEGIN")
        two.execute(SET + "EARLIEST")
        two.execute("COMMIT")
        assert _committed(other) == {0: 0, 1: 0}
    finally:
        other.close()


def test_a_read_after_the_move_in_one_transaction_continues_from_it(two) -> None:
    two.execute("BEGIN")
    two.execute(SET + "(PARTITION 0 OFFSET 1, PARTITION 1 OFFSET 4)")
    # the poll takes partition 0 first (its turn), from the moved offset
    assert _consume(two, ", max_messages = 3") == [(0, 1), (0, 2), (0, 3)]
    two.execute("COMMIT")
    assert _committed(two) == {0: 4, 1: 4}


def test_a_move_after_a_read_in_one_transaction_decides_the_offset(two) -> None:
    two.execute(SET + "EARLIEST")
    two.execute("BEGIN")
    assert _consume(two, ", max_messages = 4") == [(0, 0), (0, 1), (0, 2), (0, 3)]
    two.execute(SET + "(PARTITION 0 OFFSET 1)")
    assert _consume(two, ", partition = 0, max_messages = 1") == [(0, 1)]
    two.execute("COMMIT")
    assert _committed(two) == {0: 2, 1: 0}  # partition 1 stays where EARLIEST put it


def test_a_concurrent_reader_gets_40001_at_its_commit(two, database) -> None:
    reader = database.connect()
    try:
        two.execute(SET + "EARLIEST")
        reader.execute("BEGIN")
        assert len(_consume(reader)) == 10
        two.execute(SET + "(PARTITION 0 OFFSET 2)")  # no members: not refused
        with pytest.raises(SerializationFailure) as conflict:
            reader.execute("COMMIT")
        assert conflict.value.sqlstate == "40001"
        assert _committed(two) == {0: 2, 1: 0}
    finally:
        reader.close()


def test_refused_while_the_consumer_has_live_members_unless_forced(two, database) -> None:
    two.execute(SET + "EARLIEST")  # no members yet
    member = database.connect()
    try:
        member.execute("BEGIN")
        assert len(_consume(member, ", member = 'w1', max_messages = 2")) == 2
        with pytest.raises(ObjectInUseError, match='"w1"') as refused:
            two.execute(SET + "LATEST")
        assert refused.value.sqlstate == "55006"
        assert _committed(two) == {0: 0, 1: 0}
        two.execute(SET + "(PARTITION 0 OFFSET 4) FORCE")
        assert _committed(two) == {0: 4, 1: 0}
        with pytest.raises(SerializationFailure):
            member.execute("COMMIT")  # its read started at the offset the reset moved
        assert _consume(member, ", member = 'w1', max_messages = 20") == [(0, 4)] + [
            (1, offset) for offset in range(5)
        ]
    finally:
        member.close()
    two.execute(SET + "LATEST")  # the member left with its session: no FORCE needed
    assert _committed(two) == {0: 5, 1: 5}


def test_refusal_inside_a_transaction_fails_it(two, database) -> None:
    member = database.connect()
    try:
        _consume(member, ", member = 'w1', max_messages = 1")
        two.execute("BEGIN")
        with pytest.raises(ObjectInUseError):
            two.execute(SET + "EARLIEST")
        two.execute("ROLLBACK")
    finally:
        member.close()


def test_the_move_survives_a_restart(tmp_path) -> None:
    path = str(tmp_path / "data")
    database = Database.open(path)
    session = database.connect()
    session.execute("CREATE TOPIC t (CONSUMER c)")
    session.execute("INSERT INTO TOPIC t (data) SELECT 'm' FROM range(4)")
    _consume(session)
    session.execute(SET + "(PARTITION 0 OFFSET 1)")
    session.close()
    database.close()
    database = Database.open(path)
    session = database.connect()
    try:
        assert _committed(session) == {0: 1}
    finally:
        session.close()
        database.close()


def test_explain_shows_the_move(two) -> None:
    plan = rows(two, "EXPLAIN " + SET + "(PARTITION 1 OFFSET 2) FORCE")
    text = "\n".join(r["plan"] for r in plan)
    assert "SetConsumerOffsets topic=t consumer=c p1:2 force" in text


def test_moving_offsets_needs_select_on_the_topic(two) -> None:
    """Moving a consumer is consuming (docs/DESIGN.md §6: topic SELECT covers it)."""
    two.execute("SET ROLE alice")
    with pytest.raises(InsufficientPrivilegeError):
        two.execute(SET + "EARLIEST")
    two.execute("RESET ROLE")
    assert _committed(two) == {0: 5, 1: 5}
    two.execute("GRANT SELECT ON TOPIC t TO alice")
    two.execute("SET ROLE alice")
    two.execute(SET + "EARLIEST")
    two.execute("RESET ROLE")
    assert _committed(two) == {0: 0, 1: 0}


def test_ranges_committed_ahead_before_a_rewind_are_forgotten(session) -> None:
    """COMMIT OFFSETS remembers ranges past a gap; a rewind starts over without them."""
    session.execute("CREATE TOPIC t (CONSUMER c)")
    session.execute("INSERT INTO TOPIC t (data) SELECT 'm' FROM range(10)")
    commit = "COMMIT OFFSETS ON TOPIC t FOR CONSUMER c (PARTITION 0 {})"
    session.execute(commit.format("FROM 5 UPTO 7"))  # ahead of a gap: remembered
    session.execute(commit.format("UPTO 3"))
    assert _committed(session) == {0: 3}
    session.execute(SET + "EARLIEST")
    session.execute(commit.format("UPTO 5"))
    assert _committed(session) == {0: 5}, "the range [5, 7) was committed before the rewind"


def test_a_move_whose_consumer_moved_before_its_commit_gets_40001(two, database) -> None:
    """Validated like a read: recovery replays commit records by transaction id, which
    only validated moves of one consumer partition are sure to follow."""
    two.execute(SET + "EARLIEST")
    reader = database.connect()
    try:
        two.execute("BEGIN")
        two.execute(SET + "LATEST")
        assert len(_consume(reader, ", partition = 0, max_messages = 2")) == 2  # commits
        with pytest.raises(SerializationFailure) as conflict:
            two.execute("COMMIT")
        assert "moved from 0 to 2" in str(conflict.value)
        assert _committed(two) == {0: 2, 1: 0}
    finally:
        reader.close()


@pytest.mark.parametrize(
    ("sql", "message"),
    [
        (SET + "(PARTITION 0 OFFSET 1, PARTITION 0 OFFSET 2)", "listed more than once"),
        (SET + "TIMESTAMP 'yesterday'", "invalid timestamp"),
        (SET + "EARLIEST, ADD CONSUMER d", "syntax error"),
        (SET + "NEWEST", "syntax error"),
        ("ALTER TOPIC t ALTER CONSUMER c SET OFFSETS EARLIEST", "syntax error"),
    ],
)
def test_malformed_moves_are_syntax_errors(sql: str, message: str) -> None:
    with pytest.raises(SqlSyntaxError, match=message) as error:
        parse_one(sql)
    assert error.value.sqlstate == "42601"
