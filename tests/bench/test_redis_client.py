"""The benchmark's minimal RESP2 client against canned replies (no server needed)."""

from __future__ import annotations

import socket

import pytest

from bench.redis import Client, RedisError


def _client_with(replies: bytes) -> tuple[Client, socket.socket]:
    ours, theirs = socket.socketpair()
    client = Client.__new__(Client)
    client.sock = ours
    client._buffer = bytearray()
    theirs.sendall(replies)
    return client, theirs


def test_commands_are_arrays_of_bulk_strings() -> None:
    assert Client.encode(["XADD", "s", "*", "d", b"\x00\r\n", 7]) == (
        b"*6\r\n$4\r\nXADD\r\n$1\r\ns\r\n$1\r\n*\r\n$1\r\nd\r\n$3\r\n\x00\r\n\r\n$1\r\n7\r\n"
    )


def test_replies_of_every_kind_are_parsed() -> None:
    client, peer = _client_with(
        b"+OK\r\n:42\r\n$5\r\nab\r\nc\r\n$-1\r\n*2\r\n*2\r\n$3\r\n1-0\r\n*0\r\n:1\r\n-ERR no\r\n"
    )
    try:
        replies = client.pipeline([["A"]] * 6)
        assert replies[:5] == ["OK", 42, b"ab\r\nc", None, [[b"1-0", []], 1]]
        assert isinstance(replies[5], RedisError) and str(replies[5]) == "ERR no"
        sent = peer.recv(1000)
        assert sent == b"*1\r\n$1\r\nA\r\n" * 6
    finally:
        client.close()
        peer.close()


def test_an_error_reply_raises_on_call() -> None:
    client, peer = _client_with(b"-WRONGTYPE bad\r\n")
    try:
        with pytest.raises(RedisError, match="WRONGTYPE"):
            client.call("GET", "k")
    finally:
        client.close()
        peer.close()
