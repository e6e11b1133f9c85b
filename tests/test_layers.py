"""The import layers hold: import-linter's contracts pass, storage/ knows no SQL, and no
package has import circles."""

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


# -- no import circles inside a package ---------------------------------------------------------
# import-linter's acyclic_siblings contract (pyproject.toml) refuses them too; this walks the
# imports itself as a second, independent reading: every import statement of a module (inside
# functions and ``if TYPE_CHECKING:`` too: a circle drawn only for the type checker is a
# circle all the same), resolved to the modules of the project.
PACKAGES = ("sql", "spark_sql_ext", "engine", "planner", "grammar", "storage")


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _project_modules(package: str) -> dict[str, Path]:
    return {_module_name(path): path for path in sorted((ROOT / package).rglob("*.py"))}


def _imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The project modules ``name`` (at ``path``) imports, resolved (``from a import b`` is
    ``a.b`` when that is a module, else ``a``; relative imports from the module's package)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                       for alias in node.names]  # fmt: skip
        else:
            continue
        for target in targets:
            while target and target not in known:  # ``import a.b.c`` of a module ``a.b``
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def import_circles(graph: dict[str, set[str]]) -> list[tuple[str, ...]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[tuple[str, ...]] = []

    def visit(start: str) -> None:
        # Iterative, so a long chain of imports cannot reach Python's recursion limit.
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            target = next(edges, None)
            if target is not None:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph[target]))))
                elif target in on_stack:
                    low[node] = min(low[node], index[target])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                members = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    members.append(member)
                    if member == node:
                        break
                if len(members) > 1:
                    circles.append(tuple(sorted(members)))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(circles)


def package_graph(package: str) -> dict[str, set[str]]:
    """Module -> the modules of the same top-level package it imports."""
    modules = _project_modules(package)
    known = set(modules)
    return {name: _imports_of(name, path, known) for name, path in modules.items()}


def test_no_import_circles_inside_a_package() -> None:
    """None at all: the engine's lower modules know the database and the session by
    ``engine.protocols``, GRANT/SET ROLE run from ``engine.grants`` over
    ``engine.privileges``, Spark's batch and streaming classes share ``spark_sql_ext.tasks``."""
    found = [circle for package in PACKAGES for circle in import_circles(package_graph(package))]
    assert not found, "import circles: " + "; ".join(" <-> ".join(circle) for circle in found)


def test_the_package_graphs_are_read_whole() -> None:
    """The circle test sees every package's modules and their imports (an empty or
    unresolved graph would pass it vacuously)."""
    engine = package_graph("engine")
    assert {"engine.session", "engine.database", "engine.bulk"} <= set(engine)
    assert "engine.protocols" in engine["engine.bulk"]
    assert "engine.privileges" in engine["engine.grants"]
    assert "spark_sql_ext.tasks" in package_graph("spark_sql_ext")["spark_sql_ext.streaming"]


def test_the_circle_finder_finds_circles_and_only_circles(tmp_path: Path) -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e2"}, "e2": set()}
    assert import_circles(graph) == [("a", "b", "c")]
    assert import_circles({"x": {"y"}, "y": {"x"}, "z": set()}) == [("x", "y")]
    assert import_circles({"p": {"q"}, "q": set()}) == []


def test_the_import_resolver_sees_type_checking_and_relative_imports(tmp_path: Path) -> None:
    package = ROOT / "sql" / "pgwire"
    known = set(_project_modules("sql"))
    # commands.py imported the server only for the type checker before the wings: still an edge.
    sample = tmp_path / "sample.py"
    sample.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
        "    from sql.pgwire.server import PgServer\n"
        "from sql.pgwire.codec import messages as m\nimport sql.pgwire.limits\n"
        "def f():\n    from sql.pgwire import users\n"
    )
    found = _imports_of("sql.pgwire.connection.sample", sample, known)
    assert found == {"sql.pgwire.server", "sql.pgwire.codec.messages", "sql.pgwire.limits",
                     "sql.pgwire.users"}  # fmt: skip
    assert (package / "server.py").exists()


def test_every_package_is_in_the_setuptools_package_list() -> None:
    """pyproject lists packages one by one: a new subpackage (a pgwire wing) must be there,
    or an installed topicbase lacks it while tests run from the checkout still pass."""
    import tomllib

    configuration = tomllib.loads((ROOT / "pyproject.toml").read_text())
    listed = set(configuration["tool"]["setuptools"]["packages"])
    found = {
        _module_name(init)
        for package in PACKAGES
        for init in (ROOT / package).rglob("__init__.py")
        if "java" not in init.parts
    }
    assert found - listed == set(), f"packages missing from pyproject: {sorted(found - listed)}"
