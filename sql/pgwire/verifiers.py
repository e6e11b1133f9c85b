"""Password verifiers as PostgreSQL stores them, and SASLprep.

RFC 5802/7677 SCRAM-SHA-256 in PostgreSQL's text form
``SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>`` (``ScramVerifier``,
``make_scram_verifier``) and PostgreSQL's ``md5<hex>`` (``make_md5_verifier``,
``md5_response``). Passwords are prepared with SASLprep (RFC 4013, Python's ``stringprep``
tables, i.e. Unicode 3.2); a password SASLprep rejects is used as its raw UTF-8 bytes, as
PostgreSQL and libpq do. Pure functions: the users file (``users``) stores what these
make, the exchanges (``auth``) check against it; neither is imported here.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
import stringprep
import unicodedata
from dataclasses import dataclass

from storage.limits import SCRAM_ITERATIONS_MAX

SCRAM_MECHANISM = "SCRAM-SHA-256"
SCRAM_ITERATIONS = 4096
SCRAM_SALT_BYTES = 16
SCRAM_KEY_BYTES = 32  # SHA-256


_PROHIBITED = (
    stringprep.in_table_c12, stringprep.in_table_c21, stringprep.in_table_c22,
    stringprep.in_table_c3, stringprep.in_table_c4, stringprep.in_table_c5,
    stringprep.in_table_c6, stringprep.in_table_c7, stringprep.in_table_c8,
    stringprep.in_table_c9, stringprep.in_table_a1,
)  # fmt: skip


def saslprep(text: str) -> str | None:
    """RFC 4013 SASLprep of ``text`` (as a stored string), or None if it is prohibited."""
    mapped = "".join(
        " " if stringprep.in_table_c12(c) else c for c in text if not stringprep.in_table_b1(c)
    )
    prepared = unicodedata.normalize("NFKC", mapped)
    if any(check(c) for c in prepared for check in _PROHIBITED):
        return None
    if any(stringprep.in_table_d1(c) for c in prepared):
        if any(stringprep.in_table_d2(c) for c in prepared):
            return None
        if not (stringprep.in_table_d1(prepared[0]) and stringprep.in_table_d1(prepared[-1])):
            return None
    return prepared


def password_bytes(password: str) -> bytes:
    prepared = saslprep(password)
    return (password if prepared is None else prepared).encode("utf-8")


def hmac_sha256(key: bytes, data: bytes) -> bytes:
    return hmac.new(key, data, hashlib.sha256).digest()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def unb64(text: str) -> bytes:
    """Strict base64 decoding; ValueError (binascii.Error) on bad input."""
    return base64.b64decode(text.encode("ascii"), validate=True)


@dataclass(frozen=True)
class ScramVerifier:
    """What the server keeps of a SCRAM-SHA-256 password (RFC 5802 section 3)."""

    iterations: int
    salt: bytes
    stored_key: bytes
    server_key: bytes

    @classmethod
    def parse(cls, text: str) -> ScramVerifier:
        """PostgreSQL's ``SCRAM-SHA-256$<iter>:<salt>$<StoredKey>:<ServerKey>``; ValueError."""
        try:
            mechanism, parameters, keys = text.split("$")
            iterations_text, salt_text = parameters.split(":")
            stored_text, server_text = keys.split(":")
            verifier = cls(int(iterations_text), unb64(salt_text), unb64(stored_text),
                           unb64(server_text))  # fmt: skip
        except (ValueError, binascii.Error, UnicodeEncodeError):
            raise ValueError("malformed SCRAM-SHA-256 verifier") from None
        if mechanism != SCRAM_MECHANISM:
            raise ValueError(f"verifier is not {SCRAM_MECHANISM}")
        if not 1 <= verifier.iterations <= SCRAM_ITERATIONS_MAX or not verifier.salt:
            raise ValueError("SCRAM-SHA-256 verifier has a bad iteration count or salt")
        if len(verifier.stored_key) != SCRAM_KEY_BYTES or len(verifier.server_key) != 32:
            raise ValueError("SCRAM-SHA-256 verifier keys are not 32 bytes")
        return verifier

    def to_text(self) -> str:
        return (f"{SCRAM_MECHANISM}${self.iterations}:{b64(self.salt)}$"
                f"{b64(self.stored_key)}:{b64(self.server_key)}")  # fmt: skip

    def matches_password(self, password: str) -> bool:
        """True if ``password`` derives this verifier (PBKDF2: slow on purpose)."""
        candidate = make_scram_verifier(password, salt=self.salt, iterations=self.iterations)
        return hmac.compare_digest(candidate.stored_key, self.stored_key) and hmac.compare_digest(
            candidate.server_key, self.server_key
        )


def make_scram_verifier(password: str, *, salt: bytes | None = None,
                        iterations: int = SCRAM_ITERATIONS) -> ScramVerifier:  # fmt: skip
    """A SCRAM-SHA-256 verifier of ``password`` with ``salt`` (fresh random if None)."""
    salt = secrets.token_bytes(SCRAM_SALT_BYTES) if salt is None else salt
    salted = hashlib.pbkdf2_hmac("sha256", password_bytes(password), salt, iterations)
    stored_key = hashlib.sha256(hmac_sha256(salted, b"Client Key")).digest()
    verifier = ScramVerifier(iterations, salt, stored_key, hmac_sha256(salted, b"Server Key"))
    assert len(verifier.stored_key) == len(verifier.server_key) == SCRAM_KEY_BYTES
    return verifier


def make_md5_verifier(user: str, password: str) -> str:
    """PostgreSQL's stored md5 password: ``md5`` + hex md5(password + user name)."""
    return "md5" + hashlib.md5((password + user).encode("utf-8")).hexdigest()


def md5_response(md5_verifier: str, salt: bytes) -> str:
    """What a client that knows the password answers to AuthenticationMD5Password(salt)."""
    assert md5_verifier.startswith("md5") and len(salt) == 4
    return "md5" + hashlib.md5(md5_verifier[3:].encode("ascii") + salt).hexdigest()
