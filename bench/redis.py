"""A throwaway Redis server for baselines, and a minimal RESP2 client (benchmarks only).

``find_redis_server()`` returns Debian's ``redis-server``, ``apt-get install``-ing
the ``redis-server`` package when it is missing (root only). ``Server`` is a
context manager: one ``redis-server`` on 127.0.0.1 on a free port, with its
own temp data dir, AOF on with the ``appendfsync`` policy asked for
(``always``: an fsync before replying to each batch of writes the event loop
handled; ``everysec``: one a second), no RDB snapshots, no unix socket,
protected mode on; stopped (SIGTERM, then SIGKILL by its pid) and its dir
deleted on exit.

Why a client here rather than redis-py: the benchmark needs five commands
(PING, XADD, XREADGROUP, XACK, XGROUP, and INFO for checks) and pipelining,
which RESP2 makes ~100 lines; written here it costs no install at bench time
and parses replies in pure Python as redis-py does without hiredis, so the
client's CPU is of the same kind as psycopg's on the other sides.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

from bench.postgres import free_port

START_TIMEOUT_S = 30
POLICIES = ("always", "everysec", "no")


def find_redis_server(log: Callable[[str], None] = print) -> str:
    """Path of ``redis-server``; installs Debian's package with apt-get when it is absent."""
    found = shutil.which("redis-server")
    if found:
        return found
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise RuntimeError("redis-server not found and cannot apt-get install it")
    log("redis-server not found: apt-get install -y redis-server (benchmark baseline only)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update"], check=True, env=env, capture_output=True)
    subprocess.run(
        ["apt-get", "install", "-y", "redis-server"], check=True, env=env, capture_output=True
    )
    found = shutil.which("redis-server")
    if not found:
        raise RuntimeError("apt-get install redis-server left no redis-server on PATH")
    return found


class RedisError(Exception):
    """An error reply (``-ERR ...``)."""


class Client:
    """RESP2 over one TCP connection: ``call`` one command, ``pipeline`` many in one flight."""

    def __init__(self, port: int, host: str = "127.0.0.1", timeout: float = 30.0) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._buffer = bytearray()

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @staticmethod
    def encode(args: Sequence[bytes | str | int]) -> bytes:
        """A command as a RESP array of bulk strings."""
        parts = [b"*%d\r\n" % len(args)]
        for arg in args:
            data = arg if isinstance(arg, bytes) else str(arg).encode()
            parts.append(b"$%d\r\n" % len(data))
            parts.append(data)
            parts.append(b"\r\n")
        return b"".join(parts)

    def call(self, *args: bytes | str | int) -> Any:
        self.sock.sendall(self.encode(args))
        return self._reply()

    def pipeline(self, commands: Sequence[Sequence[bytes | str | int]]) -> list[Any]:
        """Send every command, then read every reply (errors are returned, not raised)."""
        self.sock.sendall(b"".join(self.encode(c) for c in commands))
        replies = []
        for _ in commands:
            try:
                replies.append(self._reply())
            except RedisError as error:
                replies.append(error)
        return replies

    # -- reply parsing ----------------------------------------------------------------
    def _fill(self) -> None:
        chunk = self.sock.recv(1 << 20)
        if not chunk:
            raise ConnectionError("redis closed the connection")
        self._buffer += chunk

    def _line(self) -> bytes:
        while True:
            end = self._buffer.find(b"\r\n")
            if end >= 0:
                line = bytes(self._buffer[:end])
                del self._buffer[: end + 2]
                return line
            self._fill()

    def _exact(self, count: int) -> bytes:
        while len(self._buffer) < count + 2:
            self._fill()
        data = bytes(self._buffer[:count])
        del self._buffer[: count + 2]
        return data

    def _reply(self) -> Any:
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            raise RedisError(rest.decode())
        if kind == b":":
            return int(rest)
        if kind == b"$":
            size = int(rest)
            return None if size < 0 else self._exact(size)
        if kind == b"*":
            size = int(rest)
            return None if size < 0 else [self._reply() for _ in range(size)]
        raise ConnectionError(f"unexpected RESP reply {line[:40]!r}")


class Server:
    """``redis-server`` on 127.0.0.1 with AOF under ``appendfsync``; ``port`` once started."""

    def __init__(
        self,
        appendfsync: str = "always",
        *,
        parent: str | None = None,
        log: Callable[[str], None] = print,
    ) -> None:
        assert appendfsync in POLICIES, appendfsync
        self.appendfsync = appendfsync
        self.parent = parent
        self.log = log
        self.root = ""
        self.port = 0
        self.version = ""
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> Server:
        binary = find_redis_server(self.log)
        self.root = tempfile.mkdtemp(prefix="topicbase-redis-", dir=self.parent)
        self.port = free_port()
        self.process = subprocess.Popen(
            [binary, "--bind", "127.0.0.1", "--port", str(self.port), "--dir", self.root,
             "--appendonly", "yes", "--appendfsync", self.appendfsync, "--save", "",
             "--unixsocket", "", "--protected-mode", "yes", "--daemonize", "no",
             "--logfile", os.path.join(self.root, "redis.log")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                with Client(self.port, timeout=2) as client:
                    if client.call("PING") == "PONG":
                        info = client.call("INFO", "server").decode()
                        break
            except (OSError, RedisError):
                pass
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not start (log in {self.root})")
            time.sleep(0.05)
        for line in info.splitlines():
            if line.startswith("redis_version:"):
                self.version = "Redis " + line.split(":", 1)[1].strip()
        return self

    def client(self) -> Client:
        return Client(self.port)

    def stop(self) -> None:
        try:
            if self.process is not None and self.process.poll() is None:
                self.process.send_signal(signal.SIGTERM)
                try:
                    self.process.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    self.process.kill()
                    self.process.wait()
            self.process = None
        finally:
            if self.root:
                shutil.rmtree(self.root, ignore_errors=True)
                self.root = ""

    def __enter__(self) -> Server:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(Exception):
            self.stop()
