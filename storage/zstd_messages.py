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
"""

from __future__ import annotations

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


def check_zstd_messages(data: pa.Array) -> None:
    """Refuse ``data`` (a binary column, every message zstd-compressed) unless each
    message is one zstd frame with its content size declared within the bounds above that
    decompresses to it (the module doc)."""
    count = len(data)
    if not count:
        return
    offsets = np.frombuffer(data.buffers()[1], dtype=np.int32, count=count + 1,
                            offset=data.offset * 4).astype(np.int64)  # fmt: skip
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
    largest = int(sizes.max())
    if largest > limits.MESSAGE_BYTES_MAX:
        raise LimitExceededError(f"a zstd message of {largest} bytes decompressed exceeds "
                                 f"the limit of {limits.MESSAGE_BYTES_MAX} bytes")  # fmt: skip
    total = int(sizes.sum(dtype=np.uint64))
    if total > limits.BATCH_BYTES_MAX:
        raise LimitExceededError(f"zstd messages of {total} bytes decompressed exceed the "
                                 f"limit of {limits.BATCH_BYTES_MAX} bytes a batch")  # fmt: skip
    segments = np.stack([starts, lengths], axis=1).astype(np.uint64)
    try:
        zstandard.ZstdDecompressor().multi_decompress_to_buffer(
            zstandard.BufferWithSegments(values, segments.tobytes()),
            decompressed_sizes=sizes.tobytes())
    except zstandard.ZstdError as error:
        raise InvalidBinaryDataError(f"cannot decode a zstd message: {error}") from None
