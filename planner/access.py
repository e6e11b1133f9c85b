"""Which relations a DuckDB statement touches, and with which privilege.

``relation_access(sql)`` reads one statement with sqlglot and says, for every table or
view it names, what PostgreSQL would check: ``SELECT``, ``INSERT``, ``UPDATE``,
``DELETE``, ``CREATE`` (a new table or view: CREATE on its schema), ``OWN`` (DROP,
ALTER, CREATE INDEX, CREATE OR REPLACE, COMMENT ON: only the owner) or ``SUPERUSER`` (statements
whose objects are not tables and views: schemas, sequences, macros, types). A statement
whose relations cannot be known from its tree (sqlglot cannot read it, or a table
function that takes a relation's name as a string) gets ``Access.opaque`` set: the
engine refuses it to anyone but a superuser rather than guess.

Names are as the statement wrote them, lower-cased unless quoted, normalised to
``schema.name`` without the database (``tables.main.t`` and ``main.t`` are ``t``);
names in DuckDB's and PostgreSQL's catalogs (``pg_catalog``, ``information_schema``)
and ``sys.`` views are left out; a temporary object named as one (``temp.t``,
``temp.main.t``) is ``temp.main.t``; a temporary table or view a CREATE makes is not
among what it creates (it has no owner row), and so is a name that refers to a
common table expression in scope (``WITH t AS (...) SELECT * FROM t`` reads no table
``t``; inside the CTE's own definition ``t`` is the table again, unless RECURSIVE).

Pure functions of the SQL text, cached; no I/O; thread-safe.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import sqlglot
from sqlglot import expressions as exp

from grammar.text_cache import text_cache
from planner.duckdb_sql import parse_duckdb
from planner.front_work import find_all
from planner.nested_writes import nested_writes
from planner.star_expansion import star_columns

DATABASE_NAME = "tables"  # DuckDB's name of the tables file (engine.tables.TABLES_FILE)
ANALYSIS_CACHE_ENTRIES = 1024
_CATALOG_SCHEMAS = frozenset({"pg_catalog", "information_schema", "sys"})
_TEMP_CATALOGS = frozenset({"temp", "system"})
TEMPORARY_CATALOG = "temp"  # names of the session's temporary objects: ``temp.<schema>.<name>``
# Table functions that read a relation named by a string: no tree shows which.
_RELATION_BY_STRING = frozenset({"query", "query_table"})
# Statements that read no table's rows (settings, catalog listings, transaction control).
_NO_DATA = (exp.Set, exp.Show, exp.Pragma, exp.Use, exp.Describe, exp.Transaction,
            exp.Commit, exp.Rollback)  # fmt: skip
_PASSIVE_COMMANDS = frozenset(
    {"EXECUTE", "DEALLOCATE", "RESET", "CHECKPOINT", "SHOW", "SET", "DESCRIBE"}
)


@dataclass(frozen=True)
class Access:
    """What one statement needs: (relation, privilege) pairs, and what it creates."""

    needs: tuple[tuple[str, str], ...]
    created: tuple[tuple[str, str], ...] = ()  # (relation, "table" | "view")
    dropped: tuple[str, ...] = ()
    renamed: tuple[tuple[str, str], ...] = ()  # (old, new)
    opaque: str | None = None  # why the relations cannot be known
    # How many times each relation is read in the text (a view read twice is expanded
    # twice by DuckDB's binder: ``engine.privileges`` bounds what a statement expands to),
    # a read inside a NOT MATERIALIZED common table expression counted once for each copy
    # DuckDB binds of it (``_inline_weights``).
    reads: tuple[tuple[str, int], ...] = ()
    # References to common table expressions, counted the same way: each binds a copy
    # of a NOT MATERIALIZED one (round 26: a chain of such CTEs is 2^n, no relation read).
    cte_reads: int = 0
    # Columns its SELECTs make with their stars expanded, a relation counted as one
    # column (``planner.star_expansion``: stars over self-joins double at each level).
    star_columns: int = 0


@text_cache(ANALYSIS_CACHE_ENTRIES)
def relation_access(sql: str) -> Access:
    try:
        tree = parse_duckdb(sql)
    except (sqlglot.errors.SqlglotError, IndexError):  # sqlglot trips on some DuckDB forms
        word = _first_word(sql)
        return Access(()) if word in _PASSIVE_COMMANDS else Access((), opaque=word)
    if tree is None or isinstance(tree, _NO_DATA):
        return Access(())
    if isinstance(tree, exp.Command):
        return _command_access(tree, sql)
    if isinstance(tree, exp.Column) and _first_word(sql) == "CHECKPOINT":
        return Access(())
    for function in find_all(tree, exp.Anonymous, exp.Func):
        name = (function.name if isinstance(function, exp.Anonymous) else "").lower()
        if name in _RELATION_BY_STRING:
            return Access((), opaque=f"{name}()")
    return _tree_access(tree)


@text_cache(ANALYSIS_CACHE_ENTRIES)
def view_reads(create_sql: str) -> Access:
    """What the query of a view (DuckDB's ``CREATE VIEW ... AS query`` text) reads."""
    try:
        tree = parse_duckdb(create_sql)
    except sqlglot.errors.ParseError:
        return Access((), opaque="a view sqlglot cannot read")
    query = tree.expression if isinstance(tree, exp.Create) else None
    if query is None:
        return Access((), opaque="a view sqlglot cannot read")
    return _tree_access(query)


def _first_word(sql: str) -> str:
    words = sql.split(None, 1)
    return words[0].upper() if words else ""


def _command_access(tree: exp.Command, sql: str) -> Access:
    """``EXPLAIN [ANALYZE] stmt`` and ``PREPARE name AS stmt`` need what ``stmt`` needs."""
    verb = str(tree.this).upper()
    rest = tree.expression.name if isinstance(tree.expression, exp.Literal) else str(
        tree.expression or ""
    )
    if verb == "EXPLAIN":
        words = rest.split(None, 1)
        inner = words[1] if words and words[0].upper() == "ANALYZE" and len(words) > 1 else rest
        return relation_access(inner)
    if verb == "PREPARE":
        parts = rest.split(None, 2)
        if len(parts) == 3 and parts[1].upper() == "AS":
            return relation_access(parts[2])
        return Access((), opaque=verb)
    if verb in _PASSIVE_COMMANDS:
        return Access(())
    return Access((), opaque=verb)


def _tree_access(tree: exp.Expression) -> Access:
    needs: list[tuple[str, str]] = []
    created: list[tuple[str, str]] = []
    dropped: list[str] = []
    renamed: list[tuple[str, str]] = []
    target_node = _target(tree)
    target = _relation_name(target_node) if target_node is not None else None
    if isinstance(tree, exp.Create):
        kind = str(tree.args.get("kind") or "TABLE").upper()
        if kind == "INDEX":
            table = tree.find(exp.Table)
            if table is not None and (name := _relation_name(table)) is not None:
                return Access(((name, "OWN"),))
            return Access(())
        elif kind not in ("TABLE", "VIEW"):
            return Access((), opaque=f"CREATE {kind}")
        elif kind == "VIEW" and _temporary(tree):
            # Its reads would be checked at use as its owner's, but it has no owner row
            # and shadows names inside other views too: for superusers only.
            return Access((), opaque="CREATE TEMPORARY VIEW")
        elif (target is not None and not _temporary(tree)
              and not target.startswith(f"{TEMPORARY_CATALOG}.")):  # DuckDB refuses those
            if tree.args.get("replace"):
                needs.append((target, "OWN"))
            needs.append((target, "CREATE"))
            created.append((target, kind.lower()))
        if kind == "VIEW":
            # PostgreSQL checks a view's relations when it is used, as its owner.
            return Access(tuple(needs), tuple(created))
    elif isinstance(tree, exp.Drop):
        kind = str(tree.args.get("kind") or "TABLE").upper()
        if kind not in ("TABLE", "VIEW"):
            return Access((), opaque=f"DROP {kind}")
        for table in tree.args.get("tables") or ():
            if (name := _relation_name(table)) is not None:
                needs.append((name, "OWN"))
                dropped.append(name)
        return Access(tuple(dict.fromkeys(needs)), dropped=tuple(dropped))
    elif isinstance(tree, exp.Alter):
        if target is not None:
            needs.append((target, "OWN"))
            for action in tree.args.get("actions") or ():
                if isinstance(action, exp.AlterRename) and isinstance(action.this, exp.Table):
                    new = _relation_name(action.this)
                    if new is not None:
                        renamed.append((target, new))
    elif isinstance(tree, exp.Comment):
        return _comment_access(tree)
    elif isinstance(tree, exp.Copy) and isinstance(tree.this, exp.Table):
        if (name := _relation_name(tree.this)) is not None:
            needs.append((name, "INSERT" if tree.args.get("kind") else "SELECT"))
        target_node = tree.this
    elif target is not None:
        needs.extend((target, privilege) for privilege in _write_privileges(tree))
    # A write nested below the root (``WITH u AS (UPDATE t ...)``) needs its own
    # privileges on its target; the planner refuses such statements, this is the
    # second line.
    written = {id(target_node)} if target_node is not None else set()
    for nested in nested_writes(tree):
        if (node := _target(nested)) is not None and (name := _relation_name(node)) is not None:
            needs.extend((name, privilege) for privilege in _write_privileges(nested))
            written.add(id(node))
    reads: dict[str, int] = {}
    named: dict[int, tuple[exp.Table, exp.CTE]] = {}  # CTE references, by id of the table
    relations: list[tuple[exp.Table, str]] = []
    for table in find_all(tree, exp.Table):
        if id(table) in written or isinstance(table.parent, exp.AlterRename):
            continue
        name = _relation_name(table)
        if name is None:
            continue
        cte = _cte_named(table)
        if cte is None:
            needs.append((name, "SELECT"))
            relations.append((table, name))
        else:
            named[id(table)] = (table, cte)
    weight = _inline_weights(named.values())
    for table, name in relations:
        reads[name] = reads.get(name, 0) + weight(table)
    cte_reads = sum(weight(table) for table, _ in named.values())
    return Access(tuple(dict.fromkeys(needs)), tuple(created), tuple(dropped), tuple(renamed),
                  reads=tuple(reads.items()), cte_reads=cte_reads,
                  star_columns=star_columns(tree, _cte_named))  # fmt: skip


# Copies counted past this are as good as infinite (no big-number arithmetic on 2^n).
_WEIGHT_MAX = 1 << 62


def _inline_weights(
    references: Iterable[tuple[exp.Table, exp.CTE]],
) -> Callable[[exp.Expression], int]:
    """How many copies of a node DuckDB's binder binds: 1 outside common table expressions;
    inside a CTE's body, the copies of that CTE. A NOT MATERIALIZED CTE is inlined at each
    reference, so its copies are the sum, over its references (outside its own body), of
    the copies of the place each stands in; any other CTE is bound once where it is
    defined (DuckDB 2.0 materializes one read twice: measured, round 26), so its copies are
    those of its definition's place. Iterative (a chain of thousands of CTEs recurses
    nowhere); a cycle (a RECURSIVE WITH naming a later CTE) counts once; capped at
    ``_WEIGHT_MAX``. Linear in the references and the nodes' depth."""
    refs: dict[int, list[exp.Table]] = {}
    for table, cte in references:
        refs.setdefault(id(cte), []).append(table)
    known: dict[int, int] = {}

    def enclosing(node: exp.Expression) -> exp.CTE | None:
        parent = node.parent
        while parent is not None and not isinstance(parent, exp.CTE):
            parent = parent.parent
        return parent

    def sources(cte: exp.CTE) -> list[exp.CTE | None]:
        """The CTEs (None: none) whose copies make ``cte``'s."""
        if cte.args.get("materialized") is not False:
            return [enclosing(cte)]
        return [enclosing(table) for table in refs.get(id(cte), ()) if not _within(table, cte)]

    def weight_of(cte: exp.CTE | None) -> int:
        if cte is None:
            return 1
        if id(cte) in known:
            return known[id(cte)]
        stack: list[exp.CTE] = [cte]
        started: set[int] = set()
        while stack:
            current = stack[-1]
            if id(current) in known:
                stack.pop()
                continue
            pending = [s for s in sources(current) if s is not None and id(s) not in known
                       and id(s) not in started]  # fmt: skip
            if pending and id(current) not in started:
                started.add(id(current))
                stack.extend(pending)
                continue
            total = sum(known.get(id(s), 1) if s is not None else 1 for s in sources(current))
            known[id(current)] = min(total, _WEIGHT_MAX)
            stack.pop()
        return known[id(cte)]

    return lambda node: weight_of(enclosing(node))


def _within(node: exp.Expression, ancestor: exp.Expression) -> bool:
    parent = node.parent
    while parent is not None:
        if parent is ancestor:
            return True
        parent = parent.parent
    return False


def _comment_access(tree: exp.Comment) -> Access:
    """COMMENT ON is for the object's owner, as in PostgreSQL: a table or view (a column's
    table); any other kind (schemas, macros, sequences, indexes) for superusers."""
    kind = str(tree.args.get("kind") or "").upper()
    node = tree.this
    if kind == "COLUMN" and isinstance(node, exp.Column) and node.table:
        column = node.copy()  # a node put in a new one is moved there: the tree is shared
        node = exp.Table(this=column.args["table"], db=column.args.get("db"),
                         catalog=column.args.get("catalog"))  # fmt: skip
    elif kind not in ("TABLE", "VIEW"):
        return Access((), opaque=f"COMMENT ON {kind or '?'}")
    name = _relation_name(node) if isinstance(node, exp.Table) else None
    if name is None:
        return Access((), opaque=f"COMMENT ON {kind}")
    return Access(((name, "OWN"),))


def _target(tree: exp.Expression) -> exp.Table | None:
    """The relation a writing statement writes (or creates, drops, alters)."""
    if not isinstance(tree, exp.Insert | exp.Update | exp.Delete | exp.Merge | exp.Create
                      | exp.Drop | exp.Alter | exp.TruncateTable):  # fmt: skip
        return None
    node = tree.this
    if isinstance(tree, exp.TruncateTable):
        node = tree.expressions[0] if tree.expressions else None
    if isinstance(node, exp.Schema):
        node = node.this
    return node if isinstance(node, exp.Table) and node.name else None


def _temporary(tree: exp.Create) -> bool:
    properties = tree.args.get("properties")
    return properties is not None and any(
        isinstance(p, exp.TemporaryProperty) for p in properties.expressions
    )


def _write_privileges(tree: exp.Expression) -> tuple[str, ...]:
    """PostgreSQL's privileges on the written relation; SELECT when its rows are read
    (a WHERE, RETURNING, a MERGE condition, an ON CONFLICT update)."""
    reads = bool(tree.args.get("where") or tree.args.get("returning"))
    if isinstance(tree, exp.Insert):
        conflict = tree.args.get("conflict")
        updates = conflict is not None and "UPDATE" in conflict.sql(dialect="duckdb").upper()
        # INSERT OR REPLACE is DuckDB's ON CONFLICT DO UPDATE of every column.
        updates = updates or str(tree.args.get("alternative") or "").upper() == "REPLACE"
        return ("INSERT",) + (("UPDATE", "SELECT") if updates else ()) + (
            ("SELECT",) if tree.args.get("returning") else ()
        )
    if isinstance(tree, exp.Update):
        reads = reads or bool(tree.args.get("from") or tree.args.get("from_"))
        reads = reads or any(
            True for e in tree.expressions for _ in e.expression.find_all(exp.Column)
        )
        return ("UPDATE",) + (("SELECT",) if reads else ())
    if isinstance(tree, exp.Delete | exp.TruncateTable):
        return ("DELETE",) + (("SELECT",) if reads else ())
    assert isinstance(tree, exp.Merge)
    text = " ".join(w.sql(dialect="duckdb").upper() for w in find_all(tree, exp.When))
    wanted = [p for p in ("INSERT", "UPDATE", "DELETE") if p in text]
    return (*wanted, "SELECT")


def _relation_name(table: exp.Table) -> str | None:
    """``schema.name`` (``name`` in main) of a user relation, ``temp.<schema>.name`` of a
    temporary one named so; None for catalogs and table functions."""
    if not table.name or not isinstance(table.this, exp.Identifier):
        return None
    catalog = table.catalog.lower() if table.catalog else ""
    schema = table.db.lower() if table.db else ""
    if catalog == "temp" or (not catalog and schema == "temp"):
        # The session's own temporary objects (``temp.main.t``): named so that the
        # door can check what a temporary view reads (``engine.privileges``).
        inner = schema if catalog and schema not in ("", "temp") else "main"
        return f"{TEMPORARY_CATALOG}.{inner}.{_case(table.this)}"
    if catalog in _TEMP_CATALOGS or schema in _CATALOG_SCHEMAS:
        return None
    if catalog and catalog != DATABASE_NAME:
        return f"{catalog}.{schema}.{_case(table.this)}"  # another database: never granted
    name = _case(table.this)
    return name if schema in ("", "main") else f"{schema}.{name}"


def relation_name(table: exp.Table) -> str | None:
    """The name ``Access.needs`` and ``Access.reads`` give the relation ``table`` names
    (None for catalogs and table functions)."""
    return _relation_name(table)


def _case(identifier: exp.Identifier) -> str:
    """DuckDB's names are case-insensitive: one spelling for the catalog's keys."""
    return str(identifier.this).lower()


def _cte_named(table: exp.Table) -> exp.CTE | None:
    """The common table expression in scope this unqualified name refers to (None: a
    relation's name)."""
    if table.db or table.catalog:
        return None
    name = _case(table.this)
    child: exp.Expression = table
    node = table.parent
    inside: exp.With | None = None
    while node is not None:
        if isinstance(node, exp.With):
            ctes = list(node.expressions)
            index = next((i for i, c in enumerate(ctes) if c is child), len(ctes))
            visible = ctes[: index + 1] if node.args.get("recursive") else ctes[:index]
            found = _cte_of(visible, name)
            if found is not None:
                return found
            inside = node
        else:
            with_ = node.args.get("with") or node.args.get("with_")
            if isinstance(with_, exp.With) and with_ is not inside:
                found = _cte_of(with_.expressions, name)
                if found is not None:
                    return found
        child, node = node, node.parent
    return None


def _cte_of(ctes: list[exp.Expression], name: str) -> exp.CTE | None:
    """The last of ``ctes`` called ``name`` (lower case), if any."""
    found = None
    for cte in ctes:
        if isinstance(cte, exp.CTE) and cte.alias_or_name.lower() == name:
            found = cte
    return found
