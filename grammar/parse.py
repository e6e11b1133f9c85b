"""SQL text to statement objects: the parser front door.

This module owns ``parse`` and ``parse_one`` and the decisions around them:

- the script length limit (``SQL_TEXT_BYTES_MAX``, 54000 when exceeded);
- dispatch by a statement's first words: topic DDL, transaction control,
  ``SHOW TOPICS``, ``DESCRIBE TOPIC``, ``COMMIT OFFSETS`` and the head and tail of
  ``INSERT INTO TOPIC`` go through the Lark grammar in ``topic.lark``; ``EXPLAIN`` is
  unwrapped; everything else is DuckDB SQL, kept as text;
- topic relations inside SQL: ``TOPIC name [WITH (...)]`` after FROM, JOIN or a
  comma of a FROM list is replaced by a placeholder relation ``__topic_scan_<n>``
  and recorded as a ``TopicScan``; the rewritten text must then parse with sqlglot's
  DuckDB dialect (42601 with line and column if not). SQL without topic relations
  is not re-parsed here: DuckDB reports its own errors.
- ``INSERT INTO TOPIC ... VALUES`` rows of plain literals are read by a regex
  scanner (``split.scan_value_rows``); rows with expressions go to the SQL path.

Invariants: every statement keeps its exact source ``text`` and ``position``; error
positions are absolute in the whole script. Settings and options are checked by
``grammar.settings``. No I/O except reading ``topic.lark`` once at import; the
parser object is immutable after construction, so parsing is thread-safe.
"""

from __future__ import annotations

import importlib.resources
from dataclasses import dataclass
from itertools import islice

import sqlglot
from lark import Lark, Tree
from lark import Token as LarkToken
from lark.exceptions import UnexpectedInput, UnexpectedToken
from sqlglot import exp

from grammar import settings
from grammar.ast import (
    AddConsumer,
    AlterAction,
    AlterConsumerReset,
    AlterConsumerSet,
    AlterTopic,
    Begin,
    Commit,
    CommitOffsets,
    ConsumerDefinition,
    CreateTopic,
    DescribeTopic,
    DropConsumer,
    DropTopic,
    Explain,
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
    SqlStatement,
    Statement,
    TopicScan,
    Value,
)
from grammar.split import (
    SourceText,
    Token,
    matching_parenthesis,
    parse_interval,
    parse_point_in_time,
    scan_value_rows,
    statement_spans,
    tokenize,
    unquote_identifier,
    unquote_string,
)
from storage.errors import (
    DuplicateObjectError,
    FeatureNotSupportedError,
    InvalidNameError,
    LimitExceededError,
    SqlSyntaxError,
    TopicbaseError,
)
from storage.limits import NAME_COMPONENT_BYTES_MAX, SQL_TEXT_BYTES_MAX

PLACEHOLDER_PREFIX = "__topic_scan_"
# INSERT INTO TOPIC name ( c1 , c2 ... ) and the body's first token, for column lists
# up to 64 names; a longer list cannot be valid and is left to the grammar to refuse.
_INSERT_HEAD_TOKENS_MAX = 4 + 2 * 64 + 1
# What may follow INSERT INTO TOPIC name [(columns)], besides "(".
_QUERY_STARTS = ("VALUES", "SELECT", "WITH", "FROM", "TABLE")
# Stands for the rows or query of INSERT INTO TOPIC when its head and tail go
# through the grammar (see topic.lark).
BODY_MARK = "\ue000"

_PARSER = Lark(
    importlib.resources.files("grammar").joinpath("topic.lark").read_text(encoding="utf-8"),
    parser="lalr",
    start=["statement", "setting_list"],
    propagate_positions=True,
)
_LARK_HEADS = frozenset(
    {"BEGIN", "START", "COMMIT", "END", "ROLLBACK", "ABORT"}
    | {"CREATE TOPIC", "ALTER TOPIC", "DROP TOPIC", "SHOW TOPICS", "DESCRIBE TOPIC"}
)
# Words that end a FROM list at the same parenthesis depth, and words that may follow
# a relation, so `FROM topic WHERE ...` reads a table called "topic".
_FROM_LIST_ENDERS = frozenset(
    {"WHERE", "GROUP", "HAVING", "ORDER", "LIMIT", "OFFSET", "FETCH", "WINDOW", "QUALIFY"}
    | {"UNION", "EXCEPT", "INTERSECT", "SELECT", "RETURNING", "SET", "VALUES"}
)
_RELATION_FOLLOWERS = _FROM_LIST_ENDERS | frozenset(
    {"AS", "FOR", "JOIN", "INNER", "LEFT", "RIGHT", "FULL", "CROSS", "NATURAL", "POSITIONAL"}
    | {"ASOF", "ANTI", "SEMI", "ON", "USING", "TABLESAMPLE", "PIVOT", "UNPIVOT", "WITH"}
    | {"LATERAL"}
)


def parse(text: str) -> list[Statement]:
    """Every statement of a script, in order. Empty statements are skipped."""
    assert isinstance(text, str), type(text)
    _check_length(text)
    source = SourceText(text)
    statements: list[Statement] = []
    for start, end in statement_spans(source):
        try:
            statements.append(_parse_statement(source, start, end))
        except TopicbaseError as error:
            # Fronts may show where a statement failed even when the message does not.
            if "line" not in error.context:
                position = source.position(start)
                error.context.update(line=position.line, column=position.column)
            raise
    return statements


def parse_one(text: str) -> Statement:
    """The single statement of ``text``; 42601 if there is none or more than one."""
    statements = parse(text)
    if len(statements) != 1:
        raise SqlSyntaxError(f"expected exactly one statement, got {len(statements)}")
    return statements[0]


def _check_length(text: str) -> None:
    size_bytes = len(text) if len(text) * 4 <= SQL_TEXT_BYTES_MAX else len(text.encode())
    if size_bytes > SQL_TEXT_BYTES_MAX:
        raise LimitExceededError(
            f"SQL text is {size_bytes} bytes; the limit is {SQL_TEXT_BYTES_MAX} bytes",
            size_bytes=size_bytes,
        )


def _parse_statement(source: SourceText, start: int, end: int) -> Statement:
    head = list(islice(tokenize(source, start, end), 3))
    words = [token.text.upper() if token.kind == "word" else "" for token in head]
    words += [""] * (3 - len(words))
    if words[0] == "EXPLAIN":
        return _parse_explain(source, start, end, head)
    if words == ["INSERT", "INTO", "TOPIC"]:
        return _parse_insert(source, start, end)
    if words[:2] == ["DESCRIBE", "TOPIC"] and len(head) < 3:
        return _parse_sql(source, start, end)  # DuckDB's DESCRIBE of a table "topic"
    if words[0] in _LARK_HEADS or " ".join(words[:2]) in _LARK_HEADS:
        return _parse_with_grammar(source, start, end, source.text[start:end])
    if words[0] in ("GRANT", "REVOKE") or _is_role_statement(words):
        return _parse_with_grammar(source, start, end, source.text[start:end])
    if words[0] in ("CREATE", "ALTER", "DROP") and words[1].startswith("TOPIC"):
        # DuckDB has no object type spelled like this: `CREATE TOPICC x` is a typo of
        # ours, and the grammar points at it.
        return _parse_with_grammar(source, start, end, source.text[start:end])
    return _parse_sql(source, start, end)


def _is_role_statement(words: list[str]) -> bool:
    """SET/RESET [SESSION | LOCAL] ROLE and [SESSION] SESSION AUTHORIZATION (DuckDB has
    neither; ``SET SESSION name = value`` stays a setting)."""
    if words[0] not in ("SET", "RESET"):
        return False
    return words[1] == "ROLE" or (
        words[1] in ("SESSION", "LOCAL") and words[2] in ("ROLE", "AUTHORIZATION", "SESSION")
    )


def _parse_explain(source: SourceText, start: int, end: int, head: list[Token]) -> Explain:
    analyze = len(head) > 1 and head[1].is_word("ANALYZE")
    inner_index = 2 if analyze else 1
    if len(head) <= inner_index:
        raise source.syntax_error(end, "syntax error at end of input")
    inner_start = head[inner_index].start
    inner = _parse_statement(source, inner_start, end)
    if isinstance(inner, Explain | Begin | Commit | Rollback):
        raise source.syntax_error(
            inner_start, f"EXPLAIN cannot explain {type(inner).__name__.upper()}"
        )
    return Explain(inner, analyze, source.position(start), source.text[start:end])


# -- the grammar path ----------------------------------------------------------------------
def _parse_with_grammar(source: SourceText, start: int, end: int, statement_text: str) -> Statement:
    """Parse ``statement_text`` (the statement, or its INSERT skeleton of equal length)."""
    try:
        tree = _PARSER.parse(statement_text, start="statement")
    except UnexpectedInput as error:
        raise _grammar_error(source, start, end, error) from None
    return _TreeBuilder(source, start, end).build(tree)


def _grammar_error(
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


_OBJECT_KINDS = {"table_objects": "table", "topic_objects": "topic", "schema_objects": "schema"}
# PostgreSQL's privileges of tables and views (SELECT, INSERT, UPDATE, DELETE; TRUNCATE,
# REFERENCES and TRIGGER have no meaning here), of topics (read, write, settings and
# consumers) and of schemas (CREATE; USAGE is implied: there is one schema).
PRIVILEGES_BY_KIND = {
    "table": ("SELECT", "INSERT", "UPDATE", "DELETE"),
    "topic": ("SELECT", "INSERT", "ALTER"),
    "schema": ("CREATE",),
}


def _subtrees(tree: Tree | None, data: str) -> list[Tree]:
    if tree is None:
        return []
    return [child for child in tree.children if isinstance(child, Tree) and child.data == data]


class _TreeBuilder:
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


# -- names and ALTER rules ------------------------------------------------------------------
def check_topic_name(name: str, position: SourcePosition | None = None) -> None:
    """A topic name is a path: components separated by "/", none of them empty, "." or
    "..". 42602 otherwise. A path relative to the database (``dir/events``), or, as YQL
    writes it, absolute (``/Root/dir/events``): the planner makes an absolute path
    relative to the database's path, refusing one outside it (``planner.paths``)."""
    _check_common_name("topic", name, position)
    relative = name[1:] if name.startswith("/") else name
    for component in relative.split("/"):
        if component in ("", ".", ".."):
            shown = "an empty component" if not component else f'a "{component}" component'
            raise _name_error(f'topic name "{name}" has {shown}', position)
        if len(component.encode()) > NAME_COMPONENT_BYTES_MAX:
            raise _name_error(
                f'topic name "{name}" has a component longer than {NAME_COMPONENT_BYTES_MAX} bytes',
                position,
            )


def check_consumer_name(name: str, position: SourcePosition | None = None) -> None:
    """A consumer name is one non-empty component without "/" or "|"."""
    _check_common_name("consumer", name, position)
    if "/" in name or "|" in name:
        raise _name_error(f'consumer name "{name}" must not contain "/" or "|"', position)
    if len(name.encode()) > NAME_COMPONENT_BYTES_MAX:
        raise _name_error(
            f'consumer name "{name}" is longer than {NAME_COMPONENT_BYTES_MAX} bytes', position
        )


def _check_common_name(what: str, name: str, position: SourcePosition | None) -> None:
    if not name:
        raise _name_error(f"{what} name is empty", position)
    if any(ord(character) < 32 or ord(character) == 127 for character in name):
        raise _name_error(f"{what} name {name!r} contains a control character", position)


def _name_error(message: str, position: SourcePosition | None) -> InvalidNameError:
    if position is None:
        return InvalidNameError(message)
    return InvalidNameError(message, line=position.line, column=position.column)


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


# -- INSERT INTO TOPIC ---------------------------------------------------------------------------
def _parse_insert(source: SourceText, start: int, end: int) -> InsertTopic:
    head = list(islice(tokenize(source, start, end), _INSERT_HEAD_TOKENS_MAX))
    located = _insert_body_index(head)
    if located is None:
        return _parse_with_grammar(source, start, end, source.text[start:end])  # type: ignore[return-value]
    body_index, width = located
    body_start = head[body_index].start
    if not (head[body_index].is_word(*_QUERY_STARTS) or head[body_index].text == "("):
        raise source.error_near(body_start, end)
    if head[body_index].is_word("VALUES"):
        scanned = _scan_literal_rows(source, head[body_index].end, end, width)
        if scanned is not None:
            value_rows, rows_end = scanned
            insert = _insert_skeleton(source, start, end, body_start, rows_end)
            checked = settings.check_value_rows(insert.columns, value_rows, source, body_start)
            return _replace_body(insert, values=checked)
    body_tokens = list(tokenize(source, body_start, end))
    scans = _find_topic_scans(source, body_tokens)
    tail_index = _insert_tail_index(body_tokens, scans)
    body_end = body_tokens[tail_index - 1].end if tail_index else body_start
    insert = _insert_skeleton(source, start, end, body_start, body_end)
    query = _sql_statement(source, body_start, body_end, scans, query_only=True)
    return _replace_body(insert, query=query)


def _insert_body_index(head: list[Token]) -> tuple[int, int] | None:
    """Index of the first token after ``INSERT INTO TOPIC name [(columns)]``, and the
    number of columns named (1 for the default column list)."""
    index, width = 4, 1
    if len(head) > index and head[index].text == "(" and head[index].kind == "punct":
        expect_name = True
        for probe in range(index + 1, len(head)):
            token = head[probe]
            if expect_name and token.kind not in ("word", "quoted"):
                break
            if not expect_name and token.text == ")":
                index, width = probe + 1, (probe - index) // 2
                break
            if not expect_name and token.text != ",":
                break
            expect_name = not expect_name
    return (index, width) if len(head) > index else None


def _scan_literal_rows(
    source: SourceText, start: int, end: int, width: int
) -> tuple[list[tuple[Value, ...]], int] | None:
    scanned = scan_value_rows(source, start, end, width)
    if scanned is None:
        return None
    tail = next(tokenize(source, scanned[1], end), None)
    if tail is not None and not tail.is_word("WITH", "RETURNING"):
        return None
    return scanned


def _insert_skeleton(
    source: SourceText, start: int, end: int, body_start: int, body_end: int
) -> InsertTopic:
    text = source.text
    body = text[body_start:body_end]
    # Only the length must hold: positions are computed from offsets, not Lark's lines.
    mark = BODY_MARK + " " * (len(body) - 1) if body else ""
    skeleton = text[start:body_start] + mark + text[body_end:end]
    assert len(skeleton) == end - start
    insert = _parse_with_grammar(source, start, end, skeleton)
    assert isinstance(insert, InsertTopic)
    return insert


def _replace_body(
    insert: InsertTopic,
    *,
    values: tuple[tuple[Value, ...], ...] | None = None,
    query: SqlStatement | None = None,
) -> InsertTopic:
    return InsertTopic(
        insert.topic,
        insert.columns,
        values,
        query,
        insert.options,
        insert.returning,
        insert.position,
        insert.text,
    )


def _insert_tail_index(tokens: list[Token], scans: list[_ScanMatch]) -> int:
    """Index where ``[WITH (...)] [RETURNING ...]`` begins after an INSERT's query."""
    inside_scan = {index for scan in scans for index in range(scan.first, scan.last + 1)}
    depth, tail = 0, len(tokens)
    for index, token in enumerate(tokens):
        if index in inside_scan or token.kind not in ("punct", "word"):
            continue
        depth += 1 if token.text == "(" else -1 if token.text == ")" else 0
        if depth == 0 and token.is_word("RETURNING"):
            tail = index
            break
    for index in range(tail - 2, -1, -1):
        token = tokens[index]
        if index in inside_scan or not token.is_word("WITH") or tokens[index + 1].text != "(":
            continue
        if matching_parenthesis(tokens, index + 1) == tail - 1 and _depth(tokens, index) == 0:
            return index
    return tail


def _depth(tokens: list[Token], stop: int) -> int:
    depth = 0
    for token in tokens[:stop]:
        if token.kind == "punct":
            depth += 1 if token.text == "(" else -1 if token.text == ")" else 0
    return depth


# -- ordinary SQL and topic relations --------------------------------------------------------
@dataclass(frozen=True)
class _ScanMatch:
    """Token indexes ``first..last`` of ``TOPIC name [WITH (...)]`` in a statement."""

    first: int
    last: int
    topic: str
    options: tuple[tuple[str, Value], ...]
    start: int
    end: int


def _parse_sql(source: SourceText, start: int, end: int) -> SqlStatement:
    text = source.text[start:end]
    if "topic" not in text.lower():
        return SqlStatement(text, (), source.position(start), text)
    tokens = list(tokenize(source, start, end))
    _refuse_topic_writes(source, tokens)
    scans = _find_topic_scans(source, tokens)
    return _sql_statement(source, start, end, scans, query_only=False)


def _refuse_topic_writes(source: SourceText, tokens: list[Token]) -> None:
    """UPDATE/DELETE/TRUNCATE of a topic, and INSERT INTO TOPIC nested in SQL."""
    for index, token in enumerate(tokens[:-2]):
        if not tokens[index + 1].is_word("TOPIC") or not _is_topic_name(tokens[index + 2]):
            continue
        verb = (
            "DELETE"
            if token.is_word("FROM") and index and tokens[index - 1].is_word("DELETE")
            else token.text.upper()
            if token.is_word("UPDATE", "TRUNCATE")
            else None
        )
        if verb is not None:
            raise FeatureNotSupportedError(
                f"topics are append-only: {verb} is not supported on a TOPIC",
                **vars(source.position(token.start)),
            )
        if token.is_word("INTO"):
            raise FeatureNotSupportedError(
                "INSERT INTO TOPIC must be a statement of its own, not part of another",
                **vars(source.position(token.start)),
            )


def _is_topic_name(token: Token) -> bool:
    if token.kind in ("quoted", "backquoted"):
        return True
    return token.kind == "word" and token.text.upper() not in _RELATION_FOLLOWERS


def _find_topic_scans(source: SourceText, tokens: list[Token]) -> list[_ScanMatch]:
    """Every ``TOPIC name [WITH (...)]`` standing where a relation may stand."""
    scans: list[_ScanMatch] = []
    in_from_list = [False]
    index = 0
    while index < len(tokens):
        token = tokens[index]
        if token.kind == "punct" and token.text in "()":
            if token.text == "(":
                in_from_list.append(False)
            elif len(in_from_list) > 1:
                in_from_list.pop()
        elif token.is_word("FROM"):
            in_from_list[-1] = True
        elif token.kind == "word" and token.text.upper() in _FROM_LIST_ENDERS:
            in_from_list[-1] = False
        elif token.is_word("TOPIC") and _stands_as_relation(tokens, index, in_from_list[-1]):
            scan = _match_scan(source, tokens, index)
            scans.append(scan)
            index = scan.last + 1
            continue
        index += 1
    return scans


def _stands_as_relation(tokens: list[Token], index: int, in_from_list: bool) -> bool:
    if index == 0 or index + 1 >= len(tokens) or not _is_topic_name(tokens[index + 1]):
        return False
    previous = tokens[index - 1]
    return previous.is_word("FROM", "JOIN") or (in_from_list and previous.text == ",")


def _match_scan(source: SourceText, tokens: list[Token], index: int) -> _ScanMatch:
    name_token = tokens[index + 1]
    if index + 2 < len(tokens) and tokens[index + 2].text == ".":
        raise source.syntax_error(
            tokens[index + 2].start,
            "a topic name is one identifier; write a path in backquotes: TOPIC `dir/name`",
        )
    topic = unquote_identifier(name_token.text)
    check_topic_name(topic, source.position(name_token.start))
    last, options = index + 1, {}
    has_options = index + 3 < len(tokens) and tokens[index + 2].is_word("WITH")
    if has_options and tokens[index + 3].text == "(":
        close = matching_parenthesis(tokens, index + 3)
        if close is None:
            raise source.syntax_error(tokens[index + 3].start, "missing ) after TOPIC options")
        options = _read_options(source, tokens[index + 3].start, tokens[close].end)
        last = close
    return _ScanMatch(
        index, last, topic, tuple(options.items()), tokens[index].start, tokens[last].end
    )


def _read_options(source: SourceText, start: int, end: int) -> dict[str, Value]:
    try:
        tree = _PARSER.parse(source.text[start:end], start="setting_list")
    except UnexpectedInput as error:
        raise _grammar_error(source, start, end, error) from None
    builder = _TreeBuilder(source, start, end)
    pairs = builder.setting_pairs(tree)
    try:
        return settings.validate_read_options(pairs)
    except TopicbaseError as error:
        builder.locate(error)
        raise


def _sql_statement(
    source: SourceText, start: int, end: int, scans: list[_ScanMatch], *, query_only: bool
) -> SqlStatement:
    """The SQL of ``start..end`` with scans replaced; checked with sqlglot when it has
    scans or must be a query."""
    text = source.text[start:end]
    if not scans and not query_only:
        return SqlStatement(text, (), source.position(start), text)
    pieces: list[str] = []
    offset_map: list[tuple[int, int]] = []  # (offset in rewritten SQL, offset in script)
    cursor, rewritten_length = start, 0
    topic_scans = []
    for number, scan in enumerate(scans):
        placeholder = f"{PLACEHOLDER_PREFIX}{number}"
        before = source.text[cursor : scan.start]
        for piece, origin in ((before, cursor), (placeholder, scan.start)):
            offset_map.append((rewritten_length, origin))
            pieces.append(piece)
            rewritten_length += len(piece)
        cursor = scan.end
        topic_scans.append(
            TopicScan(scan.topic, scan.options, placeholder, source.position(scan.start))
        )
    offset_map.append((rewritten_length, cursor))
    pieces.append(source.text[cursor:end])
    sql = "".join(pieces)
    expression = _check_with_sqlglot(source, sql, offset_map, end)
    if query_only and not isinstance(expression, exp.Query | exp.Values):
        raise source.syntax_error(start, "INSERT INTO TOPIC expects VALUES or a query here")
    if scans and isinstance(expression, exp.Command):
        raise FeatureNotSupportedError(
            "TOPIC relations are not supported in this kind of statement",
            **vars(source.position(scans[0].start)),
        )
    return SqlStatement(sql, tuple(topic_scans), source.position(start), text)


def _check_with_sqlglot(
    source: SourceText, sql: str, offset_map: list[tuple[int, int]], end: int
) -> exp.Expression:
    try:
        expression = sqlglot.parse_one(sql, read="duckdb")
    except sqlglot.errors.ParseError as error:
        detail = error.errors[0] if error.errors else {}
        offset = _sqlglot_offset(sql, detail)
        raise source.error_near(_script_offset(offset_map, offset), end) from None
    except sqlglot.errors.SqlglotError as error:
        raise source.syntax_error(offset_map[0][1], f"syntax error: {error}") from None
    return expression


def _sqlglot_offset(sql: str, detail: dict[str, object]) -> int:
    """sqlglot reports the 1-based line and the column where the bad token ends."""
    line, column = detail.get("line"), detail.get("col")
    if not isinstance(line, int) or not isinstance(column, int):
        return 0
    line_start = 0
    for _ in range(line - 1):
        line_start = sql.find("\n", line_start) + 1
    highlight = str(detail.get("highlight") or "")
    return max(line_start, min(len(sql), line_start + column - len(highlight)))


def _script_offset(offset_map: list[tuple[int, int]], offset: int) -> int:
    """Where a rewritten-SQL offset comes from; a placeholder maps to its TOPIC word."""
    origin = offset_map[0][1]
    for index, (rewritten_start, script_start) in enumerate(offset_map):
        if rewritten_start > offset:
            break
        is_placeholder = index % 2 == 1 and index != len(offset_map) - 1
        origin = script_start if is_placeholder else script_start + offset - rewritten_start
    return origin
