"""The engine's public API: everything a front (``sql``, ``spark_sql_ext``) may import.

A front opens a ``Database``, makes a ``Session`` per connection (acting as an
``Identity``) and hands it statements; every statement then goes through the session's
door (planning, the sandbox, privileges, limits). Fronts also parse statement text to
decide their own protocol behaviour (COPY, cursors, session commands), so the statement
objects and the parser are re-exported here as the engine's statement vocabulary.

Fronts import nothing else of the engine, planner or grammar, and nothing of storage but
``storage.errors`` and ``storage.limits``: import-linter's "fronts use only engine.api"
contract in ``pyproject.toml`` enforces it.
"""

from __future__ import annotations

from engine.bulk import run_over_relation
from engine.bulk_read import OffsetRange, project_schema, read_range
from engine.bulk_write import ABANDON_AFTER_S_DEFAULT
from engine.check import check_database
from engine.clock import SYSTEM_CLOCK
from engine.database import Database
from engine.describe import Description
from engine.gc_tuning import freeze_owned_process
from engine.identity import LOCAL_SUPERUSER, LOCAL_SUPERUSER_NAME, Identity, RoleRemovedError
from engine.lookup_plans import lookup_shaped
from engine.malloc_tuning import configure as configure_malloc
from engine.packed_read import PackedBatch
from engine.privileges import use_role_lookup
from engine.result import Rows
from engine.session import Result, Session, parse_statements
from engine.streams import BATCH_ROWS, RowStream, from_table
from engine.transaction import SessionState
from grammar import ast
from grammar import settings as setting_rules
from grammar.bounded_cache import SCHEMA_COLUMN_BYTES, TEXT_COST_PER_CHAR, BoundedCache
from grammar.parse import parse, parse_one
from grammar.range_read import RangeRead, match_range_read
from grammar.settings import INSERT_COLUMNS
from grammar.split import (
    SourceText,
    Token,
    matching_parenthesis,
    split_statements,
    tokenize,
    unquote_identifier,
    unquote_string,
)
from grammar.text_cache import text_cache

__all__ = [
    "ABANDON_AFTER_S_DEFAULT",
    "BATCH_ROWS",
    "INSERT_COLUMNS",
    "LOCAL_SUPERUSER",
    "LOCAL_SUPERUSER_NAME",
    "SCHEMA_COLUMN_BYTES",
    "SYSTEM_CLOCK",
    "TEXT_COST_PER_CHAR",
    "BoundedCache",
    "Database",
    "Description",
    "Identity",
    "OffsetRange",
    "PackedBatch",
    "RangeRead",
    "Result",
    "RoleRemovedError",
    "RowStream",
    "Rows",
    "Session",
    "SessionState",
    "SourceText",
    "Token",
    "ast",
    "check_database",
    "configure_malloc",
    "freeze_owned_process",
    "from_table",
    "lookup_shaped",
    "match_range_read",
    "matching_parenthesis",
    "parse",
    "parse_one",
    "parse_statements",
    "project_schema",
    "read_range",
    "run_over_relation",
    "setting_rules",
    "split_statements",
    "text_cache",
    "tokenize",
    "unquote_identifier",
    "unquote_string",
    "use_role_lookup",
]
