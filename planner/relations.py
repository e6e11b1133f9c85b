"""Topics named as plain relations: ``SELECT ... FROM events`` reads the topic ``events``.

Postgres clients that reflect relations (SQLAlchemy ``autoload_with``, pandas
``read_sql_table``, psql users) see topics in pg_catalog as foreign tables of schema
``main`` and then write ``FROM name``, ``FROM main.name`` or ``FROM "name"`` without the
``TOPIC`` keyword. Such a reference reads the topic as ``FROM TOPIC name`` without a
consumer does: a peek of every partition from its first retained offset, nothing
committed. It has no ``WITH`` options, so it reads up to the largest read allowed
(``limits.READ_MESSAGES_MAX`` messages, ``limits.READ_BYTES_MAX`` bytes) rather than a
peek's default batch. A topic holding more is refused with 54000 (a relation is read
whole or not at all, so ``count(*)`` never undercounts); it is read in ranges with
``FROM TOPIC ... WITH (partition, from_offset, max_messages)``.

Name resolution, for a relation that is unqualified or qualified by schema ``main``:

1. a CTE of the statement with that name is the CTE (any CTE of that name anywhere in
   the statement shadows the topic everywhere in it);
2. a DuckDB table or view of that name seen by the session is the table: tables and
   topics live in different namespaces, and a topic never changes the meaning of a
   statement over tables;
3. a topic: a quoted name matches the topic spelled exactly so; an unquoted name the
   topic spelled as written, else its lower-case form (PostgreSQL folds unquoted names);
4. neither: the statement goes to DuckDB unchanged, which reports 42P01 as before.

Each topic named so is read once per statement: one ``ReadRecords`` and one placeholder
relation however often it is named (a self-join sees one snapshot). Every reference
becomes ``<placeholder> AS <its alias or its name>``, so columns qualified by the name
keep resolving; from there the statement takes the ``FROM TOPIC`` path unchanged.

Write targets: ``INSERT INTO name`` of a topic appends to it as ``INSERT INTO TOPIC
name`` does (``plan_plain_insert``); ``UPDATE``/``DELETE``/``TRUNCATE`` of a topic name and
a ``CREATE VIEW`` reading one are refused with 0A000 (a view would keep a placeholder
that exists only while a statement runs).

Pure: no I/O; DuckDB's relations are known through ``SessionCatalog.has_duckdb_relation``,
which is asked only about names that also name a topic.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import sqlglot
from sqlglot import expressions as exp

from grammar.parse import PLACEHOLDER_PREFIX
from grammar.text_cache import text_cache
from planner.catalog import SessionCatalog, TopicInfo
from planner.duckdb_sql import parse_duckdb
from planner.front_work import find_all
from planner.operations import ReadRecords
from storage import limits
from storage.errors import FeatureNotSupportedError

RELATION_CACHE_ENTRIES = 1024
# A plain relation has no WITH options: it reads as much as one read may, and a topic
# holding more is refused (54000) rather than read in part (``complete``).
PLAIN_READ_OPTIONS = {
    "max_messages": limits.READ_MESSAGES_MAX,
    "max_bytes": limits.READ_BYTES_MAX,
    "complete": True,
}


@dataclass(frozen=True)
class PlainRelations:
    """The result of resolving plain relation names of one statement.

    ``sql`` is the statement with topic references replaced (unchanged when ``reads``
    is empty); ``reads`` holds one peek per topic named; ``insert_topic`` is the topic
    an ``INSERT INTO name`` targets, or None.
    """

    sql: str
    reads: tuple[ReadRecords, ...]
    insert_topic: TopicInfo | None = None


@dataclass(frozen=True)
class _Candidate:
    name: str
    quoted: bool


@dataclass(frozen=True)
class _Candidates:
    sources: tuple[_Candidate, ...]
    target: _Candidate | None
    target_verb: str | None  # INSERT, UPDATE, DELETE, TRUNCATE, or None
    is_view: bool


def names_a_topic(relation_names: tuple[str, ...], catalog: SessionCatalog) -> bool:
    """Whether any of ``relation_names`` (``name`` or ``schema.name``, as
    ``planner.analyse_sql`` lists them) may stand for a topic: a cheap test, from the
    catalog's memory only, before the statement is read again for the real rules."""
    for qualified in relation_names:
        schema, _, name = qualified.rpartition(".")
        if schema.lower() not in ("", "main"):
            continue
        if catalog.topic(name) is not None or catalog.topic(name.lower()) is not None:
            return True
    return False


def resolve_plain_relations(sql: str, catalog: SessionCatalog, first_number: int) -> PlainRelations:
    """Turn plain references to topics in ``sql`` into placeholder relations.

    ``first_number`` is the number of the first free ``__topic_scan_<n>`` placeholder
    (the grammar numbered the ``FROM TOPIC`` scans before it).
    """
    candidates = _candidates(sql)
    if candidates is None:
        return PlainRelations(sql, ())
    # By the name as written (``events``, ``EVENTS``): the topic it stands for.
    named = {c.name: info for c in candidates.sources if (info := _topic_of(c, catalog))}
    topics = {info.name: info for info in named.values()}
    insert_topic = None
    if candidates.target is not None:
        target_topic = _topic_of(candidates.target, catalog)
        if target_topic is not None:
            insert_topic = _check_target(candidates.target_verb, target_topic)
    if topics and candidates.is_view:
        name = next(iter(topics))
        raise FeatureNotSupportedError(
            f'a view cannot read topic "{name}": a topic is read when a statement runs; '
            "select from it in the query instead"
        )
    if not topics:
        return PlainRelations(sql, (), insert_topic)
    placeholders = {
        name: f"{PLACEHOLDER_PREFIX}{first_number + index}" for index, name in enumerate(topics)
    }
    reads = tuple(
        ReadRecords(
            info.name, info.topic_id, info.partitions, placeholders[name], None,
            dict(PLAIN_READ_OPTIONS),
        )
        for name, info in topics.items()
    )  # fmt: skip
    by_name = tuple((written, placeholders[info.name]) for written, info in named.items())
    rewritten = _rewrite(sql, by_name)
    assert rewritten != sql, "a resolved topic reference must change the statement"
    return PlainRelations(rewritten, reads, insert_topic)


def _topic_of(candidate: _Candidate, catalog: SessionCatalog) -> TopicInfo | None:
    """The topic a name stands for, unless a DuckDB relation of that name wins."""
    info = catalog.topic(candidate.name)
    if info is None and not candidate.quoted and candidate.name != candidate.name.lower():
        info = catalog.topic(candidate.name.lower())
    if info is None or catalog.has_duckdb_relation(candidate.name):
        return None
    return info


def _check_target(verb: str | None, info: TopicInfo) -> TopicInfo | None:
    if verb == "INSERT":
        return info
    if verb in ("UPDATE", "DELETE", "TRUNCATE"):
        raise FeatureNotSupportedError(
            f'"{info.name}" is a topic, and topics are append-only: {verb} is not supported'
        )
    return None


@text_cache(RELATION_CACHE_ENTRIES)
def _candidates(sql: str) -> _Candidates | None:
    """Names in ``sql`` that could stand for topics; None if there are none."""
    tree = _parse(sql)
    if tree is None:
        return None
    target_table, verb = _write_target(tree)
    sources: dict[str, _Candidate] = {}
    for _, candidate in _source_relations(tree):
        sources.setdefault(candidate.name, candidate)
    target = _plain_name(target_table) if target_table is not None else None
    if not sources and target is None:
        return None
    is_view = isinstance(tree, exp.Create) and str(tree.args.get("kind") or "").upper() == "VIEW"
    return _Candidates(tuple(sources.values()), target, verb if target else None, is_view)


def _parse(sql: str) -> exp.Expression | None:
    try:
        return parse_duckdb(sql)
    except sqlglot.errors.ParseError:
        return None  # DuckDB judges what sqlglot cannot read, as before


_TARGET_VERBS: tuple[tuple[type[exp.Expression], str], ...] = (
    (exp.Insert, "INSERT"),
    (exp.Update, "UPDATE"),
    (exp.Delete, "DELETE"),
    (exp.TruncateTable, "TRUNCATE"),
)
_OTHER_WRITES = (exp.Merge, exp.Create, exp.Drop, exp.Alter)


def _write_target(tree: exp.Expression) -> tuple[exp.Table | None, str | None]:
    """The table a statement writes (as ``planner.analyse_sql`` finds it) and its verb."""
    for kind, verb in _TARGET_VERBS:
        if isinstance(tree, kind):
            return tree.find(exp.Table), verb
    if isinstance(tree, _OTHER_WRITES):
        return tree.find(exp.Table), None
    return None, None


def _source_relations(tree: exp.Expression) -> Iterator[tuple[exp.Table, _Candidate]]:
    """Relations the statement reads that may be topics: plain names (``_plain_name``)
    that are not its write target and not, unqualified, the name of one of its CTEs."""
    target_table, _ = _write_target(tree)
    cte_names = {cte.alias_or_name.lower() for cte in find_all(tree, exp.CTE)}
    for table in list(find_all(tree, exp.Table)):
        candidate = _plain_name(table)
        if table is target_table or candidate is None:
            continue
        if candidate.name.lower() in cte_names and not table.args.get("db"):
            continue
        yield table, candidate


def _plain_name(table: exp.Table) -> _Candidate | None:
    """The name of an unqualified or ``main.``-qualified relation, else None."""
    identifier = table.this
    if not isinstance(identifier, exp.Identifier) or table.args.get("catalog"):
        return None
    db = table.args.get("db")
    if db is not None and (not isinstance(db, exp.Identifier) or db.name.lower() != "main"):
        return None
    name = identifier.name
    if not name or name.startswith(PLACEHOLDER_PREFIX):
        return None
    return _Candidate(name, bool(identifier.args.get("quoted")))


@text_cache(RELATION_CACHE_ENTRIES)
def _rewrite(sql: str, by_name: tuple[tuple[str, str], ...]) -> str:
    """``FROM events e`` -> ``FROM __topic_scan_<n> AS e``; ``main.events.c`` -> ``events.c``.

    ``by_name`` pairs each name as written with its topic's placeholder.
    """
    placeholders = dict(by_name)
    parsed = _parse(sql)
    assert parsed is not None, "only statements that parsed have topic references"
    tree = parsed.copy()  # changed below; the parsed tree is shared (``planner.front_work``)
    topic_tables = [
        (table, placeholders[candidate.name])
        for table, candidate in _source_relations(tree)
        if candidate.name in placeholders
    ]
    qualified = {table.name.lower() for table, _ in topic_tables if table.args.get("db")}
    for table, placeholder in topic_tables:
        replacement = exp.Table(this=exp.to_identifier(placeholder))
        if not isinstance(table.parent, _OPERANDS_WITHOUT_ALIAS):
            alias = table.args.get("alias") or exp.TableAlias(this=table.this.copy())
            replacement.set("alias", alias.copy())
        table.replace(replacement)
    for column in tree.find_all(exp.Column):
        if column.args.get("db") is not None and column.table.lower() in qualified:
            column.set("db", None)
    rewritten = tree.sql(dialect="duckdb")
    try:
        parse_duckdb(rewritten)
    except sqlglot.errors.ParseError:
        names = ", ".join(f'"{name}"' for name in sorted(placeholders))
        raise FeatureNotSupportedError(
            f"topic {names} cannot be read by name in this statement; "
            "read it with FROM TOPIC name instead"
        ) from None
    return rewritten


# Statements whose operand is a bare relation that takes no alias: DESCRIBE events.
_OPERANDS_WITHOUT_ALIAS = (exp.Describe, exp.Summarize, exp.Copy)


@dataclass(frozen=True)
class PlainInsert:
    """``INSERT INTO name [(columns)] VALUES ... | query [RETURNING ...]`` of a topic.

    ``query`` is the rows' SQL on its own (``VALUES ...`` or a query); ``columns`` are
    the topic write columns it fills (``data`` alone for ``VALUES`` without a column
    list, the query's own names for a query without one), as ``INSERT INTO TOPIC``.
    """

    columns: tuple[str, ...]
    query: str
    returning: tuple[str, ...]


_INSERT_CLAUSES_REFUSED = {
    "conflict": "ON CONFLICT",
    "overwrite": "OVERWRITE",
    "alternative": "OR REPLACE/IGNORE",
    "by_name": "BY NAME",
    "where": "WHERE",
}


def plain_insert(sql: str, topic: str) -> PlainInsert:
    """The parts of a plain ``INSERT INTO`` whose target is the topic ``topic``."""
    tree = _parse(sql)
    assert isinstance(tree, exp.Insert), "only INSERT statements have an insert topic"
    for arg, clause in _INSERT_CLAUSES_REFUSED.items():
        if tree.args.get(arg):
            raise FeatureNotSupportedError(
                f'{clause} is not supported when inserting into topic "{topic}"'
            )
    body = tree.expression
    if not isinstance(body, exp.Query | exp.Values):
        raise FeatureNotSupportedError(
            f'INSERT INTO topic "{topic}" needs VALUES or a query with a data column'
        )
    body = body.copy()
    with_clause = tree.args.get("with_")
    if with_clause is not None:
        if not isinstance(body, exp.Select):
            raise FeatureNotSupportedError(
                f'WITH before INSERT INTO topic "{topic}" needs a SELECT'
            )
        body.set("with_", with_clause.copy())
    target = tree.this
    columns = tuple(i.name for i in target.expressions) if isinstance(target, exp.Schema) else ()
    if not columns and isinstance(body, exp.Values):
        columns = ("data",)
    return PlainInsert(columns, body.sql(dialect="duckdb"), _returning(tree, topic))


def _returning(tree: exp.Insert, topic: str) -> tuple[str, ...]:
    returning = tree.args.get("returning")
    if returning is None:
        return ()
    names = []
    for item in returning.expressions:
        if isinstance(item, exp.Star):
            names.append("*")
        elif isinstance(item, exp.Column) and not item.table:
            names.append(item.name)
        else:
            raise FeatureNotSupportedError(
                f'RETURNING of an insert into topic "{topic}" lists plain column names'
            )
    return tuple(names)
