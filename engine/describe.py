"""Describing a planned statement without running it: its parameters and result columns.

A Postgres-wire client that prepares a statement (asyncpg, pg8000) asks, before it
binds any value, how many parameters the statement takes, of which types, and which
columns it returns. ``describe_plan`` answers from the plan alone and from DuckDB's
binder; nothing is executed, nothing is written, no offset moves.

How DuckDB is asked: DuckDB 2.0's binder (the connection's ``_bind``, which its own
relation layer uses) binds a statement without running it and reports its output names
and types, the type of each parameter (UNKNOWN where the context does not tell) and
whether it returns rows; given parameter values, it types the statement as an execution
with those values would. Topic relations and ``sys.`` views are stood in for by empty
Arrow tables of their schema, registered for the duration of the description only (not
at all for a plain topic read, whose columns are the topic relation's). The Arrow type of
each result column comes from ``SELECT CAST(NULL AS <type>) ... LIMIT 0``, a constant
query, so it is exactly the type an execution produces. Without that binder (DuckDB 1.x)
only statements DuckDB classes as SELECT are bound, as lazy relations (``cursor.sql``
builds them without running them), with parameters read as typed NULLs.

Parameter types (a DuckDB type name per ``$n``, or None when nothing tells):
1. ``INSERT INTO TOPIC`` values and ``WITH`` options: the type of the target column or
   option (``data`` BLOB, ``seq_no`` BIGINT, ``producer_id`` VARCHAR, ``wait`` INTERVAL…);
   options of ``FROM TOPIC t WITH (...)`` likewise.
2. DuckDB SQL: what DuckDB's binder infers (``id = $1`` → the column's type, ``$1::T``
   → T, ``LIMIT $1`` → BIGINT, ``VALUES`` of an INSERT → the column's type ...).
3. Where the binder says UNKNOWN (``SELECT $1``, ``$1 + 1``), from the placeholder's
   context read with sqlglot: in a comparison, arithmetic, ``LIKE``, ``IN`` or
   ``BETWEEN`` the type of the other operand, bound by DuckDB in the statement's FROM
   clause (other placeholders read as NULL of their type).
4. Anything else is None: the wire front reports it as ``text``, as PostgreSQL does for
   an unknown-typed parameter it cannot resolve, and DuckDB casts the text value where
   it is used.
Result columns are bound with each parameter given a sample value of the Python type
the wire front decodes it to (text when unknown), so ``SELECT $1`` returns text.
"""

from __future__ import annotations

import contextlib
import datetime
import decimal
import uuid
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import pyarrow as pa
import sqlglot
from sqlglot import expressions as exp

from engine import introspection, tables, write_statements
from engine.topic_relation import SCHEMA as TOPIC_SCHEMA
from grammar import ast
from grammar.bounded_cache import SCHEMA_COLUMN_BYTES, TEXT_COST_PER_CHAR, BoundedCache
from grammar.settings import RETURNING_COLUMNS
from planner.operations import (
    AppendRecords,
    Introspect,
    Plan,
    ReadRecords,
    RunQuery,
)
from planner.planner import parse_duckdb
from planner.write_statements import AbortStagedWrites, CommitStagedWrites
from storage import limits
from storage.errors import TopicbaseError

UNKNOWN_PARAMETER_TYPE = "VARCHAR"  # how an untyped parameter is read while binding

# DuckDB type names of the columns and options parameters can stand for.
INSERT_COLUMN_TYPES = {
    "data": "BLOB",
    "producer_id": "VARCHAR",
    "seq_no": "BIGINT",
    "message_group_id": "VARCHAR",
    "partition": "BIGINT",
    "created_at": "TIMESTAMP WITH TIME ZONE",
    "metadata": "JSON",
    "codec": "VARCHAR",
}
OPTION_TYPES = {
    "consumer": "VARCHAR",
    "member": "VARCHAR",
    "partition": "BIGINT",
    "from_offset": "BIGINT",
    "max_messages": "BIGINT",
    "max_bytes": "BIGINT",
    "wait": "INTERVAL",
    "read_from": "TIMESTAMP WITH TIME ZONE",
    "max_lag": "INTERVAL",
    "decode": "BOOLEAN",
    "codec": "VARCHAR",
    "producer_id": "VARCHAR",
    "message_group_id": "VARCHAR",
}
_TOPIC_SQL_TYPES = {
    "partition": "INTEGER",
    "offset": "BIGINT",
    "seq_no": "BIGINT",
    "producer_id": "VARCHAR",
    "message_group_id": "VARCHAR",
    "created_at": "TIMESTAMP WITH TIME ZONE",
    "written_at": "TIMESTAMP WITH TIME ZONE",
    "codec": "VARCHAR",
    "data": "BLOB",
    "metadata": "MAP(VARCHAR, BLOB)",
}
_RETURNING_SQL_TYPES = {
    "partition": ("INTEGER", pa.int32()),
    "offset": ("BIGINT", pa.int64()),
    "status": ("VARCHAR", pa.string()),
    "seq_no": ("BIGINT", pa.int64()),
    "producer_id": ("VARCHAR", pa.string()),
    "message_group_id": ("VARCHAR", pa.string()),
    "created_at": ("TIMESTAMP WITH TIME ZONE", pa.timestamp("us", tz="UTC")),
}
_OTHER_OPERAND = (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.Add, exp.Sub,
                  exp.Mul, exp.Div, exp.Mod, exp.Like, exp.ILike, exp.NullSafeEQ,
                  exp.NullSafeNEQ)  # fmt: skip


@dataclass(frozen=True)
class ResultColumn:
    """One result column: its name, the Arrow type execution yields, DuckDB's type name
    (which keeps what Arrow loses, such as UUID and JSON, both Arrow strings)."""

    name: str
    arrow_type: pa.DataType
    sql_type: str


@dataclass(frozen=True)
class Description:
    """``parameter_types[i]`` is the DuckDB type name of ``$(i+1)`` or None (unknown);
    its length is the highest parameter index the statement uses. ``columns`` is None
    when the statement returns no rows."""

    parameter_types: tuple[str | None, ...]
    columns: tuple[ResultColumn, ...] | None


def describe_plan(
    plan: Plan, statement: ast.Statement, cursor: Any, database: Any, owner: Any = None
) -> Description:
    """The description of ``statement`` (planned as ``plan``); runs nothing.

    ``cursor`` is the session's DuckDB cursor: only binding happens on it, and the stand-in
    relations registered on it are gone when this returns. With an ``owner`` (the
    session), descriptions are kept per statement text and reused while DuckDB's catalog
    version (which any DDL, registration or write moves) stays where it was.
    """
    version = _catalog_version(cursor)
    key = _statement_key(statement)
    memo = None
    if owner is not None and version is not None and key is not None:
        memo = _MEMO.get(owner)
        if memo is None:
            memo = _MEMO[owner] = BoundedCache("engine.describe.memo", MEMO_ENTRIES)
        kept = memo.get(key)
        if kept is not None and kept[0] == version:
            return kept[1]
    description = _describe(plan, statement, cursor, database)
    if memo is not None:
        after = _catalog_version(cursor)  # stand-in registrations move it
        if after is not None:
            columns = len(description.columns or ()) + len(description.parameter_types)
            cost = TEXT_COST_PER_CHAR * len(key) + SCHEMA_COLUMN_BYTES * columns
            memo.put(key, (after, description), cost)
    return description


MEMO_ENTRIES = 128  # per session, and bounded in bytes (``BoundedCache``: a description
# of thousands of columns holds megabytes)
_MEMO: weakref.WeakKeyDictionary[Any, BoundedCache]
_MEMO = weakref.WeakKeyDictionary()


def _catalog_version(cursor: Any) -> int | None:
    """DuckDB's count of statements that may change what a name binds to (2.0's binder
    API), less the moves of the engine's own kept plans (``tables.catalog_version``);
    None where the connection does not tell."""
    return tables.catalog_version(cursor)


def _statement_key(statement: ast.Statement) -> str | None:
    """The statement's own text, and for plain SQL also what DuckDB gets (a front may
    rewrite the SQL of a statement and keep its text)."""
    text = getattr(statement, "text", None)
    if not isinstance(text, str) or len(text) > limits.DESCRIBE_MEMO_TEXT_CHARS_MAX:
        return None
    sql = statement.sql if isinstance(statement, ast.SqlStatement) else ""
    return f"{type(statement).__name__}\0{text}\0{sql}"


def _describe(plan: Plan, statement: ast.Statement, cursor: Any, database: Any) -> Description:
    parameters: dict[int, str | None] = {}
    _collect_ast_parameters(statement, parameters)
    if plan.explain_only:
        return Description(_as_tuple(parameters), (_column("plan", pa.string(), "VARCHAR"),))
    columns: tuple[ResultColumn, ...] | None = None
    with _stand_ins(plan, cursor, database):
        for operation in plan.operations:
            if isinstance(operation, RunQuery):
                columns = _named(_describe_query(operation, cursor, parameters), operation)
            elif isinstance(operation, AppendRecords):
                columns = _returning_columns(operation)
            elif isinstance(operation, Introspect):
                columns = _introspection_columns(operation, database)
            elif isinstance(operation, CommitStagedWrites | AbortStagedWrites):
                columns = tuple(_column(f.name, f.type, _sql_type_of(f.type))
                                for f in write_statements.result_schema(operation))  # fmt: skip
    return Description(_as_tuple(parameters), columns)


def _named(
    columns: tuple[ResultColumn, ...] | None, operation: RunQuery
) -> tuple[ResultColumn, ...] | None:
    """The columns under PostgreSQL's names, as execution gives them (``streams.named``)."""
    names = operation.column_names
    if columns is None or names is None or len(names) != len(columns):
        return columns
    return tuple(replace(c, name=n) for c, n in zip(columns, names, strict=True))


# -- parameters of the topic syntax -------------------------------------------------------------
def _collect_ast_parameters(statement: ast.Statement, found: dict[int, str | None]) -> None:
    if isinstance(statement, ast.Explain):
        _collect_ast_parameters(statement.statement, found)
        return
    if isinstance(statement, ast.InsertTopic):
        columns = statement.columns or ("data",)
        for row in statement.values or ():
            for name, value in zip(columns, row, strict=False):
                _note(found, value, INSERT_COLUMN_TYPES.get(name))
        _note_options(found, statement.options)
        if statement.query is not None:
            _collect_ast_parameters(statement.query, found)
    elif isinstance(statement, ast.SqlStatement):
        for scan in statement.topic_scans:
            _note_options(found, scan.options)


def _note_options(found: dict[int, str | None], options: Any) -> None:
    pairs = options.items() if isinstance(options, dict) else options
    for name, value in pairs:
        _note(found, value, OPTION_TYPES.get(name))


def _note(found: dict[int, str | None], value: Any, sql_type: str | None) -> None:
    known = isinstance(value, ast.Parameter) and found.get(value.index) is not None
    numbered = isinstance(value, ast.Parameter) and 0 < value.index <= limits.WIRE_PARAMETERS_MAX
    if numbered and not known:
        found[value.index] = sql_type


def _as_tuple(found: dict[int, str | None]) -> tuple[str | None, ...]:
    count = max(found, default=0)
    return tuple(found.get(index) for index in range(1, count + 1))


# -- DuckDB SQL ---------------------------------------------------------------------------------
def _describe_query(
    operation: RunQuery, cursor: Any, parameters: dict[int, str | None]
) -> tuple[ResultColumn, ...] | None:
    if operation.projection is not None:  # columns of a topic relation, taken as they are
        fields = {f.name: f.type for f in TOPIC_SCHEMA}
        return tuple(
            _column(name, fields[source], _TOPIC_SQL_TYPES[source])
            for source, name in operation.projection[1]
        )
    signature = _duckdb_signature(cursor, operation.sql, raise_errors=True)
    if signature is not None:
        for name, sql_type in signature.parameters:
            if name.isdigit() and parameters.get(int(name)) is None:
                parameters[int(name)] = None if sql_type == "UNKNOWN" else sql_type
    tree = None
    if signature is None or any(parameters.get(int(n)) is None for n, _ in signature.parameters):
        try:
            tree = parse_duckdb(operation.sql)
        except sqlglot.errors.SqlglotError:
            tree = None
    if tree is not None:
        _infer_parameters(tree, cursor, parameters)
    if signature is None:
        return _describe_without_binder(operation, tree, cursor, parameters)
    if signature.return_type != "query_result":
        return None
    if not signature.parameters:
        return _columns_of(cursor, signature.names, signature.types)
    # Typed as the execution will type it; if the samples do not bind (a parameter
    # whose type could not be inferred, used where text does not fit), the unknown
    # parameters are read as untyped NULLs.
    names = [n for n, _ in signature.parameters]
    for unknown in ("", None):
        values = [_sample_value(parameters.get(int(n)), unknown) for n in names]
        typed = _duckdb_signature(cursor, operation.sql, values)
        if typed is not None:
            return _columns_of(cursor, typed.names, typed.types)
    return None


def _describe_without_binder(
    operation: RunQuery, tree: exp.Expression | None, cursor: Any, parameters: dict[int, str | None]
) -> tuple[ResultColumn, ...] | None:
    """The result columns where DuckDB's binder is not reachable (DuckDB 1.x): queries are
    bound as lazy relations with their parameters read as typed NULLs."""
    if tree is None:
        return None
    if isinstance(tree, exp.Query) or _is_select_statement(cursor, operation.sql):
        return _bound_columns(cursor, _with_typed_nulls(tree, parameters).sql(dialect="duckdb"))
    if isinstance(tree, exp.Insert | exp.Update | exp.Delete) and tree.args.get("returning"):
        return _returning_of_dml(tree, cursor, parameters)
    return None


@dataclass(frozen=True)
class _Signature:
    names: list[str]
    types: list[str]
    parameters: list[tuple[str, str]]
    return_type: str  # "query_result", "changed_rows", "nothing", ...


def _duckdb_signature(
    cursor: Any, sql: str, values: list[Any] | None = None, *, raise_errors: bool = False
) -> _Signature | None:
    """What DuckDB's binder says of ``sql`` (run: never): output names and types, parameter
    types (``UNKNOWN`` where the context does not tell) and the kind of result. With
    ``values`` the parameters are typed from them, as in an execution with those values.

    This is DuckDB 2.0's binder entry point of the Python connection (``_bind``, what its
    relation layer uses); None when it is missing (DuckDB 1.x) or, unless ``raise_errors``,
    cannot bind ``sql``.
    """
    binder = getattr(cursor, "_bind", None)
    if binder is None:
        return None
    try:
        with tables.translated():
            bound = binder(sql, values=values)
    except TopicbaseError:
        if raise_errors:
            raise
        return None
    except (TypeError, ValueError):  # another binder signature, values it cannot take
        return None
    names, types, parameters, return_type = bound[0], bound[1], bound[2], bound[3]
    return _Signature(
        list(names), [str(t) for t in types], [(str(n), str(t)) for n, t in parameters],
        str(return_type),
    )  # fmt: skip


_SAMPLES: tuple[tuple[tuple[str, ...], Any], ...] = (
    (("TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT", "USMALLINT",
      "UINTEGER", "UBIGINT", "INT"), 0),
    (("FLOAT", "DOUBLE", "REAL"), 0.0),
    (("DECIMAL", "NUMERIC"), decimal.Decimal(0)),
    (("BOOLEAN",), False),
    (("BLOB",), b""),
    (("DATE",), datetime.date(2000, 1, 1)),
    (("TIMESTAMP WITH TIME ZONE", "TIMESTAMPTZ"),
     datetime.datetime(2000, 1, 1, tzinfo=datetime.UTC)),
    (("TIMESTAMP",), datetime.datetime(2000, 1, 1)),
    (("INTERVAL",), datetime.timedelta(0)),
    (("UUID",), uuid.UUID(int=0)),
)  # fmt: skip


def _sample_value(sql_type: str | None, unknown: Any = "") -> Any:
    """A Python value of the kind the wire front decodes a ``sql_type`` parameter to
    (``unknown`` for an unknown type), so a bind with it types the statement as an
    execution with such values."""
    if sql_type is None:
        return unknown
    upper = sql_type.upper()
    for names, sample in _SAMPLES:
        if any(upper == n or upper.startswith(n + "(") for n in names):
            return sample
    return ""


def _columns_of(
    cursor: Any, names: list[str], sql_types: list[str]
) -> tuple[ResultColumn, ...] | None:
    try:
        with tables.translated():
            arrow = _arrow_types(cursor, sql_types)
    except TopicbaseError:
        return None
    return tuple(_column(n, a, s) for n, a, s in zip(names, arrow, sql_types, strict=True))


def _placeholders(tree: exp.Expression) -> Iterator[tuple[int, exp.Placeholder]]:
    """Each ``$n`` (index n) and ``?`` (the n-th one) of ``tree`` in text order."""
    question_marks = 0
    for node in tree.find_all(exp.Placeholder):
        name = node.this
        if name is None:
            question_marks += 1
            yield question_marks, node
        elif str(name).isdigit() and 0 < int(name) <= limits.WIRE_PARAMETERS_MAX:
            yield int(name), node


def _infer_parameters(tree: exp.Expression, cursor: Any, found: dict[int, str | None]) -> None:
    for index, node in _placeholders(tree):
        if found.get(index) is None:
            try:
                found[index] = _context_type(node, tree, cursor, found)
            except (TopicbaseError, sqlglot.errors.SqlglotError):
                found[index] = None


def _context_type(
    node: exp.Placeholder, root: exp.Expression, cursor: Any, found: dict[int, str | None]
) -> str | None:
    parent = node.parent
    if isinstance(parent, exp.Cast) and node.arg_key == "this":
        return parent.to.sql(dialect="duckdb")
    if isinstance(parent, exp.Limit | exp.Offset | exp.Fetch):
        return "BIGINT"
    if isinstance(parent, exp.Tuple) and isinstance(parent.parent, exp.Values):
        insert = parent.parent.parent
        if isinstance(insert, exp.Insert) and not isinstance(insert.parent, exp.Insert):
            return _insert_column_type(insert, parent.expressions.index(node), cursor)
    in_set = isinstance(parent, exp.EQ) and isinstance(parent.parent, exp.Update)
    if in_set and node is parent.expression and isinstance(parent.this, exp.Column):
        return _table_column_type(parent.parent.this, parent.this.name, cursor)
    holder = parent
    while isinstance(holder, exp.Paren):
        holder = holder.parent
    if isinstance(holder, exp.Any) and isinstance(holder.parent, _OTHER_OPERAND):
        # x = ANY($1): a list of x's type
        other = _other_operand(holder, holder.parent)
        if other is None:
            return None
        # Probed without the filter: ANY over an untyped NULL does not bind.
        element = _expression_type(other, node, root, cursor, found, keep_filter=False)
        return None if element is None else f"{element}[]"
    other = _other_operand(node, parent)
    if other is None:
        return None
    return _expression_type(other, node, root, cursor, found)


def _other_operand(node: exp.Expression, parent: exp.Expression | None) -> exp.Expression | None:
    if isinstance(parent, _OTHER_OPERAND):
        return parent.expression if node is parent.this else parent.this
    if isinstance(parent, exp.In) and node.arg_key == "expressions":
        return parent.this
    if isinstance(parent, exp.Between) and node.arg_key in ("low", "high"):
        return parent.this
    return None


def _insert_column_type(insert: exp.Insert, position: int, cursor: Any) -> str | None:
    target = insert.this
    names: list[str] | None = None
    if isinstance(target, exp.Schema):
        names = [c.name for c in target.expressions]
        target = target.this
    if not isinstance(target, exp.Table):
        return None
    columns = _bound_columns(cursor, f"SELECT * FROM {target.sql(dialect='duckdb')}")
    if columns is None:
        return None
    by_name = {c.name.lower(): c.sql_type for c in columns}
    if names is None:
        return columns[position].sql_type if position < len(columns) else None
    return by_name.get(names[position].lower()) if position < len(names) else None


def _table_column_type(table: exp.Expression, column: str, cursor: Any) -> str | None:
    if not isinstance(table, exp.Table):
        return None
    columns = _bound_columns(cursor, f"SELECT * FROM {table.sql(dialect='duckdb')}") or ()
    return next((c.sql_type for c in columns if c.name.lower() == column.lower()), None)


def _expression_type(
    other: exp.Expression,
    node: exp.Placeholder,
    root: exp.Expression,
    cursor: Any,
    found: dict[int, str | None],
    *,
    keep_filter: bool = True,
) -> str | None:
    """DuckDB's type of ``other`` where it stands: ``SELECT other FROM <scope's sources>``
    (``keep_filter=False``: without the scope's WHERE)."""
    scope = node.find_ancestor(exp.Select, exp.Update, exp.Delete)
    if isinstance(scope, exp.Select):
        probe = scope.copy()
        dropped = ("order", "limit", "offset", "distinct", "qualify")
        for key in dropped if keep_filter else (*dropped, "where"):
            probe.set(key, None)
        probe.set("expressions", [other.copy()])
        if scope is not root and isinstance(root, exp.Query) and root.args.get("with"):
            probe.set("with", root.args["with"].copy())
    elif isinstance(scope, exp.Update | exp.Delete):
        probe = exp.select(other.copy()).from_(scope.this.copy())
    else:
        probe = exp.select(other.copy())
    columns = _bound_columns(cursor, _with_typed_nulls(probe, found).sql(dialect="duckdb"))
    return columns[0].sql_type if columns else None


def _with_typed_nulls(tree: exp.Expression, found: dict[int, str | None]) -> exp.Expression:
    """``tree`` with every parameter read as a NULL of its (inferred) type."""
    copy = tree.copy()
    for index, node in list(_placeholders(copy)):
        sql_type = found.get(index) or UNKNOWN_PARAMETER_TYPE
        node.replace(exp.cast(exp.null(), exp.DataType.build(sql_type, dialect="duckdb")))
    return copy


def _returning_of_dml(
    tree: exp.Expression, cursor: Any, found: dict[int, str | None]
) -> tuple[ResultColumn, ...] | None:
    target = tree.this.this if isinstance(tree.this, exp.Schema) else tree.this
    if not isinstance(target, exp.Table):
        return None
    returning = tree.args["returning"]
    probe = exp.select(*[e.copy() for e in returning.expressions]).from_(target.copy())
    return _bound_columns(cursor, _with_typed_nulls(probe, found).sql(dialect="duckdb"))


def _is_select_statement(cursor: Any, sql: str) -> bool:
    """True when DuckDB classes ``sql`` as a SELECT (then ``cursor.sql`` only binds it)."""
    try:
        with tables.translated():
            statements = cursor.extract_statements(sql)
    except TopicbaseError:
        return False
    return len(statements) == 1 and statements[0].type.name == "SELECT"


def _bound_columns(cursor: Any, sql: str) -> tuple[ResultColumn, ...] | None:
    """Names and types of a SELECT's columns, bound by DuckDB and never run; None when
    DuckDB cannot bind it."""
    if hasattr(cursor, "_bind"):
        signature = _duckdb_signature(cursor, sql)
        if signature is None or signature.return_type != "query_result":
            return None
        return _columns_of(cursor, signature.names, signature.types)
    if not _is_select_statement(cursor, sql):
        return None
    try:
        with tables.translated():
            relation = cursor.sql(sql)
            names, sql_types = list(relation.columns), [str(t) for t in relation.types]
            arrow = _arrow_types(cursor, sql_types)
    except TopicbaseError:
        return None
    return tuple(_column(n, a, s) for n, a, s in zip(names, arrow, sql_types, strict=True))


def _arrow_types(cursor: Any, sql_types: list[str]) -> list[pa.DataType]:
    """The Arrow types DuckDB produces for ``sql_types``, from a constant query; kept
    per type name (a name always maps to the same Arrow type in one process), at most
    ``ARROW_TYPES_CACHED`` of them."""
    missing = sorted({t for t in sql_types if t not in _arrow_type_cache})
    if len(_arrow_type_cache) + len(missing) > ARROW_TYPES_CACHED:
        _arrow_type_cache.clear()
        missing = sorted(set(sql_types))
    if missing:
        items = ", ".join(f'CAST(NULL AS {t}) AS "c{i}"' for i, t in enumerate(missing))
        schema = cursor.sql(f"SELECT {items} LIMIT 0").to_arrow_table().schema
        _arrow_type_cache.update(zip(missing, (f.type for f in schema), strict=True))
    return [_arrow_type_cache[t] for t in sql_types]


ARROW_TYPES_CACHED = 4096
_arrow_type_cache: dict[str, pa.DataType] = {}


# -- other statements ---------------------------------------------------------------------------
def _returning_columns(operation: AppendRecords) -> tuple[ResultColumn, ...] | None:
    if not operation.returning:
        return None
    names = RETURNING_COLUMNS if "*" in operation.returning else operation.returning
    known = [n for n in names if n in _RETURNING_SQL_TYPES]
    return tuple(_column(n, _RETURNING_SQL_TYPES[n][1], _RETURNING_SQL_TYPES[n][0]) for n in known)


def _introspection_columns(operation: Introspect, database: Any) -> tuple[ResultColumn, ...]:
    if operation.what == "topics":
        schema = introspection.show_topics(database).schema
    else:
        schema = introspection.describe_topic(database, operation.topic).schema
    return tuple(_column(f.name, f.type, _sql_type_of(f.type)) for f in schema)


def _sql_type_of(arrow_type: pa.DataType) -> str:
    if pa.types.is_integer(arrow_type):
        return "BIGINT" if arrow_type.bit_width == 64 else "INTEGER"
    return "VARCHAR"


def _column(name: str, arrow_type: pa.DataType, sql_type: str) -> ResultColumn:
    return ResultColumn(name, arrow_type, sql_type)


@contextlib.contextmanager
def _stand_ins(plan: Plan, cursor: Any, database: Any) -> Iterator[None]:
    """Empty tables of the right schema under the names the plan's queries read."""
    names: list[str] = []
    if all(op.projection is not None for op in plan.operations if isinstance(op, RunQuery)):
        yield  # no query reaches DuckDB
        return
    try:
        for operation in plan.operations:
            if isinstance(operation, ReadRecords):
                names.append(operation.placeholder)
                tables.register(cursor, operation.placeholder, TOPIC_SCHEMA.empty_table())
            elif isinstance(operation, RunQuery):
                for view in operation.system_views:
                    schema = introspection.SYSTEM_VIEWS[view](database).schema
                    names.append(f"__sys_{view}")
                    tables.register(cursor, f"__sys_{view}", schema.empty_table())
        yield
    finally:
        for name in names:
            with contextlib.suppress(TopicbaseError):
                tables.unregister(cursor, name)
