"""What each ordinary user holds in one server process, counted across its doors.

``topicbase serve`` opens two doors on one database: the Postgres wire (a session per
connection) and Arrow Flight (an engine session per call in progress). A user's
``connection_limit`` (users file) or else ``--max-connections-per-user`` bounds what they
hold at once, as PostgreSQL's role ``CONNECTION LIMIT`` bounds a role's backends. Before
round 28 each door counted apart, so a user could hold their limit at each door (twice the
engine sessions they were given). One ``UserSessions`` is shared by both doors of a
``serve``; a door built alone (tests, embedding) makes its own.

Invariants: a user's count never exceeds the limit it was claimed under; ``held`` names
only users holding something; every successful ``claim`` is matched by one ``release``.
Thread-safe: the wire claims on its event loop thread, Flight on gRPC's threads.
"""

from __future__ import annotations

import threading
from collections import Counter


class UserSessions:
    """Sessions and calls in progress per ordinary user, across the doors of a process."""

    def __init__(self) -> None:
        self._held: Counter[str] = Counter()
        self._lock = threading.Lock()

    def claim(self, name: str, limit: int | None) -> bool:
        """Count one more for ``name`` unless they hold ``limit`` already (None: no bound);
        whether it was counted (then ``release`` gives it back)."""
        with self._lock:
            if limit is not None and self._held[name] >= limit:
                return False
            self._held[name] += 1
            return True

    def release(self, name: str) -> None:
        """Give back one that ``claim`` counted for ``name``."""
        with self._lock:
            assert self._held[name] > 0, "a place is given back only by its holder"
            self._held[name] -= 1
            if not self._held[name]:
                del self._held[name]

    def held(self) -> dict[str, int]:
        """What each user holds now, at both doors (a copy)."""
        with self._lock:
            return dict(self._held)
