"""Statement -> Plan. Pure: reads only the ``Catalog`` it is given.

One planning function per statement kind (SQLite's ``insert.c``/``select.c``
split), dispatched by type. sqlglot analyses the non-topic SQL: which tables a
statement reads and writes, whether it returns rows, and which ``sys.`` views
it needs. A topic named like a table (``FROM events``, no ``TOPIC``) is turned
into the same ``ReadRecords`` + placeholder as ``FROM TOPIC events`` by
``planner.relations``, which states the name resolution rule (a DuckDB table or
view of the same name wins); that needs a ``SessionCatalog``, so a plain
``Catalog`` plans such a name as a table, as before.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import sqlglot
from sqlglot import expressions as exp

from grammar import ast
from grammar.text_cache import text_cache
from planner.catalog import Catalog, SessionCatalog, TopicInfo
from planner.column_names import pg_column_names
from planner.ddl import plan_alter_topic, plan_create_topic, plan_drop_topic
from planner.duckdb_sql import parse_duckdb, upsert_shape
from planner.front_work import find_all
from planner.key_lookup import lookup_shape_of
from planner.literal_select import is_literal_select
from planner.nested_writes import refuse_nested_writes
from planner.offsets import plan_set_offsets
from planner.operations import (
    AppendRecords,
    ChangePrivileges,
    CommitConsumerOffsets,
    Introspect,
    Operation,
    Plan,
    ReadRecords,
    RunQuery,
    SwitchRole,
    TransactionControl,
)
from planner.paths import database_path_of, relative_statement
from planner.relations import names_a_topic, plain_insert, resolve_plain_relations
from planner.upsert_check import upsert_check
from planner.write_statements import plan_abort_writes, plan_commit_writes
from storage.errors import StatementTooComplexError, UndefinedObjectError, UndefinedTopicError

SYSTEM_VIEWS = ("topics", "partitions", "consumers", "owners", "grants", "roles")
# The sqlglot analyses below are pure functions of the SQL text: a worker that runs
# the same statements in a loop parses each once.
SQL_ANALYSIS_CACHE_ENTRIES = 1024
WRITING_STATEMENTS = (
    exp.Insert,
    exp.Update,
    exp.Delete,
    exp.Merge,
    exp.Create,
    exp.Drop,
    exp.Alter,
    exp.TruncateTable,
)


def plan(statement: ast.Statement, catalog: Catalog) -> Plan:
    """Turn one parsed statement into a plan of operations.

    A statement nested too deeply for sqlglot is 54001, never a ``RecursionError``
    (``grammar.split.check_complexity`` refuses most before; this is the safety net).
    """
    try:
        return _plan(statement, catalog)
    except RecursionError:
        raise StatementTooComplexError("statement too complex: nested too deeply") from None


def _plan(statement: ast.Statement, catalog: Catalog) -> Plan:
    if isinstance(statement, ast.Explain):
        inner = _plan(statement.statement, catalog)
        return replace(inner, explain_only=True, line=statement.position.line)
    # Topic names as YQL writes them, absolute paths in the database, become relative.
    statement = relative_statement(statement, database_path_of(catalog))
    planner = _PLANNERS.get(type(statement))
    assert planner is not None, f"no planner for {type(statement).__name__}"
    planned = planner(statement, catalog)
    line = statement.position.line
    return planned if planned.line == line else replace(planned, line=line)


def require_topic(catalog: Catalog, name: str) -> TopicInfo:
    info = catalog.topic(name)
    if info is None:
        raise UndefinedTopicError(f'topic "{name}" does not exist', topic=name)
    return info


def _plan_sql(statement: ast.SqlStatement, catalog: Catalog) -> Plan:
    """``FROM TOPIC`` scans, then plain names of topics (``planner.relations``), then SQL."""
    reads = tuple(_plan_scan(scan, catalog) for scan in statement.topic_scans)
    sql = statement.sql
    analysed = None
    if isinstance(catalog, SessionCatalog):
        analysed = analyse_sql(sql)
        if names_a_topic(analysed.tables_read + analysed.tables_written, catalog):
            plain = resolve_plain_relations(sql, catalog, len(statement.topic_scans))
            sql, reads, analysed = plain.sql, (*reads, *plain.reads), None
            if plain.insert_topic is not None:
                return _plan_plain_insert(sql, reads, plain.insert_topic)
    # Over no topic read, the query is the text's analysis itself (``_query_over`` with
    # no reads adds nothing; RunQuery is immutable): reuse it rather than analyse again,
    # which for a text too long for the text caches meant a second sqlglot parse.
    query = analysed if analysed is not None and not reads else _query_over_reads(sql, reads)
    return Plan((*reads, query), query.tag)


def _query_over_reads(sql: str, reads: tuple[ReadRecords, ...]) -> RunQuery:
    return _query_over(sql, bool(reads), reads[0].placeholder if len(reads) == 1 else None)


@text_cache(SQL_ANALYSIS_CACHE_ENTRIES)
def _query_over(sql: str, reads: bool, placeholder: str | None) -> RunQuery:
    """The query of ``sql`` over topic reads (``reads``; ``placeholder``: the one read's
    relation, if one): a function of these alone, so kept per text (the two ``replace``
    calls cost more than the cached analyses they combine; RunQuery is immutable)."""
    names = _column_names(sql) if reads else None  # of the text as written, not rewritten
    sql = _text_casts_of_data(sql) if reads else sql
    query = analyse_sql(sql)
    if names is not None:
        query = replace(query, column_names=names)
    if placeholder is not None:
        query = replace(query, projection=_plain_projection(sql, placeholder))
    return query


def _plan_plain_insert(sql: str, reads: tuple[ReadRecords, ...], info: TopicInfo) -> Plan:
    """``INSERT INTO name ...`` where ``name`` is a topic: as ``INSERT INTO TOPIC name``."""
    parts = plain_insert(sql, info.name)
    query = _query_over_reads(parts.query, reads)
    append = AppendRecords(
        info.name,
        info.topic_id,
        info.active_partitions or info.partitions,
        parts.columns,
        None,
        {},
        parts.returning,
    )
    return Plan((*reads, query, append), "INSERT")


def _plan_scan(scan: ast.TopicScan, catalog: Catalog) -> ReadRecords:
    info = require_topic(catalog, scan.topic)
    return _checked_read(info, scan.placeholder, dict(scan.options))


def bind_read(operation: ReadRecords, options: dict[str, Any], catalog: Catalog) -> ReadRecords:
    """``operation`` with its options' parameters bound (``options``, validated by the
    caller): the consumer and partition given as parameters are checked now, as a literal
    one is when the statement is planned."""
    info = require_topic(catalog, operation.topic)
    return _checked_read(info, operation.placeholder, options)


def _checked_read(info: TopicInfo, placeholder: str, options: dict[str, Any]) -> ReadRecords:
    """The read of ``info`` with these options; a consumer or partition that does not
    exist is refused (42704). Parameters are left to ``bind_read``: an unbound consumer
    reads as None and an unbound partition as every partition until then."""
    consumer = options.get("consumer")
    if isinstance(consumer, ast.Parameter):
        consumer = None
    elif consumer is not None and consumer not in info.consumers:
        raise UndefinedObjectError(
            f'consumer "{consumer}" does not exist on topic "{info.name}"',
            topic=info.name,
            consumer=consumer,
        )
    partitions = info.partitions
    wanted = options.get("partition")
    if wanted is not None and not isinstance(wanted, ast.Parameter):
        if wanted not in info.partitions:
            raise UndefinedObjectError(f'topic "{info.name}" has no partition {wanted}')
        partitions = (wanted,)
    return ReadRecords(info.name, info.topic_id, partitions, placeholder, consumer, options)


@text_cache(SQL_ANALYSIS_CACHE_ENTRIES)
def analyse_sql(sql: str) -> RunQuery:
    """Tables read and written by plain SQL, and whether it returns rows."""
    try:
        tree = parse_duckdb(sql)
    except sqlglot.errors.ParseError:
        # sqlglot does not know every DuckDB statement (EXPORT DATABASE, ...): run it
        # as it is and let DuckDB judge it, with its own error and caret.
        words = sql.split(None, 1)
        return RunQuery(sql, (), (), False, words[0].upper() if words else "EMPTY")
    if tree is None:
        return RunQuery(sql, (), (), False, "EMPTY", uses_parameters=False)
    refuse_nested_writes(tree)  # its tag, writes and privileges would be the root's only
    if isinstance(tree, exp.TruncateTable):
        tree, sql = _truncate_without_only(tree)
    if any(t.this == exp.DataType.Type.JSONB for t in find_all(tree, exp.DataType)):
        sql = tree.sql(dialect="duckdb")  # PostgreSQL's jsonb is DuckDB's JSON
    written: set[str] = set()
    target = None
    if isinstance(tree, WRITING_STATEMENTS):
        target = tree.find(exp.Table)
    if target is not None:
        written.add(_table_name(target))
    renamed_to = {id(t) for r in find_all(tree, exp.AlterRename) for t in r.find_all(exp.Table)}
    read = {
        _table_name(t) for t in find_all(tree, exp.Table) if t.name and id(t) not in renamed_to
    } - written
    returns_rows = isinstance(tree, exp.Query) or bool(tree.args.get("returning"))
    views = tuple(
        sorted({t.name for t in find_all(tree, exp.Table) if t.db == "sys" and not t.catalog})
    )
    for view in views:
        if view not in SYSTEM_VIEWS:
            raise UndefinedTopicError(
                f'system view "sys.{view}" does not exist (known: '
                + ", ".join(f"sys.{v}" for v in SYSTEM_VIEWS)
                + ")"
            )
    uses_parameters = any(True for _ in find_all(tree, exp.Placeholder, exp.Parameter))
    names = pg_column_names(tree) if returns_rows else None
    if views:
        sql = _rename_system_views(tree).sql(dialect="duckdb")
    return RunQuery(
        sql,
        tuple(sorted(read)),
        tuple(sorted(written)),
        returns_rows,
        _tag_of(tree, sql),
        views,
        uses_parameters,
        column_names=names,
        upsert=upsert_shape(tree),
        upsert_check=upsert_check(tree),
        lookup=None if views else lookup_shape_of(tree),
        literal_only=is_literal_select(tree),
    )


@text_cache(SQL_ANALYSIS_CACHE_ENTRIES)
def _column_names(sql: str) -> tuple[str, ...] | None:
    try:
        tree = parse_duckdb(sql)
    except sqlglot.errors.ParseError:
        return None
    return None if tree is None else pg_column_names(tree)


def _rename_system_views(tree: exp.Expression) -> exp.Expression:
    """``sys.topics`` -> ``__sys_topics``, the relation the engine registers per statement."""

    def rename(node: exp.Expression) -> exp.Expression:
        if isinstance(node, exp.Table) and node.db == "sys" and not node.catalog:
            renamed = exp.to_table(f"__sys_{node.name}")
            alias = node.args.get("alias")
            if alias is not None:
                renamed.set("alias", alias)
            return renamed
        return node

    return tree.transform(rename)


_CLAUSES_THAT_NEED_DUCKDB = (
    "where",
    "group",
    "having",
    "order",
    "limit",
    "offset",
    "distinct",
    "joins",
    "laterals",
    "windows",
    "qualify",
    "with",
    "sample",
    "into",
    "kind",
)


@text_cache(SQL_ANALYSIS_CACHE_ENTRIES)
def _plain_projection(sql: str, placeholder: str) -> tuple[str, tuple[tuple[str, str], ...]] | None:
    """``SELECT a, b AS c FROM <placeholder>`` -> its columns; None for anything more."""
    try:
        tree = parse_duckdb(sql)
    except sqlglot.errors.ParseError:
        return None
    if not isinstance(tree, exp.Select) or any(tree.args.get(c) for c in _CLAUSES_THAT_NEED_DUCKDB):
        return None
    source = tree.args.get("from_") or tree.args.get("from")
    relation = source.this if source is not None else None
    if not isinstance(relation, exp.Table) or relation.name != placeholder or relation.db:
        return None
    columns = []
    for item in tree.expressions:
        column = item.this if isinstance(item, exp.Alias) else item
        if not isinstance(column, exp.Column) or column.name not in TOPIC_COLUMNS:
            return None
        columns.append((column.name, item.alias_or_name))
    names = [name for _, name in columns]
    if len(set(names)) != len(names):
        return None
    return placeholder, tuple(columns)


TOPIC_COLUMNS = frozenset(
    {
        "partition",
        "offset",
        "seq_no",
        "producer_id",
        "message_group_id",
        "created_at",
        "written_at",
        "codec",
        "data",
        "metadata",
    }
)


@text_cache(SQL_ANALYSIS_CACHE_ENTRIES)
def _text_casts_of_data(sql: str) -> str:
    """``CAST(data AS VARCHAR)`` -> ``decode(data)`` in statements that read topics.

    DuckDB's BLOB-to-VARCHAR cast escapes bytes such as ``"`` as ``\\x22``, so
    JSON in a message would not survive it; ``decode`` reads the bytes as
    UTF-8 (and fails on invalid UTF-8, as a text cast should).
    """
    tree = parse_duckdb(sql)
    assert tree is not None, "only statements that read topics are rewritten"
    changed = False

    def rewrite(node: exp.Expression) -> exp.Expression:
        nonlocal changed
        is_text = isinstance(node, exp.Cast) and node.to.this in _TEXT_TYPES
        if is_text and isinstance(node.this, exp.Column) and node.this.name == "data":
            changed = True
            return exp.Anonymous(this="decode", expressions=[node.this.copy()])
        return node

    rewritten = tree.transform(rewrite)
    return rewritten.sql(dialect="duckdb") if changed else sql


_TEXT_TYPES = (exp.DataType.Type.VARCHAR, exp.DataType.Type.TEXT)


def _table_name(table: exp.Table) -> str:
    return ".".join(part for part in (table.db, table.name) if part)


def _truncate_without_only(tree: exp.TruncateTable) -> tuple[exp.TruncateTable, str]:
    """``TRUNCATE [TABLE] ONLY t`` (the PostgreSQL JDBC driver's) as DuckDB takes it: DuckDB
    has no inheritance, so ONLY changes nothing, and its parser refuses the word."""
    tree = tree.copy()
    for table in tree.expressions:
        table.set("only", None)
    return tree, tree.sql(dialect="duckdb")


def _tag_of(tree: exp.Expression, sql: str) -> str:
    """The PostgreSQL-style command tag (without row counts)."""
    if isinstance(tree, exp.Query):
        return "SELECT"
    simple = {exp.Insert: "INSERT", exp.Update: "UPDATE", exp.Delete: "DELETE", exp.Merge: "MERGE"}
    for kind, tag in simple.items():
        if isinstance(tree, kind):
            return tag
    if isinstance(tree, exp.Create | exp.Drop | exp.Alter):
        verb = tree.key.upper()
        return f"{verb} {str(tree.args.get('kind') or 'TABLE').upper()}"
    if isinstance(tree, exp.TruncateTable):
        return "TRUNCATE TABLE"
    words = sql.split(None, 1)
    return words[0].upper() if words else "EMPTY"


def _plan_insert(statement: ast.InsertTopic, catalog: Catalog) -> Plan:
    info = require_topic(catalog, statement.topic)
    options = dict(statement.options)
    operations: list[Operation] = []
    if statement.query is not None:
        query_plan = _plan_sql(statement.query, catalog)
        operations.extend(query_plan.operations)
    append = AppendRecords(
        info.name,
        info.topic_id,
        info.active_partitions or info.partitions,
        statement.columns,
        statement.values,
        options,
        statement.returning,
    )
    return Plan((*operations, append), "INSERT")


def _plan_commit_offsets(statement: ast.CommitOffsets, catalog: Catalog) -> Plan:
    info = require_topic(catalog, statement.topic)
    if statement.consumer not in info.consumers:
        raise UndefinedObjectError(
            f'consumer "{statement.consumer}" does not exist on topic "{info.name}"'
        )
    for offset_range in statement.ranges:
        if offset_range.partition not in info.partitions:
            raise UndefinedObjectError(
                f'topic "{info.name}" has no partition {offset_range.partition}'
            )
    ranges = tuple((r.partition, r.start, r.end) for r in statement.ranges)
    operation = CommitConsumerOffsets(info.name, info.topic_id, statement.consumer, ranges)
    return Plan((operation,), "COMMIT OFFSETS")


def _plan_transaction(action: str, tag: str) -> Callable[[Any, Catalog], Plan]:
    def planner(statement: Any, catalog: Catalog) -> Plan:
        return Plan((TransactionControl(action),), tag)

    return planner


def _plan_show(statement: ast.ShowTopics, catalog: Catalog) -> Plan:
    return Plan((Introspect("topics"),), "SHOW")


def _plan_describe(statement: ast.DescribeTopic, catalog: Catalog) -> Plan:
    info = require_topic(catalog, statement.name)
    return Plan((Introspect("topic", info.name),), "DESCRIBE")


def _plan_grant(statement: ast.Grant, catalog: Catalog) -> Plan:
    """GRANT/REVOKE; a topic named must exist (42P01), tables and views are looked up
    when it runs (they live in DuckDB, in the session's transaction)."""
    if statement.object_kind == "topic":
        for name in statement.objects:
            require_topic(catalog, name)
    operation = ChangePrivileges(
        statement.revoke,
        statement.privileges,
        statement.object_kind,
        statement.objects,
        statement.grantees,
        statement.grant_option,
    )
    return Plan((operation,), "REVOKE" if statement.revoke else "GRANT")


def _plan_set_role(statement: ast.SetRole, catalog: Catalog) -> Plan:
    tag = "RESET" if statement.text.lstrip().upper().startswith("RESET") else "SET"
    return Plan((SwitchRole(statement.role, statement.session_authorization),), tag)


_PLANNERS: dict[type, Callable[[Any, Catalog], Plan]] = {
    ast.SqlStatement: _plan_sql,
    ast.InsertTopic: _plan_insert,
    ast.CommitOffsets: _plan_commit_offsets,
    ast.CommitWrites: plan_commit_writes,
    ast.AbortWrites: plan_abort_writes,
    ast.SetOffsets: plan_set_offsets,
    ast.CreateTopic: plan_create_topic,
    ast.AlterTopic: plan_alter_topic,
    ast.DropTopic: plan_drop_topic,
    ast.Begin: _plan_transaction("begin", "BEGIN"),
    ast.Commit: _plan_transaction("commit", "COMMIT"),
    ast.Rollback: _plan_transaction("rollback", "ROLLBACK"),
    ast.ShowTopics: _plan_show,
    ast.DescribeTopic: _plan_describe,
    ast.Grant: _plan_grant,
    ast.SetRole: _plan_set_role,
}
