"""The import layers hold: import-linter's contracts pass, and storage/ knows no SQL."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FORBIDDEN_IN_STORAGE = ("sql", "engine", "planner", "grammar", "duckdb", "sqlglot", "lark")


def _imported_modules(path: Path) -> set[str]:
    """Top-level names of every module ``path`` imports (absolute imports only)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


def test_import_linter_contracts_are_kept() -> None:
    lint_imports = Path(sys.executable).parent / "lint-imports"
    if not lint_imports.exists():
        pytest.fail(f"lint-imports is not installed next to {sys.executable}")
    result = subprocess.run(
        [str(lint_imports), "--no-cache", "--no-logo"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_storage_imports_nothing_of_sql_or_the_layers_above() -> None:
    modules = sorted((ROOT / "storage").glob("*.py"))
    assert len(modules) > 10, "storage/ has its modules"
    for path in modules:
        bad = _imported_modules(path) & set(FORBIDDEN_IN_STORAGE)
        assert not bad, f"{path.name} imports {sorted(bad)}"


def test_import_walker_sees_every_import_form(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import duckdb\nimport os.path as p\nfrom sqlglot import exp\nfrom . import sibling\n"
        "def f():\n    from lark import Lark\n"
    )
    assert _imported_modules(sample) == {"duckdb", "os", "sqlglot", "lark"}
