"""TLS of ``topicbase serve`` (``sql.pgwire.tls``) with a self-signed certificate made here.

TLS is offered, not forced: ``sslmode=require`` gets TLS, ``sslmode=disable`` stays in
plaintext on the same server, and without a certificate ``require`` fails cleanly.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import os
import shutil
import socket
import ssl
import struct
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import asyncpg
import psycopg
import pytest

from sql.pgwire import users
from sql.pgwire.codec import messages as m
from sql.pgwire.server import ServerThread
from tests.tls_certificates import self_signed

PASSWORD = "tls and scram"
SSL_REQUEST = struct.pack("!ii", 8, m.SSL_REQUEST)
GSSENC_REQUEST = struct.pack("!ii", 8, m.GSSENC_REQUEST)


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    return self_signed(tmp_path_factory.mktemp("tls"), alt_names=None)


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator[Callable[..., ServerThread]]:
    users_file = str(tmp_path / "users.json")
    users.add_user(users_file, "alice", PASSWORD)
    started: list[ServerThread] = []

    def start(**options: object) -> ServerThread:
        running = ServerThread(str(tmp_path / "data"), "127.0.0.1", 0, auth="scram",
                               users_file=users_file, **options)  # type: ignore[arg-type]  # fmt: skip
        started.append(running)
        return running

    yield start
    for running in started:
        running.stop()


def connect(server: ServerThread, sslmode: str, host: str = "127.0.0.1",
            **options: object) -> psycopg.Connection:  # fmt: skip
    return psycopg.connect(host=host, port=server.port, user="alice", password=PASSWORD,
                           dbname="topicbase", sslmode=sslmode, connect_timeout=10,
                           **options)  # type: ignore[arg-type]  # fmt: skip


def test_sslmode_require_gets_tls(start_server, certificate) -> None:
    cert, key = certificate
    server = start_server(tls_cert=cert, tls_key=key)
    with connect(server, "require") as conn:
        assert conn.pgconn.ssl_in_use
        # The server's end of this very connection is TLS too.
        writer = server.server.connections[conn.info.backend_pid].writer
        assert writer.get_extra_info("ssl_object").version() in ("TLSv1.2", "TLSv1.3")
        assert conn.execute("SELECT 'over tls'").fetchone() == ("over tls",)


def test_sslmode_verify_full_accepts_the_certificate_as_its_root(start_server,
                                                                 certificate) -> None:  # fmt: skip
    cert, key = certificate
    server = start_server(tls_cert=cert, tls_key=key)
    with connect(server, "verify-full", host="localhost", sslrootcert=cert) as conn:
        assert conn.pgconn.ssl_in_use
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_sslmode_disable_against_a_tls_server_stays_plaintext(start_server, certificate) -> None:
    cert, key = certificate
    server = start_server(tls_cert=cert, tls_key=key)
    with connect(server, "disable") as conn:
        assert not conn.pgconn.ssl_in_use
        assert conn.execute("SELECT 1").fetchone() == (1,)
    with connect(server, "prefer") as conn:  # libpq's default asks, and gets it
        assert conn.pgconn.ssl_in_use


def test_sslmode_require_without_a_certificate_fails_cleanly(start_server) -> None:
    server = start_server()
    with pytest.raises(psycopg.OperationalError, match="server does not support SSL"):
        connect(server, "require")
    with connect(server, "prefer") as conn:  # the server carries on, in plaintext
        assert not conn.pgconn.ssl_in_use
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_asyncpg_logs_in_with_scram_over_tls(start_server, certificate) -> None:
    cert, key = certificate
    server = start_server(tls_cert=cert, tls_key=key)
    context = ssl.create_default_context(cafile=cert)
    context.check_hostname = False  # the certificate names localhost; we dial 127.0.0.1

    async def session() -> tuple[str, bool]:
        conn = await asyncpg.connect(host="127.0.0.1", port=server.port, user="alice",
                                     password=PASSWORD, database="topicbase",
                                     ssl=context)  # fmt: skip
        try:
            encrypted = conn._transport.get_extra_info("ssl_object") is not None
            return await conn.execute("SELECT 1"), encrypted
        finally:
            await conn.close()

    assert asyncio.run(session()) == ("SELECT 1", True)


def test_psql_over_tls_reports_an_ssl_connection(start_server, certificate) -> None:
    psql = shutil.which("psql")
    assert psql is not None, "psql is part of the test environment (PostgreSQL 15 client)"
    cert, key = certificate
    server = start_server(tls_cert=cert, tls_key=key)
    environment = {**os.environ, "PGPASSWORD": PASSWORD, "PGSSLMODE": "require",
                   "PGCONNECT_TIMEOUT": "10"}  # fmt: skip
    done = subprocess.run(
        [psql, "-X", "-h", "127.0.0.1", "-p", str(server.port), "-U", "alice", "-d",
         "topicbase", "-c", "\\conninfo"],
        env=environment, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "SSL connection (protocol: TLSv1." in done.stdout


# -- raw sockets: what a broken or hostile client gets ---------------------------------------------
def read_message(sock: socket.socket) -> tuple[bytes, bytes]:
    header = b""
    while len(header) < 5:
        chunk = sock.recv(5 - len(header))
        assert chunk, "connection closed"
        header += chunk
    length = struct.unpack("!i", header[1:5])[0] - 4
    body = b""
    while len(body) < length:
        chunk = sock.recv(length - len(body))
        assert chunk, "connection closed"
        body += chunk
    return header[:1], body


def test_plaintext_pipelined_after_ssl_request_is_refused(start_server, certificate) -> None:
    cert, key = certificate
    server = start_server(tls_cert=cert, tls_key=key)
    startup = struct.pack("!i", m.PROTOCOL_V3) + m.cstr("user") + m.cstr("alice") + b"\0"
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(SSL_REQUEST + struct.pack("!i", len(startup) + 4) + startup)
        kind, body = read_message(sock)  # not "S": an error, in plaintext
        assert kind == b"E" and b"C08P01\0" in body and b"unencrypted data" in body
    with connect(server, "require") as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_a_failed_handshake_does_not_stop_the_server(start_server, certificate) -> None:
    cert, key = certificate
    server = start_server(tls_cert=cert, tls_key=key)
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(SSL_REQUEST)
        assert sock.recv(1) == b"S"
        sock.sendall(b"this is not a TLS ClientHello" * 10)
        leftover = b""
        while chunk := sock.recv(4096):  # the server closes the connection
            leftover += chunk
        assert b"SELECT" not in leftover
    with connect(server, "require") as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_gss_encryption_is_refused_and_a_second_ssl_request_is_an_error(
    start_server, certificate
) -> None:
    cert, key = certificate
    server = start_server(tls_cert=cert, tls_key=key)
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as raw:
        raw.sendall(GSSENC_REQUEST)
        assert raw.recv(1) == b"N"
        raw.sendall(SSL_REQUEST)
        assert raw.recv(1) == b"S"
        context = ssl.create_default_context(cafile=cert)
        context.check_hostname = False
        with context.wrap_socket(raw) as tls:
            tls.sendall(SSL_REQUEST)
            kind, body = read_message(tls)
            assert kind == b"E" and b"C08P01\0" in body


def test_unusable_certificate_files_are_refused_at_start(tmp_path: Path, certificate) -> None:
    cert, key = certificate
    users_file = str(tmp_path / "users.json")
    users.add_user(users_file, "alice", PASSWORD)
    data_dir = str(tmp_path / "data")
    open_key = tmp_path / "open.key"
    open_key.write_bytes(Path(key).read_bytes())
    open_key.chmod(0o644)
    cases = [
        ({"tls_cert": cert}, "go together"),
        ({"tls_cert": str(tmp_path / "missing.crt"), "tls_key": key}, "does not exist"),
        ({"tls_cert": cert, "tls_key": str(open_key)}, "accessible to everyone"),
        ({"tls_cert": users_file, "tls_key": key}, "cannot load TLS certificate"),
    ]
    for options, message in cases:
        with pytest.raises(users.ConfigFileError, match=message):
            ServerThread(data_dir, auth="scram", users_file=users_file,
                         **options)  # type: ignore[arg-type]  # fmt: skip


# -- SCRAM-SHA-256-PLUS: channel binding to the server certificate ----------------------------
def test_libpq_channel_binding_require_works_over_tls(start_server, certificate) -> None:
    cert, key = certificate
    server = start_server(tls_cert=cert, tls_key=key)
    # libpq refuses to finish unless the server completed SCRAM-SHA-256-PLUS.
    with connect(server, "require", channel_binding="require") as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(host="127.0.0.1", port=server.port, user="alice", password="wrong",
                        dbname="topicbase", sslmode="require", channel_binding="require",
                        connect_timeout=10)  # fmt: skip


def test_binding_data_is_the_sha256_of_the_certificate(certificate) -> None:
    from sql.pgwire import tls

    cert, _ = certificate
    der = subprocess.run(["/usr/bin/openssl", "x509", "-in", cert, "-outform", "DER"],
                         check=True, capture_output=True, timeout=60).stdout  # fmt: skip
    assert tls.channel_binding_data(cert) == hashlib.sha256(der).digest()


def test_a_certificate_without_a_single_hash_offers_no_channel_binding(tmp_path: Path) -> None:
    from sql.pgwire import tls

    cert, key = str(tmp_path / "ed.crt"), str(tmp_path / "ed.key")
    subprocess.run(
        ["/usr/bin/openssl", "req", "-x509", "-newkey", "ed25519", "-nodes", "-days", "2",
         "-subj", "/CN=localhost", "-keyout", key, "-out", cert],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    assert tls.channel_binding_data(cert) is None
    users_file = str(tmp_path / "users.json")
    users.add_user(users_file, "alice", PASSWORD)
    server = ServerThread(str(tmp_path / "data"), auth="scram", users_file=users_file,
                          tls_cert=cert, tls_key=key)  # fmt: skip
    try:
        with tls_client(server, cert) as sock:
            assert tls_scram_mechanisms(sock) == b"SCRAM-SHA-256\0\0"
        with connect(server, "require") as conn:  # plain SCRAM over TLS
            assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        server.stop()


@contextlib.contextmanager
def tls_client(server: ServerThread, cert: str) -> Iterator[ssl.SSLSocket]:
    raw = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    raw.sendall(SSL_REQUEST)
    assert raw.recv(1) == b"S"
    context = ssl.create_default_context(cafile=cert)
    context.check_hostname = False
    with context.wrap_socket(raw) as sock:
        yield sock


def tls_scram_mechanisms(sock: ssl.SSLSocket) -> bytes:
    startup = struct.pack("!i", m.PROTOCOL_V3) + m.cstr("user") + m.cstr("alice") + b"\0"
    sock.sendall(struct.pack("!i", len(startup) + 4) + startup)
    kind, body = read_message(sock)
    assert kind == b"R" and struct.unpack("!i", body[:4])[0] == m.AUTH_SASL
    return body[4:]


def sasl_initial(mechanism: str, data: bytes) -> bytes:
    return m.message(b"p", m.cstr(mechanism) + struct.pack("!i", len(data)) + data)


def test_plus_is_offered_and_a_downgrade_is_refused(start_server, certificate) -> None:
    cert, key = certificate
    server = start_server(tls_cert=cert, tls_key=key)
    with tls_client(server, cert) as sock:
        assert tls_scram_mechanisms(sock) == b"SCRAM-SHA-256-PLUS\0SCRAM-SHA-256\0\0"
        # "y": the client could bind but believes the server cannot: someone stripped -PLUS.
        sock.sendall(sasl_initial("SCRAM-SHA-256", b"y,,n=,r=clientnonce"))
        kind, body = read_message(sock)
        assert kind == b"E" and b"C08P01\0" in body and b"negotiation error" in body


def test_plus_with_binding_data_of_another_certificate_is_refused(
    start_server, certificate
) -> None:
    cert, key = certificate
    server = start_server(tls_cert=cert, tls_key=key)
    with tls_client(server, cert) as sock:
        tls_scram_mechanisms(sock)
        header = b"p=tls-server-end-point,,"
        sock.sendall(sasl_initial("SCRAM-SHA-256-PLUS", header + b"n=,r=clientnonce"))
        kind, body = read_message(sock)
        assert kind == b"R" and struct.unpack("!i", body[:4])[0] == m.AUTH_SASL_CONTINUE
        nonce = dict(p.split("=", 1) for p in body[4:].decode().split(","))["r"]
        # What a man in the middle with its own certificate would forward.
        binding = base64.b64encode(header + hashlib.sha256(b"another cert").digest()).decode()
        proof = base64.b64encode(bytes(32)).decode()
        sock.sendall(m.message(b"p", f"c={binding},r={nonce},p={proof}".encode()))
        kind, body = read_message(sock)
        assert kind == b"E" and b"C08P01\0" in body and b"channel binding" in body
