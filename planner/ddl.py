"""Planning of CREATE / ALTER / DROP TOPIC: the complete new state, checked.

The parser already checked each WITH/SET/RESET list on its own; here the
actions are applied in order to the topic as the catalog has it, and YDB's
rules that need the whole picture are checked: consumers exist (or not), a
consumer's codecs include the topic's, auto-partitioning once enabled is not
disabled, partitions are only ever added.
"""

from __future__ import annotations

from typing import Any

from grammar import ast
from grammar import settings as rules
from planner.catalog import Catalog
from planner.operations import AlterTopicEntry, CreateTopicEntry, DropTopicEntry, Plan
from storage.errors import (
    DuplicateObjectError,
    DuplicateTopicError,
    UndefinedObjectError,
    UndefinedTopicError,
)


def plan_create_topic(statement: ast.CreateTopic, catalog: Catalog) -> Plan:
    if catalog.topic(statement.name) is not None:
        if statement.if_not_exists:
            note = f'topic "{statement.name}" already exists, skipping'
            return Plan((), "CREATE TOPIC", notes=(note,))
        raise DuplicateTopicError(f'topic "{statement.name}" already exists')
    settings = {**rules.TOPIC_SETTING_DEFAULTS, **dict(statement.settings)}
    rules.check_topic_rules(settings)
    consumers: dict[str, dict[str, Any]] = {}
    for consumer in statement.consumers:
        if consumer.name in consumers:
            raise DuplicateObjectError(f'consumer "{consumer.name}" is listed twice')
        consumers[consumer.name] = _new_consumer(consumer.name, dict(consumer.settings), settings)
    entry = CreateTopicEntry(statement.name, settings, consumers, statement.if_not_exists)
    return Plan((entry,), "CREATE TOPIC")


def plan_alter_topic(statement: ast.AlterTopic, catalog: Catalog) -> Plan:
    info = catalog.topic(statement.name)
    if info is None:
        if statement.if_exists:
            return Plan((), "ALTER TOPIC", notes=(f'topic "{statement.name}" does not exist',))
        raise UndefinedTopicError(f'topic "{statement.name}" does not exist')
    settings = dict(info.settings)
    consumers = {name: dict(values) for name, values in info.consumers.items()}
    for action in statement.actions:
        _apply_action(action, settings, consumers)
    rules.check_topic_rules(settings)
    rules.check_strategy_change(
        str(info.settings.get("auto_partitioning_strategy", "disabled")),
        str(settings.get("auto_partitioning_strategy", "disabled")),
    )
    for name, values in consumers.items():
        rules.check_consumer_rules(values, consumer=name)
        rules.check_consumer_codecs(
            settings["supported_codecs"], values.get("supported_codecs", ()), consumer=name
        )
    active = len(info.active_partitions or info.partitions)
    added = max(0, int(settings["min_active_partitions"]) - active)
    entry = AlterTopicEntry(info.name, info.topic_id, settings, consumers, added)
    return Plan((entry,), "ALTER TOPIC")


def plan_drop_topic(statement: ast.DropTopic, catalog: Catalog) -> Plan:
    info = catalog.topic(statement.name)
    if info is None:
        if statement.if_exists:
            return Plan((), "DROP TOPIC", notes=(f'topic "{statement.name}" does not exist',))
        raise UndefinedTopicError(f'topic "{statement.name}" does not exist')
    return Plan((DropTopicEntry(info.name, info.topic_id, statement.if_exists),), "DROP TOPIC")


def _apply_action(
    action: ast.AlterAction, settings: dict[str, Any], consumers: dict[str, dict[str, Any]]
) -> None:
    if isinstance(action, ast.SetTopicSettings):
        settings.update(dict(action.settings))
    elif isinstance(action, ast.ResetTopicSettings):
        for name in action.setting_names:
            settings[name] = rules.TOPIC_SETTING_DEFAULTS[name]
    elif isinstance(action, ast.AddConsumer):
        if action.name in consumers:
            raise DuplicateObjectError(f'consumer "{action.name}" already exists')
        consumers[action.name] = _new_consumer(action.name, dict(action.settings), settings)
    elif isinstance(action, ast.DropConsumer):
        _require_consumer(consumers, action.name)
        del consumers[action.name]
    elif isinstance(action, ast.AlterConsumerSet):
        _require_consumer(consumers, action.name)
        consumers[action.name].update(dict(action.settings))
    else:
        assert isinstance(action, ast.AlterConsumerReset), action
        _require_consumer(consumers, action.name)
        for name in action.setting_names:
            consumers[action.name][name] = rules.CONSUMER_SETTING_DEFAULTS[name]


def _new_consumer(
    name: str, given: dict[str, Any], topic_settings: dict[str, Any]
) -> dict[str, Any]:
    values = {**rules.CONSUMER_SETTING_DEFAULTS, **given}
    rules.check_consumer_rules(values, consumer=name)
    rules.check_consumer_codecs(
        topic_settings["supported_codecs"], values.get("supported_codecs", ()), consumer=name
    )
    return values


def _require_consumer(consumers: dict[str, dict[str, Any]], name: str) -> None:
    if name not in consumers:
        raise UndefinedObjectError(f'consumer "{name}" does not exist')
