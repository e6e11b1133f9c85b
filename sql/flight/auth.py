"""Authentication of the Flight door: Flight's basic-auth handshake, then bearer tokens.

A client calls ``FlightClient.authenticate_basic_token(user, password)``: the handshake
carries ``Authorization: Basic …``, which is checked against the same users file as the
wire server (the password must derive the user's stored SCRAM-SHA-256 verifier; no
plaintext is stored anywhere), and answered with ``Authorization: Bearer <token>``, which
every later call carries. Under ``--auth trust`` any user name is accepted and acts as a
superuser, exactly as on the wire.

Invariants: a token is 256 random bits, known only to the server's memory, valid for
``TOKEN_LIFETIME_S``; a failed password check waits ``failure_delay_s`` before answering;
the users file is re-read when it changes, and a token stands for the user's entry as it
was at login: at every call the user's entry now decides (``identity_of``), so a user
removed from the file or given a new password has its tokens refused (28000, log in
again) and a superuser demoted in the file acts as an ordinary user from its next call.
"""

from __future__ import annotations

import base64
import binascii
import logging
import secrets
import threading
import time
from dataclasses import dataclass
from typing import Any

import pyarrow.flight as flight

from engine.api import LOCAL_SUPERUSER_NAME, Identity
from sql.flight.admission import CallAdmission
from sql.pgwire.users import UsersFile
from sql.pgwire.verifiers import ScramVerifier
from storage import limits

log = logging.getLogger(__name__)

TOKEN_LIFETIME_S = 12 * 3600.0
AUTH_FAILURE_DELAY_S = 0.5


@dataclass(frozen=True)
class _Token:
    identity: Identity
    expires_s: float
    scram: str | None  # the user's verifier at login (None under trust)


class FlightAuthenticator:
    """Checks Basic credentials and issues and checks bearer tokens."""

    def __init__(self, users: UsersFile | None, failure_delay_s: float = AUTH_FAILURE_DELAY_S
                 ) -> None:  # fmt: skip
        self.users = users  # None: trust
        self.failure_delay_s = failure_delay_s
        self._tokens: dict[str, _Token] = {}
        self._lock = threading.Lock()

    def login(self, user: str, password: str) -> tuple[str, Identity]:
        """A fresh token for ``user`` if ``password`` is right; FlightUnauthenticatedError."""
        identity, scram = self._check(user, password)
        token = secrets.token_urlsafe(32)
        now = time.monotonic()
        with self._lock:
            if len(self._tokens) >= limits.FLIGHT_TOKENS_MAX:
                self._tokens = {k: t for k, t in self._tokens.items() if t.expires_s > now}
            self._tokens[token] = _Token(identity, now + TOKEN_LIFETIME_S, scram)
        return token, identity

    def _check(self, user: str, password: str) -> tuple[Identity, str | None]:
        """The identity ``user`` logs in as, and the verifier it was checked against."""
        if self.users is None:
            return Identity(user or LOCAL_SUPERUSER_NAME, superuser=True), None
        error = self.users.reload()
        if error is not None:
            log.warning("users file: %s (keeping the last good contents)", error)
        entry = self.users.lookup(user)
        valid = False
        if entry is not None:
            try:
                valid = ScramVerifier.parse(entry.scram).matches_password(password)
            except ValueError:
                valid = False
        if not valid:
            log.warning('Flight: password authentication failed for user "%s"', user)
            time.sleep(self.failure_delay_s)
            raise flight.FlightUnauthenticatedError(
                f'28P01: password authentication failed for user "{user}"'
            )
        assert entry is not None
        return Identity(user, superuser=entry.superuser), entry.scram

    def connection_limit(self, name: str) -> int | None:
        """The user's own connection limit as the users file said at its last reload
        (every call reloads it first; None: none, or no file)."""
        entry = None if self.users is None else self.users.lookup(name)
        return None if entry is None else entry.connection_limit

    def identity_of(self, token: str) -> Identity:
        """Who a call carrying ``token`` acts as, by the users file now (re-read if it
        changed: a stat of it per call, nothing next to a Flight call)."""
        with self._lock:
            held = self._tokens.get(token)
        if held is None or held.expires_s <= time.monotonic():
            raise flight.FlightUnauthenticatedError("28000: invalid or expired token; log in")
        if self.users is None:
            return held.identity
        error = self.users.reload()
        if error is not None:
            log.warning("users file: %s (keeping the last good contents)", error)
        entry = self.users.lookup(held.identity.name)
        if entry is None or entry.scram != held.scram:
            with self._lock:
                self._tokens.pop(token, None)
            raise flight.FlightUnauthenticatedError(
                "28000: the user was removed or its password changed since this token was "
                "issued; log in again"
            )
        if entry.superuser != held.identity.superuser:
            held = _Token(Identity(entry.name, entry.superuser), held.expires_s, held.scram)
            with self._lock:
                if token in self._tokens:
                    self._tokens[token] = held
        return held.identity


class _AuthMiddleware(flight.ServerMiddleware):
    def __init__(self, identity: Identity, token: str | None,
                 admission: CallAdmission | None = None) -> None:  # fmt: skip
        self.identity = identity
        self._token = token
        self._admission = admission  # set while the call holds a place of its user's

    def sending_headers(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self._token}"} if self._token else {}

    def call_completed(self, exception: Any) -> None:
        admission, self._admission = self._admission, None
        if admission is not None:
            admission.release(self.identity.name)


class AuthMiddlewareFactory(flight.ServerMiddlewareFactory):
    """Every call: Basic (the handshake) logs in, Bearer is checked; anything else fails.
    A call of an ordinary user then takes a place among its user's calls in progress
    (``admission``, given back when the call completes; 53300 past the user's limit)."""

    def __init__(self, authenticator: FlightAuthenticator,
                 admission: CallAdmission | None = None) -> None:  # fmt: skip
        self.authenticator = authenticator
        self.admission = admission

    def start_call(self, info: Any, headers: dict[str, list[str]]) -> _AuthMiddleware:
        middleware = self._authenticated(headers)
        if self.admission is not None and self.admission.claim(middleware.identity):
            middleware._admission = self.admission
        return middleware

    def _authenticated(self, headers: dict[str, list[str]]) -> _AuthMiddleware:
        values = headers.get("authorization") or headers.get("Authorization") or []
        if not values:
            raise flight.FlightUnauthenticatedError("28000: no credentials: log in first")
        kind, _, value = values[0].partition(" ")
        if kind.lower() == "basic":
            try:
                user, _, password = base64.b64decode(value, validate=True).decode().partition(":")
            except (binascii.Error, UnicodeDecodeError):
                raise flight.FlightUnauthenticatedError(
                    "28000: malformed Basic credentials") from None
            token, identity = self.authenticator.login(user, password)
            return _AuthMiddleware(identity, token)
        if kind.lower() == "bearer":
            return _AuthMiddleware(self.authenticator.identity_of(value), None)
        raise flight.FlightUnauthenticatedError(f"28000: unsupported authorization {kind}")


class NoHandshakeCheck(flight.ServerAuthHandler):
    """The handshake itself succeeds: the middleware checked its Basic header already."""

    def authenticate(self, outgoing: Any, incoming: Any) -> None:
        return None

    def is_valid(self, token: bytes) -> str:
        return ""
