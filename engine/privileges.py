"""Privileges: owners and GRANTs, checked for every relation a statement touches.

(Being built: see issue 10. ``check_plan`` is called by ``Session._guard`` for every
statement before it runs.)
"""

from __future__ import annotations

from typing import Any

from engine.identity import Identity
from planner.operations import Plan


def check_plan(plan: Plan, identity: Identity, session: Any) -> None:
    """Refuse (42501) a plan that touches a relation ``identity`` has no privilege on."""


def require(session: Any, kind: str, name: str, privilege: str) -> None:
    """Refuse (42501, naming the object and the privilege) unless the session's identity
    holds ``privilege`` on the ``kind`` ('topic' or 'table') called ``name``. For doors
    that act on relations without a SQL plan (the Flight door's reads and writes)."""
