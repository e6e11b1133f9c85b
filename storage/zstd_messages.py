"""Checking a column of zstd-compressed messages that a client compressed itself.

A staged frame (``storage.staged_frames``, ``COPY ... (FORMAT frames)``) may hold
messages the client compressed with zstd (codec 4), one zstd frame per message, when
the topic accepts zstd (round 17: the Spark writer's ``frameCodec=zstd``). The server
never stores a message a reader could not decode, so every such message is decompressed
once here, in C (``ZstdDecompressor.multi_decompress_to_buffer``: no Python call per
message), into memory that is dropped at once.

Invariants (what ``check_zstd_messages`` guarantees for a column it accepts):
- every message starts with a zstd frame header that declares its content size, at most
  ``limits.MESSAGE_BYTES_MAX``; the declared sizes of one column sum to at most
  ``limits.BATCH_BYTES_MAX`` (what one batch may hold), read from the headers (numpy,
  vectorized) before anything is decompressed, so a small frame cannot make the server
  allocate more than that;
- every message decompresses to exactly its declared size (``codecs.decode``, what
  readers call, then returns those bytes: bytes after the first zstd frame of a message
  are ignored by both alike).
Otherwise ``InvalidBinaryDataError`` (22P03) or, for a size over a bound, 54000.

Messages that declare a size of 0 are not handed to the C call: python-zstandard 0.25's
``multi_decompress_to_buffer`` corrupts the heap when an item decompresses to nothing
(found here: ``free(): double free`` for a column whose first message is empty); its
``decompress`` returns ``b""`` for them without reading further, and so do readers.

``decode_zstd_column`` is the read side (``codecs.decode_column``): a column of zstd
messages decoded by the same one C call instead of a Python call per message.
"""

from __future__ import annotations

import threading
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
_LOCAL = threading.local()  # one decompressor a thread (they are not thread-safe)


def declared_sizes(data: pa.Array) -> np.ndarray:
    """The content size each message of ``data`` (a binary column of zstd messages, no
    nulls) declares in its zstd frame header (uint64), read with numpy alone; 22P03 for a
    message that is not a zstd frame header declaring its size."""
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
    return sizes + np.where(size_flag == 1, 256, 0).astype(np.uint64)


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
    total = int(sizes.sum(dtype=np.uint64))
    if total > limits.BATCH_BYTES_MAX:
        raise LimitExceededError(f"zstd messages of {total} bytes decompressed exceed the "
                                 f"limit of {limits.BATCH_BYTES_MAX} bytes a batch")  # fmt: skip
    _decompress(data, sizes)  # decompressed, then dropped: only whether it decodes matters


def decode_zstd_column(data: pa.Array) -> pa.Array | None:
    """``data`` (a binary column of zstd messages, no nulls) decoded by one C call, or
    None when a message does not declare its size or does not decode (the caller's
    per-message path then decodes it, or names the broken message)."""
    try:
        sizes = declared_sizes(data)
        out = _decompress(data, sizes)
    except InvalidBinaryDataError:
        return None
    pieces = iter([out[i].tobytes() for i in range(len(out))])
    return pa.array([next(pieces) if size else b"" for size in sizes.tolist()],
                    type=data.type)  # fmt: skip


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
