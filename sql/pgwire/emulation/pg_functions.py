"""PostgreSQL functions that ``pg_rewrite`` replaces, as DuckDB SQL builders.

``FUNCTIONS`` maps a lower-case function name to a builder that takes the rewriter (for
its ``context`` and the set of catalog relations it ``needed``) and the arguments as DuckDB
SQL, and returns the replacement SQL. A builder adds to ``needed`` every ``__pg_``
relation its SQL reads. Pure functions.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from sql.pgwire.emulation import pg_privileges
from sql.pgwire.emulation import pg_relations as rel
from sql.pgwire.emulation.pg_types import all_types, format_type_sql


class Rewriter(Protocol):
    """What a builder may use of ``pg_rewrite``'s rewriter."""

    context: Any
    needed: set[str]

    def setting(self, arguments: list[str]) -> str: ...

    def visible_schemas(self) -> str: ...


def quote(text: str) -> str:
    """A SQL string literal."""
    return "'" + text.replace("'", "''") + "'"


def to_regtype(name_sql: str) -> str:
    rows = ", ".join(
        f"({oid}, '{name}', '{shown.replace(chr(39), chr(39) * 2)}')"
        for oid, name, _, _, _, _, shown in all_types()
    )
    wanted = f"regexp_replace(lower({name_sql}), '^pg_catalog\\.', '')"
    return (
        f"(SELECT t.oid FROM (VALUES {rows}) AS t(oid, typname, shown) "
        f"WHERE t.typname = {wanted} OR t.shown = {wanted} LIMIT 1)"
    )


def _lookup(relation: str, column: str, key: str) -> Callable[[Rewriter, list[str]], str]:
    def build(rewriter: Rewriter, arguments: list[str]) -> str:
        rewriter.needed.add(relation)
        return f"(SELECT {column} FROM {rel.cte_name(relation)} WHERE {key} = {arguments[0]} " \
               "LIMIT 1)"  # fmt: skip

    return build


def _description(rewriter: Rewriter, arguments: list[str]) -> str:
    rewriter.needed.add("pg_description")
    subid = arguments[1] if len(arguments) > 1 and not arguments[1].startswith("'") else "0"
    return (
        f"(SELECT description FROM __pg_description WHERE objoid = {arguments[0]} "
        f"AND objsubid = {subid} LIMIT 1)"
    )


def _index_definition(rewriter: Rewriter, arguments: list[str]) -> str:
    """``pg_get_indexdef(index[, column[, pretty]])``: the CREATE INDEX statement, or with a
    column number > 0 that column of the index (its name)."""
    whole = _lookup("pg_index", "indexdef", "indexrelid")(rewriter, arguments)
    if len(arguments) < 2:
        return whole
    rewriter.needed.add("pg_attribute")
    column = (
        f"(SELECT attname FROM __pg_attribute WHERE attrelid = {arguments[0]} "
        f"AND attnum = {arguments[1]} LIMIT 1)"
    )
    return f"CASE WHEN {arguments[1]} = 0 THEN {whole} ELSE {column} END"


def _table_is_visible(rewriter: Rewriter, arguments: list[str]) -> str:
    rewriter.needed.update(("pg_class", "pg_namespace"))
    return (
        f"({arguments[0]} IN (SELECT c.oid FROM __pg_class c JOIN __pg_namespace n "
        f"ON n.oid = c.relnamespace WHERE n.nspname IN ({rewriter.visible_schemas()})))"
    )


def _to_regclass(rewriter: Rewriter, arguments: list[str]) -> str:
    rewriter.needed.update(("pg_class", "pg_namespace"))
    name = arguments[0]
    return (
        f"(SELECT c.oid FROM __pg_class c JOIN __pg_namespace n ON n.oid = c.relnamespace "
        f"WHERE c.relname = split_part({name}, '.', -1) AND (NOT contains({name}, '.') "
        f"OR n.nspname = split_part({name}, '.', 1)) LIMIT 1)"
    )


def _has_table_privilege(rewriter: Rewriter, arguments: list[str]) -> str:
    """``has_table_privilege([user,] table, privilege)``: ``pg_privileges`` decides."""
    rewriter.needed.update({"pg_class", "role_source"})
    if len(arguments) == 2:
        return pg_privileges.has_table_privilege(quote(rewriter.context.user), *arguments)
    return pg_privileges.has_table_privilege(*arguments[:3])


FUNCTIONS: dict[str, Callable[[Rewriter, list[str]], str]] = {
    "version": lambda r, a: quote(
        f"PostgreSQL {r.context.server_version} on x86_64-pc-linux-gnu, compiled by Python, 64-bit"
    ),
    "current_database": lambda r, a: quote(r.context.database),
    "current_version": lambda r, a: FUNCTIONS["version"](r, a),  # sqlglot's name of version()
    "current_setting": lambda r, a: r.setting(a),
    "pg_get_userbyid": lambda r, a: (
        f"CASE WHEN {a[0]} = {rel.ROLE_OID} THEN {quote(r.context.user)} "
        f"ELSE 'unknown (OID=' || {a[0]} || ')' END"
    ),
    "pg_table_is_visible": _table_is_visible,
    "has_table_privilege": _has_table_privilege,
    "pg_type_is_visible": lambda r, a: "true",
    "pg_collation_is_visible": lambda r, a: "true",
    "json_build_object": lambda r, a: f"json_object({', '.join(a)})",
    "jsonb_build_object": lambda r, a: f"json_object({', '.join(a)})",
    "array_length": lambda r, a: f"len({a[0]})",
    "pg_function_is_visible": lambda r, a: "true",
    "format_type": lambda r, a: format_type_sql(a[0], a[1] if len(a) > 1 else "NULL"),
    "pg_get_expr": lambda r, a: a[0],
    "pg_get_constraintdef": _lookup("pg_constraint", "condef", "oid"),
    "pg_get_indexdef": lambda r, a: _index_definition(r, a),
    "pg_get_viewdef": lambda r, a: (
        f"(SELECT sql FROM duckdb_views() WHERE view_oid = {a[0]} LIMIT 1)"
    ),
    "obj_description": _description,
    "col_description": _description,
    "shobj_description": lambda r, a: "NULL::VARCHAR",
    "pg_encoding_to_char": lambda r, a: f"CASE WHEN {a[0]} = 6 THEN 'UTF8' ELSE '' END",
    "to_regtype": lambda r, a: to_regtype(a[0]),
    "to_regclass": _to_regclass,
    "pg_relation_is_publishable": lambda r, a: "false",
    "pg_partition_ancestors": lambda r, a: f"unnest([CAST({a[0]} AS BIGINT)])",
    "pg_is_other_temp_schema": lambda r, a: "false",
    "pg_my_temp_schema": lambda r, a: "0",
    "pg_backend_pid": lambda r, a: "0",
    "array_upper": lambda r, a: f"len({a[0]})",
    "quote_ident": lambda r, a: (
        f"CASE WHEN regexp_full_match({a[0]}, '[a-z_][a-z0-9_$]*') THEN {a[0]} "
        f"ELSE '\"' || replace({a[0]}, '\"', '\"\"') || '\"' END"
    ),
    "quote_literal": lambda r, a: f"'''' || replace({a[0]}, '''', '''''') || ''''",
    "pg_database_size": lambda r, a: "NULL::BIGINT",  # unknown: psql shows an empty size
    "pg_relation_size": lambda r, a: "0",
    "pg_table_size": lambda r, a: "0",
    "pg_total_relation_size": lambda r, a: "0",
    "pg_get_serial_sequence": lambda r, a: "NULL::VARCHAR",
    "pg_get_statisticsobjdef_columns": lambda r, a: "NULL::VARCHAR",
    "pg_get_function_result": lambda r, a: "NULL::VARCHAR",
    "pg_get_triggerdef": lambda r, a: "NULL::VARCHAR",
    "pg_get_function_arguments": lambda r, a: "NULL::VARCHAR",
    "pg_get_statisticsobjdef_expressions": lambda r, a: "NULL::VARCHAR[]",
}
# Privileges Topicbase does not grant (columns, schemas' USAGE, databases, functions) are
# everyone's; tables and views answer from their grants (above).
for _privilege in ("column", "any_column", "schema", "database", "sequence", "function"):
    FUNCTIONS[f"has_{_privilege}_privilege"] = lambda r, a: "true"
