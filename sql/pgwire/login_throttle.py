"""Failed-login throttling of the wire server, per client address and per user name.

PostgreSQL answers a wrong password at once (``auth_delay`` adds a fixed pause, per
connection); an attacker with many connections then guesses as fast as it can connect.
Here failures are remembered across connections, by client address and by user name:

- A failure is answered (FATAL 28P01) only after a delay that grows with the recent
  failures of that address and of that user (the larger of the two): the base delay for
  the first ``FREE_FAILURES``, then doubling each time, at most ``DELAY_S_MAX``. Failure
  counts halve every ``HALF_LIFE_S``, so a forgotten password costs a few seconds, not
  a lock-out.
- The delay is an ``asyncio.sleep`` (the event loop serves everyone else) and the
  delayed connection holds no session slot nor a place among the connections still
  authenticating (``sql.pgwire.server``): it sits in a *penalty box*. A box holds at most
  ``PENALTY_BOX_MAX`` connections per address and per user name, and
  ``PENALTY_SOCKETS_MAX`` in all; an attempt whose address or user has a full box is
  refused before any password is checked (53300), which bounds the guessing rate at
  about ``PENALTY_BOX_MAX / DELAY_S_MAX`` per address and per user, however many
  connections the attacker opens.
- A right password is never delayed: the exchange always runs (unless a box is full),
  so a user logs in at once while someone floods wrong passwords, for that very name
  from the same address included. A success clears that user's failures.

Invariants: counts and boxes are bounded (``KEYS_MAX`` remembered keys, oldest dropped);
box counts never go negative. Thread-safety: used from the event loop thread only.
"""

from __future__ import annotations

import contextlib
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from storage.errors import TooManyConnectionsError

FREE_FAILURES = 3  # failures of one key answered after the base delay only
DELAY_S_BASE = 0.5  # every failure waits at least this long (as auth.AUTH_FAILURE_DELAY_S)
DELAY_S_MAX = 5.0  # the longest a failure waits
HALF_LIFE_S = 60.0  # a key's failure count halves in this time
PENALTY_BOX_MAX = 16  # delayed failures at once per address and per user name
PENALTY_SOCKETS_MAX = 256  # delayed failures at once in all
KEYS_MAX = 10_000  # addresses and user names remembered (oldest forgotten first)


@dataclass(slots=True)
class _Failures:
    count: float = 0.0
    at_s: float = 0.0
    boxed: int = 0  # connections of this key waiting out a failure now


class LoginThrottle:
    """The failure memory of one server (see the module doc)."""

    def __init__(self, base_delay_s: float = DELAY_S_BASE, *,
                 clock: Callable[[], float] = time.monotonic) -> None:  # fmt: skip
        self.base_delay_s = base_delay_s
        self._clock = clock
        self._keys: OrderedDict[str, _Failures] = OrderedDict()
        self.boxed = 0  # connections in every penalty box

    @staticmethod
    def _address_key(address: str) -> str:
        return "address:" + address

    @staticmethod
    def _user_key(user: str) -> str:
        return "user:" + user

    def _entry(self, key: str) -> _Failures:
        entry = self._keys.get(key)
        if entry is None:
            while len(self._keys) >= KEYS_MAX:
                oldest = next((k for k, e in self._keys.items() if e.boxed == 0), None)
                if oldest is None:
                    break
                del self._keys[oldest]
            entry = self._keys[key] = _Failures(at_s=self._clock())
        self._keys.move_to_end(key)
        return entry

    def _count(self, entry: _Failures) -> float:
        """The entry's failures now, decayed since its last one."""
        elapsed_s = max(self._clock() - entry.at_s, 0.0)
        return entry.count * 0.5 ** (elapsed_s / HALF_LIFE_S)

    def admit(self, address: str, user: str) -> None:
        """Before an exchange: refuse (53300) when the address's or user's box is full."""
        if self.boxed >= PENALTY_SOCKETS_MAX:
            raise TooManyConnectionsError("too many failed login attempts at once; try again later")
        for key, what in ((self._address_key(address), f"from {address}"),
                          (self._user_key(user), f'for user "{user}"')):  # fmt: skip
            entry = self._keys.get(key)
            if entry is not None and entry.boxed >= PENALTY_BOX_MAX:
                raise TooManyConnectionsError(
                    f"too many failed login attempts {what}; try again later"
                )

    def failed(self, address: str, user: str) -> float:
        """Count a failure of ``address`` and ``user``; the seconds to wait before saying so."""
        counts = []
        for key in (self._address_key(address), self._user_key(user)):
            entry = self._entry(key)
            entry.count = self._count(entry) + 1
            entry.at_s = self._clock()
            counts.append(entry.count)
        excess = max(counts) - FREE_FAILURES
        if excess <= 0:
            return self.base_delay_s
        return min(self.base_delay_s * 2 ** excess, max(DELAY_S_MAX, self.base_delay_s))

    def succeeded(self, user: str) -> None:
        """The user proved their password: their failures are forgotten (the address's
        stay: one valid account must not reset a spraying address)."""
        entry = self._keys.get(self._user_key(user))
        if entry is not None:
            entry.count = 0.0

    @contextlib.contextmanager
    def penalty_box(self, address: str, user: str) -> Iterator[None]:
        """Hold a place in the address's and user's boxes while a failure is delayed."""
        entries = [self._entry(self._address_key(address)), self._entry(self._user_key(user))]
        for entry in entries:
            entry.boxed += 1
        self.boxed += 1
        try:
            yield
        finally:
            self.boxed -= 1
            for entry in entries:
                entry.boxed -= 1
                assert entry.boxed >= 0
            assert self.boxed >= 0

    def failures(self, address: str | None = None, user: str | None = None) -> float:
        """The decayed failure count of an address or a user (for tests and logs)."""
        key = self._address_key(address) if address is not None else self._user_key(user or "")
        entry = self._keys.get(key)
        return 0.0 if entry is None else self._count(entry)
