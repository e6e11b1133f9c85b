"""The ingest check of staged frames (``staged_frames.check_incoming``) for bodies whose
data column is compressed whole (``storage.column_codec``), round 22 review R1: a plain
body costs what it cost before the codec existed; a compressed one is held to one zstd
frame and to its message count's bound before anything is decompressed, and its
decompressed output is counted among the checks in flight while the decoded batch lives."""

from __future__ import annotations

import contextlib
import struct
from collections.abc import Callable, Iterator
from typing import Any

import crc32c
import pyarrow as pa
import pytest
import zstandard

from engine import staged_refs
from engine.staged_refs import check_incoming_frame
from storage import staged_frames
from storage.column_codec import (
    DATA_VALUES,
    NOT_COMPRESSED,
    assemble_body,
    compress_body,
    compressed_values,
    unpacked_bytes,
)
from storage.errors import DataError, InvalidBinaryDataError
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


_INT64 = struct.Struct("<q")
_ZSTD = zstandard.ZstdCompressor(level=1, write_content_size=True)
MESSAGES = [b"line %d of the log, status 200\n" % i * 3 for i in range(40)]


def _with_values(values: Callable[[bytes], bytes]) -> pa.Buffer:
    """A body of ``MESSAGES`` whose data values are ``values(uncompressed)`` after their
    length prefix, every other buffer stored as it is."""

    def piece(index: int, raw: bytes) -> bytes:
        if index == DATA_VALUES:
            return _INT64.pack(len(raw)) + values(raw)
        return _INT64.pack(NOT_COMPRESSED) + raw

    return assemble_body(wire(MESSAGES), piece)


@pytest.mark.parametrize(
    "values",
    [
        lambda v: _ZSTD.compress(v) + _ZSTD.compress(b""),  # a second, empty frame
        lambda v: _ZSTD.compress(v) + struct.pack("<II", 0x184D2A50, 4) + b"evil",  # skippable
        lambda v: _ZSTD.compress(v) + bytes(16),  # trailing bytes
        lambda v: _ZSTD.compress(v)[:-3],  # truncated
    ],
    ids=["empty-frame", "skippable-frame", "trailing-bytes", "truncated"],
)
def test_the_values_must_be_exactly_one_zstd_frame(values: Callable[[bytes], bytes]) -> None:
    """R1 L-1: a payload followed by another frame was accepted and stored (Arrow decodes
    the first and ignores the rest); now refused (22P03) before anything is decompressed."""
    body = _with_values(values)
    with pytest.raises(InvalidBinaryDataError, match="exactly one zstd frame"):
        compressed_values(body)
    with pytest.raises(DataError) as refused:
        check_incoming(incoming(body, len(MESSAGES)), body)
    assert refused.value.sqlstate == "22P03"


@pytest.mark.parametrize("checksum", [False, True])
def test_one_zstd_frame_of_many_blocks_is_accepted(checksum: bool) -> None:
    """The walk over blocks: a payload of several blocks (over 128 KiB), with or without
    a checksum, decodes back to the messages."""
    messages = [bytes(range(256)) * 64 + b"%d" % i for i in range(40)]  # ~650 KiB
    compressor = zstandard.ZstdCompressor(level=1, write_content_size=True,
                                          write_checksum=checksum)  # fmt: skip
    body = compress_body(wire(messages))
    if checksum:

        def piece(index: int, raw: bytes) -> bytes:
            prefix = _INT64.pack(len(raw) if index == DATA_VALUES else NOT_COMPRESSED)
            return prefix + (compressor.compress(raw) if index == DATA_VALUES else raw)

        body = assemble_body(wire(messages), piece)
    assert compressed_values(body).compressed
    batch = check_incoming(incoming(body, len(messages)), body)
    assert [bytes(d) for d in batch.column("data").to_pylist()] == messages


@pytest.mark.parametrize("header_count", [2, 1])
def test_a_frame_of_several_messages_declares_at_most_the_frame_target(
    monkeypatch: pytest.MonkeyPatch, header_count: int
) -> None:
    """R1 L-2: two 3 MiB messages (6 MiB, over the 4 MiB frame target) were decompressed
    (the bound was 16 MiB whatever the count) before the frame target refused them; now
    refused (22P04, as the plain frame) from the declared size, nothing decompressed or
    held, whether the header or the body's own metadata counts the messages (a header
    claiming one message does not raise the bound)."""
    counted = Counted(monkeypatch)
    messages = [bytes(3 << 20), bytes(3 << 20)]
    body = compress_body(wire(messages))
    with pytest.raises(DataError, match="over the frame target of 4194304") as refused:
        check_incoming(incoming(body, header_count), body)
    assert refused.value.sqlstate == "22P04"
    assert "declares" in str(refused.value)  # from the declared size, not the decoded batch
    assert counted.holds == []
    one = compress_body(wire([bytes(6 << 20)]))  # one message alone may be larger
    assert compressed_values(one, 1).declared == 6 << 20


def test_the_hold_lasts_while_the_checks_use_the_decoded_batch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """R1 L-3: the decompressed values were counted among the checks in flight only while
    Arrow decoded them; the frame's remaining checks (its messages: ``cuttable``; the
    engine's values: ``check_incoming_frame``) ran on the batch after the hold ended."""
    active = [False]
    held: list[tuple[str, bool]] = []
    hold = staged_frames.holding_decompressed

    @contextlib.contextmanager
    def marked(nbytes: int) -> Iterator[None]:
        with hold(nbytes):
            active[0] = True
            try:
                yield
            finally:
                active[0] = False

    def watched(name: str, check: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            held.append((name, active[0]))
            return check(*args)

        return call

    monkeypatch.setattr(staged_frames, "holding_decompressed", marked)
    monkeypatch.setattr(staged_frames, "cuttable", watched("cuttable", staged_frames.cuttable))
    monkeypatch.setattr(
        staged_refs, "_readable_instants", watched("instants", staged_refs._readable_instants)
    )
    body = compress_body(wire(MESSAGES))
    check_incoming_frame(incoming(body, len(MESSAGES)), body)
    assert held == [("cuttable", True), ("instants", True)]
    assert active == [False]


def test_a_segment_probes_each_published_frame_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """``LogSegment.unpacked_at``: a frame read again is charged the same without a second
    probe; a frame past a gap is probed every time until the reads reach it in order."""
    from storage import segment as segment_module
    from storage.segment import LogSegment

    probes: list[int] = []
    probe = segment_module.unpacked_bytes

    def counted(body: pa.Buffer, messages: bool = False) -> int:
        probes.append(body.size)
        return probe(body, messages)

    monkeypatch.setattr(segment_module, "unpacked_bytes", counted)
    plain = serialize_body_buffer(wire(MESSAGES))
    packed = compress_body(wire(MESSAGES))
    declared = sum(map(len, MESSAGES))
    segment = LogSegment.__new__(LogSegment)  # only its probe's state is used here
    segment._probed_below, segment._unpacked = 0, {}
    layout = [(0, plain), (plain.size, packed), (plain.size + packed.size, plain)]
    assert segment.unpacked_at(layout[2][0], plain.size, plain) == 0  # past a gap
    for _ in range(2):
        got = [segment.unpacked_at(position, body.size, body) for position, body in layout]
        assert got == [0, declared, 0]
    assert segment.unpacked_at(layout[2][0], plain.size, plain) == 0
    assert probes == [plain.size, plain.size, packed.size, plain.size]


@pytest.mark.parametrize("count", [3, 200])
def test_a_frame_of_zstd_messages_is_charged_what_they_declare(count: int) -> None:
    """``unpacked_bytes(messages=True)``: the sizes a frame's zstd messages declare (read
    one by one for a few, with numpy for many), mixed with raw ones; 0 for a plain frame
    of raw messages, and 0 without ``messages``."""
    from tests.pgwire.test_copy_frames_zstd import zstd_wire

    sizes = [(i * 7919) % 5000 for i in range(count)]
    batch = zstd_wire([_ZSTD.compress(bytes(size)) for size in sizes])
    codecs = pa.array([4 if i % 3 else 1 for i in range(count)], pa.uint8())
    batch = batch.set_column(4, batch.schema.field(4), codecs)
    body = serialize_body_buffer(batch)
    expected = sum(size for i, size in enumerate(sizes) if i % 3)
    assert unpacked_bytes(body, messages=True) == expected
    assert unpacked_bytes(body) == 0
    assert unpacked_bytes(serialize_body_buffer(wire(MESSAGES)), messages=True) == 0


def test_a_segment_remembers_at_most_its_bound_of_compressed_frames(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Past ``limits.UNPACKED_REMEMBERED_MAX`` compressed frames a segment remembers no
    more (its memory does not grow with a segment of small compressed frames): the frames
    from there on are probed at every read and charged the same."""
    from storage import limits
    from storage.segment import LogSegment

    monkeypatch.setattr(limits, "UNPACKED_REMEMBERED_MAX", 2)
    plain = serialize_body_buffer(wire(MESSAGES))
    packed = compress_body(wire(MESSAGES))
    declared = sum(map(len, MESSAGES))
    bodies = [packed, plain, packed, packed, plain, packed]
    layout, position = [], 0
    for body in bodies:
        layout.append((position, body))
        position += body.size
    segment = LogSegment.__new__(LogSegment)  # only its probe's state is used here
    segment._probed_below, segment._unpacked = 0, {}
    expected = [declared if body is packed else 0 for body in bodies]
    for _ in range(3):
        got = [segment.unpacked_at(at, body.size, body) for at, body in layout]
        assert got == expected
        assert len(segment._unpacked) == 2
        assert segment._probed_below == layout[3][0]  # stopped at the third compressed frame
