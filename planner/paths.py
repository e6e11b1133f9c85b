"""Topic names as YDB writes them: absolute paths inside the database.

YDB names a topic by its path in the database's tree: in a database ``/Root`` the topic
``/Root/dir/events`` is the one a relative name ``dir/events`` (or ``\\`dir/events\\```)
names. Topicbase is one database whose path is ``Database.open(..., database_path=...)``
(default ``DEFAULT_DATABASE_PATH``); the catalog keeps topics by their relative name.

This module owns that rule: ``check_database_path`` (a path of at least one component,
no empty, "." or ".." one, no trailing "/"), ``relative_name`` (42602 for an absolute
path outside the database, or for the database itself), and ``relative_statement``,
which the planner applies to every statement before planning it, so every later step
sees relative names only. Pure.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from grammar import ast
from storage.errors import InvalidNameError

DEFAULT_DATABASE_PATH = "/Root"


def check_database_path(path: str) -> str:
    """``path`` if it is a valid database path (``/Root``, ``/Root/db1``), else 42602."""
    components = path[1:].split("/") if path.startswith("/") else []
    if not components or any(c in ("", ".", "..") for c in components):
        raise InvalidNameError(
            f'database path "{path}" must be absolute, like "/Root", with no empty, "." or '
            '".." component and no trailing "/"'
        )
    return path


def database_path_of(catalog: Any) -> str:
    """The database path of a planner catalog (a ``SessionCatalog`` wraps the database)."""
    inner = getattr(catalog, "topics", catalog)
    return str(getattr(inner, "database_path", DEFAULT_DATABASE_PATH))


def relative_name(name: str, database_path: str) -> str:
    """The catalog's name of topic ``name``: relative names stay as they are."""
    if not name.startswith("/"):
        return name
    prefix = database_path + "/"
    if not name.startswith(prefix) or len(name) == len(prefix):
        raise InvalidNameError(
            f'topic path "{name}" is not inside the database "{database_path}"; write '
            f'"{prefix}<name>" or the name relative to the database',
            topic=name,
        )
    return name[len(prefix) :]


def relative_statement(statement: ast.Statement, database_path: str) -> ast.Statement:
    """``statement`` with every topic name it holds made relative to the database."""

    def rel(name: str) -> str:
        return relative_name(name, database_path)

    # Each branch leaves a statement without absolute names as it is (no copy): the
    # planner runs this for every statement, INSERT's fast path included.
    named = ast.CreateTopic | ast.AlterTopic | ast.DropTopic | ast.DescribeTopic
    if isinstance(statement, named):
        if statement.name.startswith("/"):
            return replace(statement, name=rel(statement.name))
    elif isinstance(statement, ast.CommitOffsets | ast.SetOffsets):
        if statement.topic.startswith("/"):
            return replace(statement, topic=rel(statement.topic))
    elif isinstance(statement, ast.SqlStatement):
        return _relative_scans(statement, database_path)
    elif isinstance(statement, ast.InsertTopic):
        query = statement.query
        relative_query = None if query is None else _relative_scans(query, database_path)
        if statement.topic.startswith("/") or relative_query is not query:
            return replace(statement, topic=rel(statement.topic), query=relative_query)
    elif isinstance(statement, ast.Grant) and any(
        statement.object_kind == "topic" and name.startswith("/") for name in statement.objects
    ):
        return replace(statement, objects=tuple(rel(name) for name in statement.objects))
    return statement


def _relative_scans(statement: ast.SqlStatement, database_path: str) -> ast.SqlStatement:
    if not any(scan.topic.startswith("/") for scan in statement.topic_scans):
        return statement
    scans = tuple(
        replace(scan, topic=relative_name(scan.topic, database_path))
        for scan in statement.topic_scans
    )
    return replace(statement, topic_scans=scans)
