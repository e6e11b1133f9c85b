"""Consumer members and partition leases: balanced readers of one consumer.

Readers that name a ``member`` (``FROM TOPIC t WITH (consumer = 'c', member =
'w1')``) join the consumer's group. The partitions are divided among the live
members (sorted by name, partition ``i`` to member ``i mod n``); every change
of membership (a join, a leave, a lease expiring) starts a new *generation*.
A member's transaction holds the leases it read under, as (member,
generation); at COMMIT each must still be current, else 40001: a stalled
("zombie") member whose partitions were handed on cannot commit.

Leases live in memory (they need no durability: after a restart every member
rejoins). A member that has not read for ``lease_timeout_s`` expires; a
session's members leave when it closes.
Thread-safety: every method holds the registry lock.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from engine.clock import Clock

GroupKey = tuple[str, str]  # (topic id, consumer)
DEFAULT_LEASE_TIMEOUT_S = 30.0


@dataclass(slots=True)
class _Member:
    session_id: int
    last_seen_s: float


@dataclass(slots=True)
class _Group:
    generation: int = 0
    members: dict[str, _Member] = field(default_factory=dict)
    partitions: tuple[int, ...] = ()
    owners: dict[int, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Lease:
    member: str
    generation: int


class LeaseRegistry:
    def __init__(self, clock: Clock, lease_timeout_s: float = DEFAULT_LEASE_TIMEOUT_S) -> None:
        assert lease_timeout_s > 0
        self._clock = clock
        self.lease_timeout_s = lease_timeout_s
        self._groups: dict[GroupKey, _Group] = {}
        self._lock = threading.Lock()

    def join(
        self, key: GroupKey, member: str, session_id: int, partitions: tuple[int, ...]
    ) -> tuple[Lease, tuple[int, ...]]:
        """Join (or heartbeat) ``member``; returns its lease and the partitions it owns."""
        with self._lock:
            group = self._groups.setdefault(key, _Group())
            now = self._clock.monotonic_s()
            changed = self._expire(group, now)
            current = group.members.get(member)
            if current is None or current.session_id != session_id:
                group.members[member] = _Member(session_id, now)
                changed = True
            else:
                current.last_seen_s = now
            if partitions != group.partitions:
                group.partitions = partitions
                changed = True
            if changed:
                self._rebalance(group)
            owned = tuple(p for p in group.partitions if group.owners.get(p) == member)
            return Lease(member, group.generation), owned

    def holds(self, key: GroupKey, partition: int, lease: Lease) -> bool:
        """True if ``lease`` still owns ``partition`` (same member, same generation, alive)."""
        with self._lock:
            group = self._groups.get(key)
            if group is None:
                return False
            if self._expire(group, self._clock.monotonic_s()):
                self._rebalance(group)
            return (
                group.generation == lease.generation
                and group.owners.get(partition) == lease.member
            )

    def members(self, key: GroupKey) -> tuple[str, ...]:
        """The live members of a consumer's group, by name (silent ones expire first)."""
        with self._lock:
            group = self._groups.get(key)
            if group is None:
                return ()
            if self._expire(group, self._clock.monotonic_s()):
                self._rebalance(group)
            return tuple(sorted(group.members))

    def leave_session(self, session_id: int) -> None:
        """Release every membership a closing session held."""
        with self._lock:
            for group in self._groups.values():
                gone = [m for m, state in group.members.items() if state.session_id == session_id]
                for member in gone:
                    del group.members[member]
                if gone:
                    self._rebalance(group)

    def _expire(self, group: _Group, now: float) -> bool:
        silent = [
            m for m, state in group.members.items()
            if now - state.last_seen_s > self.lease_timeout_s
        ]
        for member in silent:
            del group.members[member]
        return bool(silent)

    def _rebalance(self, group: _Group) -> None:
        group.generation += 1
        names = sorted(group.members)
        group.owners = (
            {p: names[i % len(names)] for i, p in enumerate(group.partitions)} if names else {}
        )
