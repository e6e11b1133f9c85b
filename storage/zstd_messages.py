"""Checking a column of zstd-compressed messages that a client compressed itself.

A staged frame (``storage.staged_frames``, ``COPY ... (FORMAT frames)``) may hold
messages the client compressed with zstd (codec 4), one zstd frame per message, when
the topic accepts zstd (round 17: the Spark writer's ``frameCodec=zstd``). The server
never stores a message a reader could not decode, so every such message is decompressed
once here, in C (``ZstdDecompressor.multi_decompress_to_buffer``: no Python call per
message), into memory that is dropped at once.

Invariants (what ``check_zstd_messages`` guarantees for a column it accepts):
- every message starts with a zstd frame header that declares its content size, at most
  ``limits.MESSAGE_BYTES_MAX``; the declared sizes of a column of several messages sum to
  at most ``limits.FRAME_TARGET_BYTES`` plus its largest message (a raw frame of several
  messages holds at most ``FRAME_TARGET_BYTES``; the Spark writer cuts its zstd frames by
  plain bytes so), read from the headers (numpy, vectorized) before anything is
  decompressed, so a small frame cannot make the server (or any later reader) allocate
  more than that (review R1 round 17, F3: 4 x 16 MiB of zeros fit in a 2 KB frame);
- every message decompresses to exactly its declared size (``codecs.decode``, what
  readers call, then returns those bytes: bytes after the first zstd frame of a message
  are ignored by both alike);
- a message that declares a size of 0 is exactly one empty zstd frame (its header, one
  empty last raw block, its checksum if the header says so) and nothing else, so any
  zstd decoder reads it (review R1 round 17, F4).
Otherwise ``InvalidBinaryDataError`` (22P03) or, for a size over a bound, 54000. The checks
of all threads together hold at most ``limits.ZSTD_CHECK_IN_FLIGHT_BYTES`` of decompressed
output at once (a check waits for room): the output is dropped at once, but many
connections checking bomb-like frames at the same time would otherwise add up.

Messages that declare a size of 0 are not handed to the C call: python-zstandard 0.25's
``multi_decompress_to_buffer`` corrupts the heap when an item decompresses to nothing
(found here: ``free(): double free`` for a column whose first message is empty); its
``decompress`` returns ``b""`` for them without reading further, and so do readers.

``decode_zstd_column`` is the read side (``codecs.decode_column``): a column of zstd
messages decoded by the same one C call instead of a Python call per message, only
within the same bounds (python-zstandard aborts the process on a declared size past
2^63: review R1 F2 / R2-17-1); anything else goes to the per-message path, which names
the broken message (22P03).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import zstandard

from storage import limits
from storage.errors import InvalidBinaryDataError, LimitExceededError

ZSTD_MAGIC = 0xFD2FB528
# Frame_Header_Descriptor's Dictionary_ID_flag -> the field's bytes; FCS flag -> bytes.
_DICTIONARY_ID_BYTES = np.array([0, 1, 2, 4], dtype=np.int64)
_CONTENT_SIZE_BYTES = np.array([0, 2, 4, 8], dtype=np.int64)
_HEADER_MIN_BYTES = 6  # magic, descriptor, at least one byte of content size
_EMPTY_BLOCK = b"\x01\x00\x00"  # Last_Block 1, Raw_Block, Block_Size 0
_EMPTY_CHECKSUM = bytes.fromhex("99e9d851")  # low 4 bytes of XXH64(b"", 0), little-endian
_LOCAL = threading.local()  # one decompressor a thread (they are not thread-safe)


class _InFlight:
    """Bytes of decompressed output the checks of all threads hold at once, at most
    ``cap`` (a check larger than the cap alone waits until nothing else is in flight)."""

    def __init__(self, cap: int) -> None:
        self._cap = cap
        self._held = 0
        self._room = threading.Condition()

    @contextlib.contextmanager
    def holding(self, nbytes: int) -> Iterator[None]:
        with self._room:
            self._room.wait_for(lambda: self._held == 0 or self._held + nbytes <= self._cap)
            self._held += nbytes
        try:
            yield
        finally:
            with self._room:
                self._held -= nbytes
                assert self._held >= 0
                self._room.notify_all()


_CHECKS_IN_FLIGHT = _InFlight(limits.ZSTD_CHECK_IN_FLIGHT_BYTES)


def holding_decompressed(nbytes: int) -> contextlib.AbstractContextManager[None]:
    """Room for ``nbytes`` of decompressed output among all threads' checks (the bound
    above), held while the ``with`` block runs: a check of a compressed frame's data
    column (``storage.column_codec``) shares it with the per-message checks."""
    return _CHECKS_IN_FLIGHT.holding(nbytes)


def declared_sizes(data: pa.Array) -> np.ndarray:
    """The content size each message of ``data`` (a binary column of zstd messages, no
    nulls) declares in its zstd frame header (uint64), read with numpy alone; 22P03 for a
    message that is not a zstd frame header declaring its size, or that declares 0 and is
    not exactly one empty frame."""
    count = len(data)
    offsets = _offsets(data)
    values = data.buffers()[2]
    body = np.frombuffer(values, dtype=np.uint8) if values is not None else np.zeros(0, np.uint8)
    starts, lengths = offsets[:-1], np.diff(offsets)
    if int(lengths.min()) < _HEADER_MIN_BYTES:
        raise InvalidBinaryDataError("a zstd message is too short to be a zstd frame")
    padded = np.concatenate([body, np.zeros(16, np.uint8)])  # header reads past a short end
    magic = (padded[starts].astype(np.uint32) | padded[starts + 1].astype(np.uint32) << 8
             | padded[starts + 2].astype(np.uint32) << 16
             | padded[starts + 3].astype(np.uint32) << 24)  # fmt: skip
    if not bool((magic == ZSTD_MAGIC).all()):
        raise InvalidBinaryDataError("a zstd message does not start with a zstd frame")
    descriptor = padded[starts + 4].astype(np.int64)
    single_segment = (descriptor >> 5) & 1
    size_flag = descriptor >> 6
    if bool(((descriptor >> 3) & 1).any()):
        raise InvalidBinaryDataError("a zstd message's frame header sets a reserved bit")
    if bool(((size_flag == 0) & (single_segment == 0)).any()):
        raise InvalidBinaryDataError("a zstd message's frame does not declare its size")
    size_bytes = np.where(size_flag == 0, 1, _CONTENT_SIZE_BYTES[size_flag])
    at = starts + 5 + (1 - single_segment) + _DICTIONARY_ID_BYTES[descriptor & 3]
    if bool((at + size_bytes > starts + lengths).any()):
        raise InvalidBinaryDataError("a zstd message ends inside its frame header")
    sizes = np.zeros(count, dtype=np.uint64)
    for byte in range(8):
        present = size_bytes > byte
        sizes |= np.where(present, padded[np.where(present, at + byte, 0)], 0).astype(
            np.uint64) << np.uint64(8 * byte)  # fmt: skip
    sizes += np.where(size_flag == 1, 256, 0).astype(np.uint64)
    empty = np.flatnonzero(sizes == 0)
    if len(empty):
        if bool((descriptor[empty] & 3).any()):  # a dictionary id: decoders without it refuse
            raise InvalidBinaryDataError("a zstd message that declares no content names a "
                                         "dictionary")  # fmt: skip
        _check_empty_frames(body, starts[empty], lengths[empty], (at + size_bytes)[empty],
                            (descriptor[empty] >> 2) & 1)  # fmt: skip
    return sizes


def _check_empty_frames(body: np.ndarray, starts: np.ndarray, lengths: np.ndarray,
                        header_ends: np.ndarray, checksum: np.ndarray) -> None:  # fmt: skip
    """22P03 unless each message (``starts``, ``lengths`` in ``body``) declaring a size
    of 0 is its header (to ``header_ends``), one empty last raw block and, where the
    header's Content_Checksum_flag is set, the 4-byte checksum: nothing else."""
    if bool((lengths != header_ends - starts + len(_EMPTY_BLOCK) + 4 * checksum).any()):
        raise InvalidBinaryDataError("a zstd message that declares no content is not one "
                                     "empty zstd frame")  # fmt: skip
    for i, at in enumerate(header_ends.tolist()):
        if body[at : at + len(_EMPTY_BLOCK)].tobytes() != _EMPTY_BLOCK:
            raise InvalidBinaryDataError("a zstd message that declares no content is not "
                                         "one empty zstd frame")  # fmt: skip
        if checksum[i] and body[at + 3 : at + 7].tobytes() != _EMPTY_CHECKSUM:
            raise InvalidBinaryDataError("a zstd message's checksum does not match its "
                                         "content")  # fmt: skip


def check_zstd_messages(data: pa.Array) -> None:
    """Refuse ``data`` (a binary column, every message zstd-compressed) unless each
    message is one zstd frame with its content size declared within the bounds above that
    decompresses to it (the module doc)."""
    if not len(data):
        return
    sizes = declared_sizes(data)
    largest = int(sizes.max())
    if largest > limits.MESSAGE_BYTES_MAX:
        raise LimitExceededError(f"a zstd message of {largest} bytes decompressed exceeds "
                                 f"the limit of {limits.MESSAGE_BYTES_MAX} bytes")  # fmt: skip
    total = _total(sizes)
    if total > _frame_bound(largest, len(sizes)):
        raise LimitExceededError(
            f"a frame of {len(sizes)} zstd messages of {total} bytes decompressed exceeds "
            f"the frame target of {limits.FRAME_TARGET_BYTES} bytes and one message")  # fmt: skip
    with _CHECKS_IN_FLIGHT.holding(total):
        _decompress(data, sizes)  # decompressed, then dropped: only whether it decodes


def decode_zstd_column(data: pa.Array) -> pa.Array | None:
    """``data`` (a binary column of zstd messages, no nulls) decoded by one C call, or
    None when a message does not declare its size or does not decode (the caller's
    per-message path then decodes it, or names the broken message)."""
    try:
        sizes = declared_sizes(data)
        largest = int(sizes.max()) if len(sizes) else 0
        if largest > limits.MESSAGE_BYTES_MAX or _total(sizes) > _frame_bound(largest,
                                                                              len(sizes)):
            return None  # never handed to the C call (it aborts on absurd sizes)
        out = _decompress(data, sizes)
    except (InvalidBinaryDataError, MemoryError):
        return None
    pieces = iter([out[i].tobytes() for i in range(len(out))])
    return pa.array([next(pieces) if size else b"" for size in sizes.tolist()],
                    type=data.type)  # fmt: skip


def _total(sizes: np.ndarray) -> int:
    """The sizes' sum; only once the largest is known to be at most MESSAGE_BYTES_MAX (so
    the uint64 sum cannot wrap)."""
    return int(sizes.sum(dtype=np.uint64))


def _frame_bound(largest: int, count: int) -> int:
    """The decompressed bytes a frame of ``count`` messages may declare (module doc)."""
    return largest if count == 1 else limits.FRAME_TARGET_BYTES + largest


def _offsets(data: pa.Array) -> np.ndarray:
    return np.frombuffer(data.buffers()[1], dtype=np.int32, count=len(data) + 1,
                         offset=data.offset * 4).astype(np.int64)  # fmt: skip


def _decompress(data: pa.Array, sizes: np.ndarray) -> Any:
    """The messages of ``data`` that declare a size above 0, decompressed in one C call
    to exactly their ``sizes`` (22P03 otherwise), in order (a ``BufferWithSegmentsCollection``:
    item i's ``tobytes()``; empty when none declares a size above 0)."""
    offsets = _offsets(data)
    keep = sizes > 0
    if not bool(keep.any()):
        return ()
    segments = np.stack([offsets[:-1][keep], np.diff(offsets)[keep]], axis=1).astype(np.uint64)
    try:
        decompressor = getattr(_LOCAL, "zstd", None)
        if decompressor is None:
            decompressor = _LOCAL.zstd = zstandard.ZstdDecompressor()
        out = decompressor.multi_decompress_to_buffer(
            zstandard.BufferWithSegments(data.buffers()[2], segments.tobytes()),
            decompressed_sizes=sizes[keep].tobytes())
    except (zstandard.ZstdError, ValueError) as error:
        raise InvalidBinaryDataError(f"cannot decode a zstd message: {error}") from None
    return out
