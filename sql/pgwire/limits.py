"""Limits of the PostgreSQL-wire server, each with its reason.

``PgServer`` takes each as a constructor parameter (``topicbase serve
--max-connections N`` sets the first); their defaults, with the reasons for them, live
with every other limit in ``storage.limits``. Going over one is an error with a
SQLSTATE, never a hang or a dead server:

- connections: ``connections_max`` counts sessions (logged-in connections), as
  PostgreSQL's ``max_connections``. When all are taken, a new socket gets ``FATAL
  53300 sorry, too many clients already`` once it has sent its startup packet, and is
  closed; a CancelRequest is still served. The last ``superuser_reserved_connections``
  slots (default 3, at most ``connections_max - 1``) are for superusers: anyone else
  who logs in when only those are left gets ``FATAL 53300 remaining connection slots
  are reserved for roles with the SUPERUSER attribute``. An ordinary user holds at most
  their ``connection_limit`` (users file) or else ``connections_per_user_max`` sessions
  (``--max-connections-per-user``; none by default), as a role's ``CONNECTION LIMIT``:
  one more gets ``FATAL 53300 too many connections for role "x"``. Superusers are not
  bound by it, as in PostgreSQL. Under ``serve`` the user's Flight calls in progress
  count too (``sql.user_sessions``: one count for both doors).
- connections still logging in (accepted, not yet authenticated, or being refused)
  have a cap of their own, ``unauthenticated_max``, outside ``connections_max``, and a
  deadline, ``authentication_timeout_s`` (default ``sql.pgwire.auth``'s 10 s), after
  which the socket is closed. When the cap is reached, a newcomer takes the place of
  the oldest such socket of the client address holding the most of them: a flood of
  idle sockets from one place pushes out its own sockets, never a session and hardly
  ever someone else's login. Connections waiting out a failed login's delay are in the
  login throttle's penalty box instead (``sql.pgwire.login_throttle``).
- message size: a frontend message whose length word is over the limit gets
  ``FATAL 54000`` and the connection is closed *before its body is read*, so a
  hostile length word costs no memory. (PostgreSQL's own ceiling is 1 GiB.)
- statement size: a Query or Parse whose text is over the limit gets ``ERROR
  54000``; the connection stays usable and an open transaction is failed, as any
  failed statement fails it. The grammar parses about 5 MB/s here, so the limit
  also bounds the time one statement can spend in the parser.
- result size: the engine materialises a statement's whole result as one Arrow
  table (``engine.session.Result.table``) before the wire layer sees it, so this
  limit cannot bound the engine's peak memory; what it bounds is what the
  server then encodes and sends (text encoding grows it: ``bytea`` doubles as
  hex), and what a client must take. A result whose Arrow size is over the
  limit gets ``ERROR 54000`` instead of rows; inside a transaction block the
  transaction is failed, so a consumer read whose rows were refused never
  commits its offsets. A topic read alone is already capped by the storage
  limits (``storage.limits.READ_BYTES_MAX`` and ``READ_MESSAGES_MAX``) well
  below the default, so an autocommit consumer read is not refused after its
  offsets moved; a bigger result (a table scan, a join) is refused whole: read
  it in parts with ``LIMIT ... OFFSET``.
- held client bytes: COPY FROM STDIN data not yet written and the Bind messages of held
  portals, summed over all connections, stay within ``held_bytes_max``
  (``sql.pgwire.memory_budget``) beyond each connection's floor, ``held_bytes_floor``
  (never refused, not charged), and one connection's charge within a quarter of it: past
  either the COPY or Bind gets ``ERROR 53200`` and the connection stays usable (each
  connection alone is bounded too: ``COPY_IN_BYTES_MAX``, ``PORTALS_PER_CONNECTION_MAX``
  portals of one message each). All held: ``held_bytes_max + connections_max x
  held_bytes_floor`` at most.
- spilled cursor bytes: the rows of SQL cursors past ``spill.SPILL_BYTES`` each are kept
  in unlinked files of the temporary directory; their bytes, summed over all connections,
  stay within ``spill_bytes_max`` and, over the connections of one login (superusers
  too), within ``spill_login_bytes_max`` (``sql.pgwire.spill_budget``): past either the
  DECLARE gets ``ERROR 53400`` as it writes, its file is dropped, the connection stays
  usable. ``topicbase serve --cursor-spill-limit MIB --cursor-spill-login-limit MIB``.
"""

from __future__ import annotations

import argparse
import asyncio
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa

from sql.pgwire.codec.messages import ProtocolError, message_length
from sql.user_sessions import UserSessions
from storage.errors import LimitExceededError, TooManyConnectionsError
from storage.limits import (
    CONNECTIONS_MAX_DEFAULT,
    CURSOR_SPILL_BYTES_MAX_DEFAULT,
    CURSOR_SPILL_LOGIN_BYTES_MAX_DEFAULT,
    KIB,
    MIB,
    RESULT_BYTES_MAX_DEFAULT,
    STATEMENT_BYTES_MAX_DEFAULT,
    SUPERUSER_RESERVED_CONNECTIONS_DEFAULT,
    UNAUTHENTICATED_MAX_DEFAULT,
    WIRE_HELD_BYTES_FLOOR,
    WIRE_HELD_BYTES_MAX_DEFAULT,
    WIRE_MESSAGE_BYTES_MAX_DEFAULT,
)


@dataclass(frozen=True)
class ServerLimits:
    """The limits one server enforces; every value is positive."""

    connections_max: int = CONNECTIONS_MAX_DEFAULT
    message_bytes_max: int = WIRE_MESSAGE_BYTES_MAX_DEFAULT
    statement_bytes_max: int = STATEMENT_BYTES_MAX_DEFAULT
    result_bytes_max: int = RESULT_BYTES_MAX_DEFAULT
    unauthenticated_max: int = UNAUTHENTICATED_MAX_DEFAULT
    superuser_reserved_connections: int = SUPERUSER_RESERVED_CONNECTIONS_DEFAULT
    # None: sql.pgwire.auth.AUTHENTICATION_TIMEOUT_S, read when a connection starts.
    authentication_timeout_s: float | None = None
    held_bytes_max: int = WIRE_HELD_BYTES_MAX_DEFAULT
    # What one connection holds before anything is charged to ``held_bytes_max``.
    held_bytes_floor: int = WIRE_HELD_BYTES_FLOOR
    # Sessions one ordinary user may hold at once when the users file gives them no
    # ``connection_limit`` of their own; None: no such bound (PostgreSQL's default).
    connections_per_user_max: int | None = None
    # Bytes in SQL cursors' spill files (temporary disk), all connections' and one login's.
    spill_bytes_max: int = CURSOR_SPILL_BYTES_MAX_DEFAULT
    spill_login_bytes_max: int = CURSOR_SPILL_LOGIN_BYTES_MAX_DEFAULT

    def __post_init__(self) -> None:
        for name in ("connections_max", "message_bytes_max", "statement_bytes_max",
                     "result_bytes_max", "unauthenticated_max", "held_bytes_max",
                     "spill_bytes_max", "spill_login_bytes_max"):  # fmt: skip
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, not {value!r}")
        reserved = self.superuser_reserved_connections
        if not isinstance(reserved, int) or reserved < 0:
            raise ValueError(f"superuser_reserved_connections must be 0 or more, not {reserved!r}")
        floor = self.held_bytes_floor
        if not isinstance(floor, int) or floor < 0:
            raise ValueError(f"held_bytes_floor must be 0 or more, not {floor!r}")
        per_user = self.connections_per_user_max
        if per_user is not None and (not isinstance(per_user, int) or per_user < 0):
            raise ValueError(f"connections_per_user_max must be 0 or more, not {per_user!r}")
        timeout_s = self.authentication_timeout_s
        if timeout_s is not None and not 0 < timeout_s <= 600:
            raise ValueError(f"authentication_timeout_s must be in (0, 600], not {timeout_s!r}")

    @property
    def reserved_connections(self) -> int:
        """The superuser-only slots in force: at most all but one (with max_connections 1,
        one ordinary user can still log in)."""
        return min(self.superuser_reserved_connections, self.connections_max - 1)


class MessageTooLargeError(LimitExceededError, ProtocolError):
    """A frontend message over ``message_bytes_max``: fatal, the body is never read.

    A limit (54000, from ``LimitExceededError``, first in the order) and a protocol error
    (the connection ends, as for every ``ProtocolError``)."""


def message_body_length(header: bytes, limits: ServerLimits) -> int:
    """The body length of a message from its 5-byte header, within ``limits``.

    A length word under 4 (negative included) or over PostgreSQL's 1 GiB is a
    ProtocolError (08P01); one over ``message_bytes_max`` is MessageTooLargeError
    (54000). Both are fatal: after a bad length the stream cannot be resynchronised.
    """
    length = message_length(header)
    if length > limits.message_bytes_max:
        raise MessageTooLargeError(
            f"message of type {header[:1]!r} is {length} bytes, over the limit of "
            f"{limits.message_bytes_max} bytes"
        )
    return length


def statement_error(body: bytes, limits: ServerLimits) -> LimitExceededError | None:
    """The error for a Query/Parse message body longer than ``statement_bytes_max``."""
    if len(body) <= limits.statement_bytes_max:
        return None
    return LimitExceededError(
        f"statement is {len(body)} bytes, over the limit of {limits.statement_bytes_max} bytes"
    )


def result_error(table: pa.Table | None, limits: ServerLimits) -> LimitExceededError | None:
    """The error for a result whose Arrow size is over ``result_bytes_max``."""
    if table is None or table.get_total_buffer_size() <= limits.result_bytes_max:
        return None  # the buffers' whole size bounds nbytes (a slice's share): cheaper
    if table.nbytes <= limits.result_bytes_max:
        return None
    return LimitExceededError(
        f"result of {table.num_rows} rows is {table.nbytes} bytes, over the limit of "
        f"{limits.result_bytes_max} bytes; read it in parts (LIMIT ... OFFSET)"
    )


class Admission:
    """Who holds a place in one server: sessions (``connections_max``, some reserved for
    superusers; at most a user's connection limit for an ordinary user) and sockets still
    logging in (``unauthenticated_max``).

    Invariants: ``sessions`` never exceeds ``connections_max`` and is the sum of
    ``by_user``; an ordinary user's count never exceeds the limit they were admitted
    under; a task is among the unauthenticated at most once and leaves when it logs in,
    starts a failed login's delay, is pushed out, or ends. Thread-safety: event loop
    thread only.
    """

    def __init__(self, limits: ServerLimits, user_sessions: UserSessions | None = None) -> None:
        """``user_sessions``: what users hold across the process's doors (``serve`` shares
        one with its Flight door), else this server's own."""
        self.limits = limits
        self.sessions = 0
        self.by_user: Counter[str] = Counter()  # sessions held, per user name
        self.user_sessions = user_sessions or UserSessions()
        # Sockets not logged in yet, oldest first, with their client address.
        self._unauthenticated: dict[asyncio.Task[None], str] = {}
        self.pushed_out = 0  # sockets closed to make room (for tests and logs)

    @property
    def unauthenticated(self) -> int:
        return len(self._unauthenticated)

    def full(self) -> bool:
        """Every session slot is taken: a newcomer is refused before it logs in."""
        return self.sessions >= self.limits.connections_max

    def enter(self, task: asyncio.Task[None], address: str) -> asyncio.Task[None] | None:
        """Count a new socket among those logging in; when that makes one too many, the
        socket to push out (the oldest of the address holding the most), else None."""
        victim = None
        if len(self._unauthenticated) >= self.limits.unauthenticated_max:
            busiest, _ = Counter(self._unauthenticated.values()).most_common(1)[0]
            victim = next(t for t, a in self._unauthenticated.items() if a == busiest)
            del self._unauthenticated[victim]
            self.pushed_out += 1
        self._unauthenticated[task] = address
        assert len(self._unauthenticated) <= self.limits.unauthenticated_max
        return victim

    def leave(self, task: asyncio.Task[None] | None) -> None:
        """The socket logged in, is waiting out a failed login, or is gone."""
        if task is not None:
            self._unauthenticated.pop(task, None)

    def claim(self, user: str, superuser: bool, user_limit: int | None = None) -> None:
        """Take a session slot for ``user``, who just logged in; 53300 if none is left for
        them: the last ``reserved_connections`` are for superusers, and an ordinary user
        holds at most ``user_limit`` sessions (the users file's ``connection_limit``), or
        else ``connections_per_user_max``, as PostgreSQL's role ``CONNECTION LIMIT``,
        which binds no superuser either."""
        if self.sessions >= self.limits.connections_max:
            raise TooManyConnectionsError("sorry, too many clients already")
        ordinary_max = self.limits.connections_max - self.limits.reserved_connections
        if not superuser and self.sessions >= ordinary_max:
            raise TooManyConnectionsError(
                "remaining connection slots are reserved for roles with the SUPERUSER attribute"
            )
        limit = self.limits.connections_per_user_max if user_limit is None else user_limit
        # counted with the user's Flight calls in progress (``sql.user_sessions``)
        if not self.user_sessions.claim(user, None if superuser else limit):
            raise TooManyConnectionsError(f'too many connections for role "{user}"')
        self.sessions += 1
        self.by_user[user] += 1

    def release(self, user: str) -> None:
        """Give back a slot ``claim`` gave ``user``."""
        assert self.by_user[user] > 0, "a slot is given back only by its holder"
        self.user_sessions.release(user)
        self.sessions -= 1
        self.by_user[user] -= 1
        if not self.by_user[user]:
            del self.by_user[user]  # the table holds only users with a session
        assert self.sessions >= 0


# -- topicbase serve options ------------------------------------------------------------------
def _count(minimum: int) -> Callable[[str], int]:
    """An argparse type: an integer of at least ``minimum``."""

    def parse(text: str) -> int:
        value = int(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, not {value}")
        return value

    return parse


def _seconds(text: str) -> float:
    value = float(text)
    if not 0 < value <= 600:
        raise argparse.ArgumentTypeError(f"must be more than 0 and at most 600 seconds, not {text}")
    return value


SETTING_OPTIONS = ("idle_session_timeout", "idle_in_transaction_session_timeout", "log_statement")


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    """``topicbase serve``'s options for these limits and the server's setting defaults."""
    parser.add_argument(
        "--max-connections", type=_count(1), default=CONNECTIONS_MAX_DEFAULT,
        help=f"sessions at most (default {CONNECTIONS_MAX_DEFAULT})",
    )  # fmt: skip
    parser.add_argument(
        "--superuser-reserved-connections", type=_count(0),
        default=SUPERUSER_RESERVED_CONNECTIONS_DEFAULT,
        help="of --max-connections, the slots only superusers may take (default "
             f"{SUPERUSER_RESERVED_CONNECTIONS_DEFAULT})",
    )  # fmt: skip
    parser.add_argument(
        "--max-connections-per-user", type=_count(0), default=None, metavar="N",
        help="sessions one ordinary user may hold when the users file gives them no "
             "connection limit of their own (default: no such limit, as PostgreSQL)",
    )  # fmt: skip
    parser.add_argument(
        "--max-unauthenticated-connections", type=_count(1), default=UNAUTHENTICATED_MAX_DEFAULT,
        help=f"sockets still logging in at once (default {UNAUTHENTICATED_MAX_DEFAULT})",
    )  # fmt: skip
    parser.add_argument(
        "--authentication-timeout", type=_seconds, metavar="SECONDS",
        help="close a socket not logged in after this long (default 10)",
    )  # fmt: skip
    parser.add_argument(
        "--cursor-spill-limit", type=_count(1), metavar="MIB",
        default=CURSOR_SPILL_BYTES_MAX_DEFAULT // MIB,
        help="MiB all SQL cursors may keep in temporary files (default "
             f"{CURSOR_SPILL_BYTES_MAX_DEFAULT // MIB})",
    )  # fmt: skip
    parser.add_argument(
        "--cursor-spill-login-limit", type=_count(1), metavar="MIB",
        default=CURSOR_SPILL_LOGIN_BYTES_MAX_DEFAULT // MIB,
        help="MiB the SQL cursors of one user's connections may keep in temporary files "
             f"(default {CURSOR_SPILL_LOGIN_BYTES_MAX_DEFAULT // MIB})",
    )  # fmt: skip
    parser.add_argument(
        "--statement-size-limit", type=_count(1), metavar="KIB",
        default=STATEMENT_BYTES_MAX_DEFAULT // KIB,
        help="KiB of SQL text one Query or Parse message may carry; longer is 54000 unread "
             f"(default {STATEMENT_BYTES_MAX_DEFAULT // KIB}; the front's work grows with "
             "the text, ~10-35 us a byte: lower it on a server open to untrusted users)",
    )  # fmt: skip
    parser.add_argument(
        "--idle-session-timeout", metavar="DURATION", default=None,
        help="default idle_session_timeout, e.g. 10min (default 0: none)",
    )  # fmt: skip
    parser.add_argument(
        "--idle-in-transaction-session-timeout", metavar="DURATION", default=None,
        help="default idle_in_transaction_session_timeout, e.g. 60s (default 0: none)",
    )  # fmt: skip
    parser.add_argument(
        "--log-statement", choices=("none", "ddl", "mod", "all"), default=None,
        help="statements whose text goes to the server log (default none)",
    )  # fmt: skip


def serve_configuration(arguments: argparse.Namespace) -> tuple[ServerLimits, dict[str, str]]:
    """The limits and setting defaults that ``add_serve_arguments``'s options ask for."""
    limits = ServerLimits(
        connections_max=arguments.max_connections,
        unauthenticated_max=arguments.max_unauthenticated_connections,
        superuser_reserved_connections=arguments.superuser_reserved_connections,
        authentication_timeout_s=arguments.authentication_timeout,
        connections_per_user_max=arguments.max_connections_per_user,
        spill_bytes_max=arguments.cursor_spill_limit * MIB,
        spill_login_bytes_max=arguments.cursor_spill_login_limit * MIB,
        statement_bytes_max=arguments.statement_size_limit * KIB,
    )
    settings = {
        name: getattr(arguments, name)
        for name in SETTING_OPTIONS
        if getattr(arguments, name) is not None
    }
    return limits, settings
