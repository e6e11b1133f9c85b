"""Owners, grants and roles as PostgreSQL clients see them (psql's ``\\dp`` and ``\\du``).

DuckDB SQL over the engine's ``sys.owners``, ``sys.grants`` and ``sys.roles`` views, used
by ``pg_relations`` (``pg_class.relacl``, ``pg_roles``/``pg_authid``/``pg_user``,
``information_schema.table_privileges``) and ``pg_functions`` (``has_table_privilege``):

- ``relacl`` is PostgreSQL's aclitem text, ``grantee=privileges/grantor`` with the
  owner's entry first, PUBLIC as an empty grantee, ``*`` after a privilege held WITH
  GRANT OPTION; letters ``a`` INSERT, ``r`` SELECT, ``w`` UPDATE, ``d`` DELETE and, for
  topics, ``A`` ALTER. NULL while nothing was ever granted (PostgreSQL's default ACL).
- Role OIDs: the connected user is ``ROLE_OID`` (10, what every relation's owner OID
  and ``pg_get_userbyid`` assume); other roles get ``ROLE_OID_BASE + n`` by name order.

Placeholders ``{user}`` and ``{database}`` as in ``pg_relations``. Pure data.
"""

from __future__ import annotations

ROLE_OID = 10
ROLE_OID_BASE = 16_385
_LETTER = ("CASE privilege WHEN 'INSERT' THEN 'a' WHEN 'SELECT' THEN 'r' WHEN 'UPDATE' "
           "THEN 'w' WHEN 'DELETE' THEN 'd' WHEN 'ALTER' THEN 'A' ELSE '?' END")  # fmt: skip
_ORDER = ("CASE privilege WHEN 'INSERT' THEN 1 WHEN 'SELECT' THEN 2 WHEN 'UPDATE' THEN 3 "
          "WHEN 'DELETE' THEN 4 ELSE 5 END")  # fmt: skip

# One row per relation or topic with grants: (is_topic, relname, acl).
ACL = f"""
SELECT g.namespace = 'topic' AS is_topic, g.name AS relname,
       [coalesce(o.owner, 'topicbase') || '='
        || CASE g.namespace WHEN 'topic' THEN 'arA' ELSE 'arwd' END
        || '/' || coalesce(o.owner, 'topicbase')]
       || list(g.grantee || '=' || g.letters || '/' || g.grantor
               ORDER BY g.grantee, g.grantor) AS acl
FROM (SELECT namespace, name, grantee, grantor,
             string_agg({_LETTER} || CASE WHEN grantable THEN '*' ELSE '' END, ''
                        ORDER BY {_ORDER}) AS letters
      FROM sys.grants WHERE namespace IN ('relation', 'topic')
      GROUP BY namespace, name, grantee, grantor) AS g
LEFT JOIN sys.owners AS o ON o.namespace = g.namespace AND o.name = g.name
GROUP BY g.namespace, g.name, o.owner
"""

# Every role with its OID, superuser flag and own connection limit (-1: none); the
# connected user is always there.
ROLE_SOURCE = f"""
SELECT CASE WHEN name = {{user}} THEN {ROLE_OID}
            ELSE {ROLE_OID_BASE} + row_number() OVER (ORDER BY name) END::BIGINT AS oid,
       name, superuser, connection_limit
FROM (SELECT name, superuser, connection_limit FROM sys.roles
      UNION ALL
      -- a name the users file does not hold: only --auth trust lets it in, as a superuser
      SELECT {{user}}, true, -1 WHERE {{user}} NOT IN (SELECT name FROM sys.roles))
"""

ROLES = """
SELECT oid, name AS rolname, superuser AS rolsuper, true AS rolinherit,
       superuser AS rolcreaterole, superuser AS rolcreatedb, true AS rolcanlogin,
       false AS rolreplication, superuser AS rolbypassrls, connection_limit AS rolconnlimit,
       '********' AS rolpassword, NULL::TIMESTAMPTZ AS rolvaliduntil,
       NULL::VARCHAR[] AS rolconfig
FROM __pg_role_source
"""

USER = """
SELECT name AS usename, oid AS usesysid, superuser AS usecreatedb, superuser AS usesuper,
       false AS userepl, superuser AS usebypassrls, '********' AS passwd,
       NULL::TIMESTAMPTZ AS valuntil, NULL::VARCHAR[] AS useconfig
FROM __pg_role_source
"""

# PostgreSQL lists the owner's privileges too (granted by the owner, grantable).
TABLE_PRIVILEGES = """
SELECT grantor, CASE grantee WHEN '' THEN 'PUBLIC' ELSE grantee END AS grantee,
       {database} AS table_catalog, 'main' AS table_schema, name AS table_name,
       privilege AS privilege_type, CASE WHEN grantable THEN 'YES' ELSE 'NO' END AS is_grantable,
       CASE WHEN privilege = 'SELECT' THEN 'YES' ELSE 'NO' END AS with_hierarchy
FROM (SELECT name, grantee, privilege, grantor, grantable FROM sys.grants
      WHERE namespace = 'relation' AND name NOT LIKE '%.%'
      UNION ALL
      SELECT o.name, o.owner, p.privilege, o.owner, true
      FROM sys.owners AS o, (VALUES ('SELECT'), ('INSERT'), ('UPDATE'), ('DELETE')) AS p(privilege)
      WHERE o.namespace = 'relation' AND o.name NOT LIKE '%.%')
"""


def has_table_privilege(user_sql: str, table_sql: str, privilege_sql: str) -> str:
    """``has_table_privilege(user, table, privilege)`` as a DuckDB expression.

    ``table`` is a name (``t``, ``main.t``) or an OID of ``pg_class``; ``privilege`` is one
    or more of SELECT, INSERT, UPDATE, DELETE (comma-separated, any one suffices, ``WITH
    GRANT OPTION`` asks for the option), as PostgreSQL reads it. True for superusers and
    owners (an object without an owner row is the bootstrap superuser's).
    """
    by_name = f"regexp_replace(lower(CAST({table_sql} AS VARCHAR)), '^(tables\\.)?main\\.', '')"
    by_oid = f"(SELECT lower(relname) FROM __pg_class WHERE oid = TRY_CAST({table_sql} AS BIGINT))"
    name = f"(CASE WHEN typeof({table_sql}) LIKE '%INT%' THEN {by_oid} ELSE {by_name} END)"
    wanted = (f"list_transform(string_split(upper({privilege_sql}), ','), "
              "x -> trim(replace(x, 'WITH GRANT OPTION', '')))")  # fmt: skip
    option = f"contains(upper({privilege_sql}), 'WITH GRANT OPTION')"
    return (
        f"(coalesce((SELECT superuser FROM __pg_role_source WHERE name = {user_sql}), false) "
        f"OR coalesce((SELECT owner FROM sys.owners WHERE namespace = 'relation' "
        f"AND name = {name}), 'topicbase') = {user_sql} "
        f"OR EXISTS (SELECT 1 FROM sys.grants WHERE namespace = 'relation' AND name = {name} "
        f"AND grantee IN ({user_sql}, '') AND list_contains({wanted}, privilege) "
        f"AND (grantable OR NOT {option})))"
    )
