"""TLS for pgwire connections: the server's context and the upgrade after an SSLRequest.

TLS is offered, not forced: with ``--tls-cert``/``--tls-key`` the server answers an
SSLRequest with ``S`` and runs the handshake on the same stream
(``StreamWriter.start_tls``); clients that do not ask (``sslmode=disable``) stay in
plaintext. Without a certificate the answer is ``N``, as PostgreSQL's is.

Channel binding: ``channel_binding_data`` computes RFC 5929 ``tls-server-end-point``
data (the certificate's hash, with the hash of its signature algorithm) for
SCRAM-SHA-256-PLUS (``sql.pgwire.auth``); a certificate without a single signature hash
(Ed25519, RSASSA-PSS) gets no -PLUS, as with PostgreSQL.

Invariants: TLS 1.2 or newer; no plaintext byte that arrived before the handshake is
ever read as if it had come through TLS (a client that pipelines data after its
SSLRequest is refused, as PostgreSQL does since CVE-2021-23214); the key file must not
be readable by everyone; at most WIRE_NEGOTIATION_PACKETS_MAX encryption requests per
connection.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import ssl
import stat

from sql.pgwire.codec import messages as m
from sql.pgwire.users import ConfigFileError
from storage.limits import WIRE_NEGOTIATION_PACKETS_MAX

log = logging.getLogger(__name__)

TLS_HANDSHAKE_TIMEOUT_S = 30.0


def make_server_context(cert_path: str, key_path: str) -> ssl.SSLContext:
    """A server TLS context from PEM files; ConfigFileError (F0000) if they are unusable."""
    for path in (cert_path, key_path):
        if not os.path.isfile(path):
            raise ConfigFileError(f"TLS file {path} does not exist or is not a file")
    if os.stat(key_path).st_mode & stat.S_IRWXO:
        raise ConfigFileError(f"TLS key file {key_path} is accessible to everyone "
                              f"(chmod 600 it)")  # fmt: skip
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert_path, key_path)
    except (ssl.SSLError, OSError) as error:
        raise ConfigFileError(f"cannot load TLS certificate {cert_path} with key {key_path}: "
                              f"{error}") from None  # fmt: skip
    return context


def _buffered_bytes(reader: asyncio.StreamReader) -> int:
    # StreamReader has no public way to ask this; ``_buffer`` is CPython's bytearray.
    buffer = getattr(reader, "_buffer", b"")
    return len(buffer)


async def accept_tls(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     context: ssl.SSLContext) -> None:  # fmt: skip
    """Answer an SSLRequest with ``S`` and run the server side of the TLS handshake.

    ProtocolError if plaintext data followed the SSLRequest; ConnectionAbortedError
    (closed quietly by the caller) if the handshake fails or times out.
    """
    if _buffered_bytes(reader):
        raise m.ProtocolError("received unencrypted data after SSL request")
    writer.write(b"S")
    try:
        # No await between the check above and start_tls pausing the transport, so no
        # plaintext byte can slip into the reader's buffer.
        await writer.start_tls(context, ssl_handshake_timeout=TLS_HANDSHAKE_TIMEOUT_S)
    except (ssl.SSLError, OSError, TimeoutError) as error:
        log.info("TLS handshake with %s failed: %s", writer.get_extra_info("peername"), error)
        raise ConnectionAbortedError("TLS handshake failed") from error
    assert writer.get_extra_info("ssl_object") is not None, "the stream is encrypted"




async def negotiate(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    context: ssl.SSLContext | None) -> m.Startup:  # fmt: skip
    """Read startup packets, answering SSLRequest (``S`` and the handshake when ``context``
    is set, else ``N``) and GSSENCRequest (``N``), and return the first other packet
    (StartupMessage, CancelRequest or an unknown protocol version) for the caller."""
    encrypted = False
    for _ in range(WIRE_NEGOTIATION_PACKETS_MAX):
        length = m.startup_length(await reader.readexactly(4))
        startup = m.parse_startup(await reader.readexactly(length - 4))
        if startup.code == m.SSL_REQUEST and encrypted:
            raise m.ProtocolError("SSL request on an already encrypted connection")
        if startup.code == m.SSL_REQUEST and context is not None:
            await accept_tls(reader, writer, context)
            encrypted = True
        elif startup.code in (m.SSL_REQUEST, m.GSSENC_REQUEST):
            writer.write(b"N")
            await writer.drain()
        else:
            return startup
    raise m.ProtocolError("too many encryption requests before the startup packet")


# -- channel binding (RFC 5929 tls-server-end-point, for SCRAM-SHA-256-PLUS) -------------------
# DER-encoded signatureAlgorithm OIDs -> the hash of tls-server-end-point (RFC 5929 section
# 4.1: MD5 and SHA-1 are replaced by SHA-256). Others (RSASSA-PSS, Ed25519) have no
# single hash here: no channel binding is offered with such a certificate, as PostgreSQL.
_RSA = bytes.fromhex("2a864886f70d0101")  # 1.2.840.113549.1.1
_ECDSA = bytes.fromhex("2a8648ce3d04")  # 1.2.840.10045.4
_END_POINT_HASHES = {
    _RSA + b"\x04": "sha256", _RSA + b"\x05": "sha256", _RSA + b"\x0b": "sha256",
    _RSA + b"\x0c": "sha384", _RSA + b"\x0d": "sha512", _RSA + b"\x0e": "sha224",
    _ECDSA + b"\x01": "sha256", _ECDSA + b"\x03\x01": "sha224", _ECDSA + b"\x03\x02": "sha256",
    _ECDSA + b"\x03\x03": "sha384", _ECDSA + b"\x03\x04": "sha512",
}  # fmt: skip


def _der_element(data: bytes, at: int) -> tuple[int, int, int]:
    """(tag, start of contents, end of contents) of the DER element at ``at``; ValueError."""
    if at + 2 > len(data):
        raise ValueError("truncated DER")
    tag, length, start = data[at], data[at + 1], at + 2
    if length & 0x80:
        count = length & 0x7F
        if not 1 <= count <= 4 or start + count > len(data):
            raise ValueError("bad DER length")
        length, start = int.from_bytes(data[start : start + count], "big"), start + count
    if start + length > len(data):
        raise ValueError("truncated DER")
    return tag, start, start + length


def signature_hash_name(certificate_der: bytes) -> str | None:
    """The tls-server-end-point hash of a certificate, or None if it has no single one."""
    tag, start, _ = _der_element(certificate_der, 0)  # Certificate ::= SEQUENCE
    _, _, tbs_end = _der_element(certificate_der, start)  # tbsCertificate
    tag_algorithm, algorithm_start, _ = _der_element(certificate_der, tbs_end)
    tag_oid, oid_start, oid_end = _der_element(certificate_der, algorithm_start)
    if (tag, tag_algorithm, tag_oid) != (0x30, 0x30, 0x06):
        raise ValueError("not an X.509 certificate")
    return _END_POINT_HASHES.get(certificate_der[oid_start:oid_end])


def channel_binding_data(cert_path: str) -> bytes | None:
    """tls-server-end-point data of the (first) certificate in ``cert_path``: its hash,
    or None when channel binding cannot be offered with it."""
    with open(cert_path, encoding="ascii", errors="replace") as file:
        text = file.read()
    begin, end = text.find(ssl.PEM_HEADER), text.find(ssl.PEM_FOOTER)
    if begin < 0 or end < begin:
        return None
    try:
        der = ssl.PEM_cert_to_DER_cert(text[begin : end + len(ssl.PEM_FOOTER)])
        name = signature_hash_name(der)
    except ValueError:
        return None
    return None if name is None else hashlib.new(name, der).digest()
