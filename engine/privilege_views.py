"""The ``sys.owners``, ``sys.grants`` and ``sys.roles`` views: privileges for introspection.

User statements never reach the ``__topicbase`` schema; these views are how clients (and
``sql.pgwire``'s ``pg_class.relacl``, ``pg_roles``, ``information_schema.table_privileges``
and ``has_table_privilege``) see owners, grants and roles. Like the other ``sys.`` views
they are built per statement from committed state (a transaction's own uncommitted GRANT
is not shown here, though it is already in force for its checks).

``sys.roles`` lists the bootstrap superuser, the users a server registered
(``privileges.use_role_lookup``: the users file) and every other name that owns something
or was granted something, with ``superuser`` as the engine knows it and
``connection_limit``, the user's own limit of sessions (PostgreSQL's ``rolconnlimit``; -1
when the users file gives none, as for names it does not hold).
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from engine import privileges, tables
from engine.catalog import OWNER_SUPERUSER, SCHEMA


def owners_view(database: Any) -> pa.Table:
    return _query(database, f"SELECT namespace, name, kind, owner FROM {SCHEMA}.owners "
                            "ORDER BY namespace, name")  # fmt: skip


def grants_view(database: Any) -> pa.Table:
    return _query(
        database,
        f"SELECT DISTINCT namespace, name, grantee, privilege, grantor, grantable "
        f"FROM {SCHEMA}.grants ORDER BY namespace, name, grantee, privilege, grantor",
    )


def roles_view(database: Any) -> pa.Table:
    names = {OWNER_SUPERUSER} | set(privileges.known_roles(database))
    for column, table in (("owner", "owners"), ("grantee", "grants"), ("grantor", "grants")):
        result = _query(database, f"SELECT DISTINCT {column} FROM {SCHEMA}.{table}")
        names.update(value for value in result.column(0).to_pylist() if value)
    ordered = sorted(names)
    return pa.table({
        "name": pa.array(ordered, pa.string()),
        "superuser": pa.array([privileges.is_superuser_name(database, n) for n in ordered]),
        "connection_limit": pa.array([_limit(database, n) for n in ordered], pa.int32()),
    })  # fmt: skip


def _limit(database: Any, name: str) -> int:
    limit = privileges.connection_limit_of(database, name)
    return -1 if limit is None else limit


def _query(database: Any, sql: str) -> pa.Table:
    cursor = database.root.cursor()
    try:
        result = tables.query_arrow(cursor, sql)
    finally:
        cursor.close()
    assert result is not None
    return result
