"""Every topic setting, consumer setting, read/write option and write column, checked.

This module owns the tables of names, types, ranges, defaults and RESET/ALTER rules,
the cross-setting rules, and the columns and literal values a topic write accepts.
The parser calls it on each WITH/SET/RESET list and VALUES row; the engine calls
``check_topic_rules``/``check_consumer_rules`` on the settings in force after an
ALTER, ``check_consumer_codecs`` with a topic's and a consumer's codecs, and
``check_strategy_change`` with the old and new auto-partitioning strategy.

Invariants: returned dicts hold canonical names (lower case, aliases resolved) and
normalised values (choices in lower case, codec lists as tuples, points in time as
aware UTC datetimes, intervals as timedeltas). Errors: unknown name or bad value
22023 with the name; a name given twice 42601; going over a storage limit 54000;
something Topicbase does not build yet 0A000. Pure, no I/O.

Where the facts come from (YDB documentation and the YQL translator, read as facts):

- ``yql/reference/syntax/create-topic.md`` and ``alter-topic.md`` (en, ru): the names,
  types and defaults: min_active_partitions 1; partition_count_limit (alias of
  max_active_partitions) 0; retention_period Interval, 18h; retention_storage_mb 0 =
  unlimited, "not supported in topics with autopartitioning enabled";
  partition_write_speed_bytes_per_second 2097152; partition_write_burst_bytes 0 =
  "equal to the quota"; metering_mode RESERVED_CAPACITY | REQUEST_UNITS;
  auto_partitioning_strategy values disabled (default), scale_up, paused;
  auto_partitioning_up_utilization_percent 80; auto_partitioning_stabilization_window
  5m; settings of several ALTER CONSUMER actions "shouldn't repeat".
- ``_includes/topic_consumer_parameters.md``: type STREAMING | SHARED (default
  STREAMING); important boolean false; availability_period Interval, no default,
  "incompatible with the important parameter"; read_from Datetime, Timestamp or
  integer Unix seconds, default 0; shared consumers only: keep_messages_order false,
  default_processing_timeout 30s, max_processing_attempts 1000 ("only with
  dead_letter_policy = move or delete"), dead_letter_policy delete | move | none
  (default none), dead_letter_queue ("required for move and not supported for none or
  delete").
- ``yql/essentials/sql/v1/sql_translation`` (topic settings): which values are integer,
  string, bool or Interval literals; metrics_level takes an integer or a string;
  content_based_deduplication is a bool; RESET is refused for important, type,
  keep_messages_order, the shared-consumer Interval settings, max_processing_attempts
  and the dead-letter settings; ALTER is refused for type and keep_messages_order; a
  consumer setting given twice for one consumer is an error.
- YDB's topic schema checks (``pq_schema_actor``): 0 partitions means 1; a nonzero
  maximum below the minimum is refused; utilization percents lie in 0..100, 0 taking
  the default (down: 30); retention must be at least a second; a burst above twice
  the speed and above 1 MiB is refused; a consumer's codecs, when listed, must
  include every codec of the topic; read_from cannot be negative; metrics levels
  are 0 disabled, 1 database, 2 object, 3 detailed.

Topicbase's own choices: a topic accepts raw, gzip and zstd unless told otherwise;
choices are spelled in lower case; 'up' is accepted for 'scale_up' (docs/DESIGN.md §1);
'scale_up_and_down' is accepted and acts like 'scale_up' (partitions split, merging is not
built; docs/autopartitioning.md); type 'shared' is refused with 0A000 until it is built.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import Enum

from grammar.ast import Parameter, SourcePosition, Value
from grammar.names import check_member_name
from grammar.split import SourceText, parse_point_in_time
from storage import limits
from storage.errors import (
    DatetimeFieldOverflowError,
    DuplicateColumnError,
    FeatureNotSupportedError,
    InvalidParameterValueError,
    LimitExceededError,
    NotNullViolationError,
    NumericValueOutOfRangeError,
    SqlSyntaxError,
    UndefinedColumnError,
)

KNOWN_CODECS = ("raw", "gzip", "lzop", "zstd")
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# YDB refuses a burst above both twice the write speed and this floor.
BURST_FLOOR_BYTES = 1024 * 1024


class SettingKind(Enum):
    INTEGER = "an integer"
    BOOLEAN = "true or false"
    STRING = "a string"
    CHOICE = "one of"
    INTERVAL = "an Interval('...')"
    POINT_IN_TIME = "a Timestamp('...'), a Datetime('...') or integer Unix seconds"
    CODEC_LIST = "a string of comma-separated codecs"
    METRICS_LEVEL = "an integer 0-3 or a level name"


@dataclass(frozen=True)
class SettingSpec:
    """One setting: its type, range and rules. ``limit_maximum`` is a storage limit
    (54000 when exceeded); for strings it counts UTF-8 bytes."""

    name: str
    kind: SettingKind
    default: Value
    resettable: bool = True
    alterable: bool = True
    minimum: int | timedelta | None = None
    maximum: int | timedelta | None = None
    limit_maximum: int | timedelta | None = None
    choices: tuple[tuple[str, str], ...] = ()
    zero_means_default: bool = False
    shared_only: bool = False
    not_built: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class InvalidLiteral:
    """A typed literal that did not decode; validation reports it with the name."""

    kind: str
    text: str
    reason: str


_STRATEGIES = (("disabled", "disabled"), ("up", "scale_up"), ("scale_up", "scale_up"))
_STRATEGIES += (("paused", "paused"), ("scale_up_and_down", "scale_up_and_down"))
_METRICS_LEVELS = ("disabled", "database", "object", "detailed")


def _spec(name: str, kind: SettingKind, default: Value, **rules: object) -> SettingSpec:
    return SettingSpec(name, kind, default, **rules)  # type: ignore[arg-type]


_I, _B, _S, _C = SettingKind.INTEGER, SettingKind.BOOLEAN, SettingKind.STRING, SettingKind.CHOICE
_T, _P = SettingKind.INTERVAL, SettingKind.POINT_IN_TIME
_SECOND = timedelta(seconds=1)

TOPIC_SETTINGS: Mapping[str, SettingSpec] = {
    spec.name: spec
    for spec in (
        _spec(
            "min_active_partitions",
            _I,
            1,
            minimum=0,
            zero_means_default=True,
            limit_maximum=limits.PARTITIONS_PER_TOPIC_MAX,
        ),
        _spec(
            "max_active_partitions", _I, 0, minimum=0, limit_maximum=limits.PARTITIONS_PER_TOPIC_MAX
        ),
        _spec("retention_period", _T, timedelta(hours=18), minimum=_SECOND),
        _spec("retention_storage_mb", _I, 0, minimum=0),
        _spec("supported_codecs", SettingKind.CODEC_LIST, ("raw", "gzip", "zstd")),
        _spec(
            "partition_write_speed_bytes_per_second",
            _I,
            2_097_152,
            minimum=0,
            zero_means_default=True,
        ),
        _spec("partition_write_burst_bytes", _I, 0, minimum=0),
        _spec(
            "metering_mode",
            _C,
            None,
            choices=(
                ("reserved_capacity", "reserved_capacity"),
                ("request_units", "request_units"),
            ),
        ),
        _spec(
            "auto_partitioning_strategy",
            _C,
            "disabled",
            choices=_STRATEGIES,
        ),
        _spec(
            "auto_partitioning_up_utilization_percent",
            _I,
            80,
            minimum=0,
            maximum=100,
            zero_means_default=True,
        ),
        _spec(
            "auto_partitioning_down_utilization_percent",
            _I,
            30,
            minimum=0,
            maximum=100,
            zero_means_default=True,
        ),
        _spec("auto_partitioning_stabilization_window", _T, timedelta(minutes=5), minimum=_SECOND),
        _spec("metrics_level", SettingKind.METRICS_LEVEL, None),
        _spec("content_based_deduplication", _B, False),
    )
}
TOPIC_SETTING_ALIASES: Mapping[str, str] = {"partition_count_limit": "max_active_partitions"}

CONSUMER_SETTINGS: Mapping[str, SettingSpec] = {
    spec.name: spec
    for spec in (
        _spec("important", _B, False, resettable=False),
        _spec("read_from", _P, EPOCH),
        _spec("supported_codecs", SettingKind.CODEC_LIST, ()),
        _spec("availability_period", _T, None, minimum=_SECOND),
        _spec(
            "type",
            _C,
            "streaming",
            resettable=False,
            alterable=False,
            choices=(("streaming", "streaming"), ("shared", "shared")),
            not_built=(("shared", "shared consumers are not built yet"),),
        ),
        _spec(
            "keep_messages_order", _B, False, resettable=False, alterable=False, shared_only=True
        ),
        _spec(
            "default_processing_timeout",
            _T,
            timedelta(seconds=30),
            resettable=False,
            minimum=_SECOND,
            shared_only=True,
        ),
        _spec("max_processing_attempts", _I, 1000, resettable=False, minimum=1, shared_only=True),
        _spec(
            "dead_letter_policy",
            _C,
            "none",
            resettable=False,
            shared_only=True,
            choices=(("delete", "delete"), ("move", "move"), ("none", "none")),
        ),
        _spec("dead_letter_queue", _S, None, resettable=False, shared_only=True),
        _spec(
            "receive_message_wait_time",
            _T,
            None,
            resettable=False,
            minimum=timedelta(0),
            shared_only=True,
        ),
        _spec(
            "receive_message_delay",
            _T,
            None,
            resettable=False,
            minimum=timedelta(0),
            shared_only=True,
        ),
    )
}

READ_OPTIONS: Mapping[str, SettingSpec] = {
    spec.name: spec
    for spec in (
        _spec("consumer", _S, None),
        _spec("member", _S, None),
        _spec("partition", _I, None, minimum=0),
        _spec("from_offset", _I, None, minimum=0),
        _spec("max_messages", _I, None, minimum=1, limit_maximum=limits.READ_MESSAGES_MAX),
        _spec("max_bytes", _I, None, minimum=1, limit_maximum=limits.READ_BYTES_MAX),
        _spec(
            "wait",
            _T,
            timedelta(0),
            minimum=timedelta(0),
            limit_maximum=timedelta(milliseconds=limits.WAIT_MS_MAX),
        ),
        _spec("read_from", _P, None),
        _spec("max_lag", _T, None, minimum=timedelta(0)),
        _spec("decode", _B, True),
    )
}

WRITE_OPTIONS: Mapping[str, SettingSpec] = {
    spec.name: spec
    for spec in (
        _spec("codec", _C, None, choices=tuple((codec, codec) for codec in KNOWN_CODECS)),
        _spec("producer_id", _S, None, limit_maximum=limits.PRODUCER_ID_BYTES_MAX),
        _spec("message_group_id", _S, None, limit_maximum=limits.PRODUCER_ID_BYTES_MAX),
        _spec("partition", _I, None, minimum=0),
    )
}

TOPIC_SETTING_DEFAULTS: Mapping[str, Value] = {n: s.default for n, s in TOPIC_SETTINGS.items()}
CONSUMER_SETTING_DEFAULTS: Mapping[str, Value] = {
    name: spec.default for name, spec in CONSUMER_SETTINGS.items()
}

SettingPairs = Iterable[tuple[str, object]] | Mapping[str, object]


# -- public entry points -------------------------------------------------------------------
def validate_topic_settings(pairs: SettingPairs, *, creating: bool = False) -> dict[str, Value]:
    """Checked, normalised topic settings of one WITH or SET list.

    ``creating`` also checks the cross-setting rules against the defaults of the
    settings not given, as CREATE TOPIC will store them.
    """
    settings = _validate(pairs, TOPIC_SETTINGS, "topic setting", TOPIC_SETTING_ALIASES)
    check_topic_rules({**TOPIC_SETTING_DEFAULTS, **settings} if creating else settings)
    return settings


def validate_consumer_settings(
    pairs: SettingPairs, *, consumer: str, altering: bool = False
) -> dict[str, Value]:
    """Checked, normalised settings of one consumer's WITH or ALTER CONSUMER SET list."""
    settings = _validate(pairs, CONSUMER_SETTINGS, "consumer setting", {})
    if altering:
        for name in settings:
            if not CONSUMER_SETTINGS[name].alterable:
                raise InvalidParameterValueError(
                    f'consumer setting "{name}" cannot be altered (consumer "{consumer}")',
                    setting=name,
                )
    check_consumer_rules(
        settings if altering else {**CONSUMER_SETTING_DEFAULTS, **settings}, consumer=consumer
    )
    # Only a written max_processing_attempts is checked: a stored default cannot be
    # told from a written one later, so this rule is not part of check_consumer_rules.
    policy = settings.get("dead_letter_policy", None if altering else "none")
    if "max_processing_attempts" in settings and policy == "none":
        raise _rule_error(
            f'consumer "{consumer}": max_processing_attempts needs dead_letter_policy '
            "'move' or 'delete'",
            "max_processing_attempts",
        )
    _refuse_unbuilt_consumer_settings(settings, consumer)
    return settings


def validate_topic_reset(names: Iterable[str]) -> tuple[str, ...]:
    """Canonical names of a topic RESET list."""
    return _validate_reset(names, TOPIC_SETTINGS, "topic setting", TOPIC_SETTING_ALIASES)


def validate_consumer_reset(names: Iterable[str]) -> tuple[str, ...]:
    """Canonical names of an ALTER CONSUMER ... RESET list."""
    return _validate_reset(names, CONSUMER_SETTINGS, "consumer setting", {})


def validate_read_options(pairs: SettingPairs) -> dict[str, Value]:
    """Options of ``FROM TOPIC t WITH (...)``. Parameters pass unchecked; the planner
    calls this again with the bound values."""
    options = _validate(pairs, READ_OPTIONS, "read option", {}, parameters_allowed=True)
    if options.get("member") is not None and options.get("consumer") is None:
        raise InvalidParameterValueError(
            'read option "member" needs a "consumer" to join', setting="member"
        )
    if isinstance(options.get("member"), str):
        check_member_name(options["member"])
    return options


def validate_write_options(pairs: SettingPairs) -> dict[str, Value]:
    """Options of ``INSERT INTO TOPIC ... WITH (...)``: defaults for every row."""
    return _validate(pairs, WRITE_OPTIONS, "write option", {}, parameters_allowed=True)


# -- cross-setting rules ------------------------------------------------------------------------
def check_topic_rules(settings: Mapping[str, Value]) -> None:
    """Rules between topic settings; checks only pairs present in ``settings``."""
    minimum, maximum = settings.get("min_active_partitions"), settings.get("max_active_partitions")
    if isinstance(minimum, int) and isinstance(maximum, int) and 0 < maximum < minimum:
        raise _rule_error(
            f"max_active_partitions ({maximum}) must be 0 or at least "
            f"min_active_partitions ({minimum})",
            "max_active_partitions",
        )
    storage_mb = settings.get("retention_storage_mb")
    strategy = settings.get("auto_partitioning_strategy")
    if isinstance(storage_mb, int) and storage_mb > 0 and strategy not in (None, "disabled"):
        raise _rule_error(
            "retention_storage_mb is not supported with auto-partitioning "
            f"(auto_partitioning_strategy = '{strategy}')",
            "retention_storage_mb",
        )
    speed = settings.get("partition_write_speed_bytes_per_second")
    burst = settings.get("partition_write_burst_bytes")
    if (
        isinstance(speed, int)
        and isinstance(burst, int)
        and burst > max(2 * speed, BURST_FLOOR_BYTES)
    ):
        raise _rule_error(
            f"partition_write_burst_bytes ({burst}) may not exceed twice "
            f"partition_write_speed_bytes_per_second or 1 MiB, whichever is larger",
            "partition_write_burst_bytes",
        )


def check_consumer_rules(settings: Mapping[str, Value], *, consumer: str) -> None:
    """Rules between one consumer's settings; checks only pairs present."""
    if settings.get("important") is True and settings.get("availability_period") is not None:
        raise _rule_error(
            f'consumer "{consumer}": important and availability_period exclude each other',
            "availability_period",
        )
    policy = settings.get("dead_letter_policy")
    queue = settings.get("dead_letter_queue")
    if policy == "move" and "dead_letter_queue" in settings and queue is None:
        raise _rule_error(
            f"consumer \"{consumer}\": dead_letter_policy 'move' needs a dead_letter_queue",
            "dead_letter_queue",
        )
    if policy in ("none", "delete") and queue is not None:
        raise _rule_error(
            f"consumer \"{consumer}\": dead_letter_queue needs dead_letter_policy 'move'",
            "dead_letter_queue",
        )


def check_consumer_codecs(
    topic_codecs: Iterable[str], consumer_codecs: Iterable[str], *, consumer: str
) -> None:
    """A consumer that lists codecs must accept every codec the topic accepts."""
    listed = tuple(consumer_codecs)
    if not listed:
        return
    missing = [codec for codec in topic_codecs if codec not in listed]
    if missing:
        raise InvalidParameterValueError(
            f'consumer "{consumer}" does not support codec "{missing[0]}", which the topic '
            "accepts; a consumer's supported_codecs must include all of the topic's",
            setting="supported_codecs",
        )


def check_strategy_change(old_strategy: str, new_strategy: str) -> None:
    """Auto-partitioning, once enabled, can be paused but not disabled."""
    if old_strategy != "disabled" and new_strategy == "disabled":
        raise _rule_error(
            f"auto-partitioning is '{old_strategy}' and cannot be disabled (rule: once "
            "enabled, auto_partitioning_strategy can be paused but never set back to "
            "'disabled'); set auto_partitioning_strategy = 'paused' to stop splits",
            "auto_partitioning_strategy",
        )


def _rule_error(message: str, setting: str) -> InvalidParameterValueError:
    return InvalidParameterValueError(message, setting=setting)


def _refuse_unbuilt_consumer_settings(settings: Mapping[str, Value], consumer: str) -> None:
    for name, value in settings.items():
        spec = CONSUMER_SETTINGS[name]
        if spec.shared_only:
            raise FeatureNotSupportedError(
                f'consumer "{consumer}": "{name}" applies to shared consumers, '
                "which are not built yet",
                setting=name,
            )
        reason = dict(spec.not_built).get(value) if isinstance(value, str) else None
        if reason:
            raise FeatureNotSupportedError(
                f"consumer \"{consumer}\": {name} = '{value}' is refused: {reason}", setting=name
            )


# -- the common walk -----------------------------------------------------------------------------
def _validate(
    pairs: SettingPairs,
    table: Mapping[str, SettingSpec],
    scope: str,
    aliases: Mapping[str, str],
    *,
    parameters_allowed: bool = False,
) -> dict[str, Value]:
    items = pairs.items() if isinstance(pairs, Mapping) else pairs
    result: dict[str, Value] = {}
    written_as: dict[str, str] = {}
    for written_name, value in items:
        name = _canonical_name(written_name, table, scope, aliases)
        if name in written_as:
            raise _duplicate_error(scope, written_as[name], written_name)
        written_as[name] = written_name
        if isinstance(value, Parameter):
            if not parameters_allowed:
                raise FeatureNotSupportedError(
                    f'{scope} "{name}": parameters are not supported here; write the value',
                    setting=name,
                )
            result[name] = value
            continue
        result[name] = convert_value(table[name], value, scope)
    return result


def _canonical_name(
    written_name: str, table: Mapping[str, SettingSpec], scope: str, aliases: Mapping[str, str]
) -> str:
    lowered = written_name.lower()
    name = aliases.get(lowered, lowered)
    if name not in table:
        known = ", ".join(sorted(table))
        raise InvalidParameterValueError(
            f'unknown {scope} "{written_name}" (known: {known})', setting=written_name
        )
    return name


def _duplicate_error(scope: str, first: str, second: str) -> SqlSyntaxError:
    if first.lower() == second.lower():
        name = second.lower()
        return SqlSyntaxError(f'{scope} "{name}" is specified more than once', setting=name)
    return SqlSyntaxError(
        f'{scope} "{first}" and "{second}" name the same setting; give only one', setting=second
    )


def _validate_reset(
    names: Iterable[str], table: Mapping[str, SettingSpec], scope: str, aliases: Mapping[str, str]
) -> tuple[str, ...]:
    seen: dict[str, str] = {}
    for written_name in names:
        name = _canonical_name(written_name, table, scope, aliases)
        if name in seen:
            raise _duplicate_error(scope, seen[name], written_name)
        seen[name] = written_name
        if not table[name].resettable:
            raise InvalidParameterValueError(
                f'{scope} "{name}" cannot be reset; SET it to the value you want', setting=name
            )
    return tuple(seen)


# -- value conversion ----------------------------------------------------------------------------
class _BadValue(Exception):
    """Internal: why a value does not fit a setting."""


def convert_value(spec: SettingSpec, value: object, scope: str) -> Value:
    """The normalised value of one setting; raises 22023, 54000 or 0A000."""
    try:
        if isinstance(value, InvalidLiteral):
            raise _BadValue(f"{value.kind}('{value.text}') is not valid: {value.reason}")
        converted = _CONVERTERS[spec.kind](spec, value)
        _check_range(spec, converted, scope)
    except _BadValue as bad:
        raise InvalidParameterValueError(
            f'invalid value for {scope} "{spec.name}": {bad}', setting=spec.name
        ) from None
    reason = dict(spec.not_built).get(converted) if isinstance(converted, str) else None
    if reason and scope != "consumer setting":
        raise FeatureNotSupportedError(
            f"{scope} {spec.name} = '{converted}' is refused: {reason}", setting=spec.name
        )
    return converted


def _check_range(spec: SettingSpec, value: Value, scope: str) -> None:
    if isinstance(value, str) and isinstance(spec.limit_maximum, int):
        size_bytes = len(value.encode())
        if size_bytes > spec.limit_maximum:
            raise LimitExceededError(
                f'{scope} "{spec.name}" is {size_bytes} bytes long; the limit is '
                f"{spec.limit_maximum}",
                setting=spec.name,
            )
    if not isinstance(value, int | timedelta) or isinstance(value, bool):
        return
    if spec.minimum is not None and value < spec.minimum:  # type: ignore[operator]
        raise _BadValue(f"{_show(value)} is below the minimum of {_show(spec.minimum)}")
    if spec.maximum is not None and value > spec.maximum:  # type: ignore[operator]
        raise _BadValue(f"{_show(value)} is above the maximum of {_show(spec.maximum)}")
    if spec.limit_maximum is not None and value > spec.limit_maximum:  # type: ignore[operator]
        raise LimitExceededError(
            f'{scope} "{spec.name}" is {_show(value)}, above the limit of '
            f"{_show(spec.limit_maximum)}",
            setting=spec.name,
        )


def _show(value: object) -> str:
    if isinstance(value, timedelta):
        return f"{value.total_seconds():g} seconds"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f"'{value}'"
    if isinstance(value, datetime):
        return f"Timestamp('{value.isoformat()}')"
    if isinstance(value, bytes):
        return f"X'{value.hex()}'"
    return "NULL" if value is None else str(value)


def _expect(spec: SettingSpec, value: object) -> _BadValue:
    return _BadValue(f"expected {spec.kind.value}, got {_show(value)}")


def _to_integer(spec: SettingSpec, value: object) -> Value:
    if not isinstance(value, int) or isinstance(value, bool):
        raise _expect(spec, value)
    if value == 0 and spec.zero_means_default:
        return spec.default
    return value


def _to_boolean(spec: SettingSpec, value: object) -> Value:
    if not isinstance(value, bool):
        raise _expect(spec, value)
    return value


def _to_string(spec: SettingSpec, value: object) -> Value:
    if not isinstance(value, str):
        raise _expect(spec, value)
    if not value:
        raise _BadValue("must not be empty")
    return value


def _to_choice(spec: SettingSpec, value: object) -> Value:
    choices = dict(spec.choices)
    if not isinstance(value, str) or value.strip().lower() not in choices:
        spelled = ", ".join(f"'{choice}'" for choice in choices)
        raise _BadValue(f"expected one of {spelled}, got {_show(value)}")
    return choices[value.strip().lower()]


def _to_interval(spec: SettingSpec, value: object) -> Value:
    if not isinstance(value, timedelta):
        raise _expect(spec, value)
    return value


def _to_point_in_time(spec: SettingSpec, value: object) -> Value:
    if isinstance(value, datetime):
        return value.astimezone(UTC)
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise _BadValue(f"Unix seconds cannot be negative, got {value}")
        return EPOCH + timedelta(seconds=value)
    raise _expect(spec, value)


def _to_codec_list(spec: SettingSpec, value: object) -> Value:
    if not isinstance(value, str):
        raise _expect(spec, value)
    codecs = [part.strip().lower() for part in value.split(",")]
    for codec in codecs:
        if codec not in KNOWN_CODECS:
            shown = f"'{codec}'" if codec else "an empty name"
            raise _BadValue(f"unknown codec {shown}; known codecs: {', '.join(KNOWN_CODECS)}")
    if len(set(codecs)) != len(codecs):
        raise _BadValue(f"a codec is listed twice in '{value}'")
    return tuple(codecs)


def _to_metrics_level(spec: SettingSpec, value: object) -> Value:
    if isinstance(value, int) and not isinstance(value, bool):
        if not 0 <= value < len(_METRICS_LEVELS):
            raise _BadValue(f"levels are 0 to {len(_METRICS_LEVELS) - 1}, got {value}")
        return _METRICS_LEVELS[value]
    if isinstance(value, str) and value.strip().lower() in _METRICS_LEVELS:
        return value.strip().lower()
    raise _BadValue(f"expected 0-3 or one of {', '.join(_METRICS_LEVELS)}, got {_show(value)}")


_CONVERTERS = {
    SettingKind.INTEGER: _to_integer,
    SettingKind.BOOLEAN: _to_boolean,
    SettingKind.STRING: _to_string,
    SettingKind.CHOICE: _to_choice,
    SettingKind.INTERVAL: _to_interval,
    SettingKind.POINT_IN_TIME: _to_point_in_time,
    SettingKind.CODEC_LIST: _to_codec_list,
    SettingKind.METRICS_LEVEL: _to_metrics_level,
}


# -- the columns of a topic write: the one list of each, which the engine imports ----------------
INSERT_COLUMNS = (
    "data",
    "producer_id",
    "seq_no",
    "message_group_id",
    "partition",
    "created_at",
    "metadata",
    "codec",
)
# What an autocommit INSERT INTO TOPIC ... RETURNING gives per message, in this order.
RETURNING_COLUMNS = (
    "partition",
    "offset",
    "status",
    "seq_no",
    "producer_id",
    "message_group_id",
    "created_at",
)


def check_insert_columns(columns: tuple[str, ...], position: SourcePosition | None) -> None:
    """Columns of INSERT INTO TOPIC: known, each once, ``data`` among them."""
    where = {} if position is None else {"line": position.line, "column": position.column}
    seen: set[str] = set()
    for column in columns:
        if column not in INSERT_COLUMNS:
            raise UndefinedColumnError(
                f'column "{column}" of a topic does not exist; a topic write takes '
                f"{', '.join(INSERT_COLUMNS)}",
                **where,
            )
        if column in seen:
            raise DuplicateColumnError(f'column "{column}" is specified more than once', **where)
        seen.add(column)
    if "data" not in seen:
        raise NotNullViolationError('a topic write needs the "data" column', **where)


def expand_returning(items: tuple[str, ...]) -> tuple[str, ...]:
    """RETURNING columns of a topic write, ``*`` expanded."""
    expanded: list[str] = []
    for item in items:
        if item == "*":
            expanded += RETURNING_COLUMNS
        elif item in RETURNING_COLUMNS:
            expanded.append(item)
        else:
            raise UndefinedColumnError(
                f'column "{item}" cannot be returned by a topic write; choose from '
                f"{', '.join(RETURNING_COLUMNS)}"
            )
    return tuple(expanded)


def check_value_rows(
    columns: tuple[str, ...],
    rows: list[tuple[Value, ...]],
    source: SourceText,
    body_offset: int,
) -> tuple[tuple[Value, ...], ...]:
    """Literal rows checked and normalised against their columns."""
    converters = [_CELL_CONVERTERS[column] for column in columns]
    checked: list[tuple[Value, ...]] = []
    for row_number, row in enumerate(rows, start=1):
        if len(row) != len(columns):
            raise source.syntax_error(
                body_offset,
                f"VALUES row {row_number} has {len(row)} values for {len(columns)} columns",
            )
        checked.append(
            tuple(
                value if isinstance(value, Parameter) else _cell(convert, column, value, row_number)
                for convert, column, value in zip(converters, columns, row, strict=True)
            )
        )
    return tuple(checked)


def _cell(convert: _CellConverter, column: str, value: Value, row_number: int) -> Value:
    try:
        return convert(value)
    except _BadValue as bad:
        raise InvalidParameterValueError(
            f'VALUES row {row_number}, column "{column}": {bad}', column=column, row=row_number
        ) from None
    except (LimitExceededError, NotNullViolationError, NumericValueOutOfRangeError,
            DatetimeFieldOverflowError) as error:  # fmt: skip
        raise type(error)(f'VALUES row {row_number}, column "{column}": {error}') from None


_CellConverter = Callable[[Value], Value]


def _data_cell(value: Value) -> Value:
    if value is None:
        raise NotNullViolationError("a message needs data; it must not be NULL")
    if not isinstance(value, str | bytes):
        raise _BadValue(f"expected a string or X'..' bytes, got {_show(value)}")
    if len(value) > limits.MESSAGE_BYTES_MAX and (
        isinstance(value, bytes) or len(value.encode()) > limits.MESSAGE_BYTES_MAX
    ):
        raise LimitExceededError(f"a message is limited to {limits.MESSAGE_BYTES_MAX} bytes")
    return value


def _identifier_cell(value: Value) -> Value:
    if value is not None and not isinstance(value, str):
        raise _BadValue(f"expected a string or NULL, got {_show(value)}")
    if value is not None and len(value.encode()) > limits.PRODUCER_ID_BYTES_MAX:
        raise LimitExceededError(f"the limit is {limits.PRODUCER_ID_BYTES_MAX} bytes")
    return value


def _count_cell(value: Value) -> Value:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise _BadValue(f"expected a non-negative integer or NULL, got {_show(value)}")
    if not 0 <= value <= 2**63 - 1:  # what a topic stores (int64), as engine.writes checks
        raise NumericValueOutOfRangeError(f"{value} is out of range (0 to {2**63 - 1})")
    return value


def _created_at_cell(value: Value) -> Value:
    if value is None or isinstance(value, datetime):
        return value
    if not isinstance(value, str):
        raise _BadValue(f"expected a Timestamp('...') or an ISO-8601 string, got {_show(value)}")
    if _OUT_OF_RANGE_INSTANT.match(value):  # readers return years 1..9999 (engine.writes)
        raise DatetimeFieldOverflowError(f"'{value}' is out of range (finite, years 1 to 9999)")
    try:
        return parse_point_in_time(value)
    except OverflowError:  # an offset moved it past year 1 or 9999
        raise DatetimeFieldOverflowError(f"'{value}' is out of range (years 1 to 9999)") from None
    except ValueError as error:
        raise _BadValue(f"'{value}' is not a point in time: {error}") from None


# A year before 1 or past 9999, or an infinity: a timestamp, but out of range (22008).
_OUT_OF_RANGE_INSTANT = re.compile(r"\s*(?:[+-]\d+-|\d{5,}-|[+-]?infinity\s*$)", re.IGNORECASE)


def _metadata_cell(value: Value) -> Value:
    if value is None:
        return None
    if not isinstance(value, str):
        raise _BadValue(f"expected a JSON object string or NULL, got {_show(value)}")
    try:
        decoded = json.loads(value)
    except ValueError:
        decoded = None
    if not isinstance(decoded, dict) or not all(isinstance(v, str) for v in decoded.values()):
        raise _BadValue('expected a JSON object whose values are strings, like \'{"k": "v"}\'')
    if len(decoded) > limits.METADATA_ITEMS_MAX:
        raise LimitExceededError(f"a message has at most {limits.METADATA_ITEMS_MAX} items")
    return tuple(decoded.items())


def _codec_cell(value: Value) -> Value:
    if value is None:
        return None
    if not isinstance(value, str) or value.lower() not in KNOWN_CODECS:
        raise _BadValue(f"expected one of {', '.join(KNOWN_CODECS)}, got {_show(value)}")
    return value.lower()


_CELL_CONVERTERS: Mapping[str, _CellConverter] = {
    "data": _data_cell,
    "producer_id": _identifier_cell,
    "message_group_id": _identifier_cell,
    "seq_no": _count_cell,
    "partition": _count_cell,
    "created_at": _created_at_cell,
    "metadata": _metadata_cell,
    "codec": _codec_cell,
}
