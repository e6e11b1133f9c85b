"""The server-wide budget of bytes clients make the wire server hold between messages.

Each connection's holdings are bounded on their own (a COPY FROM STDIN buffers at most
``storage.limits.COPY_IN_BYTES_MAX``; a Bind's parameters are one message, at most
``message_bytes_max``, kept by its portal, of which a connection holds at most
``PORTALS_PER_CONNECTION_MAX``), but with N connections their sum was unbounded. The
``MemoryBudget`` of one server counts, across all its connections, the bytes of COPY data
received and not yet written, and the Bind messages whose portals are still held.

Each connection's holdings (``ConnectionHoldings``, its COPY data and portals together) are
counted in two parts:

- its floor: the first ``ServerLimits.held_bytes_floor`` bytes (``WIRE_HELD_BYTES_FLOOR``,
  1 MiB) are not charged to the shared budget and are never refused: however full the
  budget is, every connection can still bind its statements and COPY small batches (one
  client filling the budget and sitting idle in a transaction does not stop the others,
  review R1-6);
- beyond the floor, bytes are charged to the shared budget, and one connection may be
  charged at most its share, ``held_bytes_max // WIRE_HELD_SHARE_DIVISOR`` (a quarter):
  one connection alone cannot take the whole budget;
- once logged in, a connection's charge also counts in its login's account, and all the
  connections of one login together may be charged at most ``login_share_max``,
  ``held_bytes_max // WIRE_HELD_LOGIN_DIVISOR`` (a half: two whole COPYs of one user fit)
  (``join``, ``leave``): the connections of one user cannot take the whole budget from
  the others (review R1-6's remainder). Different users do not limit each other below
  the budget.

Who is refused: the connection whose COPY chunk or Bind would take its own charge past its
share, its login's charge past the login's share, or the budget's total past
``held_bytes_max``, gets 53200 (out of memory) for that
statement and stays usable (what it held is given back as for any failed COPY or Bind);
nothing held by others is taken away.

A message is read whole before it is parsed (up to ``message_bytes_max``): one longer than
the floor holds its announced length while its body arrives (``take_arriving``; review
R1-7: clients announcing big messages and never finishing them held them uncounted); when
that is refused its body is read and dropped in small pieces (``skip_body``, as
PostgreSQL's ``pq_getmessage`` discards a message it cannot hold) and the message gets
53200, the connection goes on. A message within the floor is not counted (so it is never
refused). So the bytes held for clients stay within ``held_bytes_max + connections_max *
2 * held_bytes_floor`` (its floor's holdings and one uncounted message a connection; 1 GiB
+ 200 MiB by default).

Invariants: ``MemoryBudget.held_bytes`` is the sum of every connection's ``charged``; it
never goes below 0 nor, after a ``charge`` returned, above ``bytes_max``; a connection's
``charged == max(0, held - floor)`` and ``charged <= share_max`` after each call returns; a
login's account's ``charged`` is the sum of its joined connections' ``charged`` (at most
``login_share_max`` after a ``charge`` returned), and an account is kept only while a connection
of its login is joined or it is charged (so at most one per logged-in connection).
Thread-safety: connections on threads of their own share one budget, whose ``charge`` and
``give`` are one add under a lock, nothing allocated; a ``ConnectionHoldings`` is used on
its connection's one loop only and takes no lock while the connection holds no more than
its floor (a statement of small Binds never touches the budget).
"""

from __future__ import annotations

import asyncio
import threading

from storage.errors import OutOfMemoryError
from storage.limits import WIRE_HELD_LOGIN_DIVISOR, WIRE_HELD_SHARE_DIVISOR


class MemoryBudgetExceededError(OutOfMemoryError):
    """A COPY chunk or a Bind past the server's budget of held client bytes, or past the
    connection's share of it (53200)."""


class LoginAccount:
    """What the connections of one login are charged together (``charged``) and how many
    of them are joined (``connections``). Changed under the budget's lock only."""

    __slots__ = ("charged", "connections", "login")

    def __init__(self, login: str) -> None:
        self.login = login
        self.charged = 0
        self.connections = 0


class MemoryBudget:
    """Bytes held for clients beyond their floors by all of one server's connections, at
    most ``bytes_max``; each connection's at most ``share_max``, each login's connections'
    together at most ``login_share_max``."""

    def __init__(self, bytes_max: int, floor_bytes: int) -> None:
        assert bytes_max > 0 and floor_bytes >= 0, (bytes_max, floor_bytes)
        self.bytes_max = bytes_max
        self.floor_bytes = floor_bytes
        self.share_max = max(1, bytes_max // WIRE_HELD_SHARE_DIVISOR)
        self.login_share_max = max(self.share_max, bytes_max // WIRE_HELD_LOGIN_DIVISOR)
        self.held_bytes = 0
        self._lock = threading.Lock()
        self._accounts: dict[str, LoginAccount] = {}

    def connection(self) -> ConnectionHoldings:
        """The holdings of a new connection, counted in this budget."""
        return ConnectionHoldings(self)

    def join(self, holdings: ConnectionHoldings, login: str) -> None:
        """Count ``holdings`` (a connection that just logged in as ``login``) in its login's
        account from now on; what it is already charged moves into the account unrefused
        (a login's messages are within the floor, so that is 0 in practice)."""
        assert holdings.budget is self and holdings.account is None
        with self._lock:
            account = self._accounts.get(login)
            if account is None:
                account = self._accounts[login] = LoginAccount(login)
            account.connections += 1
            account.charged += holdings.charged
        holdings.account = account
        holdings.joined = True

    def leave(self, holdings: ConnectionHoldings) -> None:
        """The connection of ``holdings`` ends: its login's account forgets it once neither
        a joined connection nor a charge keeps it."""
        account = holdings.account
        if account is None or not holdings.joined:
            return
        holdings.joined = False  # what it still holds stays charged to ``account`` until given
        with self._lock:
            account.connections -= 1
            assert account.connections >= 0, account.login
            self._forget_if_unused(account)

    def accounts(self) -> dict[str, int]:
        """Each login's charged bytes (for tests and monitoring)."""
        with self._lock:
            return {login: account.charged for login, account in self._accounts.items()}

    def charge(self, nbytes: int, what: str, account: LoginAccount | None = None) -> None:
        """Count ``nbytes`` more (in ``account`` too, if the connection has logged in), or
        raise 53200 (nothing counted) if that would pass the budget or the login's share;
        ``what`` names the holding in the error."""
        assert nbytes >= 0, nbytes
        with self._lock:
            held = self.held_bytes + nbytes
            if account is not None and account.charged + nbytes > self.login_share_max:
                login_charged = account.charged
            elif held <= self.bytes_max:
                self.held_bytes = held
                if account is not None:
                    account.charged += nbytes
                return
            else:
                login_charged = -1
        if login_charged >= 0:
            raise MemoryBudgetExceededError(
                f"out of memory: {what} would take the bytes the connections of user "
                f"{account.login!r} hold in COPY data and bound parameters beyond their own "
                f"{self.floor_bytes} bytes each from {login_charged} to {login_charged + nbytes}, "
                f"past one user's share of {self.login_share_max} bytes (a "
                f"1/{WIRE_HELD_LOGIN_DIVISOR} share of the server's limit of {self.bytes_max} "
                f"bytes); close portals, end COPYs on the user's other connections or send "
                f"smaller pieces"
            )
        raise MemoryBudgetExceededError(
            f"out of memory: {what} would take the bytes all connections hold in COPY data "
            f"and bound parameters past the server's limit of {self.bytes_max} bytes; "
            f"retry later or in smaller pieces"
        )

    def give(self, nbytes: int, account: LoginAccount | None = None) -> None:
        """Give back ``nbytes`` a ``charge`` counted (in ``account`` too)."""
        with self._lock:
            self.held_bytes -= nbytes
            assert self.held_bytes >= 0, (self.held_bytes, nbytes)
            if account is not None:
                account.charged -= nbytes
                assert account.charged >= 0, (account.login, account.charged, nbytes)
                self._forget_if_unused(account)

    def _forget_if_unused(self, account: LoginAccount) -> None:
        """Under the lock: drop ``account`` once no connection and no charge keep it."""
        unused = account.connections == 0 and account.charged == 0
        if unused and self._accounts.get(account.login) is account:
            del self._accounts[account.login]


class ConnectionHoldings:
    """What one connection holds for its client (COPY data, portals' Bind messages):
    ``held`` bytes, of which ``charged`` (those beyond the budget's floor) are counted in
    the shared budget. Used on the connection's loop only."""

    __slots__ = ("account", "budget", "charged", "floor", "held", "joined")

    def __init__(self, budget: MemoryBudget) -> None:
        self.budget = budget
        self.floor = budget.floor_bytes
        self.held = 0
        self.charged = 0
        self.account: LoginAccount | None = None  # its login's, once ``MemoryBudget.join``ed
        self.joined = False  # counted in ``account.connections`` (until ``leave``)

    def take(self, nbytes: int, what: str) -> None:
        """Hold ``nbytes`` more, or raise 53200 (nothing held) past the connection's share
        or the budget; within the floor no lock is taken."""
        held = self.held + nbytes
        over = held - self.floor
        if over > self.charged:
            if over > self.budget.share_max:
                raise MemoryBudgetExceededError(
                    f"out of memory: {what} of {nbytes} bytes would take what this "
                    f"connection holds in COPY data, bound parameters and cursors to {held} bytes, "
                    f"past its share of {self.floor + self.budget.share_max} bytes (a "
                    f"1/{WIRE_HELD_SHARE_DIVISOR} share of the server's limit of "
                    f"{self.budget.bytes_max} bytes beyond {self.floor} of its own); "
                    f"close portals or send smaller pieces"
                )
            self.budget.charge(over - self.charged, f"{what} of {nbytes} bytes", self.account)
            self.charged = over
        self.held = held

    def give(self, nbytes: int) -> None:
        """Let go of ``nbytes`` a ``take`` held; what falls back within the floor is given
        back to the budget."""
        held = self.held - nbytes
        assert held >= 0, (self.held, nbytes)
        self.held = held
        if self.charged:
            over = max(0, held - self.floor)
            if over < self.charged:
                self.budget.give(self.charged - over, self.account)
                self.charged = over

    def take_arriving(self, length: int) -> int:
        """Hold a message's announced body ``length`` while it arrives when it is longer
        than the floor; the bytes held, to ``give`` once the body is parsed (0: none).
        53200 (nothing held) past the share or the budget: skip the body then."""
        if length <= self.floor:
            return 0
        self.take(length, "a message still arriving")
        return length


_SKIP_PIECE_BYTES = 64 * 1024


async def skip_body(reader: asyncio.StreamReader, length: int) -> None:
    """Read and drop the ``length`` bytes of a refused message's body, a piece at a time
    (nothing held); ``IncompleteReadError`` if the client goes first."""
    while length > 0:
        piece = await reader.read(min(length, _SKIP_PIECE_BYTES))
        if not piece:
            raise asyncio.IncompleteReadError(b"", length)
        length -= len(piece)


async def read_body(reader: asyncio.StreamReader, holdings: ConnectionHoldings,
                    length: int) -> bytes:  # fmt: skip
    """A message's body of ``length`` bytes, held in ``holdings`` while it arrives when it
    is longer than the floor; 53200 (the body skipped, nothing held) when that is refused."""
    try:
        arriving = holdings.take_arriving(length)
    except MemoryBudgetExceededError:
        await skip_body(reader, length)
        raise
    try:
        return await reader.readexactly(length)
    finally:
        if arriving:
            holdings.give(arriving)
