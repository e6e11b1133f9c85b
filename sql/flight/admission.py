"""Flight calls in progress per ordinary user, bounded as the wire bounds sessions.

The wire gives an ordinary user at most their ``connection_limit`` (users file) or else
``--max-connections-per-user`` sessions (``sql.pgwire.limits.Admission``). A Flight call
is the door's session: each opens an engine session acting as the user, and a ``DoGet``
keeps its session until its stream ends. So the same limit bounds a user's Flight calls
in progress: one more is refused before it runs, with gRPC's UNAVAILABLE (pyarrow's
``FlightUnavailableError``, the status clients retry) carrying ``53300: too many
connections for role "x"``. Superusers are not bound (nor under ``--auth trust``, where
every caller is one), as on the wire. Under ``serve`` the count is shared with the wire's
sessions (``sql.user_sessions``, round 28): a user holds their limit across both doors.

Invariants: a user's count never exceeds the limit it was claimed under; ``calls`` holds
only users with a call in progress; every successful ``claim`` is matched by one
``release`` (the middleware's ``call_completed``, however the call ends). Thread-safe:
gRPC runs calls on many threads.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable

import pyarrow.flight as flight

from engine.api import Identity
from sql.user_sessions import UserSessions


class CallAdmission:
    """Counts ordinary users' Flight calls in progress against their limit."""

    def __init__(self, limit_of: Callable[[str], int | None],
                 per_user_max: int | None = None,
                 user_sessions: UserSessions | None = None) -> None:  # fmt: skip
        """``limit_of(name)``: the user's own connection limit (None: none of their own,
        then ``per_user_max``; None for both: no bound). ``user_sessions``: what users
        hold across the process's doors (``serve`` shares one with the wire), else the
        door's own."""
        self._limit_of = limit_of
        self.per_user_max = per_user_max
        self.calls: Counter[str] = Counter()  # this door's calls in progress
        self.user_sessions = user_sessions or UserSessions()
        self._lock = threading.Lock()

    def claim(self, identity: Identity) -> bool:
        """Count a call of ``identity``; True if it must be released (an ordinary user's),
        ``FlightUnavailableError`` (53300) when the user holds their limit already."""
        if identity.superuser:
            return False
        own = self._limit_of(identity.name)
        limit = self.per_user_max if own is None else own
        with self._lock:
            if not self.user_sessions.claim(identity.name, limit):
                raise flight.FlightUnavailableError(
                    f'53300: too many connections for role "{identity.name}" (at most '
                    f"{limit} sessions and Flight calls at once)")  # fmt: skip
            self.calls[identity.name] += 1
        return True

    def release(self, name: str) -> None:
        """Give back a call ``claim`` counted for ``name``."""
        with self._lock:
            assert self.calls[name] > 0, "a call is given back only by its holder"
            self.user_sessions.release(name)
            self.calls[name] -= 1
            if not self.calls[name]:
                del self.calls[name]
