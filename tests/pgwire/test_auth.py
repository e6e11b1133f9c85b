"""Authentication of ``topicbase serve`` (``sql.pgwire.auth``, ``sql.pgwire.users``).

Real servers on loopback, driven by psycopg 3, asyncpg, psql and raw sockets; the users
file written by ``sql.pgwire.users`` or by the ``topicbase user add`` console script.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import shutil
import socket
import stat
import struct
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import asyncpg
import psycopg
import pytest

from sql.pgwire import auth, users, verifiers
from sql.pgwire.codec import messages as m
from sql.pgwire.server import ServerThread

TOPICBASE = str(Path(sys.executable).with_name("topicbase"))
ALICE_PASSWORD = "correct horse"  # alice has a SCRAM verifier and an md5 hash
BOB_PASSWORD = "bob's pässword"  # bob has a SCRAM verifier only (non-ASCII on purpose)


@pytest.fixture
def users_file(tmp_path: Path) -> str:
    path = str(tmp_path / "users.json")
    users.add_user(path, "alice", ALICE_PASSWORD, with_md5=True)
    # bob creates tables in some tests: a superuser (ordinary users need GRANTs).
    users.add_user(path, "bob", BOB_PASSWORD, superuser=True)
    return path


@pytest.fixture
def start_server(tmp_path: Path, users_file: str) -> Iterator[Callable[..., ServerThread]]:
    started: list[ServerThread] = []

    def start(auth_method: str, **options: object) -> ServerThread:
        options.setdefault("users_file", users_file)
        running = ServerThread(str(tmp_path / "data"), "127.0.0.1", 0, auth=auth_method,
                               **options)  # type: ignore[arg-type]  # fmt: skip
        started.append(running)
        return running

    yield start
    for running in started:
        running.stop()


def connect(server: ServerThread, user: str, password: str | None = None,
            **options: object) -> psycopg.Connection:  # fmt: skip
    extra = {} if password is None else {"password": password}
    return psycopg.connect(host="127.0.0.1", port=server.port, user=user, dbname="topicbase",
                           connect_timeout=10, **extra, **options)  # type: ignore[arg-type]  # fmt: skip


def assert_login_refused(server: ServerThread, user: str, password: str) -> None:
    with pytest.raises(psycopg.OperationalError,
                       match=f'password authentication failed for user "{user}"'):  # fmt: skip
        connect(server, user, password)


# -- a raw client, to see the exchange itself ------------------------------------------------
class RawClient:
    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.buffer = b""

    def startup(self, **parameters: str) -> None:
        body = struct.pack("!i", m.PROTOCOL_V3)
        for name, value in parameters.items():
            body += m.cstr(name) + m.cstr(value)
        body += b"\0"
        self.sock.sendall(struct.pack("!i", len(body) + 4) + body)

    def send(self, kind: bytes, body: bytes) -> None:
        self.sock.sendall(m.message(kind, body))

    def read(self) -> tuple[bytes, bytes] | None:
        """One backend message (type, body), or None at end of stream."""
        while len(self.buffer) < 5 or len(self.buffer) < 1 + self._length():
            chunk = self.sock.recv(65536)
            if not chunk:
                return None
            self.buffer += chunk
        length = struct.unpack("!i", self.buffer[1:5])[0]
        kind, body = self.buffer[:1], self.buffer[5 : 1 + length]
        self.buffer = self.buffer[1 + length :]
        return kind, body

    def _length(self) -> int:
        return int(struct.unpack("!i", self.buffer[1:5])[0])

    def read_auth_request(self) -> tuple[int, bytes]:
        message = self.read()
        assert message is not None and message[0] == b"R", message
        return struct.unpack("!i", message[1][:4])[0], message[1][4:]

    def close(self) -> None:
        self.sock.close()


def error_fields(body: bytes) -> dict[str, str]:
    fields = {}
    for part in body.rstrip(b"\0").split(b"\0"):
        fields[part[:1].decode()] = part[1:].decode()
    return fields


def scram_first_round(client: RawClient, user: str) -> dict[str, str]:
    """Start SCRAM as ``user`` and return the server-first-message's attributes."""
    client.startup(user=user, database="topicbase")
    code, mechanisms = client.read_auth_request()
    assert (code, mechanisms) == (m.AUTH_SASL, b"SCRAM-SHA-256\0\0")
    first = b"n,,n=,r=rawclientnonce"
    client.send(b"p", m.cstr("SCRAM-SHA-256") + struct.pack("!i", len(first)) + first)
    code, server_first = client.read_auth_request()
    assert code == m.AUTH_SASL_CONTINUE
    return dict(part.split("=", 1) for part in server_first.decode().split(","))


# -- SCRAM ---------------------------------------------------------------------------------------
def test_scram_login_with_the_right_password_runs_statements(start_server) -> None:
    server = start_server("scram")
    with connect(server, "alice", ALICE_PASSWORD, autocommit=True) as conn:
        assert conn.execute("SELECT 1 + 1").fetchone() == (2,)
        assert conn.info.parameter_status("session_authorization") == "alice"
    with connect(server, "bob", BOB_PASSWORD) as conn:  # non-ASCII password, SASLprep'd
        assert conn.execute("SELECT 'ok'").fetchone() == ("ok",)


def test_scram_wrong_password_gets_28P01_and_is_logged(start_server, caplog) -> None:
    server = start_server("scram")
    caplog.set_level(logging.WARNING, logger="sql.pgwire.auth")
    assert_login_refused(server, "alice", "wrong horse")

    async def asyncpg_login() -> None:
        await asyncpg.connect(host="127.0.0.1", port=server.port, user="alice",
                              password="wrong horse", database="topicbase")  # fmt: skip

    with pytest.raises(asyncpg.InvalidPasswordError) as caught:
        asyncio.run(asyncpg_login())
    assert caught.value.sqlstate == "28P01"
    failures = [r.getMessage() for r in caplog.records if "authentication failed" in r.getMessage()]
    assert len(failures) == 2 and all('user "alice"' in f and "wrong password" in f
                                      for f in failures)  # fmt: skip


def test_scram_unknown_user_runs_the_whole_exchange_then_fails(start_server, caplog) -> None:
    server = start_server("scram")
    caplog.set_level(logging.WARNING, logger="sql.pgwire.auth")
    assert_login_refused(server, "mallory", "anything")
    salts = []
    for user in ("mallory", "mallory", "eve"):
        client = RawClient(server.port)
        try:
            attributes = scram_first_round(client, user)
            assert attributes["i"] == "4096" and attributes["r"].startswith("rawclientnonce")
            salts.append(attributes["s"])
            proof = base64.b64encode(bytes(32)).decode()
            final = f"c=biws,r={attributes['r']},p={proof}".encode()
            client.send(b"p", final)
            kind, body = client.read() or (b"", b"")
            assert kind == b"E"
            fields = error_fields(body)
            assert (fields["S"], fields["C"]) == ("FATAL", "28P01")
            assert fields["M"] == f'password authentication failed for user "{user}"'
            assert client.read() is None  # and the connection is closed
        finally:
            client.close()
    # A stable salt per unknown name (as a real user's would be), different between names.
    assert salts[0] == salts[1] != salts[2]
    assert any("no such user" in r.getMessage() for r in caplog.records)


def test_scram_wrong_proof_from_a_raw_client_for_a_real_user_gets_28P01(start_server) -> None:
    server = start_server("scram")
    client = RawClient(server.port)
    try:
        attributes = scram_first_round(client, "alice")
        users_path = server.server.authenticator.users.path  # type: ignore[union-attr]
        verifier = verifiers.ScramVerifier.parse(users.read_users(users_path)["alice"].scram)
        assert base64.b64decode(attributes["s"]) == verifier.salt
        client.send(b"p", f"c=biws,r={attributes['r']},p={base64.b64encode(bytes(32)).decode()}"
                    .encode())  # fmt: skip
        kind, body = client.read() or (b"", b"")
        assert kind == b"E" and error_fields(body)["C"] == "28P01"
    finally:
        client.close()


def test_malformed_sasl_messages_get_08P01_and_the_server_carries_on(start_server) -> None:
    server = start_server("scram")
    bad_initial = [
        m.cstr("SCRAM-SHA-1") + struct.pack("!i", 3) + b"n,,",  # a mechanism not offered
        m.cstr("SCRAM-SHA-256") + struct.pack("!i", 99) + b"n,,n=,r=x",  # length overrun
        m.cstr("SCRAM-SHA-256") + struct.pack("!i", 9) + b"p=x,,n=,r",  # channel binding
        m.cstr("SCRAM-SHA-256") + struct.pack("!i", 8) + b"n,a=z,n=",  # authzid, no nonce
    ]
    for body in bad_initial:
        client = RawClient(server.port)
        try:
            client.startup(user="alice")
            assert client.read_auth_request()[0] == m.AUTH_SASL
            client.send(b"p", body)
            kind, error = client.read() or (b"", b"")
            assert kind == b"E" and error_fields(error)["C"] == "08P01", body
        finally:
            client.close()
    client = RawClient(server.port)
    try:  # a Query instead of the password message
        client.startup(user="alice")
        assert client.read_auth_request()[0] == m.AUTH_SASL
        client.send(b"Q", m.cstr("SELECT 1"))
        kind, error = client.read() or (b"", b"")
        assert kind == b"E" and error_fields(error)["C"] == "08P01"
    finally:
        client.close()
    with connect(server, "alice", ALICE_PASSWORD) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_startup_without_a_user_name_is_refused_with_28000(start_server) -> None:
    server = start_server("scram")
    client = RawClient(server.port)
    try:
        client.startup(database="topicbase")
        kind, body = client.read() or (b"", b"")
        assert kind == b"E"
        assert error_fields(body)["C"] == "28000"
    finally:
        client.close()


def test_asyncpg_logs_in_with_scram(start_server) -> None:
    server = start_server("scram")

    async def session() -> tuple[str, str]:
        conn = await asyncpg.connect(host="127.0.0.1", port=server.port, user="bob",
                                     password=BOB_PASSWORD, database="topicbase")  # fmt: skip
        try:
            return await conn.execute("SELECT 1"), conn.get_settings().session_authorization
        finally:
            await conn.close()

    assert asyncio.run(session()) == ("SELECT 1", "bob")


def test_psql_logs_in_with_scram_and_pgpassword(start_server) -> None:
    psql = shutil.which("psql")
    assert psql is not None, "psql is part of the test environment (PostgreSQL 15 client)"
    server = start_server("scram")
    command = [psql, "-X", "-h", "127.0.0.1", "-p", str(server.port), "-U", "alice",
               "-d", "topicbase", "-At", "-c", "SELECT 40 + 2"]  # fmt: skip
    environment = {**os.environ, "PGPASSWORD": ALICE_PASSWORD, "PGCONNECT_TIMEOUT": "10"}
    done = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout.strip()) == (0, "42"), done.stderr
    environment["PGPASSWORD"] = "wrong"
    done = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert 'password authentication failed for user "alice"' in done.stderr


# -- md5, cleartext, trust -----------------------------------------------------------------------
def test_md5_mode_uses_the_md5_hash(start_server) -> None:
    server = start_server("md5")
    with connect(server, "alice", ALICE_PASSWORD) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
    assert_login_refused(server, "alice", "wrong horse")
    assert_login_refused(server, "nobody", ALICE_PASSWORD)
    client = RawClient(server.port)
    try:
        client.startup(user="alice")
        code, salt = client.read_auth_request()
        assert code == m.AUTH_MD5 and len(salt) == 4
    finally:
        client.close()


def test_md5_mode_asks_a_user_without_md5_hash_for_scram(start_server) -> None:
    server = start_server("md5")
    client = RawClient(server.port)
    try:
        client.startup(user="bob")
        assert client.read_auth_request()[0] == m.AUTH_SASL
    finally:
        client.close()
    with connect(server, "bob", BOB_PASSWORD) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
    assert_login_refused(server, "bob", "nope")


def test_password_mode_checks_cleartext_against_the_scram_verifier(start_server) -> None:
    server = start_server("password")
    client = RawClient(server.port)
    try:
        client.startup(user="alice")
        assert client.read_auth_request() == (m.AUTH_CLEARTEXT, b"")
    finally:
        client.close()
    for user, password in (("alice", ALICE_PASSWORD), ("bob", BOB_PASSWORD)):
        with connect(server, user, password) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
    assert_login_refused(server, "alice", ALICE_PASSWORD.upper())
    assert_login_refused(server, "nobody", ALICE_PASSWORD)


def test_trust_mode_needs_no_password(start_server) -> None:
    server = start_server("trust")
    with connect(server, "anyone") as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_an_unknown_method_or_an_empty_users_file_is_refused(tmp_path: Path) -> None:
    from storage.errors import TopicbaseError

    with pytest.raises(TopicbaseError, match='"kerberos" is not supported'):
        ServerThread(str(tmp_path / "data"), auth="kerberos")
    with pytest.raises(users.ConfigFileError, match="topicbase user add"):
        ServerThread(str(tmp_path / "data"), auth="scram", users_file=str(tmp_path / "none"))
    (tmp_path / "broken.json").write_text('{"format": "something else"}')
    with pytest.raises(users.ConfigFileError) as caught:
        ServerThread(str(tmp_path / "data"), auth="md5", users_file=str(tmp_path / "broken.json"))
    assert caught.value.sqlstate == "F0000"
    # The data directory was released each time: a server can still open it.
    ServerThread(str(tmp_path / "data")).stop()


# -- failed logins do not hurt anyone else -------------------------------------------------------
def test_password_guess_loop_does_not_stop_the_server(start_server, caplog) -> None:
    server = start_server("scram")
    caplog.set_level(logging.WARNING, logger="sql.pgwire.auth")
    with connect(server, "bob", BOB_PASSWORD, autocommit=True) as bystander:
        bystander.execute("CREATE TABLE guesses (n BIGINT)")
        bystander.execute("GRANT SELECT ON guesses TO alice")
        refused: list[str] = []

        def guess(thread_number: int) -> None:
            # 6 failures of one user and address: 3 answered after the base delay, then
            # delays that double (1, 2, 4 s; 9 failures waited ~9.6 s in all)
            for attempt in range(2):
                try:
                    connect(server, "alice", f"guess-{thread_number}-{attempt}").close()
                except psycopg.OperationalError as error:
                    refused.append(str(error))

        guessers = [threading.Thread(target=guess, args=(n,)) for n in range(3)]
        for thread in guessers:
            thread.start()
        for n in range(20):  # the other session carries on while the guesses are delayed
            bystander.execute("INSERT INTO guesses VALUES (%s)", [n])
        for thread in guessers:
            thread.join(timeout=60)
        assert len(refused) == 6
        assert all('password authentication failed for user "alice"' in e for e in refused)
        assert bystander.execute("SELECT count(*) FROM guesses").fetchone() == (20,)
    failures = [r for r in caplog.records if "authentication failed" in r.getMessage()]
    assert len(failures) == 6
    with connect(server, "alice", ALICE_PASSWORD) as conn:
        assert conn.execute("SELECT count(*) FROM guesses").fetchone() == (20,)


# -- the users file and `topicbase user add` ----------------------------------------------------
def run_user_add(*arguments: str, password: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([TOPICBASE, "user", "add", *arguments, "--password-stdin"],
                          input=password + "\n", capture_output=True, text=True,
                          timeout=60)  # fmt: skip


def test_user_add_console_script_writes_verifiers_then_login_works(tmp_path: Path) -> None:
    path = tmp_path / "conf" / "users.json"
    done = run_user_add("carol", "--users-file", str(path), password="Tr0ub4dor&3")
    assert done.returncode == 0, done.stderr
    assert "added user carol" in done.stdout
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    text = path.read_text()
    assert "Tr0ub4dor" not in text and "md5" not in text
    entry = json.loads(text)["users"]["carol"]
    verifier = verifiers.ScramVerifier.parse(entry["scram"])
    assert verifier.iterations == 4096 and len(verifier.salt) == 16
    assert [name for name in os.listdir(path.parent) if ".tmp" in name] == []

    running = ServerThread(str(tmp_path / "data"), auth="scram", users_file=str(path))
    try:
        with connect(running, "carol", "Tr0ub4dor&3") as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
        # A new password while the server runs: it re-reads the file.
        done = run_user_add("carol", "--users-file", str(path), password="new one")
        assert done.returncode == 0 and "updated user carol" in done.stdout
        assert_login_refused(running, "carol", "Tr0ub4dor&3")
        with connect(running, "carol", "new one") as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        running.stop()


def test_user_add_defaults_to_the_data_directory_and_md5_only_on_request(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    done = run_user_add("dave", "--data-dir", str(data_dir), "--md5", password="pw")
    assert done.returncode == 0, done.stderr
    entry = json.loads((data_dir / "users.json").read_text())["users"]["dave"]
    assert entry["md5"] == verifiers.make_md5_verifier("dave", "pw")
    assert verifiers.ScramVerifier.parse(entry["scram"]).matches_password("pw")


def test_user_add_refuses_bad_input_and_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "users.json"
    done = run_user_add("erin", "--users-file", str(path), password="")
    assert done.returncode == 1 and "22023" in done.stderr and "empty password" in done.stderr
    done = run_user_add("bad\tname", "--users-file", str(path), password="pw")
    assert done.returncode == 1 and "42602" in done.stderr
    assert not path.exists()


def test_malformed_users_file_while_running_keeps_the_last_good_one(
    start_server, users_file: str
) -> None:
    server = start_server("scram")
    Path(users_file).write_text("{ not json")
    with connect(server, "alice", ALICE_PASSWORD) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
    assert_login_refused(server, "alice", "wrong")


# -- the default: `topicbase serve` asks for SCRAM ----------------------------------------------
def test_serve_defaults_to_scram_and_refuses_to_start_without_users(tmp_path: Path) -> None:
    data_dir = str(tmp_path / "data")
    done = subprocess.run([TOPICBASE, "serve", "--data-dir", data_dir, "--port", "0",
                           "--flight-port", "0"],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 1
    assert "F0000" in done.stderr and "topicbase user add" in done.stderr
    assert run_user_add("frank", "--data-dir", data_dir, password="pw").returncode == 0
    command = [TOPICBASE, "serve", "--data-dir", data_dir, "--port", "0", "--flight-port", "0"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert "serving" in line, process.stderr.read() if process.stderr else line
        port = int(line.rsplit(":", 1)[1])
        with pytest.raises(psycopg.OperationalError, match="password"):
            psycopg.connect(host="127.0.0.1", port=port, user="frank", dbname="x",
                            connect_timeout=10)  # fmt: skip
        with psycopg.connect(host="127.0.0.1", port=port, user="frank", password="pw",
                             dbname="x", connect_timeout=10) as conn:  # fmt: skip
            assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        process.terminate()
        process.wait(timeout=30)


# -- verifiers and SCRAM against the RFCs -------------------------------------------------------
def test_scram_exchange_matches_the_rfc_7677_example() -> None:
    # RFC 7677 section 3: user "user", password "pencil".
    salt = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
    verifier = verifiers.make_scram_verifier("pencil", salt=salt, iterations=4096)
    exchange = auth.ScramExchange(verifier, server_nonce="%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0")
    server_first = exchange.first(b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO")
    assert server_first == (b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                            b"s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096")  # fmt: skip
    client_final = (b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                    b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")  # fmt: skip
    assert exchange.final(client_final) == b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="
    wrong = auth.ScramExchange(verifiers.make_scram_verifier("pencil2", salt=salt),
                               server_nonce="%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0")  # fmt: skip
    wrong.first(b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO")
    assert wrong.final(client_final) is None


def test_verifier_text_round_trips_and_malformed_ones_are_refused() -> None:
    verifier = verifiers.make_scram_verifier("secret")
    assert verifiers.ScramVerifier.parse(verifier.to_text()) == verifier
    assert verifier.matches_password("secret") and not verifier.matches_password("Secret")
    for text in ("", "md5abc", "SCRAM-SHA-1$4096:c2FsdA==$AAAA:AAAA",
                 "SCRAM-SHA-256$0:c2FsdA==$" + verifier.to_text().split("$")[2],
                 "SCRAM-SHA-256$4096:c2FsdA==$AAAA:AAAA",
                 "SCRAM-SHA-256$4096:!!$" + verifier.to_text().split("$")[2]):  # fmt: skip
        with pytest.raises(ValueError):
            verifiers.ScramVerifier.parse(text)


def test_saslprep_follows_rfc_4013_examples() -> None:
    assert verifiers.saslprep("I\u00adX") == "IX"  # soft hyphen mapped to nothing
    assert verifiers.saslprep("user") == "user"
    assert verifiers.saslprep("\u00aa") == "a"  # NFKC
    assert verifiers.saslprep("\u2168") == "IX"
    assert verifiers.saslprep("\u0007") is None  # prohibited: control character
    assert verifiers.saslprep("\u0627\u0031") is None  # bidi: RandALCat must end the string
    # A password SASLprep refuses is used raw (as libpq does): still a working verifier.
    assert verifiers.make_scram_verifier("\u0007bell").matches_password("\u0007bell")


def test_user_add_prompts_twice_and_refuses_a_mismatch(tmp_path: Path) -> None:
    import pexpect

    path = str(tmp_path / "users.json")
    for second, expected_status in (("typo", 1), ("s3cret!", 0)):
        child = pexpect.spawn(TOPICBASE, ["user", "add", "gina", "--users-file", path],
                              encoding="utf-8", timeout=60)  # fmt: skip
        child.expect("Password for gina: ")
        child.sendline("s3cret!")
        child.expect("Enter it again: ")
        child.sendline(second)
        child.expect(pexpect.EOF)
        child.close()
        assert child.exitstatus == expected_status, child.before
        if expected_status:
            assert "passwords do not match" in (child.before or "")
            assert not os.path.exists(path)
    entry = users.read_users(path)["gina"]
    assert verifiers.ScramVerifier.parse(entry.scram).matches_password("s3cret!")
    assert "s3cret" not in Path(path).read_text()


def test_a_client_silent_during_authentication_is_disconnected(start_server, monkeypatch) -> None:
    monkeypatch.setattr(auth, "AUTHENTICATION_TIMEOUT_S", 0.5)
    server = start_server("scram")
    client = RawClient(server.port)
    try:
        client.startup(user="alice")
        assert client.read_auth_request()[0] == m.AUTH_SASL
        assert client.read() is None  # never answered: the server hangs up
    finally:
        client.close()
    with connect(server, "alice", ALICE_PASSWORD) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
