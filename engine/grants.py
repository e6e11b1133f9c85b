"""GRANT, REVOKE and SET ROLE / SET SESSION AUTHORIZATION, as PostgreSQL 15 runs them.

GRANT and REVOKE write ``__topicbase.grants`` through the session's DuckDB cursor, in the
statement's transaction: inside BEGIN they roll back with it, and they are durable at
COMMIT like any table row. Who may grant (PostgreSQL's rule): the owner, a superuser (the
grant is then recorded as made by the owner), or a holder of the privilege WITH GRANT
OPTION (recorded as made by that holder). A REVOKE takes away what the revoker (or, for
the owner and superusers, the owner) granted, and the grants that depended on it
(PostgreSQL's CASCADE; RESTRICT is not distinguished). CREATE on a schema is granted by
superusers only (they own the schemas).

SET ROLE (to any role for a superuser session user, else only back to oneself) changes
the identity privileges are checked against; SET SESSION AUTHORIZATION (only when the
authenticated user is a superuser) changes the session user too. ``current_user`` and
``session_user`` answer with them (temporary macros on the session's connection). Inside
a transaction block they are undone by ROLLBACK, as in PostgreSQL.

This module builds on ``engine.privileges`` (who owns and holds what); privileges knows
nothing of it, and the session runs these statements through ``run``.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from engine import privilege_cache, privileges, tables
from engine.catalog import OWNER_SUPERUSER, SCHEMA
from engine.identity import Identity, RoleRemovedError
from planner.operations import ChangePrivileges, SwitchRole
from storage.errors import (
    InsufficientPrivilegeError,
    TopicbaseError,
    UndefinedObjectError,
    UndefinedTopicError,
)

PRIVILEGES = {
    "table": ("SELECT", "INSERT", "UPDATE", "DELETE"),
    "topic": ("SELECT", "INSERT", "ALTER"),
    "schema": ("CREATE",),
    "sequence": ("USAGE", "SELECT", "UPDATE"),
}
SCHEMAS = ("main",)


class InvalidGrantOperationError(TopicbaseError):
    sqlstate = "0LP01"


class InvalidSchemaNameError(TopicbaseError):
    sqlstate = "3F000"


def run(session: Any, operation: ChangePrivileges | SwitchRole) -> str:
    """GRANT/REVOKE or SET ROLE; the command tag."""
    if isinstance(operation, SwitchRole):
        return switch_role(session, operation)
    return change_privileges(session, operation)


# -- GRANT and REVOKE --------------------------------------------------------------------
def change_privileges(session: Any, operation: ChangePrivileges) -> str:
    identity: Identity = session.identity
    namespace = privileges.namespace_of(operation.object_kind)
    wanted = PRIVILEGES[operation.object_kind]
    chosen = wanted if "ALL" in operation.privileges else operation.privileges
    if operation.grant_option and not operation.revoke and "" in operation.grantees:
        raise InvalidGrantOperationError("grant options can only be granted to roles")
    _check_roles_exist(session, operation.grantees)
    privilege_cache.note_write(session)
    privileges.open_duckdb_transaction(session)
    for written in operation.objects:
        name, label = _object(session, operation.object_kind, written)
        grantor = _grantor(session, identity, namespace, name, label, chosen)
        for privilege in chosen:
            for grantee in operation.grantees:
                if operation.revoke:
                    _revoke(session, namespace, name, grantee, privilege, grantor,
                            operation.grant_option)  # fmt: skip
                else:
                    _grant(session, namespace, name, grantee, privilege, grantor,
                           operation.grant_option)  # fmt: skip
    return "REVOKE" if operation.revoke else "GRANT"


def _check_roles_exist(session: Any, grantees: tuple[str, ...]) -> None:
    """42704 for a grantee the users file does not hold, when a server registered one (the
    console and DB-API have no users file: any name may be granted to, for later)."""
    known = set(privileges.known_roles(session.database))
    if not known:
        return
    for grantee in grantees:
        if grantee and grantee != OWNER_SUPERUSER and grantee not in known:
            raise UndefinedObjectError(f'role "{grantee}" does not exist')


def _object(session: Any, kind: str, written: str) -> tuple[str, str]:
    """The catalog key of a named object and how errors call it ("table t")."""
    if kind == "topic":
        if session.database.catalog.entry(written) is None:
            raise UndefinedTopicError(f'topic "{written}" does not exist', topic=written)
        return written, f"topic {written}"
    parts = written.split(".")
    if kind == "schema":
        if len(parts) == 2 and parts[0] == "tables":
            parts = parts[1:]
        if len(parts) != 1 or parts[0] not in SCHEMAS:
            raise InvalidSchemaNameError(f'schema "{written}" does not exist')
        return parts[0], f"schema {parts[0]}"
    if kind == "sequence":
        name = privileges.sequence_key(written)
        if name is None or not privileges.sequence_exists(session, name):
            raise UndefinedTopicError(f'relation "{written}" does not exist')
        return name, f"sequence {name}"
    if len(parts) == 3 and parts[0] == "tables":
        parts = parts[1:]
    if len(parts) == 2 and parts[0] == "main":
        parts = parts[1:]
    name = ".".join(parts)
    relation = privileges.relation_kind(session, name) if len(parts) <= 2 else None
    if relation is None:
        raise UndefinedTopicError(f'relation "{written}" does not exist')
    return name, f"{relation} {name}"


def _grantor(
    session: Any,
    identity: Identity,
    namespace: str,
    name: str,
    label: str,
    chosen: tuple[str, ...],
) -> str:
    """Who the grant is recorded as made by; 42501 if ``identity`` may not grant."""
    owner = OWNER_SUPERUSER if namespace == "schema" else _owner(session, namespace, name)
    if identity.superuser or identity.name == owner:
        return owner
    for privilege in chosen:
        if not _grant_option_held(session, namespace, name, identity.name, privilege):
            raise InsufficientPrivilegeError(
                f"permission denied for {label} (only its owner, a superuser or a holder of "
                f"{privilege} WITH GRANT OPTION may grant or revoke it)"
            )
    return identity.name


def _owner(session: Any, namespace: str, name: str) -> str:
    found = privileges.owner_of(session, namespace, name)
    return OWNER_SUPERUSER if found is None else found[0]


def _grant_option_held(session: Any, namespace: str, name: str, user: str, privilege: str) -> bool:
    return bool(_rows(
        session,
        f"SELECT 1 FROM {SCHEMA}.grants WHERE namespace = ? AND name = ? AND privilege = ? "
        "AND grantee = ? AND grantable LIMIT 1",
        [namespace, name, privilege, user],
    ))  # fmt: skip


def _grant(session: Any, namespace: str, name: str, grantee: str, privilege: str,
           grantor: str, option: bool) -> None:  # fmt: skip
    key = [namespace, name, grantee, privilege, grantor]
    where = "namespace = ? AND name = ? AND grantee = ? AND privilege = ? AND grantor = ?"
    if _rows(session, f"SELECT 1 FROM {SCHEMA}.grants WHERE {where}", key):
        if option:
            tables.run(session.cursor, f"UPDATE {SCHEMA}.grants SET grantable = true "
                       f"WHERE {where}", key)  # fmt: skip
        return
    tables.run(session.cursor, f"INSERT INTO {SCHEMA}.grants VALUES (?, ?, ?, ?, ?, ?)",
               [*key, option])  # fmt: skip


def _revoke(session: Any, namespace: str, name: str, grantee: str, privilege: str,
            grantor: str, option_only: bool) -> None:  # fmt: skip
    """Take away a grant (or only its grant option) and what the grantee granted from
    it, PostgreSQL's CASCADE: grants whose grantor no longer holds the grant option."""
    key = [namespace, name, grantee, privilege, grantor]
    where = "namespace = ? AND name = ? AND grantee = ? AND privilege = ? AND grantor = ?"
    if option_only:
        tables.run(session.cursor, f"UPDATE {SCHEMA}.grants SET grantable = false "
                   f"WHERE {where}", key)  # fmt: skip
    else:
        tables.run(session.cursor, f"DELETE FROM {SCHEMA}.grants WHERE {where}", key)
    dependent_grantors = [grantee]
    while dependent_grantors:
        holder = dependent_grantors.pop()
        if holder == "" or _grant_option_held(session, namespace, name, holder, privilege):
            continue
        rows = _rows(session, f"SELECT DISTINCT grantee FROM {SCHEMA}.grants WHERE "
                     "namespace = ? AND name = ? AND privilege = ? AND grantor = ?",
                     [namespace, name, privilege, holder])  # fmt: skip
        tables.run(session.cursor, f"DELETE FROM {SCHEMA}.grants WHERE namespace = ? AND "
                   "name = ? AND privilege = ? AND grantor = ?",
                   [namespace, name, privilege, holder])  # fmt: skip
        dependent_grantors += [row[0] for row in rows]


def _rows(session: Any, sql: str, parameters: list[Any]) -> list[tuple[Any, ...]]:
    """A few rows as tuples (``fetchall``: no Arrow result is built for them)."""
    return tables.fetch_rows(session.cursor, sql, parameters)


# -- SET ROLE and SET SESSION AUTHORIZATION -------------------------------------------------
@dataclass
class _Roles:
    authenticated: Identity  # who logged in (or the console's local superuser)
    session_user: Identity


_roles: weakref.WeakKeyDictionary[Any, _Roles] = weakref.WeakKeyDictionary()


def switch_role(session: Any, operation: SwitchRole) -> str:
    roles = _roles.get(session)
    if roles is None:
        roles = _roles[session] = _Roles(session.identity, session.identity)
    transaction = session.transaction
    if transaction is not None and transaction.explicit and session not in privileges.role_undo:
        # As in PostgreSQL, a ROLLBACK undoes it (the current_user macros roll back with
        # the DuckDB transaction; privileges.check_plan restores the identities).
        identity, session_user = session.identity, roles.session_user

        def undo() -> None:
            session.identity, roles.session_user = identity, session_user

        privileges.role_undo[session] = (transaction, undo)
    if operation.session_authorization:
        if operation.role is not None and operation.role != roles.authenticated.name:
            if not roles.authenticated.superuser:
                raise InsufficientPrivilegeError(
                    "permission denied to set session authorization (superusers only)"
                )
            roles.session_user = _identity(session, operation.role)
        else:
            roles.session_user = roles.authenticated
        session.identity = roles.session_user
    elif operation.role is None or operation.role == roles.session_user.name:
        session.identity = roles.session_user
    elif not roles.session_user.superuser:
        raise InsufficientPrivilegeError(f'permission denied to set role "{operation.role}"')
    else:
        session.identity = _identity(session, operation.role)
    _name_users(session, session.identity.name, roles.session_user.name)
    return "SET"


def refresh_roles(session: Any, superuser_of: Callable[[str], bool | None]) -> None:
    """Derive the session's identities again from ``superuser_of`` (a user's superuser flag
    now; None for a user no longer known), after the users file changed under an open
    session: PostgreSQL's ALTER ROLE … NOSUPERUSER reaches open sessions at once.

    The logged-in user is looked up first: unknown, RoleRemovedError (the front ends the
    session). Then, stricter than PostgreSQL (which checks SET ROLE and SET SESSION
    AUTHORIZATION only when they run): a power a session used and no longer has is taken
    back — a logged-in user no longer a superuser is its own session user again, and a
    session user no longer a superuser is its own current role again. Every other
    identity keeps its name and takes its flag now (a user removed: no superuser).
    Invariant: after it, no identity of the session holds a superuser flag the users file
    does not give now, also after a ROLLBACK of a SET ROLE of the open transaction (its
    undo derives them again). An identity that did not change stays the same object (the
    door's memo, keyed by it, stays valid)."""
    roles = _roles.get(session)
    authenticated = session.identity if roles is None else roles.authenticated
    flag = superuser_of(authenticated.name)
    if flag is None:
        raise RoleRemovedError(authenticated.name)
    authenticated = _flagged(authenticated, flag)
    if roles is None:
        if session.identity is not authenticated:
            session.identity = authenticated
        return
    session_user = roles.session_user
    if session_user.name != authenticated.name and not authenticated.superuser:
        session_user = authenticated
    else:
        session_user = _flagged(session_user, bool(superuser_of(session_user.name)))
    identity = session.identity
    if identity.name == session_user.name or not session_user.superuser:
        identity = session_user
    else:
        identity = _flagged(identity, bool(superuser_of(identity.name)))
    names_changed = (identity.name, session_user.name) != (session.identity.name,
                                                            roles.session_user.name)
    roles.authenticated, roles.session_user, session.identity = (
        authenticated, session_user, identity)
    if names_changed:
        _name_users(session, identity.name, session_user.name)
    pending = privileges.role_undo.get(session)
    if pending is not None:
        transaction, undo = pending

        def undo_then_refresh() -> None:
            undo()
            try:
                refresh_roles(session, superuser_of)
            except RoleRemovedError:  # removed since: the front ends the session next
                roles.authenticated = _flagged(roles.authenticated, False)
                roles.session_user = _flagged(roles.session_user, False)
                session.identity = _flagged(session.identity, False)

        privileges.role_undo[session] = (transaction, undo_then_refresh)


def _flagged(identity: Identity, superuser: bool) -> Identity:
    """``identity`` itself if its flag is ``superuser``, else the same name with it."""
    return identity if identity.superuser == superuser else Identity(identity.name, superuser)


def session_user(session: Any) -> Identity:
    roles = _roles.get(session)
    return session.identity if roles is None else roles.session_user


def _identity(session: Any, name: str) -> Identity:
    return Identity(name, superuser=privileges.is_superuser_name(session.database, name))


def _name_users(session: Any, current: str, user: str) -> None:
    """``current_user``/``user`` and ``session_user`` in this session's SQL."""
    for macro, value in (("current_user", current), ("user", current), ("session_user", user)):
        tables.run(session.cursor, f"CREATE OR REPLACE TEMP MACRO {macro}() AS "
                   f"{_literal(value)}")  # fmt: skip


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"
