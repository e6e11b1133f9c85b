"""Password authentication of pgwire connections: SCRAM-SHA-256, md5, cleartext or trust.

Owns the server side of each exchange, after the StartupMessage (the verifiers it checks
against are ``sql.pgwire.verifiers``, the users file that holds them ``sql.pgwire.users``):

- ``scram``: AuthenticationSASL [SCRAM-SHA-256] → SASLInitialResponse (client-first) →
  SASLContinue (server-first: nonce, salt, iterations) → SASLResponse (client-final with
  the proof) → SASLFinal (the server signature). On a TLS connection whose certificate
  has a single signature hash, SCRAM-SHA-256-PLUS with ``tls-server-end-point`` channel
  binding (RFC 5929) is offered first; a client then saying "I could bind but you
  cannot" (``y``) is refused as a downgrade.
- ``md5``: AuthenticationMD5Password with a random 4-byte salt; the client answers
  ``md5`` + md5(md5(password + user) + salt). As in PostgreSQL, a user without a stored
  md5 hash is asked for SCRAM instead.
- ``password``: AuthenticationCleartextPassword; the password is checked against the
  SCRAM verifier (PBKDF2 off the event loop). Use it only over TLS or loopback.
- ``trust``: no password.

Invariants: the server never sees or stores a plaintext password except transiently in
``password`` mode; comparisons are constant-time; an unknown user goes through the same
exchange as a known one (a mock SCRAM salt derived from the name, so the salt does not
reveal whether the user exists) and fails at the same step. Every failure is logged with
its reason, waits (``asyncio.sleep``: other connections carry on) for the delay the
server's ``LoginThrottle`` sets (at least ``failure_delay_s``, growing with recent failures
of the client address and of the user name, across connections: ``sql.pgwire.login_throttle``)
and then raises ``InvalidPasswordError`` (FATAL 28P01 ``password authentication failed
for user "x"``), or ``ProtocolError`` (08P01) for a malformed exchange. While it waits,
the connection is in the throttle's penalty box (the channel's ``on_penalty`` tells the
server, which then stops counting it among connections still authenticating); an address
or user whose box is full is refused before its exchange (53300).

Thread-safety: ``Authenticator`` holds no per-connection state; each exchange has its own
``ScramExchange``.
"""

from __future__ import annotations

import asyncio
import binascii
import enum
import hashlib
import hmac
import logging
import secrets
from collections.abc import Callable

from sql.pgwire.codec import messages as m
from sql.pgwire.login_throttle import LoginThrottle
from sql.pgwire.users import ConfigFileError, UsersFile
from sql.pgwire.verifiers import (
    SCRAM_ITERATIONS,
    SCRAM_KEY_BYTES,
    SCRAM_MECHANISM,
    SCRAM_SALT_BYTES,
    ScramVerifier,
    b64,
    hmac_sha256,
    md5_response,
    unb64,
)
from storage.errors import TopicbaseError

log = logging.getLogger(__name__)

SCRAM_PLUS_MECHANISM = "SCRAM-SHA-256-PLUS"
CHANNEL_BINDING_TYPE = "tls-server-end-point"
SCRAM_NONCE_BYTES = 18
AUTH_FAILURE_DELAY_S = 0.5
# Startup negotiation, TLS handshake and authentication together. PostgreSQL's default
# is 60 s; 10 s is ample for a TLS handshake plus SCRAM's round trips over a slow link
# (a client computes its 4096 PBKDF2 iterations in milliseconds), and a password prompt
# never runs inside it: psql and libpq ask for the password before they connect again.
# A socket that has not logged in by then is closed (``ServerLimits`` may set another).
AUTHENTICATION_TIMEOUT_S = 10.0


class AuthMethod(enum.Enum):
    SCRAM = "scram"
    MD5 = "md5"
    PASSWORD = "password"
    TRUST = "trust"


class InvalidAuthorizationError(TopicbaseError):
    sqlstate = "28000"


class InvalidPasswordError(TopicbaseError):
    sqlstate = "28P01"


# -- SCRAM exchange ------------------------------------------------------------------------
def _malformed(detail: str) -> m.ProtocolError:
    return m.ProtocolError(f"malformed SCRAM message: {detail}")


def _attribute(part: str, name: str) -> str:
    if not part.startswith(name + "="):
        raise _malformed(f'expected attribute "{name}"')
    return part[len(name) + 1 :]


class ScramExchange:
    """The server side of one SCRAM-SHA-256(-PLUS) exchange (RFC 5802 section 5).

    ``channel_binding``: the tls-server-end-point data when the client chose
    SCRAM-SHA-256-PLUS; ``binding_offered``: whether -PLUS was offered at all (then a
    client that says it could bind but thinks the server cannot, flag ``y``, is being
    downgraded and is refused, RFC 5802 section 6).
    """

    def __init__(
        self, verifier: ScramVerifier, *, channel_binding: bytes | None = None,
        binding_offered: bool = False, server_nonce: str | None = None,
    ) -> None:  # fmt: skip
        """``server_nonce`` is fixed only by tests (RFC 7677's example); else random."""
        assert channel_binding is None or binding_offered, "-PLUS chosen only if offered"
        self.verifier = verifier
        self.channel_binding = channel_binding
        self.binding_offered = binding_offered
        self.server_nonce = server_nonce or b64(secrets.token_bytes(SCRAM_NONCE_BYTES))
        self.gs2_header = ""
        self.client_first_bare = ""
        self.server_first = ""
        self.nonce = ""

    def first(self, client_first: bytes) -> bytes:
        """server-first-message for client-first-message; ProtocolError if malformed."""
        text = _decode(client_first)
        parts = text.split(",")
        if len(parts) < 4:
            raise _malformed("client-first-message has too few attributes")
        self._check_binding_flag(parts[0])
        if parts[1]:
            raise _malformed("client uses authorization identity, which is not supported")
        if parts[2].startswith("m="):
            raise _malformed("mandatory extensions are not supported")
        _attribute(parts[2], "n")  # the user name: PostgreSQL uses the startup one
        client_nonce = _attribute(parts[3], "r")
        if not client_nonce or any(not 0x21 <= ord(c) <= 0x7E for c in client_nonce):
            raise _malformed("client nonce has invalid characters")
        self.gs2_header = f"{parts[0]},{parts[1]},"
        self.client_first_bare = ",".join(parts[2:])
        self.nonce = client_nonce + self.server_nonce
        self.server_first = (f"r={self.nonce},s={b64(self.verifier.salt)},"
                             f"i={self.verifier.iterations}")  # fmt: skip
        return self.server_first.encode("ascii")

    def _check_binding_flag(self, flag: str) -> None:
        if self.channel_binding is not None:  # the client chose SCRAM-SHA-256-PLUS
            if flag != f"p={CHANNEL_BINDING_TYPE}":
                raise m.ProtocolError(
                    "SCRAM channel binding negotiation error: -PLUS needs "
                    f'"p={CHANNEL_BINDING_TYPE}", the client sent "{flag}"'
                )
        elif flag.startswith("p="):
            raise m.ProtocolError("SCRAM channel binding is not offered on this connection")
        elif flag == "y" and self.binding_offered:
            raise m.ProtocolError("SCRAM channel binding negotiation error: the client "
                                  "supports it and the server offered it (downgrade?)")  # fmt: skip
        elif flag not in ("n", "y"):
            raise _malformed(f"unexpected channel-binding flag {flag[:1]!r}")

    def final(self, client_final: bytes) -> bytes | None:
        """server-final-message if the proof is right, None if not; ProtocolError if malformed."""
        assert self.nonce, "first() ran"
        text = _decode(client_final)
        parts = text.split(",")
        if len(parts) < 3:
            raise _malformed("client-final-message has too few attributes")
        try:
            binding = unb64(_attribute(parts[0], "c"))
            proof = unb64(_attribute(parts[-1], "p"))
        except (binascii.Error, UnicodeEncodeError):
            raise _malformed("invalid base64") from None
        if binding != self.gs2_header.encode("utf-8") + (self.channel_binding or b""):
            raise _malformed("channel binding data does not match the gs2 header")
        if _attribute(parts[1], "r") != self.nonce:
            raise _malformed("nonce does not match")
        if len(proof) != SCRAM_KEY_BYTES:
            raise _malformed("client proof has the wrong length")
        without_proof = ",".join(parts[:-1])
        auth_message = f"{self.client_first_bare},{self.server_first},{without_proof}"
        client_signature = hmac_sha256(self.verifier.stored_key, auth_message.encode("utf-8"))
        client_key = bytes(a ^ b for a, b in zip(proof, client_signature, strict=True))
        if not hmac.compare_digest(hashlib.sha256(client_key).digest(), self.verifier.stored_key):
            return None
        server_signature = hmac_sha256(self.verifier.server_key, auth_message.encode("utf-8"))
        return f"v={b64(server_signature)}".encode("ascii")


def _decode(data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise _malformed("invalid UTF-8") from None


# -- the exchange on a connection ----------------------------------------------------------
class AuthChannel:
    """Sends authentication requests and reads PasswordMessages on one connection."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 server_binding: bytes | None = None) -> None:  # fmt: skip
        """``server_binding``: the server certificate's tls-server-end-point data (None if
        it has none); used only if this connection is in fact encrypted."""
        self.reader = reader
        self.writer = writer
        encrypted = writer.get_extra_info("ssl_object") is not None
        self.channel_binding = server_binding if encrypted else None
        self.mechanism = ""  # what the exchange used, for the log
        peer = writer.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        # The client address without its port: what failures are counted by.
        self.address = str(peer[0]) if isinstance(peer, tuple) else str(peer)
        # Called once a failure starts its delay (the server stops counting the
        # connection among those still authenticating).
        self.on_penalty: Callable[[], None] | None = None

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def receive(self) -> bytes:
        """The body of the next message, which must be a PasswordMessage (``p``)."""
        header = await self.reader.readexactly(5)
        return await self.reader.readexactly(m.password_message_length(header))


class Authenticator:
    """Checks passwords for one server: its method, its users file, its failure delay."""

    def __init__(self, method: AuthMethod, users: UsersFile | None,
                 failure_delay_s: float = AUTH_FAILURE_DELAY_S) -> None:  # fmt: skip
        assert method is AuthMethod.TRUST or users is not None, "password methods need users"
        self.method = method
        self.users = users
        self.failure_delay_s = failure_delay_s
        self.throttle = LoginThrottle(failure_delay_s)
        self._mock_secret = secrets.token_bytes(32)

    def is_superuser(self, user: str) -> bool:
        """Whether ``user`` (authenticated) is a superuser: under trust every client is
        (there are no roles to consult), else the users file says."""
        return self.users is None or self.users.is_superuser(user)

    def connection_limit(self, user: str) -> int | None:
        """The most sessions ``user`` may hold by the users file (its ``connection_limit``);
        None when it sets none, and under trust (no users file)."""
        entry = None if self.users is None else self.users.lookup(user)
        return None if entry is None else entry.connection_limit

    async def authenticate(self, channel: AuthChannel, user: str) -> None:
        """Return once ``user`` proved their password (at once for trust).

        Raises InvalidPasswordError (28P01) or ProtocolError (08P01) after logging the
        failure and waiting ``failure_delay_s``; a client that hangs up mid-way raises
        IncompleteReadError or ConnectionError without the delay.
        """
        if self.method is AuthMethod.TRUST:
            return
        self.throttle.admit(channel.address, user)  # 53300 while a penalty box is full
        failure: TopicbaseError | None = None
        try:
            reason = await self._exchange(channel, user)
        except m.ProtocolError as error:
            reason, failure = error.message, error
        if reason is None:
            self.throttle.succeeded(user)
            log.info('user "%s" authenticated (%s) from %s', user, channel.mechanism, channel.peer)
            return
        delay_s = self.throttle.failed(channel.address, user)
        log.warning('password authentication failed for user "%s" from %s: %s (%s); '
                    "answered in %.1f s", user, channel.peer, reason, channel.mechanism,
                    delay_s)  # fmt: skip
        with self.throttle.penalty_box(channel.address, user):
            if channel.on_penalty is not None:
                channel.on_penalty()
            await asyncio.sleep(delay_s)
        raise failure or InvalidPasswordError(f'password authentication failed for user "{user}"')

    async def _exchange(self, channel: AuthChannel, user: str) -> str | None:
        """None on success, else the reason of the failure (for the log)."""
        assert self.users is not None
        error = self.users.reload()
        if error is not None:
            log.error("users file not reloaded, keeping its last good contents: %s", error)
        entry = self.users.lookup(user)
        if self.method is AuthMethod.MD5 and (entry is None or entry.md5 is not None):
            return await self._md5(channel, user, None if entry is None else entry.md5)
        verifier = None if entry is None else ScramVerifier.parse(entry.scram)
        if self.method is AuthMethod.PASSWORD:
            return await self._cleartext(channel, user, verifier)
        return await self._scram(channel, user, verifier)

    def _mock_verifier(self, user: str) -> ScramVerifier:
        """A verifier no password matches, with a salt stable per user name."""
        salt = hmac_sha256(self._mock_secret, user.encode("utf-8"))[:SCRAM_SALT_BYTES]
        keys = secrets.token_bytes(2 * SCRAM_KEY_BYTES)
        return ScramVerifier(SCRAM_ITERATIONS, salt, keys[:SCRAM_KEY_BYTES], keys[SCRAM_KEY_BYTES:])

    async def _scram(self, channel: AuthChannel, user: str,
                     verifier: ScramVerifier | None) -> str | None:  # fmt: skip
        channel.mechanism = SCRAM_MECHANISM
        offered = [SCRAM_MECHANISM]
        if channel.channel_binding is not None:
            offered.insert(0, SCRAM_PLUS_MECHANISM)
        await channel.send(m.authentication_sasl(offered))
        initial = m.parse_sasl_initial_response(await channel.receive())
        if initial.mechanism not in offered:
            raise m.ProtocolError("client selected an invalid SASL authentication mechanism")
        plus = initial.mechanism == SCRAM_PLUS_MECHANISM
        channel.mechanism = initial.mechanism
        exchange = ScramExchange(
            verifier or self._mock_verifier(user),
            channel_binding=channel.channel_binding if plus else None,
            binding_offered=channel.channel_binding is not None,
        )
        if initial.data is None:
            raise _malformed("no initial response")
        await channel.send(m.authentication_sasl_continue(exchange.first(initial.data)))
        server_final = exchange.final(m.parse_sasl_response(await channel.receive()))
        if server_final is None:
            return "no such user" if verifier is None else "wrong password (SCRAM proof)"
        await channel.send(m.authentication_sasl_final(server_final))
        return None

    async def _md5(self, channel: AuthChannel, user: str, md5_verifier: str | None) -> str | None:
        channel.mechanism = "md5"
        salt = secrets.token_bytes(4)
        await channel.send(m.authentication_md5_password(salt))
        answer = m.parse_password(await channel.receive())
        if md5_verifier is None:
            return "no such user"
        expected = md5_response(md5_verifier, salt)
        if not hmac.compare_digest(answer.encode("utf-8"), expected.encode("ascii")):
            return "wrong password (md5)"
        return None

    async def _cleartext(self, channel: AuthChannel, user: str,
                         verifier: ScramVerifier | None) -> str | None:  # fmt: skip
        channel.mechanism = "cleartext password"
        await channel.send(m.authentication_cleartext_password())
        password = m.parse_password(await channel.receive())
        checked = verifier or self._mock_verifier(user)  # same work for unknown users
        matches = await asyncio.to_thread(checked.matches_password, password)
        if verifier is None:
            return "no such user"
        return None if matches and password else "wrong password (cleartext)"


def make_authenticator(method: AuthMethod, users_path: str,
                       failure_delay_s: float = AUTH_FAILURE_DELAY_S) -> Authenticator:  # fmt: skip
    """The authenticator of a server; for a password method the users file at
    ``users_path`` must be well-formed and name at least one user (ConfigFileError)."""

    if method is AuthMethod.TRUST:
        return Authenticator(method, None, failure_delay_s)
    users = UsersFile(users_path)
    error = users.reload()
    if error is not None:
        raise error
    if users.count() == 0:
        raise ConfigFileError(
            f"no users in {users_path}: add one with `topicbase user add NAME` (with the "
            f"same --data-dir or --users-file), or serve with --auth trust"
        )
    return Authenticator(method, users, failure_delay_s)
