"""One home each for errors and for limits: an error class outside ``storage/errors.py``
does not repeat a SQLSTATE that ``storage.errors`` already has, and a ``*_MAX`` constant
lives in ``storage/limits.py`` (with its reason) unless it is listed below.

Both lists shrink: an entry leaves when its constant or class moves home; a new
constant or class outside the homes fails here."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("sql", "spark_sql_ext", "engine", "planner", "grammar", "storage")
HOMES = ("storage/errors.py", "storage/limits.py")
LIMIT_NAME = re.compile(r"[A-Z][A-Z0-9_]*_MAX(_[A-Z]+)?")

# Error classes that still repeat a SQLSTATE of storage.errors: none left.
KNOWN_DUPLICATE_ERRORS: set[tuple[str, str]] = set()
# Constants named like limits that stay beside their code: facts of a format (INT64_MAX,
# the latest timestamp), defaults of a read's options, and bounds of one module's caches
# and retries that nothing else reads.
KNOWN_LIMITS_ELSEWHERE = {
    ("engine/deltas.py", "GROUP_MAX"),  # the applier's batching, not a bound on anyone
    ("engine/deltas.py", "INTEGER_MAX"),  # DuckDB's integer types' ranges
    ("engine/check.py", "COPY_ATTEMPTS_MAX"),
    ("engine/check.py", "LIVE_RUNS_MAX"),
    ("engine/privilege_cache.py", "ENTRIES_MAX"),
    ("engine/sandbox.py", "CACHED_SQL_CHARS_MAX"),
    ("engine/writes.py", "CREATED_AT_US_MAX"),
    ("engine/writes.py", "INT64_MAX"),
    ("engine/writes.py", "NULLS_CACHED_MAX"),
    ("engine/writes.py", "PLAIN_DATA_BYTES_MAX"),  # Arrow binary's int32 offsets
    ("sql/console.py", "REPL_ROWS_SHOWN_MAX"),
    ("sql/pgwire/login_throttle.py", "DELAY_S_MAX"),
    ("sql/pgwire/login_throttle.py", "KEYS_MAX"),
    ("sql/pgwire/login_throttle.py", "PENALTY_BOX_MAX"),
    ("sql/pgwire/login_throttle.py", "PENALTY_SOCKETS_MAX"),
}


def _sqlstates(tree: ast.Module) -> dict[str, str]:
    """Class name -> the SQLSTATE its body assigns, for the module's top-level classes."""
    found = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if (isinstance(item, ast.Assign) and isinstance(item.value, ast.Constant)
                        and any(getattr(t, "id", None) == "sqlstate" for t in item.targets)):
                    found[node.name] = item.value.value
    return found  # fmt: skip


def _limit_names(tree: ast.Module) -> set[str]:
    names = set()
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else (
            [node.target] if isinstance(node, ast.AnnAssign) else [])  # fmt: skip
        names.update(t.id for t in targets
                     if isinstance(t, ast.Name) and LIMIT_NAME.fullmatch(t.id))  # fmt: skip
    return names


def _modules() -> list[tuple[str, ast.Module]]:
    return [
        (path.relative_to(ROOT).as_posix(), ast.parse(path.read_text(encoding="utf-8")))
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        if path.relative_to(ROOT).as_posix() not in HOMES
    ]


def test_no_error_class_repeats_a_sqlstate_of_storage_errors() -> None:
    home = set(_sqlstates(ast.parse((ROOT / "storage/errors.py").read_text())).values())
    assert {"42703", "42701", "23502", "54000"} <= home
    repeated = {(path, name) for path, tree in _modules()
                for name, state in _sqlstates(tree).items() if state in home}  # fmt: skip
    assert repeated - KNOWN_DUPLICATE_ERRORS == set(), "use storage.errors' class instead"
    assert KNOWN_DUPLICATE_ERRORS - repeated == set(), "gone home: take it off the list"


def test_limits_live_in_storage_limits() -> None:
    found = {(path, name) for path, tree in _modules() for name in _limit_names(tree)}
    assert found - KNOWN_LIMITS_ELSEWHERE == set(), "move these to storage/limits.py"
    assert KNOWN_LIMITS_ELSEWHERE - found == set(), "gone home: take it off the list"


def test_the_walkers_see_classes_and_constants() -> None:
    sample = ast.parse(
        'class E(Exception):\n    sqlstate = "42703"\nX_MAX = 1\nY_MAX_DEFAULT: int = 2\n'
        "_PRIVATE_MAX = 3\nMAXIMUM = 4\ndef f():\n    Z_MAX = 5\n"
    )
    assert _sqlstates(sample) == {"E": "42703"}
    assert _limit_names(sample) == {"X_MAX", "Y_MAX_DEFAULT"}
