"""Tests of grammar/settings.py: every setting and option, valid and invalid, the
cross-setting rules the engine calls, the defaults DESCRIBE shows, and the values a
topic write accepts per column."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from grammar import settings
from grammar.ast import Parameter
from grammar.split import SourceText
from storage import limits
from storage.errors import TopicbaseError

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "grammar"
HOUR = timedelta(hours=1)
NEW_YEAR = datetime(2024, 1, 1, tzinfo=UTC)

# (name, written value, normalised value)
VALID_TOPIC = [
    ("min_active_partitions", 3, 3),
    ("min_active_partitions", 0, 1),
    ("max_active_partitions", 10, 10),
    ("partition_count_limit", 7, 7),
    ("retention_period", HOUR, HOUR),
    ("retention_storage_mb", 0, 0),
    ("supported_codecs", "Raw, ZSTD", ("raw", "zstd")),
    ("partition_write_speed_bytes_per_second", 0, 2_097_152),
    ("partition_write_burst_bytes", 1_000_000, 1_000_000),
    ("metering_mode", "REQUEST_UNITS", "request_units"),
    ("auto_partitioning_strategy", "up", "scale_up"),
    ("auto_partitioning_strategy", "Scale_Up_And_Down", "scale_up_and_down"),
    ("auto_partitioning_up_utilization_percent", 100, 100),
    ("auto_partitioning_down_utilization_percent", 0, 30),
    ("auto_partitioning_stabilization_window", timedelta(seconds=1), timedelta(seconds=1)),
    ("metrics_level", 0, "disabled"),
    ("content_based_deduplication", False, False),
]
# (name, written value, SQLSTATE, part of the message)
INVALID_TOPIC = [
    ("min_active_partitions", True, "22023", "expected an integer, got true"),
    ("max_active_partitions", -1, "22023", "-1 is below the minimum of 0"),
    ("partition_count_limit", 1001, "54000", "above the limit of 1000"),
    ("retention_period", timedelta(0), "22023", "0 seconds is below the minimum of 1 seconds"),
    ("retention_storage_mb", "1", "22023", "expected an integer"),
    ("supported_codecs", "", "22023", "unknown codec an empty name"),
    ("partition_write_speed_bytes_per_second", -1, "22023", "below the minimum"),
    ("partition_write_burst_bytes", 1.0, "22023", "expected an integer, got 1.0"),
    ("metering_mode", 1, "22023", "expected one of"),
    ("auto_partitioning_strategy", "scale_down", "22023", "expected one of"),
    ("auto_partitioning_up_utilization_percent", 101, "22023", "above the maximum of 100"),
    ("auto_partitioning_down_utilization_percent", "30", "22023", "expected an integer"),
    ("auto_partitioning_stabilization_window", 300, "22023", "expected an Interval"),
    ("metrics_level", -1, "22023", "levels are 0 to 3"),
    ("content_based_deduplication", None, "22023", "expected true or false, got NULL"),
]
VALID_CONSUMER = [
    ("important", True, True),
    ("read_from", 0, datetime(1970, 1, 1, tzinfo=UTC)),
    ("read_from", NEW_YEAR, NEW_YEAR),
    ("supported_codecs", "gzip", ("gzip",)),
    ("availability_period", HOUR, HOUR),
    ("type", "Streaming", "streaming"),
]
INVALID_CONSUMER = [
    ("important", 1, "22023", "expected true or false"),
    ("read_from", -5, "22023", "cannot be negative"),
    ("supported_codecs", "raw,raw", "22023", "listed twice"),
    ("availability_period", timedelta(seconds=-1), "22023", "below the minimum"),
    ("type", "shared", "0A000", "shared consumers are not built yet"),
    ("keep_messages_order", True, "0A000", "applies to shared consumers"),
    ("default_processing_timeout", HOUR, "0A000", "applies to shared consumers"),
    ("max_processing_attempts", 0, "22023", "below the minimum of 1"),
    ("dead_letter_policy", "bounce", "22023", "expected one of 'delete', 'move', 'none'"),
    ("dead_letter_queue", 5, "22023", "expected a string"),
    ("receive_message_wait_time", HOUR, "0A000", "applies to shared consumers"),
    ("receive_message_delay", "1s", "22023", "expected an Interval"),
]
VALID_READ = [
    ("consumer", "c", "c"),
    ("member", "m", "m"),
    ("partition", 0, 0),
    ("from_offset", 5, 5),
    ("max_messages", limits.READ_MESSAGES_MAX, limits.READ_MESSAGES_MAX),
    ("max_bytes", 1, 1),
    ("wait", timedelta(milliseconds=limits.WAIT_MS_MAX), timedelta(minutes=5)),
    ("read_from", 1, datetime(1970, 1, 1, 0, 0, 1, tzinfo=UTC)),
    ("max_lag", timedelta(0), timedelta(0)),
    ("decode", True, True),
]
INVALID_READ = [
    ("consumer", None, "22023", "expected a string, got NULL"),
    ("member", "", "22023", "must not be empty"),
    ("partition", "0", "22023", "expected an integer"),
    ("from_offset", -1, "22023", "below the minimum of 0"),
    ("max_messages", limits.READ_MESSAGES_MAX + 1, "54000", "above the limit"),
    ("max_bytes", limits.READ_BYTES_MAX + 1, "54000", "above the limit"),
    ("wait", timedelta(minutes=6), "54000", "above the limit of 300 seconds"),
    ("read_from", HOUR, "22023", "expected a Timestamp"),
    ("max_lag", 5, "22023", "expected an Interval"),
    ("decode", "yes", "22023", "expected true or false"),
]
VALID_WRITE = [
    ("codec", "ZSTD", "zstd"),
    ("producer_id", "p" * limits.PRODUCER_ID_BYTES_MAX, "p" * limits.PRODUCER_ID_BYTES_MAX),
    ("message_group_id", "g", "g"),
    ("partition", 3, 3),
]
INVALID_WRITE = [
    ("codec", "lz4", "22023", "expected one of 'raw', 'gzip', 'lzop', 'zstd'"),
    ("producer_id", "é" * 1025, "54000", "2050 bytes long; the limit is 2048"),
    ("message_group_id", 1, "22023", "expected a string"),
    ("partition", -2, "22023", "below the minimum of 0"),
]


def _validate_consumer(pairs: list[tuple[str, object]]) -> dict[str, object]:
    return dict(settings.validate_consumer_settings(pairs, consumer="c"))


def _validate_read(pairs: list[tuple[str, object]]) -> dict[str, object]:
    """A member needs a consumer to join; give it one."""
    joined = [("consumer", "c"), *pairs] if pairs[0][0] == "member" else pairs
    return dict(settings.validate_read_options(joined))


VALIDATORS = {
    "topic": lambda pairs: settings.validate_topic_settings(pairs, creating=True),
    "consumer": _validate_consumer,
    "read": _validate_read,
    "write": settings.validate_write_options,
}
VALID = [
    pytest.param(kind, name, value, expected, id=f"{kind}-{name}-{value!r}"[:60])
    for kind, table in (
        ("topic", VALID_TOPIC),
        ("consumer", VALID_CONSUMER),
        ("read", VALID_READ),
        ("write", VALID_WRITE),
    )
    for name, value, expected in table
]
INVALID = [
    pytest.param(kind, name, value, sqlstate, part, id=f"{kind}-{name}-{value!r}"[:60])
    for kind, table in (
        ("topic", INVALID_TOPIC),
        ("consumer", INVALID_CONSUMER),
        ("read", INVALID_READ),
        ("write", INVALID_WRITE),
    )
    for name, value, sqlstate, part in table
]


@pytest.mark.parametrize(("kind", "name", "value", "expected"), VALID)
def test_valid_value_is_accepted_and_normalised(
    kind: str, name: str, value: object, expected: object
) -> None:
    result = VALIDATORS[kind]([(name, value)])
    canonical = settings.TOPIC_SETTING_ALIASES.get(name, name) if kind == "topic" else name
    assert result[canonical] == expected
    assert type(result[canonical]) is type(expected)


@pytest.mark.parametrize(("kind", "name", "value", "sqlstate", "message_part"), INVALID)
def test_invalid_value_is_refused_with_name_and_reason(
    kind: str, name: str, value: object, sqlstate: str, message_part: str
) -> None:
    with pytest.raises(TopicbaseError) as raised:
        VALIDATORS[kind]([(name, value)])
    assert raised.value.sqlstate == sqlstate
    assert message_part in str(raised.value)
    if sqlstate == "22023":
        assert name in str(raised.value)


@pytest.mark.parametrize(
    ("table", "valid", "invalid"),
    [
        (settings.TOPIC_SETTINGS, VALID_TOPIC, INVALID_TOPIC),
        (settings.CONSUMER_SETTINGS, VALID_CONSUMER, INVALID_CONSUMER),
        (settings.READ_OPTIONS, VALID_READ, INVALID_READ),
        (settings.WRITE_OPTIONS, VALID_WRITE, INVALID_WRITE),
    ],
    ids=["topic", "consumer", "read", "write"],
)
def test_every_setting_has_valid_and_invalid_cases(
    table: dict[str, object], valid: list[tuple[str, ...]], invalid: list[tuple[str, ...]]
) -> None:
    # Shared-consumer settings have no valid use until shared consumers are built.
    usable = {name for name, spec in table.items() if not spec.shared_only}  # type: ignore[attr-defined]
    assert usable <= {row[0] for row in valid}
    assert set(table) <= {row[0] for row in invalid}


@pytest.mark.parametrize("kind", ["valid", "invalid"])
def test_every_topic_and_consumer_setting_appears_in_the_sql_fixtures(kind: str) -> None:
    text = "".join(path.read_text() for path in (FIXTURES / kind).glob("*.sql")).lower()
    names = set(settings.TOPIC_SETTINGS) | set(settings.TOPIC_SETTING_ALIASES)
    names |= set(settings.CONSUMER_SETTINGS) | set(settings.READ_OPTIONS)
    names |= set(settings.WRITE_OPTIONS)
    if kind == "valid":  # shared-consumer settings cannot be used yet
        names -= {name for name, spec in settings.CONSUMER_SETTINGS.items() if spec.shared_only}
    assert {name for name in names if f"{name} =" not in text} == set()


# -- names, duplicates, RESET -------------------------------------------------------------
def test_unknown_setting_is_refused_with_its_name_as_written() -> None:
    with pytest.raises(TopicbaseError, match='unknown topic setting "Retention"') as raised:
        settings.validate_topic_settings([("Retention", HOUR)])
    assert raised.value.sqlstate == "22023"
    assert raised.value.context["setting"] == "Retention"


def test_a_mapping_is_accepted_as_input() -> None:
    assert settings.validate_topic_settings({"RETENTION_PERIOD": HOUR}) == {
        "retention_period": HOUR
    }


def test_alias_and_name_together_are_one_setting_given_twice() -> None:
    with pytest.raises(TopicbaseError, match="name the same setting") as raised:
        settings.validate_topic_settings(
            [("partition_count_limit", 2), ("max_active_partitions", 2)]
        )
    assert raised.value.sqlstate == "42601"


def test_reset_resolves_aliases_and_refuses_what_cannot_be_reset() -> None:
    assert settings.validate_topic_reset(["PARTITION_COUNT_LIMIT"]) == ("max_active_partitions",)
    assert settings.validate_consumer_reset(["read_from"]) == ("read_from",)
    with pytest.raises(TopicbaseError, match='"important" cannot be reset'):
        settings.validate_consumer_reset(["important"])


def test_every_topic_setting_can_be_reset() -> None:
    assert set(settings.validate_topic_reset(settings.TOPIC_SETTINGS)) == set(
        settings.TOPIC_SETTINGS
    )


def test_parameters_are_refused_in_ddl_but_kept_in_options() -> None:
    with pytest.raises(TopicbaseError) as raised:
        settings.validate_topic_settings([("retention_period", Parameter(1))])
    assert raised.value.sqlstate == "0A000"
    assert settings.validate_read_options([("max_messages", Parameter(2))]) == {
        "max_messages": Parameter(2)
    }


def test_invalid_literal_is_reported_with_the_setting_name() -> None:
    literal = settings.InvalidLiteral("Interval", "PT1X", "expected an ISO-8601 duration")
    with pytest.raises(TopicbaseError, match=r"retention_period.*Interval\('PT1X'\)"):
        settings.validate_topic_settings([("retention_period", literal)])


# -- defaults ---------------------------------------------------------------------------
def test_defaults_cover_every_setting_with_the_documented_values() -> None:
    topic, consumer = settings.TOPIC_SETTING_DEFAULTS, settings.CONSUMER_SETTING_DEFAULTS
    assert set(topic) == set(settings.TOPIC_SETTINGS)
    assert set(consumer) == set(settings.CONSUMER_SETTINGS)
    assert topic["min_active_partitions"] == 1
    assert topic["max_active_partitions"] == 0
    assert topic["retention_period"] == timedelta(hours=18)
    assert topic["retention_storage_mb"] == 0
    assert topic["partition_write_speed_bytes_per_second"] == 2 * 1024 * 1024
    assert topic["partition_write_burst_bytes"] == 0
    assert topic["auto_partitioning_strategy"] == "disabled"
    assert topic["auto_partitioning_up_utilization_percent"] == 80
    assert topic["auto_partitioning_stabilization_window"] == timedelta(minutes=5)
    assert consumer["important"] is False
    assert consumer["read_from"] == datetime(1970, 1, 1, tzinfo=UTC)
    assert consumer["type"] == "streaming"
    assert consumer["default_processing_timeout"] == timedelta(seconds=30)
    assert consumer["max_processing_attempts"] == 1000
    assert consumer["dead_letter_policy"] == "none"


def test_every_default_passes_its_own_validation() -> None:
    for name, value in settings.TOPIC_SETTING_DEFAULTS.items():
        spec = settings.TOPIC_SETTINGS[name]
        if value is not None and spec.kind is not settings.SettingKind.CODEC_LIST:
            assert settings.convert_value(spec, value, "topic setting") == value


# -- rules the engine calls on the settings in force -------------------------------------------
def test_topic_rules_apply_to_merged_settings_after_alter() -> None:
    in_force = {**settings.TOPIC_SETTING_DEFAULTS, "auto_partitioning_strategy": "scale_up"}
    change = settings.validate_topic_settings([("retention_storage_mb", 10)])
    with pytest.raises(TopicbaseError, match="not supported with auto-partitioning"):
        settings.check_topic_rules({**in_force, **change})


def test_max_partitions_of_zero_means_no_separate_maximum() -> None:
    settings.check_topic_rules({"min_active_partitions": 8, "max_active_partitions": 0})
    with pytest.raises(TopicbaseError, match="must be 0 or at least"):
        settings.check_topic_rules({"min_active_partitions": 8, "max_active_partitions": 7})


def test_burst_may_reach_twice_the_speed_or_one_mebibyte() -> None:
    settings.check_topic_rules(
        {"partition_write_speed_bytes_per_second": 1000, "partition_write_burst_bytes": 1048576}
    )
    settings.check_topic_rules(
        {"partition_write_speed_bytes_per_second": 2**22, "partition_write_burst_bytes": 2**23}
    )
    with pytest.raises(TopicbaseError, match="may not exceed twice"):
        settings.check_topic_rules(
            {
                "partition_write_speed_bytes_per_second": 1000,
                "partition_write_burst_bytes": 2**20 + 1,
            }
        )


def test_consumer_rules_apply_to_merged_settings_after_alter() -> None:
    in_force = {**settings.CONSUMER_SETTING_DEFAULTS, "availability_period": HOUR}
    change = settings.validate_consumer_settings([("important", True)], consumer="c", altering=True)
    with pytest.raises(TopicbaseError, match="exclude each other"):
        settings.check_consumer_rules({**in_force, **change}, consumer="c")


def test_consumer_codecs_must_include_every_topic_codec() -> None:
    settings.check_consumer_codecs(("raw", "zstd"), (), consumer="c")
    settings.check_consumer_codecs(("raw",), ("zstd", "raw"), consumer="c")
    with pytest.raises(TopicbaseError, match='does not support codec "zstd"') as raised:
        settings.check_consumer_codecs(("raw", "zstd"), ("raw",), consumer="c")
    assert raised.value.sqlstate == "22023"


@pytest.mark.parametrize(
    ("old", "new", "allowed"),
    [
        ("disabled", "scale_up", True),
        ("scale_up", "paused", True),
        ("paused", "scale_up", True),
        ("disabled", "disabled", True),
        ("scale_up", "disabled", False),
        ("paused", "disabled", False),
    ],
)
def test_auto_partitioning_can_be_paused_but_never_disabled_again(
    old: str, new: str, allowed: bool
) -> None:
    if allowed:
        settings.check_strategy_change(old, new)
    else:
        with pytest.raises(TopicbaseError, match="cannot be disabled") as raised:
            settings.check_strategy_change(old, new)
        assert raised.value.sqlstate == "22023"


def test_altering_a_consumer_refuses_settings_fixed_at_creation() -> None:
    with pytest.raises(TopicbaseError, match='"type" cannot be altered'):
        settings.validate_consumer_settings([("type", "streaming")], consumer="c", altering=True)


# -- the columns of a topic write ----------------------------------------------------------
def _rows(columns: tuple[str, ...], *rows: tuple[object, ...]) -> tuple[tuple[object, ...], ...]:
    return settings.check_value_rows(columns, list(rows), SourceText("x"), 0)  # type: ignore[arg-type]


def test_write_values_are_normalised_per_column() -> None:
    columns = ("data", "created_at", "metadata", "codec", "seq_no")
    checked = _rows(columns, (b"\x00", "2024-01-01T01:00:00+01:00", '{"a": "b"}', "GZIP", 0))
    assert checked == ((b"\x00", NEW_YEAR, (("a", "b"),), "gzip", 0),)


def test_parameters_in_rows_are_kept_for_binding() -> None:
    assert _rows(("data", "seq_no"), (Parameter(1), Parameter(2))) == (
        (Parameter(1), Parameter(2)),
    )


def test_a_message_above_the_size_limit_is_refused_with_54000() -> None:
    with pytest.raises(TopicbaseError) as raised:
        _rows(("data",), (b"x" * (limits.MESSAGE_BYTES_MAX + 1),))
    assert raised.value.sqlstate == "54000"
    assert 'VALUES row 1, column "data"' in str(raised.value)


def test_metadata_above_the_item_limit_is_refused_with_54000() -> None:
    items = ", ".join(f'"k{number}": "v"' for number in range(limits.METADATA_ITEMS_MAX + 1))
    with pytest.raises(TopicbaseError) as raised:
        _rows(("data", "metadata"), ("x", "{" + items + "}"))
    assert raised.value.sqlstate == "54000"


def test_insert_columns_and_returning_are_checked() -> None:
    settings.check_insert_columns(("seq_no", "data"), None)
    with pytest.raises(TopicbaseError) as raised:
        settings.check_insert_columns(("data", "offset"), None)
    assert raised.value.sqlstate == "42703"
    assert settings.expand_returning(("status", "*"))[:2] == ("status", "partition")
