"""The PostgreSQL emulation: what a PostgreSQL client expects to find, over DuckDB.

``pg_types`` (the ``pg_type`` rows), ``pg_privileges`` (owners, grants, roles),
``pg_relations`` (the ``pg_catalog``/``information_schema`` relations), ``pg_functions``
(PostgreSQL functions), ``pg_rewrite`` (catalog queries into DuckDB SQL), ``pg_settings``
(the settings table, SET/SHOW/RESET), ``setting_changes`` (SET undone by rollback, reported
changes) and ``surface`` (``ConnectionCatalog``: one connection's PostgreSQL surface, which
runs session commands and rewritten catalog queries). Imports neither the connection nor
the codecs.
"""
