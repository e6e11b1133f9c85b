"""The asyncio PostgreSQL-wire server: ``topicbase serve``.

``PgServer`` listens, admits sockets (``limits.Admission``: the login deadline, the
sockets still logging in, the session slots of ``max_connections``), hands each to a
``connection.Connection`` and answers a CancelRequest; ``serve`` runs it in the
foreground until SIGINT/SIGTERM, ``ServerThread`` on a background thread. What happens on
one connection is ``connection/``'s (see there, and ``sql.pgwire`` for the wings).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
from collections.abc import Callable
from typing import Any

from engine.api import Database, configure_malloc, freeze_owned_process
from sql.pgwire import auth as wire_auth
from sql.pgwire import memory_cap
from sql.pgwire import tls as wire_tls
from sql.pgwire.codec import messages as m
from sql.pgwire.connection.connection import SERVER_VERSION, Connection
from sql.pgwire.emulation.pg_settings import PgSettings
from sql.pgwire.limits import Admission, ServerLimits
from sql.pgwire.memory_budget import MemoryBudget
from sql.pgwire.spill_budget import SpillBudget
from sql.pgwire.users import ConfigFileError, UsersWatch, default_users_path
from sql.user_sessions import UserSessions
from storage.errors import FeatureNotSupportedError, TooManyConnectionsError
from storage.limits import REFUSAL_PACKETS_MAX, REFUSAL_TIMEOUT_S, USERS_FILE_POLL_S

log = logging.getLogger(__name__)

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 5433


# Libraries that would put statement text in the server's log (sqlglot warns with SQL
# fragments); statements reach the log only through ``log_statement``.
SQL_LOGGERS = ("sqlglot", "duckdb")


def silence_sql_logging() -> None:
    """Keep libraries that log SQL out of the server log (idempotent)."""
    for name in SQL_LOGGERS:
        logging.getLogger(name).setLevel(logging.CRITICAL + 1)



class PgServer:
    """Serves one open ``Database`` over the PostgreSQL protocol."""

    def __init__(self, database: Database, host: str = DEFAULT_HOST,
                 port: int = DEFAULT_PORT, auth: str = "trust",
                 limits: ServerLimits | None = None, *, users_file: str | None = None,
                 tls_cert: str | None = None, tls_key: str | None = None,
                 settings: dict[str, str] | None = None,
                 user_sessions: UserSessions | None = None) -> None:  # fmt: skip
        """``auth``: scram, md5, password or trust (``sql.pgwire.auth``); ``users_file``
        defaults to ``<data-dir>/users.json``; TLS is offered when ``tls_cert`` and
        ``tls_key`` (PEM) are given; ``settings``: the server's defaults of session
        settings (``idle_session_timeout``, ``log_statement``…, ``emulation.pg_settings``);
        ``user_sessions``: the per-user count shared with a Flight door (``serve``).
        Bad settings raise before anything listens."""
        silence_sql_logging()
        self.settings = dict(settings or {})
        PgSettings(SERVER_VERSION, "", "", self.settings)  # checks them (22023)
        try:
            method = wire_auth.AuthMethod(auth)
        except ValueError:
            raise FeatureNotSupportedError(
                f'authentication method "{auth}" is not supported'
            ) from None
        if (tls_cert is None) != (tls_key is None):
            raise ConfigFileError("a TLS certificate and its key go together (--tls-cert and "
                                  "--tls-key)")  # fmt: skip
        self.authenticator = wire_auth.make_authenticator(
            method, users_file or default_users_path(database.path)
        )
        self.tls_context = (
            None if tls_cert is None or tls_key is None
            else wire_tls.make_server_context(tls_cert, tls_key)
        )  # fmt: skip
        # tls-server-end-point data for SCRAM-SHA-256-PLUS (None: not offered).
        self.tls_channel_binding = (
            None if tls_cert is None else wire_tls.channel_binding_data(tls_cert)
        )
        if method is wire_auth.AuthMethod.PASSWORD and self.tls_context is None:
            log.warning("--auth password sends passwords in cleartext and TLS is not "
                        "configured: use it only on loopback")  # fmt: skip
        self.database = database
        self.host = host
        self.port = port
        self.connections: dict[int, Connection] = {}
        self._next_process_id = 1000
        self._server: asyncio.Server | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.limits = limits or ServerLimits()
        # COPY data and held portals' Bind messages of all connections (53200 past it)
        self.memory_budget = MemoryBudget(self.limits.held_bytes_max, self.limits.held_bytes_floor)
        # Bytes in the spill files of all connections' cursors (53400 past it, or past a login's)
        self.spill_budget = SpillBudget(self.limits.spill_bytes_max,
                                        self.limits.spill_login_bytes_max)  # fmt: skip
        # session slots, sockets still logging in
        self.admission = Admission(self.limits, user_sessions)
        self.open_sockets = 0  # accepted and not yet closed
        self._users_watch: UsersWatch | None = None

    def claim_slot(
        self, connection: Connection, user: str, superuser: bool, user_limit: int | None
    ) -> None:
        """``user`` logged in: take a session slot (53300 if none is left for them, or
        they hold their connection limit already)."""
        self.admission.leave(asyncio.current_task())
        self.admission.claim(user, superuser, user_limit)
        connection.slot_user = user

    def release_slot(self, user: str) -> None:
        self.admission.release(user)

    def leave_unauthenticated(self, task: asyncio.Task[Any] | None) -> None:
        """A failed login waits out its delay in the throttle's penalty box, not here."""
        self.admission.leave(task)

    def register(self, connection: Connection) -> int:
        self._next_process_id += 1
        self.connections[self._next_process_id] = connection
        return self._next_process_id

    def cancel(self, process_id: int, secret_key: int) -> None:
        connection = self.connections.get(process_id)
        if connection is not None and connection.secret_key == secret_key and connection.session:
            connection.session.cancel()
            connection.context.cancel_bell.ring()  # a COPY IN waiting for its client ends

    def call_soon(self, function: Callable[[], Any]) -> None:
        """Run ``function`` on the server's event loop thread, from a connection's own
        thread (``connection.own_thread``); dropped if the loop is closed already."""
        loop = self._loop
        if loop is None:
            return
        try:
            loop.call_soon_threadsafe(function)
        except RuntimeError:  # closed: the server stopped
            log.debug("the server's loop is closed")

    async def start(self) -> int:
        """Start listening; returns the port (useful with port 0)."""
        self._loop = asyncio.get_running_loop()
        self._server = await asyncio.start_server(self._handle, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        users = self.authenticator.users
        if users is not None and self._users_watch is None:
            # open sessions learn of a demotion or a removal (Connection.check_users_file)
            self._users_watch = UsersWatch(users, USERS_FILE_POLL_S).start()
        return self.port

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self.open_sockets += 1  # only the event loop thread touches the count
        peer = writer.get_extra_info("peername")
        victim = self.admission.enter(task, str(peer[0]) if isinstance(peer, tuple) else "")
        if victim is not None:  # too many sockets logging in: the flood's oldest goes
            pushed_out = self.admission.pushed_out
            if pushed_out & (pushed_out - 1) == 0:  # 1, 2, 4, 8 …: a flood does not flood the log
                log.warning("%d connections logging in at once: closed the oldest of the "
                            "busiest address (%d so far)", self.limits.unauthenticated_max,
                            pushed_out)  # fmt: skip
            victim.cancel()
        try:
            if self.admission.full():
                await self._refuse(reader, writer)
            else:
                await Connection(self, reader, writer).run()
        except asyncio.CancelledError:  # the server is stopping, or the socket was pushed out
            log.debug("connection task cancelled")
            writer.close()
        finally:
            self.admission.leave(task)
            self.open_sockets -= 1
            assert self.open_sockets >= 0
            self._tasks.discard(task)

    async def _refuse(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Answer a client over ``connections_max`` with FATAL 53300, then close.

        As PostgreSQL does, the refusal comes after the startup packet (clients read an
        ErrorResponse only then): SSL/GSS requests get ``N``, a CancelRequest is still
        served, anything malformed or slow (``REFUSAL_TIMEOUT_S``) is just closed.
        """
        error = TooManyConnectionsError("sorry, too many clients already")
        try:
            async with asyncio.timeout(REFUSAL_TIMEOUT_S):
                for _ in range(REFUSAL_PACKETS_MAX):
                    length = m.startup_length(await reader.readexactly(4))
                    startup = m.parse_startup(await reader.readexactly(length - 4))
                    if startup.code in (m.SSL_REQUEST, m.GSSENC_REQUEST):
                        writer.write(b"N")
                        continue
                    if startup.code == m.CANCEL_REQUEST:
                        self.cancel(startup.process_id, startup.secret_key)
                    else:
                        writer.write(m.error_response(error.sqlstate, error.message,
                                                      severity="FATAL"))  # fmt: skip
                    break
                await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError, m.ProtocolError):
            log.debug("a refused client went away or sent garbage")
        finally:
            writer.close()

    async def stop(self) -> None:
        if self._users_watch is not None:
            self._users_watch.stop()
            self._users_watch = None
        if self._server is not None:
            self._server.close()
            for connection in list(self.connections.values()):
                connection.close_socket()
            if self._tasks:
                _, pending = await asyncio.wait(list(self._tasks), timeout=5)
                for task in pending:
                    task.cancel()
            await self._server.wait_closed()


def serve(data_dir: str, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT,
          auth: str = "scram", ready: Callable[[int], None] | None = None,
          limits: ServerLimits | None = None, *, users_file: str | None = None,
          tls_cert: str | None = None, tls_key: str | None = None,
          settings: dict[str, str] | None = None,
          memory_cap_bytes: int | None = None,
          user_sessions: UserSessions | None = None) -> None:  # fmt: skip
    """Open ``data_dir`` and serve it until SIGINT or SIGTERM (blocking). Meant to own its
    process: it tunes the process's malloc for large messages (``engine.malloc_tuning``),
    caps its private memory (``sql.pgwire.memory_cap``: ``memory_cap_bytes``, default a
    share of physical memory, 0 none; a value built past it fails with 53200 instead of the
    kernel killing the server) and sends the log to stderr at INFO (logins, statements
    under ``log_statement``) if nothing configured logging before. ``user_sessions``: the
    per-user count shared with ``serve``'s Flight door."""
    configure_malloc()  # glibc's thresholds, unless the environment chose (before the open)
    connections = (limits or ServerLimits()).connections_max
    capped = memory_cap.cap_process_data(memory_cap_bytes, connections)
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO,
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")  # fmt: skip
    silence_sql_logging()
    if capped is not None:
        log.info("process memory capped at %d MiB (RLIMIT_DATA)", capped >> 20)
    database = Database.open(data_dir)
    freeze_owned_process()  # this process is the server's (engine.gc_tuning)
    try:
        server = PgServer(database, host, port, auth, limits=limits, users_file=users_file,
                          tls_cert=tls_cert, tls_key=tls_key, settings=settings,
                          user_sessions=user_sessions)  # fmt: skip

        async def main() -> None:
            bound = await server.start()
            stopping = asyncio.Event()
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopping.set)
            if ready is not None:
                ready(bound)
            try:
                await stopping.wait()
            finally:
                await server.stop()

        asyncio.run(main())
    finally:
        database.close()


class ServerThread:
    """A server on a background thread with its own event loop (tests, embedding)."""

    def __init__(self, data_dir: str, host: str = DEFAULT_HOST, port: int = 0,
                 limits: ServerLimits | None = None, *, auth: str = "trust",
                 users_file: str | None = None, tls_cert: str | None = None,
                 tls_key: str | None = None,
                 settings: dict[str, str] | None = None,
                 user_sessions: UserSessions | None = None) -> None:  # fmt: skip
        self.database = Database.open(data_dir)
        try:
            self.server = PgServer(self.database, host, port, auth, limits=limits,
                                   users_file=users_file, tls_cert=tls_cert,
                                   tls_key=tls_key, settings=settings,
                                   user_sessions=user_sessions)  # fmt: skip
        except BaseException:
            self.database.close()
            raise
        self.loop = asyncio.new_event_loop()
        self.port = self.loop.run_until_complete(self.server.start())
        self.thread = threading.Thread(target=self.loop.run_forever, name="topicbase-pgwire",
                                       daemon=True)  # fmt: skip
        self.thread.start()

    def stop(self) -> None:
        future = asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop)
        try:
            future.result(timeout=10)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=10)
            self.database.close()
