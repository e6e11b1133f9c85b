"""A raw-socket PostgreSQL frontend for the limit and fuzz tests (no client library).

It sends exactly the bytes a test gives it and reads backend messages one at a
time, so a test can send what no real client would.
"""

from __future__ import annotations

import socket
import struct

from sql.pgwire.codec import messages as m

TIMEOUT_S = 20.0


def startup_packet(**parameters: str) -> bytes:
    body = struct.pack("!i", m.PROTOCOL_V3)
    for name, value in {"user": "tester", **parameters}.items():
        body += m.cstr(name) + m.cstr(value)
    body += b"\0"
    return struct.pack("!i", len(body) + 4) + body


def query(text: str) -> bytes:
    return m.message(b"Q", m.cstr(text))


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


def errors(items: list[tuple[bytes, bytes]]) -> list[dict[str, str]]:
    return [error_fields(body) for kind, body in items if kind == b"E"]
