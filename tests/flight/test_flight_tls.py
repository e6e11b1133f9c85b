"""The Flight door over TLS when the server has a certificate: a client that trusts the
certificate reads; a plaintext client cannot talk to it. With a client CA (mutual TLS) a
client without a certificate cannot send a request at all: the door holds nothing of a
stranger's message (without it, gRPC holds the whole message before Flight's login)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow as pa
import pytest

from spark_sql_ext.client import TopicbaseClient, TopicbaseFlightError
from spark_sql_ext.options import parse_options
from sql.flight.server import start_flight
from storage.errors import InvalidParameterValueError
from tests.flight.conftest import PASSWORDS
from tests.pgwire.test_copy_arrow_bounds import peak_mib, reset_peak
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


_STRANGER = textwrap.dedent("""
    import sys
    import pyarrow.flight as flight
    port, roots = sys.argv[1], open(sys.argv[2], "rb").read()
    raw = flight.FlightClient(f"grpc+tls://127.0.0.1:{port}", tls_root_certs=roots)
    try:
        list(raw.do_action(flight.Action("stage", bytes(int(sys.argv[3]) << 20))))
    except flight.FlightError as error:
        print(type(error).__name__)
""")


def _stranger_growth_mib(port: int, roots: str, body_mib: int) -> int:
    """Peak RSS growth of this process (the door's) while a client that never logs in
    sends one action of ``body_mib`` MiB from a child process."""
    before = reset_peak()
    subprocess.run([sys.executable, "-c", _STRANGER, str(port), roots, str(body_mib)],
                   check=True, capture_output=True, timeout=120)  # fmt: skip
    return peak_mib() - before


def test_a_door_asking_for_client_certificates_holds_nothing_for_a_stranger(
        database, tmp_path: Path) -> None:  # fmt: skip
    (tmp_path / "server").mkdir()
    (tmp_path / "client").mkdir()
    cert, key = self_signed(tmp_path / "server", alt_names="IP:127.0.0.1,DNS:localhost")
    client_cert, client_key = self_signed(tmp_path / "client", common_name="etl", alt_names=None)
    session = database.connect()
    session.execute("CREATE TOPIC t")
    session.close()
    open_door = start_flight(database, "127.0.0.1", 0, "scram", tls_cert=cert, tls_key=key)
    try:  # without client certificates, gRPC holds a stranger's whole message first
        assert _stranger_growth_mib(open_door.port, cert, 128) >= 128
    finally:
        open_door.stop()
    door = start_flight(database, "127.0.0.1", 0, "scram", tls_cert=cert, tls_key=key,
                        tls_client_ca=client_cert)  # fmt: skip
    try:
        url = f"topicbase+tls://127.0.0.1:{door.port}"
        assert _stranger_growth_mib(door.port, cert, 128) < 32
        with pytest.raises(TopicbaseFlightError):
            TopicbaseClient(url, "alice", PASSWORDS["alice"], tls_root_certs=cert)
        options = parse_options({
            "url": url, "user": "alice", "password": PASSWORDS["alice"], "topic": "t",
            "tlsRootCerts": cert, "tlsClientCert": client_cert, "tlsClientKey": client_key,
        })  # fmt: skip
        with options.connect() as client:  # as a Spark task connects
            batch = pa.record_batch({"data": pa.array([b"m"])})
            client.commit("s", 0, [client.put({"topic": "t"}, [batch], batch.schema)])
            assert client.read_all({"topic": "t", "columns": ["data"]}).num_rows == 1
    finally:
        door.stop()


def test_a_client_ca_needs_tls(database, tmp_path: Path) -> None:
    cert, _ = self_signed(tmp_path, common_name="etl", alt_names=None)
    with pytest.raises(InvalidParameterValueError):
        start_flight(database, "127.0.0.1", 0, "scram", tls_client_ca=cert)
