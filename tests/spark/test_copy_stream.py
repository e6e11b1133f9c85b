"""The JVM reader's COPY stream read as a channel (``PgWireClient.CopyStream``): on a
plaintext connection each CopyData payload goes from the socket straight into the
caller's direct buffer (an Arrow buffer in ``WireBatchReader``) and each header is read
alone, so the buffered stream does not read ahead into a payload.

A fake server on loopback (startup answered with AuthenticationOk) sends CopyData of uneven
sizes, some empty, with a NoticeResponse between them, every message cut into pieces that
reach the socket separately (headers split too); ``tests/spark/java/.../CopyStreamCheck.java``
reads the COPY into direct and heap buffers of other uneven sizes, now and then through the
InputStream side, and writes what it got. Its bytes must be the payloads, in order, and
the connection must be at ReadyForQuery after the COPY (a following query answers)."""

from __future__ import annotations

import os
import random
import socket
import struct
import subprocess
import threading
import time
from pathlib import Path

import pyspark

from spark_sql_ext.build_jar import build

HERE = Path(__file__).resolve().parent
CHECK = HERE / "java" / "io" / "topicbase" / "spark" / "CopyStreamCheck.java"


def _message(kind: bytes, body: bytes) -> bytes:
    return kind + struct.pack("!I", len(body) + 4) + body


def _read_message(conn: socket.socket) -> tuple[bytes, bytes]:
    head = _read_exactly(conn, 5)
    return head[:1], _read_exactly(conn, struct.unpack("!I", head[1:])[0] - 4)


def _read_exactly(conn: socket.socket, count: int) -> bytes:
    data = b""
    while len(data) < count:
        piece = conn.recv(count - len(data))
        assert piece, "the client closed the connection"
        data += piece
    return data


def _send_in_pieces(conn: socket.socket, data: bytes, chance: random.Random) -> None:
    """``data`` in pieces of 1..9 or up to 80 KiB bytes, each its own segment."""
    at = 0
    while at < len(data):
        size = chance.choice([1, 2, 3, 4, 9, chance.randrange(1, 80_000)])
        conn.sendall(data[at:at + size])
        at += size
        time.sleep(0.0005)


def _serve(listener: socket.socket, payloads: list[bytes], failures: list[str],
           broken_length: int | None = None) -> None:  # fmt: skip
    """Answer one COPY with ``payloads``; with ``broken_length``, a CopyData header of that
    length after the first payload instead of the rest, then the connection closes."""
    try:
        conn, _ = listener.accept()
        with conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            length = struct.unpack("!I", _read_exactly(conn, 4))[0]
            _read_exactly(conn, length - 4)  # the startup packet
            conn.sendall(_message(b"R", struct.pack("!I", 0)) + _message(b"Z", b"I"))
            kind, _ = _read_message(conn)
            assert kind == b"Q"
            chance = random.Random(7)
            out = _message(b"H", b"\x01\x00\x01\x00\x01")
            for index, payload in enumerate(payloads):
                out += _message(b"d", payload)
                if broken_length is not None:
                    _send_in_pieces(conn, out + b"d" + struct.pack("!i", broken_length), chance)
                    conn.recv(16)  # the client gives up: its close
                    return
                if index == len(payloads) // 2:
                    out += _message(b"N", b"SNOTICE\x00Mhalf way\x00\x00")
            out += _message(b"c", b"") + _message(b"C", b"COPY 1\x00") + _message(b"Z", b"I")
            _send_in_pieces(conn, out, chance)
            kind, _ = _read_message(conn)
            assert kind == b"Q"
            conn.sendall(_message(b"T", b"\x00\x01?column?\x00" + b"\x00" * 18)
                         + _message(b"D", b"\x00\x01\x00\x00\x00\x012")
                         + _message(b"C", b"SELECT 1\x00") + _message(b"Z", b"I"))  # fmt: skip
            conn.recv(16)  # Terminate, or the close
    except Exception as error:  # reported by the test
        failures.append(repr(error))


def _run_check(tmp_path: Path, payloads: list[bytes], broken_length: int | None = None
               ) -> tuple[subprocess.CompletedProcess[str], list[str], Path]:  # fmt: skip
    """CopyStreamCheck against the fake server; its run, the server's failures, its bytes."""
    listener = socket.create_server(("127.0.0.1", 0))
    failures: list[str] = []
    server = threading.Thread(target=_serve, args=(listener, payloads, failures, broken_length),
                              daemon=True)  # fmt: skip
    server.start()
    jars = os.path.join(os.path.dirname(pyspark.__file__), "jars", "*")
    classpath = os.pathsep.join([jars, build()])
    classes = tmp_path / "classes"
    subprocess.run(["javac", "--release", "17", "-nowarn", "-cp", classpath, "-d",
                    str(classes), str(CHECK)], check=True, timeout=300)  # fmt: skip
    got = tmp_path / "got"
    done = subprocess.run(["java", "-ea", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-cp",
                           os.pathsep.join([classpath, str(classes)]),
                           "io.topicbase.spark.CopyStreamCheck",
                           f"127.0.0.1:{listener.getsockname()[1]}", str(got)],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    server.join(10)
    listener.close()
    return done, failures, got


def test_copy_data_read_as_a_channel_is_the_payloads_in_order(tmp_path: Path) -> None:
    chance = random.Random(3)
    sizes = [65536, 5, 0, 65536, 1, 65531, 200_000, 0, 3, 70_000, 65536, 12, 65536, 9999]
    payloads = [bytes(chance.getrandbits(8) for _ in range(min(size, 64))) * (size // 64)
                + bytes(chance.getrandbits(8) for _ in range(size % 64)) for size in sizes]
    done, failures, got = _run_check(tmp_path, payloads)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert not failures, failures
    expected = b"".join(payloads)
    assert done.stdout.split() == ["bytes", str(len(expected)), "ready", "1"]
    assert got.read_bytes() == expected


def test_a_copy_data_length_under_four_is_a_clear_protocol_error(tmp_path: Path) -> None:
    """A broken server's CopyData length below its own 4 bytes (review R2, round 20): the
    reader fails with 08P01 naming the length, not an index or argument exception."""
    for length in (2, -5):
        done, failures, _ = _run_check(tmp_path, [b"x" * 100], broken_length=length)
        assert not failures, failures
        assert done.returncode != 0
        assert f"bad message length {length} from server in a COPY" in done.stderr, (
            done.stderr[-2000:])
