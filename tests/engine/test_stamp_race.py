"""Review R1-5: ``privilege_cache.stamp`` reads ``writers`` without the lock; the order of
``_Cache.sweep``'s writes must leave no interleaving in which the door's memo matches after
a committed REVOKE. Replayed deterministically (each hook stands for a GIL switch there)."""
from __future__ import annotations

from typing import Any

import pytest

from engine import privilege_cache, privileges
from engine.database import Database
from engine.identity import Identity
from engine.session import Session
from grammar.bounded_cache import BoundedCache
from grammar.parse import parse
from planner import planner
from storage.errors import InsufficientPrivilegeError
from storage.limits import DOOR_DECISIONS_MAX

ALICE = Identity("alice", superuser=False)


class _SwitchOnce(list[Any]):
    """``cache.writers`` whose first emptiness test lets another thread run first, then
    answers what it read before that thread ran (empty)."""

    def __init__(self, switch: Any) -> None:
        super().__init__()
        self.switch = switch

    def __len__(self) -> int:
        switch, self.switch = self.switch, None
        if switch is not None:
            switch()
            return 0  # the value read before the switch
        return super().__len__()


def test_no_stale_allow_after_a_committed_revoke(session: Session, database: Database,
                                                 monkeypatch: Any) -> None:  # fmt: skip
    root = session
    root.execute("CREATE TABLE kv (k BIGINT PRIMARY KEY, v VARCHAR)")
    root.execute("GRANT SELECT ON kv TO alice")
    alice = database.connect(ALICE)
    (statement,) = parse("SELECT v FROM kv WHERE k = 1")
    plan = planner.plan(statement, alice.planning_catalog)
    memo = BoundedCache("tests.r1", DOOR_DECISIONS_MAX)
    cache = privilege_cache._cache_of(database)
    privilege_cache.stamp(alice)  # sweep anything left

    # (a) alice's stamp reads writers == [], root's REVOKE transaction registers and
    # bumps the generation, alice reads the bumped generation: a stamp of an open writer.
    def revoke_begins() -> None:
        root.execute("BEGIN")
        root.execute("REVOKE SELECT ON kv FROM alice")  # note_write: appends, g += 1

    cache.writers = _SwitchOnce(revoke_begins)
    privileges.check_plan(plan, alice.identity, alice, memo=memo)  # allowed (not committed)
    assert len(memo._entries) == 1, "decision kept under the open writer's generation"
    root.execute("COMMIT")  # the REVOKE is committed

    # (b) the sweep after the COMMIT empties ``writers`` (under the cache's lock); a thread
    # switched in right then takes the lock-free stamp: it must not be the stamp the
    # decision was kept under (``_Cache.sweep`` moves the generation first), or the memo
    # would let alice through after the REVOKE committed.
    ((value, _cost),) = memo._entries.values()
    kept_stamp = value[2]
    seen: list[Any] = []
    original_setattr = privilege_cache._Cache.__setattr__

    def switched(self: Any, name: str, value: Any) -> None:
        original_setattr(self, name, value)
        if name == "writers" and not value and not seen:
            seen.append(privilege_cache.stamp(alice))  # the switch: the lock-free path

    monkeypatch.setattr(privilege_cache._Cache, "__setattr__", switched)
    privilege_cache.generation_now(database)  # any thread's sweep
    monkeypatch.setattr(privilege_cache._Cache, "__setattr__", original_setattr)
    assert seen and seen[0] is not None and seen[0] != kept_stamp
    with pytest.raises(InsufficientPrivilegeError):
        privileges.check_plan(plan, alice.identity, alice, memo=memo)
    alice.close()
