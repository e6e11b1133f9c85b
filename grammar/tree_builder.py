"""The Lark path: topic statements parsed with ``topic.lark`` and built into statement objects.

``parse_with_grammar`` parses one statement's text (or an INSERT skeleton of equal length)
and ``TreeBuilder`` turns the tree into ``grammar.ast`` objects, checking settings with
``grammar.settings`` and names with ``grammar.names``, and the rules of one ALTER TOPIC
(no setting twice, no consumer both added and dropped). ``read_options`` reads the
``WITH (...)`` of a ``TOPIC name`` in SQL. Offsets in a tree are relative to the
statement's start; errors carry absolute positions in the script.

Invariants: ``PARSER`` is built once at import (reading ``topic.lark``) and immutable
after, so parsing is thread-safe.
"""

from __future__ import annotations

import importlib.resources

from lark import Lark, Tree
from lark import Token as LarkToken
from lark.exceptions import UnexpectedInput, UnexpectedToken

from grammar import settings
from grammar.ast import (
    AbortWrites,
    AddConsumer,
    AlterAction,
    AlterConsumerReset,
    AlterConsumerSet,
    AlterTopic,
    Begin,
    Commit,
    CommitOffsets,
    CommitWrites,
    ConsumerDefinition,
    CreateTopic,
    DescribeTopic,
    DropConsumer,
    DropTopic,
    Grant,
    InsertTopic,
    OffsetRange,
    Parameter,
    ResetTopicSettings,
    Rollback,
    SetOffsets,
    SetRole,
    SetTopicSettings,
    ShowTopics,
    SourcePosition,
    Statement,
    Value,
)
from grammar.names import check_consumer_name, check_topic_name
from grammar.split import (
    SourceText,
    parse_interval,
    parse_point_in_time,
    unquote_identifier,
    unquote_string,
)
from storage.errors import (
    DuplicateObjectError,
    FeatureNotSupportedError,
    NumericValueOutOfRangeError,
    SqlSyntaxError,
    TopicbaseError,
)

PARSER = Lark(
    importlib.resources.files("grammar").joinpath("topic.lark").read_text(encoding="utf-8"),
    parser="lalr",
    start=["statement", "setting_list"],
    propagate_positions=True,
)


# -- the grammar path ----------------------------------------------------------------------
def parse_with_grammar(source: SourceText, start: int, end: int, statement_text: str) -> Statement:
    """Parse ``statement_text`` (the statement, or its INSERT skeleton of equal length)."""
    try:
        tree = PARSER.parse(statement_text, start="statement")
    except UnexpectedInput as error:
        raise grammar_error(source, start, end, error) from None
    return TreeBuilder(source, start, end).build(tree)


def grammar_error(
    source: SourceText, start: int, end: int, error: UnexpectedInput
) -> SqlSyntaxError:
    if isinstance(error, UnexpectedToken) and error.token.type == "$END":
        return source.syntax_error(end, "syntax error at end of input")
    relative = error.token.start_pos if isinstance(error, UnexpectedToken) else error.pos_in_stream
    return source.error_near(start + (relative or 0), end)


def _subtree(tree: Tree, data: str) -> Tree | None:
    for child in tree.children:
        if isinstance(child, Tree) and child.data == data:
            return child
    return None


def _privileges_and_objects(tree: Tree) -> tuple[Tree, Tree]:
    """The privileges and objects subtrees of a GRANT or REVOKE tree."""
    children = [c for c in tree.children if isinstance(c, Tree)]
    privileges = next(c for c in children if c.data in ("privileges", "all_privileges"))
    objects = next(c for c in children if c.data in _OBJECT_KINDS)
    return privileges, objects


_OBJECT_KINDS = {"table_objects": "table", "topic_objects": "topic", "schema_objects": "schema",
                 "sequence_objects": "sequence"}  # fmt: skip
# PostgreSQL's privileges of tables and views (SELECT, INSERT, UPDATE, DELETE; TRUNCATE,
# REFERENCES and TRIGGER have no meaning here), of topics (read, write, settings and
# consumers), of schemas (CREATE; USAGE is implied: there is one schema) and of sequences
# (USAGE: nextval and currval; SELECT: currval; UPDATE: nextval and setval).
PRIVILEGES_BY_KIND = {
    "table": ("SELECT", "INSERT", "UPDATE", "DELETE"),
    "topic": ("SELECT", "INSERT", "ALTER"),
    "schema": ("CREATE",),
    "sequence": ("USAGE", "SELECT", "UPDATE"),
}


def _subtrees(tree: Tree | None, data: str) -> list[Tree]:
    if tree is None:
        return []
    return [child for child in tree.children if isinstance(child, Tree) and child.data == data]


class TreeBuilder:
    """Turns one Lark tree into statement objects; offsets in the tree are relative to
    ``start``."""

    def __init__(self, source: SourceText, start: int, end: int) -> None:
        self.source = source
        self.start = start
        self.end = end
        self.setting_positions: dict[str, SourcePosition] = {}

    def build(self, tree: Tree) -> Statement:
        builder = getattr(self, f"_build_{tree.data}")
        try:
            statement: Statement = builder(tree)
        except TopicbaseError as error:
            self.locate(error)
            raise
        return statement

    def locate(self, error: TopicbaseError) -> None:
        """Give a settings error the line and column where its setting is written."""
        position = self.setting_positions.get(str(error.context.get("setting", "")).lower())
        if position is not None and "line" not in error.context:
            error.context.update(line=position.line, column=position.column)

    def position(self, item: Tree | LarkToken) -> SourcePosition:
        relative = item.start_pos if isinstance(item, LarkToken) else item.meta.start_pos
        return self.source.position(self.start + (relative or 0))

    @property
    def place(self) -> dict[str, object]:
        return {
            "position": self.source.position(self.start),
            "text": self.source.text[self.start : self.end],
        }

    # -- statements --------------------------------------------------------------------
    def _build_create_topic(self, tree: Tree) -> CreateTopic:
        consumers = tuple(
            self.consumer(entry, ConsumerDefinition)
            for entry in _subtrees(_subtree(tree, "consumer_entries"), "consumer_entry")
        )
        _refuse_repeated_consumers([consumer.name for consumer in consumers])
        topic_settings = settings.validate_topic_settings(
            self.setting_pairs(_subtree(tree, "with_settings")), creating=True
        )
        topic_codecs = topic_settings.get(
            "supported_codecs", settings.TOPIC_SETTING_DEFAULTS["supported_codecs"]
        )
        for consumer in consumers:
            consumer_codecs = dict(consumer.settings).get("supported_codecs", ())
            settings.check_consumer_codecs(
                topic_codecs,
                consumer_codecs,
                consumer=consumer.name,  # type: ignore[arg-type]
            )
        return CreateTopic(
            name=self.topic_name(tree),
            if_not_exists=_subtree(tree, "if_not_exists") is not None,
            consumers=consumers,
            settings=tuple(topic_settings.items()),
            **self.place,  # type: ignore[arg-type]
        )

    def _build_alter_topic(self, tree: Tree) -> AlterTopic:
        actions = tuple(
            getattr(self, f"action_{child.data}")(child)
            for child in tree.children
            if isinstance(child, Tree) and hasattr(self, f"action_{child.data}")
        )
        _refuse_conflicting_actions(actions)
        return AlterTopic(
            name=self.topic_name(tree),
            if_exists=_subtree(tree, "if_exists") is not None,
            actions=actions,
            **self.place,  # type: ignore[arg-type]
        )

    def _build_drop_topic(self, tree: Tree) -> DropTopic:
        if_exists = _subtree(tree, "if_exists") is not None
        return DropTopic(self.topic_name(tree), if_exists, **self.place)  # type: ignore[arg-type]

    def _build_begin_transaction(self, tree: Tree) -> Begin:
        return Begin(**self.place)  # type: ignore[arg-type]

    def _build_commit_transaction(self, tree: Tree) -> Commit:
        return Commit(**self.place)  # type: ignore[arg-type]

    def _build_rollback_transaction(self, tree: Tree) -> Rollback:
        return Rollback(**self.place)  # type: ignore[arg-type]

    def _build_show_topics(self, tree: Tree) -> ShowTopics:
        return ShowTopics(**self.place)  # type: ignore[arg-type]

    def _build_describe_topic(self, tree: Tree) -> DescribeTopic:
        return DescribeTopic(self.topic_name(tree), **self.place)  # type: ignore[arg-type]

    def _build_grant(self, tree: Tree, revoke: bool = False) -> Grant:
        privileges_tree, objects_tree = _privileges_and_objects(tree)
        kind = _OBJECT_KINDS[objects_tree.data]
        if privileges_tree.data == "all_privileges":
            privileges: tuple[str, ...] = ("ALL",)
        else:
            privileges = tuple(dict.fromkeys(str(t).upper() for t in privileges_tree.children))
            for token in privileges_tree.children:
                if str(token).upper() not in PRIVILEGES_BY_KIND[kind]:
                    raise self.source.syntax_error(
                        self.start + (token.start_pos or 0),  # type: ignore[union-attr]
                        f"privilege {str(token).upper()} does not apply to a {kind} (it has "
                        + ", ".join(PRIVILEGES_BY_KIND[kind]) + ")",
                    )
        if kind == "topic":
            objects = tuple(self.name_of(child, consumer=False) for child in objects_tree.children)
        else:
            objects = tuple(self.object_name(child) for child in objects_tree.children)
        grantees_tree = _subtree(tree, "grantees")
        assert grantees_tree is not None
        grantees = tuple(dict.fromkeys(self.grantee(child) for child in grantees_tree.children))
        option = _subtree(tree, "revoke_grant_option" if revoke else "grant_option") is not None
        return Grant(revoke, privileges, kind, objects, grantees, option, **self.place)  # type: ignore[arg-type]

    def _build_revoke(self, tree: Tree) -> Grant:
        return self._build_grant(tree, revoke=True)

    def object_name(self, tree: Tree) -> str:
        """A table, view or schema name: parts joined by dots, unquoted parts lower-cased
        (PostgreSQL's folding; DuckDB's names are case-insensitive anyway)."""
        return ".".join(self.identifier(child) for child in tree.children)  # type: ignore[arg-type]

    def identifier(self, name_tree: Tree) -> str:
        token = name_tree.children[0]
        assert isinstance(token, LarkToken)
        if token.type == "IDENT":
            return str(token).lower()
        return unquote_identifier(str(token))

    def grantee(self, tree: Tree) -> str:
        if tree.data == "public_grantee":
            return ""
        return self.identifier(tree.children[0])  # type: ignore[arg-type]

    def _build_set_role(self, tree: Tree, session_authorization: bool = False) -> SetRole:
        role_tree = tree.children[-1]
        assert isinstance(role_tree, Tree)
        if role_tree.data == "role_none":
            role = None
        elif role_tree.data == "role_string":
            role = unquote_string(str(role_tree.children[0]))
        else:
            role = self.identifier(role_tree.children[0])  # type: ignore[arg-type]
        return SetRole(role, session_authorization, **self.place)  # type: ignore[arg-type]

    def _build_set_session_authorization(self, tree: Tree) -> SetRole:
        return self._build_set_role(tree, session_authorization=True)

    def _build_reset_role(self, tree: Tree) -> SetRole:
        return SetRole(None, False, **self.place)  # type: ignore[arg-type]

    def _build_reset_session_authorization(self, tree: Tree) -> SetRole:
        return SetRole(None, True, **self.place)  # type: ignore[arg-type]

    def _build_commit_offsets(self, tree: Tree) -> CommitOffsets:
        topic_tree, consumer_tree = _subtrees(tree, "name")
        ranges = tuple(self.offset_range(child) for child in _subtrees(tree, "offset_range"))
        seen: set[int] = set()
        for offset_range in ranges:
            if offset_range.partition in seen:
                raise self.source.syntax_error(
                    offset_range.position.offset,
                    f"partition {offset_range.partition} is listed more than once",
                )
            seen.add(offset_range.partition)
        return CommitOffsets(
            topic=self.name_of(topic_tree, consumer=False),
            consumer=self.name_of(consumer_tree, consumer=True),
            ranges=ranges,
            **self.place,  # type: ignore[arg-type]
        )

    def _build_commit_writes(self, tree: Tree) -> CommitWrites:
        ids_tree = _subtree(tree, "write_ids")
        assert ids_tree is not None
        sink, batch = (t for t in tree.children if isinstance(t, LarkToken))
        batch_id = int(batch)
        if batch_id > 2**63 - 1:
            raise NumericValueOutOfRangeError(f"BATCH {batch_id} is out of range (0 to "
                                              f"{2**63 - 1})")  # fmt: skip
        return CommitWrites(self.write_ids(ids_tree), unquote_string(sink), batch_id,
                            **self.place)  # type: ignore[arg-type]

    def _build_abort_writes(self, tree: Tree) -> AbortWrites:
        ids_tree = _subtree(tree, "write_ids")
        assert ids_tree is not None
        return AbortWrites(self.write_ids(ids_tree), **self.place)  # type: ignore[arg-type]

    def write_ids(self, tree: Tree) -> tuple[str, ...]:
        """The listed write ids, each once (42601 for a repeat: a typo, not a request)."""
        ids = [unquote_string(token) for token in tree.children]
        seen: set[str] = set()
        for token, write_id in zip(tree.children, ids, strict=True):
            if write_id in seen:
                raise self.source.syntax_error(
                    self.start + token.start_pos, f"write {write_id!r} is listed more than once")
            seen.add(write_id)
        return tuple(ids)

    def _build_set_offsets(self, tree: Tree) -> SetOffsets:
        topic_tree, consumer_tree = _subtrees(tree, "name")
        target = next(c for c in tree.children if isinstance(c, Tree) and c.data in _TARGETS)
        timestamp, offsets = None, []
        if target.data == "timestamp_target":
            text = unquote_text(target.children[0])  # type: ignore[arg-type]
            timestamp = _typed_literal("timestamp", text)
            if isinstance(timestamp, settings.InvalidLiteral):
                raise self.source.syntax_error(
                    self.position(target).offset, f"invalid timestamp '{text}': {timestamp.reason}"
                )
        for child in _subtrees(target, "partition_offset"):
            partition, offset = (int(token) for token in child.children)  # type: ignore[call-overload]
            if partition in dict(offsets):
                raise self.source.syntax_error(
                    self.position(child).offset, f"partition {partition} is listed more than once"
                )
            offsets.append((partition, offset))
        return SetOffsets(
            topic=self.name_of(topic_tree, consumer=False),
            consumer=self.name_of(consumer_tree, consumer=True),
            target=_TARGETS[target.data],
            timestamp=timestamp,  # type: ignore[arg-type]
            offsets=tuple(offsets),
            force=_subtree(tree, "force") is not None,
            if_exists=_subtree(tree, "if_exists") is not None,
            **self.place,  # type: ignore[arg-type]
        )

    def _build_insert_topic(self, tree: Tree) -> InsertTopic:
        """The head and tail of an INSERT; the caller fills in rows or query."""
        column_list = _subtree(tree, "column_list")
        columns = (
            tuple(self.column(child) for child in _subtrees(column_list, "column"))
            if column_list is not None
            else ("data",)
        )
        options = settings.validate_write_options(
            self.setting_pairs(_subtree(tree, "with_settings"))
        )
        returning_tree = _subtree(tree, "returning")
        returning = tuple(
            self.returning_item(item) for item in _subtrees(returning_tree, "returning_item")
        )
        settings.check_insert_columns(columns, self.position(column_list) if column_list else None)
        return InsertTopic(
            topic=self.topic_name(tree),
            columns=columns,
            values=None,
            query=None,
            options=tuple(options.items()),
            returning=settings.expand_returning(returning),
            **self.place,  # type: ignore[arg-type]
        )

    # -- ALTER TOPIC actions ---------------------------------------------------------------
    def action_add_consumer(self, tree: Tree) -> AddConsumer:
        return self.consumer(tree.children[0], AddConsumer)

    def action_drop_consumer(self, tree: Tree) -> DropConsumer:
        return DropConsumer(self.name_of(tree.children[0], consumer=True), self.position(tree))

    def action_alter_consumer_set(self, tree: Tree) -> AlterConsumerSet:
        name = self.name_of(tree.children[0], consumer=True)
        consumer_settings = settings.validate_consumer_settings(
            self.setting_pairs(tree.children[1]), consumer=name, altering=True
        )
        return AlterConsumerSet(name, tuple(consumer_settings.items()), self.position(tree))

    def action_alter_consumer_reset(self, tree: Tree) -> AlterConsumerReset:
        name = self.name_of(tree.children[0], consumer=True)
        names = settings.validate_consumer_reset(self.name_list(tree.children[1]))
        return AlterConsumerReset(name, names, self.position(tree))

    def action_set_settings(self, tree: Tree) -> SetTopicSettings:
        topic_settings = settings.validate_topic_settings(self.setting_pairs(tree.children[0]))
        return SetTopicSettings(tuple(topic_settings.items()), self.position(tree))

    def action_reset_settings(self, tree: Tree) -> ResetTopicSettings:
        names = settings.validate_topic_reset(self.name_list(tree.children[0]))
        return ResetTopicSettings(names, self.position(tree))

    # -- pieces ----------------------------------------------------------------------------
    def consumer(self, entry: Tree, kind: type) -> ConsumerDefinition | AddConsumer:
        name = self.name_of(entry.children[0], consumer=True)
        consumer_settings = settings.validate_consumer_settings(
            self.setting_pairs(_subtree(entry, "with_settings")), consumer=name
        )
        built: ConsumerDefinition | AddConsumer = kind(
            name, tuple(consumer_settings.items()), self.position(entry)
        )
        return built

    def topic_name(self, tree: Tree) -> str:
        name_tree = _subtree(tree, "name")
        assert name_tree is not None
        return self.name_of(name_tree, consumer=False)

    def name_of(self, name_tree: Tree, *, consumer: bool) -> str:
        token = name_tree.children[0]
        assert isinstance(token, LarkToken)
        name = unquote_identifier(str(token))
        position = self.position(token)
        if consumer:
            check_consumer_name(name, position)
        else:
            check_topic_name(name, position)
        return name

    def column(self, tree: Tree) -> str:
        token = tree.children[0]
        assert isinstance(token, LarkToken)
        return unquote_identifier(str(token)) if token.type == "QUOTED_IDENT" else token.lower()

    def returning_item(self, tree: Tree) -> str:
        child = tree.children[0]
        return "*" if isinstance(child, LarkToken) else self.column(child)

    def offset_range(self, tree: Tree) -> OffsetRange:
        partition_token, end_token = tree.children[0], tree.children[-1]
        start_tree = _subtree(tree, "offset_start")
        start = int(start_tree.children[0]) if start_tree is not None else None  # type: ignore[arg-type]
        end = int(end_token)  # type: ignore[arg-type]
        if start is not None and start > end:
            raise self.source.syntax_error(
                self.position(start_tree).offset,  # type: ignore[arg-type]
                f"offset range starts at {start}, after its end {end}",
            )
        return OffsetRange(int(partition_token), start, end, self.position(tree))  # type: ignore[arg-type]

    def name_list(self, tree: Tree) -> list[str]:
        return [str(child.children[0]) for child in _subtrees(tree, "setting_name")]

    def setting_pairs(self, tree: Tree | None) -> list[tuple[str, object]]:
        """``(name, value)`` pairs of a ``with_settings`` or ``setting_list`` tree."""
        if tree is not None and tree.data == "with_settings":
            tree = tree.children[0]  # type: ignore[assignment]
        for setting in _subtrees(tree, "setting"):
            name_token = setting.children[0]
            self.setting_positions[str(name_token).lower()] = self.position(name_token)  # type: ignore[arg-type]
        return [
            (str(setting.children[0]), self.value(setting.children[1]))  # type: ignore[arg-type]
            for setting in _subtrees(tree, "setting")
        ]

    def value(self, node: Tree) -> object:
        kind = node.data
        tokens = [child for child in node.children if isinstance(child, LarkToken)]
        if kind == "number":
            literal = tokens[-1]
            number = int(literal) if literal.type == "INT" else float(literal)
            return -number if tokens[0].type == "MINUS" else number
        if kind in ("true", "false", "null"):
            return {"true": True, "false": False, "null": None}[kind]
        if kind == "string":
            return unquote_text(tokens[0])
        if kind in ("interval", "timestamp", "datetime"):
            return _typed_literal(kind, unquote_text(tokens[0]))
        if kind == "dollar_parameter":
            index = int(tokens[0][1:])
            if index < 1:
                raise self.source.syntax_error(
                    self.position(tokens[0]).offset, f"there is no parameter ${index}"
                )
            return Parameter(index)
        assert kind == "question_parameter", kind
        raise FeatureNotSupportedError(
            "? parameters are only allowed in VALUES rows; use $1-style parameters here"
        )


# The targets of SET OFFSETS TO, by their tree's name.
_TARGETS = {
    "earliest": "earliest",
    "latest": "latest",
    "timestamp_target": "timestamp",
    "explicit_offsets": "offsets",
}


def unquote_text(token: LarkToken) -> str:
    """The text of a string literal: 'single' or, as in YQL, "double" quoted."""
    if token.type == "QUOTED_IDENT":
        return unquote_identifier(str(token))  # the same rule: "" stands for "
    return unquote_string(str(token))


def _typed_literal(kind: str, text: str) -> object:
    spelled = {"interval": "Interval", "timestamp": "Timestamp", "datetime": "Datetime"}[kind]
    try:
        if kind == "interval":
            return parse_interval(text)
        return parse_point_in_time(text, spelled)
    except ValueError as error:
        return settings.InvalidLiteral(spelled, text, str(error))



# -- the rules of one ALTER TOPIC --------------------------------------------------------
def _refuse_repeated_consumers(names: list[str]) -> None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise DuplicateObjectError(f'consumer "{name}" is specified more than once')
        seen.add(name)


def _refuse_conflicting_actions(actions: tuple[AlterAction, ...]) -> None:
    """One ALTER TOPIC may not name a setting twice, nor add, drop and alter one
    consumer in different ways."""
    topic_names: list[str] = []
    consumer_kinds: dict[str, list[str]] = {}
    consumer_settings: dict[str, list[str]] = {}
    for action in actions:
        if isinstance(action, SetTopicSettings):
            topic_names += [name for name, _ in action.settings]
        elif isinstance(action, ResetTopicSettings):
            topic_names += list(action.setting_names)
        else:
            kind = type(action).__name__.replace("Set", "").replace("Reset", "")
            consumer_kinds.setdefault(action.name, []).append(kind)
            names = consumer_settings.setdefault(action.name, [])
            if isinstance(action, AlterConsumerSet):
                names += [name for name, _ in action.settings]
            elif isinstance(action, AlterConsumerReset):
                names += list(action.setting_names)
    _refuse_repeats(topic_names, "topic setting")
    for consumer, kinds in consumer_kinds.items():
        _refuse_consumer_conflict(consumer, kinds)
        _refuse_repeats(consumer_settings[consumer], f'setting of consumer "{consumer}"')


def _refuse_repeats(names: list[str], what: str) -> None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise SqlSyntaxError(f'{what} "{name}" is given more than once in one ALTER TOPIC')
        seen.add(name)


def _refuse_consumer_conflict(consumer: str, kinds: list[str]) -> None:
    if kinds.count("AddConsumer") > 1:
        raise DuplicateObjectError(f'consumer "{consumer}" is added more than once')
    distinct = sorted(set(kinds))
    if len(distinct) > 1 or kinds.count("DropConsumer") > 1:
        spelled = {"AddConsumer": "ADD", "DropConsumer": "DROP", "AlterConsumer": "ALTER"}
        listed = " and ".join(spelled[kind] for kind in distinct)
        raise SqlSyntaxError(
            f'consumer "{consumer}" is both the target of {listed} CONSUMER in one ALTER TOPIC'
            if len(distinct) > 1
            else f'consumer "{consumer}" is dropped more than once'
        )




def read_options(source: SourceText, start: int, end: int) -> dict[str, Value]:
    try:
        tree = PARSER.parse(source.text[start:end], start="setting_list")
    except UnexpectedInput as error:
        raise grammar_error(source, start, end, error) from None
    builder = TreeBuilder(source, start, end)
    pairs = builder.setting_pairs(tree)
    try:
        return settings.validate_read_options(pairs)
    except TopicbaseError as error:
        builder.locate(error)
        raise
