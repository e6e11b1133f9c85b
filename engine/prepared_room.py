"""The bound on what a session's SQL-level prepared statements hold.

``PREPARE name AS statement`` (the statement, not the wire's Parse message) goes to
DuckDB, which keeps the statement and its plan on the session's connection until
DEALLOCATE or the session ends. DuckDB sets no bound on them, and every session shares
this one process: an ordinary user preparing statement after statement of a few MiB each
grew a server by ~7 MiB per MiB of text (measured: 100 PREPAREs of 1 MiB over the wire,
+711 MiB) until the machine ran out of memory. So a PREPARE that would leave the session holding
more than ``limits.SQL_PREPARED_STATEMENTS_PER_SESSION_MAX`` (16) statements, or more than
``limits.PREPARED_TEXT_CHARS_PER_CONNECTION_MAX`` characters of their texts (the wire's
bound on its own named statements), is refused with 54000 before DuckDB sees it; a PREPARE
that replaces a statement of the same name counts without the one it replaces.

This is NOT a bound on memory: DuckDB folds constants when it prepares, so each kept
statement may hold a value as large as one statement's result (``PREPARE p AS SELECT
repeat('x', 100000000)``: 48 characters, ~100 MB kept; review R2 F1, round 23). The count
keeps that to 16 such values a session; the sound fix (keep the text, run EXECUTE as the
text with its arguments bound, so DuckDB keeps nothing) is open. The engine's own kept plans
(``tables.PLAN_PREFIX``) are bounded where they are made and are not counted here.

One catalog query per PREPARE (a rare statement); thread-safe as the cursor is.
"""

from __future__ import annotations

from typing import Any

from engine import tables
from storage import limits
from storage.errors import LimitExceededError


def check_room(cursor: Any, sql: str) -> None:
    """Refuse (54000) the PREPARE ``sql`` if the statements ``cursor`` would then hold
    are over the bounds."""
    tokens = tables.sql_tokens(sql)
    if len(tokens) < 2:
        return  # not a PREPARE DuckDB can read: it refuses it itself
    name = tokens[1].text
    name = name[1:-1].replace('""', '"') if name.startswith('"') else name
    ((count, chars),) = tables.fetch_rows(
        cursor,
        "SELECT count(*), coalesce(sum(length(statement)), 0) FROM duckdb_prepared_statements() "
        "WHERE lower(name) <> lower(?) AND NOT starts_with(name, ?)",
        [name, tables.PLAN_PREFIX],
    )
    if count >= limits.SQL_PREPARED_STATEMENTS_PER_SESSION_MAX:
        raise LimitExceededError(
            f"too many prepared statements in this session (limit "
            f"{limits.SQL_PREPARED_STATEMENTS_PER_SESSION_MAX}): DEALLOCATE some first"
        )
    if chars + len(sql) > limits.PREPARED_TEXT_CHARS_PER_CONNECTION_MAX:
        raise LimitExceededError(
            "the prepared statements of this session would hold more than "
            f"{limits.PREPARED_TEXT_CHARS_PER_CONNECTION_MAX} characters of text: "
            "DEALLOCATE some first"
        )
