"""The server-wide budget of bytes SQL cursors keep in spill files (temporary disk).

A cursor's rows past ``spill.SPILL_BYTES`` go to an unlinked file in the temporary
directory that lives as long as the cursor (``sql.pgwire.connection.spill``). The result
cap bounds each batch, not a cursor's whole result, and a connection keeps up to
``CURSORS_PER_CONNECTION_MAX`` cursors: their bytes were not bounded, so one DECLARE could
fill the disk that TMPDIR shares (round 25's open item). The ``SpillBudget`` of one server
counts the bytes written to every live spill file:

- all connections together at most ``bytes_max`` (``ServerLimits.spill_bytes_max``);
- the connections of one login together at most ``login_bytes_max``
  (``ServerLimits.spill_login_bytes_max``), superusers included: the disk is shared by
  everyone, and by the data directory when TMPDIR is on its filesystem.

Bytes are charged as they are written, before the write (``SpillCharge.take``): a DECLARE
that would pass either bound gets 53400 (``SpillLimitExceededError``, PostgreSQL's code for
``temp_file_limit``: a configured limit on a shared resource, class 53 as the memory budget's
53200; retrying once others closed cursors may work) with nothing more written, its file
is dropped and its bytes given back; the connection stays usable.

Each spill file has one ``SpillCharge``, given back (``release``) when its cursor is
dropped (CLOSE, the prune of an ended transaction, the connection's end), when the spill
fails (any error, ENOSPC included), and, as a safety net, when the mapping of the file is
freed (a result lost to a cancelled task): ``release`` gives back what is charged at that
moment, so calling it twice, or from two threads, never gives back twice.

Invariants: ``SpillBudget.spilled_bytes`` is the sum of every live charge's ``charged``
and, once a ``take`` returned, at most ``bytes_max``; a login's sum at most
``login_bytes_max``; an account is kept only while its login has bytes charged.
Thread-safety: charges are taken on connections' worker threads and given back on their
loops or wherever the last reference to a mapping goes; every change is under the
budget's lock (one add, nothing allocated but a login's first entry).
"""

from __future__ import annotations

import threading

from storage.errors import ConfigurationLimitExceededError


class SpillLimitExceededError(ConfigurationLimitExceededError):
    """A cursor's spill file past the server's or its login's bound of spilled bytes (53400)."""


class SpillBudget:
    """Bytes in the live spill files of one server's cursors: at most ``bytes_max`` in all,
    ``login_bytes_max`` for the connections of one login."""

    def __init__(self, bytes_max: int, login_bytes_max: int) -> None:
        assert bytes_max > 0 and login_bytes_max > 0, (bytes_max, login_bytes_max)
        self.bytes_max = bytes_max
        self.login_bytes_max = login_bytes_max
        self.spilled_bytes = 0
        self._lock = threading.Lock()
        self._logins: dict[str, int] = {}

    def charge_for(self, login: str) -> SpillCharge:
        """A new, empty charge for one spill file of a connection of ``login``."""
        return SpillCharge(self, login)

    def accounts(self) -> dict[str, int]:
        """Each login's spilled bytes (for tests and monitoring)."""
        with self._lock:
            return dict(self._logins)

    def charge(self, charge: SpillCharge, nbytes: int) -> None:
        """Count ``nbytes`` more in ``charge`` and its login, or raise 53400 (nothing counted)."""
        assert nbytes >= 0, nbytes
        login = charge.login
        with self._lock:
            login_bytes = self._logins.get(login, 0)
            login_over = login_bytes + nbytes > self.login_bytes_max
            if not login_over and self.spilled_bytes + nbytes <= self.bytes_max:
                self._logins[login] = login_bytes + nbytes
                self.spilled_bytes += nbytes
                charge.charged += nbytes
                return
        if login_over:
            raise SpillLimitExceededError(
                f"temporary file size exceeds the limit: a cursor's spill file would take the "
                f"bytes the cursors of user {login!r} keep on disk from {login_bytes} to "
                f"{login_bytes + nbytes}, past one user's limit of {self.login_bytes_max} bytes; "
                f"close cursors (on this or the user's other connections) or fetch less at once"
            )
        raise SpillLimitExceededError(
            f"temporary file size exceeds the limit: a cursor's spill file would take the bytes "
            f"all cursors keep on disk past the server's limit of {self.bytes_max} bytes; close "
            f"cursors or retry later"
        )

    def release(self, charge: SpillCharge) -> None:
        """Give back what ``charge`` holds now (nothing if it holds nothing)."""
        with self._lock:
            nbytes, charge.charged = charge.charged, 0
            if not nbytes:
                return
            self.spilled_bytes -= nbytes
            left = self._logins[charge.login] - nbytes
            assert self.spilled_bytes >= 0 and left >= 0, (self.spilled_bytes, charge.login, left)
            if left:
                self._logins[charge.login] = left
            else:
                del self._logins[charge.login]


class SpillCharge:
    """The bytes of one spill file charged to its login (``charged``): taken as they are
    written, given back by ``release``. ``charged`` changes under the budget's lock only."""

    __slots__ = ("budget", "charged", "login")

    def __init__(self, budget: SpillBudget, login: str) -> None:
        self.budget = budget
        self.login = login
        self.charged = 0

    def take(self, nbytes: int) -> None:
        """Charge ``nbytes`` about to be written, or raise 53400 (nothing charged)."""
        self.budget.charge(self, nbytes)

    def release(self) -> None:
        """Give back what is charged now (idempotent; a later ``take`` is charged anew)."""
        self.budget.release(self)
