"""Rewrite PostgreSQL catalog queries into DuckDB SQL over the emulated catalog.

``rewrite(sql, context)`` parses a client's query with sqlglot (dialect ``postgres``) and
returns DuckDB SQL, or None when the query touches nothing this module emulates (the
caller then runs the original text unchanged). It:

- replaces ``pg_catalog.<relation>`` (also unqualified ``pg_<relation>``) and
  ``information_schema.tables``/``columns`` with ``__pg_<relation>`` common table
  expressions from ``pg_relations``, prepended in a ``WITH`` clause (before the query's
  own CTEs) together with the relations they use;
- replaces PostgreSQL functions DuckDB lacks or answers differently (``version``,
  ``current_database``, ``format_type``, ``pg_get_expr``, ``pg_get_userbyid``,
  ``pg_table_is_visible``, ``to_regtype``, ``obj_description``, ``pg_encoding_to_char``,
  ``pg_get_constraintdef``, ``current_setting`` …, see ``pg_functions.FUNCTIONS``);
- turns psql's ``OPERATOR(pg_catalog.~)`` into ``~`` and drops ``COLLATE
  pg_catalog.default``; casts to ``regclass``/``regtype``/``regnamespace`` become
  look-ups (a literal gives an OID, anything else a name); ``oid``, ``name``, ``"char"``
  and ``pg_catalog.``-qualified types become DuckDB types.

Invariants: the result depends only on ``sql`` and ``context`` (cached); relation names
a query does not use are never added; a query that sqlglot cannot parse is left alone.
Thread-safe (pure functions and an lru cache).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import sqlglot
from sqlglot import expressions as exp

from engine.api import text_cache
from sql.pgwire.emulation import pg_relations as rel
from sql.pgwire.emulation.pg_functions import FUNCTIONS, quote, to_regtype
from sql.pgwire.emulation.pg_types import format_type_sql
from storage.errors import StatementTooComplexError

REWRITE_CACHE_ENTRIES = 512
_MARKERS = re.compile(
    r"pg_|information_schema|version\s*\(|current_database|current_catalog|format_type|"
    r"to_reg|obj_description|col_description|current_setting|regclass|regtype|::\s*oid|"
    r"current_user|session_user|has_table_privilege",
    re.IGNORECASE,
)
_QUERY_START = re.compile(r"\s*(\(\s*)*(SELECT|WITH|VALUES|TABLE)\b", re.IGNORECASE)
_OPERATOR = re.compile(r"OPERATOR\s*\(\s*pg_catalog\s*\.\s*([~!<>=*]+)\s*\)", re.IGNORECASE)
_COLLATE_DEFAULT = re.compile(r"COLLATE\s+(pg_catalog\s*\.\s*)?\"?default\"?", re.IGNORECASE)
_CATALOG_CLASSES = {"pg_class": 1259, "pg_type": 1247, "pg_attribute": 1249, "pg_proc": 1255,
                    "pg_namespace": 2615, "pg_constraint": 2606, "pg_database": 1262,
                    "pg_description": 2609, "pg_index": 2610}  # fmt: skip


@dataclass(frozen=True)
class RewriteContext:
    """What a rewrite may depend on besides the SQL text (part of the cache key)."""

    user: str
    database: str
    server_version: str
    settings: tuple[tuple[str, str], ...]  # (lower-case name, value)
    search_path: tuple[str, ...]


def might_need_rewrite(sql: str) -> bool:
    """A cheap test: False means the query certainly uses nothing emulated here.

    Only queries are rewritten (a bulk INSERT is never scanned for catalog words)."""
    return _QUERY_START.match(sql) is not None and _MARKERS.search(sql) is not None


def rewrite(sql: str, context: RewriteContext) -> str | None:
    """DuckDB SQL for ``sql`` over the emulated catalog; None if nothing is emulated.

    A statement nested too deeply for sqlglot's recursion is 54001, as in the engine."""
    try:
        return _rewrite(sql, context)
    except RecursionError:
        raise StatementTooComplexError("statement too complex (nested too deeply)") from None


@text_cache(REWRITE_CACHE_ENTRIES)
def _rewrite(sql: str, context: RewriteContext) -> str | None:
    text = _COLLATE_DEFAULT.sub("", _OPERATOR.sub(r" \1 ", sql))
    try:
        tree = sqlglot.parse_one(text, read="postgres")
    except sqlglot.errors.SqlglotError:
        return None
    if tree is None or isinstance(tree, exp.Command):
        return None
    rewriter = _Rewriter(context)
    try:
        rewritten = tree.transform(rewriter.node)
    except sqlglot.errors.SqlglotError:
        return None  # a construct the rewriter cannot rebuild: DuckDB gets the original
    if not rewriter.changed:
        return None
    return _with_relations(rewritten, rewriter.needed, context)


class _Rewriter:
    def __init__(self, context: RewriteContext) -> None:
        self.context = context
        self.needed: set[str] = set()
        self.changed = False

    def node(self, node: exp.Expression) -> exp.Expression:
        # A replacement may itself need one (pg_catalog.version() -> version() -> '...').
        for _ in range(3):
            replaced = self._replace(node)
            if replaced is node:
                break
            self.changed = True
            node = replaced
        return node

    def _replace(self, node: exp.Expression) -> exp.Expression:
        if isinstance(node, exp.Table):
            return self._table(node)
        if isinstance(node, exp.Dot) and _name(node.this) == "pg_catalog":
            # pg_catalog.f(...) -> f(...); sqlglot does not descend into a replacement.
            return node.expression.transform(self.node)
        if isinstance(node, exp.Cast):
            return self._cast(node)
        if isinstance(node, exp.Column) and node.db.lower() in ("pg_catalog", "information_schema"):
            node.set("db", None)  # in place: the parent is needed below
            self.changed = True
        if isinstance(node, exp.CurrentSchema) and _is_projected(node):
            return exp.alias_(node.copy(), "current_schema")  # DuckDB: "current_schema()"
        if isinstance(node, exp.CurrentUser | exp.SessionUser):
            return self._role_name(node)
        if isinstance(node, exp.Column) and not node.table and node.name.lower() in (
            "current_catalog", "user"
        ) and not node.this.quoted:  # fmt: skip
            value = self.context.database if node.name.lower() == "current_catalog" else None
            return exp.Literal.string(value or self.context.user)
        if _is_projected_vector(node):
            return exp.func("array_to_string", node.copy(), exp.Literal.string(" "))
        if isinstance(node, exp.Func):
            name = _function_name(node)
            handler = FUNCTIONS.get(name) if name else None
            if handler is not None:
                arguments = [_argument_sql(a.transform(self.node)) for a in _arguments(node)]
                replaced = _parse_expression(_keep_parameters(handler(self, arguments), arguments))
                return _named_like_postgres(node, replaced, name)
        return node

    def _role_name(self, node: exp.Expression) -> exp.Expression:
        """The login user, unless SET ROLE / SET SESSION AUTHORIZATION gave the session
        another name: the engine then defines ``current_user``/``session_user`` macros on
        its DuckDB connection (``engine.grants``), and DuckDB's own answer is "duckdb"."""
        function = "session_user" if isinstance(node, exp.SessionUser) else "current_user"
        login = _quote(self.context.user)
        # A subquery: DuckDB would read a bare SESSION_USER next to an alias of the same
        # name as a reference to that alias.
        asked = f"(SELECT {function})"
        replaced = _parse_expression(f"CASE WHEN {asked} = 'duckdb' THEN {login} ELSE {asked} END")
        return exp.alias_(replaced, function) if _is_projected(node) else replaced

    def _table(self, table: exp.Table) -> exp.Expression:
        schema = table.db.lower()
        name = table.name.lower()
        if isinstance(table.this, exp.Func):
            function = _function_name(table.this)
            if function == "pg_options_to_table":
                argument = _arguments(table.this)[0].transform(self.node).sql(dialect="duckdb")
                sql = (
                    "(SELECT split_part(o, '=', 1) AS option_name, "
                    "split_part(o, '=', 2) AS option_value "
                    f"FROM (SELECT unnest({argument}) AS o))"
                )
                return _aliased(
                    exp.maybe_parse(sql, dialect="duckdb").subquery(), table, name or "options"
                )
            if schema == "pg_catalog":  # pg_catalog.generate_series(...): DuckDB's own
                table.set("db", None)
                self.changed = True
            return table
        relation = None
        if schema in ("", "pg_catalog") and not table.catalog:
            if name == "pg_settings":
                return self._settings_table(table)
            if name in rel.RELATIONS and name.startswith("pg_"):
                relation = name
        elif schema == "information_schema" and not table.catalog:
            relation = rel.INFORMATION_SCHEMA.get(name)
        if relation is None:
            return table
        self.needed.add(relation)
        replacement = exp.to_table(rel.cte_name(relation))
        return _aliased(replacement, table, name)

    def _settings_table(self, table: exp.Table) -> exp.Expression:
        rows = ", ".join(
            f"({_quote(name)}, {_quote(value)})" for name, value in self.context.settings
        )
        sql = (
            "(SELECT name, setting, NULL::VARCHAR AS unit, 'Topicbase' AS category, "
            "'' AS short_desc, 'user' AS context, 'string' AS vartype, 'session' AS source, "
            f"setting AS reset_val, setting AS boot_val FROM (VALUES {rows}) AS s(name, setting))"
        )
        return _aliased(exp.maybe_parse(sql, dialect="duckdb"), table, "pg_settings")

    def _cast(self, cast: exp.Cast) -> exp.Expression:
        target = _type_name(cast.to)
        if target is None:
            return cast
        value = cast.this.transform(self.node)
        literal = value.this if isinstance(value, exp.Literal) and value.is_string else None
        if target == "regclass":
            if literal is not None:
                return _parse_expression(self._regclass_oid(_quote(literal), literal))
            if isinstance(value, exp.Placeholder | exp.Parameter):  # a name, bound later
                return _parse_expression(self._regclass_of_text(value.sql(dialect="duckdb")))
            self.needed.add("pg_class")
            return _parse_expression(
                f"COALESCE((SELECT relname FROM __pg_class WHERE oid = {value.sql('duckdb')} "
                f"LIMIT 1), CAST({value.sql('duckdb')} AS VARCHAR))"
            )
        if target == "regtype":
            if literal is not None:
                return _parse_expression(to_regtype(_quote(literal)))
            return _parse_expression(format_type_sql(value.sql("duckdb"), "NULL"))
        if target == "regnamespace":
            self.needed.add("pg_namespace")
            return _parse_expression(
                f"(SELECT nspname FROM __pg_namespace WHERE oid = {value.sql('duckdb')})"
            )
        if target in ("regproc", "regprocedure", "regrole"):
            return exp.cast(value, exp.DataType.build("VARCHAR"))
        if target in ("oid", "xid", "cid", "regconfig"):
            return exp.cast(value, exp.DataType.build("BIGINT"))
        if target in ("name", "char", "text", "bpchar", "varchar", "character varying"):
            return exp.cast(value, exp.DataType.build("VARCHAR"))
        if target in ("int2", "int4", "int8", "bool", "float4", "float8", "numeric"):
            return exp.cast(value, exp.DataType.build(target, dialect="postgres"))
        if target in ("int2[]", "int4[]", "oid[]", "text[]", "name[]"):
            element = {"int2[]": "SMALLINT", "int4[]": "INTEGER", "oid[]": "BIGINT"}
            return exp.cast(value, exp.DataType.build(element.get(target, "VARCHAR") + "[]"))
        return cast

    def _regclass_oid(self, quoted: str, literal: str) -> str:
        if literal.isdigit():
            return literal
        name = literal.split(".")[-1].strip('"')
        if name in _CATALOG_CLASSES:
            return str(_CATALOG_CLASSES[name])
        self.needed.add("pg_class")
        self.needed.add("pg_namespace")
        schema_test = ""
        if "." in literal:
            schema = literal.split(".")[0].strip('"')
            schema_test = f" AND n.nspname = {_quote(schema)}"
        return (
            f"(SELECT c.oid FROM __pg_class c JOIN __pg_namespace n "
            f"ON n.oid = c.relnamespace WHERE c.relname = {_quote(name)}{schema_test} LIMIT 1)"
        )

    def _regclass_of_text(self, text: str) -> str:
        """SQL: the OID a text value names as ``regclass`` (digits, or a relation name)."""
        self.needed.update(("pg_class", "pg_namespace"))
        name = f"trim(split_part({text}, '.', -1), '\"')"
        catalog = " ".join(f"WHEN '{k}' THEN {v}" for k, v in _CATALOG_CLASSES.items())
        return (
            f"CASE WHEN regexp_full_match({text}, '[0-9]+') THEN CAST({text} AS BIGINT) "
            f"ELSE COALESCE(CASE {name} {catalog} END, (SELECT c.oid FROM __pg_class c "
            f"JOIN __pg_namespace n ON n.oid = c.relnamespace WHERE c.relname = {name} "
            f"AND (NOT contains({text}, '.') OR n.nspname = trim(split_part({text}, '.', 1), "
            "'\"')) LIMIT 1)) END"
        )

    def visible_schemas(self) -> str:
        return ", ".join(_quote(s) for s in ("pg_catalog", *self.context.search_path))

    def setting(self, arguments: list[str]) -> str:
        name = arguments[0].strip("'").lower() if arguments else ""
        values = dict(self.context.settings)
        if name in values:
            return _quote(values[name])
        if arguments and not arguments[0].startswith("'"):  # a parameter: look it up
            rows = ", ".join(f"({_quote(k)}, {_quote(v)})" for k, v in self.context.settings)
            return (
                f"(SELECT s.value FROM (VALUES {rows}) AS s(name, value) "
                f"WHERE s.name = lower({arguments[0]}))"
            )
        return f"current_setting({', '.join(arguments)})"


def _with_relations(tree: exp.Expression, needed: set[str], context: RewriteContext) -> str:
    """The DuckDB SQL of ``tree`` behind a WITH of the relations it uses."""
    ctes = [
        # MATERIALIZED: a relation used twice (pg_class in pg_table_is_visible) runs once.
        f"{rel.cte_name(name)} AS MATERIALIZED "
        f"({rel.relation_sql(name, context.user, context.database)})"
        for name in rel.with_dependencies(needed)
    ]
    own = tree.args.get("with_")
    recursive = False
    if own is not None:
        recursive = bool(own.args.get("recursive"))
        ctes += [cte.sql(dialect="duckdb") for cte in own.expressions]
        tree.set("with_", None)
    body = tree.sql(dialect="duckdb")
    if not ctes:
        return body
    return f"WITH {'RECURSIVE ' if recursive else ''}{', '.join(ctes)} {body}"


def _aliased(replacement: exp.Expression, original: exp.Table, name: str) -> exp.Expression:
    alias = original.args.get("alias")
    if alias is None:
        alias = exp.TableAlias(this=exp.to_identifier(name))
    replacement.set("alias", alias.copy())
    return replacement


def _function_name(node: exp.Expression) -> str | None:
    if isinstance(node, exp.Anonymous):
        return str(node.this).lower()
    if isinstance(node, exp.CurrentSchema):
        return None
    if isinstance(node, exp.Func):
        return node.sql_name().lower()
    return None


def _arguments(node: exp.Expression) -> list[exp.Expression]:
    if isinstance(node, exp.Anonymous):
        values = node.expressions
    else:
        values = [v for key, v in node.args.items() if v is not None and key != "this"]
        values = ([node.this] if node.this is not None else []) + [
            item for v in values for item in (v if isinstance(v, list) else [v])
        ]
    return [value for value in values if isinstance(value, exp.Expression)]


def _named_like_postgres(
    original: exp.Expression, replaced: exp.Expression, name: str
) -> exp.Expression:
    """A replaced function selected without an alias keeps PostgreSQL's column name (the
    function's), not the text of its replacement."""
    if _is_projected(original):
        return exp.alias_(replaced, "version" if name == "current_version" else name)
    return replaced


def _is_projected(node: exp.Expression) -> bool:
    """``node`` is an item of a SELECT list, without an alias."""
    parent = node.parent
    return isinstance(parent, exp.Select) and any(node is item for item in parent.expressions)


def _keep_parameters(sql: str, arguments: list[str]) -> str:
    """``sql`` still referring to every ``$n`` of ``arguments`` (DuckDB refuses a bound
    parameter the statement does not use); a dropped one is tested and ignored."""
    dropped = [a for a in arguments if "$" in a and a not in sql]
    for argument in dropped:
        sql = f"COALESCE({sql}, CASE WHEN {argument} IS NULL THEN NULL END)"
    return sql


_INT2VECTOR_COLUMNS = ("indkey", "indoption", "indclass", "indcollation")


def _is_projected_vector(node: exp.Expression) -> bool:
    """A PostgreSQL ``int2vector``/``oidvector`` column (``pg_index.indoption``…) selected
    as it is: its text form is space-separated numbers, which clients split themselves."""
    if not isinstance(node, exp.Column) or node.name.lower() not in _INT2VECTOR_COLUMNS:
        return False
    parent = node.parent
    if isinstance(parent, exp.Alias):
        parent = parent.parent
        node = node.parent
    return isinstance(parent, exp.Select) and node in parent.expressions


def _argument_sql(argument: exp.Expression) -> str:
    """SQL of a function argument, parenthesised unless atomic (``f(a = b)`` is no kwarg)."""
    sql = argument.sql(dialect="duckdb")
    atomic = (exp.Column, exp.Literal, exp.Placeholder, exp.Parameter, exp.Null, exp.Boolean)
    return sql if isinstance(argument, atomic) else f"({sql})"


def _type_name(data_type: exp.Expression) -> str | None:
    if isinstance(data_type, exp.ObjectIdentifier):
        return data_type.name.lower()
    if not isinstance(data_type, exp.DataType):
        return None
    kind = data_type.args.get("kind")
    if data_type.this == exp.DataType.Type.USERDEFINED and kind is not None:
        last = kind.expression if isinstance(kind, exp.Dot) else kind
        return last.name.lower()
    if data_type.this == exp.DataType.Type.NAME:
        return "name"
    if data_type.this == exp.DataType.Type.ARRAY and data_type.expressions:
        inner = _type_name(data_type.expressions[0])
        return None if inner is None else inner + "[]"
    return None


def _name(node: exp.Expression) -> str:
    return node.name.lower() if isinstance(node, exp.Identifier) else ""


def _parse_expression(sql: str) -> exp.Expression:
    return sqlglot.parse_one(sql, read="duckdb")


_quote = quote
