"""A raw-socket PostgreSQL frontend for the limit and fuzz tests (no client library).

It sends exactly the bytes a test gives it and reads backend messages one at a
time, so a test can send what no real client would.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Sequence

from sql.pgwire.codec import messages as m
from sql.pgwire.connection.lookup_flight import FLIGHT_TAIL

TIMEOUT_S = 20.0


def startup_packet(**parameters: str) -> bytes:
    body = struct.pack("!i", m.PROTOCOL_V3)
    for name, value in {"user": "tester", **parameters}.items():
        body += m.cstr(name) + m.cstr(value)
    body += b"\0"
    return struct.pack("!i", len(body) + 4) + body


def query(text: str) -> bytes:
    return m.message(b"Q", m.cstr(text))


def parse(name: str, text: str, oids: Sequence[int] = ()) -> bytes:
    """Parse of statement ``name``, with the parameter types ``oids``."""
    body = m.cstr(name) + m.cstr(text) + struct.pack("!H", len(oids))
    return m.message(b"P", body + b"".join(struct.pack("!I", oid) for oid in oids))


def bind(statement: str, values: Sequence[bytes | None] = (), formats: Sequence[int] = (),
         results: Sequence[int] = ()) -> bytes:  # fmt: skip
    """Bind of the unnamed portal: parameter ``formats``, ``values`` (None: NULL), result
    formats ``results``."""
    body = m.cstr("") + m.cstr(statement) + struct.pack("!H", len(formats))
    body += b"".join(struct.pack("!h", f) for f in formats) + struct.pack("!H", len(values))
    for value in values:
        body += struct.pack("!i", -1) if value is None else struct.pack("!i", len(value)) + value
    body += struct.pack("!H", len(results)) + b"".join(struct.pack("!h", f) for f in results)
    return m.message(b"B", body)


def flight(statement: str, values: Sequence[bytes | None] = (), formats: Sequence[int] = (),
           results: Sequence[int] = ()) -> bytes:  # fmt: skip
    """Bind (unnamed portal) / Describe / Execute / Sync, as psycopg sends a prepared one."""
    return bind(statement, values, formats, results) + FLIGHT_TAIL


def sync() -> bytes:
    return m.message(b"S", b"")


def cancel_request(port: int, process_id: int, secret_key: int) -> None:
    """Send a CancelRequest for the backend ``process_id``/``secret_key`` on a connection of
    its own; returns once the server handled it (it closes that connection then)."""
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_S) as sock:
        sock.sendall(struct.pack("!iiii", 16, m.CANCEL_REQUEST, process_id, secret_key))
        sock.recv(1)


def error_fields(body: bytes) -> dict[str, str]:
    """The fields of an ErrorResponse/NoticeResponse body by their one-letter codes."""
    out = {}
    for part in body.split(b"\0"):
        if part:
            out[chr(part[0])] = part[1:].decode("utf-8", "replace")
    return out


class RawClient:
    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_S)
        self.buffer = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def try_send(self, data: bytes) -> bool:
        """Send; False if the server has already closed the connection."""
        try:
            self.sock.sendall(data)
            return True
        except (BrokenPipeError, ConnectionResetError):
            return False

    def _fill(self, count: int) -> bool:
        while len(self.buffer) < count:
            try:
                chunk = self.sock.recv(65536)
            except ConnectionResetError:
                return False
            if not chunk:
                return False
            self.buffer += chunk
        return True

    def read_byte(self) -> bytes | None:
        if not self._fill(1):
            return None
        byte, self.buffer = self.buffer[:1], self.buffer[1:]
        return byte

    def read(self) -> tuple[bytes, bytes] | None:
        """One backend message (type, body), or None at the end of the stream."""
        if not self._fill(5):
            return None
        length = struct.unpack("!i", self.buffer[1:5])[0]
        assert length >= 4, f"backend sent a bad length {length}"
        if not self._fill(1 + length):
            return None
        kind, body = self.buffer[:1], self.buffer[5 : 1 + length]
        self.buffer = self.buffer[1 + length :]
        return kind, body

    def until_ready(self) -> list[tuple[bytes, bytes]]:
        got = []
        while True:
            item = self.read()
            assert item is not None, f"connection closed after {got}"
            got.append(item)
            if item[0] == b"Z":
                return got

    def start(self, **parameters: str) -> list[tuple[bytes, bytes]]:
        self.send(startup_packet(**parameters))
        return self.until_ready()

    def start_with_keys(self, **parameters: str) -> tuple[int, int]:
        """``start``; the BackendKeyData's process id and secret key (``cancel_request``)."""
        keys = [body for kind, body in self.start(**parameters) if kind == b"K"]
        process_id, secret_key = struct.unpack("!ii", keys[0])
        return process_id, secret_key

    def read_all(self) -> list[tuple[bytes, bytes]]:
        """Every message until the server closes the connection."""
        got = []
        while (item := self.read()) is not None:
            got.append(item)
        return got

    def closed(self) -> bool:
        """True if the server closes the connection before sending anything more."""
        return self.read() is None

    def close(self) -> None:
        self.sock.close()


class FlightClient(RawClient):
    """A raw client that logs in as a user whose password is ``<user>-pw`` (the flight
    tests' users files) and asks for replies up to ReadyForQuery."""

    def login(self, user: str) -> None:
        self.send(startup_packet(user=user, database="topicbase"))
        assert self.read() == (b"R", struct.pack("!i", 3))
        self.send(m.message(b"p", m.cstr(f"{user}-pw")))
        self.until_ready()

    def ask(self, data: bytes) -> list[tuple[bytes, bytes]]:
        self.send(data)
        return self.until_ready()

    def sql(self, text: str) -> None:
        replies = self.ask(m.message(b"Q", m.cstr(text)))
        assert not [body for kind, body in replies if kind == b"E"], replies


def errors(items: list[tuple[bytes, bytes]]) -> list[dict[str, str]]:
    return [error_fields(body) for kind, body in items if kind == b"E"]
