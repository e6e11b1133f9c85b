"""End-to-end behaviour of sessions: DDL, topic writes and reads, consumers, transactions."""

from __future__ import annotations

import threading

import pytest

from engine.database import Database
from storage import errors
from tests.engine.conftest import rows

TOPIC = "CREATE TOPIC events (CONSUMER c1, CONSUMER c2) WITH (min_active_partitions = 2)"


def test_create_topic_shows_in_show_topics_and_sys_topics(session):
    session.execute(TOPIC)
    assert [r["name"] for r in rows(session, "SHOW TOPICS")] == ["events"]
    view = rows(session, "SELECT name, partitions, consumers FROM sys.topics")
    assert view == [{"name": "events", "partitions": 2, "consumers": 2}]


def test_create_existing_topic_is_42p07_and_if_not_exists_is_a_notice(session):
    session.execute(TOPIC)
    with pytest.raises(errors.DuplicateTopicError) as caught:
        session.execute(TOPIC)
    assert caught.value.sqlstate == "42P07"
    result = session.execute("CREATE TOPIC IF NOT EXISTS events")[0]
    assert "already exists" in result.notices[0]


def test_insert_returning_reports_duplicates_with_earlier_offsets(session):
    session.execute(TOPIC)
    first = rows(
        session,
        "INSERT INTO TOPIC events (data, producer_id, seq_no) VALUES ('a','p',1),('b','p',2) "
        'RETURNING partition, "offset", status',
    )
    again = rows(
        session,
        "INSERT INTO TOPIC events (data, producer_id, seq_no) VALUES ('a','p',1),('c','p',3) "
        'RETURNING "offset", status',
    )
    assert [r["status"] for r in first] == ["written", "written"]
    assert again == [{"offset": 0, "status": "duplicate"}, {"offset": 2, "status": "written"}]


def test_consumer_read_commits_in_autocommit_and_continues_next_time(session):
    session.execute(TOPIC)
    session.execute(
        "INSERT INTO TOPIC events (data) VALUES ('a'), ('b'), ('c') WITH (partition = 0)"
    )
    sql = (
        "SELECT CAST(data AS VARCHAR) AS d FROM TOPIC events "
        "WITH (consumer = 'c1', max_messages = 2)"
    )
    assert [r["d"] for r in rows(session, sql)] == ["a", "b"]
    assert [r["d"] for r in rows(session, sql)] == ["c"]
    assert rows(session, sql) == []
    # The other consumer has its own offsets; a peek commits nothing.
    assert len(rows(session, "SELECT * FROM TOPIC events WITH (consumer = 'c2')")) == 3
    assert len(rows(session, "SELECT * FROM TOPIC events")) == 3


def test_reading_with_unknown_consumer_is_an_error(session):
    session.execute(TOPIC)
    with pytest.raises(errors.UndefinedObjectError):
        session.execute("SELECT * FROM TOPIC events WITH (consumer = 'nobody')")


def test_unknown_topic_is_42p01(session):
    with pytest.raises(errors.UndefinedTopicError) as caught:
        session.execute("SELECT * FROM TOPIC nope")
    assert caught.value.sqlstate == "42P01"


def test_rolled_back_transaction_moves_no_offset_and_publishes_nothing(session):
    session.execute(TOPIC + "; CREATE TOPIC out")
    session.execute("INSERT INTO TOPIC events (data) VALUES ('a'), ('b')")
    session.execute("BEGIN")
    session.execute(
        "INSERT INTO TOPIC out (data) SELECT data FROM TOPIC events WITH (consumer='c1')"
    )
    assert rows(session, "SELECT * FROM TOPIC out") == []
    session.execute("ROLLBACK")
    assert rows(session, "SELECT * FROM TOPIC out") == []
    assert len(rows(session, "SELECT * FROM TOPIC events WITH (consumer = 'c1')")) == 2


def test_overlapping_readers_second_commit_gets_40001(database):
    first, second = database.connect(), database.connect()
    first.execute(TOPIC + "; CREATE TOPIC out")
    first.execute("INSERT INTO TOPIC events (data) VALUES ('a'), ('b')")
    move = "INSERT INTO TOPIC out (data) SELECT data FROM TOPIC events WITH (consumer = 'c1')"
    for s in (first, second):
        s.execute("BEGIN")
        s.execute(move)
    first.execute("COMMIT")
    with pytest.raises(errors.SerializationFailure) as caught:
        second.execute("COMMIT")
    assert caught.value.sqlstate == "40001"
    assert len(rows(first, "SELECT * FROM TOPIC out")) == 2


def test_different_consumers_commit_without_conflict(database):
    first, second = database.connect(), database.connect()
    first.execute(TOPIC)
    first.execute("INSERT INTO TOPIC events (data) VALUES ('a'), ('b')")
    for s, consumer in ((first, "c1"), (second, "c2")):
        s.execute("BEGIN")
        s.execute(f"SELECT * FROM TOPIC events WITH (consumer = '{consumer}')")
    first.execute("COMMIT")
    second.execute("COMMIT")
    assert rows(first, "SELECT * FROM sys.consumers WHERE lag_messages > 0") == []


def test_failed_statement_puts_transaction_in_25p02_until_rollback(session):
    session.execute("BEGIN")
    with pytest.raises(errors.TopicbaseError):
        session.execute("SELECT * FROM missing_table")
    with pytest.raises(errors.InFailedTransactionError) as caught:
        session.execute("SELECT 1")
    assert caught.value.sqlstate == "25P02"
    assert session.execute("ROLLBACK")[0].tag == "ROLLBACK"
    assert rows(session, "SELECT 1 AS x") == [{"x": 1}]


def test_topic_to_table_in_one_transaction(session):
    session.execute(TOPIC + "; CREATE TABLE counts (k VARCHAR PRIMARY KEY, n BIGINT)")
    session.execute(
        "INSERT INTO TOPIC events (data, message_group_id) VALUES ('x','u1'),('y','u1'),('z','u2')"
    )
    upsert = (
        "INSERT INTO counts SELECT message_group_id, count(*) FROM TOPIC events "
        "WITH (consumer = 'c1') GROUP BY 1 ON CONFLICT (k) DO UPDATE SET n = n + EXCLUDED.n"
    )
    session.execute(f"BEGIN; {upsert}; COMMIT")
    session.execute("INSERT INTO TOPIC events (data, message_group_id) VALUES ('w','u1')")
    session.execute(f"BEGIN; {upsert}; COMMIT")
    assert rows(session, "SELECT * FROM counts ORDER BY k") == [
        {"k": "u1", "n": 3},
        {"k": "u2", "n": 1},
    ]


def test_commit_offsets_advances_only_over_a_gap_free_prefix(session):
    session.execute(TOPIC)
    session.execute("INSERT INTO TOPIC events (data) VALUES ('a'),('b'),('c') WITH (partition = 0)")
    committed = "SELECT committed_offset FROM sys.consumers WHERE consumer='c1' AND partition=0"
    session.execute("COMMIT OFFSETS ON TOPIC events FOR CONSUMER c1 (PARTITION 0 FROM 1 UPTO 3)")
    assert rows(session, committed) == [{"committed_offset": None}]
    session.execute("COMMIT OFFSETS ON TOPIC events FOR CONSUMER c1 (PARTITION 0 FROM 0 UPTO 1)")
    assert rows(session, committed) == [{"committed_offset": 3}]


def test_catalog_and_offsets_survive_reopen(tmp_path):
    path = str(tmp_path / "data")
    db = Database.open(path)
    s = db.connect()
    s.execute(TOPIC + "; INSERT INTO TOPIC events (data) VALUES ('a'), ('b') WITH (partition = 1)")
    s.execute("SELECT * FROM TOPIC events WITH (consumer = 'c1', max_messages = 1)")
    s.close()
    db.close()
    db = Database.open(path)
    s = db.connect()
    left = rows(s, "SELECT CAST(data AS VARCHAR) AS d FROM TOPIC events WITH (consumer = 'c1')")
    assert left == [{"d": "b"}]
    s.close()
    db.close()


def test_alter_topic_adds_partitions_and_consumers_and_refuses_disabling_autopartitioning(session):
    session.execute(TOPIC)
    session.execute(
        "ALTER TOPIC events ADD CONSUMER c3, SET (min_active_partitions = 3, "
        "auto_partitioning_strategy = 'scale_up')"
    )
    view = rows(session, "SELECT partitions, consumers FROM sys.topics")
    assert view == [{"partitions": 3, "consumers": 3}]
    with pytest.raises(errors.InvalidParameterValueError):
        session.execute("ALTER TOPIC events SET (auto_partitioning_strategy = 'disabled')")
    session.execute("ALTER TOPIC events SET (auto_partitioning_strategy = 'paused')")


def test_alter_consumer_codecs_must_include_the_topics(session):
    session.execute("CREATE TOPIC t (CONSUMER c) WITH (supported_codecs = 'raw,zstd')")
    with pytest.raises(errors.InvalidParameterValueError) as caught:
        session.execute("ALTER TOPIC t ALTER CONSUMER c SET (supported_codecs = 'raw')")
    assert caught.value.sqlstate == "22023"


def test_write_with_codec_the_topic_refuses_is_22023(session):
    session.execute("CREATE TOPIC t WITH (supported_codecs = 'raw')")
    with pytest.raises(errors.UnsupportedCodecError) as caught:
        session.execute("INSERT INTO TOPIC t (data) VALUES ('x') WITH (codec = 'zstd')")
    assert caught.value.sqlstate == "22023"


def test_compressed_messages_read_back_decoded(session):
    session.execute("CREATE TOPIC t")
    session.execute("INSERT INTO TOPIC t (data) VALUES ('hello hello hello') WITH (codec = 'gzip')")
    assert rows(session, "SELECT CAST(data AS VARCHAR) AS d, codec FROM TOPIC t") == [
        {"d": "hello hello hello", "codec": "gzip"}
    ]


def test_consumer_wait_is_woken_by_a_write_from_another_session(database):
    reader, writer = database.connect(), database.connect()
    reader.execute("CREATE TOPIC t (CONSUMER c)")
    found: list = []
    thread = threading.Thread(
        target=lambda: found.extend(
            rows(reader, "SELECT * FROM TOPIC t WITH (consumer = 'c', wait = Interval('PT5S'))")
        )
    )
    thread.start()
    writer.execute("INSERT INTO TOPIC t (data) VALUES ('late')")
    thread.join(timeout=10)
    assert len(found) == 1


def test_explain_lists_operations_without_running_them(session):
    session.execute(TOPIC + "; CREATE TABLE t (k VARCHAR)")
    plan = rows(
        session,
        "EXPLAIN INSERT INTO t SELECT CAST(data AS VARCHAR) FROM TOPIC events WITH (consumer='c1')",
    )
    text = "\n".join(r["plan"] for r in plan)
    assert "ReadRecords topic=events partitions=[0,1] consumer c1" in text
    assert "writes=[t]" in text
    assert rows(session, "SELECT count(*) AS n FROM t") == [{"n": 0}]
    # EXPLAIN did not consume anything.
    assert rows(session, "SELECT * FROM sys.consumers WHERE committed_offset IS NOT NULL") == []


def test_topic_ddl_inside_a_transaction_is_refused(session):
    session.execute("BEGIN")
    with pytest.raises(errors.ActiveSqlTransactionError) as caught:
        session.execute("CREATE TOPIC t")
    assert caught.value.sqlstate == "25001"
    session.execute("ROLLBACK")


def test_plain_column_picks_of_a_topic_match_what_duckdb_returns(session):
    session.execute(TOPIC)
    session.execute("INSERT INTO TOPIC events (data) VALUES ('a'), ('b') WITH (partition = 1)")
    direct = rows(session, 'SELECT "offset", data AS payload FROM TOPIC events')
    through_duckdb = rows(
        session, 'SELECT "offset", data AS payload FROM TOPIC events WHERE "offset" >= 0'
    )
    assert direct == through_duckdb == [
        {"offset": 0, "payload": b"a"},
        {"offset": 1, "payload": b"b"},
    ]


def test_transaction_records_whether_it_committed(database):
    """``Transaction.committed``: fronts read the outcome after the fact."""
    first, second = database.connect(), database.connect()
    try:
        first.execute("CREATE TOPIC outcome (CONSUMER c)")
        first.execute("INSERT INTO TOPIC outcome (data) VALUES ('a')")
        outcomes = []
        for end in ("COMMIT", "ROLLBACK"):
            first.execute("BEGIN")
            transaction = first.transaction
            first.execute(end)
            outcomes.append(transaction.committed)
        assert outcomes == [True, False]
        first.execute("BEGIN")
        stale = first.transaction
        rows(first, "SELECT data FROM TOPIC outcome WITH (consumer = 'c')")
        rows(second, "SELECT data FROM TOPIC outcome WITH (consumer = 'c')")  # commits first
        with pytest.raises(errors.SerializationFailure):
            first.execute("COMMIT")
        assert stale.committed is False and first.transaction is None
    finally:
        first.close()
        second.close()
