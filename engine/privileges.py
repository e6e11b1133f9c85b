"""Privileges: owners and GRANTs, checked for every relation a statement touches.

PostgreSQL 15's model. Every topic, table and view has an owner (its creator, recorded
in the same transaction as its CREATE, see ``record_ddl``); the owner and superusers may
do everything to it, others what ``GRANT`` gave them or PUBLIC. Creating a table, view
or topic needs CREATE on the schema (``GRANT CREATE ON SCHEMA main TO u``, which only
superusers start); DROP and ALTER of a table need ownership; ALTER TOPIC needs ALTER or
ownership, DROP TOPIC ownership. A view is read with the privileges of its owner on what
it reads (the reader needs SELECT on the view only). Statements whose relations cannot
be known from their tree (``planner.access``: schemas, macros, ``query_table('t')``…)
are for superusers only.

``check_plan`` runs for every plan before anything of it runs (``Session._guard``) and
``require`` for doors without a plan. Refusals are 42501 naming the object and the
privilege. Owners and grants are read through the session's own DuckDB cursor, so a
transaction sees its own GRANTs and a rolled-back GRANT never existed.

Invariants: a superuser is never refused here (the sandbox still applies); nothing is
read from or written to DuckDB for a superuser's statement except the owner rows of
the objects it creates or drops.
"""

from __future__ import annotations

import dataclasses
import re
import weakref
from collections.abc import Callable
from typing import Any

import sqlglot
from sqlglot import expressions as exp

from engine import privilege_cache, sandbox, tables
from engine.catalog import OWNER_SUPERUSER, SCHEMA
from engine.identity import Identity
from grammar.bounded_cache import BoundedCache
from grammar.text_cache import text_cache
from planner.access import (
    DATABASE_NAME,
    Access,
    relation_access,
    relation_name,
    view_reads,
)
from planner.alias_expansion import MacroCost, token_name
from planner.duckdb_sql import parse_duckdb
from planner.operations import (
    AlterTopicEntry,
    AppendRecords,
    ChangePrivileges,
    CommitConsumerOffsets,
    CreateTopicEntry,
    DropTopicEntry,
    Introspect,
    Plan,
    ReadRecords,
    RunQuery,
    SetConsumerOffsets,
    SwitchRole,
    TransactionControl,
)
from planner.plan_relations import largest_join_with_views
from planner.write_statements import AbortStagedWrites, CommitStagedWrites
from storage import limits
from storage.errors import InsufficientPrivilegeError, LimitExceededError
from storage.limits import PLAN_RELATIONS_MAX

_DDL_TAGS = ("CREATE", "DROP", "ALTER")
CALL_NAMES_CACHE_ENTRIES = 1024  # texts whose macro-calling names are kept (a frozenset each)
VIEW_JOINS_CACHE_ENTRIES = 1024  # (text, its views' counts) whose join graph is kept (an int)
_EXECUTE_WORD = re.compile(r"\bEXECUTE\b", re.IGNORECASE)
# Touch no relation (transactions, SHOW/DESCRIBE TOPIC: catalogs are everyone's), are
# judged when they run (GRANT/REVOKE and SET ROLE: engine.grants), or name no topic
# (DROP TOPIC IF EXISTS of none; one that exists is checked above).
_UNCHECKED = (TransactionControl, Introspect, ChangePrivileges, SwitchRole, DropTopicEntry,
              CommitStagedWrites, AbortStagedWrites)  # engine.bulk_write checks the writes
_KIND_NAMESPACE = {"table": "relation", "view": "relation", "topic": "topic", "schema": "schema",
                   "sequence": "sequence"}  # fmt: skip

# Who is a superuser, by name, for a database, and which users exist: the wire server
# registers its users file's answers (a view owner's status is looked up when the view
# is read; sys.roles lists the users).
_role_lookups: weakref.WeakKeyDictionary[Any, Callable[[str], bool]] = (
    weakref.WeakKeyDictionary()
)
_role_listings: weakref.WeakKeyDictionary[Any, Callable[[], list[str]]] = (
    weakref.WeakKeyDictionary()
)
_role_limits: weakref.WeakKeyDictionary[Any, Callable[[str], int | None]] = (
    weakref.WeakKeyDictionary()
)


def use_role_lookup(database: Any, lookup: Callable[[str], bool],
                    listing: Callable[[], list[str]] | None = None,
                    connection_limit: Callable[[str], int | None] | None = None,
                    ) -> None:  # fmt: skip
    """Tell the engine how to learn whether a user name is a superuser, (``listing``)
    which users there are and (``connection_limit``) a user's own connection limit (None:
    none): the users file."""
    _role_lookups[database] = lookup
    if listing is not None:
        _role_listings[database] = listing
    if connection_limit is not None:
        _role_limits[database] = connection_limit


def known_roles(database: Any) -> list[str]:
    listing = _role_listings.get(database)
    return [] if listing is None else listing()


def connection_limit_of(database: Any, name: str) -> int | None:
    """A user's own connection limit as the users file says (None: none, or no file)."""
    limit = _role_limits.get(database)
    return None if limit is None else limit(name)


def is_superuser_name(database: Any, name: str) -> bool:
    if name == OWNER_SUPERUSER:
        return True
    lookup = _role_lookups.get(database)
    return lookup is not None and lookup(name)


# -- the checks --------------------------------------------------------------------------
# Sessions that changed role inside a transaction block: (that transaction, how to undo
# it), settled at the session's next statement once the transaction ended (engine.grants).
role_undo: weakref.WeakKeyDictionary[Any, tuple[Any, Callable[[], None]]] = (
    weakref.WeakKeyDictionary()
)


def settled_identity(session: Any) -> Identity:
    """The identity the door checks ``session``'s next statement with: its identity, once
    a SET ROLE of a transaction that rolled back is undone (``_settle_role``). Both checks
    of a statement use it (``Session._guard``), so the sandbox and the privileges judge
    the same identity."""
    # ``role_undo.data``: its dict, whose emptiness costs no Python call (``len`` of the
    # WeakKeyDictionary runs one); a dead entry only sends us to the exact test.
    if role_undo.data and session in role_undo:
        return _settle_role(session)
    return session.identity  # type: ignore[no-any-return]


def kept_decision(plan: Plan, identity: Identity, session: Any, memo: BoundedCache) -> bool:
    """Whether ``memo`` holds a decision to let ``plan`` through for ``identity`` that still
    stands, by ``check_plan``'s rules for its memo: the same plan and identity objects, not
    inside an explicit transaction, the session's names resolving plainly, and the
    privilege cache's stamp as it was when the decision was made. False: check in full.

    The whole test of a hit, in one call (``Session._guard`` asks it before either check,
    and its memo is filled only after the sandbox let the same plan through for the same
    identity: see ``Session.door_memo``)."""
    kept = memo.get(id(plan))
    if kept is None or kept[0] is not plan or kept[1] is not identity:
        return False
    transaction = session.transaction
    if transaction is not None and transaction.explicit:
        # Defence in depth (review R2-18 F3): no decision is kept inside an explicit
        # transaction (``check_plan``), and one kept before it stands only while nothing
        # changed; this refuses the memo there outright, as ``check_plan`` does (R3-17-1).
        return False
    return bool(session.names_resolve_plainly()) and kept[2] == privilege_cache.stamp(session)


def check_plan(plan: Plan, identity: Identity, session: Any,
               memo: BoundedCache | None = None) -> None:  # fmt: skip
    """Refuse (42501) a plan that touches a relation ``identity`` has no privilege on.

    ``memo``: the session's decisions on plans it keeps and checks again on every run
    (``Session.answer_lookup``, a kept literal SELECT, ``engine.kept_plans``). A plan
    allowed here is let through again at once while the plan and the identity are the
    same objects (both immutable; SET ROLE and SET SESSION AUTHORIZATION replace the
    identity) and the privilege cache's stamp stands (``privilege_cache.stamp``: no
    GRANT, REVOKE, DDL of a relation or topic began since, and no such transaction is
    open), and only for a decision made of nothing else (``_decided_by_cache``: tables'
    and topics' owners and grants; no view, whose owner's superuser status the users file
    gives, no EXECUTE, no ownership test), and only while the session's names resolve
    plainly (``Session.names_resolve_plainly``: else a name is checked wherever DuckDB may
    find it, and the session's temporary views too, read from DuckDB every time).
    Refusals are never kept, and nothing is kept or used inside an explicit transaction
    (its decisions stand on its snapshot, not on the current stamp)."""
    # ``role_undo.data``: its dict, whose emptiness costs no Python call (``len`` of the
    # WeakKeyDictionary runs one); a dead entry only sends us to the exact test.
    if role_undo.data and session in role_undo:
        identity = _settle_role(session)
    if identity.superuser:
        return
    transaction = getattr(session, "transaction", None)
    if memo is not None and transaction is not None and transaction.explicit:
        # An explicit transaction decides on its own snapshot of owners and grants, which
        # may predate the current stamp (a REVOKE committed since): such a decision must
        # not be kept under that stamp for the runs after its COMMIT (review R3-17-1).
        memo = None
    stamp = None
    if memo is not None and session.names_resolve_plainly():
        stamp = privilege_cache.stamp(session)
        if stamp is not None:
            kept = memo.get(id(plan))
            if kept is not None and kept[0] is plan and kept[1] is identity and kept[2] == stamp:
                return
    _check_operations(plan, identity, session)
    if memo is not None and stamp is not None and _decided_by_cache(plan, identity, session):
        # holds the plan (its id is not reused meanwhile) and the identity
        memo.put(id(plan), (plan, identity, stamp), limits.DOOR_DECISION_BYTES)


def _decided_by_cache(plan: Plan, identity: Identity, session: Any) -> bool:
    """Whether ``check_plan``'s decision on ``plan`` (allowed) was made of the identity,
    the plan's texts and ``_facts`` of tables and topics alone (all under
    ``privilege_cache.stamp``): topic reads and writes (``_require_topic``: a topic's
    owner and grants, its existence from the catalog, whose count of topics created and
    dropped is part of the stamp), transaction control (nothing), and queries, none an
    EXECUTE (its statements are the session's DuckDB's), each needing SELECT, INSERT,
    UPDATE or DELETE on relations that are tables or do not exist (a view's check asks
    the users file whether its owner is a superuser), in a session whose names resolve
    plainly (each name was checked as itself alone)."""
    if not session.names_resolve_plainly():
        return False
    for operation in plan.operations:
        if isinstance(operation, _MEMO_OPERATIONS):
            continue
        if not isinstance(operation, RunQuery) or _executed_name(operation.sql) is not None:
            return False
        if _SEQUENCE_WORD.search(operation.sql) is not None:
            return False  # a sequence's existence is no fact of the stamp's
        access = relation_access(operation.sql)
        if access.opaque is not None:
            return False
        for name, privilege in access.needs:
            if privilege not in _MEMO_PRIVILEGES:
                return False
            found, _ = _facts(session, "relation", name, identity.name)
            if found is not None and found[1] != "table":
                return False
    return True


_MEMO_PRIVILEGES = frozenset({"SELECT", "INSERT", "UPDATE", "DELETE"})


_TOPIC_READS = (ReadRecords, CommitConsumerOffsets, SetConsumerOffsets)
# Operations whose check (``_check_operations``) reads nothing but ``_facts`` of a topic
# (SELECT or INSERT on it), or nothing at all: a decision of them may be kept.
_MEMO_OPERATIONS = (*_TOPIC_READS, AppendRecords, TransactionControl)


def _check_operations(plan: Plan, identity: Identity, session: Any) -> None:
    """``check_plan``'s checks of every operation, for ``identity`` (no superuser)."""
    placeholders = {op.placeholder for op in plan.operations if isinstance(op, ReadRecords)}
    for operation in plan.operations:
        if type(operation) is RunQuery:  # the usual operation, first (a class of its own)
            _check_query(session, identity, operation, placeholders)
        elif isinstance(operation, _TOPIC_READS):
            _require_topic(session, identity, operation.topic, "SELECT")
        elif isinstance(operation, AppendRecords):
            _require_topic(session, identity, operation.topic, "INSERT")
        elif isinstance(operation, CreateTopicEntry):
            _require_schema_create(session, identity, "main")
        elif isinstance(operation, AlterTopicEntry):
            _require_topic(session, identity, operation.name, "ALTER")
        elif isinstance(operation, DropTopicEntry) and operation.topic_id is not None:
            _require_owner(session, identity, "topic", operation.name)
        elif isinstance(operation, RunQuery):
            _check_query(session, identity, operation, placeholders)
        elif not isinstance(operation, _UNCHECKED):
            # An operation this module does not know yet is refused, never let through.
            raise InsufficientPrivilegeError(
                f"permission denied: {type(operation).__name__} is for superusers"
            )


def _settle_role(session: Any) -> Identity:
    """Undo a SET ROLE of a transaction that rolled back; the identity to check."""
    transaction, undo = role_undo[session]
    if session.transaction is not transaction:
        del role_undo[session]
        if not transaction.committed:
            undo()
    return session.identity  # type: ignore[no-any-return]


def require(session: Any, kind: str, name: str, privilege: str) -> None:
    """Refuse (42501, naming the object and the privilege) unless the session's identity
    holds ``privilege`` on the ``kind`` ('topic' or 'table') called ``name``. For doors
    that act on relations without a SQL plan (the Flight door's reads and writes)."""
    identity = session.identity
    if identity.superuser:
        return
    if kind == "topic":
        _require_topic(session, identity, name, privilege.upper())
        return
    parts = name.lower().split(".")
    if parts[:1] == [DATABASE_NAME] and len(parts) == 3:
        parts = parts[1:]
    if parts[:1] == ["main"] and len(parts) == 2:
        parts = parts[1:]  # main.t and tables.main.t are t, as planner.access names them
    _require_relation(session, identity.name, ".".join(parts), privilege.upper(), 0)


def _check_query(
    session: Any, identity: Identity, operation: RunQuery, placeholders: set[str]
) -> None:
    executed = _executed_name(operation.sql)
    if executed is not None:  # judged as what it runs, now (PostgreSQL checks at EXECUTE)
        for inner in _prepared_statements(session, executed, operation.sql):
            if _executed_name(inner) is not None:  # DuckDB never holds one; never loop
                raise InsufficientPrivilegeError("permission denied: EXECUTE of an EXECUTE")
            # The sandbox's rules for the caller too: a superuser's PREPARE (of
            # ``current_setting``, say) run after SET ROLE is judged as the role's.
            sandbox.check_sql(inner, superuser=False)
            _check_query(session, identity, dataclasses.replace(operation, sql=inner),
                         placeholders)  # fmt: skip
        return
    access = relation_access(operation.sql)
    if access.opaque is not None:
        raise InsufficientPrivilegeError(
            f"permission denied: {access.opaque} is for superusers (the relations it "
            "touches cannot be checked)"
        )
    plain = session.names_resolve_plainly()
    own = placeholders | {f"__sys_{v}" for v in operation.system_views}  # not DuckDB's
    for name, privilege in access.needs:
        if name in own:
            continue
        if privilege == "CREATE":
            _require_schema_create(session, identity, _schema_of(name))
            continue
        for candidate in (name,) if plain else _candidates(session, name):
            if privilege == "OWN":
                _require_owner(session, identity, "relation", candidate)
            else:
                _require_relation(session, identity.name, candidate, privilege, 0)
    _require_macro_reads(session, identity.name, operation.sql, 0)
    _require_sequences(session, identity.name, operation.sql)
    _refuse_view_expansion(session, identity.name, access, own)
    _refuse_view_predicates(session, identity.name, operation.sql, access, own)
    _refuse_large_join_of_views(session, identity.name, operation.sql, access, own)
    if not plain:
        _require_temporary_views(session, identity)
        _refuse_shadowed_view_reads(session, [name for name, _ in access.needs])


def _names_fact(session: Any, key: tuple[Any, ...], read: Callable[[], Any]) -> Any:
    """``read()``'s value, kept per session while what it read from DuckDB's catalog
    stands: the privilege cache's stamp (no DDL of a relation or topic began since, none
    open: ``privilege_cache.stamp``) and the session's ``names_epoch`` (moved by every
    statement after which its names may resolve anew: SET search_path or schema, CREATE
    TEMPORARY, DISCARD ALL). Without it a session with a temporary table paid ~6 ms of
    catalog queries a statement. A value read inside an explicit transaction whose
    snapshot predates the stamp is not kept."""
    stamp = privilege_cache.stamp(session)
    if stamp is None:
        return read()
    facts: dict[tuple[Any, ...], Any] = session.names_facts
    basis = (stamp, session.names_epoch)
    if facts.get(("basis",)) != basis:
        facts.clear()
        facts[("basis",)] = basis
    if key in facts:
        return facts[key]
    value = read()
    transaction = getattr(session, "transaction", None)
    if (transaction is not None and transaction.explicit
            and transaction.privilege_generation != stamp[0]):  # fmt: skip
        # Read on the transaction's snapshot, older than the stamp: not kept under it for
        # the statements after its COMMIT (review R4-17-1; ``privilege_cache.cached``'s
        # rule for a stale snapshot).
        return value
    if len(facts) >= limits.NAMES_FACTS_MAX:
        facts.clear()
        facts[("basis",)] = basis
    facts[key] = value
    return value


def _candidates(session: Any, name: str) -> tuple[str, ...]:
    return _names_fact(  # type: ignore[no-any-return]
        session, ("candidates", name), lambda: _read_candidates(session, name)
    )


def _read_candidates(session: Any, name: str) -> tuple[str, ...]:
    """Every relation ``name`` (as ``planner.access`` names it) may resolve to in a session
    whose names do not resolve as a fresh connection's (``Session.names_resolve_plainly``:
    another ``search_path`` or ``schema``, temporary relations): the name itself and each
    existing table or view of that name where DuckDB may find it (``x`` and ``main.x`` in
    main or any schema of the search path; ``s.x`` in ``s`` only). The
    door checks them all: whichever DuckDB picks was checked (a name shadowed by another
    the user may not use is refused, where PostgreSQL would look at the one it finds).
    Temporary relations are checked by ``_require_temporary_views``."""
    schema, _, bare = name.rpartition(".")
    if "." in schema:  # another database's or a temporary relation: as named
        return (name,)
    # An unqualified name (``main.x`` is one to ``planner.access``) may be found in main
    # or in any schema of the search path (``current_schemas``: the schema set by SET
    # schema leads it); a qualified one in its schema.
    rows = _rows(
        session,
        "WITH path AS (SELECT unnest(CASE WHEN ? = '' THEN list_append(current_schemas(false),"
        " 'main') ELSE [?] END) AS schema_name) "
        "SELECT schema_name FROM duckdb_tables() WHERE NOT temporary AND database_name = ? "
        "AND lower(table_name) = ? AND schema_name IN (SELECT schema_name FROM path) UNION "
        "SELECT schema_name FROM duckdb_views() WHERE NOT temporary AND database_name = ? "
        "AND lower(view_name) = ? AND schema_name IN (SELECT schema_name FROM path)",
        [schema, schema, DATABASE_NAME, bare, DATABASE_NAME, bare],
    )
    found = {bare if row[0] == "main" else f"{row[0]}.{bare}" for row in rows}
    return (name, *sorted(found - {name}))


def _require_temporary_views(session: Any, identity: Identity) -> None:
    """In a session with temporary relations, each temporary view may be what a name
    resolves to, in the statement or inside any view it reads (DuckDB looks in the
    session's temporary objects first): every one is checked as the session's current
    user's view, whatever the statement names. Ordinary users cannot create them
    (``planner.access``: CREATE TEMPORARY VIEW is for superusers); this covers a
    superuser's session that switched to an ordinary role after making some."""
    rows = _names_fact(session, ("temporary views",), lambda: _rows(
        session,
        "SELECT view_name, sql FROM duckdb_views() WHERE temporary AND NOT internal",
        [],
    ))  # fmt: skip
    for view_name, sql in rows:
        access = view_reads(sql)
        if access.opaque is not None:
            raise InsufficientPrivilegeError(
                f"permission denied for temporary view {view_name}: its query cannot be "
                f"checked ({access.opaque})"
            )
        for inner, privilege in access.needs:
            for candidate in _candidates(session, inner):
                try:
                    _require_relation(session, identity.name, candidate, privilege, 1)
                except InsufficientPrivilegeError as error:
                    raise InsufficientPrivilegeError(
                        f"{error.message}, for temporary view {view_name}"
                    ) from None


def _refuse_shadowed_view_reads(session: Any, names: list[str]) -> None:
    """Refuse (42501) a statement that reads, through any chain of views, a view one of
    whose names this session's own temporary table or view would replace: DuckDB binds
    a view's names when it is read, temporary relations first, so a temporary ``acl``
    would stand in for the ``acl`` of another user's row-filtering view (review R1-10;
    PostgreSQL binds a view's relations when it is made). Only names a temporary
    relation can take (``x``, ``main.x``) count."""
    registered = tables.registered_names(session.cursor)
    rows = _names_fact(session, ("temporary relations",), lambda: _rows(
        session,
        "SELECT table_name FROM duckdb_tables() WHERE temporary UNION ALL "
        "SELECT view_name FROM duckdb_views() WHERE temporary AND NOT internal",
        [],
    ))  # fmt: skip
    temporary = {str(row[0]).lower() for row in rows if row[0] not in registered}
    if not temporary:
        return
    seen: set[str] = set()
    pending = [(candidate, 0) for name in names for candidate in _candidates(session, name)
               if "." not in candidate.rpartition(".")[0]]  # fmt: skip
    while pending:
        name, depth = pending.pop()
        if name in seen or _relation_kind_fact(session, name) != "view":
            continue
        seen.add(name)
        if depth >= limits.VIEW_DEPTH_MAX:
            raise InsufficientPrivilegeError(
                f"view {name} nests more than {limits.VIEW_DEPTH_MAX} views"
            )
        for inner, _ in _view_access(session, name).needs:
            if "." not in inner and inner in temporary:
                raise InsufficientPrivilegeError(
                    f"permission denied for view {name}: this session's temporary relation "
                    f"{inner} would replace the {inner} it reads; drop or rename it"
                )
            pending.extend((candidate, depth + 1) for candidate in _candidates(session, inner))


def _relation_kind_fact(session: Any, name: str) -> str | None:
    return _names_fact(  # type: ignore[no-any-return]
        session, ("kind", name), lambda: relation_kind(session, name)
    )


def _executed_name(sql: str) -> str | None:
    """The name an ``EXECUTE name [(arguments)]`` runs, read with DuckDB's own lexer
    (comments and quoting as DuckDB sees them), else None."""
    if _EXECUTE_WORD.search(sql) is None:  # cheap: most statements never mention it
        return None
    tokens = tables.sql_tokens(sql)
    if len(tokens) < 2 or tokens[0].text.upper() != "EXECUTE":
        return None
    name = tokens[1].text
    return name[1:-1].replace('""', '"') if name.startswith('"') else name


def _prepared_statements(session: Any, name: str, sql: str) -> list[str]:
    """The statements an EXECUTE of ``name`` may run: the session's SQL-level statement
    kept under that name (``engine.prepared_room``: as the sandbox read it at PREPARE),
    else what DuckDB holds under ``name`` on the session's connection (EXECUTE matches
    names without case; the engine's kept plans), as DuckDB itself renders them."""
    kept = getattr(session, "sql_statements", None)
    key = None if kept is None else kept.executed(sql)  # as the run will find it
    if key is not None:
        statement = kept.statement(key)
        if statement is None:  # the sandbox refuses such a PREPARE: never run unchecked
            raise InsufficientPrivilegeError("permission denied: EXECUTE of an unreadable PREPARE")
        return [statement]
    rows = tables.fetch_rows(
        session.cursor,
        "SELECT statement FROM duckdb_prepared_statements() WHERE lower(name) = lower(?)",
        [name],
    )
    return [str(row[0]) for row in rows]


def _require_topic(session: Any, identity: Identity, topic: str, privilege: str) -> None:
    if not holds(session, identity.name, "topic", topic, privilege):
        raise InsufficientPrivilegeError(
            f"permission denied for topic {topic} ({privilege} privilege needed)"
        )


def _require_schema_create(session: Any, identity: Identity, schema: str) -> None:
    if not holds(session, identity.name, "schema", schema, "CREATE"):
        raise InsufficientPrivilegeError(
            f"permission denied for schema {schema} (CREATE privilege needed; a superuser "
            f"may GRANT CREATE ON SCHEMA {schema} TO {identity.name})"
        )


def _require_owner(session: Any, identity: Identity, namespace: str, name: str) -> None:
    found = owner_of(session, namespace, name)
    if found is not None and found[0] != identity.name:
        raise InsufficientPrivilegeError(f"must be owner of {found[1]} {name}")


def _require_relation(session: Any, user: str, name: str, privilege: str, depth: int,
                      invoker: str | None = None) -> None:  # fmt: skip
    """``privilege`` on table or view ``name``; for a view, its owner's on what it reads;
    and ``invoker``'s (the session's user; default ``user``) on what the macros read that
    its definition calls, a view's through every view below it, a table's in its
    defaults, generated columns and checks (``_require_macros_within``)."""
    found, granted = _facts(session, "relation", name, user)
    if found is None:
        return  # no such relation: DuckDB says so (42P01) when the statement runs
    owner, kind = found
    if owner != user and privilege not in granted:
        raise InsufficientPrivilegeError(
            f"permission denied for {kind} {name} ({privilege} privilege needed)"
        )
    invoker = user if invoker is None else invoker
    if _user_macros(session):
        _require_macros_within(session, invoker, name, kind, depth)
    if kind == "view" or privilege in ("INSERT", "UPDATE"):
        # nextval in a view, or in a table's defaults (which INSERT and UPDATE run): the
        # reader's or writer's privileges on the sequence, as PostgreSQL's
        _require_sequences(session, invoker, _relation_sql(session, name))
    if kind != "view" or is_superuser_name(session.database, owner):
        return
    if depth >= limits.VIEW_DEPTH_MAX:
        raise InsufficientPrivilegeError(
            f"view {name} nests more than {limits.VIEW_DEPTH_MAX} views"
        )
    access = _view_access(session, name)
    if access.opaque is not None:
        raise InsufficientPrivilegeError(
            f"permission denied for view {name}: its query cannot be checked ({access.opaque})"
        )
    for inner, inner_privilege in access.needs:
        try:
            _require_relation(session, owner, inner, inner_privilege, depth + 1, invoker)
        except InsufficientPrivilegeError as error:
            raise InsufficientPrivilegeError(
                f"{error.message}, for view {name} owned by {owner}"
            ) from None


def _require_macro_reads(session: Any, user: str, sql: str, depth: int) -> None:
    """``user``'s privileges on what the macros ``sql`` may call read, as PostgreSQL runs a
    function with its caller's privileges (SECURITY INVOKER): DuckDB expands a macro into
    the statement, so a superuser's ``CREATE MACRO peek() AS TABLE SELECT * FROM t`` would
    otherwise hand ``t`` to anyone who may call it. What may call one: an identifier
    before ``(``, a keyword (DuckDB calls a macro named ``current_user`` without
    parentheses) and an operator (a macro ``"+"`` shadows the built-in); a column named
    like a macro is not a call (review R2 F4). A table named like a macro, written before
    ``(``, gets that macro's body checked too (a refusal, never a leak). Macros calling
    macros are followed to ``limits.VIEW_DEPTH_MAX``."""
    macros = _user_macros(session)
    if not macros:
        return
    called = _call_names(sql) & macros.keys()
    if called and depth == 0:  # their copies of arguments, with the built-ins'
        expanding = _user_macro_costs(session)
        if called & expanding.keys():
            sandbox.refuse_expansion(sql, tables.sql_tokens(sql), expanding, superuser=False)
    for name in sorted(called):
        if depth >= limits.VIEW_DEPTH_MAX:
            raise InsufficientPrivilegeError(
                f"macro {name} nests more than {limits.VIEW_DEPTH_MAX} macros and views"
            )
        for body in macros[name]:
            access = relation_access(body) if body is not None else Access((), opaque="?")
            if access.opaque is not None or body is None:
                raise InsufficientPrivilegeError(
                    f"permission denied for macro {name}: its body cannot be checked"
                )
            # The sandbox's rules for the caller too (its superuser creator passed them as
            # a superuser: DuckDB's settings, current_setting, are a superuser's to read).
            sandbox.check_sql(body, superuser=False)
            for inner, inner_privilege in access.needs:
                try:
                    _require_relation(session, user, inner, inner_privilege, depth + 1)
                except InsufficientPrivilegeError as error:
                    raise InsufficientPrivilegeError(
                        f"{error.message}, read by macro {name}"
                    ) from None
            _require_macro_reads(session, user, body, depth + 1)
            _require_sequences(session, user, body)


def _require_macros_within(session: Any, invoker: str, name: str, kind: str,
                           depth: int) -> None:  # fmt: skip
    """``invoker``'s privileges on what the macros read that relation ``name``'s definition
    calls, and the sandbox's rules for them (DuckDB's CREATE text: a table's defaults,
    generated columns and checks run as the statement's user, as PostgreSQL runs them;
    DuckDB refuses subqueries there, so for a table only a settings reader can be found),
    and for a view the same for every relation it reads, whoever owns the views on the
    way (PostgreSQL runs a view's functions as the reader)."""
    if depth >= limits.VIEW_DEPTH_MAX:
        raise InsufficientPrivilegeError(
            f"{kind} {name} nests more than {limits.VIEW_DEPTH_MAX} views and macros"
        )
    _require_macro_reads(session, invoker, _relation_sql(session, name), depth + 1)
    if kind != "view":
        return
    for inner, _ in _view_access(session, name).needs:
        found, _ = _facts(session, "relation", inner, invoker)
        if found is not None:
            _require_macros_within(session, invoker, inner, found[1], depth + 1)


@text_cache(CALL_NAMES_CACHE_ENTRIES)
def _call_names(sql: str) -> frozenset[str]:
    """The names in ``sql`` that may call a macro (``_require_macro_reads``), lower case."""
    tokens = tables.sql_tokens(sql)
    return frozenset(
        token_name(token.text) for at, token in enumerate(tokens)
        if token.kind in ("keyword", "operator")
        or (token.kind == "identifier" and at + 1 < len(tokens) and tokens[at + 1].text == "(")
    )  # fmt: skip


def _user_macros(session: Any) -> dict[str, tuple[str | None, ...]]:
    """The macros of the tables database by name (lower case): each overload's body as a
    query (a scalar macro's expression under ``SELECT``). Cached with the owners and
    grants: CREATE and DROP MACRO register as writers (``prepare_ddl``), so the cache's
    generation moves with them. Only superusers create macros (``planner.access``)."""
    return privilege_cache.cached(  # type: ignore[no-any-return]
        session, ("macros",), lambda: _read_user_macros(session)
    )


def _user_macro_costs(session: Any) -> dict[str, MacroCost]:
    """The built-in and user scalar macros that copy a parameter more than once (or
    expand large), by name (``sandbox.expanding_macro_costs``): a superuser's
    ``CREATE MACRO sq(x) AS x * x`` nested by anyone doubles at each level. Cached with
    the macros (``_user_macros``)."""
    return privilege_cache.cached(  # type: ignore[no-any-return]
        session, ("macro_costs",), lambda: _read_user_macro_costs(session)
    )


def _read_user_macro_costs(session: Any) -> dict[str, MacroCost]:
    rows = _rows(
        session,
        "SELECT lower(function_name), parameters, macro_definition FROM duckdb_functions() "
        "WHERE NOT internal AND database_name = ? AND function_type = 'macro' "
        "AND macro_definition IS NOT NULL",
        [DATABASE_NAME],
    )
    definitions = [(str(name), tuple(map(str, parameters or ())), str(body))
                   for name, parameters, body in rows]  # fmt: skip
    return sandbox.expanding_macro_costs(definitions, sandbox.builtin_macro_costs())


def _read_user_macros(session: Any) -> dict[str, tuple[str | None, ...]]:
    rows = _rows(
        session,
        "SELECT lower(function_name), function_type, macro_definition FROM duckdb_functions() "
        "WHERE NOT internal AND database_name = ? AND function_type IN ('macro', 'table_macro')",
        [DATABASE_NAME],
    )
    macros: dict[str, list[str | None]] = {}
    for name, kind, body in rows:
        query = None if body is None else body if kind == "table_macro" else f"SELECT {body}"
        macros.setdefault(str(name), []).append(query)
    return {name: tuple(bodies) for name, bodies in macros.items()}


def _relation_sql(session: Any, name: str) -> str:
    return privilege_cache.cached(  # type: ignore[no-any-return]
        session, ("relation_sql", name), lambda: _read_relation_sql(session, name)
    )


def _read_relation_sql(session: Any, name: str) -> str:
    """DuckDB's CREATE text of table or view ``name`` ('' if there is none)."""
    schema, _, bare = name.rpartition(".")
    rows = _rows(
        session,
        "SELECT sql FROM duckdb_views() WHERE NOT temporary AND schema_name = ? "
        "AND lower(view_name) = ? AND database_name = 'tables' UNION ALL "
        "SELECT sql FROM duckdb_tables() WHERE NOT temporary AND schema_name = ? "
        "AND lower(table_name) = ? AND database_name = 'tables'",
        [schema or "main", bare, schema or "main", bare],
    )
    return str(rows[0][0]) if rows and rows[0][0] is not None else ""


def holds(session: Any, user: str, namespace: str, name: str, privilege: str) -> bool:
    """Whether ``user`` owns the object or was granted ``privilege`` (or PUBLIC was)."""
    found, granted = _facts(session, namespace, name, user)
    if namespace == "schema":
        return privilege in granted
    return found is None or found[0] == user or privilege in granted


# -- catalog reads (through the session's cursor: its transaction's view) -----------------
def _facts(
    session: Any, namespace: str, name: str, user: str
) -> tuple[tuple[str, str] | None, set[str]]:
    """The object's (owner, kind), None if it does not exist, and the privileges ``user``
    or PUBLIC were granted on it (cached: ``engine.privilege_cache``)."""
    return privilege_cache.cached(  # type: ignore[no-any-return]
        session, ("facts", namespace, name, user),
        lambda: _read_facts(session, namespace, name, user),
    )  # fmt: skip


def _read_facts(
    session: Any, namespace: str, name: str, user: str
) -> tuple[tuple[str, str] | None, set[str]]:
    """``_facts`` in one round trip to DuckDB (each costs ~0.5 ms)."""
    rows = _rows(
        session,
        f"SELECT true, owner, kind FROM {SCHEMA}.owners WHERE namespace = ? AND name = ? "
        f"UNION ALL SELECT false, privilege, NULL FROM {SCHEMA}.grants WHERE namespace = ? "
        "AND name = ? AND grantee IN (?, '')",
        [namespace, name, namespace, name, user],
    )
    owners = [(row[1], row[2]) for row in rows if row[0]]
    granted = {row[1] for row in rows if not row[0]}
    if namespace == "schema":
        return None, granted
    return (owners[0] if owners else _unowned(session, namespace, name)), granted


def owner_of(session: Any, namespace: str, name: str) -> tuple[str, str] | None:
    """(owner, kind) of a topic or relation; None if it does not exist. An object with no
    owner row (made before owners were recorded) belongs to the bootstrap superuser."""
    rows = _rows(
        session,
        f"SELECT owner, kind FROM {SCHEMA}.owners WHERE namespace = ? AND name = ? LIMIT 1",
        [namespace, name],
    )
    if rows:
        return rows[0][0], rows[0][1]
    return _unowned(session, namespace, name)


def _unowned(session: Any, namespace: str, name: str) -> tuple[str, str] | None:
    if namespace == "sequence":
        return (OWNER_SUPERUSER, "sequence") if sequence_exists(session, name) else None
    if namespace == "topic":
        exists = session.database.catalog.entry(name) is not None
        return (OWNER_SUPERUSER, "topic") if exists else None
    kind = relation_kind(session, name)
    return None if kind is None else (OWNER_SUPERUSER, kind)


# -- sequences ------------------------------------------------------------------------------
# PostgreSQL's privileges of a sequence's functions: nextval needs USAGE or UPDATE, currval
# SELECT or USAGE, setval UPDATE (DuckDB has nextval and currval).
_SEQUENCE_FUNCTIONS = {
    "nextval": ("USAGE", "UPDATE"),
    "currval": ("SELECT", "USAGE"),
    "setval": ("UPDATE",),
}
_SEQUENCE_WORD = re.compile(r"(?:NEXTVAL|CURRVAL|SETVAL)", re.IGNORECASE)


def sequence_key(written: str) -> str | None:
    """The catalog key of a sequence named ``written`` (``ids``, ``main.ids``,
    ``tables.main.ids``: ``ids``; another schema's: ``schema.ids``), lower case as DuckDB
    looks names up; None for a name of more parts or of another database."""
    parts = [part.strip().strip('"').lower() for part in written.split(".")]
    if len(parts) == 3:
        if parts[0] != DATABASE_NAME:
            return None
        parts = parts[1:]
    if len(parts) == 2 and parts[0] == "main":
        parts = parts[1:]
    if not parts or len(parts) > 2 or not all(parts):
        return None
    return ".".join(parts)


def sequence_exists(session: Any, name: str) -> bool:
    schema, _, bare = name.rpartition(".")
    return bool(_rows(
        session,
        "SELECT 1 FROM duckdb_sequences() WHERE NOT temporary AND database_name = ? "
        "AND schema_name = ? AND lower(sequence_name) = ?",
        [DATABASE_NAME, schema or "main", bare],
    ))  # fmt: skip


def _require_sequences(session: Any, user: str, sql: str) -> None:
    """Refuse (42501) ``sql`` if it calls nextval, currval or setval on a sequence ``user``
    neither owns nor holds a privilege of PostgreSQL's for that call on (superusers are
    not checked). The sequence must be named by a string literal (DuckDB's lexer reads
    the call: quoted or qualified function names alike); any other argument cannot be
    known before the run and is refused."""
    if _SEQUENCE_WORD.search(sql) is None:  # cheap: most statements never mention one
        return
    tokens = tables.sql_tokens(sql)
    for at, token in enumerate(tokens[:-1]):
        function = token_name(token.text)
        if function not in _SEQUENCE_FUNCTIONS or tokens[at + 1].text != "(":
            continue
        argument = tokens[at + 2] if at + 2 < len(tokens) else None
        closing = tokens[at + 3].text if at + 3 < len(tokens) else ""
        name = None
        if argument is not None and argument.kind == "string_const" and closing in (")", ","):
            text = argument.text
            if text[:1] == "'" and text[-1:] == "'":
                name = sequence_key(text[1:-1].replace("''", "'"))
        if name is None:
            raise InsufficientPrivilegeError(
                f"permission denied: {function}() of a sequence not named by a string "
                "literal is for superusers"
            )
        allowed = _SEQUENCE_FUNCTIONS[function]
        for candidate in _sequence_candidates(session, name):
            if not any(holds(session, user, "sequence", candidate, p) for p in allowed):
                raise InsufficientPrivilegeError(
                    f"permission denied for sequence {candidate} ({' or '.join(allowed)} "
                    f"privilege needed for {function})"
                )


def _sequence_candidates(session: Any, name: str) -> tuple[str, ...]:
    """Every sequence ``name`` (a ``sequence_key``) may be to DuckDB: itself, and for an
    unqualified name in a session whose names do not resolve plainly (``SET search_path``
    or ``schema``), each sequence of that name in a schema of the search path (review R2
    F3: ``nextval('ids')`` took ``s2.ids`` while ``main.ids`` was checked). All are
    checked, as relations are (``_candidates``)."""
    if "." in name or session.names_resolve_plainly():
        return (name,)
    rows = _rows(
        session,
        "SELECT DISTINCT schema_name FROM duckdb_sequences() WHERE database_name = ? "
        "AND lower(sequence_name) = ? AND schema_name IN "
        "(SELECT unnest(list_append(current_schemas(false), 'main')))",
        [DATABASE_NAME, name],
    )
    found = {name if row[0] == "main" else f"{row[0]}.{name}" for row in rows}
    return (name, *sorted(found - {name}))


def relation_kind(session: Any, name: str) -> str | None:
    """'table' or 'view' if ``name`` (``schema.name`` or a name in main) exists."""
    schema, _, bare = name.rpartition(".")
    rows = _rows(
        session,
        "SELECT 'table' FROM duckdb_tables() WHERE NOT temporary AND schema_name = ? "
        "AND lower(table_name) = ? AND database_name = 'tables' UNION ALL "
        "SELECT 'view' FROM duckdb_views() WHERE NOT temporary AND schema_name = ? "
        "AND lower(view_name) = ? AND database_name = 'tables'",
        [schema or "main", bare, schema or "main", bare],
    )
    return rows[0][0] if rows else None


def _refuse_view_expansion(session: Any, user: str, access: Access, own: set[str]) -> None:
    """Refuse (54000) a statement whose relations, its views expanded into what they read
    (DuckDB's binder copies a view's query into every place it is read), come to more
    than ``limits.VIEW_EXPANDED_RELATIONS_MAX`` relation reads: a chain of views each
    joining the one before twice is 2^n relations to bind and join (round 25: 14 views,
    3.6 s; each view more doubles it), from a user granted CREATE on a schema. ``own``:
    the plan's topic reads and system views, one relation each, no catalog lookup. Each
    copy DuckDB binds of a NOT MATERIALIZED common table expression counts as one relation
    read, and the reads inside it once per copy (``Access.cte_reads``; round 26: a chain
    of such CTEs each joining the previous twice is 2^n, 16 of them 15 s and 0.7 GiB of
    bind, with no privilege at all). And 54000 for a statement whose stars make more than
    ``limits.BIND_EXPANSION_NODES_MAX`` columns, a relation counted as one
    (``Access.star_columns``: ``SELECT *, * FROM (SELECT *, * FROM ...)`` is 2^n, round 26)."""
    if access.star_columns > limits.BIND_EXPANSION_NODES_MAX:
        raise LimitExceededError(
            f"statement makes {access.star_columns} columns once its stars are expanded, "
            f"counting each table as one (at most {limits.BIND_EXPANSION_NODES_MAX}): a star "
            "over a relation joined with itself doubles its columns"
        )
    total = access.cte_reads
    for name, count in access.reads:
        if name in own:
            total += count
            continue
        total += count * (_view_size(session, name, 0) if _is_view(session, name, user) else 1)
    if total > limits.VIEW_EXPANDED_RELATIONS_MAX:
        raise LimitExceededError(
            f"statement reads {total} relations once its views are expanded (and its NOT "
            f"MATERIALIZED common table expressions; at most "
            f"{limits.VIEW_EXPANDED_RELATIONS_MAX}): each is expanded wherever it is read"
        )


def _refuse_view_predicates(session: Any, user: str, sql: str, access: Access,
                            own: set[str]) -> None:  # fmt: skip
    """Refuse (54000) a statement whose filters and its views' (expanded, once per read)
    come to more than ``limits.PREDICATE_FILTER_CONJUNCTS_MAX`` conjuncts that are not
    plain comparisons: DuckDB pushes a view's filters down with the statement's and
    combines them in time quadratic in their number, with no interrupt (round 27: 16
    views each reading the one before ``WHERE a <> i AND …`` 256 times, each view
    allowed on its own: 13.9 s). The sandbox bounds each text alone
    (``sandbox.refuse_costly_predicates``)."""
    from_views = 0
    for name, count in access.reads:
        if name in own:
            continue
        if _is_view(session, name, user):
            from_views += count * _view_conjuncts(session, name, 0)
    if from_views == 0:
        return
    if from_views + sandbox.filter_conjuncts_bound(sql) <= limits.PREDICATE_FILTER_CONJUNCTS_MAX:
        return  # the tokens' bound suffices: no tree for the statement
    total = from_views + sandbox.filter_conjuncts(sql)
    if total > limits.PREDICATE_FILTER_CONJUNCTS_MAX:
        raise LimitExceededError(
            f"statement too complex to plan: {total} filter conditions that are not plain "
            f"comparisons once its views are expanded (at most "
            f"{limits.PREDICATE_FILTER_CONJUNCTS_MAX}, counting <>, NOT, IN, LIKE, ORs and "
            "function calls ANDed together); DuckDB combines a view's filters with the "
            "statement's"
        )


def _view_conjuncts(session: Any, name: str, depth: int) -> int:
    """The filter conjuncts view ``name`` adds where it is read (its views' too), cached
    with the owners and grants. Past ``limits.VIEW_DEPTH_MAX`` views deep: more than the
    bound (refused)."""
    return _per_view(session, "view_conjuncts", name, depth,
                     limits.PREDICATE_FILTER_CONJUNCTS_MAX + 1, _read_view_conjuncts)  # fmt: skip


def _read_view_conjuncts(session: Any, name: str, depth: int) -> int:
    size = sandbox.filter_conjuncts(_relation_sql(session, name))
    for inner, count in _view_access(session, name).reads:
        if _is_view(session, inner, OWNER_SUPERUSER):
            size += count * _view_conjuncts(session, inner, depth + 1)
        if size > limits.PREDICATE_FILTER_CONJUNCTS_MAX:
            break  # refused whatever the rest adds
    return size


def _view_size(session: Any, name: str, depth: int) -> int:
    """How many relation reads view ``name`` expands to (its views expanded too), cached
    with the owners and grants (a view's DDL moves the cache's generation). Past
    ``limits.VIEW_DEPTH_MAX`` views deep: more than any bound (refused)."""
    return _per_view(session, "view_size", name, depth,
                     limits.VIEW_EXPANDED_RELATIONS_MAX + 1, _read_view_size)  # fmt: skip


def _per_view(session: Any, kind: str, name: str, depth: int, over: int,
              read: Callable[[Any, str, int], int]) -> int:  # fmt: skip
    """``read(session, name, depth)``: a count view ``name`` adds where it is read (its
    own views' counted by recursing with ``depth + 1``), cached as ``kind`` with the owners
    and grants (a view's DDL moves the cache's generation); ``over`` (more than the
    count's bound: refused) past ``limits.VIEW_DEPTH_MAX`` views deep."""
    if depth > limits.VIEW_DEPTH_MAX:
        return over
    return privilege_cache.cached(  # type: ignore[no-any-return]
        session, (kind, name), lambda: read(session, name, depth)
    )


def _read_view_size(session: Any, name: str, depth: int) -> int:
    access = _view_access(session, name)
    size = access.cte_reads
    for inner, count in access.reads:
        is_view = _is_view(session, inner, OWNER_SUPERUSER)
        size += count * (_view_size(session, inner, depth + 1) if is_view else 1)
        if size > limits.VIEW_EXPANDED_RELATIONS_MAX:
            break  # refused whatever the rest adds
    return max(size, 1)


def _refuse_large_join_of_views(session: Any, user: str, sql: str, access: Access,
                                own: set[str]) -> None:  # fmt: skip
    """Refuse (54000) a statement that reads views whose queries, put in place of each
    read, would hand DuckDB's join-order optimizer more than ``PLAN_RELATIONS_MAX``
    relations in one graph (``plan_relations.largest_join_with_views``). The sandbox's
    bound (``sandbox.refuse_large_join``) counts a view as one relation: round 27, four
    views of 60 relations each joined were accepted and planned for ~4 s of CPU, eight
    for 32 s, from a user granted CREATE on a schema. A statement reading no view costs
    nothing more here; one that does is parsed once (cached per text) and each view's
    count is cached with the owners and grants (``_view_join_size``)."""
    views = {name for name, _ in access.reads if name not in own and _is_view(session, name, user)}
    if not views:
        return
    sizes = tuple(sorted((name, _view_join_size(session, name, 0)) for name in views))
    size = _join_with_views(sql, sizes)
    if size > PLAN_RELATIONS_MAX:
        raise LimitExceededError(
            f"statement too complex to plan: DuckDB would join {size} relations at once "
            f"once its views are put in place (at most {PLAN_RELATIONS_MAX}); split it, or "
            "stage intermediate results in a table"
        )


def _is_view(session: Any, name: str, user: str) -> bool:
    found, _ = _facts(session, "relation", name, user)
    return found is not None and found[1] == "view"


def _view_join_size(session: Any, name: str, depth: int) -> int:
    """The relations view ``name``'s query adds to the join graph it is read in (its own
    views' counted alike), at most ``PLAN_RELATIONS_MAX + 1`` (refused whatever the rest
    adds), cached with the owners and grants. Past ``limits.VIEW_DEPTH_MAX`` views deep:
    over the bound."""
    return _per_view(session, "view_join", name, depth, PLAN_RELATIONS_MAX + 1,
                     _read_view_join_size)  # fmt: skip


def _read_view_join_size(session: Any, name: str, depth: int) -> int:
    query = _view_query(session, name)
    if query is None:
        return 1  # sqlglot cannot read it (nor ``_view_size``): DuckDB's binder judges it
    inner = {other for other, _ in _view_access(session, name).reads
             if _is_view(session, other, OWNER_SUPERUSER)}  # fmt: skip
    sizes = {other: _view_join_size(session, other, depth + 1) for other in inner}
    size = largest_join_with_views(query, sandbox.builtin_macro_relations(),
                                   lambda table: sizes.get(relation_name(table) or "", 1))
    return max(1, min(size, PLAN_RELATIONS_MAX + 1))


def _view_query(session: Any, name: str) -> exp.Expression | None:
    text = _view_sql(session, name)
    if text is None:
        return None
    tree = _parsed(text)
    query = tree.expression if isinstance(tree, exp.Create) else None
    return query if isinstance(query, exp.Expression) else None


def _planned_tree(sql: str) -> exp.Expression | None:
    """sqlglot's tree of what DuckDB plans for ``sql``: the statement of an ``EXPLAIN
    [ANALYZE]`` or ``PREPARE name AS``, else the statement; None if sqlglot cannot read
    it."""
    tree = _parsed(sql)
    if isinstance(tree, exp.Command):
        verb = str(tree.this).upper()
        rest = tree.expression.name if isinstance(tree.expression, exp.Literal) else str(
            tree.expression or "")  # fmt: skip
        words = rest.split(None, 2)
        if verb == "EXPLAIN" and words:
            inner = rest.split(None, 1)[1] if words[0].upper() == "ANALYZE" and len(words) > 1 \
                else rest
            return _planned_tree(inner)
        if verb == "PREPARE" and len(words) == 3 and words[1].upper() == "AS":
            return _planned_tree(words[2])
        return None
    return tree


@text_cache(VIEW_JOINS_CACHE_ENTRIES)
def _join_with_views(sql: str, sizes: tuple[tuple[str, int], ...]) -> int:
    """The largest join graph of ``sql`` with its views' reads counted as ``sizes`` says
    (0 when sqlglot cannot read it: the sandbox judged it by DuckDB's tokens)."""
    tree = _planned_tree(sql)
    if tree is None:
        return 0
    by_name = dict(sizes)
    return largest_join_with_views(tree, sandbox.builtin_macro_relations(),
                                   lambda table: by_name.get(relation_name(table) or "", 1))


def _parsed(sql: str) -> exp.Expression | None:
    try:
        return parse_duckdb(sql)
    except (sqlglot.errors.SqlglotError, IndexError):
        return None


def _view_access(session: Any, name: str) -> Access:
    return privilege_cache.cached(  # type: ignore[no-any-return]
        session, ("view", name), lambda: _read_view_access(session, name)
    )


def _read_view_access(session: Any, name: str) -> Access:
    text = _view_sql(session, name)
    return view_reads(text) if text is not None else Access(())


def _view_sql(session: Any, name: str) -> str | None:
    """DuckDB's CREATE text of the (persistent) view ``name``, None if there is none."""
    schema, _, bare = name.rpartition(".")
    rows = _rows(
        session,
        "SELECT sql FROM duckdb_views() WHERE NOT temporary AND schema_name = ? "
        "AND lower(view_name) = ? AND database_name = 'tables'",
        [schema or "main", bare],
    )
    return rows[0][0] if rows else None


def _rows(session: Any, sql: str, parameters: list[Any]) -> list[tuple[Any, ...]]:
    tables.run(session.cursor, sql, parameters)
    return session.cursor.fetchall()  # a few rows: no Arrow round trip


def _schema_of(name: str) -> str:
    schema, _, _ = name.rpartition(".")
    return schema or "main"


# -- owners of tables and views: recorded with their DDL ------------------------------------
def is_relation_ddl(operation: Any) -> bool:
    return isinstance(operation, RunQuery) and operation.tag.startswith(_DDL_TAGS)


def prepare_ddl(session: Any, operation: RunQuery) -> list[str]:
    """Before a CREATE/DROP/ALTER of a relation runs: open the DuckDB transaction the owner
    rows are written in (an autocommit statement's, committed by ``Session._commit``) and
    note which of the relations it creates exist already (their owners stay). A macro's
    CREATE or DROP registers as a writer too: the checks cache the macros' bodies
    (``_user_macros``) with the owners and grants."""
    access = relation_access(operation.sql)
    if operation.tag.endswith((" MACRO", " FUNCTION")):
        privilege_cache.note_write(session)
        return []
    if operation.tag in _SEQUENCE_DDL_TAGS:  # owners and grants of sequences, as of tables
        privilege_cache.note_write(session)
        open_duckdb_transaction(session)
        return [n for n in _sequences_named(operation.sql) if sequence_exists(session, n)]
    if not (access.created or access.dropped or access.renamed):
        return []
    privilege_cache.note_write(session)
    open_duckdb_transaction(session)
    return [name for name, _ in access.created if relation_kind(session, name) is not None]


def record_ddl(session: Any, operation: RunQuery, existed: list[str]) -> None:
    """After the DDL ran, in its transaction: owners of new relations, none of dropped
    ones (their grants go too), renamed rows follow their relation."""
    if operation.tag in _SEQUENCE_DDL_TAGS:
        _record_sequence_ddl(session, operation, existed)
        return
    access = relation_access(operation.sql)
    cursor = session.cursor
    for name in access.dropped:
        if relation_kind(session, name) is None:
            forget(session, "relation", name)
    for old, new in access.renamed:
        for table in ("owners", "grants"):
            tables.run(cursor, f"UPDATE {SCHEMA}.{table} SET name = ? WHERE namespace = "
                       "'relation' AND name = ?", [new, old])  # fmt: skip
    for name, kind in access.created:
        if name in existed or relation_kind(session, name) is None:
            continue
        forget(session, "relation", name)
        tables.run(cursor, f"INSERT INTO {SCHEMA}.owners VALUES ('relation', ?, ?, ?)",
                   [name, kind, session.identity.name])  # fmt: skip


_SEQUENCE_DDL_TAGS = ("CREATE SEQUENCE", "DROP SEQUENCE")


def _sequences_named(sql: str) -> list[str]:
    """The sequences a ``CREATE [OR REPLACE] SEQUENCE [IF NOT EXISTS] name`` or ``DROP
    SEQUENCE [IF EXISTS] name, ...`` names (``sequence_key``s), read with DuckDB's lexer."""
    tokens = tables.sql_tokens(sql)
    words = [token.text.upper() for token in tokens]
    if "SEQUENCE" not in words:
        return []
    at = words.index("SEQUENCE") + 1
    while at < len(words) and words[at] in ("IF", "NOT", "EXISTS"):
        at += 1
    names: list[str] = []
    parts: list[str] = []
    expect_name = True
    for token in tokens[at:]:
        if expect_name and token.kind in ("identifier", "keyword"):
            parts.append(token.text)
            expect_name = False
        elif not expect_name and token.text in (".", ","):
            if token.text == ",":
                names.append(".".join(parts))
                parts = []
            expect_name = True
        else:
            break
    if parts and not expect_name:
        names.append(".".join(parts))
    keys = [sequence_key(name) for name in names]
    return [key for key in keys if key is not None]


def _record_sequence_ddl(session: Any, operation: RunQuery, existed: list[str]) -> None:
    """After CREATE or DROP SEQUENCE ran, in its transaction: a new sequence is its
    creator's (no grants); a dropped one's owner and grants go (a later sequence of the
    name starts without them)."""
    for name in _sequences_named(operation.sql):
        exists = sequence_exists(session, name)
        if operation.tag == "DROP SEQUENCE" and not exists:
            forget(session, "sequence", name)
        elif operation.tag == "CREATE SEQUENCE" and exists and name not in existed:
            forget(session, "sequence", name)
            tables.run(session.cursor, f"INSERT INTO {SCHEMA}.owners VALUES ('sequence', ?, "
                       "'sequence', ?)", [name, session.identity.name])  # fmt: skip


def forget(session: Any, namespace: str, name: str) -> None:
    for table in ("owners", "grants"):
        tables.run(session.cursor, f"DELETE FROM {SCHEMA}.{table} WHERE namespace = ? AND "
                   "name = ?", [namespace, name])  # fmt: skip


def open_duckdb_transaction(session: Any) -> None:
    """Make sure the statement's writes to the catalog share one DuckDB transaction."""
    transaction = session.transaction
    assert transaction is not None
    if not transaction.explicit and not transaction.duckdb_open:
        tables.run(session.cursor, "BEGIN TRANSACTION")
        transaction.duckdb_open = True


def namespace_of(kind: str) -> str:
    return _KIND_NAMESPACE[kind]
