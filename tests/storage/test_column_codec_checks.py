"""The ingest check of staged frames (``staged_frames.check_incoming``) for bodies whose
data column is compressed whole (``storage.column_codec``), round 22 review R1: a plain
body costs what it cost before the codec existed; a compressed one is held to one zstd
frame and to its message count's bound before anything is decompressed, and its
decompressed output is counted among the checks in flight while the decoded batch lives."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import crc32c
import pyarrow as pa
import pytest

from storage import staged_frames
from storage.column_codec import compress_body
from storage.record_batch import serialize_body_buffer
from storage.staged_frames import IncomingFrame, check_incoming
from tests.pgwire.test_copy_frames import wire


def incoming(body: pa.Buffer, count: int) -> IncomingFrame:
    return IncomingFrame(b"", crc32c.crc32c(body), 0, count, body.size)


class Counted:
    """Counts the calls of the check's compression probe and of its in-flight hold."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.probes = 0
        self.holds: list[int] = []
        probe, hold = staged_frames.compressed_values, staged_frames.holding_decompressed

        def counted_probe(*args: Any, **kwargs: Any) -> Any:
            self.probes += 1
            return probe(*args, **kwargs)

        @contextlib.contextmanager
        def counted_hold(nbytes: int) -> Iterator[None]:
            self.holds.append(nbytes)
            with hold(nbytes):
                yield

        monkeypatch.setattr(staged_frames, "compressed_values", counted_probe)
        monkeypatch.setattr(staged_frames, "holding_decompressed", counted_hold)


def test_a_plain_body_is_neither_probed_for_compression_nor_held(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """R1 M-2: the compression probe and the hold (a shared lock, notify_all) cost a plain
    frame ~30 % more CPU; only a body the plain parse refuses is probed."""
    counted = Counted(monkeypatch)
    messages = [b"m%d" % i * 20 for i in range(5)]
    batch = check_incoming(incoming(serialize_body_buffer(wire(messages)), 5),
                           serialize_body_buffer(wire(messages)))  # fmt: skip
    assert [bytes(d) for d in batch.column("data").to_pylist()] == messages
    assert (counted.probes, counted.holds) == (0, [])
    body = compress_body(wire(messages))
    batch = check_incoming(incoming(body, 5), body)
    assert [bytes(d) for d in batch.column("data").to_pylist()] == messages
    assert (counted.probes, counted.holds) == (1, [sum(map(len, messages))])
