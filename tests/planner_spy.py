"""A spy on ``planner.plan`` for tests that count what gets planned."""

from __future__ import annotations

from typing import Any

import pytest

from planner import planner


def planned_statements(monkeypatch: pytest.MonkeyPatch, attribute: str = "sql") -> list[str]:
    """From now on, each statement ``planner.plan`` plans (from anywhere), as its
    ``attribute`` (``sql`` or ``text``; a statement without it as its class name)."""
    planned: list[str] = []
    original = planner.plan

    def spying(statement: Any, catalog: Any) -> Any:
        planned.append(getattr(statement, attribute, type(statement).__name__))
        return original(statement, catalog)

    monkeypatch.setattr(planner, "plan", spying)
    return planned
