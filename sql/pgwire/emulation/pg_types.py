"""PostgreSQL's built-in types as the emulated ``pg_type`` shows them, and DuckDB types
mapped onto them.

The OIDs are PostgreSQL 15's (fixed, advertised on the wire by ``types.py``): a client
that joins ``pg_attribute.atttypid`` to ``pg_type.oid``, or looks a type up by the OID
of a result column, finds the same row. DuckDB's own ``pg_catalog`` mixes DuckDB type
ids (``INTEGER`` is 13 there) with PostgreSQL OIDs, so nothing joins; this table is why
Topicbase does not use it.

The DuckDB → PostgreSQL mapping agrees with ``types.type_oid`` (which maps Arrow result
types): ``VARCHAR`` is ``text`` (DuckDB strings have no length), unsigned and huge
integers widen, nested types (lists, structs, maps) are ``json``.
Pure data and string builders; no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PgType:
    oid: int
    name: str  # typname
    length: int  # typlen, -1 for variable length
    category: str  # typcategory
    array_oid: int  # typarray, 0 if none
    shown: str  # format_type() without a modifier


BASE_TYPES: tuple[PgType, ...] = (
    PgType(16, "bool", 1, "B", 1000, "boolean"),
    PgType(17, "bytea", -1, "U", 1001, "bytea"),
    PgType(18, "char", 1, "Z", 1002, '"char"'),
    PgType(19, "name", 64, "S", 1003, "name"),
    PgType(20, "int8", 8, "N", 1016, "bigint"),
    PgType(21, "int2", 2, "N", 1005, "smallint"),
    PgType(22, "int2vector", -1, "A", 1006, "int2vector"),
    PgType(23, "int4", 4, "N", 1007, "integer"),
    PgType(24, "regproc", 4, "N", 1008, "regproc"),
    PgType(25, "text", -1, "S", 1009, "text"),
    PgType(26, "oid", 4, "N", 1028, "oid"),
    PgType(28, "xid", 4, "U", 1011, "xid"),
    PgType(30, "oidvector", -1, "A", 1013, "oidvector"),
    PgType(114, "json", -1, "U", 199, "json"),
    PgType(142, "xml", -1, "U", 143, "xml"),
    PgType(700, "float4", 4, "N", 1021, "real"),
    PgType(701, "float8", 8, "N", 1022, "double precision"),
    PgType(705, "unknown", -2, "X", 0, "unknown"),
    PgType(790, "money", 8, "N", 791, "money"),
    PgType(869, "inet", -1, "I", 1041, "inet"),
    PgType(1042, "bpchar", -1, "S", 1014, "character"),
    PgType(1043, "varchar", -1, "S", 1015, "character varying"),
    PgType(1082, "date", 4, "D", 1182, "date"),
    PgType(1083, "time", 8, "D", 1183, "time without time zone"),
    PgType(1114, "timestamp", 8, "D", 1115, "timestamp without time zone"),
    PgType(1184, "timestamptz", 8, "D", 1185, "timestamp with time zone"),
    PgType(1186, "interval", 16, "T", 1187, "interval"),
    PgType(1266, "timetz", 12, "D", 1270, "time with time zone"),
    PgType(1560, "bit", -1, "V", 1561, "bit"),
    PgType(1562, "varbit", -1, "V", 1563, "bit varying"),
    PgType(1700, "numeric", -1, "N", 1231, "numeric"),
    PgType(2205, "regclass", 4, "N", 2210, "regclass"),
    PgType(2206, "regtype", 4, "N", 2211, "regtype"),
    PgType(2249, "record", -1, "P", 2287, "record"),
    PgType(2277, "anyarray", -1, "P", 0, "anyarray"),
    PgType(2278, "void", 4, "P", 0, "void"),
    PgType(2950, "uuid", 16, "U", 2951, "uuid"),
    PgType(3802, "jsonb", -1, "U", 3807, "jsonb"),
)


def all_types() -> list[tuple[int, str, int, str, int, int, str]]:
    """(oid, typname, typlen, typcategory, typarray, typelem, shown) of base and array types."""
    rows = [(t.oid, t.name, t.length, t.category, t.array_oid, 0, t.shown) for t in BASE_TYPES]
    rows += [
        (t.array_oid, "_" + t.name, -1, "A", 0, t.oid, t.shown + "[]")
        for t in BASE_TYPES
        if t.array_oid
    ]
    assert len({row[0] for row in rows}) == len(rows), "type OIDs are unique"
    return rows


# DuckDB type names (as duckdb_columns().data_type spells them, without modifiers) -> OID.
_DUCKDB_TYPES: tuple[tuple[str, int], ...] = (
    ("BOOLEAN", 16), ("TINYINT", 21), ("SMALLINT", 21), ("UTINYINT", 21), ("INTEGER", 23),
    ("USMALLINT", 23), ("BIGINT", 20), ("UINTEGER", 20), ("UBIGINT", 1700),
    ("HUGEINT", 1700), ("UHUGEINT", 1700), ("BIGNUM", 1700), ("FLOAT", 700), ("DOUBLE", 701),
    ("DECIMAL", 1700), ("VARCHAR", 25), ("BLOB", 17), ("DATE", 1082), ("TIME", 1083),
    ("TIME WITH TIME ZONE", 1266), ("TIMESTAMP", 1114), ("TIMESTAMP_S", 1114),
    ("TIMESTAMP_MS", 1114), ("TIMESTAMP_NS", 1114), ("TIMESTAMP WITH TIME ZONE", 1184),
    ("INTERVAL", 1186), ("UUID", 2950), ("JSON", 114), ("BIT", 1560),
)  # fmt: skip


def duckdb_type_oid_sql(data_type: str) -> str:
    """SQL: the PostgreSQL OID of the DuckDB type named by the SQL expression ``data_type``.

    Lists, arrays, structs, maps and unions are ``json`` (114), as results show them;
    anything else unknown is ``text``.
    """
    base = f"regexp_replace({data_type}, '\\(.*$', '')"
    cases = " ".join(f"WHEN '{name}' THEN {oid}" for name, oid in _DUCKDB_TYPES)
    nested = (
        f"WHEN {data_type} LIKE '%[]' OR {data_type} LIKE '%]' OR {data_type} LIKE 'STRUCT(%' "
        f"OR {data_type} LIKE 'MAP(%' OR {data_type} LIKE 'UNION(%' THEN 114"
    )
    return f"(CASE {nested} ELSE (CASE {base} {cases} ELSE 25 END) END)"


def format_type_sql(type_oid: str, typmod: str) -> str:
    """SQL: PostgreSQL's ``format_type(oid, typmod)`` over the types above.

    ``numeric`` with a modifier shows ``numeric(p,s)``; character types ``(n)``. An
    unknown OID gives ``???`` as PostgreSQL does; a NULL OID gives NULL.
    """
    cases = " ".join(f"WHEN {oid} THEN '{shown.replace(chr(39), chr(39) * 2)}'"
                     for oid, _, _, _, _, _, shown in all_types())  # fmt: skip
    modifier = (
        f"CASE WHEN {typmod} IS NULL OR {typmod} < 0 THEN '' "
        f"WHEN {type_oid} = 1700 THEN '(' || (({typmod} - 4) // 65536) || ',' "
        f"|| (({typmod} - 4) % 65536) || ')' "
        f"WHEN {type_oid} IN (1042, 1043) THEN '(' || ({typmod} - 4) || ')' ELSE '' END"
    )
    return (
        f"(CASE WHEN {type_oid} IS NULL THEN NULL ELSE "
        f"COALESCE(CASE {type_oid} {cases} END, '???') || {modifier} END)"
    )
