"""The emulated ``pg_catalog`` and ``information_schema`` relations, as DuckDB SQL.

Each relation is a query over DuckDB's metadata functions (``duckdb_tables()``,
``duckdb_columns()``, ``duckdb_constraints()``, ``duckdb_indexes()``, ``duckdb_views()``,
``duckdb_schemas()``, ``duckdb_sequences()``) and, for topics, the engine's
``sys.topics`` view. The rewriter (``pg_rewrite``) puts the ones a query needs in a
``WITH`` clause named ``__pg_<relation>``; a relation may use other ones (``needs``).

What the catalog shows:
- Namespaces: ``pg_catalog`` (11), ``information_schema`` (13183), and the schemas of
  the DuckDB database (``main`` is the default schema). The engine's schema
  ``__topicbase`` is never shown.
- Relations (``pg_class``): tables (relkind ``r``), views (``v``), indexes (``i``, also one
  per PRIMARY KEY / UNIQUE constraint, which DuckDB does not list as an index),
  sequences (``S``) and **topics as foreign tables (``f``)** in schema ``main``: a topic
  is data Topicbase keeps outside DuckDB and reads with ``FROM TOPIC``, which is what a
  foreign table is to PostgreSQL. psql's ``\\d`` lists them as "foreign table", ``\\d
  topic`` shows their ten columns and "Server: topics" with the topic's partitions and
  consumers as options; SQLAlchemy reports them by ``get_foreign_table_names()``.
- OIDs: DuckDB's catalog OIDs for tables, views, indexes, schemas, sequences (stable
  while the object exists); ``1_000_000_000 + n`` for topic ``t<n>``;
  ``2_000_000_000 + table_oid * 100 + k`` for the k-th constraint of a table (and its
  index); ``10`` is the connected role, other roles (the users file) follow
  ``pg_privileges.ROLE_OID_BASE``; the database is ``16384``.
- Privileges (``pg_privileges``): ``pg_class.relacl`` as aclitem text, ``pg_roles`` and
  friends with ``rolsuper`` from the users file, ``information_schema.table_privileges``.
- Types are PostgreSQL OIDs (``pg_types``); ``atttypmod`` carries numeric precision.

Placeholders ``{user}`` and ``{database}`` are replaced by quoted literals. Pure data.
"""

from __future__ import annotations

from dataclasses import dataclass

from sql.pgwire.emulation import pg_privileges
from sql.pgwire.emulation.pg_types import all_types, duckdb_type_oid_sql

HIDDEN_SCHEMAS = ("__topicbase", "pg_catalog", "information_schema")
TOPIC_OID_BASE = 1_000_000_000
CONSTRAINT_OID_BASE = 2_000_000_000
DATABASE_OID = 16384
ROLE_OID = 10


@dataclass(frozen=True)
class Relation:
    sql: str
    needs: tuple[str, ...] = ()


_HIDDEN = ", ".join(f"'{name}'" for name in HIDDEN_SCHEMAS)
_MAIN_OID = (
    "(SELECT oid FROM duckdb_schemas() WHERE database_name = current_database() "
    "AND schema_name = 'main')"
)
_TOPIC_OID = f"({TOPIC_OID_BASE} + CAST(substr(topic_id, 2) AS BIGINT))"
_USER_TABLES = (
    f"duckdb_tables() WHERE database_name = current_database() AND schema_name NOT IN ({_HIDDEN})"
)
_USER_VIEWS = (
    "duckdb_views() WHERE database_name = current_database() AND NOT internal "
    f"AND schema_name NOT IN ({_HIDDEN})"
)

# Topic relation columns: name, type OID, NOT NULL. Matches the engine's read schema.
TOPIC_COLUMNS: tuple[tuple[str, int, bool], ...] = (
    ("partition", 23, True), ("offset", 20, True), ("seq_no", 20, False),
    ("producer_id", 25, False), ("message_group_id", 25, False), ("created_at", 1184, False),
    ("written_at", 1184, True), ("codec", 25, True), ("data", 17, True), ("metadata", 114, False),
)  # fmt: skip
_TOPIC_COLUMN_VALUES = ", ".join(
    f"('{name}', {oid}, {str(not_null).lower()}, {number})"
    for number, (name, oid, not_null) in enumerate(TOPIC_COLUMNS, start=1)
)

# Every column of the user's tables and views, read once per query (duckdb_columns() costs
# a scan of all catalog columns, system ones included, each time it is called).
_COLUMNS = f"""
SELECT database_name, schema_name, schema_oid, table_oid, table_name, column_name,
       column_index, column_default, is_nullable, data_type, numeric_precision,
       numeric_scale, comment, {duckdb_type_oid_sql("data_type")} AS type_oid
FROM duckdb_columns()
WHERE database_name = current_database() AND schema_name NOT IN ({_HIDDEN})
"""

_CONSTRAINTS = f"""
SELECT table_oid, schema_oid, table_name, constraint_type, constraint_text, expression,
       constraint_column_indexes, constraint_column_names, constraint_name, referenced_table,
       referenced_column_names,
       {CONSTRAINT_OID_BASE} + table_oid * 100
         + row_number() OVER (PARTITION BY table_oid ORDER BY constraint_index) AS oid
FROM duckdb_constraints()
WHERE database_name = current_database() AND schema_name NOT IN ({_HIDDEN})
  AND constraint_type IN ('PRIMARY KEY', 'UNIQUE', 'FOREIGN KEY', 'CHECK')
"""
# The referenced table's OID and column numbers of each foreign key (confrelid, confkey).
_FOREIGN_KEYS = """
SELECT u.oid, min(c.table_oid) AS confrelid, list(c.column_index ORDER BY u.i) AS confkey
FROM (SELECT oid, schema_oid, referenced_table, unnest(referenced_column_names) AS n,
             generate_subscripts(referenced_column_names, 1) AS i
      FROM __pg_constraint_source WHERE constraint_type = 'FOREIGN KEY') AS u
JOIN __pg_columns_source AS c
  ON c.schema_oid = u.schema_oid AND c.table_name = u.referenced_table AND c.column_name = u.n
GROUP BY u.oid
"""

_CLASS = f"""
SELECT oid, relname, relnamespace, relkind, relnatts, relhasindex, relchecks, relam,
       0::BIGINT AS reltype, 0::BIGINT AS reloftype, {ROLE_OID}::BIGINT AS relowner,
       oid AS relfilenode, 0::BIGINT AS reltablespace, 0 AS relpages, -1.0::FLOAT AS reltuples,
       0 AS relallvisible, 0::BIGINT AS reltoastrelid, false AS relisshared,
       'p' AS relpersistence, false AS relhasrules,
       -- psql shows foreign keys only of tables with triggers (PostgreSQL's FK triggers)
       oid IN (SELECT table_oid FROM __pg_constraint_source WHERE constraint_type = 'FOREIGN KEY')
         OR (relkind = 'r' AND relname IN (SELECT referenced_table FROM __pg_constraint_source
                                           WHERE constraint_type = 'FOREIGN KEY'))
         AS relhastriggers,
       false AS relhassubclass, false AS relrowsecurity, false AS relforcerowsecurity,
       true AS relispopulated, 'd' AS relreplident, false AS relispartition,
       0::BIGINT AS relrewrite, 0::BIGINT AS relfrozenxid, 0::BIGINT AS relminmxid,
       -- owners and grants (emulation.pg_privileges); tables, views and topics live in main
       (SELECT a.acl FROM __pg_acl AS a WHERE c.relkind IN ('r', 'v', 'f')
          AND c.relnamespace = {_MAIN_OID} AND a.is_topic = (c.relkind = 'f')
          AND a.relname = CASE WHEN c.relkind = 'f' THEN c.relname ELSE lower(c.relname) END)
         AS relacl,
       NULL::VARCHAR[] AS reloptions, NULL::VARCHAR AS relpartbound
FROM (
  SELECT table_oid AS oid, table_name AS relname, schema_oid AS relnamespace, 'r' AS relkind,
         column_count AS relnatts,
         index_count > 0 OR table_oid IN (SELECT table_oid FROM __pg_constraint_source
                                          WHERE constraint_type IN ('PRIMARY KEY', 'UNIQUE'))
           AS relhasindex,
         check_constraint_count AS relchecks, 2 AS relam
  FROM {_USER_TABLES}
  UNION ALL
  SELECT view_oid, view_name, schema_oid, 'v', column_count, false, 0, 0 FROM {_USER_VIEWS}
  UNION ALL
  SELECT index_oid, index_name, schema_oid, 'i', 1, false, 0, 403 FROM duckdb_indexes()
  WHERE database_name = current_database() AND schema_name NOT IN ({_HIDDEN})
  UNION ALL
  SELECT oid, constraint_name, schema_oid, 'i', len(constraint_column_indexes), false, 0, 403
  FROM __pg_constraint_source WHERE constraint_type IN ('PRIMARY KEY', 'UNIQUE')
  UNION ALL
  SELECT sequence_oid, sequence_name, schema_oid, 'S', 3, false, 0, 0 FROM duckdb_sequences()
  WHERE database_name = current_database() AND schema_name NOT IN ({_HIDDEN})
  UNION ALL
  SELECT {_TOPIC_OID}, name, {_MAIN_OID}, 'f', {len(TOPIC_COLUMNS)}, false, 0, 0
  FROM sys.topics
) AS c
"""

_ATTRIBUTE = f"""
SELECT attrelid, attname, atttypid, attnum, atttypmod, attnotnull, atthasdef,
       -1 AS attstattarget, -1 AS attlen, 0 AS attndims, -1 AS attcacheoff, false AS attbyval,
       'i' AS attalign, 'p' AS attstorage, '' AS attcompression, false AS atthasmissing,
       '' AS attidentity, '' AS attgenerated, false AS attisdropped, true AS attislocal,
       0 AS attinhcount, 0::BIGINT AS attcollation, NULL::VARCHAR[] AS attacl,
       NULL::VARCHAR[] AS attoptions, NULL::VARCHAR[] AS attfdwoptions,
       NULL::VARCHAR AS attmissingval
FROM (
  SELECT table_oid AS attrelid, column_name AS attname,
         type_oid AS atttypid, column_index AS attnum,
         CASE WHEN data_type LIKE 'DECIMAL(%' THEN numeric_precision * 65536 + numeric_scale + 4
              ELSE -1 END AS atttypmod,
         NOT is_nullable AS attnotnull, column_default IS NOT NULL AS atthasdef
  FROM __pg_columns_source
  WHERE database_name = current_database() AND schema_name NOT IN ({_HIDDEN})
  UNION ALL
  SELECT {_TOPIC_OID}, c.name, c.type_oid, c.number, -1, c.not_null, false
  FROM sys.topics, (VALUES {_TOPIC_COLUMN_VALUES}) AS c(name, type_oid, not_null, number)
  UNION ALL  -- the columns of the index of each PRIMARY KEY / UNIQUE constraint
  SELECT s.oid, c.column_name, c.type_oid, s.position, -1, false,
         false
  FROM (SELECT oid, table_oid, unnest(constraint_column_indexes) + 1 AS column_index,
               generate_subscripts(constraint_column_indexes, 1) AS position
        FROM __pg_constraint_source WHERE constraint_type IN ('PRIMARY KEY', 'UNIQUE')) AS s
  JOIN __pg_columns_source AS c ON c.table_oid = s.table_oid AND c.column_index = s.column_index
  UNION ALL  -- the columns (or expressions, as text) of each DuckDB index
  SELECT e.index_oid, e.name, COALESCE(c.type_oid, 25), e.position,
         -1, false, false
  FROM (SELECT index_oid, table_oid,
               trim(unnest(string_split(trim(expressions, '[]'), ',')), ' "') AS name,
               generate_subscripts(string_split(trim(expressions, '[]'), ','), 1) AS position
        FROM duckdb_indexes() WHERE database_name = current_database()) AS e
  LEFT JOIN __pg_columns_source AS c ON c.table_oid = e.table_oid AND c.column_name = e.name
)
"""

_INDEX = """
SELECT oid AS indexrelid, table_oid AS indrelid, len(constraint_column_indexes) AS indnatts,
       len(constraint_column_indexes) AS indnkeyatts,
       true AS indisunique, constraint_type = 'PRIMARY KEY' AS indisprimary,
       false AS indisexclusion, true AS indimmediate, false AS indisclustered,
       true AS indisvalid, false AS indcheckxmin, true AS indisready, true AS indislive,
       false AS indisreplident,
       list_transform(constraint_column_indexes, lambda x: x + 1) AS indkey,
       NULL::BIGINT[] AS indcollation, NULL::BIGINT[] AS indclass,
       list_transform(constraint_column_indexes, lambda x: 0) AS indoption,
       NULL::VARCHAR AS indexprs, NULL::VARCHAR AS indpred, false AS indnullsnotdistinct,
       'CREATE UNIQUE INDEX ' || constraint_name || ' ON ' || table_name || ' USING btree ('
         || array_to_string(constraint_column_names, ', ') || ')' AS indexdef
FROM __pg_constraint_source s WHERE constraint_type IN ('PRIMARY KEY', 'UNIQUE')
UNION ALL
SELECT i.index_oid, i.table_oid, len(k.indkey), len(k.indkey), i.is_unique, i.is_primary,
       false, true, false, true, false, true, true, false, k.indkey, NULL, NULL,
       list_transform(k.indkey, lambda x: 0), NULL, NULL, false,
       'CREATE ' || CASE WHEN i.is_unique THEN 'UNIQUE ' ELSE '' END || 'INDEX ' || i.index_name
         || ' ON ' || i.schema_name || '.' || i.table_name || ' USING btree ('
         || trim(i.expressions, '[]') || ')'
FROM duckdb_indexes() AS i
JOIN (  -- column numbers of the indexed expressions, 0 for one that is not a plain column
  SELECT e.index_oid, list(COALESCE(c.column_index, 0) ORDER BY e.position) AS indkey
  FROM (SELECT index_oid, table_oid,
               trim(unnest(string_split(trim(expressions, '[]'), ',')), ' "') AS name,
               generate_subscripts(string_split(trim(expressions, '[]'), ','), 1) AS position
        FROM duckdb_indexes() WHERE database_name = current_database()) AS e
  LEFT JOIN __pg_columns_source AS c ON c.table_oid = e.table_oid AND c.column_name = e.name
  GROUP BY e.index_oid
) AS k ON k.index_oid = i.index_oid
WHERE i.database_name = current_database()
"""

_CONSTRAINT = """
SELECT s.oid, constraint_name AS conname, schema_oid AS connamespace,
       CASE constraint_type WHEN 'PRIMARY KEY' THEN 'p' WHEN 'UNIQUE' THEN 'u'
            WHEN 'FOREIGN KEY' THEN 'f' ELSE 'c' END AS contype,
       false AS condeferrable, false AS condeferred, true AS convalidated,
       table_oid AS conrelid, 0::BIGINT AS contypid,
       CASE WHEN constraint_type IN ('PRIMARY KEY', 'UNIQUE') THEN s.oid ELSE 0 END AS conindid,
       0::BIGINT AS conparentid,
       COALESCE(f.confrelid, 0) AS confrelid,
       'a' AS confupdtype, 'a' AS confdeltype, 's' AS confmatchtype, true AS conislocal,
       0 AS coninhcount, true AS connoinherit,
       list_transform(constraint_column_indexes, lambda x: x + 1) AS conkey,
       confkey,
       NULL::BIGINT[] AS conpfeqop, NULL::BIGINT[] AS conppeqop, NULL::BIGINT[] AS conffeqop,
       NULL::BIGINT[] AS conexclop, expression AS conbin,
       CASE constraint_type
         WHEN 'CHECK' THEN 'CHECK (' || expression || ')'
         WHEN 'FOREIGN KEY' THEN constraint_text
         ELSE regexp_replace(constraint_text, '^(PRIMARY KEY|UNIQUE)\\(', '\\1 (') END
         AS condef
FROM __pg_constraint_source AS s LEFT JOIN __pg_foreign_keys AS f ON f.oid = s.oid
"""

_TYPE_VALUES = ", ".join(
    f"({oid}, '{name}', {length}, '{category}', {array_oid}, {element})"
    for oid, name, length, category, array_oid, element, _ in all_types()
)
_TYPE_NAMES = ", ".join(
    f"({oid}, '{name}', '{shown.replace(chr(39), chr(39) * 2)}')"
    for oid, name, _, _, _, _, shown in all_types()
)
_TYPE = f"""
SELECT oid, typname, 11::BIGINT AS typnamespace, {ROLE_OID}::BIGINT AS typowner, typlen,
       typlen > 0 AND typlen <= 8 AS typbyval, CASE WHEN typcategory = 'P' THEN 'p' ELSE 'b' END
         AS typtype,
       typcategory, false AS typispreferred, true AS typisdefined, ',' AS typdelim,
       0::BIGINT AS typrelid, '-' AS typsubscript, typelem, typarray,
       typname || 'in' AS typinput, typname || 'out' AS typoutput,
       typname || 'recv' AS typreceive, typname || 'send' AS typsend, '-' AS typmodin,
       '-' AS typmodout, '-' AS typanalyze, 'i' AS typalign, 'p' AS typstorage,
       false AS typnotnull, 0::BIGINT AS typbasetype, -1 AS typtypmod, 0 AS typndims,
       0::BIGINT AS typcollation, NULL::VARCHAR AS typdefaultbin, NULL::VARCHAR AS typdefault,
       NULL::VARCHAR[] AS typacl
FROM (VALUES {_TYPE_VALUES}) AS t(oid, typname, typlen, typcategory, typarray, typelem)
"""

_NAMESPACE = f"""
SELECT 11::BIGINT AS oid, 'pg_catalog' AS nspname, {ROLE_OID}::BIGINT AS nspowner,
       NULL::VARCHAR[] AS nspacl
UNION ALL SELECT 13183, 'information_schema', {ROLE_OID}, NULL
UNION ALL SELECT 99, 'pg_toast', {ROLE_OID}, NULL
UNION ALL SELECT oid, schema_name, {ROLE_OID}, NULL FROM duckdb_schemas()
WHERE database_name = current_database() AND schema_name NOT IN ({_HIDDEN})
"""

_ATTRDEF = f"""
SELECT {CONSTRAINT_OID_BASE} - 100000 + row_number() OVER () AS oid, table_oid AS adrelid,
       column_index AS adnum, column_default AS adbin
FROM __pg_columns_source
WHERE database_name = current_database() AND schema_name NOT IN ({_HIDDEN})
  AND column_default IS NOT NULL
"""

_DESCRIPTION = f"""
SELECT table_oid AS objoid, 1259::BIGINT AS classoid, 0 AS objsubid, comment AS description
FROM {_USER_TABLES} AND comment IS NOT NULL
UNION ALL
SELECT view_oid, 1259, 0, comment FROM {_USER_VIEWS} AND comment IS NOT NULL
UNION ALL
SELECT table_oid, 1259, column_index, comment FROM __pg_columns_source
WHERE database_name = current_database() AND schema_name NOT IN ({_HIDDEN})
  AND comment IS NOT NULL
"""

_DATABASE = f"""
SELECT {DATABASE_OID}::BIGINT AS oid, {{database}} AS datname, {ROLE_OID}::BIGINT AS datdba,
       6 AS encoding, 'c' AS datlocprovider, false AS datistemplate, true AS datallowconn,
       -1 AS datconnlimit, 0::BIGINT AS datfrozenxid, 0::BIGINT AS datminmxid,
       1663::BIGINT AS dattablespace, 'C' AS datcollate, 'C' AS datctype,
       NULL::VARCHAR AS daticulocale, NULL::VARCHAR AS datcollversion,
       NULL::VARCHAR[] AS datacl
"""

_FOREIGN_TABLE = f"""
SELECT {_TOPIC_OID} AS ftrelid, 1::BIGINT AS ftserver,
       ['partitions=' || partitions, 'active_partitions=' || active_partitions,
        'consumers=' || consumers] AS ftoptions
FROM sys.topics
"""

_FOREIGN_SERVER = f"""
SELECT 1::BIGINT AS oid, 'topics' AS srvname, {ROLE_OID}::BIGINT AS srvowner,
       1::BIGINT AS srvfdw, NULL::VARCHAR AS srvtype, NULL::VARCHAR AS srvversion,
       NULL::VARCHAR[] AS srvacl, NULL::VARCHAR[] AS srvoptions
"""

_IS_TABLES = """
SELECT {database} AS table_catalog, n.nspname AS table_schema, c.relname AS table_name,
       CASE c.relkind WHEN 'r' THEN 'BASE TABLE' WHEN 'v' THEN 'VIEW'
            WHEN 'f' THEN 'FOREIGN' END AS table_type,
       NULL::VARCHAR AS self_referencing_column_name, NULL::VARCHAR AS reference_generation,
       NULL::VARCHAR AS user_defined_type_catalog, NULL::VARCHAR AS user_defined_type_schema,
       NULL::VARCHAR AS user_defined_type_name,
       CASE WHEN c.relkind = 'r' THEN 'YES' ELSE 'NO' END AS is_insertable_into,
       'NO' AS is_typed, NULL::VARCHAR AS commit_action
FROM __pg_class c JOIN __pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind IN ('r', 'v', 'f')
"""

_IS_COLUMNS = f"""
SELECT {{database}} AS table_catalog, n.nspname AS table_schema, c.relname AS table_name,
       a.attname AS column_name, a.attnum AS ordinal_position,
       d.adbin AS column_default, CASE WHEN a.attnotnull THEN 'NO' ELSE 'YES' END AS is_nullable,
       CASE WHEN a.atttypid = 1700 THEN 'numeric' ELSE t.shown END AS data_type,
       NULL::INTEGER AS character_maximum_length, NULL::INTEGER AS character_octet_length,
       CASE WHEN a.atttypid = 1700 AND a.atttypmod > 0 THEN (a.atttypmod - 4) // 65536 END
         AS numeric_precision,
       CASE WHEN a.atttypid = 1700 THEN 10 END AS numeric_precision_radix,
       CASE WHEN a.atttypid = 1700 AND a.atttypmod > 0 THEN (a.atttypmod - 4) % 65536 END
         AS numeric_scale,
       NULL::INTEGER AS datetime_precision, {{database}} AS udt_catalog,
       'pg_catalog' AS udt_schema, t.typname AS udt_name, 'NO' AS is_identity,
       'NEVER' AS is_generated, CASE WHEN c.relkind = 'r' THEN 'YES' ELSE 'NO' END AS is_updatable
FROM __pg_attribute a
JOIN __pg_class c ON c.oid = a.attrelid AND c.relkind IN ('r', 'v', 'f')
JOIN __pg_namespace n ON n.oid = c.relnamespace
LEFT JOIN __pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
LEFT JOIN (VALUES {_TYPE_NAMES}) AS t(oid, typname, shown) ON t.oid = a.atttypid
"""


def _empty(columns: str) -> str:
    """An empty relation; ``columns`` is ``name TYPE, ...``."""
    selected = ", ".join(
        f"NULL::{part.split()[1]} AS {part.split()[0]}" for part in columns.split(", ")
    )
    return f"SELECT {selected} WHERE false"


RELATIONS: dict[str, Relation] = {
    "columns_source": Relation(_COLUMNS),
    "constraint_source": Relation(_CONSTRAINTS),
    "foreign_keys": Relation(_FOREIGN_KEYS, ("constraint_source", "columns_source")),
    "pg_namespace": Relation(_NAMESPACE),
    "pg_class": Relation(_CLASS, ("constraint_source", "acl")),
    "acl": Relation(pg_privileges.ACL),
    "role_source": Relation(pg_privileges.ROLE_SOURCE),
    "pg_attribute": Relation(_ATTRIBUTE, ("constraint_source", "columns_source")),
    "pg_type": Relation(_TYPE),
    "pg_index": Relation(_INDEX, ("constraint_source", "columns_source")),
    "pg_constraint": Relation(_CONSTRAINT, ("constraint_source", "foreign_keys")),
    "pg_attrdef": Relation(_ATTRDEF, ("columns_source",)),
    "pg_description": Relation(_DESCRIPTION, ("columns_source",)),
    "pg_database": Relation(_DATABASE),
    "pg_roles": Relation(pg_privileges.ROLES, ("role_source",)),
    "pg_authid": Relation(pg_privileges.ROLES, ("role_source",)),
    "pg_user": Relation(pg_privileges.USER, ("role_source",)),
    "pg_foreign_table": Relation(_FOREIGN_TABLE),
    "pg_foreign_server": Relation(_FOREIGN_SERVER),
    "pg_am": Relation(
        "SELECT 2::BIGINT AS oid, 'heap' AS amname, 't' AS amtype "
        "UNION ALL SELECT 403, 'btree', 'i'"
    ),
    "pg_tablespace": Relation(
        "SELECT 1663::BIGINT AS oid, 'pg_default' AS spcname, 10::BIGINT AS spcowner, "
        "NULL::VARCHAR[] AS spcacl, NULL::VARCHAR[] AS spcoptions"
    ),
    "pg_inherits": Relation(
        _empty("inhrelid BIGINT, inhparent BIGINT, inhseqno INTEGER, inhdetachpending BOOLEAN")
    ),
    "pg_collation": Relation(
        _empty("oid BIGINT, collname VARCHAR, collnamespace BIGINT, collprovider VARCHAR")
    ),
    "pg_enum": Relation(
        _empty("oid BIGINT, enumtypid BIGINT, enumsortorder FLOAT, enumlabel VARCHAR")
    ),
    "pg_auth_members": Relation(
        _empty("oid BIGINT, roleid BIGINT, member BIGINT, grantor BIGINT, admin_option BOOLEAN")
    ),
    "pg_policy": Relation(
        _empty(
            "oid BIGINT, polname VARCHAR, polrelid BIGINT, polcmd VARCHAR, polpermissive BOOLEAN, "
            "polroles BIGINT[], polqual VARCHAR, polwithcheck VARCHAR"
        )
    ),
    "pg_statistic_ext": Relation(
        _empty(
            "oid BIGINT, stxrelid BIGINT, stxname VARCHAR, stxnamespace BIGINT, stxowner BIGINT, "
            "stxstattarget INTEGER, stxkeys SMALLINT[], stxkind VARCHAR[], stxexprs VARCHAR"
        )
    ),
    "pg_trigger": Relation(
        _empty(
            "oid BIGINT, tgrelid BIGINT, tgparentid BIGINT, tgname VARCHAR, tgfoid BIGINT, "
            "tgtype SMALLINT, tgenabled VARCHAR, tgisinternal BOOLEAN, tgconstraint BIGINT"
        )
    ),
    "pg_rewrite": Relation(
        _empty(
            "oid BIGINT, rulename VARCHAR, ev_class BIGINT, ev_type VARCHAR, ev_enabled VARCHAR, "
            "is_instead BOOLEAN"
        )
    ),
    "pg_publication": Relation(
        _empty(
            "oid BIGINT, pubname VARCHAR, pubowner BIGINT, puballtables BOOLEAN, "
            "pubinsert BOOLEAN, pubupdate BOOLEAN, pubdelete BOOLEAN, pubtruncate BOOLEAN, "
            "pubviaroot BOOLEAN"
        )
    ),
    "pg_publication_rel": Relation(
        _empty("oid BIGINT, prpubid BIGINT, prrelid BIGINT, prqual VARCHAR, prattrs SMALLINT[]")
    ),
    "pg_publication_namespace": Relation(_empty("oid BIGINT, pnpubid BIGINT, pnnspid BIGINT")),
    "pg_extension": Relation(
        _empty(
            "oid BIGINT, extname VARCHAR, extowner BIGINT, extnamespace BIGINT, "
            "extrelocatable BOOLEAN, extversion VARCHAR"
        )
    ),
    "pg_sequence": Relation(
        _empty(
            "seqrelid BIGINT, seqtypid BIGINT, seqstart BIGINT, seqincrement BIGINT, "
            "seqmax BIGINT, seqmin BIGINT, seqcache BIGINT, seqcycle BOOLEAN"
        )
    ),
    "pg_opclass": Relation(
        _empty(
            "oid BIGINT, opcmethod BIGINT, opcname VARCHAR, opcnamespace BIGINT, opcdefault BOOLEAN"
        )
    ),
    "pg_depend": Relation(
        _empty(
            "classid BIGINT, objid BIGINT, objsubid INTEGER, refclassid BIGINT, refobjid BIGINT, "
            "refobjsubid INTEGER, deptype VARCHAR"
        )
    ),
    "pg_proc": Relation(
        _empty(
            "oid BIGINT, proname VARCHAR, pronamespace BIGINT, prokind VARCHAR, prorettype BIGINT"
        )
    ),
    "pg_partitioned_table": Relation(
        _empty("partrelid BIGINT, partstrat VARCHAR, partnatts SMALLINT, partattrs SMALLINT[]")
    ),
    "is_tables": Relation(_IS_TABLES, ("pg_class", "pg_namespace")),
    "is_columns": Relation(_IS_COLUMNS, ("pg_attribute", "pg_class", "pg_namespace", "pg_attrdef")),
    "is_table_privileges": Relation(pg_privileges.TABLE_PRIVILEGES),
}

# information_schema relations by their name there.
INFORMATION_SCHEMA = {
    "tables": "is_tables", "columns": "is_columns", "table_privileges": "is_table_privileges",
}  # fmt: skip


def cte_name(relation: str) -> str:
    """``pg_class`` -> ``__pg_class``; ``is_tables`` -> ``__pg_is_tables``."""
    return "__" + relation if relation.startswith("pg_") else "__pg_" + relation


def with_dependencies(names: set[str]) -> list[str]:
    """``names`` and every relation they need, dependencies first."""
    ordered: list[str] = []

    def visit(name: str) -> None:
        if name in ordered:
            return
        for needed in RELATIONS[name].needs:
            visit(needed)
        ordered.append(name)

    for name in sorted(names):
        visit(name)
    return ordered


def relation_sql(name: str, user: str, database: str) -> str:
    """The SQL of one relation with its ``__pg_`` references and placeholders filled in."""
    sql = RELATIONS[name].sql
    return sql.replace("{user}", _literal(user)).replace("{database}", _literal(database))


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"
