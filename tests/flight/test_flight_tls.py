"""The Flight door over TLS when the server has a certificate: a client that trusts the
certificate reads; a plaintext client cannot talk to it."""

from __future__ import annotations

from pathlib import Path

import pytest

from spark_sql_ext.client import TopicbaseClient, TopicbaseFlightError
from sql.flight.server import start_flight
from tests.flight.conftest import PASSWORDS
from tests.tls_certificates import self_signed


@pytest.fixture
def certificate(tmp_path: Path) -> tuple[str, str]:
    return self_signed(tmp_path, alt_names="IP:127.0.0.1,DNS:localhost")


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
