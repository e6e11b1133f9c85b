"""The literal-SELECT tests' shared pieces: a spy on ``engine.tables.query_rows`` that
records the texts run in DuckDB on the thread's literal connection (nothing kept or learnt
of any text beforehand), and a statement read through the simple protocol's stream."""

from __future__ import annotations

from typing import Any

import pytest

from engine import session as session_module
from engine import tables
from engine.session import Session
from storage.errors import TopicbaseError


def literal_runs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The texts ``tables.query_rows`` ran on a literal connection, in order (any thread's:
    a server's too). The kept rows and the rows' way's knowledge are emptied first, so a
    text's first run is DuckDB's Arrow and its second the rows' way."""
    taken: list[str] = []
    original = tables.query_rows

    def spying(cursor: Any, sql: str, parameters: Any = None, **options: Any) -> Any:
        if cursor is tables.literal_cursor():
            taken.append(sql)
        return original(cursor, sql, parameters, **options)

    monkeypatch.setattr(tables, "query_rows", spying)
    tables._literal_results.clear()
    tables._small_results.clear()
    return taken


def positional(batches: Any) -> list[tuple[Any, ...]]:
    """The rows of Arrow tables or batches as tuples (not dicts: names may repeat)."""
    return [
        tuple(column[index].as_py() for column in batch.columns)
        for batch in batches
        for index in range(batch.num_rows)
    ]


def streamed(session: Session, sql: str, parameters: Any, whole: bool) -> Any:
    """``sql`` through ``open_stream`` (the simple protocol's way): its schema, DuckDB
    types and rows (taken whole when offered and ``whole``, else as batches), or its error."""
    statement = session_module.parse_statements(sql)[0]
    try:
        stream = session.open_stream(statement, parameters, no_rows=None)
    except TopicbaseError as error:
        return ("error", type(error).__name__, error.sqlstate, error.message, session.state)
    assert stream is not None
    try:
        taken = stream.take_whole() if whole else None
        if taken is not None:
            rows = [tuple(row) for row in taken.rows]
        else:
            batches = []
            while (batch := stream.next_batch()) is not None:
                batches.append(batch)
            rows = positional(batches)
        return (stream.schema, stream.schema.metadata, stream.duckdb_types, rows)
    finally:
        stream.close()
