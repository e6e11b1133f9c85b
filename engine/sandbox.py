"""The sandbox: what DuckDB may be asked to do at all, whoever asks.

(Being built: see issue 10. ``check_plan`` is called by ``Session._guard`` for every
statement before it runs.)
"""

from __future__ import annotations

from engine.identity import Identity
from planner.operations import Plan


def check_plan(plan: Plan, identity: Identity) -> None:
    """Refuse (42501) a plan that would reach host files, the network, another database,
    a global setting or the internal catalog."""
