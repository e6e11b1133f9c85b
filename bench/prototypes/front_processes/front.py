"""A front process of the prototype (docs/durable_produce.md, round 28): the Postgres
protocol for the bench's produce client, in a process (and a GIL) of its own.

``python front.py STORE_SOCKET reuseport PORT`` listens on ``127.0.0.1:PORT`` with
``SO_REUSEPORT`` (N fronts on one port; the kernel spreads the connections by a hash of
their addresses); ``python front.py STORE_SOCKET passed FD`` takes connections handed
over the Unix socket ``FD`` (``socket.recv_fds``, SCM_RIGHTS) by ``acceptor.py``.

One thread, one ``selectors`` loop over its client connections and its connection to the
store. It speaks what psycopg sends for ``INSERT INTO TOPIC t (data) VALUES (%s)``
(trust startup; Parse, Bind, Describe, Execute, Sync, Close, Flush, Terminate) and
nothing else (a simple Query gets 0A000 and ReadyForQuery); any other statement is
refused with 0A000 (the real design would forward it to the store's full server). An
Execute of the INSERT puts its value in the front's next batch and holds the connection
(its later messages wait in its buffer). Invariants: at most one batch is at the store
at a time; a client's CommandComplete is sent only after the store acked the batch
holding its value (after the sync); the answers of one connection go out in the order of
its messages.
"""

from __future__ import annotations

import re
import selectors
import socket
import struct
import sys
from collections.abc import Callable

I32 = struct.Struct("!i")
I16 = struct.Struct("!h")
HEADER = struct.Struct("<II")
SIZE = struct.Struct("<I")
ACK = struct.Struct("<IIB")
INSERT = re.compile(
    rb"\s*insert\s+into\s+topic\s+t\s*\(\s*data\s*\)\s*values\s*\(\s*\$1\s*\)\s*;?\s*",
    re.IGNORECASE,
)
SSL_REQUEST, GSS_REQUEST, PROTOCOL_3 = 80877103, 80877104, 196608
BYTEA_OID = 17


def message(kind: bytes, body: bytes = b"") -> bytes:
    return kind + I32.pack(len(body) + 4) + body


def error_message(sqlstate: str, text: str) -> bytes:
    fields = b"SERROR\0VERROR\0C" + sqlstate.encode() + b"\0M" + text.encode() + b"\0\0"
    return message(b"E", fields)


STARTUP_REPLY = b"".join(
    [message(b"R", I32.pack(0))]
    + [message(b"S", k + b"\0" + v + b"\0") for k, v in (
        (b"server_version", b"15.0"), (b"server_encoding", b"UTF8"),
        (b"client_encoding", b"UTF8"), (b"DateStyle", b"ISO, MDY"),
        (b"integer_datetimes", b"on"), (b"standard_conforming_strings", b"on"),
        (b"TimeZone", b"UTC"), (b"is_superuser", b"on"),
    )]
    + [message(b"K", I32.pack(1) + I32.pack(1)), message(b"Z", b"I")]
)  # fmt: skip
PARSE_COMPLETE, BIND_COMPLETE = message(b"1"), message(b"2")
CLOSE_COMPLETE, NO_DATA = message(b"3"), message(b"n")
PARAMETERS_BYTEA = message(b"t", I16.pack(1) + I32.pack(17))
READY = message(b"Z", b"I")
INSERTED = message(b"C", b"INSERT 0 1\0")


class Client:
    """One client connection: its input buffer, its statements and portals, its answers."""

    __slots__ = ("failed", "held", "inbuf", "out", "portals", "sock", "started", "statements")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.inbuf = bytearray()
        self.out: list[bytes] = []
        self.started = False
        self.statements: dict[bytes, int] = {}  # name -> its parameter's type OID (0: none)
        self.portals: dict[bytes, bytes | None] = {}  # name -> the bound value
        self.held = False  # an Execute waits for its batch's ack
        self.failed = False  # an error: skip to Sync


def cstring(body: bytes, at: int) -> tuple[bytes, int]:
    end = body.index(0, at)
    return body[at:end], end + 1


def bytea_text(raw: bytes) -> bytes:
    """A bytea parameter in text format (hex, as psycopg sends it)."""
    if raw.startswith(b"\\x"):
        return bytes.fromhex(raw[2:].decode())
    raise ValueError("only hex bytea text")


class Front:
    """The loop: clients, the pending batch, the store connection."""

    def __init__(self, store_path: str) -> None:
        self.selector = selectors.DefaultSelector()
        self.store = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.store.connect(store_path)
        self.selector.register(self.store, selectors.EVENT_READ, self.on_store)
        self.store_buffer = bytearray()
        self.pending: list[tuple[Client, bytes]] = []  # the next batch
        self.in_flight: list[Client] | None = None
        self.batch_id = 0

    # -- connections -------------------------------------------------------------------
    def add_client(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        client = Client(sock)
        self.selector.register(sock, selectors.EVENT_READ, lambda: self.on_client(client))

    def close_client(self, client: Client) -> None:
        self.selector.unregister(client.sock)
        client.sock.close()
        client.inbuf.clear()

    def on_client(self, client: Client) -> None:
        try:
            data = client.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self.close_client(client)
            return
        client.inbuf += data
        self.work(client)

    def flush(self, client: Client) -> None:
        if client.out:
            data = b"".join(client.out)
            client.out.clear()
            try:
                sent = client.sock.send(data)
                if sent < len(data):  # a full socket buffer: rare for these small answers
                    client.sock.setblocking(True)
                    client.sock.sendall(data[sent:])
                    client.sock.setblocking(False)
            except BlockingIOError:
                client.sock.setblocking(True)
                client.sock.sendall(data)
                client.sock.setblocking(False)
            except OSError:
                self.close_client(client)

    # -- the protocol --------------------------------------------------------------------
    def work(self, client: Client) -> None:
        """Handle the client's whole messages until it is held or its buffer runs out."""
        buffer = client.inbuf
        while not client.held:
            if not client.started:
                if len(buffer) < 8:
                    break
                (length,) = I32.unpack_from(buffer, 0)
                if len(buffer) < length:
                    break
                (code,) = I32.unpack_from(buffer, 4)
                del buffer[:length]
                if code in (SSL_REQUEST, GSS_REQUEST):
                    client.out.append(b"N")
                elif code == PROTOCOL_3:
                    client.started = True
                    client.out.append(STARTUP_REPLY)
                else:
                    client.out.append(error_message("08P01", "unsupported startup"))
                    self.flush(client)
                    self.close_client(client)
                    return
                continue
            if len(buffer) < 5:
                break
            (length,) = I32.unpack_from(buffer, 1)
            if len(buffer) < length + 1:
                break
            kind, body = buffer[0:1], bytes(buffer[5 : length + 1])
            del buffer[: length + 1]
            if kind == b"X":
                self.flush(client)
                self.close_client(client)
                return
            if kind == b"S":
                client.failed = False
                client.out.append(READY)
                continue
            if kind == b"Q":  # simple query: not in the prototype; its own ReadyForQuery
                refusal = "the front prototype takes only the extended protocol's INSERT"
                client.out.append(error_message("0A000", refusal) + READY)
                continue
            if client.failed:
                continue
            try:
                self.handle(client, kind, body)
            except (ValueError, IndexError, struct.error) as error:
                client.out.append(error_message("08P01", f"bad message: {error}"))
                client.failed = True
        if not client.held:
            self.flush(client)

    def handle(self, client: Client, kind: bytes, body: bytes) -> None:
        if kind == b"P":
            name, at = cstring(body, 0)
            query, at = cstring(body, at)
            (types,) = I16.unpack_from(body, at)
            oid = I32.unpack_from(body, at + 2)[0] if types else 0
            if not INSERT.fullmatch(query):
                refusal = "the front prototype takes only INSERT INTO TOPIC t (data) VALUES ($1)"
                client.out.append(error_message("0A000", refusal))
                client.failed = True
                return
            client.statements[name] = oid
            client.out.append(PARSE_COMPLETE)
        elif kind == b"B":
            portal, at = cstring(body, 0)
            name, at = cstring(body, at)
            if name not in client.statements:
                client.out.append(error_message("26000", "prepared statement does not exist"))
                client.failed = True
                return
            (formats,) = I16.unpack_from(body, at)
            at += 2
            codes = [I16.unpack_from(body, at + 2 * i)[0] for i in range(formats)]
            at += 2 * formats
            (count,) = I16.unpack_from(body, at)
            at += 2
            if count != 1:
                refusal = f"bind message supplies {count} parameters, but the statement requires 1"
                client.out.append(error_message("08P01", refusal))
                client.failed = True
                return
            (size,) = I32.unpack_from(body, at)
            at += 4
            if size < 0:
                client.out.append(error_message("23502", 'null value in column "data"'))
                client.failed = True
                return
            raw = body[at : at + size]
            if codes and codes[0] == 1:
                value = raw  # binary: the bytes as sent (bytea; text's UTF-8)
            elif client.statements[name] == BYTEA_OID:
                value = bytea_text(raw)
            else:
                value = raw  # a text value: stored as its UTF-8, as the server stores text
            client.portals[portal] = value
            client.out.append(BIND_COMPLETE)
        elif kind == b"D":
            if body[0:1] == b"S":
                client.out.append(PARAMETERS_BYTEA)
            client.out.append(NO_DATA)
        elif kind == b"E":
            portal, _ = cstring(body, 0)
            value = client.portals.pop(portal, None)
            if value is None:
                client.out.append(error_message("34000", "portal does not exist"))
                client.failed = True
                return
            client.held = True
            self.pending.append((client, value))
            self.ship()
        elif kind == b"C":
            which, at = body[0:1], 1
            name, _ = cstring(body, at)
            (client.statements if which == b"S" else client.portals).pop(name, None)
            client.out.append(CLOSE_COMPLETE)
        elif kind == b"H":
            self.flush(client)
        else:
            client.out.append(error_message("0A000", f"message {kind!r} not in the prototype"))
            client.failed = True

    # -- the store -------------------------------------------------------------------------
    def ship(self) -> None:
        """Send the pending values as one batch, unless one is at the store already."""
        if self.in_flight is not None or not self.pending:
            return
        batch, self.pending = self.pending, []
        self.batch_id += 1
        parts = [SIZE.pack(len(batch))]
        for _, value in batch:
            parts.append(SIZE.pack(len(value)))
            parts.append(value)
        body = b"".join(parts)
        self.store.sendall(HEADER.pack(len(body), self.batch_id) + body)
        self.in_flight = [client for client, _ in batch]

    def on_store(self) -> None:
        data = self.store.recv(65536)
        if not data:
            raise SystemExit("the store went away")
        self.store_buffer += data
        buffer = self.store_buffer
        while len(buffer) >= ACK.size:
            batch_id, _, status = ACK.unpack_from(buffer, 0)
            if status == 0:
                answer, used = INSERTED, ACK.size
            else:
                if len(buffer) < ACK.size + 7:
                    return
                sqlstate = buffer[ACK.size : ACK.size + 5].decode()
                (size,) = struct.unpack_from("<H", buffer, ACK.size + 5)
                used = ACK.size + 7 + size
                if len(buffer) < used:
                    return
                text = buffer[ACK.size + 7 : used].decode()
                answer = error_message(sqlstate, text)
            del buffer[:used]
            assert batch_id == self.batch_id and self.in_flight is not None
            clients, self.in_flight = self.in_flight, None
            self.ship()  # the next batch goes while this one's answers are written
            for client in clients:
                client.held = False
                client.out.append(answer)
                if status != 0:
                    client.failed = True
                self.work(client)

    def run(self, extra: tuple[socket.socket, Callable[[], None]] | None) -> None:
        if extra is not None:
            self.selector.register(extra[0], selectors.EVENT_READ, extra[1])
        while True:
            for key, _ in self.selector.select():
                key.data()


def main(argv: list[str], announce: bool = True) -> int:
    store_path, mode, where = argv[0], argv[1], int(argv[2])
    front = Front(store_path)
    if mode == "reuseport":
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        listener.bind(("127.0.0.1", where))
        listener.listen(64)
        listener.setblocking(False)

        def accept() -> None:
            try:
                sock, _ = listener.accept()
            except BlockingIOError:
                return
            front.add_client(sock)

        if announce:
            print("ready", flush=True)
        front.run((listener, accept))
    else:
        handoff = socket.socket(fileno=where)

        def receive() -> None:
            _, fds, _, _ = socket.recv_fds(handoff, 16, 16)
            if not fds:
                raise SystemExit("the acceptor went away")
            for fd in fds:
                front.add_client(socket.socket(fileno=fd))

        if announce:
            print("ready", flush=True)
        front.run((handoff, receive))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
