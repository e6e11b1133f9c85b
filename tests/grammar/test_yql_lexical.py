"""YQL's lexical rules in topic statements, as YDB's grammar (SQLv1.g.in) has them.

- ``STRING_VALUE`` is single- or double-quoted: ``supported_codecs = "raw,zstd"``;
- ``topic_ref`` is a path; YDB writes it absolute, ``/Root/dir/events`` in database
  ``/Root`` (``planner.paths``; 42602 outside the database);
- a trailing comma closes a ``WITH (...)`` list;
- enum-like values (strategies, modes, levels, codecs, keywords) in any case.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from engine.database import Database
from grammar.ast import AlterTopic, CreateTopic, InsertTopic, SetOffsets, SqlStatement
from grammar.parse import parse_one
from planner.paths import check_database_path, relative_name, relative_statement
from storage.errors import InvalidNameError, SqlSyntaxError, TopicbaseError


def _settings(sql: str) -> dict:
    statement = parse_one(sql)
    assert isinstance(statement, CreateTopic)
    return dict(statement.settings)


# -- string literals in single or double quotes -------------------------------------------
def test_double_quoted_strings_are_strings_in_settings() -> None:
    single = _settings(
        "CREATE TOPIC t WITH (supported_codecs = 'raw,zstd', metering_mode = 'request_units')"
    )
    double = _settings(
        'CREATE TOPIC t WITH (supported_codecs = "raw,zstd", metering_mode = "request_units")'
    )
    assert (
        double == single == {"supported_codecs": ("raw", "zstd"), "metering_mode": "request_units"}
    )


def test_double_quoted_strings_in_typed_literals() -> None:
    assert _settings('CREATE TOPIC t WITH (retention_period = Interval("PT2H"))') == {
        "retention_period": timedelta(hours=2)
    }
    statement = parse_one(
        'CREATE TOPIC t (CONSUMER c WITH (read_from = Timestamp("2024-05-01T00:00:00Z")))'
    )
    assert isinstance(statement, CreateTopic)
    assert dict(statement.consumers[0].settings)["read_from"] == datetime(2024, 5, 1, tzinfo=UTC)
    reset = parse_one(
        'ALTER TOPIC t ALTER CONSUMER c SET OFFSETS TO TIMESTAMP "2024-05-01T00:00:00Z"'
    )
    assert isinstance(reset, SetOffsets) and reset.timestamp == datetime(2024, 5, 1, tzinfo=UTC)


def test_double_quoted_strings_in_read_and_write_options() -> None:
    read = parse_one('SELECT * FROM TOPIC t WITH (consumer = "c", max_messages = 5)')
    assert isinstance(read, SqlStatement)
    assert dict(read.topic_scans[0].options) == {"consumer": "c", "max_messages": 5}
    write = parse_one("INSERT INTO TOPIC t (data) VALUES ('x') WITH (codec = \"zstd\")")
    assert isinstance(write, InsertTopic) and dict(write.options) == {"codec": "zstd"}


def test_a_doubled_quote_inside_a_double_quoted_string_is_one_quote() -> None:
    read = parse_one('SELECT * FROM TOPIC t WITH (consumer = "say ""hi""")')
    assert isinstance(read, SqlStatement)
    assert dict(read.topic_scans[0].options)["consumer"] == 'say "hi"'


def test_double_quotes_still_name_topics_where_a_name_stands() -> None:
    statement = parse_one('CREATE TOPIC "dir/events" WITH (supported_codecs = "raw")')
    assert isinstance(statement, CreateTopic)
    assert statement.name == "dir/events" and dict(statement.settings)["supported_codecs"] == (
        "raw",
    )


def test_a_double_quoted_value_is_checked_like_a_single_quoted_one() -> None:
    with pytest.raises(TopicbaseError) as error:
        parse_one('CREATE TOPIC t WITH (supported_codecs = "raw,snappy")')
    assert error.value.sqlstate == "22023" and "snappy" in str(error.value)


# -- trailing commas ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "sql",
    [
        "CREATE TOPIC t WITH (min_active_partitions = 2,)",
        "CREATE TOPIC t (CONSUMER c WITH (important = true,)) "
        "WITH (retention_period = Interval('PT1H'),)",
        "ALTER TOPIC t SET (retention_period = Interval('PT1H'),)",
        "ALTER TOPIC t ALTER CONSUMER c SET (important = false,)",
        "SELECT * FROM TOPIC t WITH (consumer = 'c', max_messages = 3,)",
        "INSERT INTO TOPIC t (data) VALUES ('x') WITH (codec = 'raw',)",
    ],
)
def test_a_trailing_comma_closes_a_with_list(sql: str) -> None:
    without = parse_one(sql.replace(",)", ")"))
    with_comma = parse_one(sql)
    if isinstance(without, SqlStatement):
        assert isinstance(with_comma, SqlStatement)
        assert with_comma.topic_scans[0].options == without.topic_scans[0].options
    else:
        assert type(with_comma) is type(without)
        for field in ("settings", "options", "actions", "consumers"):
            if hasattr(without, field):
                strip = lambda value: repr(value).split("position=")[0]  # noqa: E731
                assert strip(getattr(with_comma, field)) == strip(getattr(without, field))


@pytest.mark.parametrize(
    "sql",
    [
        "CREATE TOPIC t WITH (min_active_partitions = 2,,)",
        "CREATE TOPIC t WITH (,)",
        "SELECT * FROM TOPIC t WITH (,)",
    ],
)
def test_a_lone_or_doubled_comma_is_still_a_syntax_error(sql: str) -> None:
    with pytest.raises(SqlSyntaxError):
        parse_one(sql)


# -- enum-like values in any case ---------------------------------------------------------------
@pytest.mark.parametrize(
    ("written", "setting", "expected"),
    [
        ("auto_partitioning_strategy = 'SCALE_UP'", "auto_partitioning_strategy", "scale_up"),
        ('auto_partitioning_strategy = "Up"', "auto_partitioning_strategy", "scale_up"),
        ("auto_partitioning_strategy = 'Disabled'", "auto_partitioning_strategy", "disabled"),
        ("metering_mode = 'RESERVED_CAPACITY'", "metering_mode", "reserved_capacity"),
        ("metrics_level = 'Detailed'", "metrics_level", "detailed"),
        ("supported_codecs = 'RAW,Zstd'", "supported_codecs", ("raw", "zstd")),
        ("content_based_deduplication = TRUE", "content_based_deduplication", True),
        ("content_based_deduplication = False", "content_based_deduplication", False),
        ("MIN_ACTIVE_PARTITIONS = 3", "min_active_partitions", 3),
    ],
)
def test_enum_like_topic_values_are_case_insensitive(written: str, setting: str, expected) -> None:
    assert _settings(f"CREATE TOPIC t WITH ({written})")[setting] == expected


def test_enum_like_consumer_and_option_values_are_case_insensitive() -> None:
    statement = parse_one("CREATE TOPIC t (CONSUMER c WITH (type = 'STREAMING', Important = True))")
    assert isinstance(statement, CreateTopic)
    assert dict(statement.consumers[0].settings) == {"type": "streaming", "important": True}
    write = parse_one(
        "INSERT INTO TOPIC t (data, codec) VALUES ('x', 'GZIP') WITH (codec = 'ZSTD')"
    )
    assert isinstance(write, InsertTopic)
    assert dict(write.options) == {"codec": "zstd"} and write.values == (("x", "gzip"),)
    for spelled in ("earliest", "Earliest", "EARLIEST"):
        reset = parse_one(f"alter topic t alter consumer c set offsets to {spelled} force")
        assert isinstance(reset, SetOffsets) and reset.target == "earliest" and reset.force


# -- absolute paths -----------------------------------------------------------------------------
def test_an_absolute_path_parses_and_a_malformed_one_is_refused() -> None:
    statement = parse_one(
        "ALTER TOPIC `/Root/dir/events` SET (retention_period = Interval('PT1H'))"
    )
    assert isinstance(statement, AlterTopic) and statement.name == "/Root/dir/events"
    for bad in ("`//x`", "`/Root/`", "`/Root/../x`", "`/`"):
        with pytest.raises(InvalidNameError) as error:
            parse_one(f"DROP TOPIC {bad}")
        assert error.value.sqlstate == "42602"


def test_absolute_paths_are_made_relative_to_the_database() -> None:
    assert relative_name("/Root/dir/events", "/Root") == "dir/events"
    assert relative_name("dir/events", "/Root") == "dir/events"
    assert relative_name("/local/db1/t", "/local/db1") == "t"
    for outside in ("/Other/t", "/Root", "/Rooted/t", "/root/t"):
        with pytest.raises(InvalidNameError) as error:
            relative_name(outside, "/Root")
        assert error.value.sqlstate == "42602"
    scan = relative_statement(
        parse_one("SELECT * FROM TOPIC `/Root/a/b` JOIN TOPIC c ON true"), "/Root"
    )
    assert isinstance(scan, SqlStatement)
    assert [s.topic for s in scan.topic_scans] == ["a/b", "c"]


@pytest.mark.parametrize("path", ["Root", "/", "/Root/", "//Root", "/Root/./x", ""])
def test_a_database_path_must_be_absolute_and_clean(path: str) -> None:
    with pytest.raises(InvalidNameError):
        check_database_path(path)


def test_a_topic_named_by_its_absolute_path_is_the_relative_one(tmp_path) -> None:
    database = Database.open(str(tmp_path / "data"))
    session = database.connect()
    try:
        session.execute(
            'CREATE TOPIC `/Root/dir/events` (CONSUMER c) WITH (supported_codecs = "raw",)'
        )
        assert [r["name"] for r in session.execute("SHOW TOPICS")[0].table.to_pylist()] == [
            "dir/events"
        ]
        session.execute("INSERT INTO TOPIC `/Root/dir/events` (data) VALUES ('a'), ('b')")
        read = session.execute('SELECT count(*) AS n FROM TOPIC `dir/events` WITH (consumer = "c")')
        assert read[0].table.to_pylist() == [{"n": 2}]
        described = session.execute("DESCRIBE TOPIC `/Root/dir/events`")[0].table.to_pylist()
        assert {"section": "topic", "name": "name", "value": "dir/events"} in described
        session.execute("ALTER TOPIC `/Root/dir/events` ALTER CONSUMER c SET OFFSETS TO EARLIEST")
        session.execute(
            "COMMIT OFFSETS ON TOPIC `/Root/dir/events` FOR CONSUMER c (PARTITION 0 UPTO 1)"
        )
        with pytest.raises(InvalidNameError) as error:
            session.execute("SELECT * FROM TOPIC `/Other/dir/events`")
        assert error.value.sqlstate == "42602"
        session.execute("DROP TOPIC `/Root/dir/events`")
        assert session.execute("SHOW TOPICS")[0].table.num_rows == 0
    finally:
        session.close()
        database.close()


def test_the_database_path_is_configurable(tmp_path) -> None:
    with pytest.raises(InvalidNameError):
        Database.open(str(tmp_path / "bad"), database_path="Root")
    database = Database.open(str(tmp_path / "data"), database_path="/local/db1")
    session = database.connect()
    try:
        session.execute("CREATE TOPIC `/local/db1/t`")
        assert session.execute("SHOW TOPICS")[0].table.column("name").to_pylist() == ["t"]
        with pytest.raises(InvalidNameError, match='not inside the database "/local/db1"'):
            session.execute("CREATE TOPIC `/Root/t`")
    finally:
        session.close()
        database.close()


def test_statements_without_absolute_paths_are_not_copied() -> None:
    """The planner runs ``relative_statement`` for every statement (INSERT's fast path)."""
    for sql in (
        "INSERT INTO TOPIC t (data) VALUES ('x')",
        "INSERT INTO TOPIC t (data) SELECT data FROM TOPIC u",
        "SELECT * FROM TOPIC t",
        "DROP TOPIC t",
        "ALTER TOPIC t ALTER CONSUMER c SET OFFSETS TO LATEST",
    ):
        statement = parse_one(sql)
        assert relative_statement(statement, "/Root") is statement
    insert = relative_statement(
        parse_one("INSERT INTO TOPIC t (data) SELECT data FROM TOPIC `/Root/u`"), "/Root"
    )
    assert isinstance(insert, InsertTopic) and insert.query is not None
    assert insert.topic == "t" and insert.query.topic_scans[0].topic == "u"


def test_grants_name_topics_by_absolute_path_too() -> None:
    grant = relative_statement(parse_one("GRANT SELECT ON TOPIC `/Root/a/b`, c TO alice"), "/Root")
    assert grant.objects == ("a/b", "c")  # type: ignore[union-attr]
    with pytest.raises(InvalidNameError):
        relative_statement(parse_one("GRANT SELECT ON TOPIC `/Else/t` TO alice"), "/Root")
