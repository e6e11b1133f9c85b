"""The Flight door over TLS when the server has a certificate: a client that trusts the
certificate reads; a plaintext client cannot talk to it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from spark_sql_ext.client import TopicbaseClient, TopicbaseFlightError
from sql.flight.server import start_flight
from tests.flight.conftest import PASSWORDS


@pytest.fixture
def certificate(tmp_path: Path) -> tuple[str, str]:
    cert, key = str(tmp_path / "server.crt"), str(tmp_path / "server.key")
    subprocess.run(
        ["/usr/bin/openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
         "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
         "-keyout", key, "-out", cert],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    os.chmod(key, 0o600)
    return cert, key


def test_tls_door(database, certificate) -> None:
    cert, key = certificate
    session = database.connect()
    session.execute("CREATE TOPIC t; INSERT INTO TOPIC t (data) VALUES ('secret')")
    session.close()
    door = start_flight(database, "127.0.0.1", 0, "scram", tls_cert=cert, tls_key=key)
    try:
        url = f"topicbase+tls://127.0.0.1:{door.port}"
        with TopicbaseClient(url, "alice", PASSWORDS["alice"], tls_root_certs=cert) as client:
            assert client.read_all({"topic": "t", "columns": ["data"]}).column(
                "data").to_pylist() == [b"secret"]
        with pytest.raises(TopicbaseFlightError):
            TopicbaseClient(f"topicbase://127.0.0.1:{door.port}", "alice", PASSWORDS["alice"])
    finally:
        door.stop()
