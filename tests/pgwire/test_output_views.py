"""``GatheringWriter.send_views`` (``sql.pgwire.connection.output``): many buffers sent in
order with one ``writev`` per group straight from the buffers; what the socket does not
take goes through the transport, still in order; TLS goes through the transport alone.

A socket pair with small buffers and a peer that reads slowly makes the kernel take part
of most groups, so the remainder path runs many times."""

from __future__ import annotations

import asyncio
import os
import random
import socket
import threading
import time
from typing import Any

import pytest

from sql.pgwire.connection import output
from sql.pgwire.connection.output import GatheringWriter


def _views(seed: int, total: int) -> list[bytes | memoryview]:
    """Buffers of uneven sizes (headers of 5 bytes, slices of one big buffer, empty ones)."""
    chance = random.Random(seed)
    big = chance.randbytes(total)
    views: list[bytes | memoryview] = []
    at = 0
    while at < total:
        size = chance.choice([0, 1, 5, 4096, 65536, chance.randrange(1, 300_000)])
        views.append(b"d" + chance.randbytes(4))
        views.append(memoryview(big)[at:at + size])
        at += size
    return views


def _drain_slowly(peer: socket.socket, got: bytearray, total: int) -> None:
    while len(got) < total:
        piece = peer.recv(7000)
        if not piece:
            return
        got += piece
        if len(got) % 5 == 0:
            time.sleep(0.0005)


class _TlsLike:
    """A writer that reports a TLS object: ``send_views`` must not write its socket."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self._writer = writer

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return object() if name == "ssl_object" else self._writer.get_extra_info(name, default)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._writer, name)


def _run(monkeypatch: pytest.MonkeyPatch, tls: bool) -> tuple[bytes, bytes, list[tuple]]:
    calls: list[tuple[int, int]] = []  # (bytes asked, bytes sent) of each writev
    real = os.writev

    def counting(fd: int, buffers: Any) -> int:
        asked = sum(len(b) for b in buffers)
        try:
            sent = real(fd, buffers)
        except BlockingIOError:
            calls.append((asked, 0))
            raise
        calls.append((asked, sent))
        return sent

    monkeypatch.setattr(output.os, "writev", counting)
    ours, peer = socket.socketpair()
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8192)
    peer.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8192)
    views = _views(11, 3_000_000)
    expected = b"first" + b"".join(bytes(v) for v in views) + b"last"
    got = bytearray()
    reader_thread = threading.Thread(target=_drain_slowly, args=(peer, got, len(expected)))
    reader_thread.start()

    async def send() -> None:
        _, writer = await asyncio.open_connection(sock=ours)
        gathering = GatheringWriter(_TlsLike(writer) if tls else writer)  # type: ignore[arg-type]
        gathering.write(b"first")  # kept: must go before the views
        await gathering.send_views(views)
        gathering.write(b"last")
        await gathering.drain()  # returns at the transport's low mark: close sends the rest
        writer.close()
        await writer.wait_closed()

    asyncio.run(send())
    reader_thread.join(30)
    peer.close()
    return bytes(got), expected, calls


def test_views_arrive_in_order_when_the_socket_takes_part_of_each_group(
        monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    got, expected, calls = _run(monkeypatch, tls=False)
    assert got == expected
    assert calls, "the views went out without writev"
    assert any(0 < sent < asked for asked, sent in calls), "no partial writev: remainder untested"
    assert all(asked <= output.WRITEV_BYTES + 300_000 for asked, _ in calls)


def test_a_tls_writer_sends_views_through_its_transport_only(
        monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    got, expected, calls = _run(monkeypatch, tls=True)
    assert got == expected
    assert calls == []


def test_kept_messages_go_in_the_first_writev(monkeypatch: pytest.MonkeyPatch) -> None:
    """A message kept by ``write`` (a COPY's CopyOutResponse) is not written alone before the
    views: it leads the first ``writev``, so the client is woken once for both."""
    first_buffers: list[bytes] = []
    real = os.writev

    def recording(fd: int, buffers: Any) -> int:
        if not first_buffers:
            first_buffers.extend(bytes(b) for b in buffers)
        return real(fd, buffers)

    monkeypatch.setattr(output.os, "writev", recording)
    ours, peer = socket.socketpair()
    views: list[bytes | memoryview] = [b"d0001", memoryview(b"x" * 1000)]
    expected = b"kept" + b"".join(bytes(v) for v in views)
    got = bytearray()
    reader_thread = threading.Thread(target=_drain_slowly, args=(peer, got, len(expected)))
    reader_thread.start()

    async def send() -> None:
        _, writer = await asyncio.open_connection(sock=ours)
        gathering = GatheringWriter(writer)
        gathering.write(b"kept")
        await gathering.send_views(views)
        writer.close()
        await writer.wait_closed()

    asyncio.run(send())
    reader_thread.join(30)
    peer.close()
    assert bytes(got) == expected
    assert first_buffers[:1] == [b"kept"], first_buffers[:2]
